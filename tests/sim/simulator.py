"""Deterministic cluster simulation of the raft core: one seed chooses everything.

The real ``RaftNode`` runs on a simulated clock (ticks; some nodes' clocks run slow), network (drops, delays,
duplicates, reordering, partitions) and disk (per-node, in memory; a crash keeps exactly
what the driver persisted under the Ready rule). A client proposes commands, requests
linearizable reads, changes membership and moves leadership while faults happen.

Phase 1: faults. Phase 2: heal everything; a leader must emerge and a fresh command
must be applied by every voter within a bounded number of ticks.

Checkers run after every Ready:
- election safety: at most one leader per term, over the whole history;
- log matching: an (index, term) pair names one entry with one predecessor term, everywhere;
- leader completeness: a new leader holds every entry already applied anywhere;
- state-machine safety: every node applies the same entry at each index, contiguously,
  and a snapshot's state hash matches the hash chain at its index;
- read index: a read's index covers everything applied anywhere before it was requested.

Replay: ``LIFTLOG_SIM_SEED=<seed> .venv/bin/pytest tests/sim -q``.
Soak: ``.venv/bin/python -m tests.sim.simulator --seeds 100000``.
"""

from __future__ import annotations

import heapq
import random
import zlib
from collections import Counter, deque
from dataclasses import dataclass

from liftlog.raft import (
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    MemoryStorage,
    Message,
    MessageType,
    NotLeader,
    ProposalDropped,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
    Snapshot,
)

from .seeds import soak

REPLAY = "LIFTLOG_SIM_SEED={seed} .venv/bin/pytest tests/sim -q"
PHASE1_TICKS = 220
PHASE2_TICKS = 250
TRACE_EVENTS = 200


class SimFailure(AssertionError):
    def __init__(self, seed: int, tick: int, what: str) -> None:
        super().__init__(f"seed {seed} failed at tick {tick}: {what}\nreplay: {REPLAY.format(seed=seed)}")
        self.seed = seed


@dataclass
class StateMachine:
    index: int = 0
    digest: int = 0


def _chain(digest: int, e: Entry) -> int:
    return zlib.crc32(bytes([e.kind.value]) + e.data, digest)


