"""The metadata state machine: operations, validation, persistence."""

from __future__ import annotations

from pathlib import Path

import pytest

from liftlog.metadata import (
    CorruptMetadataError,
    CreateStream,
    DeleteStream,
    InvalidStreamError,
    Metadata,
    MetadataError,
    MetadataFile,
    NoSuchPartitionError,
    NoSuchStreamError,
    PartitionMeta,
    SetPaused,
    SetReadonly,
    StreamExistsError,
    StreamMeta,
    StreamSettings,
    partition_subject,
    validate_stream_name,
    validate_subject,
)
from liftlog.metadata.model import (
    ChangeIsr,
    ChangeLeader,
    PartitionState,
    RegisterServer,
    ServerMeta,
    SetPartitionState,
    SetServerLiveness,
    StaleEpochError,
)


def stream(name: str = "orders", subject: str = "orders", partitions: int = 2) -> StreamMeta:
    s = StreamMeta(name=name, subject=subject, group="", creation_timestamp=1, settings=StreamSettings(min_isr=1))
    for i in range(partitions):
        s.partitions[i] = PartitionMeta(name, i, partition_subject(subject, i), "a", ["a"], ["a"])
    return s


def test_partition_subjects_follow_liftbridge() -> None:
    assert partition_subject("foo.bar", 0) == "foo.bar"
    assert partition_subject("foo.bar", 3) == "foo.bar.3"


@pytest.mark.parametrize("name", ["", "a b", "a/b", "..", ".", "x" * 250, "caf\u00e9"])
def test_invalid_stream_names_are_rejected(name: str) -> None:
    with pytest.raises(InvalidStreamError, match="stream name"):
        validate_stream_name(name)


@pytest.mark.parametrize("subject", ["", "a..b", "a.b.", "a b", "a.>.b", "a*", "foo.b>"])
def test_invalid_subjects_are_rejected(subject: str) -> None:
    with pytest.raises(InvalidStreamError, match="subject"):
        validate_subject(subject)


@pytest.mark.parametrize("subject", ["a", "a.b", "a.*", "a.>", "*.b.>", ">"])
def test_wildcard_subjects_are_accepted(subject: str) -> None:
    validate_subject(subject)


def test_create_twice_is_rejected_and_changes_nothing() -> None:
    meta = Metadata()
    meta.apply(CreateStream(stream()))
    with pytest.raises(StreamExistsError, match="orders"):
        meta.apply(CreateStream(stream(subject="other")))
    assert meta.stream("orders").subject == "orders"


def test_delete_unknown_stream() -> None:
    with pytest.raises(NoSuchStreamError, match="nope"):
        Metadata().apply(DeleteStream("nope"))


def test_pause_records_timestamps_and_resume_all() -> None:
    meta = Metadata()
    meta.apply(CreateStream(stream()))
    changed = meta.apply(SetPaused("orders", (0,), True, 100, resume_all=True))
    assert [p.id for p in changed] == [0]
    meta.apply(SetPaused("orders", (1,), True, 200))  # resume_all now False again
    meta.apply(SetPaused("orders", (0, 1), True, 300, resume_all=True))
    p0 = meta.partition("orders", 0)
    assert (p0.pause_timestamps.first, p0.pause_timestamps.latest) == (100, 100)  # already paused at 300
    resumed = meta.apply(SetPaused("orders", (1,), False, 400))
    assert sorted(p.id for p in resumed) == [0, 1]
    assert not any(p.paused for p in meta.stream("orders").partitions.values())


def test_every_change_to_a_partition_bumps_its_epoch_and_no_ops_do_not() -> None:
    meta = Metadata()
    meta.apply(CreateStream(stream()))
    meta.apply(SetPaused("orders", (0,), True, 1))
    meta.apply(SetPaused("orders", (0,), True, 2))  # already paused: nothing changes
    meta.apply(SetReadonly("orders", (0, 1), True, 3))
    assert (meta.partition("orders", 0).epoch, meta.partition("orders", 1).epoch) == (2, 1)
    assert Metadata.from_dict(meta.to_dict()).partition("orders", 0).epoch == 2


def test_unknown_partition_in_an_operation() -> None:
    meta = Metadata()
    meta.apply(CreateStream(stream()))
    with pytest.raises(NoSuchPartitionError, match="no partition 7"):
        meta.apply(SetReadonly("orders", (0, 7), True, 1))
    assert not meta.partition("orders", 0).readonly


