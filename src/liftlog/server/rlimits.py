"""The process's open-file limit: raised to the hard limit at start, reported in the cluster status.

Every partition replica keeps files open (its active segment's .log, .index
and .timeindex), so the common soft default of 1024 runs out after a few
hundred partitions even where the hard limit allows half a million.
"""

from __future__ import annotations

import logging
import resource

__all__ = ["FILES_PER_PARTITION", "check_partition_budget", "open_files_limit", "raise_open_files_limit"]

log = logging.getLogger(__name__)

#: Open files one partition replica needs at least: its active segment's .log, .index and .timeindex.
FILES_PER_PARTITION = 3
#: Kept for sockets, NATS, the Raft log and older segments when judging clustering.max.partitions.per.server.
_RESERVE = 1024
#: macOS reports an unlimited hard limit but refuses soft limits above the kernel's per-process maximum.
_FALLBACK = 10240


def open_files_limit() -> int:
    """The soft RLIMIT_NOFILE; 0 when unlimited."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 0 if soft == resource.RLIM_INFINITY else soft


def segment_files_budget(configured: int) -> int:
    """Descriptors for sealed segments: the setting, else half the open-file limit (the rest serves active
    segments, sockets and the metadata), at least 64."""
    if configured:
        return configured
    limit = open_files_limit() or 1 << 20
    return max(64, limit // 2)


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one; returns (before, after) soft limits (0: unlimited)."""
    before = open_files_limit()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft == hard:
        return before, before
    for target in (hard, _FALLBACK):
        if target != resource.RLIM_INFINITY and target <= soft:
            continue
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.debug("cannot raise the open-file limit to %s: %s", target, exc)
            continue
        break
    return before, open_files_limit()


def check_partition_budget(max_partitions_per_server: int, limit: int) -> str | None:
    """A warning when clustering.max.partitions.per.server could exhaust the open-file limit, else None."""
    needed = max_partitions_per_server * FILES_PER_PARTITION + _RESERVE
    if limit == 0 or needed <= limit:
        return None
    return (
        f"clustering.max.partitions.per.server ({max_partitions_per_server}) lets this server host partitions "
        f"needing about {needed} open files, more than its open-file limit ({limit}): raise the hard limit "
        "(ulimit -Hn, systemd LimitNOFILE=, docker --ulimit nofile=) or lower the setting"
    )
