"""Fuzzing the server-to-server protocols: control messages, metadata operations and snapshots, replication.

The two properties of ``test_decoders``: random bytes, and mutated valid
encodings, are decoded or refused with the documented error (ProtocolError,
MetadataCodecError), deterministically. The JSON formats also get valid
JSON with one field changed to any JSON value (a huge number, infinity, a
list where a string belongs, deep nesting): byte mutations mostly break
the JSON itself and never reach the field checks behind the parser.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from tests.fuzz.common import BINARY, decodes_or_refuses, fuzz_settings, json_mutated, mutated, names

from liftlog.api.envelope import MsgType, encode_envelope
from liftlog.metadata import codec, protocol
from liftlog.metadata.controller import CreateStreamRequest
from liftlog.metadata.model import (
    AddPolicy,
    ChangeGroupCoordinator,
    ChangeIsr,
    ChangeLeader,
    CompleteReassignment,
    CreateStream,
    DeleteStream,
    EventTimestamps,
    JoinGroup,
    LeaveGroup,
    MarkActivityPublished,
    Metadata,
    PartitionMeta,
    PartitionState,
    Policy,
    ReassignPartition,
    RegisterServer,
    RemoveServer,
    RevokePolicy,
    ServerMeta,
    SetPartitionState,
    SetPaused,
    SetReadonly,
    SetServerLeaving,
    SetServerLiveness,
    StreamMeta,
    StreamSettings,
)
from liftlog.replication import protocol as replication
from liftlog.replication.protocol import (
    EpochOffsetRequest,
    EpochOffsetResponse,
    FetchError,
    FetchErrorCode,
    FetchRequest,
    PartitionFetch,
    PartitionNotification,
    PartitionRefusal,
)

I32 = st.integers(0, 2**31 - 1)
I64 = st.integers(0, 2**63 - 1)
NESTED = b"[" * 5000  # deeper than the JSON parser's recursion limit


def same_repr(a: object, b: object) -> bool:
    """Equal values; NaN (valid in the JSON Python reads) is not equal to itself, its repr is."""
    return repr(a) == repr(b)


# -- liftlog.metadata.protocol --------------------------------------------------------

settings_values = st.builds(
    StreamSettings,
    retention_max_bytes=st.none() | I64,
    segment_max_bytes=st.none() | I64,
    compact_enabled=st.none() | st.booleans(),
    min_isr=st.none() | I32,
)
servers = st.builds(
    ServerMeta,
    id=names,
    host=names,
    port=st.integers(0, 65535),
    rack=names,
    alive=st.booleans(),
    liveness_changed=I64,
    leaving=st.booleans(),
)
partition_lists = st.lists(I32, max_size=3).map(tuple)
name_lists = st.lists(names, max_size=3).map(tuple)
control_requests = st.one_of(
    st.builds(
        protocol.CreateStreamChange,
        st.builds(CreateStreamRequest, names, names, names, I32, st.integers(-1, 5), settings_values),
    ),
    st.builds(protocol.DeleteStreamChange, names),
    st.builds(protocol.PauseChange, names, partition_lists, st.booleans(), st.booleans()),
    st.builds(protocol.ReadonlyChange, names, partition_lists, st.booleans()),
    st.builds(protocol.IsrChange, names, I32, name_lists, I64),
    st.builds(protocol.ServerRegistration, servers),
    st.builds(protocol.LeaderReport, names, I32, names, names, I64, I64, names),
    st.builds(protocol.LeaderConfirmation, names, I32, names),
    st.builds(
        protocol.ReassignChange,
        st.lists(st.builds(protocol.PartitionMove, names, I32, name_lists), max_size=2).map(tuple),
        st.booleans(),
    ),
    st.builds(protocol.DecommissionChange, names),
    st.just(protocol.PreferredLeadersChange()),
    st.builds(protocol.PolicyChange, names, names, names, st.booleans()),
    st.builds(protocol.GroupJoinChange, names, names, name_lists),
    st.builds(protocol.GroupLeaveChange, names, names, st.booleans()),
    st.builds(protocol.GroupCoordinatorReport, names, names, names, I64),
)
replies = st.builds(protocol.Committed, I64) | st.builds(
    protocol.Refusal, st.sampled_from(protocol.RefusalKind), names, st.integers(-1, 2**31), names
)

CONTROL: list[tuple[str, Callable[[bytes], object], st.SearchStrategy[bytes]]] = [
    (
        "request",
        protocol.decode_request,
        st.builds(protocol.encode_request, control_requests, st.none() | st.floats(0, 1e6)),
    ),
    ("reply", protocol.decode_reply, replies.map(protocol.encode_reply)),
    (
        "log_end_query",
        protocol.decode_log_end_query,
        st.builds(protocol.LogEndQuery, names, I32).map(protocol.encode_log_end_query),
    ),
    (
        "log_end",
        protocol.decode_log_end,
        st.builds(protocol.LogEnd, st.integers(-1, 2**63)).map(protocol.encode_log_end),
    ),
    (
        "applied_query",
        lambda data: protocol.decode_applied_query(data, 5.0),
        st.builds(protocol.AppliedQuery, I64, st.floats(0, 1e6)).map(protocol.encode_applied_query),
    ),
    ("applied", protocol.decode_applied, st.builds(protocol.Applied, st.booleans()).map(protocol.encode_applied)),
    ("join", protocol.decode_join, st.builds(protocol.JoinRequest, names).map(protocol.encode_join)),
    (
        "join_answer",
        protocol.decode_join_answer,
        st.builds(protocol.JoinAnswer, st.booleans(), names).map(protocol.encode_join_answer),
    ),
    ("heartbeat", protocol.decode_heartbeat, st.builds(protocol.Heartbeat, names).map(protocol.encode_heartbeat)),
]
CONTROL_IDS = [name for name, _, _ in CONTROL]


@pytest.mark.parametrize(("decode", "valid"), [(d, v) for _, d, v in CONTROL], ids=CONTROL_IDS)
@fuzz_settings(100)
@given(data=BINARY)
@example(data=NESTED)  # raised RecursionError
@example(data=b"\xff{}")  # not UTF-8
def test_control_messages_on_random_bytes(
    decode: Callable[[bytes], object], valid: st.SearchStrategy[bytes], data: bytes
) -> None:
    """Control messages arrive on NATS subjects any server (or anyone, without a cluster secret) can
    publish on: ProtocolError for anything that is not one."""
    decodes_or_refuses(decode, data, protocol.ProtocolError, same_repr)


@pytest.mark.parametrize(("decode", "valid"), [(d, v) for _, d, v in CONTROL], ids=CONTROL_IDS)
@fuzz_settings(100)
@given(data=st.data())
def test_control_messages_on_mutated_encodings(
    decode: Callable[[bytes], object], valid: st.SearchStrategy[bytes], data: st.DataObject
) -> None:
    """Damaged bytes, and valid JSON with a field changed to any JSON value."""
    decodes_or_refuses(decode, data.draw(mutated(valid)), protocol.ProtocolError, same_repr)
    decodes_or_refuses(decode, data.draw(json_mutated(valid)), protocol.ProtocolError, same_repr)


@pytest.mark.parametrize(
    "data",
    [
        b'{"kind": "delete_stream", "name": "s", "timeout": 1' + b"0" * 400 + b"}",  # OverflowError
        b'{"kind": "register_server", "server": {"id": "a", "host": "h", "port": Infinity}}',  # OverflowError
        b'{"kind": "register_server", "server": {"id": "a", "host": "h", "port": 1e400}}',
        b'{"kind": "delete_stream", "name": ' + NESTED + b"]",  # RecursionError
    ],
    ids=["huge_timeout", "infinite_port", "overflowing_port", "nested"],
)
def test_control_requests_that_escaped_protocol_error(data: bytes) -> None:
    """Found by the properties above: each raised something other than ProtocolError."""
    with pytest.raises(protocol.ProtocolError):
        protocol.decode_request(data)


def test_an_applied_query_with_a_huge_timeout_is_refused() -> None:
    """float() of a 400-digit integer overflows: a ProtocolError naming the field, not an OverflowError."""
    with pytest.raises(protocol.ProtocolError, match="timeout"):
        protocol.decode_applied_query(b'{"index": 1, "timeout": 1' + b"0" * 400 + b"}", 5.0)


# -- liftlog.metadata.codec -----------------------------------------------------------

events = st.builds(EventTimestamps, I64, I64)


@st.composite
def streams(draw: st.DrawFn) -> StreamMeta:
    name = draw(names)
    stream = StreamMeta(
        name, draw(names), draw(names), draw(I64), draw(settings_values), resume_all=draw(st.booleans())
    )
    for i in range(draw(st.integers(0, 2))):
        replicas = draw(st.lists(names, max_size=3))
        stream.partitions[i] = PartitionMeta(
            name,
            i,
            draw(names),
            draw(names),
            replicas,
            replicas[:1],
            leader_epoch=draw(I64),
            epoch=draw(I64),
            paused=draw(st.booleans()),
            pause_timestamps=draw(events),
            state=draw(st.sampled_from(PartitionState)),
            candidate=draw(names),
            target=draw(st.lists(names, max_size=2)),
        )
    return stream


operations = st.one_of(
    st.builds(RegisterServer, servers, I64),
    st.builds(SetServerLiveness, names, st.booleans(), I64),
    st.builds(CreateStream, streams()),
    st.builds(DeleteStream, names),
    st.builds(SetPaused, names, partition_lists, st.booleans(), I64, st.booleans()),
    st.builds(SetReadonly, names, partition_lists, st.booleans(), I64),
    st.builds(ChangeIsr, names, I32, name_lists, I64),
    st.builds(ChangeLeader, names, I32, names, name_lists, I64),
    st.builds(SetPartitionState, names, I32, st.sampled_from(PartitionState), names, I64),
    st.builds(ReassignPartition, names, I32, name_lists, I64),
    st.builds(CompleteReassignment, names, I32, I64),
    st.builds(SetServerLeaving, names, st.booleans()),
    st.builds(RemoveServer, names),
    st.builds(AddPolicy, st.builds(Policy, names, names, names)),
    st.builds(RevokePolicy, st.builds(Policy, names, names, names)),
    st.builds(MarkActivityPublished, I64),
    st.builds(JoinGroup, names, names, name_lists, names),
    st.builds(LeaveGroup, names, names, st.booleans()),
    st.builds(ChangeGroupCoordinator, names, names, I64),
)


@st.composite
def metadata(draw: st.DrawFn) -> Metadata:
    meta = Metadata()
    for server in draw(st.lists(servers, max_size=2)):
        meta.servers[server.id] = server
    for stream in draw(st.lists(streams(), max_size=2)):
        meta.streams[stream.name] = stream
    for policy in draw(st.lists(st.builds(Policy, names, names, names), max_size=2)):
        meta.policies[policy] = None
    return meta


encoded_operations = operations.map(codec.encode_operation)
snapshot_json = metadata().map(lambda m: json.dumps(m.to_dict()).encode())


def snapshot_dict(meta: Metadata) -> str:
    return repr(meta.to_dict())


@fuzz_settings(150)
@given(data=BINARY)
@example(data=NESTED)  # raised RecursionError
@example(data=b'{"op": "set_server_liveness", "id": "a", "alive": true, "timestamp": Infinity}')  # OverflowError
@example(data=b'{"op": "register_server", "server": {"id": "a", "host": "h", "port": 1e999}, "timestamp": 1}')
def test_metadata_operations_on_random_bytes(data: bytes) -> None:
    """The metadata Raft log holds what the controller proposed; a follower refuses what it cannot read."""
    decodes_or_refuses(codec.decode_operation, data, codec.MetadataCodecError, same_repr)


@fuzz_settings(150)
@given(plain=mutated(encoded_operations), fields=json_mutated(encoded_operations))
def test_metadata_operations_on_mutated_encodings(plain: bytes, fields: bytes) -> None:
    """Damaged operations, and operations with a field changed to any JSON value."""
    decodes_or_refuses(codec.decode_operation, plain, codec.MetadataCodecError, same_repr)
    decodes_or_refuses(codec.decode_operation, fields, codec.MetadataCodecError, same_repr)


def decode_snapshot(data: bytes) -> str:
    """The snapshot, as the repr of its dict: Metadata has no equality of its own."""
    return snapshot_dict(codec.decode_snapshot(data))


@fuzz_settings(150)
@given(data=BINARY)
@example(data=zlib.compress(NESTED))  # raised RecursionError
@example(data=zlib.compress(b'{"version": 1, "servers": [{"id": "a", "host": "h", "port": Infinity}]}'))
def test_metadata_snapshots_on_random_bytes(data: bytes) -> None:
    """Snapshots arrive in InstallSnapshot messages and from disk: MetadataCodecError for a bad one."""
    decodes_or_refuses(decode_snapshot, data, codec.MetadataCodecError)
    decodes_or_refuses(decode_snapshot, zlib.compress(data), codec.MetadataCodecError)  # past zlib


@fuzz_settings(150)
@given(plain=mutated(metadata().map(codec.encode_snapshot)), fields=json_mutated(snapshot_json))
def test_metadata_snapshots_on_mutated_encodings(plain: bytes, fields: bytes) -> None:
    """Damaged snapshots (zlib's checksum catches most), and snapshots with a field changed, recompressed."""
    decodes_or_refuses(decode_snapshot, plain, codec.MetadataCodecError)
    decodes_or_refuses(decode_snapshot, zlib.compress(fields), codec.MetadataCodecError)


# -- liftlog.replication.protocol -----------------------------------------------------

fetch_errors = st.builds(FetchError, st.sampled_from(FetchErrorCode), names, st.integers(-1, 2**63 - 1), I64)
answers = st.tuples(names, I32, I64, st.integers(-1, 2**63 - 1), st.binary(max_size=32)) | st.builds(
    PartitionRefusal, names, I32, fetch_errors
)
pairs = st.lists(st.tuples(names, I32), min_size=1, max_size=3)
epoch_responses = st.builds(
    EpochOffsetResponse, st.integers(-1, 2**63 - 1), st.integers(-1, 2**63 - 1), st.integers(-1, 2**63 - 1)
)

fetch_requests = st.builds(
    FetchRequest,
    names,
    st.integers(0, 2**32 - 1),
    st.lists(st.builds(PartitionFetch, names, I32, I64, I64, I64), min_size=1, max_size=3).map(tuple),
).map(replication.encode_fetch_request)
REPLICATION: list[tuple[str, Callable[[bytes], object], MsgType, st.SearchStrategy[bytes]]] = [
    ("fetch_request", replication.decode_fetch_request, MsgType.REPLICATION_REQUEST, fetch_requests),
    (
        "fetch_response",
        replication.decode_fetch_response,
        MsgType.REPLICATION_RESPONSE,
        st.lists(answers, max_size=3).map(replication.encode_fetch_response),
    ),
    (
        "fetch_error",
        replication.decode_fetch_error,
        MsgType.PARTITION_STATUS_RESPONSE,
        fetch_errors.map(replication.encode_fetch_error),
    ),
    (
        "epoch_offset_request",
        replication.decode_epoch_offset_request,
        MsgType.LEADER_EPOCH_OFFSET_REQUEST,
        st.builds(EpochOffsetRequest, names, I32, I64, I64, I64).map(replication.encode_epoch_offset_request),
    ),
    (
        "epoch_offset_response",
        replication.decode_epoch_offset_response,
        MsgType.LEADER_EPOCH_OFFSET_RESPONSE,
        epoch_responses.map(replication.encode_epoch_offset_response),
    ),
    (
        "epoch_offset_reply",
        replication.decode_epoch_offset_reply,
        MsgType.LEADER_EPOCH_OFFSET_RESPONSE,
        epoch_responses.map(replication.encode_epoch_offset_response)
        | fetch_errors.map(replication.encode_fetch_error),
    ),
    (
        "notification",
        replication.decode_notification,
        MsgType.PARTITION_NOTIFICATION,
        pairs.map(replication.encode_notification),
    ),
    (
        "partition_notification",
        replication.decode_partition_notification,
        MsgType.PARTITION_NOTIFICATION,
        st.builds(PartitionNotification, names, I32).map(replication.encode_partition_notification),
    ),
]
REPLICATION_IDS = [name for name, _, _, _ in REPLICATION]


@pytest.mark.parametrize(("decode", "msg_type"), [(d, t) for _, d, t, _ in REPLICATION], ids=REPLICATION_IDS)
@fuzz_settings(100)
@given(data=BINARY, crc=st.booleans())
@example(data=b"\x02\x00\x00\x00\x00\xff\xff\xff\xff\x00\x00", crc=False)  # a fetch claiming 2^32-1 partitions
@example(data=b"\x01\xff\xff\xff\xff", crc=False)  # a notification claiming 2^32-1 pairs
def test_replication_messages_on_random_bytes(
    decode: Callable[[bytes], object], msg_type: MsgType, data: bytes, crc: bool
) -> None:
    """Fetches and their answers travel over NATS: ProtocolError for anything malformed, in or out of an
    envelope of the right type (with or without its CRC)."""
    decodes_or_refuses(decode, data, replication.ProtocolError)
    decodes_or_refuses(decode, encode_envelope(msg_type, data, crc), replication.ProtocolError)


@pytest.mark.parametrize(("decode", "valid"), [(d, v) for _, d, _, v in REPLICATION], ids=REPLICATION_IDS)
@fuzz_settings(100)
@given(data=st.data())
def test_replication_messages_on_mutated_encodings(
    decode: Callable[[bytes], object], valid: st.SearchStrategy[bytes], data: st.DataObject
) -> None:
    """Damaged replication messages, each as its own encoder writes it."""
    decodes_or_refuses(decode, data.draw(mutated(valid)), replication.ProtocolError)
