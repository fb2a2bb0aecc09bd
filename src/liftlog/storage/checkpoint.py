"""Small files written atomically: offset checkpoints and the leader-epoch cache.

File format (text, one item a line, so an operator can read it)::

    liftlog-checkpoint <kind> v1
    <number of entries>
    <entry>                 one per line, fields separated by a space
    crc32c <8 hex digits>   CRC-32C of every byte above this line

Writes go to ``<name>.tmp``, are fsynced, renamed over the old file, and the
directory is fsynced, so a crash leaves either the old or the new file.
A file that fails to parse or whose CRC does not match raises
CorruptCheckpoint; the log decides how to rebuild.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from .errors import StorageError
from .fileio import DEFAULT_FILE_IO, FileIO

__all__ = [
    "CorruptCheckpoint",
    "EpochEntry",
    "LeaderEpochCache",
    "OffsetCheckpoint",
    "fsync_dir",
    "read_checkpoint",
    "write_atomic",
    "write_checkpoint",
]

log = logging.getLogger(__name__)


class CorruptCheckpoint(StorageError):
    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        super().__init__(f"checkpoint file {path} is corrupt: {reason}")


def fsync_dir(path: Path) -> None:
    DEFAULT_FILE_IO.fsync_dir(path)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves old or new, never a mix."""
    DEFAULT_FILE_IO.write_atomic(path, data)


def write_checkpoint(path: Path, kind: str, entries: list[tuple[int, ...]], io: FileIO = DEFAULT_FILE_IO) -> None:
    lines = [f"liftlog-checkpoint {kind} v1", str(len(entries))]
    lines += [" ".join(str(v) for v in entry) for entry in entries]
    body = ("\n".join(lines) + "\n").encode()
    io.write_atomic(path, body + f"crc32c {crc32c(body):08x}\n".encode())


def read_checkpoint(path: Path, kind: str, arity: int, io: FileIO = DEFAULT_FILE_IO) -> list[tuple[int, ...]] | None:
    """Entries of a checkpoint file, None if it does not exist."""
    try:
        raw = io.read_file(path)
    except FileNotFoundError:
        return None
    body, sep, trailer = raw.rstrip(b"\n").rpartition(b"\n")
    if not sep or not trailer.startswith(b"crc32c "):
        raise CorruptCheckpoint(path, "missing CRC line")
    body += b"\n"
    try:
        stored = int(trailer[7:], 16)
    except ValueError:
        raise CorruptCheckpoint(path, "unreadable CRC line") from None
    if crc32c(body) != stored:
        raise CorruptCheckpoint(path, "CRC mismatch")
    lines = body.decode("ascii", "replace").splitlines()
    if not lines or lines[0] != f"liftlog-checkpoint {kind} v1":
        raise CorruptCheckpoint(path, f"expected a {kind!r} checkpoint, found header {lines[:1]!r}")
    try:
        count = int(lines[1])
        entries = [tuple(int(f) for f in line.split()) for line in lines[2:]]
    except (IndexError, ValueError):
        raise CorruptCheckpoint(path, "unreadable entries") from None
    if count != len(entries) or any(len(e) != arity for e in entries):
        raise CorruptCheckpoint(path, f"expected {count} entries of {arity} fields")
    return entries


class OffsetCheckpoint:
    """One durable offset (the high watermark, the log start offset).

    ``write`` skips the disk when the value has not changed. Not safe to
    share between threads.
    """

    def __init__(self, path: Path, kind: str, io: FileIO = DEFAULT_FILE_IO) -> None:
        self.path = path
        self.kind = kind
        self.io = io
        self._written: int | None = None

    def read(self) -> int | None:
        entries = read_checkpoint(self.path, self.kind, 1, self.io)
        if entries is None:
            return None
        if len(entries) != 1:
            raise CorruptCheckpoint(self.path, f"expected one entry, found {len(entries)}")
        self._written = entries[0][0]
        return self._written

    def write(self, value: int) -> None:
        if value != self._written:
            write_checkpoint(self.path, self.kind, [(value,)], self.io)
            self._written = value


