"""Leadership transfer (TimeoutNow) and linearizable reads (ReadIndex)."""

from __future__ import annotations

import pytest

from liftlog.raft import NotLeader, ProposalDropped, ReadState, Role
from liftlog.raft.read_index import PendingReads

from .network import Cluster

IDS = ["a", "b", "c"]


def test_transfer_to_an_up_to_date_follower() -> None:
    c = Cluster(IDS)
    a = c.elect("a")
    c.step("a", lambda n: n.transfer_leadership("c"))
    c.deliver()
    assert c.nodes["c"].role is Role.LEADER and c.nodes["c"].term == 3
    assert a.role is Role.FOLLOWER and a.leader_id == "c"


def test_transfer_catches_a_lagging_target_up_first() -> None:
    c = Cluster(IDS)
    c.elect("a")
    c.isolated.add("c")
    for k in range(5):
        c.propose("a", f"v{k}".encode())
    c.isolated.clear()
    c.step("a", lambda n: n.transfer_leadership("c"))
    with pytest.raises(ProposalDropped, match="transfer"):
        c.nodes["a"].propose(b"during transfer")
    c.deliver()
    new = c.nodes["c"]
    assert new.role is Role.LEADER
    c.tick_all(2)
    assert c.applied["c"] == [f"v{k}".encode() for k in range(5)]


def test_transfer_to_a_dead_node_is_abandoned_after_an_election_timeout() -> None:
    c = Cluster(IDS)
    a = c.elect("a")
    c.crash("c")
    c.step("a", lambda n: n.transfer_leadership("c"))
    c.tick_all(10)
    assert a.role is Role.LEADER
    c.propose("a", b"accepted again")


def test_proposals_on_a_follower_name_the_leader() -> None:
    c = Cluster(IDS)
    c.elect("a")
    with pytest.raises(NotLeader) as err:
        c.nodes["b"].propose(b"x")
    assert err.value.leader_hint == "a"


def test_read_index_on_the_leader_waits_for_a_heartbeat_round() -> None:
    c = Cluster(IDS)
    a = c.elect("a")
    c.propose("a", b"x")
    c.step("a", lambda n: n.read_index(b"r1"))
    assert c.read_states["a"] == []
    c.deliver()
    assert c.read_states["a"] == [ReadState(a.commit_index, b"r1")]


def test_read_index_from_a_follower_is_forwarded() -> None:
    c = Cluster(IDS)
    a = c.elect("a")
    c.propose("a", b"x")
    c.step("b", lambda n: n.read_index(b"r2"))
    c.deliver()
    assert c.read_states["b"] == [ReadState(a.commit_index, b"r2")]


def test_isolated_leader_never_answers_a_read() -> None:
    c = Cluster(IDS)
    c.elect("a")
    c.isolated.add("a")
    c.step("a", lambda n: n.read_index(b"r3"))
    c.tick("a", 30)
    c.deliver()
    assert c.read_states["a"] == []


def test_read_without_a_known_leader_fails_fast() -> None:
    c = Cluster(IDS)
    with pytest.raises(NotLeader):
        c.nodes["a"].read_index(b"r4")


def test_a_quorum_for_a_later_read_confirms_the_earlier_ones() -> None:
    reads = PendingReads()
    reads.add(5, b"r1", "a", leader="a")
    reads.add(7, b"r2", "b", leader="a")
    reads.add(9, b"r3", "a", leader="a")
    voters = ("a", "b", "c")
    assert reads.ack(b"r1", "a", voters) == []  # the leader's own ack alone is no quorum
    done = reads.ack(b"r2", "c", voters)
    assert [(r.index, r.context, r.requester) for r in done] == [(5, b"r1", "a"), (7, b"r2", "b")]
    assert reads.last_context() == b"r3"
    reads.clear()
    assert not reads
