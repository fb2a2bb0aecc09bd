"""Metadata operations and snapshots as bytes: round trips, the wire format, malformed input."""

from __future__ import annotations

import json
import zlib

import pytest

from liftlog.metadata.codec import (
    MetadataCodecError,
    decode_operation,
    decode_snapshot,
    encode_operation,
    encode_snapshot,
)
from liftlog.metadata.model import (
    AddPolicy,
    ChangeIsr,
    ChangeLeader,
    CreateStream,
    DeleteStream,
    EventTimestamps,
    Metadata,
    Operation,
    PartitionMeta,
    PartitionState,
    Policy,
    RegisterServer,
    RevokePolicy,
    ServerMeta,
    SetPartitionState,
    SetPaused,
    SetReadonly,
    SetServerLiveness,
    StreamMeta,
    StreamSettings,
    partition_subject,
)

SETTINGS = StreamSettings(
    retention_max_bytes=1 << 30,
    retention_max_messages=1000,
    retention_max_age_ms=3_600_000,
    segment_max_bytes=1 << 20,
    compact_enabled=True,
    auto_pause_time_ms=0,
    auto_pause_disable_if_subscribers=False,
    min_isr=2,
    optimistic_concurrency_control=True,
    encryption=False,
)


def stream(name: str = "orders", subject: str = "orders.new", partitions: int = 3) -> StreamMeta:
    s = StreamMeta(
        name=name, subject=subject, group="g1", creation_timestamp=1_700_000_000_000, settings=SETTINGS, resume_all=True
    )
    for i in range(partitions):
        replicas = [f"s{(i + k) % 3}" for k in range(3)]
        s.partitions[i] = PartitionMeta(
            name,
            i,
            partition_subject(subject, i),
            replicas[0],
            replicas,
            replicas[:2],
            leader_epoch=i + 4,
            paused=i == 1,
            readonly=i == 2,
            pause_timestamps=EventTimestamps(10, 20) if i == 1 else EventTimestamps(),
            readonly_timestamps=EventTimestamps(30, 30) if i == 2 else EventTimestamps(),
        )
    return s


def operations() -> list[Operation]:
    """One of every operation type, with non-default fields."""
    return [
        RegisterServer(ServerMeta("s0", "10.0.0.1", 9292, rack="rack-a"), 100),
        RegisterServer(ServerMeta("s1", "10.0.0.2", 9293, rack="rack-b"), 101),
        RegisterServer(ServerMeta("s2", "host-2.example", 9294), 102),
        SetServerLiveness("s2", False, 200),
        CreateStream(stream()),
        CreateStream(stream("other", "other", 1)),
        SetPaused("orders", (0, 2), True, 300, resume_all=True),
        SetReadonly("orders", (0,), True, 400),
        SetPaused("orders", (), False, 500),
        SetServerLiveness("s2", True, 600),
        ChangeIsr("orders", 0, ("s0", "s1", "s2"), 3),
        SetPartitionState("orders", 0, PartitionState.ELECTION, "", 4),
        SetPartitionState("orders", 0, PartitionState.CANDIDATE_FOUND, "s1", 5),
        ChangeLeader("orders", 0, "s1", ("s1", "s2"), 6),
        DeleteStream("other"),
        AddPolicy(Policy("client1", "orders.*", "Publish")),
        AddPolicy(Policy("*", "*", "FetchMetadata")),
        RevokePolicy(Policy("client1", "orders.*", "Publish")),
    ]


OP_IDS = [f"{i}-{type(op).__name__}" for i, op in enumerate(operations())]


@pytest.mark.parametrize("index", range(len(operations())), ids=OP_IDS)
def test_every_operation_round_trips(index: int) -> None:
    op = operations()[index]
    decoded = decode_operation(encode_operation(op))
    assert type(decoded) is type(op)
    assert decoded == op


def test_create_stream_round_trip_keeps_settings_and_partition_state() -> None:
    decoded = decode_operation(encode_operation(CreateStream(stream())))
    assert isinstance(decoded, CreateStream)
    s = decoded.stream
    assert s.settings == SETTINGS
    assert s.settings.min_isr == 2
    assert s.settings.cleaner_interval_ms is None  # unset overrides stay unset
    assert s.group == "g1"
    assert s.resume_all is True
    assert list(s.partitions) == [0, 1, 2]
    p1, p2 = s.partitions[1], s.partitions[2]
    assert p1.stream == "orders"
    assert p1.subject == "orders.new.1"
    assert (p1.paused, p1.pause_timestamps) == (True, EventTimestamps(10, 20))
    assert (p2.readonly, p2.readonly_timestamps) == (True, EventTimestamps(30, 30))
    assert p2.isr == ["s2", "s0"]
    assert p2.leader_epoch == 6


