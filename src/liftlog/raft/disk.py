"""``DiskStorage``: ``MemoryStorage``'s semantics, made durable (one directory per raft node).

Files in the directory (all integers big-endian; payloads are ``codec`` encodings)::

    hardstate                          the last HardState saved
      0  4s   magic b"LRHS"
      4  u32  payload length
      8  u32  CRC-32C of the payload
     12  ...  payload: encode_hard_state(...)

    snapshot-<index:020d>.snap         one snapshot; the newest ``retain_snapshots`` are kept
      same layout, magic b"LRSN", payload: encode_snapshot(...)

    wal-<first index:020d>.log         write-ahead log: one record per entry, from ``first index`` on
      record
      0  u32  payload length           at least 22 (an entry with empty data)
      4  u32  CRC-32C of bytes 0..3 followed by the payload
      8  ...  payload: encode_entry(...)

``hardstate`` and snapshot files are replaced atomically (write ``<name>.tmp``, fsync,
rename, fsync the directory), so they are old or new, never a mix; a bad one is damage,
not a crash. Records of one WAL file hold consecutive indexes. An append that overwrites
from index i first truncates the file at i's record (offsets are kept in memory).
Compaction and snapshot installation write the snapshot, then a complete new WAL holding
only the entries after it (atomically, like the snapshot), then delete the older WAL files
and snapshots beyond the retention count.

Recovery on ``open`` (a crash may stop a save or a compaction between any two steps):
- ``*.tmp`` files are deleted: their rename never happened.
- The newest snapshot that passes its checks wins. A newer damaged one is only skipped
  (renamed to ``<name>.corrupt``) if the WAL still holds every entry up to its index.
- WAL files are read in order of first index; a later file replaces what earlier ones hold
  from its first index on (it was written later). Entries at or below the snapshot's index
  are dropped; so is everything when the WAL's entry at the snapshot's index has another
  term (an installed snapshot replaced a conflicting log, and the crash came before the
  WAL rewrite). A WAL that starts beyond the snapshot's index + 1 leaves a gap: an error.
- A bad record at the end of the newest WAL file with no valid record after it is a write
  the crash interrupted, never acknowledged: it is truncated away with a warning. Any other
  bad record, a bad ``hardstate`` or an unusable snapshot raises ``RaftStorageError``.
- When recovery leaves anything but exactly one WAL file holding exactly the entries
  after the snapshot, the interrupted compaction is finished by writing that file.

Blocking I/O: a driver calls this from a worker thread. Not thread-safe: one owner.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

import crc32c

from .codec import (
    CodecError,
    decode_entry,
    decode_hard_state,
    decode_snapshot,
    encode_entry,
    encode_hard_state,
    encode_snapshot,
)
from .errors import RaftError
from .types import Entry, HardState, PersistedState, Ready, Snapshot

__all__ = ["DiskStorage", "RaftStorageError"]

log = logging.getLogger(__name__)

HARDSTATE_FILE = "hardstate"
_HARDSTATE_MAGIC = b"LRHS"
_SNAPSHOT_MAGIC = b"LRSN"
_FILE_HEAD = struct.Struct(">4sII")  # magic, payload length, CRC-32C of the payload
_RECORD_HEAD = struct.Struct(">II")  # payload length, CRC-32C of (length bytes + payload)
_U32 = struct.Struct(">I")
_MIN_RECORD = 22  # version byte + 21-byte entry body with empty data
_WAL_NAME = re.compile(r"wal-(\d{20})\.log")
_SNAPSHOT_NAME = re.compile(r"snapshot-(\d{20})\.snap")
_datasync = getattr(os, "fdatasync", os.fsync)


class RaftStorageError(RaftError):
    """A raft storage file is damaged beyond what a crash can explain; names the file and byte."""

    def __init__(self, path: Path, offset: int | None, problem: str) -> None:
        self.path = path
        self.offset = offset
        self.problem = problem
        where = f"{path} at byte {offset}" if offset is not None else str(path)
        super().__init__(f"raft storage file {where}: {problem}")


def _wal_path(directory: Path, first: int) -> Path:
    return directory / f"wal-{first:020d}.log"


def _snapshot_path(directory: Path, index: int) -> Path:
    return directory / f"snapshot-{index:020d}.snap"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def _frame(entries: Sequence[Entry], offset: int) -> tuple[bytes, list[int]]:
    """WAL records for ``entries`` written at ``offset``, and each record's offset."""
    parts: list[bytes] = []
    offsets: list[int] = []
    for e in entries:
        payload = encode_entry(e)
        length = _U32.pack(len(payload))
        parts += (length, _U32.pack(crc32c.crc32c(payload, crc32c.crc32c(length))), payload)
        offsets.append(offset)
        offset += _RECORD_HEAD.size + len(payload)
    return b"".join(parts), offsets


