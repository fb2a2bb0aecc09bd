"""Activity events decided in the metadata: which operations make one, in what order, kept until published."""

from __future__ import annotations

import pytest

from liftlog.api import api_pb2
from liftlog.metadata import (
    CreateStream,
    DeleteStream,
    Metadata,
    NoSuchStreamError,
    PartitionMeta,
    SetPaused,
    SetReadonly,
    StreamMeta,
    StreamSettings,
)
from liftlog.metadata.activity import activity_event, apply_entry
from liftlog.metadata.codec import decode_operation, decode_snapshot, encode_operation, encode_snapshot
from liftlog.metadata.model import MAX_PENDING_ACTIVITY, ActivityLog, MarkActivityPublished


def stream(name: str, partitions: int = 1) -> StreamMeta:
    s = StreamMeta(name=name, subject=name, group="", creation_timestamp=1, settings=StreamSettings())
    for i in range(partitions):
        s.partitions[i] = PartitionMeta(stream=name, id=i, subject=name, leader="a", replicas=["a"], isr=["a"])
    return s


def decoded(data: bytes) -> api_pb2.ActivityStreamEvent:
    event = api_pb2.ActivityStreamEvent()
    event.ParseFromString(data)
    return event


def test_events_are_recorded_from_the_activity_streams_creation_on() -> None:
    md = Metadata()
    apply_entry(md, 3, CreateStream(stream("before")))
    assert not md.activity.pending
    apply_entry(md, 5, CreateStream(stream("__activity")))
    apply_entry(md, 6, CreateStream(stream("orders", 2)))
    apply_entry(md, 8, SetPaused("orders", (1,), True, 0, resume_all=True))
    apply_entry(md, 9, SetPaused("orders", (), False, 0))
    apply_entry(md, 11, SetReadonly("orders", (0,), True, 0))
    apply_entry(md, 12, DeleteStream("orders"))
    events = [(i, decoded(e)) for i, e in md.activity.pending]
    assert [i for i, _ in events] == [5, 6, 8, 9, 11, 12]
    assert [e.id for _, e in events] == [5, 6, 8, 9, 11, 12]
    ops = [api_pb2.ActivityStreamOp.Name(e.op) for _, e in events]
    assert ops == [
        "CREATE_STREAM",
        "CREATE_STREAM",
        "PAUSE_STREAM",
        "RESUME_STREAM",
        "SET_STREAM_READONLY",
        "DELETE_STREAM",
    ]
    assert list(events[1][1].createStreamOp.partitions) == [0, 1]
    assert events[2][1].pauseStreamOp.resumeAll and list(events[2][1].pauseStreamOp.partitions) == [1]
    assert events[4][1].setStreamReadonlyOp.readonly


def test_a_refused_operation_makes_no_event_and_replays_record_once() -> None:
    md = Metadata()
    apply_entry(md, 1, CreateStream(stream("__activity")))
    with pytest.raises(NoSuchStreamError):
        apply_entry(md, 2, DeleteStream("ghost"))
    assert [i for i, _ in md.activity.pending] == [1]
    md.activity.record(1, b"again")  # a restart applies the log again
    assert [e for _, e in md.activity.pending] != [b"again"]
    assert activity_event(MarkActivityPublished(1), 3) is None


def test_marking_published_drops_events_and_survives_snapshots_and_the_codec() -> None:
    md = Metadata()
    for i, name in enumerate(["__activity", "a", "b", "c"], start=1):
        apply_entry(md, i, CreateStream(stream(name)))
    op = decode_operation(encode_operation(MarkActivityPublished(2)))
    apply_entry(md, 5, op)
    assert md.activity.published == 2 and [i for i, _ in md.activity.pending] == [3, 4]
    restored = decode_snapshot(encode_snapshot(md))
    assert restored.activity.published == 2 and list(restored.activity.pending) == list(md.activity.pending)
    restored.activity.record(2, b"old")  # below what was published: ignored
    assert [i for i, _ in restored.activity.pending] == [3, 4]


def test_pending_events_are_bounded() -> None:
    log = ActivityLog()
    for i in range(1, MAX_PENDING_ACTIVITY + 11):
        log.record(i, b"e")
    assert len(log.pending) == MAX_PENDING_ACTIVITY and log.dropped == 10 and log.pending[0][0] == 11
