"""The Ready contract: what must be persisted travels with the messages that depend on it."""

from __future__ import annotations

import random

import pytest

from liftlog.raft import (
    EntryKind,
    HardState,
    Message,
    MessageType,
    PersistedState,
    RaftConfig,
    RaftNode,
    Role,
)
from liftlog.raft.progress import Progress, ProgressState

from .network import Cluster, role


def fresh(node_id: str = "a", peers: tuple[str, ...] = ("a", "b", "c")) -> RaftNode:
    return RaftNode(node_id, RaftConfig(peers=peers), state=PersistedState(), rng=random.Random(1))


def test_bootstrap_ready_holds_membership_entries_committed() -> None:
    node = fresh()
    assert node.has_ready()
    rd = node.ready()
    assert [(e.index, e.term, e.kind) for e in rd.entries] == [(i, 1, EntryKind.CONF_CHANGE) for i in (1, 2, 3)]
    assert rd.hard_state == HardState(term=1, vote=None, commit=3)
    assert rd.committed == rd.entries and rd.messages == []
    node.advance(rd)
    assert not node.has_ready()
    assert node.voters == ("a", "b", "c") and node.applied_index == 3


def test_a_vote_is_persisted_in_the_same_ready_as_its_grant() -> None:
    node = fresh("b")
    node.advance(node.ready())
    node.step(Message(MessageType.VOTE, "a", "b", 2, index=3, log_term=1))
    rd = node.ready()
    assert rd.hard_state == HardState(term=2, vote="a", commit=3)
    assert [(m.type, m.reject) for m in rd.messages] == [(MessageType.VOTE_RESP, False)]


def test_a_new_leaders_noop_travels_with_its_appends() -> None:
    c = Cluster(["a", "b", "c"])
    a = c.nodes["a"]
    while a.role is not Role.CANDIDATE:
        a.tick()
        if a.role is Role.PRE_CANDIDATE:
            for peer in ("b", "c"):
                a.step(Message(MessageType.PRE_VOTE_RESP, peer, "a", a.term + 1))
    a.ready()  # vote requests
    a.step(Message(MessageType.VOTE_RESP, "b", "a", a.term))
    assert role(a) is Role.LEADER
    rd = a.ready()
    assert [e.kind for e in rd.entries] == [EntryKind.NOOP]
    appends = [m for m in rd.messages if m.type is MessageType.APPEND]
    assert {m.dst for m in appends} == {"b", "c"}
    assert all(m.entries == tuple(rd.entries) for m in appends)


def test_compact_rejects_unapplied_indexes() -> None:
    node = fresh()
    node.advance(node.ready())
    with pytest.raises(ValueError, match="applied"):
        node.compact(4, b"")
    snap = node.compact(2, b"s")
    assert (snap.index, snap.term, snap.voters) == (2, 1, ("a", "b"))


def test_progress_probe_backs_off_with_the_hint_and_replicate_pipelines() -> None:
    pr = Progress(next_index=11)
    assert pr.maybe_decrease(10, 4) and pr.next == 5
    assert not pr.maybe_decrease(10, 2)  # stale rejection
    pr.sent_entries(7)
    assert pr.is_paused(max_inflight=4)
    assert pr.maybe_update(7)
    pr.become_replicate()
    for last in (8, 9, 10):
        pr.sent_entries(last)
    assert pr.state is ProgressState.REPLICATE and pr.next == 11 and pr.is_paused(3)
    assert pr.maybe_update(9) and list(pr.inflight) == [10]
    assert pr.maybe_decrease(10, 9)
    assert (pr.state, pr.next) == (ProgressState.PROBE, 10)
