"""Sparse segment indexes: offset -> file position and timestamp -> offset.

``.index`` holds 8-byte entries ``(uint32 offset - segment base, uint32
position)``, one for the first batch of the segment and then at most one per
``index_interval_bytes`` of log, each naming the start of a batch.
``.timeindex`` holds 12-byte entries ``(int64 max timestamp so far, uint32
offset - segment base)``, one for each offset index entry and naming the
same batch, so the two files must have the same number of entries: a time
index cut short by a crash is detected and rebuilt. Both are sorted, so
lookups are a binary search over an in-memory copy.

Index files carry no checksum: like Kafka, they are checked for sanity when
a segment is opened and rebuilt from the log when in doubt, and a lookup
that lands on a position whose batch does not match is reported to the
segment, which rebuilds. Not safe to share between threads.

The entries live in memory; the files are written whole (``save``) only
when a segment is sealed: the active segment's indexes are rebuilt from
its log at every open anyway, so writing them per append would cost a
system call and a descriptor per file and add a step that can fail
after the batch is already in the log.
"""

from __future__ import annotations

import bisect
import struct
from pathlib import Path

from .fileio import FileIO

__all__ = ["OffsetIndex", "TimeIndex"]

_OFFSET_ENTRY = struct.Struct(">II")
_TIME_ENTRY = struct.Struct(">qI")


class _SortedIndex:
    """Two parallel sorted columns backed by an append-only file of fixed entries."""

    ENTRY: struct.Struct

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._keys: list[int] = []
        self._values: list[int] = []

    # -- file handling -------------------------------------------------

    def _read_entries(self, io: FileIO) -> list[tuple[int, int]] | None:
        """Entries on disk, None if the file is missing, unreadable or not whole entries."""
        try:
            raw = io.read_file(self.path)
        except OSError:
            return None
        if len(raw) % self.ENTRY.size:
            return None
        return [self._decode(*e) for e in self.ENTRY.iter_unpack(raw)]

    def _decode(self, a: int, b: int) -> tuple[int, int]:
        raise NotImplementedError

    def _encode(self, key: int, value: int) -> bytes:
        raise NotImplementedError

    def replace(self, entries: list[tuple[int, int]]) -> None:
        """Replace the entries in memory (after a rebuild); ``save`` writes them."""
        self._keys = [k for k, _ in entries]
        self._values = [v for _, v in entries]

    def save(self, io: FileIO) -> None:
        """Write the entries to the file atomically (the segment is being sealed)."""
        io.write_atomic(self.path, b"".join(self._encode(k, v) for k, v in self.entries()))

    def _append(self, key: int, value: int) -> None:
        self._keys.append(key)
        self._values.append(value)

    def _truncate_entries(self, count: int) -> None:
        if count < len(self._keys):
            del self._keys[count:]
            del self._values[count:]

    def __len__(self) -> int:
        return len(self._keys)

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._keys, self._values, strict=True))


class OffsetIndex(_SortedIndex):
    """Batch base offset -> byte position of that batch in the segment's log."""

    ENTRY = _OFFSET_ENTRY

    def _decode(self, a: int, b: int) -> tuple[int, int]:
        return (self.base_offset + a, b)

    def _encode(self, key: int, value: int) -> bytes:
        return _OFFSET_ENTRY.pack(key - self.base_offset, value)

    def load(self, io: FileIO, log_size: int) -> bool:
        """Read the file; False (and nothing loaded) if it fails the sanity check."""
        entries = self._read_entries(io)
        if entries is None:
            return False
        prev_off, prev_pos = self.base_offset - 1, -1
        for off, pos in entries:
            if off <= prev_off or pos <= prev_pos or pos >= log_size:
                return False
            prev_off, prev_pos = off, pos
        if entries and entries[0][1] != 0:
            return False
        self._keys = [o for o, _ in entries]
        self._values = [p for _, p in entries]
        return True

    def append(self, offset: int, position: int) -> None:
        self._append(offset, position)

    @property
    def last_position(self) -> int:
        return self._values[-1] if self._values else -1

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last indexed batch starting at or before ``offset``.

        ``(-1, 0)`` when no entry is that low: scan from the file's start.
        """
        i = bisect.bisect_right(self._keys, offset) - 1
        if i < 0:
            return (-1, 0)
        return (self._keys[i], self._values[i])

    def truncate_from_offset(self, offset: int) -> None:
        """Drop entries for batches starting at or after ``offset``."""
        self._truncate_entries(bisect.bisect_left(self._keys, offset))

    @property
    def offsets(self) -> list[int]:
        return list(self._keys)

    def truncate_from_position(self, position: int) -> None:
        """Drop entries for batches at or after byte ``position``."""
        self._truncate_entries(bisect.bisect_left(self._values, position))


class TimeIndex(_SortedIndex):
    """Max timestamp so far -> offset of the batch that reached it."""

    ENTRY = _TIME_ENTRY

    def _decode(self, a: int, b: int) -> tuple[int, int]:
        return (a, self.base_offset + b)

    def _encode(self, key: int, value: int) -> bytes:
        return _TIME_ENTRY.pack(key, value - self.base_offset)

    def load(self, io: FileIO, batch_offsets: list[int]) -> bool:
        """Read the file; False unless it names exactly ``batch_offsets`` (the offset index's)."""
        entries = self._read_entries(io)
        if entries is None or [off for _, off in entries] != batch_offsets:
            return False
        prev_ts = -(2**63)
        for ts, _ in entries:
            if ts < prev_ts:
                return False
            prev_ts = ts
        self._keys = [t for t, _ in entries]
        self._values = [o for _, o in entries]
        return True

    @property
    def max_timestamp(self) -> int:
        return self._keys[-1] if self._keys else -1

    def append(self, timestamp: int, offset: int) -> None:
        """Add the entry for the batch at ``offset``; ``timestamp`` is the max so far."""
        if self._keys:
            timestamp = max(timestamp, self._keys[-1])
        self._append(timestamp, offset)

    def lookup(self, timestamp: int) -> int:
        """An offset such that every record before it has a timestamp < ``timestamp``."""
        i = bisect.bisect_left(self._keys, timestamp) - 1
        return self.base_offset if i < 0 else self._values[i]

    def truncate_from_offset(self, offset: int) -> None:
        self._truncate_entries(bisect.bisect_left(self._values, offset))
