"""Group commit for the ``always`` fsync policy: one fsync per log per event-loop turn.

With ``streams.fsync.policy=always`` every acknowledged message must be on
disk before its ack. Fsyncing each batch as it is written costs one fsync
per NATS burst per partition. Instead, a leader's partition writes its
batch, holds its acks and registers here; at the end of the turn (the
callbacks already queued have run) the committer fsyncs every registered
log once, in parallel threads when there are several, and then each
partition sends its acks and advances its commit. While the fsyncs run the
loop is blocked, so what arrives meanwhile is written as one larger batch
in the next turn: the slower the disk, the larger the groups.

Event-loop only; the worker threads run nothing but ``fsync``, while the
loop waits for them, so no descriptor can be closed under them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging

from liftlog.server.partitions.partition import Partition

__all__ = ["GroupCommitter"]

log = logging.getLogger(__name__)


class GroupCommitter:
    def __init__(self, max_threads: int = 4) -> None:
        self._due: dict[int, Partition] = {}
        self._scheduled = False
        self._max_threads = max_threads
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        #: How many turns fsynced, and how many log fsyncs they made (for benchmarks and tests).
        self.rounds = 0
        self.fsyncs = 0

    def add(self, part: Partition) -> None:
        """``part`` appended batches that wait for an fsync (its ``group_commit`` sink)."""
        self._due[id(part)] = part
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run)

    def _run(self) -> None:
        self._scheduled = False
        parts = [p for p in self._due.values() if p.log is not None and p.log.unsynced]
        self._due = {}
        if not parts:
            return
        self.rounds += 1
        self.fsyncs += len(parts)
        errors = self._fsync_all(parts)
        for part, error in zip(parts, errors, strict=True):
            try:
                part.synced(error)
            except Exception:
                log.exception("%s: finishing a group commit failed", part)

    def _fsync_all(self, parts: list[Partition]) -> list[OSError | None]:
        if len(parts) == 1:
            return [_fsync(parts[0])]
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self._max_threads, thread_name_prefix="fsync")
        return list(self._pool.map(_fsync, parts))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def _fsync(part: Partition) -> OSError | None:
    assert part.log is not None
    try:
        part.log.fsync_unsynced()
    except OSError as exc:
        return exc
    return None
