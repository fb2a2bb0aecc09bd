"""Elections: randomized timeouts, votes and logs, PreVote and CheckQuorum."""

from __future__ import annotations

import random

from liftlog.raft import Message, MessageType, PersistedState, RaftConfig, RaftNode, Role

from .network import Cluster, disk_with, role


def test_election_timeout_is_drawn_from_election_ticks_to_twice_that() -> None:
    seen = set()
    for seed in range(40):
        node = RaftNode(
            "a", RaftConfig(election_ticks=10, peers=("a", "b", "c")), state=PersistedState(), rng=random.Random(seed)
        )
        ticks = 0
        while node.role is Role.FOLLOWER:
            node.tick()
            ticks += 1
        assert node.role is Role.PRE_CANDIDATE
        assert 10 <= ticks < 20
        seen.add(ticks)
    assert len(seen) > 3


def test_single_node_elects_itself_and_commits_alone() -> None:
    c = Cluster(["a"])
    a = c.elect("a")
    index = c.propose("a", b"x")
    assert a.commit_index == index and c.applied["a"] == [b"x"]


def test_campaign_makes_a_lone_voter_leader_at_once_and_is_ignored_by_non_voters() -> None:
    lone = RaftNode("a", RaftConfig(peers=("a",)), state=PersistedState(), rng=random.Random(1))
    lone.campaign()
    assert lone.role is Role.LEADER and lone.term == 2
    joining = RaftNode("b", RaftConfig(), state=PersistedState(), rng=random.Random(1))
    joining.campaign()
    assert joining.role is Role.FOLLOWER and joining.term == 0


def test_a_leader_is_elected_and_known_to_all() -> None:
    c = Cluster(["a", "b", "c", "d", "e"])
    c.elect("c")
    assert {n.leader_id for n in c.nodes.values()} == {"c"}
    assert {n.term for n in c.nodes.values()} == {2}
    assert c.disks["a"].hard_state.vote == "c"


def test_a_candidate_with_a_stale_log_loses() -> None:
    ids = ["a", "b", "c"]
    disks = {"a": disk_with(ids, 2), "b": disk_with(ids, 2, 2), "c": disk_with(ids, 2, 2)}
    c = Cluster(ids, disks=disks, pre_vote=False)
    a = c.nodes["a"]
    c.tick("a", 20)
    c.deliver()
    assert a.role is not Role.LEADER
    assert not c.leaders()
    c.elect("b")


def test_prevote_keeps_an_isolated_node_from_bumping_the_term() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("a")
    c.isolated.add("c")
    for _ in range(100):
        c.tick_all()
    assert c.nodes["c"].term == 2  # pre-votes went nowhere; the term never moved
    c.isolated.clear()
    c.tick_all(30)
    a = c.nodes["a"]
    assert a.role is Role.LEADER and a.term == 2
    assert c.nodes["c"].leader_id == "a"


def test_check_quorum_leader_steps_down_when_cut_off() -> None:
    c = Cluster(["a", "b", "c"])
    a = c.elect("a")
    c.isolated.add("a")
    c.tick("a", 10)  # b and c answered within this first window
    assert role(a) is Role.LEADER
    c.tick("a", 10)  # nobody answered within this one
    assert role(a) is Role.FOLLOWER
    c.isolated.clear()
    c.tick_all(60)
    assert len(c.leaders()) == 1


def test_followers_in_lease_ignore_votes_from_a_disruptive_candidate() -> None:
    c = Cluster(["a", "b", "c"], pre_vote=False)
    c.elect("a")
    c.isolated.add("c")
    c.tick("c", 25)  # c campaigns at a higher term, alone
    assert c.nodes["c"].term > 2
    vote = Message(MessageType.VOTE, "c", "b", c.nodes["c"].term, index=100, log_term=100)
    c.nodes["b"].step(vote)
    assert c.nodes["b"].term == 2 and c.nodes["b"].leader_id == "a"


def test_leader_steps_down_on_a_higher_term() -> None:
    c = Cluster(["a", "b", "c"])
    a = c.elect("a")
    a.step(Message(MessageType.APPEND_RESP, "b", "a", 7))
    assert a.role is Role.FOLLOWER and a.term == 7


def test_restart_recovers_term_vote_commit_and_voters() -> None:
    c = Cluster(["a", "b", "c"])
    c.elect("b")
    c.propose("b", b"x")
    c.tick_all(2)
    before = c.nodes["a"]
    c.crash("a")
    after = c.start("a")
    assert (after.term, after.commit_index, after.voters) == (before.term, before.commit_index, before.voters)
    assert c.applied["a"] == [b"x", b"x"]  # the application re-applies from its last snapshot
