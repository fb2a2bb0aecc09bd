"""The file operations the storage engine performs, as one object it is given.

Every open, write, fsync, truncate, rename and unlink of a commit log goes
through a :class:`FileIO`. Production uses the plain one below; the fault
suite passes :class:`liftlog.storage.faults.FaultyFileIO`, which fails
chosen calls, writes short, and records what was fsynced so a test can cut
files back to it (power loss). The engine itself has no test branches.

Calls raise ``OSError`` as the ``os`` functions do.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["FileIO"]


class FileIO:
    """Plain ``os`` calls. Subclasses override single operations."""

    def open(self, path: Path, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def pread(self, fd: int, size: int, position: int) -> bytes:
        return os.pread(fd, size, position)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def replace(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def unlink(self, path: Path) -> None:
        """Remove ``path``; a missing file is not an error."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def read_file(self, path: Path) -> bytes:
        """A whole (small) file; FileNotFoundError if it is missing."""
        return path.read_bytes()

    # -- built from the operations above, so faults reach them too ---------

    def write_all(self, fd: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            view = view[self.write(fd, view) :]

    def fsync_dir(self, path: Path) -> None:
        """Make creations, renames and removals in directory ``path`` durable."""
        fd = self.open(path, os.O_RDONLY)
        try:
            self.fsync(fd)
        finally:
            self.close(fd)

    def write_atomic(self, path: Path, data: bytes) -> None:
        """Replace ``path`` with ``data`` so that a crash leaves old or new, never a mix.

        On an error the old file is untouched and the temporary one removed.
        """
        tmp = path.with_name(path.name + ".tmp")
        try:
            fd = self.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                self.write_all(fd, data)
                self.fsync(fd)
            finally:
                self.close(fd)
            self.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                self.unlink(tmp)
            raise
        self.fsync_dir(path.parent)


#: The instance used when a log is given none.
DEFAULT_FILE_IO = FileIO()