@dataclass(frozen=True, slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


class LeaderEpochCache:
    """Leader epoch -> first offset written in that epoch (KIP-101, KIP-279).

    Entries are strictly increasing in both epoch and start offset. Every
    change is persisted before the method returns, and a change that cannot
    be persisted (OSError) leaves the cache as it was. Not safe to share
    between threads.
    """

    KIND = "leader-epoch"

    def __init__(self, path: Path, entries: list[EpochEntry] | None = None, io: FileIO = DEFAULT_FILE_IO) -> None:
        self.path = path
        self.io = io
        self._entries: list[EpochEntry] = list(entries or [])

    @classmethod
    def load(cls, path: Path, io: FileIO = DEFAULT_FILE_IO) -> LeaderEpochCache:
        """Read the cache; raises CorruptCheckpoint if the file is damaged."""
        raw = read_checkpoint(path, cls.KIND, 2, io) or []
        entries = [EpochEntry(e, o) for e, o in raw]
        for prev, cur in itertools.pairwise(entries):
            if cur.epoch <= prev.epoch or cur.start_offset < prev.start_offset:
                raise CorruptCheckpoint(path, f"entries not increasing at epoch {cur.epoch}")
        return cls(path, entries, io)

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int | None:
        return self._entries[-1].epoch if self._entries else None

    def flush(self) -> None:
        self._set(self._entries)

    def _set(self, entries: list[EpochEntry]) -> None:
        """Persist ``entries``, then adopt them."""
        write_checkpoint(self.path, self.KIND, [(e.epoch, e.start_offset) for e in entries], self.io)
        self._entries = entries

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; True if the cache changed.

        Entries that would break monotonicity (same or higher epoch, or an
        equal or later start offset) are removed first, as Kafka does when a
        replica's log was truncated behind the cache's back.
        """
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"epoch {epoch} and start offset {start_offset} must be >= 0")
        if self._entries:
            last = self._entries[-1]
            if epoch == last.epoch and start_offset >= last.start_offset:
                return False
        entries = list(self._entries)
        removed = 0
        while entries and (entries[-1].epoch >= epoch or entries[-1].start_offset >= start_offset):
            entries.pop()
            removed += 1
        entries.append(EpochEntry(epoch, start_offset))
        self._set(entries)
        if removed:
            log.warning(
                "%s: removed %d leader epoch entries to keep epoch %d at offset %d monotonic",
                self.path,
                removed,
                epoch,
                start_offset,
            )
        return True

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for a follower asking where ``requested_epoch`` ends.

        Returns the largest known epoch <= the requested one and the start
        offset of the next larger epoch (the log end offset when the
        requested epoch is the latest). ``(-1, -1)`` when the requested
        epoch is unknown or newer than every known one.
        """
        if requested_epoch < 0 or not self._entries:
            return (-1, -1)
        if requested_epoch == self._entries[-1].epoch:
            return (requested_epoch, log_end_offset)
        epochs = [e.epoch for e in self._entries]
        higher = bisect.bisect_right(epochs, requested_epoch)
        if higher == len(epochs):
            return (-1, -1)
        end = self._entries[higher].start_offset
        if higher == 0:
            return (requested_epoch, end)
        return (self._entries[higher - 1].epoch, end)

    def truncate_from_end(self, end_offset: int) -> None:
        """Forget epochs starting at or after ``end_offset`` (the log was truncated there)."""
        if self._entries and self._entries[-1].start_offset >= end_offset:
            self._set([e for e in self._entries if e.start_offset < end_offset])

    def forget_from(self, end_offset: int) -> None:
        """``truncate_from_end`` in memory only, for when the file cannot be written."""
        self._entries = [e for e in self._entries if e.start_offset < end_offset]

    def replace(self, entries: list[EpochEntry], *, persist: bool = True) -> None:
        """Put back entries saved earlier (undoing a failed write)."""
        if persist:
            self._set(list(entries))
        else:
            self._entries = list(entries)

    def truncate_from_start(self, start_offset: int, *, persist: bool = True) -> None:
        """Drop epochs wholly below ``start_offset``; the one spanning it now starts there."""
        below = [e for e in self._entries if e.start_offset <= start_offset]
        if not below or (len(below) == 1 and below[0].start_offset == start_offset):
            return
        keep = EpochEntry(below[-1].epoch, start_offset)
        self.replace([keep] + [e for e in self._entries if e.start_offset > start_offset], persist=persist)

    def clear(self) -> None:
        if self._entries:
            self._set([])
