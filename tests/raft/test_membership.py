"""Single-server membership changes, applied when their entry commits."""

from __future__ import annotations

import pytest

from liftlog.raft import ConfChange, ConfChangeOp, MessageType, ProposalDropped, Role

from .network import Cluster

ADD, REMOVE = ConfChangeOp.ADD, ConfChangeOp.REMOVE


def test_conf_change_round_trips_through_bytes() -> None:
    cc = ConfChange(ADD, "n7")
    assert ConfChange.decode(cc.encode()) == cc
    with pytest.raises(ValueError):
        ConfChange.decode(b"add")


def test_add_a_node_that_catches_up_from_the_log() -> None:
    c = Cluster(["a", "b", "c"])
    a = c.elect("a")
    c.propose("a", b"before")
    c.step("a", lambda n: n.propose_conf_change(ConfChange(ADD, "d")))
    assert "d" not in a.voters  # not until committed
    c.start("d")
    c.deliver()
    assert a.voters == ("a", "b", "c", "d")
    c.tick_all(5)
    d = c.nodes["d"]
    assert d.voters == a.voters and d.leader_id == "a"
    c.propose("a", b"after")
    c.tick_all(2)
    assert c.applied["d"] == [b"before", b"after"]


def test_only_one_change_at_a_time() -> None:
    c = Cluster(["a", "b", "c"])
    a = c.elect("a")
    a.propose_conf_change(ConfChange(ADD, "d"))
    with pytest.raises(ProposalDropped, match="pending"):
        a.propose_conf_change(ConfChange(REMOVE, "b"))
    with pytest.raises(ProposalDropped, match="already a voter"):
        c.process("a")
        c.deliver()
        a.propose_conf_change(ConfChange(ADD, "d"))


def test_new_leader_must_commit_in_its_term_before_a_change() -> None:
    c = Cluster(["a", "b", "c"])
    c.drop = lambda m: m.type is MessageType.APPEND
    a = c.elect("a")
    with pytest.raises(ProposalDropped, match="own term"):
        a.propose_conf_change(ConfChange(REMOVE, "c"))


def test_remove_a_follower() -> None:
    c = Cluster(["a", "b", "c"])
    a = c.elect("a")
    c.step("a", lambda n: n.propose_conf_change(ConfChange(REMOVE, "c")))
    c.deliver()
    assert a.voters == ("a", "b")
    c.crash("c")
    c.propose("a", b"two of two")
    assert a.commit_index == a.log.last_index()


def test_removed_leader_steps_down_and_stays_quiet() -> None:
    c = Cluster(["a", "b", "c"])
    a = c.elect("a")
    c.step("a", lambda n: n.propose_conf_change(ConfChange(REMOVE, "a")))
    c.deliver()
    assert a.role is Role.FOLLOWER and "a" not in a.voters
    assert c.nodes["b"].voters == ("b", "c")
    c.tick_all(60)
    leaders = c.leaders()
    assert len(leaders) == 1 and leaders[0].id != "a"
    assert a.role is Role.FOLLOWER
