"""The activity stream's events, decided where the metadata changes (sans-IO).

Every applied operation that a reader of ``__activity`` should know about
becomes one ``ActivityStreamEvent`` (Liftbridge's message in
``proto/api.proto``) whose id is the operation's Raft index: strictly
increasing, in the order every server applied them. Events are kept in the
metadata (:class:`~liftlog.metadata.model.ActivityLog`) from the moment
``__activity`` exists until the controller marks them published, so they
survive a controller failover and a snapshot.
"""

from __future__ import annotations

from liftlog.api import api_pb2

from .model import (
    CreateStream,
    DeleteStream,
    JoinGroup,
    LeaveGroup,
    Metadata,
    Operation,
    PartitionMeta,
    SetPaused,
    SetReadonly,
)
from .names import ACTIVITY_STREAM

__all__ = ["activity_event", "apply_entry"]


def activity_event(op: Operation, index: int) -> api_pb2.ActivityStreamEvent | None:
    """The event ``op`` (applied at Raft ``index``) makes, None for operations readers do not see."""
    event = api_pb2.ActivityStreamEvent(id=index)
    match op:
        case CreateStream(stream=stream):
            event.op = api_pb2.CREATE_STREAM
            event.createStreamOp.stream = stream.name
            event.createStreamOp.partitions.extend(sorted(stream.partitions))
        case DeleteStream(name=name):
            event.op = api_pb2.DELETE_STREAM
            event.deleteStreamOp.stream = name
        case SetPaused(name=name, partitions=partitions, paused=True, resume_all=resume_all):
            event.op = api_pb2.PAUSE_STREAM
            event.pauseStreamOp.stream = name
            event.pauseStreamOp.partitions.extend(partitions)
            event.pauseStreamOp.resumeAll = resume_all
        case SetPaused(name=name, partitions=partitions, paused=False):
            event.op = api_pb2.RESUME_STREAM
            event.resumeStreamOp.stream = name
            event.resumeStreamOp.partitions.extend(partitions)
        case SetReadonly(name=name, partitions=partitions, readonly=readonly):
            event.op = api_pb2.SET_STREAM_READONLY
            event.setStreamReadonlyOp.stream = name
            event.setStreamReadonlyOp.partitions.extend(partitions)
            event.setStreamReadonlyOp.readonly = readonly
        case JoinGroup(group=group, consumer=consumer, streams=streams):
            event.op = api_pb2.JOIN_CONSUMER_GROUP
            event.joinConsumerGroupOp.groupId = group
            event.joinConsumerGroupOp.consumerId = consumer
            event.joinConsumerGroupOp.streams.extend(streams)
        case LeaveGroup(group=group, consumer=consumer, expired=expired):
            event.op = api_pb2.LEAVE_CONSUMER_GROUP
            event.leaveConsumerGroupOp.groupId = group
            event.leaveConsumerGroupOp.consumerId = consumer
            event.leaveConsumerGroupOp.expired = expired
        case _:
            return None
    return event


def apply_entry(metadata: Metadata, index: int, op: Operation) -> list[PartitionMeta]:
    """Apply the operation committed at Raft ``index``, recording its activity event once ``__activity`` exists.

    Raises what ``Metadata.apply`` raises (then nothing is recorded: the operation changed nothing).
    """
    changed = metadata.apply(op)
    if ACTIVITY_STREAM in metadata.streams:
        event = activity_event(op, index)
        if event is not None:
            metadata.activity.record(index, event.SerializeToString())
    return changed
