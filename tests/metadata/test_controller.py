"""The controller's decisions: planning CreateStream over live servers, and liveness from heartbeats."""

from __future__ import annotations

from collections import Counter

import pytest

from liftlog.metadata.controller import CreateStreamRequest, LivenessTracker, plan_create_stream
from liftlog.metadata.model import (
    CreateStream,
    InvalidStreamError,
    Metadata,
    RegisterServer,
    ServerMeta,
    SetServerLiveness,
    StreamExistsError,
    StreamSettings,
    partition_subject,
)

NOW = 1_700_000_000_000_000_000
NS = "liftbridge-default"
SECOND = 1_000_000_000


def cluster(*ids: str, racks: dict[str, str] | None = None, dead: tuple[str, ...] = ()) -> Metadata:
    meta = Metadata()
    for i, id_ in enumerate(ids):
        meta.apply(RegisterServer(ServerMeta(id_, f"host-{id_}", 9000 + i, rack=(racks or {}).get(id_, "")), 10))
    for id_ in dead:
        meta.apply(SetServerLiveness(id_, False, 20))
    return meta


def create(meta: Metadata, name: str, partitions: int = 1, replication_factor: int = 1) -> CreateStream:
    """Plan a stream whose subject is its name and apply it, as the controller's driver would."""
    req = CreateStreamRequest(name, name, partitions=partitions, replication_factor=replication_factor)
    op = plan_create_stream(meta, req, NOW, namespace=NS)
    meta.apply(op)
    return op


# --- plan_create_stream: the stream it builds ----------------------------------------------------


def test_planned_stream_fields() -> None:
    meta = cluster("a", "b", "c")
    settings = StreamSettings(min_isr=2, retention_max_messages=10)
    op = plan_create_stream(
        meta,
        CreateStreamRequest(
            "orders", "orders.new", group="workers", partitions=4, replication_factor=3, settings=settings
        ),
        NOW,
        namespace=NS,
    )
    s = op.stream
    assert (s.name, s.subject, s.group, s.creation_timestamp) == ("orders", "orders.new", "workers", NOW)
    assert s.settings == settings
    assert s.resume_all is False
    assert list(s.partitions) == [0, 1, 2, 3]
    for i, p in s.partitions.items():
        assert p.id == i
        assert p.stream == "orders"
        assert p.subject == partition_subject("orders.new", i)
        assert len(p.replicas) == 3 and set(p.replicas) == {"a", "b", "c"}
        assert p.leader == p.replicas[0]
        assert p.isr == p.replicas
        assert p.isr is not p.replicas  # changing the ISR later must not change the replicas
        assert (p.leader_epoch, p.paused, p.readonly) == (0, False, False)
    assert [p.subject for p in s.partitions.values()] == ["orders.new", "orders.new.1", "orders.new.2", "orders.new.3"]
    # Leaders of one stream spread over the servers.
    assert set(Counter(p.leader for p in s.partitions.values()).values()) <= {1, 2}


def test_planning_does_not_change_the_metadata() -> None:
    meta = cluster("a", "b")
    before = meta.to_dict()
    op = plan_create_stream(meta, CreateStreamRequest("orders", "orders"), NOW, namespace=NS)
    assert meta.to_dict() == before
    assert meta.apply(op) == list(op.stream.partitions.values())
    assert meta.stream("orders").creation_timestamp == NOW


def test_zero_partitions_means_one() -> None:
    op = plan_create_stream(cluster("a"), CreateStreamRequest("orders", "orders", partitions=0), NOW, namespace=NS)
    assert list(op.stream.partitions) == [0]


def test_negative_partitions_are_rejected() -> None:
    with pytest.raises(InvalidStreamError, match="partitions must be positive, got -2"):
        plan_create_stream(cluster("a"), CreateStreamRequest("orders", "orders", partitions=-2), NOW, namespace=NS)


# --- replication factor --------------------------------------------------------------------------


