"""The activity stream's events, decided where the metadata changes (sans-IO).

Every applied operation that a reader of ``__activity`` should know about
becomes one ``ActivityEvent`` (``events``; the publisher sends it as
Liftbridge's ``ActivityStreamEvent``) whose id is the operation's Raft index: strictly
increasing, in the order every server applied them. Events are kept in the
metadata (:class:`~liftlog.metadata.model.ActivityLog`) from the moment
``__activity`` exists until the controller marks them published, so they
survive a controller failover and a snapshot.
"""

from __future__ import annotations

from .events import ActivityEvent, ActivityOp
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


def activity_event(op: Operation, index: int) -> ActivityEvent | None:
    """The event ``op`` (applied at Raft ``index``) makes, None for operations readers do not see."""
    match op:
        case CreateStream(stream=stream):
            return ActivityEvent(index, ActivityOp.CREATE_STREAM, stream.name, tuple(sorted(stream.partitions)))
        case DeleteStream(name=name):
            return ActivityEvent(index, ActivityOp.DELETE_STREAM, name)
        case SetPaused(name=name, partitions=partitions, paused=True, resume_all=resume_all):
            return ActivityEvent(index, ActivityOp.PAUSE_STREAM, name, tuple(partitions), resume_all=resume_all)
        case SetPaused(name=name, partitions=partitions, paused=False):
            return ActivityEvent(index, ActivityOp.RESUME_STREAM, name, tuple(partitions))
        case SetReadonly(name=name, partitions=partitions, readonly=readonly):
            return ActivityEvent(index, ActivityOp.SET_STREAM_READONLY, name, tuple(partitions), readonly=readonly)
        case JoinGroup(group=group, consumer=consumer, streams=streams):
            return ActivityEvent(
                index, ActivityOp.JOIN_CONSUMER_GROUP, group=group, consumer=consumer, streams=tuple(streams)
            )
        case LeaveGroup(group=group, consumer=consumer, expired=expired):
            return ActivityEvent(
                index, ActivityOp.LEAVE_CONSUMER_GROUP, group=group, consumer=consumer, expired=expired
            )
        case _:
            return None


def apply_entry(metadata: Metadata, index: int, op: Operation) -> list[PartitionMeta]:
    """Apply the operation committed at Raft ``index``, recording its activity event once ``__activity`` exists.

    Raises what ``Metadata.apply`` raises (then nothing is recorded: the operation changed nothing).
    """
    changed = metadata.apply(op)
    if ACTIVITY_STREAM in metadata.streams:
        event = activity_event(op, index)
        if event is not None:
            metadata.activity.record(index, event)
    return changed
