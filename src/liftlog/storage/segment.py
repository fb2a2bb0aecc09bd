"""One segment of a commit log: a ``.log`` file of batches and its two indexes.

Files are named by the segment's base offset in 20 digits
(``00000000000000000000.log``, ``.index``, ``.timeindex``). The log file is
append-only; only truncation (replication) and compaction (which replaces
the whole file) rewrite it. The index files are written when the segment
is sealed (it stops being the active one); until then the indexes live in
memory and are rebuilt from the log at open.

Writes are all or nothing: a write that fails is cut back off the file and
raises WriteFailed; if even that fails the segment raises TornWrite, and
its owner (the log) refuses writes until ``repair`` succeeds.

Not safe to share between threads, except that ``read``/``pread`` may run
in a worker thread while the owner appends (compaction does this on closed
segments).
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from bisect import bisect_right
from collections.abc import Iterator
from pathlib import Path

from liftlog.histogram import FSYNC_SECONDS
from liftlog.recordformat import BATCH_HEADER_SIZE, BatchHeader, batch_crc_ok

from .descriptors import DescriptorBudget
from .encryption import MissingMasterKey, PartitionCipher, is_encrypted
from .errors import CorruptBatch, InvalidBatch, StorageError, WriteFailed
from .fileio import DEFAULT_FILE_IO, FileIO
from .index import OffsetIndex, TimeIndex
from .records import (
    encode_empty_batch,
    iter_batch_headers,
    parse_batch_header,
    record_keys,
    retain_records,
)

__all__ = ["Segment", "TornWrite", "segment_name"]

log = logging.getLogger(__name__)

_SCAN_CHUNK = 1 << 20
_HEADER_CHUNK = 16384
#: How many of the newest batches' positions a segment remembers at least (see ``Segment.find_position``).
_RECENT_BATCHES = 256
#: Offsets inside a segment are stored relative to its base in 32 bits.
MAX_RELATIVE_OFFSET = 2**32 - 2
_keys = itertools.count()


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


class TornWrite(StorageError):
    """A failed write left bytes in the file that could not be cut off again.

    The segment's ``size`` still names the end of its whole data; ``repair``
    retries the cut.
    """

    def __init__(self, segment: Segment, operation: str, cause: OSError) -> None:
        self.segment = segment
        self.operation = operation
        self.cause = cause
        super().__init__(f"{operation} {segment.log_path} failed ({cause}) and the partial write could not be undone")


class Segment:
    """A ``.log`` file with its offset and time indexes.

    ``next_offset`` is one past the last offset the segment holds (its base
    offset when empty); ``size`` is the log file's length in bytes.
    """

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        index_interval_bytes: int,
        io: FileIO = DEFAULT_FILE_IO,
        budget: DescriptorBudget | None = None,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.io = io
        #: Sealed segments give their descriptor up to this budget and read through it (None: keep it).
        self.budget = budget
        self._key = next(_keys)
        name = segment_name(base_offset)
        self.log_path = directory / f"{name}.log"
        self.index = OffsetIndex(directory / f"{name}.index", base_offset)
        self.time_index = TimeIndex(directory / f"{name}.timeindex", base_offset)
        self._fd: int | None = io.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        try:
            self.size = io.size(self._fd)
        except OSError:
            io.close(self._fd)
            raise
        #: The index files on disk match the entries in memory (set once written or loaded).
        self.sealed = False
        self.next_offset = base_offset
        self.max_timestamp = -1
        #: Wall-clock ns when the segment got its first batch (for age-based rolling).
        self.first_append_ns: int | None = None
        self._bytes_since_index = 0
        self.closed = False
        # Where the newest batches appended since opening start, in offset order: reads at the tail (a
        # follower's fetch, a subscriber keeping up) find their batch here instead of walking batch
        # headers from the last index entry, which for small batches is a dozen header reads.
        self._recent_bases: list[int] = []
        self._recent_ends: list[int] = []
        self._recent_positions: list[int] = []

    # -- opening -------------------------------------------------------

    @classmethod
    def create(
        cls,
        directory: Path,
        base_offset: int,
        index_interval_bytes: int,
        io: FileIO = DEFAULT_FILE_IO,
        budget: DescriptorBudget | None = None,
    ) -> Segment:
        seg = cls(directory, base_offset, index_interval_bytes, io, budget)
        if seg.size:
            seg.close()
            raise FileExistsError(f"segment {seg.log_path} already exists and is not empty")
        return seg

    @classmethod
    def open_closed(
        cls,
        directory: Path,
        base_offset: int,
        index_interval_bytes: int,
        io: FileIO = DEFAULT_FILE_IO,
        budget: DescriptorBudget | None = None,
    ) -> Segment:
        """Open a segment that is not the newest: its data must be whole.

        Indexes that fail their checks are rebuilt. The tail after the last
        index entry is walked to learn ``next_offset``; if that entry does
        not point at its batch, the indexes are rebuilt from the whole file.
        A batch that cannot be parsed there is an error, never skipped.
        """
        seg = cls(directory, base_offset, index_interval_bytes, io, budget)
        try:
            if not seg.index.load(io, seg.size) or not seg.time_index.load(io, seg.index.offsets):
                log.warning("%s: indexes missing or invalid, rebuilding from the log", seg.index.path)
                seg.rebuild_indexes(verify=False)
                seg.save_indexes()
                seg.release_descriptor()
                return seg
            seg.sealed = True
            try:
                seg._scan_tail()
            except CorruptBatch as exc:
                log.warning("%s: index does not match the log (%s), rebuilding", seg.index.path, exc)
                seg.rebuild_indexes(verify=False)
                seg.save_indexes()
        except BaseException:
            seg.close()
            raise
        seg.release_descriptor()
        return seg

    def _scan_tail(self) -> None:
        """Learn next_offset, max timestamp and index spacing from the last index entry on."""
        self._forget_recent()
        start = max(self.index.last_position, 0)
        expected = self.index.offsets[-1] if len(self.index) else None
        self.next_offset = self.base_offset
        self.max_timestamp = self.time_index.max_timestamp
        since = self.index_interval_bytes
        end = start
        for header in self._walk(start, strict=True):
            if expected is not None and header.position == start and header.base_offset != expected:
                raise CorruptBatch(str(self.log_path), start, f"index names offset {expected} here")
            self.next_offset = header.next_offset
            self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
            end = header.position + header.size
            since = end - start
        if end != self.size:
            raise CorruptBatch(str(self.log_path), end, "segment ends with a partial batch")
        if self.size == 0:
            self.first_append_ns = None
            since = self.index_interval_bytes
        self._bytes_since_index = since

    @classmethod
    def open_active(
        cls,
        directory: Path,
        base_offset: int,
        index_interval_bytes: int,
        io: FileIO = DEFAULT_FILE_IO,
        budget: DescriptorBudget | None = None,
    ) -> Segment:
        """Open the newest segment, validating every batch and cutting a torn tail."""
        seg = cls(directory, base_offset, index_interval_bytes, io, budget)
        try:
            seg.rebuild_indexes(verify=True)
        except BaseException:
            seg.close()
            raise
        return seg

    def rebuild_indexes(self, verify: bool) -> None:
        """Rebuild both indexes by scanning the log.

        With ``verify`` (the active segment), a batch that fails its checks
        or offset order ends the valid data: the file is truncated there and
        a warning says how much was dropped. Without it, such a batch is an
        error naming the file and position. The files are the caller's
        to rewrite (``save_indexes``).
        """
        offsets: list[tuple[int, int]] = []
        times: list[tuple[int, int]] = []
        self._forget_recent()
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self.first_append_ns = None
        since = self.index_interval_bytes
        end = 0
        for header in self._walk(0, strict=not verify, verify=verify):
            if header.base_offset < self.next_offset:
                if not verify:
                    raise CorruptBatch(
                        str(self.log_path), header.position, "batch offsets go backwards", header.base_offset
                    )
                break
            if self.first_append_ns is None:
                self.first_append_ns = header.first_timestamp
            self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
            if since >= self.index_interval_bytes:
                offsets.append((header.base_offset, header.position))
                times.append((self.max_timestamp, header.base_offset))
                since = 0
            since += header.size
            self.next_offset = header.next_offset
            end = header.position + header.size
        if end != self.size:
            if not verify:
                raise CorruptBatch(str(self.log_path), end, "segment ends with a partial batch")
            log.warning(
                "%s: dropping %d bytes of torn or corrupt data from byte %d to the end",
                self.log_path,
                self.size - end,
                end,
            )
            self.io.ftruncate(self._writable(), end)
            self.size = end
        self._bytes_since_index = since
        self.index.replace(offsets)
        self.time_index.replace(times)

    def save_indexes(self) -> None:
        """Write both index files; on failure remove them so no stale copy outlives this one."""
        try:
            self.index.save(self.io)
            self.time_index.save(self.io)
            self.sealed = True
        except OSError as exc:
            log.warning("%s: cannot write the indexes (%s); they will be rebuilt at the next open", self.log_path, exc)
            self.sealed = False
            self.remove_index_files()

    def remove_index_files(self) -> None:
        for path in (self.index.path, self.time_index.path):
            try:
                self.io.unlink(path)
            except OSError as exc:
                log.warning("%s: cannot remove (%s); a stale index is rebuilt when it fails its checks", path, exc)

    def _walk(self, position: int, strict: bool, verify: bool = False) -> Iterator[BatchHeader]:
        """Headers of the batches from ``position`` to the end of the file.

        Without ``verify`` only headers are read (a small read per jump, so
        lookups stay cheap); with it every batch is read whole and its CRC
        checked. Non-strict: stops quietly at the first batch that is cut
        off or fails its checks. Strict: such a batch raises CorruptBatch.
        """
        chunk = _HEADER_CHUNK if not verify else _SCAN_CHUNK
        buf = b""
        buf_start = position
        while position < self.size:
            rel = position - buf_start
            if rel + BATCH_HEADER_SIZE > len(buf):
                buf = self.pread(position, chunk)
                buf_start, rel = position, 0
            try:
                header = _moved(parse_batch_header(buf, rel), buf_start)
            except InvalidBatch as exc:
                if strict:
                    raise CorruptBatch(str(self.log_path), position, str(exc)) from None
                return
            end = position + header.size
            problem = ""
            if end > self.size:
                problem = "batch runs past the end of the file"
            elif verify:
                if end - buf_start > len(buf):
                    buf = self.pread(position, max(chunk, header.size))
                    buf_start = position
                if not batch_crc_ok(buf, _moved(header, -buf_start)):
                    problem = "CRC mismatch"
            if problem:
                if strict:
                    raise CorruptBatch(str(self.log_path), position, problem, header.base_offset)
                return
            yield header
            position = end

    # -- writing -------------------------------------------------------

    def append(self, data: bytes, headers: list[BatchHeader], now_ns: int) -> None:
        """Write whole batches (positions in ``headers`` relative to ``data``), all or nothing.

        Raises WriteFailed (the file is as before) or TornWrite (bytes past
        ``size`` are left over; ``repair`` cuts them).
        """
        position = self.size
        try:
            self.io.write_all(self._writable(), data)
        except OSError as exc:
            self._undo("write", exc)
        if self.first_append_ns is None:
            self.first_append_ns = now_ns
        since = self._bytes_since_index
        interval = self.index_interval_bytes
        bases, ends, positions = self._recent_bases, self._recent_ends, self._recent_positions
        for h in headers:
            if h.max_timestamp > self.max_timestamp:
                self.max_timestamp = h.max_timestamp
            if since >= interval or position == 0:
                self.index.append(h.base_offset, position + h.position)
                self.time_index.append(self.max_timestamp, h.base_offset)
                since = 0
            since += h.size
            bases.append(h.base_offset)
            ends.append(h.next_offset)
            positions.append(position + h.position)
        if len(bases) > 2 * _RECENT_BATCHES:
            del bases[:-_RECENT_BATCHES], ends[:-_RECENT_BATCHES], positions[:-_RECENT_BATCHES]
        self._bytes_since_index = since
        self.size = position + len(data)
        self.next_offset = headers[-1].next_offset

    def _forget_recent(self) -> None:
        """The file changed other than by appending: the remembered positions may be wrong."""
        self._recent_bases.clear()
        self._recent_ends.clear()
        self._recent_positions.clear()

    def _undo(self, operation: str, cause: OSError) -> None:
        """Cut whatever a failed write left past ``size``; always raises."""
        if self.repair():
            raise WriteFailed(operation, str(self.log_path), cause) from cause
        raise TornWrite(self, operation, cause) from cause

    def repair(self) -> bool:
        """Cut the file back to ``size`` (the end of its whole batches); True if it now ends there."""
        try:
            fd = self._writable()
            if self.io.size(fd) != self.size:
                self.io.ftruncate(fd, self.size)
            return self.io.size(fd) == self.size
        except OSError as exc:
            log.debug("%s: repair failed: %s", self.log_path, exc)
            return False

    def flush(self) -> None:
        """fsync the log file (the indexes are rebuilt from it, see ``seal``)."""
        if self._fd is not None:  # without one nothing was written since it was sealed (and fsynced)
            started = time.perf_counter()
            self.io.fsync(self._fd)
            FSYNC_SECONDS.observe(time.perf_counter() - started)

    def seal(self) -> None:
        """The segment stops being the active one: make its data durable and write its indexes."""
        self.flush()
        self.save_indexes()
        self.release_descriptor()

    def _writable(self) -> int:
        """The descriptor writes go through; a sealed segment written again (truncation) takes it back."""
        if self._fd is None:
            self._fd = self.io.open(self.log_path, os.O_RDWR | os.O_APPEND)
            if self.budget is not None:
                self.budget.forget(self.io, self._key)
        return self._fd

    def release_descriptor(self) -> None:
        """Sealed: read through the budget from now on, so idle segments hold no descriptor."""
        if self.budget is not None and self._fd is not None:
            fd, self._fd = self._fd, None
            self.io.close(fd)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self._fd is not None:
                self.io.close(self._fd)
            if self.budget is not None:
                self.budget.forget(self.io, self._key)

    def delete(self) -> None:
        """Remove the files; the descriptor stays open until ``close`` for readers still on it."""
        for path in (self.log_path, self.index.path, self.time_index.path):
            self.io.unlink(path)

    def _cut_at(self, offset: int, cipher: PartitionCipher | None) -> tuple[int, BatchHeader | None, bytes]:
        """Where ``truncate_to(offset)`` cuts, the header of the batch there, and what to write back of it."""
        position = self.find_position(offset) if offset < self.next_offset else self.size
        if position >= self.size:
            return position, None, b""
        header = self.header_at(position)
        if header.base_offset >= offset:
            return position, header, b""
        batch: bytes | memoryview = self.pread(position, header.size)
        at_zero = _moved(header, -position)
        encrypted = is_encrypted(at_zero)
        if encrypted:
            if cipher is None or not cipher.can_encrypt:
                raise MissingMasterKey(
                    f"{self.log_path}: cannot cut the encrypted batch at offset {header.base_offset} "
                    f"back to offset {offset} without the encryption master key; nothing was truncated"
                )
            batch = cipher.decrypt(batch, at_zero)
            at_zero = parse_batch_header(batch)
        keep = [o - header.base_offset for o, _ in record_keys(batch, at_zero) if o < offset]
        lod = offset - header.base_offset - 1
        kept = retain_records(batch, at_zero, keep, lod)
        if kept is not None and encrypted:
            assert cipher is not None
            kept = cipher.encrypt(kept)
        return position, header, kept or encode_empty_batch(header.base_offset, lod, header.leader_epoch)

    def truncate_to(self, offset: int, cipher: PartitionCipher | None = None) -> None:
        """Remove every record at or above ``offset``.

        A batch that straddles ``offset`` is rewritten with the records below
        it, still covering offsets up to ``offset - 1`` (decrypted by
        ``cipher`` and encrypted again if it is encrypted). If the data that
        remains ends below ``offset`` (a gap), ``next_offset`` ends up below
        it too: the log fills the gap.
        """
        if offset < self.base_offset:
            return
        try:
            position, header, tail = self._cut_at(offset, cipher)
        except OSError as exc:  # reading what to keep failed: nothing changed yet
            raise WriteFailed("truncate", str(self.log_path), exc) from exc
        if header is not None:
            try:
                self.io.ftruncate(self._writable(), position)
            except OSError as exc:
                raise WriteFailed("truncate", str(self.log_path), exc) from exc
            self.size = position
            if self.sealed:  # the files on disk still index the cut data
                self.sealed = False
                self.remove_index_files()
            self.index.truncate_from_position(position + 1 if tail else position)
            self.time_index.truncate_from_offset(offset)
            if tail:
                try:
                    self.io.write_all(self._writable(), tail)
                except OSError as exc:
                    # The segment now ends before the straddling batch: shorter than asked, but whole.
                    self.index.truncate_from_position(position)
                    self.time_index.truncate_from_offset(header.base_offset)
                    self._scan_tail()
                    self._undo("write", exc)
                self.size += len(tail)
            self._scan_tail()

    # -- reading -------------------------------------------------------

    def pread(self, position: int, size: int) -> bytes:
        fd = self._fd
        if fd is None and self.budget is not None:
            return self.budget.pread(self.io, self._key, self.log_path, size, position)
        assert fd is not None
        return self.io.pread(fd, size, position)

    def header_at(self, position: int) -> BatchHeader:
        raw = self.pread(position, BATCH_HEADER_SIZE)
        try:
            return _moved(parse_batch_header(raw), position)
        except InvalidBatch as exc:
            raise CorruptBatch(str(self.log_path), position, str(exc)) from None

    def find_position(self, offset: int, _retried: bool = False) -> int:
        """Byte position of the batch holding ``offset``, or of the first batch after it.

        Returns ``size`` when no batch in this segment reaches ``offset``.
        An index entry that does not point at the batch it names means the
        index is damaged: it is rebuilt and the lookup repeated.
        """
        bases = self._recent_bases
        if bases and bases[0] <= offset:
            i = bisect_right(bases, offset) - 1
            if offset < self._recent_ends[i]:
                return self._recent_positions[i]
            return self._recent_positions[i + 1] if i + 1 < len(bases) else self.size
        indexed_offset, position = self.index.lookup(offset)
        first = indexed_offset >= 0
        for header in self._walk(position, strict=True):
            if first and header.base_offset != indexed_offset:
                if _retried:
                    raise CorruptBatch(str(self.log_path), position, "index and log disagree after a rebuild")
                log.warning("%s: index entry for offset %d is wrong, rebuilding", self.index.path, indexed_offset)
                self.rebuild_indexes(verify=False)
                if self.sealed:
                    self.save_indexes()
                return self.find_position(offset, _retried=True)
            first = False
            if header.next_offset > offset:
                return header.position
        return self.size

    def batches(self, position: int = 0, chunk_bytes: int = _SCAN_CHUNK) -> Iterator[tuple[memoryview, BatchHeader]]:
        """(batch bytes, header) of every whole batch from ``position`` to the end.

        Each header's position is relative to its own bytes (zero). Reads in
        chunks of about ``chunk_bytes`` (one system call per chunk, not per
        batch); the caller stops iterating when it has enough. Malformed
        data raises CorruptBatch naming the file and position.
        """
        end = self.size
        chunk_bytes = min(max(chunk_bytes, 64 * 1024), _SCAN_CHUNK)
        while position < end:
            chunk = memoryview(self.pread(position, min(chunk_bytes, end - position)))
            consumed = 0
            try:
                for header in iter_batch_headers(chunk):
                    start = header.position
                    consumed = start + header.size
                    yield chunk[start:consumed], _moved(header, -start)
            except InvalidBatch as exc:
                raise CorruptBatch(str(self.log_path), position + consumed, str(exc)) from None
            if consumed == 0:
                header = self.header_at(position)
                data = self.pread(position, header.size)
                if len(data) < header.size:
                    raise CorruptBatch(str(self.log_path), position, "batch runs past the end of the file")
                consumed = header.size
                yield memoryview(data), _moved(header, -position)
            position += consumed

    def iter_headers(self, position: int = 0) -> Iterator[BatchHeader]:
        """Headers of the batches from ``position``; corrupt data raises CorruptBatch."""
        return self._walk(position, strict=True)

    def check_crc(self, data: bytes | memoryview, header: BatchHeader) -> None:
        """Raise CorruptBatch unless ``data`` (one batch, header at 0) passes its CRC."""
        if not batch_crc_ok(data, header):
            position = self.find_position(header.base_offset)
            raise CorruptBatch(str(self.log_path), position, "CRC mismatch", header.base_offset)

    def __repr__(self) -> str:
        return f"Segment({self.log_path.name}, next_offset={self.next_offset}, size={self.size})"


def _moved(header: BatchHeader, delta: int) -> BatchHeader:
    """The same header with its position shifted by ``delta``."""
    return BatchHeader(
        header.base_offset,
        header.length,
        header.leader_epoch,
        header.magic,
        header.crc,
        header.attributes,
        header.last_offset_delta,
        header.first_timestamp,
        header.max_timestamp,
        header.record_count,
        position=header.position + delta,
    )
