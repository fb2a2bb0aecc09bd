"""A budget of open descriptors for sealed segments, shared by every log of a server.

An active segment keeps its log file open (it is written all the time). A
sealed segment is only read, mostly near the tail, so its descriptor is
opened when a read needs it and closed again, least recently used first,
once more than ``limit`` are open. Without this, descriptors grow with the
number of segments on disk (retention of a week of small segments, or
thousands of partitions) until the process hits its open-file limit and
every partition's writes fail with EMFILE.

Thread-safe: compaction reads sealed segments from a worker thread. A
descriptor being read from is pinned and never closed under the reader.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import OrderedDict
from pathlib import Path

from .fileio import FileIO

__all__ = ["DescriptorBudget"]


class _Entry:
    __slots__ = ("doomed", "fd", "pins")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.pins = 0
        self.doomed = False


class DescriptorBudget:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the descriptor budget must be at least 1, got {limit}")
        self.limit = limit
        #: By segment key (unique per Segment object: compaction puts a new file under an old name).
        self._open: OrderedDict[int, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def open_count(self) -> int:
        """Descriptors of sealed segments open now."""
        return len(self._open)

    def pread(self, io: FileIO, key: int, path: Path, size: int, position: int) -> bytes:
        entry = self._acquire(io, key, path)
        try:
            return io.pread(entry.fd, size, position)
        finally:
            self._release(io, entry)

    def forget(self, io: FileIO, key: int) -> None:
        """The segment is closed or written again: close its descriptor (once no read uses it)."""
        with self._lock:
            entry = self._open.pop(key, None)
            if entry is None:
                return
            if entry.pins:
                entry.doomed = True
                return
        io.close(entry.fd)

    def _acquire(self, io: FileIO, key: int, path: Path) -> _Entry:
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:
                self._open.move_to_end(key)
                entry.pins += 1
                return entry
            try:
                fd = io.open(path, os.O_RDONLY)
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE) or not self._evict(io, 0):
                    raise
                fd = io.open(path, os.O_RDONLY)  # descriptors given back: one more try
            entry = _Entry(fd)
            entry.pins = 1
            self._open[key] = entry
            self._evict(io, self.limit)
            return entry

    def _release(self, io: FileIO, entry: _Entry) -> None:
        with self._lock:
            entry.pins -= 1
            close = entry.doomed and not entry.pins
            if len(self._open) > self.limit:  # a pinned one kept the budget over its limit
                self._evict(io, self.limit)
        if close:
            io.close(entry.fd)

    def _evict(self, io: FileIO, keep: int) -> bool:
        """Close unpinned descriptors, least recently used first, until ``keep`` are open; True if any closed."""
        closed = False
        for key in list(self._open):
            if len(self._open) <= keep:
                break
            entry = self._open[key]
            if entry.pins:
                continue
            del self._open[key]
            io.close(entry.fd)
            closed = True
        return closed
