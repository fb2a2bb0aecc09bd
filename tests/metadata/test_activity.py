"""Activity events decided in the metadata: which operations make one, in what order, kept until published."""

from __future__ import annotations

import base64
import json

import pytest

from liftlog.metadata import (
    CreateStream,
    DeleteStream,
    JoinGroup,
    LeaveGroup,
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
from liftlog.metadata.events import ActivityEvent, ActivityOp
from liftlog.metadata.model import MAX_PENDING_ACTIVITY, ActivityLog, MarkActivityPublished


def stream(name: str, partitions: int = 1) -> StreamMeta:
    s = StreamMeta(name=name, subject=name, group="", creation_timestamp=1, settings=StreamSettings())
    for i in range(partitions):
        s.partitions[i] = PartitionMeta(stream=name, id=i, subject=name, leader="a", replicas=["a"], isr=["a"])
    return s


def test_events_are_recorded_from_the_activity_streams_creation_on() -> None:
    md = Metadata()
    apply_entry(md, 3, CreateStream(stream("before")))
    assert not md.activity.pending
    apply_entry(md, 5, CreateStream(stream("__activity")))
    apply_entry(md, 6, CreateStream(stream("orders", 2)))
    apply_entry(md, 8, SetPaused("orders", (1,), True, 0, resume_all=True))
    apply_entry(md, 9, SetPaused("orders", (), False, 0))
    apply_entry(md, 11, SetReadonly("orders", (0,), True, 0))
    apply_entry(md, 12, JoinGroup("g", "c1", ("orders",), "a"))
    apply_entry(md, 13, LeaveGroup("g", "c1", expired=True))
    apply_entry(md, 14, DeleteStream("orders"))
    assert list(md.activity.pending) == [
        (5, ActivityEvent(5, ActivityOp.CREATE_STREAM, "__activity", (0,))),
        (6, ActivityEvent(6, ActivityOp.CREATE_STREAM, "orders", (0, 1))),
        (8, ActivityEvent(8, ActivityOp.PAUSE_STREAM, "orders", (1,), resume_all=True)),
        (9, ActivityEvent(9, ActivityOp.RESUME_STREAM, "orders")),
        (11, ActivityEvent(11, ActivityOp.SET_STREAM_READONLY, "orders", (0,), readonly=True)),
        (12, ActivityEvent(12, ActivityOp.JOIN_CONSUMER_GROUP, group="g", consumer="c1", streams=("orders",))),
        (13, ActivityEvent(13, ActivityOp.LEAVE_CONSUMER_GROUP, group="g", consumer="c1", expired=True)),
        (14, ActivityEvent(14, ActivityOp.DELETE_STREAM, "orders")),
    ]


def test_the_snapshot_keeps_our_events_and_reads_the_encoded_ones_an_older_version_kept() -> None:
    log = ActivityLog()
    ours = ActivityEvent(3, ActivityOp.PAUSE_STREAM, "s", (0, 2), resume_all=True)
    log.record(3, ours)
    restored = ActivityLog.from_dict(json.loads(json.dumps(log.to_dict())))
    assert list(restored.pending) == [(3, ours)]
    older = {"published": 1, "dropped": 0, "pending": [[2, base64.b64encode(b"\x08\x02").decode()]]}
    assert list(ActivityLog.from_dict(older).pending) == [(2, b"\x08\x02")]
    with pytest.raises(TypeError, match="unknown op"):
        ActivityLog.from_dict({"pending": [[4, {"id": 4, "op": "EXPLODE"}]]})


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