def test_register_server_round_trip_keeps_rack_and_dead_flag() -> None:
    op = RegisterServer(ServerMeta("s9", "h", 1, rack="r1", alive=False, liveness_changed=77), 5)
    decoded = decode_operation(encode_operation(op))
    assert isinstance(decoded, RegisterServer)
    assert decoded.server.rack == "r1"
    assert decoded.server.alive is False
    assert decoded.server.liveness_changed == 77
    assert decoded.timestamp == 5


def test_set_paused_partitions_come_back_as_a_tuple() -> None:
    decoded = decode_operation(encode_operation(SetPaused("orders", (2, 0), True, 9)))
    assert isinstance(decoded, SetPaused)
    assert decoded.partitions == (2, 0)
    assert decoded.resume_all is False


@pytest.mark.parametrize(
    ("op", "tag"),
    [
        (RegisterServer(ServerMeta("s0", "h", 1), 1), "register_server"),
        (SetServerLiveness("s0", True, 1), "set_server_liveness"),
        (CreateStream(stream()), "create_stream"),
        (DeleteStream("orders"), "delete_stream"),
        (SetPaused("orders", (), True, 1), "set_paused"),
        (SetReadonly("orders", (), True, 1), "set_readonly"),
    ],
)
def test_operations_are_compact_json_tagged_by_op(op: Operation, tag: str) -> None:
    # The tags are the persisted log format: renaming one breaks existing logs.
    data = encode_operation(op)
    assert isinstance(data, bytes)
    assert b": " not in data and b", " not in data  # compact separators
    assert json.loads(data)["op"] == tag


def test_set_paused_without_resume_all_decodes_as_false() -> None:
    data = b'{"op":"set_paused","name":"orders","partitions":[1],"paused":true,"timestamp":3}'
    assert decode_operation(data) == SetPaused("orders", (1,), True, 3, resume_all=False)


def test_unknown_extra_fields_in_an_operation_are_ignored() -> None:
    data = b'{"op":"delete_stream","name":"orders","added_later":42}'
    assert decode_operation(data) == DeleteStream("orders")


def test_replaying_decoded_operations_reaches_the_same_state() -> None:
    originals = operations()
    encoded = [encode_operation(op) for op in originals]  # encoded when proposed, before being applied
    direct, replayed = Metadata(), Metadata()
    direct_changes = [sorted((p.stream, p.id) for p in direct.apply(op)) for op in originals]
    replayed_changes = [sorted((p.stream, p.id) for p in replayed.apply(decode_operation(b))) for b in encoded]
    assert replayed.to_dict() == direct.to_dict()
    assert replayed_changes == direct_changes
    # The sequence really changed something, so the comparison is not vacuous.
    assert set(replayed.servers) == {"s0", "s1", "s2"}
    assert replayed.servers["s2"].liveness_changed == 600
    assert set(replayed.streams) == {"orders"}
    assert replayed.partition("orders", 0).readonly
    assert not any(p.paused for p in replayed.stream("orders").partitions.values())


# --- snapshots -----------------------------------------------------------------------------------


def populated() -> Metadata:
    meta = Metadata()
    for op in operations():
        meta.apply(op)
    meta.apply(CreateStream(stream("third", "third.*", 2)))
    meta.apply(SetServerLiveness("s1", False, 700))
    return meta


def test_snapshot_round_trip() -> None:
    meta = populated()
    loaded = decode_snapshot(encode_snapshot(meta))
    assert loaded.to_dict() == meta.to_dict()
    assert loaded.servers["s1"].alive is False
    assert loaded.servers["s1"].liveness_changed == 700
    assert loaded.servers["s0"].rack == "rack-a"
    assert loaded.stream("orders").settings == SETTINGS
    assert loaded.partition("third", 1).subject == "third.*.1"


def test_snapshot_is_zlib_compressed_json_of_to_dict() -> None:
    meta = populated()
    data = encode_snapshot(meta)
    assert json.loads(zlib.decompress(data)) == meta.to_dict()


def test_snapshot_of_empty_metadata_round_trips() -> None:
    loaded = decode_snapshot(encode_snapshot(Metadata()))
    assert loaded.servers == {}
    assert loaded.streams == {}


def test_empty_snapshot_bytes_is_empty_metadata() -> None:
    meta = decode_snapshot(b"")
    assert isinstance(meta, Metadata)
    assert meta.servers == {}
    assert meta.streams == {}


def test_decoded_snapshot_is_independent_of_the_original() -> None:
    meta = populated()
    loaded = decode_snapshot(encode_snapshot(meta))
    loaded.apply(SetReadonly("orders", (1,), True, 900))
    loaded.apply(SetServerLiveness("s0", False, 901))
    assert not meta.partition("orders", 1).readonly
    assert meta.servers["s0"].alive


