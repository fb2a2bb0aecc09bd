"""The controller's publisher of the activity stream ``__activity`` (Liftbridge's ``activity.stream.*``).

The metadata records an event for every applied operation readers should see (``metadata.activity``);
while this server leads the metadata group, this publishes them one at a time, in order, to partition 0
of ``__activity`` and then marks each published through Raft, so the next controller goes on after it.
A publish that fails is retried, the same event, with a growing pause (1 s doubling to 10 s) until it
succeeds or the leadership moves: nothing later overtakes it (head-of-line blocking). An event published
whose mark was lost to a failover is published again by the next controller, with the same id: readers
drop ids they have seen (at least once, never reordered).

Events travel on the internal NATS connection: with a cluster secret they are signed, and the
``__activity`` intake takes nothing else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from liftlog.api import api_pb2
from liftlog.api.envelope import encode_publish_message
from liftlog.metadata import ACTIVITY_STREAM, Metadata, partition_subject
from liftlog.metadata.events import ActivityEvent, ActivityOp
from liftlog.metadata.model import MarkActivityPublished, Operation, PendingEvent
from liftlog.server.nats.nats_types import NatsClient
from liftlog.server.partitions.acks import AckRouter

__all__ = ["ActivityPublisher", "ActivitySettings", "encode_event"]

log = logging.getLogger(__name__)

#: Liftbridge's retry pauses: 1 s, doubling, at most 10 s.
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 10.0
#: How often an idle publisher looks for new events (it is also woken when one is applied).
IDLE_CHECK_S = 1.0


@dataclass(frozen=True, slots=True)
class ActivitySettings:
    enabled: bool
    #: activity.stream.publish.timeout, seconds
    timeout: float
    #: activity.stream.publish.ack.policy
    ack_policy: api_pb2.AckPolicy


class ActivityPublisher:
    def __init__(
        self,
        settings: ActivitySettings,
        *,
        metadata: Callable[[], Metadata],
        propose: Callable[[Operation], Awaitable[object]],
        nats: NatsClient,
        acks: AckRouter,
        resume: Callable[[str, int], Awaitable[None]] | None = None,
    ) -> None:
        self.settings = settings
        #: Resumes a paused partition (a pause of __activity, manual or automatic, must not stall events).
        self._resume = resume
        self._metadata = metadata
        self._propose = propose
        self._nats = nats
        self._acks = acks
        self._wake = asyncio.Event()

    def applied(self) -> None:
        """An operation was applied: there may be a new event."""
        self._wake.set()

    async def run(self) -> None:
        """Publish pending events while this server leads (the caller cancels it when leadership moves)."""
        backoff = FIRST_BACKOFF_S
        skipped_warned = False
        while True:
            activity = self._metadata().activity
            if not activity.pending:
                self._wake.clear()
                try:
                    async with asyncio.timeout(IDLE_CHECK_S):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                continue
            index, event = activity.pending[0]
            if not self.settings.enabled:
                # __activity exists but this controller has the stream off: its events are not published.
                if not skipped_warned:
                    log.warning("activity.stream.enabled is off here: events are not published to %s", ACTIVITY_STREAM)
                    skipped_warned = True
                await self._propose(MarkActivityPublished(activity.pending[-1][0]))
                continue
            try:
                await self._publish(event)
            except Exception as exc:
                why = (
                    str(exc) or f"no ack within {self.settings.timeout:g} s"
                    if isinstance(exc, TimeoutError)
                    else str(exc)
                )
                log.warning(
                    "publishing activity event %d: %s; retrying in %.0f s", index, why or type(exc).__name__, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            backoff = FIRST_BACKOFF_S
            result = await self._propose(MarkActivityPublished(index))
            if isinstance(result, Exception):
                log.info("marking activity event %d published: %s", index, result)

    async def _publish(self, event: PendingEvent) -> None:
        metadata = self._metadata()
        stream = metadata.streams.get(ACTIVITY_STREAM)
        if stream is None or 0 not in stream.partitions:
            raise RuntimeError(f"{ACTIVITY_STREAM} does not exist")
        if stream.partitions[0].paused and self._resume is not None:
            await self._resume(ACTIVITY_STREAM, 0)
        subject = partition_subject(stream.subject, 0)
        policy = self.settings.ack_policy
        message = api_pb2.Message(value=encode_event(event))
        future = None
        if policy != api_pb2.NONE:
            message.ackInbox, message.correlationId, future = self._acks.expect(subject, policy, ACTIVITY_STREAM)
            message.ackPolicy = policy
        try:
            await self._nats.publish(subject, encode_publish_message(message))
            if future is not None:
                async with asyncio.timeout(self.settings.timeout):
                    ack = await future
                if ack.ackError != api_pb2.Ack.OK:
                    raise RuntimeError(f"{ACTIVITY_STREAM} refused the event (ack error {ack.ackError})")
        finally:
            if future is not None and not future.done():
                future.cancel()


def encode_event(event: PendingEvent) -> bytes:
    """The event as Liftbridge's ``ActivityStreamEvent`` (one an older version kept encoded: as it is)."""
    if not isinstance(event, ActivityEvent):
        return event
    out = api_pb2.ActivityStreamEvent(id=event.id, op=event.op.value)
    match event.op:
        case ActivityOp.CREATE_STREAM:
            out.createStreamOp.stream = event.stream
            out.createStreamOp.partitions.extend(event.partitions)
        case ActivityOp.DELETE_STREAM:
            out.deleteStreamOp.stream = event.stream
        case ActivityOp.PAUSE_STREAM:
            out.pauseStreamOp.stream = event.stream
            out.pauseStreamOp.partitions.extend(event.partitions)
            out.pauseStreamOp.resumeAll = event.resume_all
        case ActivityOp.RESUME_STREAM:
            out.resumeStreamOp.stream = event.stream
            out.resumeStreamOp.partitions.extend(event.partitions)
        case ActivityOp.SET_STREAM_READONLY:
            out.setStreamReadonlyOp.stream = event.stream
            out.setStreamReadonlyOp.partitions.extend(event.partitions)
            out.setStreamReadonlyOp.readonly = event.readonly
        case ActivityOp.JOIN_CONSUMER_GROUP:
            out.joinConsumerGroupOp.groupId = event.group
            out.joinConsumerGroupOp.consumerId = event.consumer
            out.joinConsumerGroupOp.streams.extend(event.streams)
        case ActivityOp.LEAVE_CONSUMER_GROUP:
            out.leaveConsumerGroupOp.groupId = event.group
            out.leaveConsumerGroupOp.consumerId = event.consumer
            out.leaveConsumerGroupOp.expired = event.expired
    return out.SerializeToString()
