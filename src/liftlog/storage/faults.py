"""A FileIO that fails on purpose, for the fault suite.

``FaultyFileIO`` passes every call to the operating system except those a
test armed to fail (by operation, file name pattern, how many matching
calls to let through first, and for how many calls), or, with ``rates``,
a seeded random share of them. A failing write can first write part of its
bytes, as a full disk does. It also records, per file, how many bytes the
last fsync made durable, so ``power_loss`` can cut every file back to what
a machine that lost power would still have (renames and truncations are
taken as durable at once: directory entries are not modelled).

For a server in another process, ``journal`` names a file that gets one
line per change of a durable length; ``power_loss_from_journal`` applies
it after the process was killed.
"""

from __future__ import annotations

import errno as errno_module
import fnmatch
import os
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .fileio import FileIO

__all__ = ["OPERATIONS", "FaultyFileIO", "power_loss_from_journal"]

#: Operations that can be made to fail.
OPERATIONS = ("open", "write", "pread", "fsync", "ftruncate", "size", "replace", "unlink", "read_file")


@dataclass(slots=True)
class _Armed:
    operation: str
    error: int
    pattern: str
    after: int
    times: int
    partial: bool

    def matches(self, operation: str, name: str) -> bool:
        return operation == self.operation and fnmatch.fnmatch(name, self.pattern)


