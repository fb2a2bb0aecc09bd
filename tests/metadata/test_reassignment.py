"""Reassignment and decommissioning: the metadata operations, the planners and the controller's next steps."""

from __future__ import annotations

from collections import Counter

import pytest

from liftlog.metadata import (
    ChangeIsr,
    ChangeLeader,
    CompleteReassignment,
    CreateStream,
    Metadata,
    MetadataError,
    PartitionMeta,
    ReassignPartition,
    RegisterServer,
    RemoveServer,
    ServerMeta,
    SetServerLeaving,
    SetServerLiveness,
    StaleEpochError,
    StreamMeta,
    StreamSettings,
)
from liftlog.metadata.codec import decode_operation, decode_snapshot, encode_operation, encode_snapshot
from liftlog.metadata.reassignment import (
    departures,
    plan_decommission,
    plan_move,
    plan_moves,
    plan_spread,
    preferred_leader_changes,
    reassignment_steps,
)


def cluster(servers: str = "abc", **streams: list[list[str]]) -> Metadata:
    """Servers with one-letter ids; each stream's partitions get the given replicas (first leads, all in sync)."""
    md = Metadata()
    for sid in servers:
        md.apply(RegisterServer(ServerMeta(sid, "127.0.0.1", 1), 1))
    for name, partitions in streams.items():
        stream = StreamMeta(name, name, "", 1, StreamSettings())
        for i, replicas in enumerate(partitions):
            stream.partitions[i] = PartitionMeta(name, i, name, replicas[0], list(replicas), list(replicas))
        md.apply(CreateStream(stream))
    return md


def test_a_reassignment_adds_the_new_replicas_then_completes_with_the_target_only() -> None:
    md = cluster(s=[["a", "b"]])
    p = md.partition("s", 0)
    md.apply(ReassignPartition("s", 0, ("c", "b"), p.epoch))
    assert (p.replicas, p.target, p.isr) == (["a", "b", "c"], ["c", "b"], ["a", "b"])
    with pytest.raises(MetadataError, match="c not in sync yet"):
        md.apply(CompleteReassignment("s", 0, p.epoch))
    md.apply(ChangeIsr("s", 0, ("a", "b", "c"), p.epoch))
    with pytest.raises(MetadataError, match="its leader a is not among the new replicas"):
        md.apply(CompleteReassignment("s", 0, p.epoch))
    md.apply(ChangeLeader("s", 0, "c", ("a", "b", "c"), p.epoch))
    md.apply(CompleteReassignment("s", 0, p.epoch))
    assert (p.replicas, p.isr, p.target, p.leader) == (["c", "b"], ["c", "b"], [], "c")


def test_reassignment_operations_refuse_what_they_cannot_do() -> None:
    md = cluster(s=[["a", "b"]])
    p = md.partition("s", 0)
    with pytest.raises(StaleEpochError):
        md.apply(ReassignPartition("s", 0, ("c",), p.epoch + 1))
    with pytest.raises(MetadataError, match="name a server twice"):
        md.apply(ReassignPartition("s", 0, ("c", "c"), p.epoch))
    with pytest.raises(MetadataError, match="no such server: x"):
        md.apply(ReassignPartition("s", 0, ("x",), p.epoch))
    md.apply(ReassignPartition("s", 0, ("c",), p.epoch))
    with pytest.raises(MetadataError, match="already moving to c"):
        md.apply(ReassignPartition("s", 0, ("b",), p.epoch))
    with pytest.raises(MetadataError, match=r"still holds replicas of s/0"):
        md.apply(RemoveServer("c"))
    with pytest.raises(MetadataError, match="no reassignment under way"):
        cluster(t=[["a"]]).apply(CompleteReassignment("t", 0, 0))


def test_new_operations_and_fields_survive_the_codec_and_snapshots() -> None:
    for op in (
        ReassignPartition("s", 1, ("c", "a"), 7),
        CompleteReassignment("s", 1, 8),
        SetServerLeaving("a", True),
        RemoveServer("a"),
    ):
        assert decode_operation(encode_operation(op)) == op
    md = cluster(s=[["a", "b"]])
    md.apply(ReassignPartition("s", 0, ("c",), 0))
    md.apply(SetServerLeaving("a", True))
    back = decode_snapshot(encode_snapshot(md))
    assert back.partition("s", 0).target == ["c"] and back.servers["a"].leaving
    assert "target" not in encode_snapshot(cluster(s=[["a"]])).hex(), "unchanged bytes without a reassignment"


def test_a_registration_keeps_a_leaving_mark_and_a_departed_server_is_gone() -> None:
    md = cluster("ab")
    md.apply(SetServerLeaving("a", True))
    md.apply(RegisterServer(ServerMeta("a", "10.0.0.1", 2), 5))
    assert md.servers["a"].leaving
    md.apply(RemoveServer("a"))
    assert "a" not in md.servers


def test_plan_move_checks_the_target() -> None:
    md = cluster("abcd", s=[["a", "b"]])
    assert plan_move(md, "s", 0, ["c", "d"]) == ReassignPartition("s", 0, ("c", "d"), 0)
    md.apply(SetServerLiveness("d", False, 5))
    with pytest.raises(MetadataError, match="cannot move to d: not alive"):
        plan_move(md, "s", 0, ["c", "d"])
    with pytest.raises(MetadataError, match="nothing to move"):
        plan_move(md, "s", 0, ["a", "b"])
    with pytest.raises(MetadataError, match="name at least one replica"):
        plan_move(md, "s", 0, [])
    md.apply(ReassignPartition("s", 0, ("c",), 0))
    with pytest.raises(MetadataError, match="already moving to c"):
        plan_move(md, "s", 0, ["b"])


