"""A consumer group member: joins, follows its assignments, reads its partitions, checkpoints through cursors.

Semantics are Liftbridge's (and its Go client's): the group's position in a partition is the cursor
``__group:<group>`` of that partition, holding the offset of the last message processed; a member
that takes a partition over starts at that offset + 1 (at least once: what the previous owner
processed after its last checkpoint comes again, nothing is skipped). A message counts as processed
once the next one is asked for (or at :meth:`Consumer.checkpoint` / close).

The member fetches its assignments from the group's coordinator every ``fetch_interval`` (this is
its heartbeat). On a new epoch it restarts its subscriptions under the new epoch; partitions it lost
are checkpointed and dropped, queued messages of them discarded, so that at any time one member
processes a partition. When the coordinator does not answer for ``coordinator_timeout`` the member
reports it; when the group forgot the member (it was silent too long), it joins again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from liftlog.api import api_pb2
from liftlog.api.cursors import group_cursor_id
from liftlog.client.errors import (
    FailedPreconditionError,
    LiftlogError,
    NotFoundError,
    NotLeaderError,
    UnavailableError,
    error_from_rpc,
)
from liftlog.client.types import Message, StartPosition
from liftlog.rpc import RpcError

if TYPE_CHECKING:
    from liftlog.client.client import Client

__all__ = ["Consumer"]

log = logging.getLogger(__name__)

Partition = tuple[str, int]
#: Called with the partitions gained (on_assign) or lost (on_revoke), after a rebalance.
RebalanceCallback = Callable[[list[Partition]], Awaitable[None] | None]


@dataclass
class _Reader:
    epoch: int
    task: asyncio.Task[None]


class Consumer:
    """One member of consumer group ``group_id`` reading ``streams``; see the module docstring.

    ``async with client.consumer("billing", ["orders"]) as consumer: async for msg in consumer: ...``
    """

    def __init__(
        self,
        client: Client,
        group_id: str,
        streams: Sequence[str],
        *,
        consumer_id: str | None = None,
        auto_checkpoint: float | None = 5.0,
        start_position: StartPosition = StartPosition.NEW_ONLY,
        fetch_interval: float | None = None,
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        queue_size: int = 256,
    ) -> None:
        if not streams:
            raise ValueError("a consumer needs at least one stream")
        self._client = client
        self.group_id = group_id
        self.streams = tuple(streams)
        self.consumer_id = consumer_id or secrets.token_hex(8)
        self.cursor_id = group_cursor_id(group_id)
        self._auto_checkpoint = auto_checkpoint
        self._start_position = start_position
        self._fetch_interval = fetch_interval
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._queue: asyncio.Queue[tuple[int, Message | None]] = asyncio.Queue(queue_size)
        self.coordinator = ""
        self.epoch = -1
        self._coordinator_timeout = 15.0
        #: What this member holds now, and the epoch its subscription of each runs under.
        self.assignments: set[Partition] = set()
        self._readers: dict[Partition, _Reader] = {}
        self._revoked: set[Partition] = set()
        #: When each partition's reader last ended, so that a restart at the same epoch waits a little.
        self._ended_at: dict[Partition, float] = {}
        #: Offset of the last message processed per partition, and the last one stored in the cursor.
        self._positions: dict[Partition, int] = {}
        self._committed: dict[Partition, int] = {}
        self._current: Message | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self._closed = False
        #: Why the member cannot go on (raised by the iteration), e.g. cursors turned off.
        self._failure: LiftlogError | None = None

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Join the group and start following assignments.

        Raises :class:`FailedPreconditionError` when the servers keep no cursors (cursors.stream.partitions
        is 0): without them a member could not tell where the group stopped.
        """
        await self._cursors_on()
        await self._join()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._follow_assignments(), name=f"consumer {self.consumer_id}"))
        if self._auto_checkpoint:
            self._tasks.append(loop.create_task(self._checkpoint_loop(), name=f"checkpoints {self.consumer_id}"))

    async def _cursors_on(self) -> None:
        """Raise unless the servers keep cursors; wait (up to 10 s) while ``__cursors`` is being set up."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while True:
            try:
                await self._client.fetch_cursor(self.cursor_id, self.streams[0])
                return
            except (NotLeaderError, UnavailableError):  # just created, or its leader is taking over
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def close(self) -> None:
        """Checkpoint what was processed (the message in hand included), leave the group, stop reading."""
        if self._closed:
            return
        self._closed = True
        self._processed()
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait((-1, None))
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._stop_readers(list(self._readers))
        with contextlib.suppress(LiftlogError):
            await self.checkpoint()
        with contextlib.suppress(LiftlogError):
            req = api_pb2.LeaveConsumerGroupRequest(groupId=self.group_id, consumerId=self.consumer_id)
            await self._client._call_any("leave_consumer_group", req)

    async def __aenter__(self) -> Consumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- messages -------------------------------------------------------------------------------------

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        self._processed()
        while True:
            if self._closed:
                raise StopAsyncIteration
            epoch, msg = await self._queue.get()
            if msg is None:  # close() or a failure wakes a waiting reader
                if self._failure is not None:
                    raise self._failure
                raise StopAsyncIteration
            key = (msg.stream, msg.partition)
            reader = self._readers.get(key)
            if reader is None or reader.epoch != epoch or key in self._revoked:
                continue  # of a partition this member no longer holds (or under an older epoch)
            if msg.offset <= self._positions.get(key, -1):
                continue  # seen before a resubscription
            self._current = msg
            return msg

    def _processed(self) -> None:
        msg, self._current = self._current, None
        if msg is not None:
            self._positions[(msg.stream, msg.partition)] = msg.offset

    async def checkpoint(self) -> None:
        """Store the position of every partition this member processed since the last checkpoint."""
        for (stream, partition), offset in list(self._positions.items()):
            if self._committed.get((stream, partition)) != offset:
                await self._client.set_cursor(self.cursor_id, stream, offset, partition=partition)
                self._committed[(stream, partition)] = offset

    async def _checkpoint_loop(self) -> None:
        assert self._auto_checkpoint is not None
        while True:
            await asyncio.sleep(self._auto_checkpoint)
            try:
                await self.checkpoint()
            except LiftlogError as exc:
                log.warning("consumer %s: checkpoint failed: %s", self.consumer_id, exc)

    # -- membership and assignments ----------------------------------------------------------------

    async def _join(self) -> None:
        req = api_pb2.JoinConsumerGroupRequest(
            groupId=self.group_id, consumerId=self.consumer_id, streams=list(self.streams)
        )
        resp: api_pb2.JoinConsumerGroupResponse = await self._client._call_any("join_consumer_group", req)
        self.coordinator, self.epoch = resp.coordinator, resp.epoch
        self._coordinator_timeout = resp.coordinatorTimeout / 1e9 or 15.0
        if self._fetch_interval is None:
            # Liftbridge's clients fetch every 0.4 x the consumer timeout; at most every second here: a fetch
            # is also how a member learns it lost a partition, and the sooner the better.
            self._fetch_interval = max(0.2, min(1.0, 0.4 * (resp.consumerTimeout / 1e9 or 15.0)))

    async def _follow_assignments(self) -> None:
        loop = asyncio.get_running_loop()
        last_ok = loop.time()
        while True:
            try:
                resp = await self._fetch_assignments()
            except (LiftlogError, RpcError) as exc:
                err = exc if isinstance(exc, LiftlogError) else error_from_rpc(exc)
                await self._recover(err, loop.time() - last_ok)
                await self._pause(1.0)
                continue
            last_ok = loop.time()
            try:
                await self._reconcile(resp.epoch, {(a.stream, p) for a in resp.assignments for p in a.partitions})
            except Exception:  # a bug here must not stop the heartbeat, which would get this member expired
                log.exception("consumer %s: rebalancing to epoch %d failed", self.consumer_id, resp.epoch)
            await self._pause(self._fetch_interval or 1.0)

    async def _pause(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    async def _fetch_assignments(self) -> api_pb2.FetchConsumerGroupAssignmentsResponse:
        address = await self._address_of(self.coordinator)
        req = api_pb2.FetchConsumerGroupAssignmentsRequest(
            groupId=self.group_id, consumerId=self.consumer_id, epoch=self.epoch
        )
        resp: api_pb2.FetchConsumerGroupAssignmentsResponse = await self._client._stub(
            address
        ).fetch_consumer_group_assignments(req, timeout=self._client.timeout)
        return resp

    async def _address_of(self, server: str) -> str:
        address = self._client._brokers.get(server)
        if address is None:
            await self._client._fetch_metadata()
            address = self._client._brokers.get(server)
        if address is None:
            raise FailedPreconditionError(f"the group coordinator {server!r} is not a live server")
        return address

    async def _recover(self, err: LiftlogError, silent_for: float) -> None:
        """After a failed fetch: adopt a new coordinator or epoch, rejoin if forgotten, report a silent one."""
        req = api_pb2.FetchMetadataRequest(groups=[self.group_id])
        try:
            resp: api_pb2.FetchMetadataResponse = await self._client._call_any("fetch_metadata", req)
        except LiftlogError:
            return
        meta = resp.groupMetadata[0] if resp.groupMetadata else None
        forgotten = isinstance(err, NotFoundError) or "not a member" in str(err)
        if meta is None or meta.error == api_pb2.ConsumerGroupMetadata.UNKNOWN_GROUP or forgotten:
            log.info("consumer %s: not in group %s any more (%s): joining again", self.consumer_id, self.group_id, err)
            with contextlib.suppress(LiftlogError):
                await self._join()
            return
        if (meta.coordinator, meta.epoch) != (self.coordinator, self.epoch):
            self.coordinator, self.epoch = meta.coordinator, meta.epoch
            return
        if silent_for > self._coordinator_timeout:
            report = api_pb2.ReportConsumerGroupCoordinatorRequest(
                groupId=self.group_id, consumerId=self.consumer_id, coordinator=self.coordinator, epoch=self.epoch
            )
            with contextlib.suppress(LiftlogError):
                await self._client._call_any("report_consumer_group_coordinator", report)

    async def _reconcile(self, epoch: int, held: set[Partition]) -> None:
        lost = sorted(self.assignments - held)
        gained = sorted(held - self.assignments)
        if lost:
            for key in lost:
                self._revoked.add(key)
            await self._stop_readers(lost)
            with contextlib.suppress(LiftlogError):  # the next owner starts after what was processed here
                await self.checkpoint()
            for key in lost:  # regained later, a partition starts from the group's cursor, not from here
                self._positions.pop(key, None)
                self._committed.pop(key, None)
            await _call(self._on_revoke, lost)
        self.epoch = epoch
        self.assignments = held
        for key in sorted(held):
            reader = self._readers.get(key)
            if reader is None or reader.epoch != epoch or reader.task.done():
                await self._stop_readers([key])
                self._revoked.discard(key)
                task = asyncio.get_running_loop().create_task(self._read(key, epoch), name=f"{key} for {epoch}")
                self._readers[key] = _Reader(epoch, task)
        if gained:
            await _call(self._on_assign, gained)

    async def _stop_readers(self, keys: Sequence[Partition]) -> None:
        readers = [self._readers.pop(k) for k in keys if k in self._readers]
        for reader in readers:
            reader.task.cancel()
        await asyncio.gather(*(r.task for r in readers), return_exceptions=True)

    async def _read(self, key: Partition, epoch: int) -> None:
        """Subscribe to one held partition under ``epoch`` from where the group is, until revoked."""
        stream, partition = key
        loop = asyncio.get_running_loop()
        ended = self._ended_at.get(key)
        if ended is not None and loop.time() - ended < 1.0:  # restarted at once: the group may not agree yet
            await asyncio.sleep(1.0 - (loop.time() - ended))
        consumer = api_pb2.Consumer(groupId=self.group_id, groupEpoch=epoch, consumerId=self.consumer_id)
        try:
            while True:
                last = self._positions.get(key)
                if last is None:
                    last = await self._group_position(stream, partition)
                sub = self._client.subscribe(
                    stream,
                    partition=partition,
                    consumer=consumer,
                    start_position=StartPosition.OFFSET,
                    start_offset=last + 1,
                    resume=True,
                )
                try:
                    async with sub:
                        async for msg in sub:
                            await self._queue.put((epoch, msg))
                    return
                except FailedPreconditionError as exc:
                    if "not currently assigned" not in str(exc):
                        log.info("consumer %s: %s/%d: %s; again shortly", self.consumer_id, stream, partition, exc)
                        await asyncio.sleep(1.0)
                        continue
                    # No longer held at this epoch: the fetch loop learns the new assignment now.
                    log.info("consumer %s: %s/%d ended: %s", self.consumer_id, stream, partition, exc)
                    self._revoked.add(key)
                    self._wake.set()
                    return
                except LiftlogError as exc:
                    log.info("consumer %s: %s/%d: %s; subscribing again", self.consumer_id, stream, partition, exc)
                    await asyncio.sleep(0.5)
        finally:
            self._ended_at[key] = loop.time()

    def _fail(self, exc: LiftlogError) -> None:
        if self._failure is None:
            self._failure = exc
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait((-1, None))

    async def _group_position(self, stream: str, partition: int) -> int:
        """The offset the group processed last in a partition: its cursor, else (pinned into the cursor, so
        that whoever takes the partition next starts there too) the start position's offset - 1."""
        backoff = 0.2
        while True:
            try:
                cursor = await self._client.fetch_cursor(self.cursor_id, stream, partition=partition)
                if cursor >= 0:
                    return cursor
                info = await self._client.fetch_partition_metadata(stream, partition)
                if self._start_position is StartPosition.EARLIEST:
                    return -1  # from the log's start: nothing to pin
                last = (
                    info.high_watermark if self._start_position is StartPosition.NEW_ONLY else info.high_watermark - 1
                )
                await self._client.set_cursor(self.cursor_id, stream, last, partition=partition)
                self._committed[(stream, partition)] = last
                return last
            except (FailedPreconditionError, NotFoundError) as exc:  # cursors off, stream gone: waiting won't help
                self._fail(exc)
                raise
            except LiftlogError as exc:  # never guess: starting past what the group processed would skip it
                log.warning("consumer %s: position in %s/%d: %s; retrying", self.consumer_id, stream, partition, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)


async def _call(callback: RebalanceCallback | None, partitions: list[Partition]) -> None:
    if callback is None:
        return
    try:
        result = callback(partitions)
        if result is not None:
            await result
    except Exception:  # the user's code: reported, and the member goes on
        log.exception("a rebalance callback failed for %s", partitions)
