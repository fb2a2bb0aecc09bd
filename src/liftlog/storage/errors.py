"""Exceptions raised by the storage engine.

Every error names the thing that is wrong and, where one exists, the valid
range, so a caller can turn it into a message a user understands.
"""

from __future__ import annotations

import errno


class StorageError(Exception):
    """Base class of every storage error."""


class OffsetOutOfRange(StorageError):
    """An offset below the log start offset or above the log end offset."""

    def __init__(self, offset: int, start: int, end: int, what: str = "read") -> None:
        self.offset = offset
        self.start = start
        self.end = end
        super().__init__(
            f"{what} at offset {offset} is out of range: the log holds offsets "
            f"[{start}, {end}) (log start offset {start}, log end offset {end})"
        )


class RecordTooLarge(StorageError):
    """A record whose encoded size exceeds the configured maximum."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"record of {size} bytes exceeds the maximum of {limit} bytes")


class NonMonotonicOffset(StorageError):
    """``append_raw`` got a batch whose offsets do not follow the log end offset."""

    def __init__(self, base_offset: int, log_end_offset: int) -> None:
        self.base_offset = base_offset
        self.log_end_offset = log_end_offset
        super().__init__(
            f"batch base offset {base_offset} is below the log end offset "
            f"{log_end_offset}: raw appends must start at offset >= {log_end_offset}"
        )


class StaleLeaderEpoch(StorageError):
    """An append with a leader epoch older than the newest one the log has seen."""

    def __init__(self, epoch: int, latest: int) -> None:
        self.epoch = epoch
        self.latest = latest
        super().__init__(f"leader epoch {epoch} is older than the log's latest epoch {latest}")


class CorruptBatch(StorageError):
    """A record batch that fails its length or CRC check where data must be whole."""

    def __init__(self, path: str, position: int, reason: str, offset: int | None = None) -> None:
        self.path = path
        self.position = position
        self.offset = offset
        where = f"{path} at byte {position}"
        if offset is not None:
            where += f" (batch base offset {offset})"
        super().__init__(f"corrupt record batch in {where}: {reason}")


class InvalidBatch(StorageError):
    """Bytes handed to the codec or to ``append_raw`` that are not valid batches."""


class LogClosed(StorageError):
    """An operation on a log that has been closed."""


def _os_error(exc: OSError) -> str:
    """``No space left on device (ENOSPC)``: the text a user reads and the name they search for."""
    name = errno.errorcode.get(exc.errno, "") if exc.errno is not None else ""
    return f"{exc.strerror or exc} ({name})" if name else str(exc)


class WriteFailed(StorageError):
    """A write failed and was undone: the log is exactly as it was before the call."""

    def __init__(self, operation: str, path: str, cause: OSError) -> None:
        self.operation = operation
        self.path = path
        self.cause = cause
        super().__init__(f"cannot {operation} {path}: {_os_error(cause)}; nothing of this write was stored")


class LogFenced(StorageError):
    """A failed write could not be undone: the log refuses writes until it is repaired.

    It stays readable up to ``readable_to`` (exclusive), the end of what it
    last wrote whole. Each later write first retries the repair, so writes
    resume once the cause is gone; reopening the log (a server restart) cuts
    the torn bytes as crash recovery does.
    """

    def __init__(self, directory: str, operation: str, path: str, cause: OSError, readable_to: int) -> None:
        self.directory = directory
        self.operation = operation
        self.path = path
        self.cause = cause
        self.readable_to = readable_to
        super().__init__(
            f"log {directory} is fenced: {operation} {path} failed ({_os_error(cause)}) and could not be undone; "
            f"offsets below {readable_to} stay readable; writes resume once the cause is gone "
            "(free disk space or file descriptors: every write retries the repair) or after a server restart"
        )