class FaultyFileIO(FileIO):
    def __init__(
        self,
        *,
        seed: int = 0,
        rates: dict[str, float] | None = None,
        errors: tuple[int, ...] = (errno_module.EIO, errno_module.ENOSPC, errno_module.EMFILE),
        journal: Path | None = None,
    ) -> None:
        self._armed: list[_Armed] = []
        self._rng = random.Random(seed)
        self.rates = dict(rates or {})
        self.errors = errors
        self._paths: dict[int, Path] = {}
        #: Durable length of every file written through this object.
        self.synced: dict[Path, int] = {}
        self.calls: Counter[str] = Counter()
        #: One line per failure injected: "operation file: error".
        self.injected: list[str] = []
        self._journal = journal.open("a", buffering=1) if journal is not None else None

    # -- arming ------------------------------------------------------------

    def fail(
        self,
        operation: str,
        error: int = errno_module.EIO,
        *,
        path: str = "*",
        after: int = 0,
        times: int = 1,
        partial: bool = False,
    ) -> None:
        """Fail the matching calls after ``after`` of them succeed, ``times`` times (-1: until ``clear``).

        ``path`` is a pattern over the file's name. With ``partial`` a failing
        write first writes half its bytes.
        """
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}; one of {', '.join(OPERATIONS)}")
        self._armed.append(_Armed(operation, error, path, after, times, partial))

    def clear(self) -> None:
        """Disarm every fault (the cause is gone); random rates stay."""
        self._armed.clear()

    def _check(self, operation: str, path: Path | None) -> _Armed | None:
        """The fault to inject for this call, if any (consuming one of its uses)."""
        self.calls[operation] += 1
        name = path.name if path is not None else ""
        for armed in self._armed:
            if armed.matches(operation, name):
                if armed.after > 0:
                    armed.after -= 1
                    continue
                if armed.times > 0:
                    armed.times -= 1
                    if armed.times == 0:
                        self._armed.remove(armed)
                return armed
        rate = self.rates.get(operation, 0.0)
        if rate and self._rng.random() < rate:
            return _Armed(operation, self._rng.choice(self.errors), "*", 0, 1, self._rng.random() < 0.5)
        return None

    def _raise(self, armed: _Armed, path: Path | None) -> None:
        message = os.strerror(armed.error)
        self.injected.append(f"{armed.operation} {path}: {errno_module.errorcode.get(armed.error, armed.error)}")
        raise OSError(armed.error, message, str(path) if path is not None else None)

    # -- durable lengths -----------------------------------------------------

    def _durable(self, path: Path, length: int | None) -> None:
        if length is None:
            self.synced.pop(path, None)
        else:
            self.synced[path] = length
        if self._journal is not None:
            self._journal.write(f"{path}\t{-1 if length is None else length}\n")

    def power_loss(self) -> dict[Path, int]:
        """Cut every file back to its last fsynced length; returns the bytes lost per file."""
        lost: dict[Path, int] = {}
        for path, length in self.synced.items():
            lost_bytes = _cut(path, length)
            if lost_bytes:
                lost[path] = lost_bytes
        return lost

    # -- the operations --------------------------------------------------------

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        armed = self._check("open", path)
        if armed is not None:
            self._raise(armed, path)
        existed = os.path.exists(path)
        fd = super().open(path, flags, mode)
        self._paths[fd] = Path(path)
        if flags & (os.O_WRONLY | os.O_RDWR) and Path(path) not in self.synced:
            self._durable(Path(path), os.fstat(fd).st_size if existed and not flags & os.O_TRUNC else 0)
        return fd

    def close(self, fd: int) -> None:
        self._paths.pop(fd, None)
        super().close(fd)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        path = self._paths.get(fd)
        armed = self._check("write", path)
        if armed is not None:
            if armed.partial and len(data) > 1:
                super().write(fd, data[: len(data) // 2])
            self._raise(armed, path)
        return super().write(fd, data)

    def pread(self, fd: int, size: int, position: int) -> bytes:
        path = self._paths.get(fd)
        armed = self._check("pread", path)
        if armed is not None:
            self._raise(armed, path)
        return super().pread(fd, size, position)

    def fsync(self, fd: int) -> None:
        path = self._paths.get(fd)
        armed = self._check("fsync", path)
        if armed is not None:
            self._raise(armed, path)
        super().fsync(fd)
        if path is not None and path.is_file():
            self._durable(path, os.fstat(fd).st_size)

    def ftruncate(self, fd: int, size: int) -> None:
        path = self._paths.get(fd)
        armed = self._check("ftruncate", path)
        if armed is not None:
            self._raise(armed, path)
        super().ftruncate(fd, size)
        if path is not None and self.synced.get(path, 0) > size:
            self._durable(path, size)

    def size(self, fd: int) -> int:
        path = self._paths.get(fd)
        armed = self._check("size", path)
        if armed is not None:
            self._raise(armed, path)
        return super().size(fd)

    def replace(self, src: Path, dst: Path) -> None:
        armed = self._check("replace", Path(dst))
        if armed is not None:
            self._raise(armed, Path(dst))
        super().replace(src, dst)
        length = self.synced.pop(Path(src), None)
        self._durable(Path(dst), length if length is not None else os.path.getsize(dst))

    def unlink(self, path: Path) -> None:
        armed = self._check("unlink", Path(path))
        if armed is not None:
            self._raise(armed, Path(path))
        super().unlink(path)
        if Path(path) in self.synced:
            self._durable(Path(path), None)

    def read_file(self, path: Path) -> bytes:
        armed = self._check("read_file", Path(path))
        if armed is not None:
            self._raise(armed, Path(path))
        return super().read_file(path)


def _cut(path: Path, length: int) -> int:
    try:
        size = os.path.getsize(path)
    except FileNotFoundError:
        return 0
    if size <= length:
        return 0
    os.truncate(path, length)
    return size - length


def power_loss_from_journal(journal: Path) -> dict[Path, int]:
    """Cut the files a killed process's FaultyFileIO journaled back to their durable lengths."""
    durable: dict[Path, int] = {}
    for line in journal.read_text().splitlines():
        name, _, length = line.rpartition("\t")
        if name:
            if int(length) < 0:
                durable.pop(Path(name), None)
            else:
                durable[Path(name)] = int(length)
    lost: dict[Path, int] = {}
    for path, durable_length in durable.items():
        lost_bytes = _cut(path, durable_length)
        if lost_bytes:
            lost[path] = lost_bytes
    return lost