def test_round_trip_through_the_file(tmp_path: Path) -> None:
    meta = Metadata()
    meta.apply(CreateStream(stream()))
    meta.apply(SetReadonly("orders", (1,), True, 5))
    store = MetadataFile(tmp_path / "metadata.json")
    store.save(meta)
    loaded = store.load()
    assert loaded.to_dict() == meta.to_dict()
    assert loaded.partition("orders", 1).readonly_timestamps.latest == 5
    assert loaded.stream("orders").settings.min_isr == 1


def test_missing_file_is_empty_and_corrupt_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "metadata.json"
    assert MetadataFile(path).load().streams == {}
    path.write_text("{not json")
    with pytest.raises(CorruptMetadataError, match=r"metadata\.json"):
        MetadataFile(path).load()


# --- servers -------------------------------------------------------------------------------------


def test_register_server_adds_an_alive_server() -> None:
    meta = Metadata()
    # The registration's own alive / liveness_changed are ignored: registering counts as alive from timestamp.
    changed = meta.apply(RegisterServer(ServerMeta("s1", "10.0.0.1", 9292, rack="r1", alive=False), 100))
    assert changed == []
    assert meta.servers["s1"] == ServerMeta("s1", "10.0.0.1", 9292, rack="r1", alive=True, liveness_changed=100)


def test_register_server_copies_the_operation_server() -> None:
    op = RegisterServer(ServerMeta("s1", "h", 1), 100)
    meta = Metadata()
    meta.apply(op)
    meta.apply(SetServerLiveness("s1", False, 200))
    assert op.server.alive is True  # the operation is not mutated by later operations
    assert op.server.liveness_changed == 0


def test_re_registration_while_alive_updates_the_address_and_keeps_liveness_changed() -> None:
    meta = Metadata()
    meta.apply(RegisterServer(ServerMeta("s1", "old-host", 1, rack="r1"), 100))
    meta.apply(RegisterServer(ServerMeta("s1", "new-host", 2, rack="r2"), 500))
    assert list(meta.servers) == ["s1"]
    assert meta.servers["s1"] == ServerMeta("s1", "new-host", 2, rack="r2", alive=True, liveness_changed=100)


def test_re_registration_after_being_dead_revives_and_resets_liveness_changed() -> None:
    meta = Metadata()
    meta.apply(RegisterServer(ServerMeta("s1", "h", 1), 100))
    meta.apply(SetServerLiveness("s1", False, 300))
    meta.apply(RegisterServer(ServerMeta("s1", "h", 1), 700))
    assert meta.servers["s1"].alive is True
    assert meta.servers["s1"].liveness_changed == 700


def test_set_server_liveness_flips_alive_and_records_the_time() -> None:
    meta = Metadata()
    meta.apply(RegisterServer(ServerMeta("s1", "h", 1), 100))
    meta.apply(RegisterServer(ServerMeta("s2", "h", 2), 100))
    assert meta.apply(SetServerLiveness("s1", False, 300)) == []
    assert (meta.servers["s1"].alive, meta.servers["s1"].liveness_changed) == (False, 300)
    assert (meta.servers["s2"].alive, meta.servers["s2"].liveness_changed) == (True, 100)  # untouched
    meta.apply(SetServerLiveness("s1", True, 400))
    assert (meta.servers["s1"].alive, meta.servers["s1"].liveness_changed) == (True, 400)


@pytest.mark.parametrize("alive", [True, False])
def test_set_server_liveness_to_the_current_value_is_a_no_op(alive: bool) -> None:
    meta = Metadata()
    meta.apply(RegisterServer(ServerMeta("s1", "h", 1), 100))
    if not alive:
        meta.apply(SetServerLiveness("s1", False, 200))
    before = meta.to_dict()
    assert meta.apply(SetServerLiveness("s1", alive, 999)) == []
    assert meta.to_dict() == before
    assert meta.servers["s1"].liveness_changed == (100 if alive else 200)