def _record_problem(buf: memoryview, pos: int) -> str | None:
    """Why the record at ``pos`` is unusable, or None when its frame and CRC are sound."""
    left = len(buf) - pos
    if left < _RECORD_HEAD.size:
        return f"partial record header ({left} of {_RECORD_HEAD.size} bytes)"
    n, crc = _RECORD_HEAD.unpack_from(buf, pos)
    if n < _MIN_RECORD:
        return f"record length {n} is below the {_MIN_RECORD}-byte minimum"
    if n > left - _RECORD_HEAD.size:
        return f"record of {n} bytes runs past the end of the file ({left - _RECORD_HEAD.size} bytes left)"
    if crc32c.crc32c(buf[pos + 8 : pos + 8 + n], crc32c.crc32c(buf[pos : pos + 4])) != crc:
        return f"CRC mismatch in a record of {n} bytes"
    return None


def _next_sound_record(buf: memoryview, start: int) -> int | None:
    """Offset of the first sound record at or after ``start`` (a byte-by-byte search)."""
    for pos in range(start, len(buf) - _RECORD_HEAD.size - _MIN_RECORD + 1):
        if _record_problem(buf, pos) is None:
            return pos
    return None


def _read_file(path: Path, magic: bytes) -> bytes:
    """The checked payload of a ``hardstate`` or snapshot file."""
    raw = path.read_bytes()
    head = _FILE_HEAD.size
    if len(raw) < head:
        raise RaftStorageError(path, 0, f"file is {len(raw)} bytes, shorter than its {head}-byte header")
    found, n, crc = _FILE_HEAD.unpack_from(raw)
    if found != magic:
        raise RaftStorageError(path, 0, f"bad magic {found!r}, expected {magic!r}")
    if n != len(raw) - head:
        raise RaftStorageError(path, 4, f"header gives a {n}-byte payload, the file holds {len(raw) - head}")
    if crc32c.crc32c(raw[head:]) != crc:
        raise RaftStorageError(path, head, "CRC mismatch in the payload")
    return raw[head:]


def _load_hard_state(path: Path) -> HardState:
    try:
        return decode_hard_state(_read_file(path, _HARDSTATE_MAGIC))
    except CodecError as exc:
        raise RaftStorageError(path, _FILE_HEAD.size, f"payload passes its CRC but does not decode: {exc}") from None


def _load_snapshot(path: Path, index: int) -> Snapshot:
    try:
        snap = decode_snapshot(_read_file(path, _SNAPSHOT_MAGIC))
    except CodecError as exc:
        raise RaftStorageError(path, _FILE_HEAD.size, f"payload passes its CRC but does not decode: {exc}") from None
    if snap.index != index:
        raise RaftStorageError(path, _FILE_HEAD.size, f"holds a snapshot of index {snap.index}, not {index}")
    return snap


