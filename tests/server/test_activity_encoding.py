"""The activity publisher sends the metadata's events as Liftbridge's ActivityStreamEvent, field by field."""

from __future__ import annotations

from liftlog.api import api_pb2
from liftlog.metadata.events import ActivityEvent, ActivityOp
from liftlog.server.control.activity import encode_event


def decoded(event: ActivityEvent | bytes) -> api_pb2.ActivityStreamEvent:
    return api_pb2.ActivityStreamEvent.FromString(encode_event(event))


def test_every_op_reaches_its_liftbridge_fields() -> None:
    e = decoded(ActivityEvent(6, ActivityOp.CREATE_STREAM, "orders", (0, 1)))
    assert (e.id, e.op, e.createStreamOp.stream, list(e.createStreamOp.partitions)) == (
        6,
        api_pb2.CREATE_STREAM,
        "orders",
        [0, 1],
    )
    e = decoded(ActivityEvent(7, ActivityOp.DELETE_STREAM, "orders"))
    assert (e.op, e.deleteStreamOp.stream) == (api_pb2.DELETE_STREAM, "orders")
    e = decoded(ActivityEvent(8, ActivityOp.PAUSE_STREAM, "o", (1,), resume_all=True))
    assert (e.op, list(e.pauseStreamOp.partitions), e.pauseStreamOp.resumeAll) == (api_pb2.PAUSE_STREAM, [1], True)
    e = decoded(ActivityEvent(9, ActivityOp.RESUME_STREAM, "o", (2,)))
    assert (e.op, e.resumeStreamOp.stream, list(e.resumeStreamOp.partitions)) == (api_pb2.RESUME_STREAM, "o", [2])
    e = decoded(ActivityEvent(10, ActivityOp.SET_STREAM_READONLY, "o", (0,), readonly=True))
    assert (e.op, e.setStreamReadonlyOp.readonly, list(e.setStreamReadonlyOp.partitions)) == (
        api_pb2.SET_STREAM_READONLY,
        True,
        [0],
    )
    e = decoded(ActivityEvent(11, ActivityOp.JOIN_CONSUMER_GROUP, group="g", consumer="c", streams=("a", "b")))
    join = e.joinConsumerGroupOp
    assert (e.op, join.groupId, join.consumerId, list(join.streams)) == (
        api_pb2.JOIN_CONSUMER_GROUP,
        "g",
        "c",
        ["a", "b"],
    )
    e = decoded(ActivityEvent(12, ActivityOp.LEAVE_CONSUMER_GROUP, group="g", consumer="c", expired=True))
    leave = e.leaveConsumerGroupOp
    assert (e.op, leave.groupId, leave.consumerId, leave.expired) == (api_pb2.LEAVE_CONSUMER_GROUP, "g", "c", True)


def test_an_event_an_older_version_kept_encoded_goes_out_as_it_is() -> None:
    older = api_pb2.ActivityStreamEvent(id=3, op=api_pb2.DELETE_STREAM).SerializeToString()
    assert encode_event(older) == older
