"""A synchronous in-memory cluster for raft scenario tests (like etcd's ``network``).

Each node has an in-memory "disk" that follows the Ready rule (persist, then send).
``deliver()`` passes messages until the network is quiet; links can be cut and messages
filtered. Applied NORMAL entries are recorded per node.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from liftlog.raft import (
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    HardState,
    MemoryStorage,
    Message,
    RaftConfig,
    RaftNode,
    ReadState,
    Role,
)


def bootstrap_entries(ids: Iterable[str]) -> list[Entry]:
    """The entries a fresh node writes for ``RaftConfig.peers`` (term 1, indexes 1..n)."""
    return [
        Entry(1, i + 1, EntryKind.CONF_CHANGE, ConfChange(ConfChangeOp.ADD, p).encode())
        for i, p in enumerate(sorted(ids))
    ]


def disk_with(ids: list[str], term: int, *extra_terms: int) -> MemoryStorage:
    """A disk holding the (committed) bootstrap entries, then one NORMAL entry per term in ``extra_terms``."""
    entries = bootstrap_entries(ids)
    for t in extra_terms:
        entries.append(Entry(t, len(entries) + 1, EntryKind.NORMAL, f"t{t}i{len(entries) + 1}".encode()))
    return MemoryStorage(HardState(term=term, vote=None, commit=len(ids)), None, entries)


class Cluster:
    def __init__(
        self,
        ids: Iterable[str],
        *,
        seed: int = 0,
        election_ticks: int = 10,
        heartbeat_ticks: int = 1,
        pre_vote: bool = True,
        check_quorum: bool = True,
        disks: dict[str, MemoryStorage] | None = None,
    ) -> None:
        self.ids = list(ids)
        self.rng = random.Random(seed)
        self.base = RaftConfig(
            election_ticks=election_ticks,
            heartbeat_ticks=heartbeat_ticks,
            pre_vote=pre_vote,
            check_quorum=check_quorum,
        )
        self.nodes: dict[str, RaftNode] = {}
        self.disks: dict[str, MemoryStorage] = dict(disks or {})
        self.applied: dict[str, list[bytes]] = {}
        self.read_states: dict[str, list[ReadState]] = {}
        self.cut: set[frozenset[str]] = set()
        self.isolated: set[str] = set()
        self.down: set[str] = set()
        self.queue: list[Message] = []
        self.sent: list[Message] = []  # every message any node emitted, for assertions
        self.drop: Callable[[Message], bool] = lambda m: False
        for i in self.ids:
            self.start(i, peers=tuple(self.ids))

    def config(self, peers: tuple[str, ...]) -> RaftConfig:
        b = self.base
        return RaftConfig(b.election_ticks, b.heartbeat_ticks, b.pre_vote, b.check_quorum, peers=peers)

    def start(self, node_id: str, peers: tuple[str, ...] = ()) -> RaftNode:
        disk = self.disks.setdefault(node_id, MemoryStorage())
        self.applied.setdefault(node_id, [])
        self.read_states.setdefault(node_id, [])
        node = RaftNode(node_id, self.config(peers), state=disk.state(), rng=random.Random(self.rng.random()))
        self.nodes[node_id] = node
        self.down.discard(node_id)
        self.process(node_id)
        return node

    def crash(self, node_id: str) -> None:
        self.down.add(node_id)
        del self.nodes[node_id]

    def process(self, node_id: str) -> None:
        node = self.nodes[node_id]
        disk = self.disks[node_id]
        while node.has_ready():
            rd = node.ready()
            disk.save(rd)
            self.queue.extend(rd.messages)
            self.sent.extend(rd.messages)
            for e in rd.committed:
                if e.kind is EntryKind.NORMAL:
                    self.applied[node_id].append(e.data)
            self.read_states[node_id].extend(rd.read_states)
            node.advance(rd)

    def compact(self, node_id: str, index: int, data: bytes = b"snap") -> None:
        self.disks[node_id].compact(self.nodes[node_id].compact(index, data))

    def blocked(self, m: Message) -> bool:
        return (
            m.dst in self.down
            or m.dst not in self.nodes
            or m.src in self.isolated
            or m.dst in self.isolated
            or frozenset((m.src, m.dst)) in self.cut
            or self.drop(m)
        )

    def deliver(self, limit: int = 100_000) -> None:
        """Deliver messages (FIFO) until none are left."""
        n = 0
        while self.queue:
            m = self.queue.pop(0)
            n += 1
            assert n < limit, "network never went quiet"
            if self.blocked(m):
                continue
            self.nodes[m.dst].step(m)
            self.process(m.dst)

    def step(self, node_id: str, fn: Callable[[RaftNode], object]) -> object:
        """Call ``fn(node)``, then process the node's Ready (not delivering)."""
        out = fn(self.nodes[node_id])
        self.process(node_id)
        return out

    def tick(self, node_id: str, n: int = 1) -> None:
        for _ in range(n):
            self.nodes[node_id].tick()
            self.process(node_id)

    def tick_all(self, n: int = 1) -> None:
        for _ in range(n):
            for i in list(self.nodes):
                self.tick(i)
            self.deliver()

    def elect(self, node_id: str) -> RaftNode:
        """Time out ``node_id`` until it campaigns, then deliver; it must win."""
        node = self.nodes[node_id]
        for _ in range(4 * self.base.election_ticks):
            if node.role is not Role.FOLLOWER:
                break
            self.tick(node_id)
        self.deliver()
        assert node.role is Role.LEADER, node
        return node

    def propose(self, node_id: str, data: bytes) -> int:
        index = self.step(node_id, lambda n: n.propose(data))
        assert isinstance(index, int)
        self.deliver()
        return index

    def leaders(self) -> list[RaftNode]:
        return [n for n in self.nodes.values() if n.role is Role.LEADER]


def role(node: RaftNode) -> Role:
    """``node.role``, opaque to mypy's narrowing (roles change between asserts)."""
    return node.role
