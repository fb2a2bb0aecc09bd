"""SetCursor and FetchCursor: cursors kept in the compacted internal stream ``__cursors``, as Liftbridge keeps them.

A cursor's partition of ``__cursors`` follows from its key (``liftlog.api.cursors``); only that
partition's leader serves it, and any other server answers FAILED_PRECONDITION (Liftbridge's "not
leader" answer, which clients re-route on). SetCursor writes one record straight into the partition
(no NATS: nobody else can add records to ``__cursors``) and returns once every in-sync replica has it.

FetchCursor answers from a table of the partition's cursors, built from its committed records the first
time the leader needs it and kept up to date by every SetCursor it acknowledges. A table belongs to one
leadership (leader epoch and log): a new leader builds its own, so it never serves what an earlier one
cached. Within the table a value replaces another only if its record is newer in the log, whatever
order acknowledgements and the building scan meet in: the answer is always the newest write, which is
what compaction keeps and every later leader finds, so a cursor never moves back by accident.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from liftlog.api import api_pb2
from liftlog.api.cursors import (
    CURSORS_STREAM,
    MAX_CURSOR_ID,
    CursorValueError,
    cursor_key,
    cursor_partition,
    decode_cursor,
    encode_cursor,
)
from liftlog.api.envelope import encode_publish_message
from liftlog.api.errors import Reason
from liftlog.metadata import MetadataError
from liftlog.rpc import StatusCode as Code
from liftlog.server.api.failures import RpcFailure, failure_from
from liftlog.server.ops.logformat import about
from liftlog.server.partitions.partition import Partition, PartitionClosed
from liftlog.storage import CommitLog, LogClosed, OffsetOutOfRange

if TYPE_CHECKING:
    from liftlog.server.api.ports import PartitionReading, Publishing
    from liftlog.server.control.cluster import MetadataService
    from liftlog.server.partitions.streams import StreamManager

__all__ = ["CursorService"]

log = logging.getLogger(__name__)

#: Records a table build reads between two turns of the event loop.
_SCAN_RECORDS = 2000
#: How long a table build waits for a new leader's high watermark to reach its log end.
CATCH_UP_S = 5.0


@dataclass
class _Table:
    """The cursors of one ``__cursors`` partition as one leadership of it knows them."""

    log: CommitLog
    epoch: int
    #: cursor key -> (offset of its newest record, the cursor's offset)
    values: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    #: Every committed record read: answers may come from it (acks update it from the start).
    complete: bool = False

    def put(self, key: bytes, record_offset: int, offset: int) -> None:
        known = self.values.get(key)
        if known is None or known[0] < record_offset:
            self.values[key] = (record_offset, offset)


class CursorService:
    def __init__(
        self,
        *,
        server_id: str,
        streams: StreamManager,
        cluster: MetadataService,
        publisher: Publishing,
        reads: PartitionReading,
        enabled: bool,
    ) -> None:
        self._server_id = server_id
        self._streams = streams
        self._cluster = cluster
        self._publisher = publisher
        self._reads = reads
        #: cursors.stream.partitions > 0 here: only changes what a missing __cursors is reported as.
        self._enabled = enabled
        self._tables: dict[int, _Table] = {}
        self._building: dict[int, asyncio.Task[_Table]] = {}

    async def set(self, req: api_pb2.SetCursorRequest) -> None:
        _check(req.stream, req.cursorId)
        if req.offset < -1:
            raise RpcFailure(Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, f"cursor offset {req.offset} is negative")
        key = cursor_key(req.cursorId, req.stream, req.partition)
        pid, part = await self._leader(key)  # first: "cursors are off" says more than anything about the stream
        self._check_target(req.stream, req.partition)
        expected = self._publisher.expect_ack(part.subject, api_pb2.ALL, CURSORS_STREAM, local=True)
        inbox, correlation_id, future = expected
        message = api_pb2.Message(
            key=key,
            value=encode_cursor(req.cursorId, req.stream, req.partition, req.offset),
            ackInbox=inbox,
            correlationId=correlation_id,
            ackPolicy=api_pb2.ALL,
        )
        try:
            part.take_local(encode_publish_message(message))
        except PartitionClosed as exc:
            future.cancel()
            raise RpcFailure(Code.UNAVAILABLE, Reason.UNAVAILABLE, f"cursors partition {pid}: {exc}") from exc
        ack = await self._publisher.await_ack(future, None)
        table = self._tables.get(pid)
        if table is not None and table.log is part.log:
            table.put(key, ack.offset, req.offset)

    async def fetch(self, req: api_pb2.FetchCursorRequest) -> int:
        _check(req.stream, req.cursorId)
        key = cursor_key(req.cursorId, req.stream, req.partition)
        pid, part = await self._leader(key)
        self._check_target(req.stream, req.partition)  # -1 for a typo would read as "nothing processed yet"
        table = await self._table(pid, part)
        known = table.values.get(key)
        return -1 if known is None else known[1]

    # -- where a cursor lives --------------------------------------------------------------------

    def _check_target(self, stream: str, partition: int) -> None:
        """A cursor names a partition that exists (Liftbridge does not check: a typo would be kept forever, and
        read back as -1)."""
        try:
            self._streams.metadata.partition(stream, partition)
        except MetadataError as exc:
            raise failure_from(exc) from exc

    async def _leader(self, key: bytes) -> tuple[int, Partition]:
        """The ``__cursors`` partition of ``key`` and this server's replica of it, which must lead it."""
        metadata = self._streams.metadata
        stream = metadata.streams.get(CURSORS_STREAM)
        if stream is None or not stream.partitions:
            if not self._enabled:
                raise RpcFailure(
                    Code.FAILED_PRECONDITION,
                    Reason.REFUSED,
                    "cursors are off: set cursors.stream.partitions to more than 0 on the servers (the metadata "
                    "leader creates the __cursors stream then)",
                )
            raise RpcFailure(
                Code.UNAVAILABLE, Reason.UNAVAILABLE, "the __cursors stream is not created yet; try again shortly"
            )
        pid = cursor_partition(key, len(stream.partitions))
        meta = stream.partitions[pid]
        try:
            if meta.paused:
                await self._cluster.resume(CURSORS_STREAM, pid)
            if meta.leader == self._server_id:
                await self._until_leading(pid)  # named, but maybe still taking the leadership up
            part = self._reads.hosted(CURSORS_STREAM, pid)
        except MetadataError as exc:
            raise failure_from(exc) from exc
        except RpcFailure as failure:
            if failure.reason is Reason.NOT_LEADER:
                raise RpcFailure(
                    Code.FAILED_PRECONDITION, Reason.NOT_LEADER, f"Server not leader for cursors partition {pid}"
                ) from None
            raise
        if not part.accepting:
            await self._publisher.until_listening(part)
        return pid, part

    async def _until_leading(self, pid: int) -> None:
        """Wait (up to CATCH_UP_S) until this server, named leader of a cursors partition, leads it."""
        streams = self._streams

        def leading_or_not_named() -> bool:
            if streams.is_leading(CURSORS_STREAM, pid):
                return True
            meta = streams.metadata.streams.get(CURSORS_STREAM)
            # Not named any more: hosted() answers NOT_LEADER, the client goes elsewhere.
            return meta is None or pid not in meta.partitions or meta.partitions[pid].leader != self._server_id

        await streams.changes.until(leading_or_not_named, CATCH_UP_S)

    # -- the table ---------------------------------------------------------------------------------

    async def _table(self, pid: int, part: Partition) -> _Table:
        log_ = part.log
        epoch = part.meta.leader_epoch
        table = self._tables.get(pid)
        if table is not None and table.complete and table.log is log_ and table.epoch == epoch:
            return table
        task = self._building.get(pid)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._build(pid, part), name=f"cursors {pid}")
            self._building[pid] = task
            task.add_done_callback(functools.partial(self._built, pid))
        return await asyncio.shield(task)

    def _built(self, pid: int, _task: asyncio.Task[_Table]) -> None:
        self._building.pop(pid, None)

    async def _build(self, pid: int, part: Partition) -> _Table:
        """Read the partition's committed cursors; the table takes SetCursor's acks from the first read on."""
        log_ = part.log
        if log_ is None:
            raise RpcFailure(Code.UNAVAILABLE, Reason.UNAVAILABLE, f"cursors partition {pid} is not open here")
        table = _Table(log_, part.meta.leader_epoch)
        self._tables[pid] = table
        try:
            # A new leader's high watermark lags until its followers fetch again; what the old leader
            # acknowledged is in this log below its end now. Wait until that is committed, then read it all.
            await self._committed_to(pid, part, log_.log_end_offset)
            await self._scan(pid, part, table)
        except BaseException:
            if self._tables.get(pid) is table:
                del self._tables[pid]
            raise
        table.complete = True
        return table

    async def _committed_to(self, pid: int, part: Partition, end: int) -> None:
        log_ = part.log
        try:
            async with asyncio.timeout(CATCH_UP_S):
                while log_ is not None and part.log is log_ and log_.high_watermark + 1 < end:
                    await part.wait_for_data()
        except TimeoutError:
            raise RpcFailure(
                Code.UNAVAILABLE,
                Reason.UNAVAILABLE,
                f"cursors partition {pid} has a new leader whose followers have not caught up yet; try again",
            ) from None

    async def _scan(self, pid: int, part: Partition, table: _Table) -> None:
        log_ = table.log
        offset = log_.log_start_offset
        skipped = 0
        while True:
            if part.log is not log_:
                raise RpcFailure(Code.UNAVAILABLE, Reason.UNAVAILABLE, f"cursors partition {pid} closed meanwhile")
            end = log_.high_watermark + 1
            if offset >= end:
                break
            try:
                records = log_.read(offset, max_records=_SCAN_RECORDS, max_offset=end)
            except OffsetOutOfRange:
                offset = log_.log_start_offset
                continue
            except LogClosed as exc:
                raise RpcFailure(Code.UNAVAILABLE, Reason.UNAVAILABLE, f"cursors partition {pid}: {exc}") from exc
            if not records:
                break
            for record in records:
                if record.key is None:
                    skipped += 1
                    continue
                try:
                    cursor = decode_cursor(record.value)
                except CursorValueError:
                    skipped += 1
                    continue
                table.put(record.key, record.offset, cursor.offset)
            offset = records[-1].offset + 1
            await asyncio.sleep(0)  # a big partition must not stall every other call
        if skipped:
            log.warning(
                "cursors partition %d: %d records are not cursors and were skipped",
                pid,
                skipped,
                extra=about(CURSORS_STREAM, pid),
            )
        log.info(
            "cursors partition %d: %d cursors loaded up to offset %d",
            pid,
            len(table.values),
            offset - 1,
            extra=about(CURSORS_STREAM, pid),
        )


def _check(stream: str, cursor_id: str) -> None:
    if not stream:
        raise RpcFailure(Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, "No stream provided")
    if not cursor_id:
        raise RpcFailure(Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, "No cursorId provided")
    if len(cursor_id) > MAX_CURSOR_ID:
        raise RpcFailure(
            Code.INVALID_ARGUMENT,
            Reason.INVALID_ARGUMENT,
            f"cursor id of {len(cursor_id)} characters; at most {MAX_CURSOR_ID} are allowed",
        )