def test_replication_factor_zero_means_one_replica() -> None:
    op = plan_create_stream(
        cluster("a", "b", "c"), CreateStreamRequest("o", "o", partitions=3, replication_factor=0), NOW, namespace=NS
    )
    assert all(len(p.replicas) == 1 for p in op.stream.partitions.values())


def test_replication_factor_minus_one_means_every_live_server() -> None:
    meta = cluster("a", "b", "c", "d", dead=("c",))
    op = plan_create_stream(meta, CreateStreamRequest("o", "o", partitions=3, replication_factor=-1), NOW, namespace=NS)
    for p in op.stream.partitions.values():
        assert sorted(p.replicas) == ["a", "b", "d"]


def test_replication_factor_above_the_live_servers_names_the_numbers() -> None:
    meta = cluster("a", "b", "c", "d", dead=("b", "d"))  # 4 registered, 2 alive
    with pytest.raises(
        InvalidStreamError, match=r"replication factor 3 is larger than the number of live servers \(2\)"
    ):
        plan_create_stream(meta, CreateStreamRequest("o", "o", replication_factor=3), NOW, namespace=NS)
    assert "o" not in meta.streams


def test_no_live_servers_is_an_invalid_stream() -> None:
    with pytest.raises(InvalidStreamError, match="no live servers"):
        plan_create_stream(cluster("a", dead=("a",)), CreateStreamRequest("o", "o"), NOW, namespace=NS)
    with pytest.raises(InvalidStreamError, match="no live servers"):
        plan_create_stream(Metadata(), CreateStreamRequest("o", "o"), NOW, namespace=NS)


def test_replication_factor_below_minus_one_is_rejected() -> None:
    with pytest.raises(InvalidStreamError, match="invalid replication factor -2"):
        plan_create_stream(cluster("a", "b"), CreateStreamRequest("o", "o", replication_factor=-2), NOW, namespace=NS)


def test_dead_servers_are_never_chosen() -> None:
    meta = cluster("a", "b", "c", "d", "e", dead=("b", "e"))
    for i in range(6):
        create(meta, f"s{i}", partitions=4, replication_factor=2)
    used = {r for s in meta.streams.values() for p in s.partitions.values() for r in p.replicas}
    assert used == {"a", "c", "d"}


def test_a_revived_server_is_used_again() -> None:
    meta = cluster("a", "b", dead=("b",))
    assert create(meta, "first", replication_factor=-1).stream.partitions[0].replicas == ["a"]
    meta.apply(SetServerLiveness("b", True, 30))
    assert sorted(create(meta, "second", replication_factor=-1).stream.partitions[0].replicas) == ["a", "b"]


# --- minIsr --------------------------------------------------------------------------------------


def test_min_isr_above_the_replication_factor_is_rejected() -> None:
    req = CreateStreamRequest("o", "o", replication_factor=2, settings=StreamSettings(min_isr=3))
    with pytest.raises(InvalidStreamError, match=r"minIsr 3 is larger than the replication factor \(2\)"):
        plan_create_stream(cluster("a", "b", "c"), req, NOW, namespace=NS)


def test_min_isr_above_the_live_servers_with_replication_factor_minus_one_is_rejected() -> None:
    req = CreateStreamRequest("o", "o", replication_factor=-1, settings=StreamSettings(min_isr=3))
    meta = cluster("a", "b", "c", dead=("c",))
    with pytest.raises(InvalidStreamError, match=r"minIsr 3 is larger than the replication factor \(2 live servers\)"):
        plan_create_stream(meta, req, NOW, namespace=NS)


def test_min_isr_above_one_with_replication_factor_zero_is_rejected() -> None:
    req = CreateStreamRequest("o", "o", replication_factor=0, settings=StreamSettings(min_isr=2))
    with pytest.raises(InvalidStreamError, match=r"minIsr 2 .*\(1\)"):
        plan_create_stream(cluster("a", "b"), req, NOW, namespace=NS)