class Simulation:
    def __init__(self, seed: int, *, trace: bool = False) -> None:
        self.seed = seed
        self.trace: deque[str] | None = deque(maxlen=TRACE_EVENTS) if trace else None
        self.rng = rng = random.Random(seed)
        n = rng.choice((3, 3, 5))
        self.initial = tuple(f"n{i}" for i in range(1, n + 1))
        self.next_id = n + 1
        self.drop_rate = rng.choice((0.0, 0.02, 0.1, 0.2))
        self.dup_rate = rng.choice((0.0, 0.02, 0.1))
        self.max_delay = rng.choice((0, 1, 2, 4, 8))
        # Short timeouts against slow links make elections contend (split votes, stale leaders).
        self.election_ticks, self.heartbeat_ticks = rng.choice(((10, 2), (10, 1), (5, 1)))
        self.crash_rate = rng.choice((0.0, 0.005, 0.02, 0.05))
        self.partition_rate = rng.choice((0.0, 0.01, 0.03, 0.08))
        self.max_down = rng.choice((5, 20, 40))
        self.pre_vote = rng.random() < 0.8
        self.check_quorum = rng.random() < 0.8
        self.skew = rng.choice((0.0, 0.0, 0.3))
        self.max_batch = rng.choice((1, 2, 64))
        self.max_inflight = rng.choice((1, 4, 64))
        self.propose_rate = rng.choice((0.1, 0.3, 0.6))
        self.compact_every = rng.choice((3, 8, 20))
        self.conf_rate = rng.choice((0.0, 0.01, 0.03, 0.1))
        self.transfer_rate = rng.choice((0.0, 0.01))
        self.read_rate = rng.choice((0.0, 0.05))
        self.now = 0
        self.seq = 0
        self.nodes: dict[str, RaftNode] = {}
        self.disks: dict[str, MemoryStorage] = {}
        self.sms: dict[str, StateMachine] = {}
        self.all_ids: list[str] = []
        self.groups: dict[str, int] = {}
        self.heal_at = 0
        self.restart_at: dict[str, int] = {}
        self.queue: list[tuple[int, int, Message]] = []
        # checker state
        self.leader_of_term: dict[int, str] = {}
        self.entry_ids: dict[tuple[int, int], tuple[int, bytes, int]] = {}
        self.applied: dict[int, tuple[int, int, bytes]] = {}
        self.digests: dict[int, int] = {0: 0}
        self.max_applied = 0
        self.read_floor: dict[bytes, int] = {}
        self.was_leader: dict[str, int] = {}
        self.transfer: tuple[str, int] | None = None
        self.stats: Counter[str] = Counter()
        self.cmd = 0
        for i in self.initial:
            self.start(i, peers=self.initial)

    # --- driver ---------------------------------------------------------------------

    def fail(self, what: str) -> SimFailure:
        if self.trace is not None:
            what += f"\nlast {len(self.trace)} events:\n" + "\n".join(self.trace)
        return SimFailure(self.seed, self.now, what)

    def note(self, event: str) -> None:
        if self.trace is not None:
            self.trace.append(f"[{self.now}] {event}")

    def start(self, node_id: str, peers: tuple[str, ...] = ()) -> None:
        self.note(f"start {node_id}")
        if node_id not in self.disks:
            self.all_ids.append(node_id)
        disk = self.disks.setdefault(node_id, MemoryStorage())
        cfg = RaftConfig(
            election_ticks=self.election_ticks,
            heartbeat_ticks=self.heartbeat_ticks,
            pre_vote=self.pre_vote,
            check_quorum=self.check_quorum,
            max_entries_per_message=self.max_batch,
            max_inflight=self.max_inflight,
            peers=peers,
        )
        state = disk.state()
        node = RaftNode(node_id, cfg, state=state, rng=random.Random(self.rng.getrandbits(32)))
        self.nodes[node_id] = node
        sm = StateMachine()
        if disk.snapshot is not None:
            sm = self.load_snapshot(node_id, disk.snapshot)
        self.sms[node_id] = sm
        self.was_leader.pop(node_id, None)
        self.process(node_id)

    def load_snapshot(self, node_id: str, snap: Snapshot) -> StateMachine:
        index, _, digest = snap.data.partition(b":")
        sm = StateMachine(int(index), int(digest))
        if sm.index != snap.index or self.digests.get(sm.index) != sm.digest:
            raise self.fail(f"{node_id} loaded snapshot {snap.index} whose state disagrees with the applied history")
        return sm

    def crash(self, node_id: str) -> None:
        self.note(f"crash {node_id}")
        del self.nodes[node_id]
        self.stats["crashes"] += 1
        self.restart_at[node_id] = self.now + self.rng.randint(1, self.max_down)

    def process(self, node_id: str) -> None:
        node = self.nodes[node_id]
        while node.has_ready():
            rd = node.ready()
            self.persist(node_id, rd)
            self.check_node(node_id, node)
            for m in rd.messages:
                self.send(m)
            self.apply(node_id, rd)
            node.advance(rd)
            if node.applied_index - node.log.snapshot_index >= self.compact_every:
                self.disks[node_id].compact(node.compact(node.applied_index, self.snapshot_data(node_id)))
                self.stats["compactions"] += 1

    def snapshot_data(self, node_id: str) -> bytes:
        sm = self.sms[node_id]
        return f"{sm.index}:{sm.digest}".encode()

    def persist(self, node_id: str, rd: Ready) -> None:
        disk = self.disks[node_id]
        if rd.snapshot is not None:
            disk.install_snapshot(rd.snapshot)
            self.stats["snapshots_installed"] += 1
        if rd.entries:
            first = rd.entries[0].index
            prev_term = disk.term(first - 1)
            if prev_term is None:
                raise self.fail(f"{node_id} persisted entry {first} after a gap")
            for e in rd.entries:
                key = (e.index, e.term)
                ident = (e.kind.value, e.data, prev_term)
                seen = self.entry_ids.setdefault(key, ident)
                if seen != ident:
                    raise self.fail(f"log matching: {node_id} has a different entry at {key}: {ident} vs {seen}")
                prev_term = e.term
            disk.append(rd.entries)
        if rd.hard_state is not None:
            old = disk.hard_state
            if rd.hard_state.term < old.term:
                raise self.fail(f"{node_id} term went back from {old.term} to {rd.hard_state.term}")
            disk.hard_state = rd.hard_state

    def apply(self, node_id: str, rd: Ready) -> None:
        sm = self.sms[node_id]
        if rd.snapshot is not None:
            sm = self.sms[node_id] = self.load_snapshot(node_id, rd.snapshot)
        for e in rd.committed:
            if e.index != sm.index + 1:
                raise self.fail(f"{node_id} applied {e.index} after {sm.index}")
            ident = (e.term, e.kind.value, e.data)
            seen = self.applied.setdefault(e.index, ident)
            if seen != ident:
                raise self.fail(f"state machine safety: {node_id} applied {ident} at {e.index}, another {seen}")
            sm.index = e.index
            sm.digest = _chain(sm.digest, e)
            known = self.digests.setdefault(e.index, sm.digest)
            if known != sm.digest:
                raise self.fail(f"{node_id} state diverged at {e.index}")
            self.max_applied = max(self.max_applied, e.index)
            if e.kind is EntryKind.CONF_CHANGE and seen is ident and e.term > 1:
                change = ConfChange.decode(e.data)
                self.stats[f"conf_{change.op.value}s_applied"] += 1
                if change.op is ConfChangeOp.REMOVE and self.leader_of_term.get(e.term) == change.node:
                    self.stats["leader_stepped_down_removed"] += 1
        for rs in rd.read_states:
            floor = self.read_floor.pop(rs.context, None)
            if floor is not None and rs.index < floor:
                raise self.fail(f"stale read at {node_id}: read index {rs.index} < applied {floor} before the read")
            self.stats["reads_served"] += 1

    def check_node(self, node_id: str, node: RaftNode) -> None:
        self.note(repr(node))
        if node.role is not Role.LEADER:
            return
        other = self.leader_of_term.setdefault(node.term, node_id)
        if other != node_id:
            raise self.fail(f"election safety: {other} and {node_id} both lead term {node.term}")
        if self.was_leader.get(node_id) == node.term:
            return
        self.was_leader[node_id] = node.term
        self.stats["elections"] += 1
        if self.transfer == (node_id, node.term - 1):
            self.stats["transfers_completed"] += 1
        # Leader completeness: every entry applied anywhere is in the new leader's log.
        disk = self.disks[node_id]
        base = disk.base
        if base and self.digests.get(base) != self.load_snapshot(node_id, disk.snapshot).digest:  # type: ignore[arg-type]
            raise self.fail(f"leader {node_id}'s snapshot disagrees with history")
        for index in range(base + 1, self.max_applied + 1):
            want = self.applied.get(index)
            if want is not None and disk.term(index) != want[0]:
                raise self.fail(f"leader completeness: leader {node_id} (term {node.term}) lacks committed {index}")

    def send(self, m: Message) -> None:
        rng = self.rng
        if self.drop_rate and rng.random() < self.drop_rate:
            return
        copies = 2 if self.dup_rate and rng.random() < self.dup_rate else 1
        for _ in range(copies):
            self.seq += 1
            delay = rng.randint(0, self.max_delay) if self.max_delay else 0
            heapq.heappush(self.queue, (self.now + delay, self.seq, m))
        if m.type is MessageType.SNAPSHOT:
            self.stats["snapshots_sent"] += 1

    def deliver_due(self) -> None:
        budget = 20_000
        while self.queue and self.queue[0][0] <= self.now:
            _, _, m = heapq.heappop(self.queue)
            budget -= 1
            if budget == 0:
                raise self.fail("network never went quiet within a tick")
            node = self.nodes.get(m.dst)
            if node is None or self.groups.get(m.src, 0) != self.groups.get(m.dst, 0):
                continue
            if self.trace is not None:
                self.note(
                    f"{m.src}->{m.dst} {m.type.value} t{m.term} i{m.index} lt{m.log_term} "
                    f"n{len(m.entries)} c{m.commit} rej{int(m.reject)} h{m.reject_hint}"
                )
            node.step(m)
            self.process(m.dst)

    # --- client and faults -------------------------------------------------------------------

    def leader(self) -> RaftNode | None:
        best: RaftNode | None = None
        for node in self.nodes.values():
            if node.role is Role.LEADER and (best is None or node.term > best.term):
                best = node
        return best

    def client(self) -> None:
        rng = self.rng
        ids = sorted(self.nodes)
        if not ids:
            return
        if rng.random() < self.propose_rate:
            target = self.nodes[rng.choice(ids)]
            self.cmd += 1
            try:
                target.propose(f"c{self.cmd}".encode())
                self.process(target.id)
            except (NotLeader, ProposalDropped):
                pass
        if self.read_rate and rng.random() < self.read_rate:
            target = self.nodes[rng.choice(ids)]
            self.cmd += 1
            ctx = f"r{self.cmd}".encode()
            try:
                target.read_index(ctx)
                self.read_floor[ctx] = self.max_applied
                self.process(target.id)
            except NotLeader:
                pass
        leader = self.leader()
        if leader is None:
            return
        if self.transfer_rate and rng.random() < self.transfer_rate:
            others = [v for v in leader.voters if v != leader.id]
            if others:
                to = rng.choice(others)
                leader.transfer_leadership(to)
                self.transfer = (to, leader.term)
                self.stats["transfers_started"] += 1
                self.process(leader.id)
        if self.conf_rate and rng.random() < self.conf_rate:
            voters = leader.voters
            try:
                if len(voters) < 5 and (len(voters) <= 3 or rng.random() < 0.5):
                    new = f"n{self.next_id}"
                    leader.propose_conf_change(ConfChange(ConfChangeOp.ADD, new))
                    self.next_id += 1
                    self.start(new)
                elif len(voters) > 3:
                    leader.propose_conf_change(ConfChange(ConfChangeOp.REMOVE, rng.choice(sorted(voters))))
                self.stats["conf_changes_proposed"] += 1
                self.process(leader.id)
            except (NotLeader, ProposalDropped):
                pass

    def faults(self) -> None:
        rng = self.rng
        for node_id, at in list(self.restart_at.items()):
            if at <= self.now:
                del self.restart_at[node_id]
                self.start(node_id)
                self.stats["restarts"] += 1
        leader = self.leader()
        if self.crash_rate and self.nodes and rng.random() < self.crash_rate:
            # Leaders are the interesting victims (Figure 8 needs leaders dying mid-replication).
            victim = leader.id if leader is not None and rng.random() < 0.5 else rng.choice(sorted(self.nodes))
            self.crash(victim)
        if self.groups and self.now >= self.heal_at:
            self.groups = {}
        elif not self.groups and self.partition_rate and rng.random() < self.partition_rate:
            if leader is not None and rng.random() < 0.5:
                self.groups = {leader.id: 1}  # cut the leader off alone
            else:
                self.groups = {i: rng.randint(0, 1) for i in self.all_ids}
            self.heal_at = self.now + rng.randint(5, 60)
            self.stats["partitions"] += 1

    def step_time(self) -> None:
        for node_id in sorted(self.nodes):
            if self.skew and self.rng.random() < self.skew:
                continue  # this node's clock runs slow: leases and timeouts disagree across nodes
            self.nodes[node_id].tick()
            self.process(node_id)
        self.deliver_due()
        self.now += 1

    # --- run ------------------------------------------------------------------------------------

    def run(self) -> Counter[str]:
        for _ in range(PHASE1_TICKS):
            self.faults()
            self.client()
            self.step_time()
        self.heal()
        self.require_liveness()
        return self.stats

    def heal(self) -> None:
        self.groups = {}
        self.drop_rate = self.dup_rate = 0.0
        self.max_delay = min(self.max_delay, 1)  # timing assumption: a round trip << election timeout
        self.skew = 0.0
        for node_id in sorted(self.restart_at):
            self.start(node_id)
        self.restart_at = {}

    def require_liveness(self) -> None:
        marker: tuple[str, int, int] | None = None  # (leader, term, index) of the fresh command
        for _ in range(PHASE2_TICKS):
            self.step_time()
            leader = self.leader()
            if leader is None:
                continue
            if marker is not None and marker[:2] != (leader.id, leader.term):
                marker = None  # a new leader may have dropped it: propose again
            if marker is None:
                try:
                    self.cmd += 1
                    marker = (leader.id, leader.term, leader.propose(f"final{self.cmd}".encode()))
                    self.process(leader.id)
                except ProposalDropped:
                    continue
            index = marker[2]
            if all(v in self.nodes and self.nodes[v].applied_index >= index for v in leader.voters):
                if not self.applied[index][2].startswith(b"final"):
                    raise self.fail(f"leader {leader.id} lost its own term-{leader.term} entry {index}")
                self.stats["liveness_ticks"] += self.now - PHASE1_TICKS
                return
        states = "\n".join(repr(n) for n in self.nodes.values())
        raise self.fail(f"liveness: no new command applied by every voter within {PHASE2_TICKS} ticks\n{states}")


def run_seed(seed: int, *, trace: bool = False) -> Counter[str]:
    """Run one seed; with ``trace`` a failure message ends with the last events (slower)."""
    return Simulation(seed, trace=trace).run()


def main(argv: list[str] | None = None) -> int:
    return soak(argv, "raft simulation", run_seed, SimFailure, REPLAY)


if __name__ == "__main__":
    raise SystemExit(main())
