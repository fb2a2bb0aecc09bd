"""liftlog's storage engine: the segmented commit log of one partition replica.

The public surface is small: open a ``CommitLog`` with a ``LogConfig``,
append ``NewRecord``s (or raw batches from a leader), read ``Record``s or
raw batch bytes back. ``docs/storage-format.md`` documents the files.
"""

from .checkpoint import CorruptCheckpoint, EpochEntry, LeaderEpochCache
from .config import FsyncPolicy, LogConfig
from .errors import (
    CorruptBatch,
    InvalidBatch,
    LogClosed,
    LogFenced,
    NonMonotonicOffset,
    OffsetOutOfRange,
    RecordTooLarge,
    StaleLeaderEpoch,
    StorageError,
    WriteFailed,
)
from .fileio import FileIO
from .log import CommitLog, CompactionResult
from .records import EMPTY_HEADERS, NewRecord, Record

__all__ = [
    "EMPTY_HEADERS",
    "CommitLog",
    "CompactionResult",
    "CorruptBatch",
    "CorruptCheckpoint",
    "EpochEntry",
    "FileIO",
    "FsyncPolicy",
    "InvalidBatch",
    "LeaderEpochCache",
    "LogClosed",
    "LogConfig",
    "LogFenced",
    "NewRecord",
    "NonMonotonicOffset",
    "OffsetOutOfRange",
    "Record",
    "RecordTooLarge",
    "StaleLeaderEpoch",
    "StorageError",
    "WriteFailed",
]
