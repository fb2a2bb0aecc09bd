"""The commit log of one partition replica: segments, offsets and checkpoints.

Directory layout::

    <dir>/00000000000000000000.log        record batches (see records.py)
    <dir>/00000000000000000000.index      offset index   (see index.py)
    <dir>/00000000000000000000.timeindex  time index
    <dir>/high-watermark.checkpoint       last committed offset
    <dir>/leader-epoch.checkpoint         epoch -> first offset
    <dir>/log-start-offset.checkpoint     first offset still served

Offsets: ``log_start_offset`` is the first offset that can be read,
``log_end_offset`` (LEO) the offset the next record gets. The high
watermark follows Liftbridge: the offset of the last committed record, -1
when none is committed. The log stores it; replication decides it.

Failures: every write either completes or leaves the log as it was and
raises WriteFailed. When a failed write cannot be undone (the file cannot
even be cut back), the log is *fenced*: writes raise LogFenced naming the
file and the OS error, reads still serve what was whole, and each later
write first retries the repair, so writing resumes once the cause is gone.

Threads: a log belongs to one owner thread (the event loop), which calls
every method except ``compact``. ``compact`` may run in a worker thread at
the same time; it works on closed segments and swaps its results in under
a lock, giving up if the owner truncated the log meanwhile. Segments that
leave the log are closed later by the owner, never under a reader.

Encryption: a log opened with ``encrypt`` stores every batch it encodes
encrypted by its ``cipher`` (see encryption.py). Raw appends are stored as
they come (a follower keeps its leader's ciphertext), ``read_raw`` returns
the stored bytes and every other read decrypts, so only replication ever
sees ciphertext.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from liftlog.recordformat import BatchHeader, batch_crc_ok

from .checkpoint import CorruptCheckpoint, EpochEntry, LeaderEpochCache, OffsetCheckpoint
from .compaction import build_key_map, clean_segment, discard_cleaning_dir, swap_in
from .config import FsyncPolicy, LogConfig
from .descriptors import DescriptorBudget
from .encryption import (
    ATTR_ENCRYPTED,
    BatchCipher,
    EncryptionError,
    MissingMasterKey,
    PartitionCipher,
    UndecryptableBatch,
)
from .errors import (
    InvalidBatch,
    LogClosed,
    LogFenced,
    NonMonotonicOffset,
    OffsetOutOfRange,
    StaleLeaderEpoch,
    WriteFailed,
)
from .fileio import DEFAULT_FILE_IO, FileIO
from .records import (
    NewRecord,
    Record,
    RecordsInfo,
    decode_records,
    encode_batch,
    encode_empty_batch,
    iter_batch_headers,
    parse_batch_header,
    seal_records,
)
from .segment import MAX_RELATIVE_OFFSET, Segment, TornWrite

__all__ = ["CommitLog", "CompactionResult"]

log = logging.getLogger(__name__)

HW_FILE = "high-watermark.checkpoint"
EPOCH_FILE = "leader-epoch.checkpoint"
START_FILE = "log-start-offset.checkpoint"

Clock = Callable[[], int]


@dataclass(frozen=True, slots=True)
class CompactionResult:
    segments_rewritten: int
    records_removed: int
    bytes_before: int
    bytes_after: int


@dataclass(slots=True)
class _Fence:
    """Why the log refuses writes, and how to try to end that."""

    error: LogFenced
    repair: Callable[[], bool]


class CommitLog:
    """A segmented, append-only log of record batches. Create with ``open``."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        clock: Clock,
        io: FileIO = DEFAULT_FILE_IO,
        budget: DescriptorBudget | None = None,
        cipher: BatchCipher | PartitionCipher | None = None,
        encrypt: bool = False,
    ) -> None:
        self.directory = directory
        #: Decrypts encrypted batches and, with ``encrypt``, encrypts every batch this log encodes, bound to
        #: this log's partition (a bare ``BatchCipher`` binds to no partition: tests and tools).
        self.cipher = cipher.bind(b"") if isinstance(cipher, BatchCipher) else cipher
        self.encrypt = encrypt
        self.config = config
        self._clock = clock
        self.io = io
        #: Where sealed segments keep their descriptors (shared by a server's logs); None: each keeps its own.
        self.budget = budget
        self._fence: _Fence | None = None
        #: With ``defer_fsync`` (and the ``always`` policy) appends leave the fsync to ``sync``, so that the
        #: batches of one event-loop turn share one (group commit); the log end before the first of them.
        self.defer_fsync = False
        #: Bytes the last append wrote (its batches, as stored): counted by the partition for metrics.
        self.last_append_bytes = 0
        self._unsynced_from: int | None = None
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._lock = threading.Lock()
        self._retired: list[Segment] = []
        self._compacting = False
        self._generation = 0
        self._start_ckpt = OffsetCheckpoint(directory / START_FILE, "log-start-offset", io)
        self._hw_ckpt = OffsetCheckpoint(directory / HW_FILE, "high-watermark", io)
        self.epoch_cache = LeaderEpochCache(directory / EPOCH_FILE, io=io)
        self.log_start_offset = 0
        self.high_watermark = -1
        self._last_fsync_ns = clock()
        self._closed = False

    # -- opening and recovery -----------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | Path,
        config: LogConfig | None = None,
        clock: Clock = time.time_ns,
        io: FileIO = DEFAULT_FILE_IO,
        budget: DescriptorBudget | None = None,
        cipher: BatchCipher | PartitionCipher | None = None,
        encrypt: bool = False,
    ) -> CommitLog:
        """Open (or create) the log in ``directory``, recovering from a crash.

        The newest segment is validated batch by batch and a torn or corrupt
        tail is cut off with a warning; damaged indexes are rebuilt; a
        damaged epoch cache is rebuilt from the batches' leader epochs.
        Raises (and leaves no file open) when the log cannot be opened.
        """
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        self = cls(path, config or LogConfig(), clock, io, budget, cipher, encrypt)
        try:
            self._recover()
        except BaseException:
            for seg in self._segments:
                seg.close()
            raise
        return self

    def _recover(self) -> None:
        io = self.io
        for leftover in self.directory.glob("*.tmp"):
            io.unlink(leftover)
        discard_cleaning_dir(self.directory)
        bases = sorted(int(p.stem) for p in self.directory.glob("*.log") if p.stem.isdigit())
        interval = self.config.index_interval_bytes
        for base in bases[:-1]:
            self._segments.append(Segment.open_closed(self.directory, base, interval, io, self.budget))
        try:
            start = self._start_ckpt.read()
        except CorruptCheckpoint as exc:
            log.warning("%s; using the first segment's base offset", exc)
            start = None
        if bases:
            active = Segment.open_active(self.directory, bases[-1], interval, io, self.budget)
            if self._segments and _empty_past_a_gap(self._segments[-1], active):
                # A crash emptied a segment that began after a gap: nothing would cover the
                # gap's offsets, so the previous segment becomes the active one again.
                log.warning("%s: empty after recovery and past a gap; removing it", active.log_path)
                active.close()
                active.delete()
            else:
                self._segments.append(active)
        else:
            self._segments.append(Segment.create(self.directory, start or 0, interval, io, self.budget))
        if start is not None:
            self._drop_segments_below(start)
        self._bases = [s.base_offset for s in self._segments]
        first = self._segments[0].base_offset
        self.log_start_offset = min(max(start if start is not None else first, first), self.log_end_offset)
        self._start_ckpt.write(self.log_start_offset)

        try:
            self.epoch_cache = LeaderEpochCache.load(self.directory / EPOCH_FILE, io)
        except CorruptCheckpoint as exc:
            log.warning("%s; rebuilding it from the log", exc)
            self._rebuild_epoch_cache()
        self.epoch_cache.truncate_from_end(self.log_end_offset)
        self.epoch_cache.truncate_from_start(self.log_start_offset)

        try:
            hw = self._hw_ckpt.read()
        except CorruptCheckpoint as exc:
            log.warning("%s; the high watermark restarts at the log start", exc)
            hw = None
        self.high_watermark = self.log_start_offset - 1 if hw is None else hw
        self._clamp_high_watermark()

    def _drop_segments_below(self, start: int) -> None:
        """Delete segments that retention removed from the log but could not unlink."""
        while len(self._segments) > 1 and self._segments[0].next_offset <= start:
            seg = self._segments.pop(0)
            log.info("%s: below the log start offset %d, deleting it", seg.log_path, start)
            seg.close()
            seg.delete()

    def _rebuild_epoch_cache(self) -> None:
        self.epoch_cache = LeaderEpochCache(self.directory / EPOCH_FILE, io=self.io)
        latest = -1
        for seg in self._segments:
            for header in seg.iter_headers():
                if header.leader_epoch > latest:
                    latest = header.leader_epoch
                    self.epoch_cache.assign(header.leader_epoch, header.base_offset)
        self.epoch_cache.flush()

    # -- properties ----------------------------------------------------

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def newest_offset(self) -> int:
        """Offset of the last record, -1 when the log has never held one."""
        return self.log_end_offset - 1

    @property
    def active_segment(self) -> Segment:
        return self._segments[-1]

    @property
    def segments(self) -> list[Segment]:
        return list(self._segments)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    # -- writing -------------------------------------------------------

    def append(
        self, records: Sequence[NewRecord], leader_epoch: int = 0, timestamp: int | None = None, attributes: int = 0
    ) -> int:
        """Assign offsets to ``records``, write them as one batch, return the new LEO.

        Records without a timestamp get ``timestamp``, by default the clock's now. ``attributes``: the
        batch's (``ATTR_MSG_IDS``).

        Raises RecordTooLarge (nothing written) for a record over
        ``max_record_bytes``, StaleLeaderEpoch for an epoch older than the
        log's latest.
        """
        self._check_writable()  # a repair may move the log end: offsets come after it
        if not records:
            return self.log_end_offset
        latest = self.epoch_cache.latest_epoch
        if latest is not None and leader_epoch < latest:
            raise StaleLeaderEpoch(leader_epoch, latest)
        now = self._clock() if timestamp is None else timestamp
        base = self.log_end_offset
        data = encode_batch(base, leader_epoch, records, now, self.config.max_record_bytes, attributes)
        if self.encrypt:
            data = self._encrypt(data)
        header = parse_batch_header(data)
        self._write(data, [header], now)
        return self.log_end_offset

    def append_encoded(
        self,
        records: bytes,
        count: int,
        leader_epoch: int = 0,
        timestamp: int | None = None,
        info: RecordsInfo | None = None,
        attributes: int = 0,
    ) -> int:
        """Append ``count`` records encoded elsewhere (``encode_records``) as one batch; return the new LEO.

        The records are stored as they are, offsets and timestamps assigned (see ``seal_records``).
        Raises what ``append`` raises, and InvalidBatch for records that are not well formed.
        """
        self._check_writable()
        latest = self.epoch_cache.latest_epoch
        if latest is not None and leader_epoch < latest:
            raise StaleLeaderEpoch(leader_epoch, latest)
        now = self._clock() if timestamp is None else timestamp
        data = seal_records(
            self.log_end_offset, leader_epoch, records, count, now, self.config.max_record_bytes, info, attributes
        )
        if self.encrypt:
            data = self._encrypt(data)
        self._write(data, [parse_batch_header(data)], now)
        return self.log_end_offset

    def append_raw(self, data: bytes | memoryview) -> int:
        """Append batches encoded elsewhere (a leader's log) without re-encoding.

        Every batch must be whole and pass its CRC, and offsets must not go
        below the LEO (gaps are legal: a compacted leader sends them).
        Returns the new LEO.
        """
        self._check_writable()
        if not data:
            return self.log_end_offset
        headers: list[BatchHeader] = []
        expected = self.log_end_offset
        try:
            for header in iter_batch_headers(data):
                if header.base_offset < expected:
                    raise NonMonotonicOffset(header.base_offset, expected)
                if not batch_crc_ok(data, header):
                    raise InvalidBatch(f"batch at base offset {header.base_offset} fails its CRC")
                headers.append(header)
                expected = header.next_offset
        except InvalidBatch as exc:
            raise InvalidBatch(f"append_raw: {exc}") from None
        consumed = headers[-1].position + headers[-1].size if headers else 0
        if consumed != len(data):
            raise InvalidBatch(f"append_raw: {len(data) - consumed} trailing bytes do not form a whole batch")
        self._write(bytes(data), headers, self._clock())
        return self.log_end_offset

    def _encrypt(self, batch: bytes) -> bytes:
        if self.cipher is None or not self.cipher.can_encrypt:
            raise MissingMasterKey(
                f"{self.directory} belongs to an encrypted stream and this server has no encryption master key "
                "(set LIFTBRIDGE_ENCRYPTION_KEY or encryption.key.file): nothing was written"
            )
        return self.cipher.encrypt(batch)

    def plain(self, data: bytes | memoryview, header: BatchHeader) -> tuple[memoryview, BatchHeader]:
        """One batch (header at ``header.position``) and its header, decrypted if it is encrypted.

        An encrypted stream's log holds only encrypted batches (and empty fillers): a clear batch with records
        there was not written by a server, and is refused rather than served.
        """
        if not header.attributes & ATTR_ENCRYPTED:
            if self.encrypt and header.record_count:
                raise UndecryptableBatch(
                    f"{self.directory}: the batch at base offset {header.base_offset} is not encrypted, in the log "
                    "of an encrypted stream"
                )
            return memoryview(data), header
        if self.cipher is None:
            raise self._no_key()
        clear = self.cipher.decrypt(data, header)
        return memoryview(clear), parse_batch_header(clear)

    def _no_key(self) -> MissingMasterKey:
        return MissingMasterKey(
            f"{self.directory} holds encrypted batches and this server has no encryption master key "
            "(set LIFTBRIDGE_ENCRYPTION_KEY or encryption.key.file)"
        )

    def _write(self, data: bytes, headers: list[BatchHeader], now: int) -> None:
        """Write whole batches, all or nothing (see the module docstring)."""
        self._check_writable()
        seg = self._segments[-1]
        first, last = headers[0], headers[-1]
        if seg.size and (
            seg.size + len(data) > self.config.segment_max_bytes
            or last.last_offset - seg.base_offset > MAX_RELATIVE_OFFSET
            or self._too_old(seg, now)
        ):
            seg = self._roll(first.base_offset)
        elif not seg.size and first.base_offset != seg.base_offset:
            # An empty segment must be named for its first offset (raw appends may skip offsets).
            seg = self._replace_empty_active(first.base_offset)
        epochs = self.epoch_cache.entries
        end = self.log_end_offset
        try:
            # After the roll: a failure here may leave the new segment empty (see _drop_emptied_active).
            self._assign_epochs(headers, epochs)
            seg.append(data, headers, now)
            self.last_append_bytes = len(data)
        except TornWrite as exc:
            self._restore_epochs(epochs)
            fence = self._drop_emptied_active()
            if fence is not None:
                raise fence from exc
            if exc.segment is not self._segments[-1]:  # the bytes it could not cut went with its file
                raise WriteFailed(exc.operation, str(exc.segment.log_path), exc.cause) from exc
            raise self._fenced_by(exc.operation, exc.segment.log_path, exc.cause, exc.segment.repair) from exc
        except WriteFailed as exc:
            self._restore_epochs(epochs)
            fence = self._drop_emptied_active()
            if fence is not None:
                raise fence from exc
            raise
        policy = self.config.fsync
        if policy is FsyncPolicy.ALWAYS and self.defer_fsync:
            if self._unsynced_from is None:
                self._unsynced_from = end
        elif policy is FsyncPolicy.ALWAYS:
            self._sync_appended(seg, end)
            self._last_fsync_ns = now
        elif policy is FsyncPolicy.INTERVAL:
            try:
                self.flush_if_due(now)
            except OSError as exc:
                # The batch is written and readable; "interval" never promised it was on disk yet.
                log.error("%s: periodic fsync failed: %s", seg.log_path, exc)
        if self._retired:
            self._close_retired()

    def _assign_epochs(self, headers: list[BatchHeader], before: list[EpochEntry]) -> None:
        latest = self.epoch_cache.latest_epoch
        for h in headers:
            if latest is None or h.leader_epoch > latest:
                try:
                    self.epoch_cache.assign(h.leader_epoch, h.base_offset)
                except OSError as exc:
                    self._restore_epochs(before)
                    raise WriteFailed("write", str(self.epoch_cache.path), exc) from exc
                latest = h.leader_epoch

    def _restore_epochs(self, entries: list[EpochEntry]) -> None:
        """Put back the epoch cache of before a write that failed."""
        if self.epoch_cache.entries == entries:
            return
        try:
            self.epoch_cache.replace(entries)
        except OSError as exc:
            # Recovery cuts the cache at the log end, so a stale file lasts only until then.
            log.warning("%s: cannot rewrite the epoch cache (%s)", self.directory, exc)
            self.epoch_cache.replace(entries, persist=False)

    # -- group commit ----------------------------------------------------

    @property
    def unsynced(self) -> bool:
        """Appends wait for ``sync`` (deferred fsync)."""
        return self._unsynced_from is not None

    @property
    def durable_end(self) -> int:
        """The log end offset up to which appends were fsynced (the LEO unless some wait for ``sync``)."""
        return self.log_end_offset if self._unsynced_from is None else self._unsynced_from

    def fsync_unsynced(self) -> None:
        """fsync the active segment; the one call of group commit that may run in a worker thread.

        Raises OSError; pass it to ``finish_sync`` on the owner thread. Rolled segments were fsynced
        when they were sealed, so the active one is the only file with unsynced appends.
        """
        self._segments[-1].flush()

    def finish_sync(self, error: OSError | None) -> None:
        """After ``fsync_unsynced``: the deferred appends are durable, or (``error``) taken back off.

        Raises WriteFailed, or LogFenced when they cannot be taken back.
        """
        start, self._unsynced_from = self._unsynced_from, None
        if start is None:
            return
        self._last_fsync_ns = self._clock()
        if error is not None:
            log.error("%s: fsync failed (%s); removing the batches it did not make durable", self.directory, error)
            self._undo_append(start)
            raise WriteFailed("fsync", str(self._segments[-1].log_path), error) from error

    def sync(self) -> None:
        """``fsync_unsynced`` and ``finish_sync`` in one call, on the owner thread."""
        if self._unsynced_from is None:
            return
        try:
            self.fsync_unsynced()
        except OSError as exc:
            self.finish_sync(exc)
        else:
            self.finish_sync(None)

    def _sync_appended(self, seg: Segment, end: int) -> None:
        """fsync what was just appended; if that fails, take it back off (it may not be on disk)."""
        try:
            seg.flush()
        except OSError as exc:
            log.error("%s: fsync failed (%s); removing the batches it did not make durable", seg.log_path, exc)
            self._undo_append(end)
            raise WriteFailed("fsync", str(seg.log_path), exc) from exc

    def _undo_append(self, end: int) -> None:
        """Cut the log back to ``end`` after a write whose outcome cannot be trusted."""
        try:
            self.truncate_to(end)
        except (WriteFailed, OSError) as exc:
            seg = self._segments[-1]
            cause = exc.cause if isinstance(exc, WriteFailed) else exc
            raise self._fenced_by("truncate", seg.log_path, cause, lambda: self._retry_truncation(end)) from exc

    # -- fencing -------------------------------------------------------

    @property
    def fenced(self) -> LogFenced | None:
        """Why the log refuses writes, None when it takes them."""
        return self._fence.error if self._fence is not None else None

    def _fenced_by(self, operation: str, path: Path, cause: OSError, repair: Callable[[], bool]) -> LogFenced:
        error = LogFenced(str(self.directory), operation, str(path), cause, self.log_end_offset)
        if self._fence is None:
            log.error("%s", error)
        self._fence = _Fence(error, repair)
        return error

    def _check_writable(self) -> None:
        self._check_open()
        fence = self._fence
        if fence is not None:
            if not fence.repair():
                raise fence.error
            if self._fence is fence:
                self._fence = None
            log.warning("%s: repaired after %s; writes resume", self.directory, fence.error.cause)

    def repair(self) -> bool:
        """Try to end a fence now; True if the log takes writes."""
        try:
            self._check_writable()
        except LogFenced:
            return False
        return True

    def _too_old(self, seg: Segment, now: int) -> bool:
        max_age = self.config.segment_max_age_ms
        return bool(max_age and seg.first_append_ns is not None and now - seg.first_append_ns >= max_age * 1_000_000)

    def roll(self) -> Segment:
        """Close the active segment and start a new one at the LEO (no-op when it is empty)."""
        self._check_open()
        if not self._segments[-1].size:
            return self._segments[-1]
        return self._roll(self.log_end_offset)

    def _roll(self, base: int) -> Segment:
        """Seal the active segment and start one at ``base``; on failure the log is as before."""
        old = self._segments[-1]
        try:
            # Closed segments must be whole on disk: recovery only repairs the newest one.
            old.seal()
        except OSError as exc:
            raise WriteFailed("fsync", str(old.log_path), exc) from exc
        new = self._create_segment(base)
        with self._lock:
            self._segments.append(new)
            self._bases.append(base)
        try:
            self.io.fsync_dir(self.directory)
        except OSError as exc:
            with self._lock:
                self._segments.pop()
                self._bases.pop()
            self._discard(new)
            old.sealed = False
            raise WriteFailed("fsync", str(self.directory), exc) from exc
        return new

    def _create_segment(self, base: int) -> Segment:
        try:
            return Segment.create(self.directory, base, self.config.index_interval_bytes, self.io, self.budget)
        except OSError as exc:
            path = self.directory / f"{base:020d}.log"
            if not isinstance(exc, FileExistsError):
                with contextlib.suppress(OSError):  # an empty file left behind is harmless
                    self.io.unlink(path)
            raise WriteFailed("create", str(path), exc) from exc

    def _discard(self, seg: Segment) -> None:
        seg.close()
        try:
            seg.delete()
        except OSError as exc:
            log.warning("%s: cannot remove this empty segment (%s)", seg.log_path, exc)

    def _replace_empty_active(self, base: int) -> Segment:
        old = self._segments[-1]
        new = self._create_segment(base)
        if len(self._segments) == 1:
            try:
                self._set_log_start(base)
            except OSError as exc:
                self._discard(new)
                raise WriteFailed("write", str(self._start_ckpt.path), exc) from exc
        with self._lock:
            self._segments[-1] = new
            self._bases[-1] = base
            self._generation += 1
        self._retire(old)
        try:
            old.delete()
        except OSError as exc:
            # Left behind, an empty file below the new segment is removed at the next open.
            log.warning("%s: cannot remove this empty segment (%s)", old.log_path, exc)
        return new

    def flush(self) -> None:
        """fsync the active segment and its indexes, and checkpoint the high watermark."""
        self._check_open()
        if self._fence is None:
            self._segments[-1].flush()
            self._unsynced_from = None
        self._hw_ckpt.write(self.high_watermark)
        self._last_fsync_ns = self._clock()

    def flush_if_due(self, now: int | None = None) -> bool:
        """With the ``interval`` policy, fsync when the interval has passed; True if it did."""
        if self.config.fsync is not FsyncPolicy.INTERVAL:
            return False
        now = self._clock() if now is None else now
        if now - self._last_fsync_ns < self.config.fsync_interval_ms * 1_000_000:
            return False
        self._segments[-1].flush()
        self._last_fsync_ns = now
        return True

    # -- high watermark ------------------------------------------------

    def set_high_watermark(self, offset: int) -> None:
        """Record the last committed offset (clamped to the log); checkpointed by ``checkpoint_high_watermark``."""
        self.high_watermark = offset
        self._clamp_high_watermark()

    def checkpoint_high_watermark(self) -> None:
        self._hw_ckpt.write(self.high_watermark)

    def _clamp_high_watermark(self) -> None:
        self.high_watermark = max(min(self.high_watermark, self.newest_offset), self.log_start_offset - 1)

    # -- reading -------------------------------------------------------

    def _check_range(self, offset: int) -> None:
        if offset < self.log_start_offset or offset > self.log_end_offset:
            raise OffsetOutOfRange(offset, self.log_start_offset, self.log_end_offset)

    def _segment_index(self, offset: int) -> int:
        """Index of the segment whose range holds ``offset`` (the first one below the log start)."""
        return max(bisect.bisect_right(self._bases, offset) - 1, 0)

    def read(
        self,
        offset: int,
        max_records: int = 10_000,
        max_bytes: int = 1 << 20,
        max_offset: int | None = None,
    ) -> list[Record]:
        """Decoded records from ``offset`` on, bounded so one call stays short.

        Stops after ``max_records`` records, after the batch that passes
        ``max_bytes`` (at least one batch is always read), and before
        ``max_offset`` (exclusive; pass ``high_watermark + 1`` for committed
        reads). Compaction gaps are skipped. Raises OffsetOutOfRange below
        the log start or above the LEO; reading at the LEO returns [].
        """
        limit = self.log_end_offset if max_offset is None else min(max_offset, self.log_end_offset)
        out: list[Record] = []
        budget = max_bytes
        for data, header in self.read_batches(offset, max_offset, max_bytes):
            out.extend(decode_records(data, header, offset, limit))
            budget -= header.size
            if out and (len(out) >= max_records or budget <= 0):
                return out[:max_records]
        return out

    def read_batches(
        self, offset: int, max_offset: int | None = None, chunk_bytes: int = 1 << 20
    ) -> Iterator[tuple[memoryview, BatchHeader]]:
        """(bytes, header) of each CRC-checked batch from the one holding ``offset``, before ``max_offset``.

        Headers' positions are relative to their own bytes. The caller decodes what it needs and stops
        iterating when it has enough; it must not await between steps (the log may change meanwhile).
        Raises OffsetOutOfRange (at the first step) as ``read`` does.
        """
        self._check_open()
        self._check_range(offset)
        limit = self.log_end_offset if max_offset is None else min(max_offset, self.log_end_offset)
        segments = self._segments
        for seg in segments[self._segment_index(offset) :]:
            if seg.next_offset <= offset:
                continue
            # Empty batches (compaction, truncation fillers) do not end a read that has found nothing yet.
            for data, header in seg.batches(seg.find_position(offset), chunk_bytes):
                if header.base_offset >= limit:
                    return
                seg.check_crc(data, header)
                yield self.plain(data, header) if self.encrypt or header.attributes & ATTR_ENCRYPTED else (data, header)
            if seg.next_offset >= limit:
                break

    def read_raw(self, offset: int, max_bytes: int = 1 << 20, max_offset: int | None = None) -> bytes:
        """Whole encoded batches from the one holding ``offset``, up to ``max_bytes``.

        For replication and fast consumers: the bytes go out as they are on
        disk. The first batch may start below ``offset`` (callers skip those
        records) and is returned even when larger than ``max_bytes``.
        Batches starting at or after ``max_offset`` are left out. Returns
        b"" at the LEO; raises OffsetOutOfRange outside the log.
        """
        self._check_open()
        self._check_range(offset)
        limit = self.log_end_offset if max_offset is None else min(max_offset, self.log_end_offset)
        segments = self._segments
        i = self._segment_index(offset)
        while offset < limit and i < len(segments):
            seg = segments[i]
            position = seg.find_position(offset)
            if position < seg.size:
                chunk = seg.pread(position, min(max_bytes, seg.size - position))
                if position + len(chunk) == seg.size and seg.next_offset <= limit:
                    return chunk  # the whole rest of the segment: whole batches, all below the limit
                end = 0
                for header in iter_batch_headers(chunk):
                    if header.base_offset >= limit:
                        break
                    end = header.position + header.size
                if end == 0:
                    header = seg.header_at(position)
                    if header.base_offset >= limit:
                        return b""
                    return seg.pread(position, header.size)
                return chunk[:end]
            i += 1
            if i < len(segments):
                offset = segments[i].base_offset
        return b""

    def read_clear(self, offset: int, max_bytes: int = 1 << 20, max_offset: int | None = None) -> bytes:
        """``read_raw`` for clients: the same batches, decrypted where they are encrypted."""
        data = self.read_raw(offset, max_bytes, max_offset)
        if not self.encrypt or not data:  # only an encrypted stream's logs hold encrypted batches
            return data
        encrypted = False
        for h in iter_batch_headers(data):
            if h.attributes & ATTR_ENCRYPTED:
                encrypted = True
            else:
                self.plain(data, h)  # raises for a clear batch with records
        if not encrypted:
            return data
        if self.cipher is None:
            raise self._no_key()
        return self.cipher.decrypt_batches(data)

    def iter_records(self, start: int, end: int | None = None, chunk_bytes: int = 1 << 20) -> Iterator[Record]:
        """Every record from ``start`` up to ``end`` (exclusive; default the LEO)."""
        offset = start
        limit = self.log_end_offset if end is None else end
        while offset < limit:
            records = self.read(offset, max_bytes=chunk_bytes, max_offset=limit)
            if not records:
                return
            yield from records
            offset = records[-1].offset + 1

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """First offset whose record has a timestamp >= ``timestamp``; None if none does."""
        self._check_open()
        for seg in list(self._segments):
            if seg.max_timestamp < timestamp or not seg.size:
                continue
            start = max(seg.time_index.lookup(timestamp), self.log_start_offset)
            for data, header in seg.batches(seg.find_position(start), 64 * 1024):
                if header.max_timestamp < timestamp:
                    continue
                seg.check_crc(data, header)
                data, header = self.plain(data, header)
                for record in decode_records(data, header, self.log_start_offset):
                    if record.timestamp >= timestamp:
                        return record.offset
        return None

    # -- truncation ----------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove every record at or above ``offset`` (replication uses it).

        A no-op when ``offset`` >= LEO. Below the log start offset it raises
        OffsetOutOfRange; use ``reset`` to empty the log instead.
        """
        self._check_writable()
        if offset >= self.log_end_offset:
            return
        if offset < self.log_start_offset:
            raise OffsetOutOfRange(offset, self.log_start_offset, self.log_end_offset, what="truncate")
        keep = max(bisect.bisect_right(self._bases, offset) - 1, 0)
        if self._segments[keep].base_offset == offset and keep > 0:
            keep -= 1
        dropped = self._segments[keep + 1 :]
        # Newest first, so whatever fails leaves a log that ends cleanly (shorter than before).
        for seg in reversed(dropped):
            try:
                seg.delete()
            except OSError as exc:
                self._after_truncation(self.log_end_offset)
                raise self._fenced_by("delete", seg.log_path, exc, lambda: self._retry_truncation(offset)) from exc
            with self._lock:
                self._generation += 1
                self._segments.pop()
                self._bases.pop()
            self._retire(seg)
        try:
            self._segments[-1].truncate_to(offset, self.cipher)
        except (WriteFailed, EncryptionError) as exc:
            # Newer segments may be gone already: the log ends where it ends now, caches follow it.
            fence = self._drop_emptied_active()
            self._after_truncation(self.log_end_offset)
            if fence is not None:
                raise fence from exc
            raise
        except TornWrite as exc:
            fence = self._drop_emptied_active()
            self._after_truncation(self.log_end_offset)
            if fence is not None:
                raise fence from exc
            if exc.segment is not self._segments[-1]:  # the bytes it could not cut went with its file
                raise WriteFailed(exc.operation, str(exc.segment.log_path), exc.cause) from exc
            raise self._fenced_by(exc.operation, exc.segment.log_path, exc.cause, exc.segment.repair) from exc
        with self._lock:
            self._generation += 1
        self._after_truncation(offset, clamp=False)
        self._fill_gap_to(offset)
        self._clamp_high_watermark()
        self._close_retired()

    def _after_truncation(self, offset: int, clamp: bool = True) -> None:
        if self._unsynced_from is not None and self._unsynced_from >= self.log_end_offset:
            self._unsynced_from = None  # what waited for an fsync is gone
        try:
            self.epoch_cache.truncate_from_end(offset)
        except OSError as exc:
            log.warning("%s: cannot rewrite the epoch cache (%s)", self.directory, exc)
            self.epoch_cache.forget_from(offset)
        if clamp:
            self._clamp_high_watermark()

    def _drop_emptied_active(self) -> LogFenced | None:
        """After a failed write or truncation: drop an empty active segment that starts past a gap.

        A raw batch after a gap rolls (or renames) the active segment to the batch's base before it
        is written, and a truncation cuts a segment's first batch before writing its kept part back;
        when that write fails, the segment is left empty with nothing covering the offsets between
        the previous segment's end and its base. Kept, its name alone would set the LEO: a failed
        append would have moved the LEO forward, fetches in the gap would get nothing below the LEO,
        and the next open (which drops such a segment, see ``_recover``) would move the LEO back.
        So the previous segment becomes the active one again now, as recovery would make it.

        The segment leaves the log before its file is unlinked, so the log is what a reopen would
        find either way. If the unlink fails, the returned fence (to raise) keeps writes off until
        it succeeds: a segment rolled past the leftover file would leave it between segments.
        """
        seg = self._segments[-1]
        if len(self._segments) < 2 or not _empty_past_a_gap(self._segments[-2], seg):
            return None
        log.warning("%s: empty after a failed write and past a gap; removing it", seg.log_path)
        with self._lock:
            self._generation += 1
            self._segments.pop()
            self._bases.pop()
        self._retire(seg)
        if self._unsynced_from is not None and self._unsynced_from >= self.log_end_offset:
            self._unsynced_from = None
        try:
            seg.delete()
        except OSError as exc:
            return self._fenced_by("delete", seg.log_path, exc, lambda: _unlinked(seg))
        return None

    def _retry_truncation(self, offset: int) -> bool:
        """A fence's repair: finish cutting the log back to ``offset``."""
        self._fence = None
        try:
            self.truncate_to(offset)
        except (WriteFailed, OSError, LogFenced):
            return False
        return True

    def _fill_gap_to(self, offset: int) -> None:
        """Cover offsets from the LEO up to ``offset`` with empty batches.

        Truncation into a gap (left by compaction or a raw append) must not
        move the LEO below the truncation point. The fillers go through the
        normal write path, so a gap too wide for one segment's 32-bit
        relative offsets rolls a new segment, and a batch's int32 offset
        delta is never exceeded.
        """
        epoch = self.epoch_cache.latest_epoch or 0
        while self.log_end_offset < offset:
            base = self.log_end_offset
            filler = encode_empty_batch(base, min(offset - base - 1, 2**31 - 1), epoch)
            self._write(filler, [parse_batch_header(filler)], self._clock())

    def reset(self, offset: int) -> None:
        """Delete everything and restart the log empty at ``offset`` (a follower far behind).

        The new segment and the log start checkpoint come first; once the
        checkpoint names ``offset`` the old segments are gone for recovery
        too, so failing to unlink them only leaves files recovery removes.
        """
        self._check_writable()
        active = self._segments[-1]
        reuse = active.base_offset == offset and not active.size
        new = active if reuse else self._create_segment(offset)
        try:
            self._start_ckpt.write(offset)
        except OSError as exc:
            if not reuse:
                self._discard(new)
            raise WriteFailed("write", str(self._start_ckpt.path), exc) from exc
        with self._lock:
            self._generation += 1
            dropped = [seg for seg in self._segments if seg is not new]
            self._segments, self._bases = [new], [offset]
        for seg in dropped:
            self._retire(seg)
            try:
                seg.delete()
            except OSError as exc:
                log.warning("%s: cannot remove it (%s); it is removed at the next open", seg.log_path, exc)
        try:
            self.io.fsync_dir(self.directory)
            self.epoch_cache.clear()
        except OSError as exc:
            log.warning("%s: reset to offset %d not fully on disk yet: %s", self.directory, offset, exc)
            self.epoch_cache.forget_from(0)
        self.log_start_offset = offset
        self.high_watermark = offset - 1
        self._unsynced_from = None
        self._close_retired()

    def _set_log_start(self, offset: int) -> None:
        """Checkpoint the new log start (OSError: nothing changed), then adopt it."""
        self._start_ckpt.write(offset)
        self.log_start_offset = offset
        try:
            self.epoch_cache.truncate_from_start(offset)
        except OSError as exc:
            # Recovery trims the file the same way, so memory may run ahead of it.
            log.warning("%s: cannot rewrite the epoch cache (%s)", self.directory, exc)
            self.epoch_cache.truncate_from_start(offset, persist=False)
        self._clamp_high_watermark()

    # -- retention -----------------------------------------------------

    def enforce_retention(self, now: int | None = None) -> int:
        """Delete whole closed segments beyond the age, size or count limits.

        The active segment is never deleted. Returns the number deleted;
        the log start offset moves to the first remaining segment.
        """
        self._check_open()
        cfg = self.config
        now = self._clock() if now is None else now
        total_bytes = self.size_bytes
        deleted: list[Segment] = []
        for seg in self._segments[:-1]:
            nxt = self._segments[len(deleted) + 1].base_offset
            # A segment compaction emptied has no timestamps: it ages from when it was rewritten, so
            # compaction alone never moves the log start (readers would take that for lost data).
            stamp = seg.max_timestamp if seg.max_timestamp >= 0 else _mtime_ns(seg.log_path)
            too_old = cfg.retention_max_age_ms and stamp < now - cfg.retention_max_age_ms * 1_000_000
            too_big = cfg.retention_max_bytes and total_bytes - seg.size >= cfg.retention_max_bytes
            too_many = cfg.retention_max_messages and self.log_end_offset - nxt >= cfg.retention_max_messages
            if not (too_old or too_big or too_many):
                break
            deleted.append(seg)
            total_bytes -= seg.size
        if not deleted:
            return 0
        # The checkpoint first: from then on recovery drops these segments even if unlinking them fails.
        start = max(self.log_start_offset, self._segments[len(deleted)].base_offset)
        try:
            self._set_log_start(start)
        except OSError as exc:
            raise WriteFailed("write", str(self._start_ckpt.path), exc) from exc
        with self._lock:
            del self._segments[: len(deleted)]
            del self._bases[: len(deleted)]
        for seg in deleted:
            log.info("%s: deleted by retention (offsets %d..%d)", seg.log_path, seg.base_offset, seg.next_offset - 1)
            self._retire(seg)
            try:
                seg.delete()
            except OSError as exc:
                log.warning("%s: cannot remove it (%s); it is removed at the next open", seg.log_path, exc)
        self._close_retired()
        return len(deleted)

    def _retire(self, seg: Segment) -> None:
        self._retired.append(seg)

    def _close_retired(self) -> None:
        with self._lock:
            if self._compacting:
                return
            retired, self._retired = self._retired, []
        for seg in retired:
            seg.close()

    # -- compaction ----------------------------------------------------

    def compact(self) -> CompactionResult:
        """Keep only the newest record per key in closed segments; safe from a worker thread.

        Records without a key are always kept; offsets never change (gaps
        appear). Only records at or below the high watermark are cleaned or
        used to decide, so an uncommitted record that may be truncated never
        hides a committed one. Each segment is replaced crash-safely (temp
        files, fsync, rename). Gives up if the owner truncates meanwhile.
        """
        with self._lock:
            if self._compacting:
                raise RuntimeError("compaction is already running on this log")
            self._compacting = True
            generation = self._generation
            segments = list(self._segments)
            bound = self.high_watermark + 1
        try:
            candidates = [s for s in segments[:-1] if s.next_offset <= bound]
            if not candidates:
                return CompactionResult(0, 0, 0, 0)
            latest = build_key_map(segments, bound, self.plain)
            rewritten = removed = before = after = 0
            for seg in candidates:
                cleaned = clean_segment(seg, latest, self.plain, self.cipher)
                if cleaned is None:
                    continue
                with self._lock:
                    if self._generation != generation or seg not in self._segments:
                        cleaned.discard()
                        log.info("%s: compaction abandoned, the log changed under it", self.directory)
                        break
                    try:
                        new = swap_in(seg, cleaned)
                    except OSError as exc:
                        cleaned.discard()
                        log.warning("%s: compaction stopped, cannot swap in %s: %s", self.directory, seg.log_path, exc)
                        break
                    if new is seg:
                        break
                    i = self._segments.index(seg)
                    self._segments[i] = new
                    self._retired.append(seg)
                rewritten += 1
                removed += cleaned.records_removed
                before += seg.size
                after += new.size
            return CompactionResult(rewritten, removed, before, after)
        finally:
            with self._lock:
                self._compacting = False

    # -- closing -------------------------------------------------------

    def close(self) -> None:
        """Flush, checkpoint and close every file. The log cannot be used after.

        A flush that fails (a full or failing disk) is logged and the files are closed anyway: what
        was not fsynced is what a crash would lose, and recovery at the next open handles it.
        """
        if self._closed:
            return
        try:
            self.flush()
        except OSError as exc:
            log.error("%s: closing without a final fsync and high watermark checkpoint: %s", self.directory, exc)
        self._closed = True
        for seg in self._segments + self._retired:
            try:
                seg.close()
            except OSError as exc:
                log.warning("%s: %s", seg.log_path, exc)
        self._retired = []

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed(f"log {self.directory} is closed")

    def __repr__(self) -> str:
        return (
            f"CommitLog({self.directory}, start={self.log_start_offset}, end={self.log_end_offset}, "
            f"hw={self.high_watermark}, segments={len(self._segments)})"
        )


def _empty_past_a_gap(previous: Segment, seg: Segment) -> bool:
    """``seg`` (the newest segment) holds no batch and starts after ``previous`` ends: nothing covers the gap."""
    return not seg.size and seg.base_offset > previous.next_offset


def _unlinked(seg: Segment) -> bool:
    """A fence's repair: remove the files of a segment that already left the log."""
    try:
        seg.delete()
    except OSError:
        return False
    return True


def _mtime_ns(path: Path) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0  # gone or unreadable: old enough to go