@pytest.mark.parametrize(("rf", "min_isr"), [(2, 2), (3, 1), (-1, 3)])
def test_min_isr_up_to_the_replication_factor_is_accepted(rf: int, min_isr: int) -> None:
    req = CreateStreamRequest("o", "o", replication_factor=rf, settings=StreamSettings(min_isr=min_isr))
    op = plan_create_stream(cluster("a", "b", "c"), req, NOW, namespace=NS)
    assert op.stream.settings.min_isr == min_isr
    assert len(op.stream.partitions[0].replicas) == (3 if rf == -1 else rf)


# --- validation ----------------------------------------------------------------------------------


def test_existing_stream_is_rejected() -> None:
    meta = cluster("a")
    create(meta, "orders")
    with pytest.raises(StreamExistsError, match="'orders' already exists"):
        plan_create_stream(meta, CreateStreamRequest("orders", "other"), NOW, namespace=NS)


@pytest.mark.parametrize("name", ["", "a b", "a/b", "..", ".x", "x" * 250])
def test_bad_names_are_rejected(name: str) -> None:
    with pytest.raises(InvalidStreamError, match="stream name"):
        plan_create_stream(cluster("a"), CreateStreamRequest(name, "orders"), NOW, namespace=NS)


@pytest.mark.parametrize("subject", ["", "a..b", "a b", "a.>.b", "foo.b>"])
def test_bad_subjects_are_rejected(subject: str) -> None:
    with pytest.raises(InvalidStreamError, match="subject"):
        plan_create_stream(cluster("a"), CreateStreamRequest("orders", subject), NOW, namespace=NS)


@pytest.mark.parametrize("subject", ["orders.>", "orders.*.>"])
def test_several_partitions_on_a_full_wildcard_subject_are_rejected(subject: str) -> None:
    with pytest.raises(InvalidStreamError, match="ends with '>'"):
        plan_create_stream(cluster("a"), CreateStreamRequest("orders", subject, partitions=2), NOW, namespace=NS)


@pytest.mark.parametrize(
    ("name", "subject", "rule"),
    [
        (".x", "x", "must not start or end with '.'"),
        ("a..b", "x", "contain '..'"),
        ("...", "x", "must not start or end with '.'"),
        ("s", ">", "matches every subject"),
        ("s", "a\x00b", "control characters"),
        ("s", f"{NS}.raft.>", f"could match '{NS}.>'"),
        ("s", "*.>", f"could match '{NS}.>'"),
        ("s", "_INBOX.>", "ack and reply inboxes"),
    ],
)
def test_names_and_subjects_that_would_break_internal_subjects_are_refused(name: str, subject: str, rule: str) -> None:
    meta = cluster("a")
    with pytest.raises(InvalidStreamError, match=rule):
        plan_create_stream(meta, CreateStreamRequest(name, subject), NOW, namespace=NS)
    assert meta.streams == {}


def test_the_controller_reserves_its_own_namespace() -> None:
    op = plan_create_stream(cluster("a"), CreateStreamRequest("s", "other.raft.>"), NOW, namespace=NS)
    assert op.stream.subject == "other.raft.>"
    with pytest.raises(InvalidStreamError, match=r"clustering\.namespace 'other'"):
        plan_create_stream(cluster("a"), CreateStreamRequest("s", "other.raft.>"), NOW, namespace="other")


def test_one_partition_on_a_full_wildcard_subject_is_accepted() -> None:
    op = plan_create_stream(cluster("a"), CreateStreamRequest("orders", "orders.>", partitions=1), NOW, namespace=NS)
    assert op.stream.partitions[0].subject == "orders.>"


def test_several_partitions_on_a_star_subject_are_accepted() -> None:
    op = plan_create_stream(cluster("a"), CreateStreamRequest("orders", "orders.*", partitions=2), NOW, namespace=NS)
    assert [p.subject for p in op.stream.partitions.values()] == ["orders.*", "orders.*.1"]