class DiskStorage:
    """Durable raft storage with ``MemoryStorage``'s surface; see the module docstring.

    ``hard_state``, ``snapshot`` and ``entries`` are read-only views of what is stored.
    With ``fsync=True`` everything a method writes is on disk when it returns; after an
    ``OSError`` the in-memory view may be ahead of the disk: close and reopen.
    """

    def __init__(self, directory: Path, *, fsync: bool, retain_snapshots: int) -> None:
        """Use ``open``: this only records the settings."""
        if retain_snapshots < 1:
            raise ValueError(f"retain_snapshots must be at least 1, not {retain_snapshots}")
        self.directory = directory
        self._fsync = fsync
        self._retain = retain_snapshots
        self._hard_state = HardState()
        self._snapshot: Snapshot | None = None
        self._entries: list[Entry] = []
        #: Byte offset of each of ``_entries``' records in the active WAL file.
        self._offsets: list[int] = []
        self._wal = _wal_path(directory, 1)
        self._wal_fd = -1
        self._wal_size = 0

    @classmethod
    def open(cls, directory: Path, *, fsync: bool = True, retain_snapshots: int = 2) -> DiskStorage:
        """Load (recovering from a crash) or create the storage in ``directory``."""
        storage = cls(directory, fsync=fsync, retain_snapshots=retain_snapshots)
        if not directory.is_dir():
            directory.mkdir(parents=True)
            if fsync:
                _fsync_dir(directory.parent)
        storage._recover()
        return storage

    def close(self) -> None:
        if self._wal_fd >= 0:
            os.close(self._wal_fd)
            self._wal_fd = -1

    def __enter__(self) -> DiskStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DiskStorage({self._wal} base={self.base} entries={len(self._entries)})"

    # --- MemoryStorage's surface --------------------------------------------------------

    @property
    def hard_state(self) -> HardState:
        return self._hard_state

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    @property
    def entries(self) -> list[Entry]:
        """Entries after the snapshot, in index order (do not modify)."""
        return self._entries

    @property
    def base(self) -> int:
        """Index of the last entry the snapshot covers (0 without one)."""
        return self._snapshot.index if self._snapshot else 0

    def term(self, index: int) -> int | None:
        """Term of the entry at ``index``; None when it is neither stored nor the snapshot's last."""
        base = self.base
        if index == base:
            return self._snapshot.term if self._snapshot else 0
        if index < base or index > base + len(self._entries):
            return None
        return self._entries[index - base - 1].term

    def state(self) -> PersistedState:
        """What a restarting node is given."""
        return PersistedState(self._hard_state, self._snapshot, tuple(self._entries))

    def save(self, ready: Ready) -> None:
        """Persist what ``ready`` asks for, in ``Ready``'s order, before its messages are sent."""
        if ready.snapshot is not None:
            self.install_snapshot(ready.snapshot)
        if ready.entries:
            self.append(ready.entries)
        if ready.hard_state is not None and ready.hard_state != self._hard_state:
            self._check_open()
            self._write_atomic(
                self.directory / HARDSTATE_FILE, _file(_HARDSTATE_MAGIC, encode_hard_state(ready.hard_state))
            )
            self._hard_state = ready.hard_state

    def install_snapshot(self, snapshot: Snapshot) -> None:
        """A snapshot received from the leader replaces the whole log."""
        self._store_snapshot(snapshot, [])

    def append(self, entries: Sequence[Entry]) -> None:
        """Append ``entries``, first dropping stored ones from ``entries[0].index`` on."""
        if not entries:
            return
        self._check_open()
        base, first = self.base, entries[0].index
        last = base + len(self._entries)
        if not base < first <= last + 1:
            raise ValueError(f"cannot append from index {first}: stored entries are ({base}, {last}]")
        for i, e in enumerate(entries):
            if e.index != first + i:
                raise ValueError(f"entries to append are not consecutive: index {e.index} at position {i}")
        keep = first - base - 1
        if keep < len(self._entries):
            self._wal_size = self._offsets[keep]
            os.ftruncate(self._wal_fd, self._wal_size)
            del self._entries[keep:], self._offsets[keep:]
        data, offsets = _frame(entries, self._wal_size)
        _write_all(self._wal_fd, data, self._wal_size)
        if self._fsync:
            _datasync(self._wal_fd)
        self._wal_size += len(data)
        self._entries.extend(entries)
        self._offsets.extend(offsets)

    def compact(self, snapshot: Snapshot) -> None:
        """Keep a snapshot the node took (``RaftNode.compact``) and drop the entries it covers."""
        self._store_snapshot(snapshot, self._entries[max(snapshot.index - self.base, 0) :])

    # --- writing --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._wal_fd < 0:
            raise ValueError(f"{self!r} is closed")

    def _write_atomic(self, path: Path, data: bytes) -> None:
        """Replace ``path`` with ``data``: a crash leaves the old file or the new, never a mix."""
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data, 0)
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if self._fsync:
            _fsync_dir(self.directory)

    def _store_snapshot(self, snapshot: Snapshot, entries: list[Entry]) -> None:
        """Write ``snapshot``, then a WAL of ``entries`` (those after it), then prune old files."""
        self._check_open()
        if snapshot.index < self.base:
            raise ValueError(f"snapshot at index {snapshot.index} is older than the stored one at {self.base}")
        self._write_atomic(
            _snapshot_path(self.directory, snapshot.index), _file(_SNAPSHOT_MAGIC, encode_snapshot(snapshot))
        )
        self._snapshot = snapshot
        self._start_wal(entries)
        snapshots = sorted(self._listing(_SNAPSHOT_NAME), reverse=True)
        self._remove(path for _, path in snapshots[self._retain :])

    def _start_wal(self, entries: list[Entry]) -> None:
        """Make a new WAL holding exactly ``entries`` (those after the snapshot) the active one."""
        path = _wal_path(self.directory, self.base + 1)
        data, offsets = _frame(entries, 0)
        self.close()
        self._write_atomic(path, data)
        self._remove(p for _, p in self._listing(_WAL_NAME) if p != path)
        self._wal_fd = os.open(path, os.O_RDWR)
        self._wal, self._wal_size = path, len(data)
        self._entries, self._offsets = list(entries), offsets

    def _remove(self, paths: Iterable[Path]) -> None:
        removed = False
        for path in paths:
            path.unlink()
            removed = True
        if removed and self._fsync:
            _fsync_dir(self.directory)

    def _listing(self, pattern: re.Pattern[str]) -> list[tuple[int, Path]]:
        found = []
        for path in self.directory.iterdir():
            m = pattern.fullmatch(path.name)
            if m:
                found.append((int(m.group(1)), path))
        return sorted(found)

    # --- recovery ---------------------------------------------------------------------------

    def _recover(self) -> None:
        tmps = [p for p in self.directory.iterdir() if p.name.endswith(".tmp")]
        if tmps:
            log.info("%s: removing %d unfinished temporary files", self.directory, len(tmps))
            self._remove(tmps)
        hs_path = self.directory / HARDSTATE_FILE
        if hs_path.exists():
            self._hard_state = _load_hard_state(hs_path)
        snapshot, damaged = self._newest_snapshot()
        self._snapshot = snapshot
        try:
            entries, clean = self._read_wals(self._listing(_WAL_NAME))
        except RaftStorageError as exc:
            if damaged is None:
                raise
            raise damaged.cannot_fall_back(self.base, f"the WAL does not continue it ({exc})") from exc
        if damaged is not None:
            last = self.base + len(entries)
            if last < damaged.index:
                raise damaged.cannot_fall_back(self.base, f"the WAL holds entries only up to index {last}")
            log.warning("%s; using the older snapshot at index %d", damaged.error, self.base)
            path = damaged.error.path
            path.rename(path.with_name(path.name + ".corrupt"))
            if self._fsync:
                _fsync_dir(self.directory)
        if clean is not None:
            self._wal, self._entries, self._offsets = clean
            self._wal_fd = os.open(self._wal, os.O_RDWR)
            self._wal_size = os.fstat(self._wal_fd).st_size
        else:
            self._start_wal(entries)

    def _newest_snapshot(self) -> tuple[Snapshot | None, _Damaged | None]:
        """The newest usable snapshot, and the newest damaged one above it if any."""
        damaged: _Damaged | None = None
        for index, path in reversed(self._listing(_SNAPSHOT_NAME)):
            try:
                return _load_snapshot(path, index), damaged
            except RaftStorageError as exc:
                damaged = damaged or _Damaged(exc, index)
        if damaged is not None:
            raise RaftStorageError(
                damaged.error.path, damaged.error.offset, f"{damaged.error.problem}; no older snapshot is usable"
            )
        return None, None

    def _read_wals(
        self, wals: list[tuple[int, Path]]
    ) -> tuple[list[Entry], tuple[Path, list[Entry], list[int]] | None]:
        """The entries after the snapshot, and (path, entries, offsets) when the newest WAL
        file holds exactly those and nothing else needs rewriting."""
        base = self.base
        merged: list[Entry] = []
        offsets: list[int] = []
        for n, (first, path) in enumerate(wals):
            reach = max(base, merged[-1].index if merged else 0)
            if first > reach + 1:
                raise RaftStorageError(
                    path, None, f"WAL starts at index {first} but the snapshot and older WAL files end at {reach}"
                )
            got, offsets = self._read_wal(path, first, newest=n == len(wals) - 1)
            if merged and first <= merged[-1].index:
                del merged[max(first - merged[0].index, 0) :]
            elif merged and first > merged[-1].index + 1:
                merged = []  # the gap lies within the snapshot
            merged.extend(got)
        if self._snapshot is not None and merged and merged[0].index <= base <= merged[-1].index:
            at = merged[base - merged[0].index]
            if at.term != self._snapshot.term:
                log.warning(
                    "%s: WAL entry %d has term %d, the snapshot term %d: dropping the log the snapshot replaced",
                    self.directory,
                    base,
                    at.term,
                    self._snapshot.term,
                )
                return [], None
        after = [e for e in merged if e.index > base]
        if len(wals) == 1 and wals[0][0] == base + 1:
            return after, (wals[0][1], after, offsets)
        return after, None

    def _read_wal(self, path: Path, first: int, *, newest: bool) -> tuple[list[Entry], list[int]]:
        """Entries and record offsets of one WAL file; truncates a torn tail of the newest."""
        buf = memoryview(path.read_bytes())
        entries: list[Entry] = []
        offsets: list[int] = []
        pos = 0
        while pos < len(buf):
            problem = _record_problem(buf, pos)
            if problem is not None:
                if not newest:
                    raise RaftStorageError(path, pos, problem)
                sound = _next_sound_record(buf, pos + 1)
                if sound is not None:
                    raise RaftStorageError(path, pos, f"{problem}, yet a valid record follows at byte {sound}")
                log.warning(
                    "%s: truncating %d bytes at byte %d, a write the crash interrupted (%s)",
                    path,
                    len(buf) - pos,
                    pos,
                    problem,
                )
                os.truncate(path, pos)
                if self._fsync:
                    fd = os.open(path, os.O_RDWR)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                break
            (n,) = _U32.unpack_from(buf, pos)
            try:
                entry = decode_entry(buf[pos + 8 : pos + 8 + n])
            except CodecError as exc:
                raise RaftStorageError(path, pos, f"record passes its CRC but does not decode: {exc}") from None
            if entry.index != first + len(entries):
                raise RaftStorageError(path, pos, f"record holds entry {entry.index}, expected {first + len(entries)}")
            entries.append(entry)
            offsets.append(pos)
            pos += _RECORD_HEAD.size + n
        return entries, offsets


class _Damaged:
    """A snapshot file that failed its checks, and the index its name gives."""

    __slots__ = ("error", "index")

    def __init__(self, error: RaftStorageError, index: int) -> None:
        self.error = error
        self.index = index

    def cannot_fall_back(self, older: int, why: str) -> RaftStorageError:
        e = self.error
        return RaftStorageError(
            e.path, e.offset, f"{e.problem}; the older snapshot at index {older} cannot replace it: {why}"
        )


def _file(magic: bytes, payload: bytes) -> bytes:
    return _FILE_HEAD.pack(magic, len(payload), crc32c.crc32c(payload)) + payload
