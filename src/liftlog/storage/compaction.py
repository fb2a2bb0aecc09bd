"""Key compaction: keep the newest record of each key in closed segments.

Rules: records without a key are always kept; a keyed record survives only
if it is the newest record for its key at or below the cleaning bound (the
high watermark); offsets never change, so compaction leaves gaps. Batches
keep their base offset, leader epoch and offset range; a batch left with no
records is dropped.

Crash safety: a cleaned segment is first built whole in
``<dir>/.cleaning/`` and fsynced. The swap then deletes the old index files,
renames the new log over the old one (atomic), renames the new indexes in
and fsyncs the directory. A crash at any point leaves either the old or the
new log under the segment's name, possibly without indexes, which opening
rebuilds; ``.cleaning/`` is discarded at open.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from liftlog.recordformat import BatchHeader

from .encryption import MissingMasterKey, PartitionCipher, is_encrypted
from .records import encode_empty_batch, iter_batch_headers, record_keys, retain_records
from .segment import Segment

__all__ = ["CleanedSegment", "build_key_map", "clean_segment", "discard_cleaning_dir", "swap_in"]

log = logging.getLogger(__name__)

CLEANING_DIR = ".cleaning"
_WRITE_CHUNK = 1 << 20


def discard_cleaning_dir(directory: Path) -> None:
    shutil.rmtree(directory / CLEANING_DIR, ignore_errors=True)


#: Decrypts one batch if it is encrypted (``CommitLog.plain``).
Plain = Callable[[bytes | memoryview, BatchHeader], tuple[memoryview, BatchHeader]]


def _clear_only(data: bytes | memoryview, header: BatchHeader) -> tuple[memoryview, BatchHeader]:
    if is_encrypted(header):
        raise MissingMasterKey(f"compaction without a key met the encrypted batch at offset {header.base_offset}")
    return memoryview(data), header


def build_key_map(segments: list[Segment], bound: int, plain: Plain = _clear_only) -> dict[bytes, int]:
    """Newest offset below ``bound`` of every key in ``segments``."""
    latest: dict[bytes, int] = {}
    for seg in segments:
        if seg.base_offset >= bound:
            break
        for data, header in seg.batches():
            if header.base_offset >= bound:
                break
            seg.check_crc(data, header)
            data, header = plain(data, header)
            for offset, key in record_keys(data, header):
                if offset >= bound:
                    break
                if key is not None:
                    latest[key] = offset
    return latest


@dataclass
class CleanedSegment:
    """A compacted copy of one segment, built and fsynced under ``.cleaning/``."""

    segment: Segment
    records_removed: int

    def discard(self) -> None:
        self.segment.close()
        self.segment.delete()


def clean_segment(
    seg: Segment, latest: dict[bytes, int], plain: Plain = _clear_only, cipher: PartitionCipher | None = None
) -> CleanedSegment | None:
    """Build the compacted copy of ``seg``; None when it would change nothing.

    An encrypted batch that loses records is encrypted again (a new nonce) after they are removed.
    """
    work = seg.directory / CLEANING_DIR
    work.mkdir(exist_ok=True)
    for stale in work.glob(f"{seg.log_path.stem}.*"):
        seg.io.unlink(stale)
    out = Segment.create(work, seg.base_offset, seg.index_interval_bytes, seg.io)
    try:
        removed = _copy_cleaned(seg, out, latest, plain, cipher)
        if removed:
            out.seal()
    except BaseException:  # a failed read, write or key: no half-built copy is left behind
        out.close()
        out.delete()
        raise
    if not removed:
        out.close()
        out.delete()
        return None
    return CleanedSegment(out, removed)


def _copy_cleaned(
    seg: Segment, out: Segment, latest: dict[bytes, int], plain: Plain, cipher: PartitionCipher | None
) -> int:
    """Write ``seg``'s batches to ``out`` without the records ``latest`` outdates; return how many went."""
    removed = 0
    pending: list[bytes] = []
    size = 0

    def write() -> None:
        nonlocal size
        if pending:
            buf = b"".join(pending)
            out.append(buf, list(iter_batch_headers(buf)), 0)
            pending.clear()
            size = 0

    last_dropped: BatchHeader | None = None
    for data, header in seg.batches():
        seg.check_crc(data, header)
        stored = data
        encrypted = is_encrypted(header)
        data, header = plain(data, header)
        records = record_keys(data, header)
        keep = [o - header.base_offset for o, k in records if k is None or latest.get(k) == o]
        last_dropped = None
        if len(keep) == len(records):
            batch = bytes(stored)
        else:
            removed += len(records) - len(keep)
            cleaned = retain_records(data, header, keep)
            if cleaned is None:
                last_dropped = header
                continue
            batch = cleaned
            if encrypted:
                if cipher is None:
                    raise MissingMasterKey(f"{seg.log_path}: compaction cannot encrypt again without a master key")
                batch = cipher.encrypt(cleaned)
        pending.append(batch)
        size += len(batch)
        if size >= _WRITE_CHUNK:
            write()
    if last_dropped is not None:
        # Keep the segment's offset range whole so the log end offset survives.
        h = last_dropped
        pending.append(encode_empty_batch(h.base_offset, h.last_offset_delta, h.leader_epoch))
    write()
    return removed


def swap_in(old: Segment, cleaned: CleanedSegment) -> Segment:
    """Put the cleaned copy under the old segment's name; returns the segment to use.

    Until the new log is renamed in, a failure raises OSError and leaves the
    old segment in place (its index files may be gone: they are rebuilt).
    After it, failures only cost index rebuilds, and if the new segment
    cannot be opened the old one (its descriptor still on the old data)
    keeps serving: same committed records, just not compacted yet.
    """
    io = old.io
    new = cleaned.segment
    new.close()
    old.sealed = False
    io.unlink(old.index.path)
    io.unlink(old.time_index.path)
    io.replace(new.log_path, old.log_path)
    try:
        io.replace(new.index.path, old.index.path)
        io.replace(new.time_index.path, old.time_index.path)
        io.fsync_dir(old.directory)
    except OSError as exc:
        log.warning("%s: compacted, but its indexes are not in place (%s); they are rebuilt", old.log_path, exc)
    try:
        return Segment.open_closed(old.directory, old.base_offset, old.index_interval_bytes, io, old.budget)
    except OSError as exc:
        log.warning("%s: cannot open the compacted segment yet (%s); serving the old copy", old.log_path, exc)
        return old