def test_spread_moves_the_fewest_replicas_onto_a_new_server() -> None:
    # Six single-replica partitions on a and b; c just joined: two of them move to c, nothing else moves.
    md = cluster("abc", s=[["a"], ["b"], ["a"], ["b"], ["a"], ["b"]])
    moves = plan_spread(md)
    assert len(moves) == 2 and all(m.target == ("c",) for m in moves)
    for m in moves:
        md.apply(m)
    counts = Counter(r for s in md.streams.values() for p in s.partitions.values() for r in (p.target or p.replicas))
    assert counts == {"a": 2, "b": 2, "c": 2}
    assert plan_spread(md) == [], "partitions already moving are counted where they go"


def test_spread_with_three_replicas_keeps_every_partition_on_distinct_servers() -> None:
    md = cluster("abcde", s=[["a", "b", "c"]] * 5)
    moves = plan_spread(md)
    for m in moves:
        assert len(set(m.target)) == 3
        md.apply(m)
    counts = Counter(r for p in md.streams["s"].partitions.values() for r in p.target or p.replicas)
    assert max(counts.values()) - min(counts.values()) <= 1 and set(counts) == set("abcde")


def test_decommission_moves_each_replica_to_the_least_loaded_server() -> None:
    md = cluster("abcd", s=[["a", "b"], ["b", "c"], ["a", "c"]])
    ops = plan_decommission(md, "a", voters="abcd")
    assert ops[0] == SetServerLeaving("a", True)
    targets = {(op.name, op.partition): op.target for op in ops[1:] if isinstance(op, ReassignPartition)}
    assert targets == {("s", 0): ("d", "b"), ("s", 2): ("d", "c")}


def test_decommission_refuses_what_would_lose_data_or_the_cluster() -> None:
    md = cluster("abc", s=[["a", "b", "c"]])
    with pytest.raises(MetadataError, match="no other live server can take the one on a"):
        plan_decommission(md, "a", voters="abc")
    md = cluster("abcd", s=[["a"]])
    md.apply(SetServerLiveness("a", False, 5))
    with pytest.raises(MetadataError, match="only in-sync replica of s/0 and is not alive"):
        plan_decommission(md, "a", voters="abcd")
    md = cluster("abc")
    md.apply(SetServerLiveness("b", False, 5))
    with pytest.raises(MetadataError, match="1 live metadata voters of 2, fewer than the 2 a quorum needs"):
        plan_decommission(md, "a", voters="abc")
    with pytest.raises(MetadataError, match="no such server"):
        plan_decommission(md, "x", voters="abc")
    with pytest.raises(MetadataError, match="last server"):
        plan_decommission(cluster("a"), "a", voters="a")


def test_the_leader_moves_last_then_the_reassignment_completes_then_the_server_departs() -> None:
    md = cluster("abc", s=[["a", "b"]])
    for op in plan_decommission(md, "a", voters="abc"):
        md.apply(op)
    p = md.partition("s", 0)
    assert p.target == ["c", "b"] and reassignment_steps(md) == [], "c is still catching up"
    md.apply(ChangeIsr("s", 0, ("a", "b", "c"), p.epoch))
    assert reassignment_steps(md) == [ChangeLeader("s", 0, "c", ("a", "b", "c"), p.epoch)]
    md.apply(reassignment_steps(md)[0])
    assert reassignment_steps(md) == [CompleteReassignment("s", 0, p.epoch)]
    assert departures(md) == []
    md.apply(reassignment_steps(md)[0])
    assert (p.replicas, p.leader) == (["c", "b"], "c")
    assert departures(md) == ["a"]


def test_preferred_leaders_on_demand() -> None:
    md = cluster("abc", s=[["a", "b"], ["b", "c"]])
    p = md.partition("s", 0)
    md.apply(ChangeLeader("s", 0, "b", ("a", "b"), p.epoch))
    assert preferred_leader_changes(md) == [ChangeLeader("s", 0, "a", ("a", "b"), p.epoch)]
    md.apply(SetServerLiveness("a", False, 5))
    assert preferred_leader_changes(md) == [], "a is not alive"


def test_a_request_names_each_partition_once_and_spread_leaves_the_named_ones_alone() -> None:
    md = cluster("abc", s=[["a"], ["a"], ["a"]])
    with pytest.raises(MetadataError, match="s/0 is named twice"):
        plan_moves(md, [("s", 0, ["b"]), ("s", 0, ["c"])], spread=False)
    ops = plan_moves(md, [("s", 0, ["b"])], spread=True)
    assert ops[0] == ReassignPartition("s", 0, ("b",), 0)
    assert all(isinstance(op, ReassignPartition) and op.partition != 0 for op in ops[1:])
    assert len(ops) == 2, "with s/0 going to b, one more move evens out a, b and c"


def test_rebalance_leaves_a_moving_partition_alone() -> None:
    from liftlog.metadata.failover import FailoverCore

    md = cluster("abc", s=[["a", "b"]])
    p = md.partition("s", 0)
    md.apply(ChangeLeader("s", 0, "b", ("a", "b"), p.epoch))
    md.apply(ReassignPartition("s", 0, ("c", "b"), p.epoch))
    core = FailoverCore(lambda: md, rebalance_after_ns=1)
    assert core.tick(0) == [] and core.tick(10) == [], "a is preferred but leaving: no hand-back mid-move"