# --- balance and racks ---------------------------------------------------------------------------


def test_leaders_rotate_over_all_servers_across_streams() -> None:
    meta = cluster("a", "b", "c")
    leaders = [create(meta, f"s{i}").stream.partitions[0].leader for i in range(6)]
    assert sorted(leaders[:3]) == ["a", "b", "c"]
    assert sorted(leaders[3:]) == ["a", "b", "c"]


def test_leaders_rotate_across_replicated_streams() -> None:
    meta = cluster("a", "b", "c")
    leaders = [create(meta, f"s{i}", replication_factor=3).stream.partitions[0].leader for i in range(9)]
    assert Counter(leaders) == {"a": 3, "b": 3, "c": 3}
    assert sorted(leaders[:3]) == ["a", "b", "c"]


def test_new_stream_leaders_go_to_the_least_loaded_servers() -> None:
    meta = cluster("a", "b", "c")
    create(meta, "big", partitions=2)  # leaders a and b
    assert create(meta, "next").stream.partitions[0].leader == "c"


def test_rack_spread_is_honoured() -> None:
    racks = {"a1": "ra", "a2": "ra", "b1": "rb", "b2": "rb", "c1": "rc", "c2": "rc"}
    meta = cluster(*racks, racks=racks)
    for i in range(4):
        create(meta, f"s{i}", partitions=6, replication_factor=3)
    for s in meta.streams.values():
        for p in s.partitions.values():
            assert sorted(racks[r] for r in p.replicas) == ["ra", "rb", "rc"], (s.name, p.id, p.replicas)


def test_rack_spread_only_counts_live_servers() -> None:
    racks = {"a1": "ra", "a2": "ra", "b1": "rb", "b2": "rb"}
    meta = cluster(*racks, racks=racks, dead=("b1",))
    for i in range(3):
        op = create(meta, f"s{i}", partitions=3, replication_factor=2)
        for p in op.stream.partitions.values():
            assert "b1" not in p.replicas
            assert sorted(racks[r] for r in p.replicas) == ["ra", "rb"]


# --- LivenessTracker -----------------------------------------------------------------------------

TIMEOUT = 5 * SECOND


def tracker(at: int = NOW) -> LivenessTracker:
    t = LivenessTracker(TIMEOUT)
    t.reset(at)
    return t


def test_nobody_is_declared_dead_during_the_grace_period_after_reset() -> None:
    meta = cluster("a", "b", "c")
    t = tracker()
    assert t.changes(meta, NOW) == []
    assert t.changes(meta, NOW + TIMEOUT - 1) == []


def test_silent_servers_are_declared_dead_after_the_timeout() -> None:
    meta = cluster("a", "b", "c")
    t = tracker()
    t.heard("b", NOW + 2 * SECOND)
    ops = t.changes(meta, NOW + TIMEOUT)
    assert ops == [SetServerLiveness("a", False, NOW + TIMEOUT), SetServerLiveness("c", False, NOW + TIMEOUT)]


def test_a_server_dies_exactly_timeout_after_it_was_last_heard() -> None:
    meta = cluster("a")
    t = tracker()
    t.heard("a", NOW + SECOND)
    assert t.last_heard("a") == NOW + SECOND
    assert t.changes(meta, NOW + SECOND + TIMEOUT - 1) == []
    assert t.changes(meta, NOW + SECOND + TIMEOUT) == [SetServerLiveness("a", False, NOW + SECOND + TIMEOUT)]


def test_a_heartbeat_brings_a_dead_server_back() -> None:
    meta = cluster("a", "b")
    t = tracker()
    t.heard("b", NOW + 4 * SECOND)
    dead_at = NOW + TIMEOUT
    ops = t.changes(meta, dead_at)
    assert ops == [SetServerLiveness("a", False, dead_at)]
    for op in ops:
        meta.apply(op)
    assert not meta.servers["a"].alive
    t.heard("a", dead_at + SECOND)
    back_at = dead_at + 2 * SECOND
    ops = t.changes(meta, back_at)
    assert ops == [SetServerLiveness("a", True, back_at)]
    meta.apply(ops[0])
    assert meta.servers["a"].alive
    assert meta.servers["a"].liveness_changed == back_at


