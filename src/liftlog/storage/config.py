"""Settings of one commit log, with the defaults a new stream gets."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["FsyncPolicy", "LogConfig"]

MiB = 1024 * 1024


class FsyncPolicy(enum.Enum):
    #: Leave flushing to the OS and rely on replication (the default, as Kafka).
    NEVER = "never"
    #: fsync at most every ``fsync_interval_ms`` (checked on append and by ``flush_if_due``).
    INTERVAL = "interval"
    #: fsync before every append returns.
    ALWAYS = "always"


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Per-log settings. Zero for a retention limit means "no limit"."""

    segment_max_bytes: int = 256 * MiB
    segment_max_age_ms: int = 0
    retention_max_bytes: int = 0
    retention_max_messages: int = 0
    retention_max_age_ms: int = 0
    compact_enabled: bool = False
    #: Largest encoded record accepted (NATS' default max payload is 1 MiB).
    max_record_bytes: int = 1 * MiB
    #: One offset index entry at most every this many bytes of log.
    index_interval_bytes: int = 4096
    fsync: FsyncPolicy = FsyncPolicy.NEVER
    fsync_interval_ms: int = 1000

    def __post_init__(self) -> None:
        for name in (
            "segment_max_bytes",
            "max_record_bytes",
            "index_interval_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in (
            "segment_max_age_ms",
            "retention_max_bytes",
            "retention_max_messages",
            "retention_max_age_ms",
            "fsync_interval_ms",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
