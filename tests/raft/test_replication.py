"""Replication: conflict repair, the current-term commit rule, snapshots to laggards."""

from __future__ import annotations

from liftlog.raft import EntryKind, Message, MessageType, Role

from .network import Cluster, disk_with, role

IDS = ["a", "b", "c"]


def test_leader_repairs_divergent_follower_logs() -> None:
    disks = {
        "a": disk_with(IDS, 4, 2, 2, 4),
        "b": disk_with(IDS, 3, 2, 3, 3, 3, 3),
        "c": disk_with(IDS, 2, 2),
    }
    c = Cluster(IDS, disks=disks)
    a = c.elect("a")
    c.propose("a", b"new")
    c.tick_all(3)
    logs = {i: [(e.index, e.term) for e in c.disks[i].entries] for i in IDS}
    assert logs["a"] == logs["b"] == logs["c"]
    assert a.commit_index == len(logs["a"])
    assert [e.term for e in c.disks["b"].entries[3:]] == [2, 2, 4, 5, 5]


def test_reject_hint_skips_a_whole_conflicting_term() -> None:
    disks = {"a": disk_with(IDS, 5, *[5] * 10), "b": disk_with(IDS, 4, *[4] * 30), "c": disk_with(IDS, 5, *[5] * 10)}
    c = Cluster(IDS, disks=disks)
    c.elect("a")
    c.tick_all(3)
    rejects = [m for m in c.sent if m.type is MessageType.APPEND_RESP and m.reject]
    assert len([m for m in rejects if m.src == "b"]) <= 2
    assert [e.term for e in c.disks["b"].entries] == [e.term for e in c.disks["a"].entries]


def test_old_term_entry_is_not_committed_by_counting_figure_8() -> None:
    # a and b hold index 4 from term 2, never committed; a becomes leader of term 3.
    disks = {"a": disk_with(IDS, 2, 2), "b": disk_with(IDS, 2, 2), "c": disk_with(IDS, 2)}
    c = Cluster(IDS, disks=disks)
    c.drop = lambda m: m.type is MessageType.APPEND  # hold back the new leader's NOOP
    a = c.elect("a")
    assert a.term == 3 and a.commit_index == 3
    # b acknowledges index 4 (term 2): a majority holds it, but it is from an older term.
    a.step(Message(MessageType.APPEND_RESP, "b", "a", 3, index=4))
    assert a.commit_index == 3
    # Once the term-3 NOOP at index 5 reaches b, both commit together.
    a.step(Message(MessageType.APPEND_RESP, "b", "a", 3, index=5))
    assert a.commit_index == 5


def test_lagging_follower_gets_a_snapshot_then_entries() -> None:
    c = Cluster(IDS)
    a = c.elect("a")
    c.crash("c")
    for k in range(10):
        c.propose("a", f"v{k}".encode())
    c.tick_all(2)
    c.compact("a", a.applied_index, b"state@" + str(a.applied_index).encode())
    c.compact("b", c.nodes["b"].applied_index)
    assert a.log.first_index() > 4
    c.start("c")
    c.tick_all(4)
    c.propose("a", b"after")
    c.tick_all(2)
    sent = [m for m in c.sent if m.type is MessageType.SNAPSHOT]
    assert len(sent) >= 1 and sent[0].dst == "c"
    disk = c.disks["c"]
    assert disk.snapshot is not None and disk.snapshot.data == b"state@" + str(disk.snapshot.index).encode()
    assert c.nodes["c"].voters == a.voters
    assert c.nodes["c"].applied_index == a.applied_index
    assert c.applied["c"][-1] == b"after"


def test_follower_rejects_append_from_a_stale_leader() -> None:
    c = Cluster(IDS)
    c.elect("a")
    b = c.nodes["b"]
    b.step(Message(MessageType.APPEND, "x", "b", 1, index=3, log_term=1))
    rd = b.ready()
    assert [(m.type, m.term) for m in rd.messages] == [(MessageType.APPEND_RESP, 2)]
    b.advance(rd)


def test_new_leader_appends_a_noop() -> None:
    c = Cluster(IDS)
    a = c.elect("a")
    last = c.disks["a"].entries[-1]
    assert (last.kind, last.term, last.index) == (EntryKind.NOOP, a.term, 4)
    c.tick_all()
    assert all(n.commit_index == 4 for n in c.nodes.values())
    assert a.role is Role.LEADER


def test_a_partitioned_leaders_uncommitted_entries_are_replaced() -> None:
    c = Cluster(["a", "b", "c", "d", "e"])
    a = c.elect("a")
    c.cut = {frozenset(("a", x)) for x in "bcde"}
    c.step("a", lambda n: n.propose(b"lost"))
    c.deliver()
    c.tick_all(40)  # the others outlive a's lease and elect someone; a loses its quorum
    (new,) = [n for n in c.leaders() if n.id != "a"]
    assert role(a) is not Role.LEADER
    c.propose(new.id, b"kept")
    c.cut = set()
    c.tick_all(5)
    assert role(a) is Role.FOLLOWER and a.leader_id == new.id
    for i in "abcde":
        assert c.applied[i] == [b"kept"]
    assert b"lost" not in [e.data for e in c.disks["a"].entries]
