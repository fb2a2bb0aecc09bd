from liftlog.raft import Role

from .network import Cluster


def test_three_nodes_elect_and_replicate() -> None:
    c = Cluster(["a", "b", "c"])
    a = c.elect("a")
    assert a.term == 2
    assert all(n.leader_id == "a" for n in c.nodes.values())
    c.propose("a", b"x")
    c.tick_all(2)
    assert all(c.applied[i] == [b"x"] for i in c.ids)
    assert [n.role for n in c.nodes.values()].count(Role.LEADER) == 1