# --- malformed input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{not json", "malformed metadata operation"),
        (b"", "malformed metadata operation"),
        (b"\xff\xfe\x00", "malformed metadata operation"),
        (b"[]", "malformed metadata operation"),
        (b"null", "malformed metadata operation"),
        (b'"create_stream"', "malformed metadata operation"),
        (b'{"name":"orders"}', "'op'"),
        (b'{"op":"delete_stream"}', "'name'"),
        (b'{"op":"set_server_liveness","id":"s0","alive":true}', "'timestamp'"),
        (b'{"op":"register_server","server":{"id":"s0","port":1},"timestamp":1}', "'host'"),
        (b'{"op":"set_paused","name":"o","partitions":null,"paused":true,"timestamp":1}', "malformed"),
        (b'{"op":"set_readonly","name":"o","partitions":["x"],"readonly":true,"timestamp":1}', "malformed"),
        (b'{"op":"set_paused","name":"o","partitions":[],"paused":true,"timestamp":"soon"}', "malformed"),
        (b'{"op":"create_stream","stream":{"name":"o","subject":"o","creation_timestamp":1}}', "'partitions'"),
        (b'{"op":"create_stream","stream":"o"}', "malformed"),
        (
            b'{"op":"create_stream","stream":{"name":"o","subject":"o","creation_timestamp":1,'
            b'"settings":{"no_such_setting":1},"partitions":[]}}',
            "no_such_setting",
        ),
    ],
)
def test_malformed_operations_raise_codec_errors(data: bytes, message: str) -> None:
    with pytest.raises(MetadataCodecError, match=message):
        decode_operation(data)


@pytest.mark.parametrize("tag", ["rename_stream", "", "CREATE_STREAM"])
def test_unknown_operation_names_the_tag(tag: str) -> None:
    with pytest.raises(MetadataCodecError, match=f"unknown metadata operation '{tag}'"):
        decode_operation(json.dumps({"op": tag, "name": "orders"}).encode())


def test_codec_error_is_a_value_error_chained_to_its_cause() -> None:
    with pytest.raises(MetadataCodecError) as info:
        decode_operation(b"{not json")
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value.__cause__, json.JSONDecodeError)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"not zlib at all", "malformed metadata snapshot"),
        (zlib.compress(b'{"version":1}')[:-3], "malformed metadata snapshot"),  # truncated stream
        (b'{"version":1,"servers":[],"streams":[]}', "malformed metadata snapshot"),  # not compressed
        (zlib.compress(b"{not json"), "malformed metadata snapshot"),
        (zlib.compress(b"\xff\xfe"), "malformed metadata snapshot"),
        (zlib.compress(b'{"version":2,"streams":[]}'), "unsupported metadata version 2"),
        (zlib.compress(b'{"streams":[]}'), "unsupported metadata version None"),
        (zlib.compress(b'{"version":1,"servers":[{"id":"s0","port":1}]}'), "'host'"),
        (zlib.compress(b'{"version":1,"servers":[{"id":"s0","host":"h","port":"x"}]}'), "malformed"),
        (zlib.compress(b'{"version":1,"streams":[{"name":"o","subject":"o","creation_timestamp":1}]}'), "partitions"),
        (zlib.compress(b'{"version":1,"streams":null}'), "malformed"),
    ],
)
def test_malformed_snapshots_raise_codec_errors(data: bytes, message: str) -> None:
    with pytest.raises(MetadataCodecError, match=message):
        decode_snapshot(data)


@pytest.mark.parametrize("payload", [b"[]", b"null", b'"snapshot"', b"1"])
def test_snapshot_whose_json_is_not_an_object_is_a_codec_error(payload: bytes) -> None:
    with pytest.raises(MetadataCodecError, match="malformed metadata snapshot"):
        decode_snapshot(zlib.compress(payload))


def test_policies_live_in_the_metadata_and_its_snapshots() -> None:
    meta = Metadata()
    for op in operations():
        meta.apply(op)
    assert list(meta.policies) == [Policy("*", "*", "FetchMetadata")]
    meta.apply(RevokePolicy(Policy("nobody", "x", "y")))  # revoking what is not there changes nothing
    meta.apply(AddPolicy(Policy("*", "*", "FetchMetadata")))  # nor does adding twice
    restored = decode_snapshot(encode_snapshot(meta))
    assert list(restored.policies) == [Policy("*", "*", "FetchMetadata")]
    older = zlib.compress(b'{"version":1,"servers":[],"streams":[]}')  # a snapshot from before policies
    assert decode_snapshot(older).policies == {}