def test_no_operations_when_metadata_already_agrees() -> None:
    meta = cluster("a", "b")
    t = tracker()
    later = NOW + TIMEOUT + SECOND
    t.heard("a", later - SECOND)
    ops = t.changes(meta, later)
    assert ops == [SetServerLiveness("b", False, later)]
    meta.apply(ops[0])
    assert t.changes(meta, later) == []
    assert t.changes(meta, later + SECOND) == []  # a still heard within the timeout, b still silent


def test_changes_repeat_until_the_metadata_is_updated() -> None:
    # The tracker does not remember what it proposed: the metadata (once the op commits) is the truth.
    meta = cluster("a")
    t = tracker()
    at = NOW + TIMEOUT
    assert t.changes(meta, at) == [SetServerLiveness("a", False, at)]
    assert t.changes(meta, at) == [SetServerLiveness("a", False, at)]


def test_operations_come_in_server_id_order() -> None:
    meta = Metadata()
    # Registration order, hosts and ports all disagree with id order.
    for id_, host, port in [("c", "h1", 4), ("a", "h4", 3), ("d", "h2", 2), ("b", "h3", 1)]:
        meta.apply(RegisterServer(ServerMeta(id_, host, port), 10))
    t = tracker()
    at = NOW + TIMEOUT
    assert [op.id for op in t.changes(meta, at)] == ["a", "b", "c", "d"]


def test_heartbeats_from_unregistered_servers_produce_no_operations() -> None:
    meta = cluster("a")
    t = tracker()
    t.heard("a", NOW + TIMEOUT)
    t.heard("stranger", NOW + TIMEOUT)
    assert t.changes(meta, NOW + TIMEOUT + 1) == []


def test_reset_forgets_heartbeats_and_restarts_the_grace_period() -> None:
    meta = cluster("a")
    t = tracker()
    t.heard("a", NOW)
    new_term = NOW + 100 * SECOND
    t.reset(new_term)
    assert t.last_heard("a") is None
    assert t.changes(meta, new_term + TIMEOUT - 1) == []
    assert t.changes(meta, new_term + TIMEOUT) == [SetServerLiveness("a", False, new_term + TIMEOUT)]


def test_grace_period_does_not_revive_a_server_that_is_already_dead() -> None:
    meta = cluster("a", "b", dead=("b",))
    t = tracker()
    assert t.changes(meta, NOW + 1) == []


def test_a_dead_server_heard_after_reset_is_revived() -> None:
    meta = cluster("a", "b", dead=("b",))
    t = tracker()
    t.heard("b", NOW + 1)
    assert SetServerLiveness("b", True, NOW + 2) in t.changes(meta, NOW + 2)


def test_a_policy_change_is_one_operation_and_odd_names_are_refused() -> None:
    from liftlog.metadata.controller import plan_policy_change
    from liftlog.metadata.model import AddPolicy, Policy, RevokePolicy

    assert plan_policy_change("c1", "orders.*", "Publish", add=True) == AddPolicy(Policy("c1", "orders.*", "Publish"))
    assert plan_policy_change("c1", "*", "*", add=False) == RevokePolicy(Policy("c1", "*", "*"))
    for bad in (("", "*", "*"), ("a,b", "*", "*"), ("c1", " x", "*"), ("c1", "*", "")):
        with pytest.raises(InvalidStreamError, match="without commas or surrounding spaces"):
            plan_policy_change(*bad, add=True)
    with pytest.raises(InvalidStreamError, match="at most 1024"):
        plan_policy_change("c" * 1025, "*", "*", add=True)