def test_set_server_liveness_of_an_unknown_server_is_an_error() -> None:
    meta = Metadata()
    meta.apply(RegisterServer(ServerMeta("s1", "h", 1), 100))
    before = meta.to_dict()
    with pytest.raises(MetadataError, match="no such server: 'ghost'"):
        meta.apply(SetServerLiveness("ghost", False, 200))
    assert meta.to_dict() == before
    assert "ghost" not in meta.servers


def test_servers_round_trip_through_to_dict() -> None:
    meta = Metadata()
    meta.apply(RegisterServer(ServerMeta("s1", "h1", 1, rack="r1"), 100))
    meta.apply(RegisterServer(ServerMeta("s2", "h2", 2), 110))
    meta.apply(SetServerLiveness("s2", False, 300))
    meta.apply(CreateStream(stream()))
    data = meta.to_dict()
    assert data["servers"] == [
        {"id": "s1", "host": "h1", "port": 1, "rack": "r1", "alive": True, "liveness_changed": 100},
        {"id": "s2", "host": "h2", "port": 2, "rack": "", "alive": False, "liveness_changed": 300},
    ]
    loaded = Metadata.from_dict(data)
    assert loaded.to_dict() == data
    assert loaded.servers["s2"] == ServerMeta("s2", "h2", 2, rack="", alive=False, liveness_changed=300)


def test_from_dict_without_servers_reads_older_files() -> None:
    meta = Metadata()
    meta.apply(CreateStream(stream()))
    data = meta.to_dict()
    del data["servers"]
    loaded = Metadata.from_dict(data)
    assert loaded.servers == {}
    assert loaded.stream("orders").partitions.keys() == {0, 1}


def test_server_from_dict_defaults_optional_fields() -> None:
    data = {"version": 1, "servers": [{"id": "s1", "host": "h", "port": "9292"}], "streams": []}
    server = Metadata.from_dict(data).servers["s1"]
    assert server == ServerMeta("s1", "h", 9292, rack="", alive=True, liveness_changed=0)


def replicated(partitions: int = 1) -> Metadata:
    meta = Metadata()
    s = StreamMeta(name="orders", subject="orders", group="", creation_timestamp=1, settings=StreamSettings())
    for i in range(partitions):
        s.partitions[i] = PartitionMeta(
            "orders", i, partition_subject("orders", i), "a", ["a", "b", "c"], ["a", "b", "c"]
        )
    meta.apply(CreateStream(s))
    return meta


def test_isr_changes_need_the_current_epoch_keep_the_leader_and_replica_order() -> None:
    meta = replicated()
    [p] = meta.apply(ChangeIsr("orders", 0, ("c", "a"), 0))
    assert p.isr == ["a", "c"] and p.epoch == 1 and p.leader_epoch == 0
    with pytest.raises(StaleEpochError, match="at epoch 1, not 0"):
        meta.apply(ChangeIsr("orders", 0, ("a",), 0))
    with pytest.raises(InvalidStreamError, match="must keep its leader a"):
        meta.apply(ChangeIsr("orders", 0, ("b", "c"), 1))
    with pytest.raises(InvalidStreamError, match="x not a replica"):
        meta.apply(ChangeIsr("orders", 0, ("a", "x"), 1))
    assert meta.partition("orders", 0).isr == ["a", "c"]


def test_an_election_walks_its_states_and_a_new_leader_starts_a_new_leader_epoch() -> None:
    meta = replicated()
    meta.apply(SetPartitionState("orders", 0, PartitionState.ELECTION, "", 0))
    meta.apply(SetPartitionState("orders", 0, PartitionState.CANDIDATE_FOUND, "b", 1))
    p = meta.partition("orders", 0)
    assert (p.state, p.candidate, p.epoch) == (PartitionState.CANDIDATE_FOUND, "b", 2)
    meta.apply(ChangeLeader("orders", 0, "b", ("c",), 2))
    assert (p.leader, p.isr, p.leader_epoch, p.epoch) == ("b", ["b", "c"], 1, 3)
    assert (p.state, p.candidate) == (PartitionState.ONLINE, "")
    restored = Metadata.from_dict(meta.to_dict()).partition("orders", 0)
    assert (restored.state, restored.leader, restored.leader_epoch) == (PartitionState.ONLINE, "b", 1)
    meta.apply(SetPartitionState("orders", 0, PartitionState.OFFLINE, "", 3))
    assert Metadata.from_dict(meta.to_dict()).partition("orders", 0).state is PartitionState.OFFLINE
