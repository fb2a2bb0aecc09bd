"""The control protocol's codec: every message round-trips, keeps the wire liftlog has always used, and
anything else is refused with a ProtocolError that names the message and the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from liftlog.metadata.controller import CreateStreamRequest
from liftlog.metadata.model import ServerMeta, StreamSettings
from liftlog.metadata.protocol import (
    Applied,
    AppliedQuery,
    Committed,
    ControlRequest,
    CreateStreamChange,
    DecommissionChange,
    DeleteStreamChange,
    Heartbeat,
    IsrChange,
    JoinAnswer,
    JoinRequest,
    LeaderConfirmation,
    LeaderReport,
    LogEnd,
    LogEndQuery,
    PartitionMove,
    PauseChange,
    PolicyChange,
    PreferredLeadersChange,
    ProtocolError,
    ReadonlyChange,
    ReassignChange,
    Refusal,
    RefusalKind,
    ServerRegistration,
    decode_applied,
    decode_applied_query,
    decode_heartbeat,
    decode_join,
    decode_join_answer,
    decode_log_end,
    decode_log_end_query,
    decode_reply,
    decode_request,
    encode_applied,
    encode_applied_query,
    encode_heartbeat,
    encode_join,
    encode_join_answer,
    encode_log_end,
    encode_log_end_query,
    encode_reply,
    encode_request,
)

names = st.text(min_size=1, max_size=20)
ints = st.integers(min_value=-1, max_value=2**40)
partitions = st.lists(st.integers(min_value=0, max_value=1000), max_size=5).map(tuple)
replicas = st.lists(names, max_size=5).map(tuple)

requests: st.SearchStrategy[ControlRequest] = st.one_of(
    st.builds(
        lambda n, s, g, p, r, ret: CreateStreamChange(
            CreateStreamRequest(n, s, g, p, r, StreamSettings(retention_max_bytes=ret))
        ),
        names,
        names,
        st.text(max_size=5),
        ints,
        ints,
        st.none() | st.integers(min_value=0),
    ),
    st.builds(DeleteStreamChange, names),
    st.builds(PauseChange, names, partitions, st.booleans(), st.booleans()),
    st.builds(ReadonlyChange, names, partitions, st.booleans()),
    st.builds(IsrChange, names, ints, replicas, ints),
    st.builds(
        lambda i, h, p, r: ServerRegistration(ServerMeta(i, h, p, r)), names, names, st.integers(0, 65535), names
    ),
    st.builds(LeaderReport, names, ints, names, names, ints, ints, st.text(max_size=10)),
    st.builds(LeaderConfirmation, names, ints, names),
    st.builds(
        ReassignChange,
        st.lists(st.builds(PartitionMove, names, ints, replicas), max_size=3).map(tuple),
        st.booleans(),
    ),
    st.builds(DecommissionChange, names),
    st.just(PreferredLeadersChange()),
    st.builds(PolicyChange, names, names, names, st.booleans()),
)


@given(requests, st.none() | st.floats(min_value=0, max_value=60))
def test_requests_round_trip(request: ControlRequest, timeout: float | None) -> None:
    assert decode_request(encode_request(request, timeout)) == (request, timeout)


@given(
    st.one_of(
        st.builds(Committed, st.integers(min_value=0)),
        st.builds(Refusal, st.sampled_from(RefusalKind), st.text(max_size=5), st.integers(-1, 100), st.text()),
    )
)
def test_replies_round_trip(reply: Committed | Refusal) -> None:
    assert decode_reply(encode_reply(reply)) == reply


def test_the_other_exchanges_round_trip() -> None:
    assert decode_log_end_query(encode_log_end_query(LogEndQuery("s", 3))) == LogEndQuery("s", 3)
    assert decode_log_end(encode_log_end(LogEnd(-1))) == LogEnd(-1)
    assert decode_applied_query(encode_applied_query(AppliedQuery(7, 1.5)), 4.5) == AppliedQuery(7, 1.5)
    assert decode_applied_query(b'{"index": 7}', 4.5) == AppliedQuery(7, 4.5)
    assert decode_applied(encode_applied(Applied(True))) == Applied(True)
    assert decode_join(encode_join(JoinRequest("b"))) == JoinRequest("b")
    assert decode_join_answer(encode_join_answer(JoinAnswer(False, "no quorum"))) == JoinAnswer(False, "no quorum")
    assert decode_heartbeat(encode_heartbeat(Heartbeat("c"))) == Heartbeat("c")


def test_the_wire_is_the_json_liftlog_has_always_sent() -> None:
    """Servers of the previous version (dicts with a "kind") and this one must understand each other."""
    old_isr = {"kind": "change_isr", "name": "o", "partition": 0, "isr": ["a", "b"], "epoch": 7, "timeout": 4.75}
    assert decode_request(json.dumps(old_isr).encode()) == (IsrChange("o", 0, ("a", "b"), 7), 4.75)
    old_report = {"kind": "report_leader", "name": "o", "partition": 1, "reporter": "b", "leader": "a"}
    old_report |= {"epoch": 3, "leader_epoch": 2}
    assert json.loads(encode_request(LeaderReport("o", 1, "b", "a", 3, 2))) == old_report
    assert json.loads(encode_request(PauseChange("o", (), pause=False))) == {
        "kind": "resume",
        "name": "o",
        "partitions": [],
        "resume_all": False,
    }
    assert json.loads(encode_reply(Refusal(RefusalKind.NOT_LEADER))) == {"error": {"kind": "not_leader"}}
    assert decode_reply(b'{"error": {"kind": "something_new", "message": "m"}}') == Refusal(
        RefusalKind.OTHER, message="m"
    )


@pytest.mark.parametrize(
    ("data", "wording"),
    [
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not a JSON object but list"),
        (b'{"name": "x"}', "field 'kind' is missing"),
        (b'{"kind": "drop_database"}', "unknown control request kind 'drop_database'"),
        (b'{"kind": "delete_stream"}', "'delete_stream' request: field 'name' is missing"),
        (b'{"kind": "delete_stream", "name": 5}', "field 'name' must be a string, not 5"),
        (b'{"kind": "change_isr", "name": "o", "partition": true, "isr": [], "epoch": 1}', "'partition' must be an"),
        (b'{"kind": "change_isr", "name": "o", "partition": 0, "isr": [1], "epoch": 1}', "list of strings"),
        (b'{"kind": "pause", "name": "o", "partitions": ["0"]}', "list of integers"),
        (b'{"kind": "readonly", "name": "o", "partitions": [], "readonly": 1}', "true or false"),
        (b'{"kind": "create_stream", "name": "o", "subject": "o", "settings": {"nope": 1}}', "bad settings"),
        (b'{"kind": "register_server", "server": {"id": "a"}}', "bad server"),
        (b'{"kind": "delete_stream", "name": "o", "timeout": "soon"}', "'timeout' must be a number"),
        (b'{"kind": "reassign", "moves": {"a": 1}}', "'moves' must be a list"),
        (b'{"kind": "reassign", "moves": [7]}', "move 0 must be an object"),
        (b'{"kind": "reassign", "moves": [{"name": "o", "partition": 0}]}', "move 0: field 'replicas' is missing"),
        (b'{"kind": "decommission"}', "field 'server' is missing"),
    ],
)
def test_malformed_requests_are_refused_by_name(data: bytes, wording: str) -> None:
    with pytest.raises(ProtocolError, match=wording.replace("[", r"\[")):
        decode_request(data)


@pytest.mark.parametrize(
    ("decode", "data"),
    [
        (decode_reply, b'{"index": "7"}'),
        (decode_reply, b'{"error": "boom"}'),
        (decode_log_end, b'{"leo": null}'),
        (decode_log_end_query, b'{"name": "s"}'),
        (decode_heartbeat, b'{"id": 1}'),
        (decode_join, b"null"),
    ],
)
def test_malformed_answers_are_refused(decode: object, data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(data)  # type: ignore[operator]
