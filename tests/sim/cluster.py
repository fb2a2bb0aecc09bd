"""Deterministic simulation of a whole liftlog cluster: one seed chooses everything (TigerBeetle's VOPR).

Each simulated server runs the real cores a liftlog server runs, driven the way the
asyncio shells drive them:

- ``RaftNode`` for the metadata group over an in-memory Raft disk, applying
  ``Metadata`` operations (the real codec) from committed entries;
- on the Raft leader, the controller's cores: ``LivenessTracker``,
  ``plan_create_stream``, ``FailoverCore`` (elections from liveness and from
  followers' reports, candidate confirmation, unclean election, preferred-leader
  rebalance), ``ChangePlanner`` for the changes it proposes, and the reassignment
  planner and steps (partitions moved to random servers while everything else
  goes on);
- for every partition replica, a real ``CommitLog`` on disk and the
  ``LeaderReplica`` / ``FollowerReplica`` core of its role, talking the real
  replication wire format (fetch, epoch offset, notifications); ``decide_role``
  picks the role from the metadata (the stream manager's reconcile) and
  ``isr_change`` whether a leader's ISR proposal may go to the controller;
  ``admit`` whether a publish is taken (at the server the client reached, against
  its metadata, then at the leader's intake), and ``fetch_refusal`` /
  ``epoch_question_refusal`` whether a leader serves a follower;
- on every follower server, one ``FetchScheduler`` per leader (the replicator's
  fetch loops): multi-partition fetches, superseded requests, sleep and
  notification, with the simulation sending, timing out and writing the log.

The shells' own timing is modelled where a decision depends on it: the reconcile
loop acts on applied metadata a few ticks late (the metadata is changed in place,
so meanwhile the old cores run against the new PartitionMeta; some seeds
have a slow loop of up to 25 ticks), and the ISR
proposals the replicator spawns as tasks are sent a few ticks after they were
decided.

The network drops, delays, duplicates and reorders messages, partitions the servers
and cuts single directions; servers crash (memory lost, Raft disk and log files
kept, as a process crash leaves them) and restart; some clocks run slow. A client
creates streams, publishes with each ack policy and reads committed data;
an administrator deletes streams (they are created again), pauses and
resumes partitions and moves them.

Checked after every step:
- an acknowledged (ack ALL) message is never lost: whatever any replica holds
  below its high watermark agrees with one committed history per partition, and
  at the end the leader holds every acknowledged message at its offset;
- a consumer never sees an offset served and later replaced (reads go through
  the same committed-history check);
- every live member of a committed ISR (after each ChangeIsr and ChangeLeader)
  holds the whole committed history: any of them may be elected next;
- at most one leader per partition and leader epoch;
- an ack ALL is given only for a message written while min.insync.replicas
  replicas were in sync (some seeds set it to 2);
- on the wire: a leader answers fetches and epoch questions only in the leader
  epoch it leads and for the incarnation it holds, and an ISR proposal goes out
  only while the metadata names its core's leader in its leader epoch;
- the metadata is identical on all servers at the same applied index.

Streams with unclean leader election may lose acknowledged messages by design:
for them only the leader-per-epoch and metadata checks apply.

Not simulated (yet): readonly streams, Raft membership changes and snapshots,
power loss (fsync), a leader holding a caught-up fetch (the simulation's leaders
answer at once), the response byte budget across partitions.

Replay: ``LIFTLOG_CLUSTER_SIM_SEED=<seed> .venv/bin/pytest tests/sim/test_cluster_sim.py -q``.
Soak: ``.venv/bin/python -m tests.sim.cluster --seeds 10000`` (``make sim SEEDS=…`` runs both simulations).
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import random
import shutil
import tempfile
import zlib
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path

from liftlog.metadata import (
    ChangeIsr,
    ChangeLeader,
    DeleteStream,
    Metadata,
    MetadataError,
    Operation,
    PartitionState,
    RegisterServer,
    ServerMeta,
    SetPaused,
    StreamSettings,
)
from liftlog.metadata.codec import decode_operation, encode_operation, encode_snapshot
from liftlog.metadata.controller import CreateStreamRequest, LivenessTracker
from liftlog.metadata.failover import AskLogEnds, FailoverAction, FailoverCore, Propose
from liftlog.metadata.planning import ChangePlanner
from liftlog.metadata.protocol import (
    CreateStreamChange,
    IsrChange,
    LeaderConfirmation,
    LeaderReport,
    PartitionMove,
    ReassignChange,
)
from liftlog.metadata.reassignment import reassignment_steps
from liftlog.raft import EntryKind, MemoryStorage, Message, NotLeader, ProposalDropped, RaftConfig, RaftNode, Role
from liftlog.replication.admission import AckPolicy, AdmissionRules, admit
from liftlog.replication.fetching import EpochQuestion, FetchOut, FetchScheduler, Member
from liftlog.replication.follower import (
    Append,
    FollowerAction,
    FollowerReplica,
    ReportLeader,
    SetHighWatermark,
    Truncate,
)
from liftlog.replication.leader import HighWatermark, LeaderAction, LeaderReplica, NotifyFollowers, ProposeIsr
from liftlog.replication.protocol import (
    EpochOffsetResponse,
    FetchError,
    FetchErrorCode,
    PartitionFetch,
    PartitionRefusal,
    decode_epoch_offset_reply,
    decode_epoch_offset_request,
    decode_fetch_request,
    decode_fetch_response,
    encode_epoch_offset_request,
    encode_epoch_offset_response,
    encode_fetch_error,
    encode_fetch_request,
    encode_fetch_response,
    fetch_entry_size,
)
from liftlog.replication.roles import (
    ConfirmCandidacy,
    Follow,
    Lead,
    ReplicaRole,
    StandBy,
    SyncMembership,
    decide_role,
    isr_change,
)
from liftlog.replication.serving import epoch_question_refusal, fetch_refusal
from liftlog.storage import CommitLog, LogConfig, NewRecord

from .seeds import soak

TICK_NS = 10_000_000  # one tick is 10 ms of simulated time
TICK_S = TICK_NS / 1e9
#: Ticks a follower waits after a failed or refused request before it asks again.
RETRY_TICKS = 3
PHASE1_TICKS = 300
PHASE2_TICKS = 600
TRACE_EVENTS = 300
REPLAY = "LIFTLOG_CLUSTER_SIM_SEED={seed} .venv/bin/pytest tests/sim/test_cluster_sim.py -q"

Key = tuple[str, int]


class SimFailure(AssertionError):
    def __init__(self, seed: int, tick: int, what: str) -> None:
        super().__init__(f"seed {seed} failed at tick {tick}: {what}\nreplay: {REPLAY.format(seed=seed)}")
        self.seed = seed


# --- messages between servers (Raft's own Message, and these) ---------------------------------


@dataclass(frozen=True, slots=True)
class Heartbeat:
    server: str


@dataclass(frozen=True, slots=True)
class ToController:
    """A report, a confirmation or an ISR change, for whoever leads the metadata group."""

    body: LeaderReport | LeaderConfirmation | IsrChange


@dataclass(frozen=True, slots=True)
class LogEndAsk:
    key: Key
    ask_id: int


@dataclass(frozen=True, slots=True)
class LogEndAnswer:
    key: Key
    ask_id: int
    replica: str
    leo: int


@dataclass(frozen=True, slots=True)
class Request:
    """A replication request (encoded fetch or epoch offset request) and the id its answer carries."""

    data: bytes
    req_id: int
    epoch_question: bool


@dataclass(frozen=True, slots=True)
class Answer:
    data: bytes
    req_id: int


@dataclass(frozen=True, slots=True)
class Notify:
    keys: tuple[Key, ...]


@dataclass(frozen=True, slots=True)
class Envelope:
    src: str
    dst: str
    body: object


# --- one server ---------------------------------------------------------------------------------


@dataclass
class Asking:
    action: AskLogEnds
    ask_id: int
    deadline: int
    answers: dict[str, int] = field(default_factory=dict)


@dataclass
class Server:
    id: str
    directory: Path
    raft: RaftNode
    metadata: Metadata = field(default_factory=Metadata)
    logs: dict[Key, CommitLog] = field(default_factory=dict)
    #: The creation timestamp of the stream each log belongs to: a deleted and re-created stream is a new log.
    incarnation: dict[Key, int] = field(default_factory=dict)
    leading: dict[Key, LeaderReplica] = field(default_factory=dict)
    #: The fetch schedule of the partitions this server follows, by leader (the replicator's fetch loops).
    fetching: dict[str, FetchScheduler] = field(default_factory=dict)
    #: Replication requests out, by id: when sent, on whose schedule, and what they carry.
    outstanding: dict[int, tuple[int, FetchScheduler, FetchOut | EpochQuestion]] = field(default_factory=dict)
    #: What each replica was last set up as, and the partition epoch of its last candidacy confirmation.
    roles: dict[Key, ReplicaRole] = field(default_factory=dict)
    confirmed_at: dict[Key, int] = field(default_factory=dict)
    #: Ack ALL publishes waiting for the HW: (offset, value, in-sync replicas when written) per partition.
    waiters: dict[Key, list[tuple[int, bytes, int]]] = field(default_factory=dict)
    #: ISR changes waiting for their task to run, as the replicator spawns them: (due tick, change).
    proposal_tasks: list[tuple[int, IsrChange]] = field(default_factory=list)
    #: When the stream manager's reconcile loop runs next, if metadata changed since it last ran.
    reconcile_at: int | None = None
    # controller state, while this server leads the metadata group
    failover: FailoverCore | None = None
    planner: ChangePlanner | None = None
    liveness: LivenessTracker | None = None
    proposals: dict[int, tuple[Propose | None, bytes]] = field(default_factory=dict)
    asking: dict[Key, Asking] = field(default_factory=dict)
    led_term: int = -1
    #: A restarted server leads nothing until a read-index barrier shows its metadata is current.
    may_lead: bool = False
    barrier: int | None = None
    barrier_asked: int = -1000


class Simulation:
    def __init__(self, seed: int, root: Path, *, trace: bool = False) -> None:
        self.seed = seed
        self.root = root
        self.trace: deque[str] | None = deque(maxlen=TRACE_EVENTS) if trace else None
        self.rng = rng = random.Random(seed)
        n = rng.choice((3, 3, 3, 5))
        self.ids = tuple(f"s{i}" for i in range(1, n + 1))
        self.drop_rate = rng.choice((0.0, 0.01, 0.05, 0.1))
        self.dup_rate = rng.choice((0.0, 0.02))
        self.max_delay = rng.choice((0, 1, 2, 4))
        self.crash_rate = rng.choice((0.0, 0.004, 0.01))
        self.partition_rate = rng.choice((0.0, 0.005, 0.02))
        self.cut_rate = rng.choice((0.0, 0.005, 0.02))
        self.max_down = rng.choice((10, 40, 100))
        self.skew = rng.choice((0.0, 0.0, 0.2))
        self.publish_rate = rng.choice((0.2, 0.5, 1.0))
        self.read_rate = rng.choice((0.0, 0.05))
        self.unclean = rng.random() < 0.35
        self.rebalance_ticks = rng.choice((0, 50))
        self.reassign_rate = rng.choice((0.0, 0.0, 0.01, 0.03))
        self.admin_rate = rng.choice((0.0, 0.0, 0.005, 0.02))
        self.healed = False
        # Drawn apart from the rest, so that seeds without min.insync.replicas run as before it was added.
        later = random.Random(seed ^ 0x5EED)
        self.min_isr = later.choice((1, 1, 2))
        #: Some seeds have a slow reconcile loop (a server under load): old cores run longer beside new metadata.
        self.slow_reconcile = later.random() < 0.15
        rf = rng.choice((2, 3)) if n == 3 else rng.choice((3, 5))
        self.streams = [("orders", rng.choice((1, 2)), min(rf, n))]
        if rng.random() < 0.5:
            self.streams.append(("events", 1, rng.choice((1, n))))
        # Timing, in ticks (10 ms): Raft elections in 100-200 ms, as the real defaults scaled down.
        self.liveness_ticks = rng.choice((20, 40))
        self.heartbeat_ticks = 5
        self.leader_timeout_ticks = rng.choice((20, 40))
        self.max_lag_ticks = rng.choice((30, 60))
        self.fetch_timeout_ticks = 15
        self.idle_ticks = 20
        self.confirm_ticks = 20
        #: How late a spawned task (an ISR proposal) may run; a reconcile can come first.
        self.task_lag_ticks = rng.choice((0, 2, 5))
        #: How late the reconcile loop acts on applied metadata. Metadata is changed in place, so
        #: meanwhile the old cores run against the new PartitionMeta, as in the server.
        self.reconcile_lag_ticks = rng.choice((0, 0, 3))
        if self.slow_reconcile:
            self.reconcile_lag_ticks = 25
        self.now = 0
        self.seq = 0
        self.ids_seq = 0
        self.queue: list[tuple[int, int, Envelope]] = []
        self.groups: dict[str, int] = {}
        self.cuts: set[tuple[str, str]] = set()
        self.heal_at = 0
        self.cut_heal_at = 0
        self.disks: dict[str, MemoryStorage] = {}
        self.servers: dict[str, Server] = {}
        self.restart_at: dict[str, int] = {}
        # checker state
        self.leader_of_epoch: dict[tuple[Key, int, int], str] = {}
        self.committed: dict[tuple[Key, int], dict[int, bytes]] = {}
        self.acked: dict[tuple[Key, int], dict[int, bytes]] = {}
        self.metadata_digest: dict[int, int] = {}
        self.stats: Counter[str] = Counter()
        self.msg = 0
        for sid in self.ids:
            self.start(sid)

    # --- plumbing -----------------------------------------------------------------------------

    def fail(self, what: str) -> SimFailure:
        if self.trace is not None:
            what += f"\nlast {len(self.trace)} events:\n" + "\n".join(self.trace)
        return SimFailure(self.seed, self.now, what)

    def note(self, event: str) -> None:
        if self.trace is not None:
            self.trace.append(f"[{self.now}] {event}")

    def seconds(self) -> float:
        """Simulated time as the fetch schedules keep it."""
        return self.now * TICK_S

    def ns(self) -> int:
        return self.now * TICK_NS

    def next_id(self) -> int:
        self.ids_seq += 1
        return self.ids_seq

    def send(self, src: str, dst: str, body: object) -> None:
        rng = self.rng
        if self.drop_rate and rng.random() < self.drop_rate:
            return
        copies = 2 if self.dup_rate and rng.random() < self.dup_rate else 1
        for _ in range(copies):
            self.seq += 1
            delay = rng.randint(0, self.max_delay) if self.max_delay else 0
            heapq.heappush(self.queue, (self.now + delay, self.seq, Envelope(src, dst, body)))

    def reachable(self, src: str, dst: str) -> bool:
        return self.groups.get(src, 0) == self.groups.get(dst, 0) and (src, dst) not in self.cuts

    def deliver_due(self) -> None:
        budget = 50_000
        while self.queue and self.queue[0][0] <= self.now:
            _, _, env = heapq.heappop(self.queue)
            budget -= 1
            if budget == 0:
                raise self.fail("the network never went quiet within a tick")
            server = self.servers.get(env.dst)
            if server is None or not self.reachable(env.src, env.dst):
                continue
            self.receive(server, env.src, env.body)

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self, sid: str) -> None:
        self.note(f"start {sid}")
        disk = self.disks.setdefault(sid, MemoryStorage())
        cfg = RaftConfig(election_ticks=10, heartbeat_ticks=2, pre_vote=True, check_quorum=True, peers=self.ids)
        raft = RaftNode(sid, cfg, state=disk.state(), rng=random.Random(self.rng.getrandbits(32)))
        server = Server(sid, self.root / sid, raft)
        self.servers[sid] = server
        self.process_raft(server)

    def crash(self, sid: str) -> None:
        self.note(f"crash {sid}")
        server = self.servers.pop(sid)
        for log in server.logs.values():
            log.close()  # a process crash: what was written stays in the files
        self.stats["crashes"] += 1
        self.restart_at[sid] = self.now + self.rng.randint(1, self.max_down)

    def log_of(self, server: Server, key: Key, created: int) -> CommitLog:
        if key in server.logs and server.incarnation[key] != created:
            self.drop_replica(server, key)  # the stream was deleted and created again
        log = server.logs.get(key)
        if log is None:
            directory = server.directory / f"{key[0]}-{key[1]}-{created}"  # as streams/<name>/.created does
            log = server.logs[key] = CommitLog.open(directory, LogConfig())
            server.incarnation[key] = created
        return log

    def drop_replica(self, server: Server, key: Key) -> None:
        self.note(f"{server.id} drops its replica of {key}")
        if key in server.leading:
            self.step_down(server, key)
        self.unfollow(server, key)
        server.roles.pop(key, None)
        server.confirmed_at.pop(key, None)
        server.logs.pop(key).close()
        created = server.incarnation.pop(key)
        shutil.rmtree(server.directory / f"{key[0]}-{key[1]}-{created}", ignore_errors=True)
        self.stats["replicas_dropped"] += 1

    # --- the metadata group -------------------------------------------------------------------

    def process_raft(self, server: Server) -> None:
        raft = self.disks[server.id]
        node = server.raft
        changed = False
        while node.has_ready():
            rd = node.ready()
            if rd.entries:
                raft.append(rd.entries)
            if rd.hard_state is not None:
                raft.hard_state = rd.hard_state
            for m in rd.messages:
                self.send(server.id, m.dst, m)
            for rs in rd.read_states:
                if rs.context == b"barrier":
                    server.barrier = rs.index
            for e in rd.committed:
                if e.kind is EntryKind.NORMAL and e.data:
                    self.apply_entry(server, e.index, e.data)
                    changed = True
            node.advance(rd)
        self.controller_role(server)
        if not server.may_lead and server.barrier is not None and node.applied_index >= server.barrier:
            server.may_lead = changed = True
            self.note(f"{server.id} may lead (metadata current at {server.barrier})")
        if changed and server.reconcile_at is None:
            server.reconcile_at = self.now + self.rng.randint(0, self.reconcile_lag_ticks)
        if server.reconcile_at is not None and server.reconcile_at <= self.now:
            server.reconcile_at = None
            self.reconcile(server)

    def apply_entry(self, server: Server, index: int, data: bytes) -> None:
        op = decode_operation(data)
        if self.trace is not None:
            self.note(f"{server.id} applies {index}: {op}")
        result: object
        try:
            result = server.metadata.apply(op)
        except MetadataError as exc:
            result = exc
        digest = zlib.crc32(encode_snapshot(server.metadata))
        first = index not in self.metadata_digest
        known = self.metadata_digest.setdefault(index, digest)
        if known != digest:
            raise self.fail(f"metadata differs on {server.id} at applied index {index}")
        if first and isinstance(op, ChangeIsr | ChangeLeader) and not isinstance(result, MetadataError):
            self.check_isr(server.metadata, (op.name, op.partition))
        pending = server.proposals.pop(index, None)
        if pending is not None and server.failover is not None:
            action, sent = pending
            if action is not None:
                outcome = result if sent == data else ProposalDropped("another entry took its index")
                self.carry_out(server, server.failover.proposed(action, outcome))

    def controller_role(self, server: Server) -> None:
        node = server.raft
        if node.role is Role.LEADER and server.led_term != node.term:
            server.led_term = node.term
            server.failover = FailoverCore(
                lambda: server.metadata,
                confirm_timeout_ns=self.confirm_ticks * TICK_NS,
                report_window_ns=3 * self.leader_timeout_ticks * TICK_NS,
                unclean_default=False,
                rebalance_after_ns=self.rebalance_ticks * TICK_NS,
            )
            server.planner = ChangePlanner("sim")
            server.liveness = LivenessTracker(self.liveness_ticks * TICK_NS)
            server.liveness.reset(self.ns())
            self.stats["controllers"] += 1
        elif node.role is not Role.LEADER and server.failover is not None:
            core, server.failover, server.liveness, server.planner = server.failover, None, None, None
            server.led_term = -1
            pending, server.proposals = server.proposals, {}
            server.asking = {}
            for action, _ in pending.values():
                if action is not None:
                    core.proposed(action, NotLeader(node.leader_id, server.id))

    def propose(self, server: Server, op: Operation, action: Propose | None = None) -> None:
        data = encode_operation(op)
        try:
            index = server.raft.propose(data)
        except (NotLeader, ProposalDropped) as exc:
            if action is not None and server.failover is not None:
                self.carry_out(server, server.failover.proposed(action, exc))
            return
        server.proposals[index] = (action, data)
        self.process_raft(server)

    def carry_out(self, server: Server, actions: list[FailoverAction]) -> None:
        for action in actions:
            if isinstance(action, Propose):
                self.stats[f"step_{action.step.name.lower()}"] += 1
                if isinstance(action.op, ChangeLeader) and action.op.isr == (action.op.leader,):
                    meta = server.metadata.partition(*action.key)
                    if action.op.leader not in meta.isr:
                        self.stats["unclean_hand_overs"] += 1
                self.propose(server, action.op, action)
            else:
                ask = Asking(action, self.next_id(), self.now + 10)
                server.asking[action.key] = ask
                for replica in action.replicas:
                    self.send(server.id, replica, LogEndAsk(action.key, ask.ask_id))
                if not action.replicas:
                    ask.deadline = self.now

    def controller_tick(self, server: Server) -> None:
        if server.failover is None or server.liveness is None:
            return
        now = self.ns()
        server.liveness.heard(server.id, now)
        md = server.metadata
        for sid in self.ids:
            if sid not in md.servers and self.now % 10 == 0:
                self.propose(server, RegisterServer(ServerMeta(sid, "127.0.0.1", 1), now))
        for change in server.liveness.changes(md, now):
            self.propose(server, change)
        for name, partitions, rf in self.streams:
            if name not in md.streams and len(md.servers) == len(self.ids) and self.now % 10 == 0:
                settings = StreamSettings(
                    unclean_leader_election=True if self.unclean and name == "orders" else None,
                    min_isr=min(self.min_isr, rf) if self.min_isr > 1 else None,
                )
                req = CreateStreamRequest(name, name, partitions=partitions, replication_factor=rf, settings=settings)
                self.plan(server, CreateStreamChange(req))
        for key, ask in list(server.asking.items()):
            if self.now >= ask.deadline and server.failover is not None:
                del server.asking[key]
                self.carry_out(server, server.failover.log_ends(key, ask.answers, now))
        if server.failover is not None:
            self.carry_out(server, server.failover.tick(now))
        if self.reassign_rate and self.rng.random() < self.reassign_rate and server.failover is not None:
            self.start_reassignment(server)
        if self.healed:
            for stream in md.streams.values():
                paused = tuple(p.id for p in stream.partitions.values() if p.paused)
                if paused and self.now % 10 == 0:
                    self.propose(server, SetPaused(stream.name, paused, False, now))
        elif self.admin_rate and self.rng.random() < self.admin_rate and md.streams:
            stream = md.streams[self.rng.choice(sorted(md.streams))]
            choice = self.rng.random()
            if choice < 0.2:
                self.note(f"{server.id} deletes stream {stream.name}")
                self.stats["deletes"] += 1
                self.propose(server, DeleteStream(stream.name))
            else:
                p = self.rng.choice(sorted(stream.partitions))
                pause = not stream.partitions[p].paused
                self.stats["pauses" if pause else "resumes"] += 1
                self.propose(server, SetPaused(stream.name, (p,), pause, now))
        for op in reassignment_steps(md):
            self.stats[f"reassignment_{type(op).__name__}"] += 1
            self.propose(server, op)

    def start_reassignment(self, server: Server) -> None:
        """An administrator moves a random partition to random servers (a decommission, a spread)."""
        md = server.metadata
        keys = [k for k in self.partition_keys() if k[0] in md.streams]
        if not keys:
            return
        key = self.rng.choice(keys)
        meta = md.partition(*key)
        # No fewer replicas than min.insync.replicas: else ack ALL could never be taken again.
        fewest = self.min_isr_configured(key[0])
        size = self.rng.randint(fewest, len(self.ids)) if self.rng.random() < 0.3 else len(meta.replicas)
        target = self.rng.sample(self.ids, size)
        if self.plan(server, ReassignChange((PartitionMove(key[0], key[1], tuple(target)),))):
            self.note(f"{server.id} moves {key} from {meta.replicas} to {target}")
            self.stats["reassignments_started"] += 1

    def plan(self, server: Server, change: CreateStreamChange | ReassignChange | IsrChange) -> bool:
        """Plan a change as the controller does and propose its operations; False if it was refused."""
        if server.planner is None:
            return False
        try:
            ops = server.planner.plan(server.metadata, change, self.ns(), self.ids)
        except MetadataError:
            return False
        for op in ops:
            self.propose(server, op)
        return True

    def to_controller(self, server: Server, body: LeaderReport | LeaderConfirmation | IsrChange) -> None:
        leader = server.raft.leader_id
        if leader is not None:
            self.send(server.id, leader, ToController(body))

    # --- partitions: roles ------------------------------------------------------------------

    def reconcile(self, server: Server) -> None:
        """Lead, follow or wait for every replica, as the metadata says (the stream manager's job)."""
        md = server.metadata
        now = self.ns()
        hosted = {
            (p.stream, p.id) for s in md.streams.values() for p in s.partitions.values() if server.id in p.replicas
        }
        for key in [k for k in server.logs if k not in hosted]:  # moved away or deleted: close and delete it
            self.drop_replica(server, key)
        for stream in md.streams.values():
            for meta in stream.partitions.values():
                if server.id not in meta.replicas:
                    continue
                key = (meta.stream, meta.id)
                log = self.log_of(server, key, stream.creation_timestamp)
                if meta.paused:  # a paused partition has no leader and no fetching: it keeps its log
                    if key in server.leading:
                        self.step_down(server, key)
                    self.unfollow(server, key)
                    server.roles.pop(key, None)
                    continue
                core = server.leading.get(key)
                decision = decide_role(
                    server.id,
                    meta,
                    server.roles.get(key),
                    server.confirmed_at.get(key, -1),
                    may_lead=server.may_lead,
                    membership=(core.replicas, core.isr) if core is not None else None,
                )
                server.confirmed_at[key] = decision.confirmed_at
                for action in decision.actions:
                    if isinstance(action, ConfirmCandidacy):
                        self.unfollow(server, key)
                        self.to_controller(server, LeaderConfirmation(meta.stream, meta.id, server.id))
                    elif isinstance(action, Lead):
                        self.unfollow(server, key)
                        self.become_leader(server, key, meta.replicas, meta.isr, meta.leader_epoch, log)
                    elif isinstance(action, Follow | StandBy):
                        if key in server.leading:
                            self.step_down(server, key)
                        self.unfollow(server, key)
                        if isinstance(action, Follow):
                            self.follow(server, key, action.leader, action.leader_epoch, log)
                    elif isinstance(action, SyncMembership) and core is not None:
                        # What the server's Partition.isr_committed does.
                        if tuple(meta.replicas) != core.replicas:
                            self.leader_did(server, key, core.replicas_changed(tuple(meta.replicas), now))
                        self.leader_did(server, key, core.isr_committed(tuple(meta.isr), now))
                if not decision.held and decision.role is not None:
                    server.roles[key] = decision.role

    def become_leader(
        self, server: Server, key: Key, replicas: list[str], isr: list[str], epoch: int, log: CommitLog
    ) -> None:
        other = self.leader_of_epoch.setdefault((key, server.incarnation[key], epoch), server.id)
        if other != server.id:
            raise self.fail(f"{other} and {server.id} both lead {key} in leader epoch {epoch}")
        self.note(f"{server.id} leads {key} epoch {epoch} leo {log.log_end_offset}")
        self.stats["leaderships"] += 1
        # As Partition.become_leader does: before its first append, the new epoch must already
        # answer followers' epoch questions (else a follower one epoch ahead of this log's last
        # record hears "unknown epoch" and truncates everything; seed 1783).
        log.epoch_cache.assign(epoch, log.log_end_offset)
        server.leading[key] = LeaderReplica(
            server.id,
            tuple(replicas),
            tuple(isr),
            epoch,
            log.log_end_offset,
            log.high_watermark,
            self.ns(),
            max_lag_ns=self.max_lag_ticks * TICK_NS,
            retry_ns=20 * TICK_NS,
        )

    def step_down(self, server: Server, key: Key) -> None:
        del server.leading[key]
        server.waiters.pop(key, None)  # those publishes fail: their clients retry, nothing was acked

    def follow(self, server: Server, key: Key, leader: str, epoch: int, log: CommitLog) -> None:
        core = FollowerReplica(
            server.id,
            leader,
            epoch,
            log.log_end_offset,
            log.high_watermark,
            log.epoch_cache.latest_epoch,
            self.ns(),
            idle_wait_s=self.idle_ticks * TICK_NS / 1e9,
            leader_timeout_ns=self.leader_timeout_ticks * TICK_NS,
        )
        self.unfollow(server, key)
        schedule = server.fetching.get(leader)
        if schedule is None:
            schedule = server.fetching[leader] = FetchScheduler(server.id, leader, self.idle_ticks * TICK_S)
        member = schedule.join(key, core, server.incarnation[key], fetch_entry_size(key[0]))
        self.follower_did(server, schedule, member, core.start())

    def unfollow(self, server: Server, key: Key) -> None:
        for schedule in server.fetching.values():
            schedule.leave(key)

    # --- partitions: the leader ---------------------------------------------------------------

    def leader_did(self, server: Server, key: Key, actions: list[LeaderAction] | tuple[LeaderAction, ...]) -> None:
        for action in actions:
            if isinstance(action, HighWatermark):
                log = server.logs[key]
                self.note(f"{server.id} leader HW {key} -> {action.hw}")
                log.set_high_watermark(action.hw)
                self.check_committed(server, key, log, action.hw)
                waiting = server.waiters.get(key, [])
                done = [w for w in waiting if w[0] <= action.hw]
                if done:
                    server.waiters[key] = [w for w in waiting if w[0] > action.hw]
                    for offset, value, in_sync in done:
                        self.check_promise(key, offset, in_sync)
                        self.acked.setdefault((key, server.incarnation[key]), {})[offset] = value
                        self.stats["acked_all"] += 1
            elif isinstance(action, ProposeIsr):
                # Decided now, as the replicator does; only the send waits for its task to run.
                try:
                    meta = server.metadata.partition(*key)
                except MetadataError:
                    meta = None  # deleted, not yet reconciled: the controller refuses it anyway
                change = isr_change(server.id, meta, action) if meta is not None else None
                if change is None:
                    self.stats["isr_proposals_stale"] += 1
                    continue
                assert meta is not None
                if meta.leader != server.id or meta.leader_epoch != action.leader_epoch:
                    raise self.fail(
                        f"{server.id} sends an ISR change for {key} decided in leader epoch {action.leader_epoch}, "
                        f"while the metadata names {meta.leader} in leader epoch {meta.leader_epoch}"
                    )
                due = self.now + self.rng.randint(0, self.task_lag_ticks)
                server.proposal_tasks.append((due, change))
                if due == self.now:
                    self.run_proposal_tasks(server)
            elif isinstance(action, NotifyFollowers):
                for follower in action.replicas:
                    self.send(server.id, follower, Notify((key,)))

    def run_proposal_tasks(self, server: Server) -> None:
        """The server's ``_propose_isr`` tasks that are due: each sends the change it was given."""
        due = [change for at, change in server.proposal_tasks if at <= self.now]
        server.proposal_tasks = [t for t in server.proposal_tasks if t[0] > self.now]
        for change in due:
            self.to_controller(server, change)
            self.stats["isr_proposals"] += 1

    def publish(self, server: Server, key: Key, ack_all: bool) -> int | None:
        """A client's publish to ``server``: its front door's admission, then (if it leads) its intake's.

        Returns the offset it was written at, None if it was not (refused, or not led there)."""
        try:
            meta = server.metadata.partition(*key)
        except MetadataError:
            return None
        policy = AckPolicy.ALL if ack_all else AckPolicy.LEADER
        rules = AdmissionRules(min_isr=self.min_isr_of(server.metadata, key))
        value = f"m{self.msg + 1}".encode()
        if admit(rules, policy, len(meta.isr), len(value), -1, None) is not None:
            self.stats["refused_at_front_door"] += 1
            return None
        core = server.leading.get(key)
        if core is None:
            return None
        log = server.logs[key]
        offset = log.log_end_offset
        if admit(rules, policy, len(core.isr), len(value), -1, offset) is not None:
            self.stats["refused_by_leader"] += 1
            return None
        self.msg += 1
        log.append([NewRecord(value)], core.leader_epoch)
        self.note(f"{server.id} appends {value!r} at {key} {offset} (epoch {core.leader_epoch}, ack all {ack_all})")
        self.stats["published"] += 1
        if ack_all:
            server.waiters.setdefault(key, []).append((offset, value, len(core.isr)))
        self.leader_did(server, key, core.appended(log.log_end_offset, self.ns()))
        return offset

    def min_isr_of(self, metadata: Metadata, key: Key) -> int:
        own = metadata.stream(key[0]).settings.min_isr
        return own if own is not None else 1

    def serve_request(self, server: Server, src: str, req: Request) -> None:
        if req.epoch_question:
            q = decode_epoch_offset_request(req.data)
            key = (q.stream, q.partition)
            core = server.leading.get(key)
            log = server.logs.get(key)
            if core is None or log is None:
                error = epoch_question_refusal(server.id, None, 0, 0, q)
            else:
                created = server.incarnation[key]
                error = epoch_question_refusal(server.id, core.leader_epoch, created, log.log_start_offset, q)
            if error is not None:
                reply = encode_fetch_error(error)
            else:
                assert core is not None and log is not None
                self.check_served(server, key, "an epoch question", q.current_epoch, core.leader_epoch, q.created)
                epoch, end = log.epoch_cache.end_offset_for(q.leader_epoch, log.log_end_offset)
                reply = encode_epoch_offset_response(EpochOffsetResponse(epoch, end, log.log_start_offset))
            self.send(server.id, src, Answer(reply, req.req_id))
            return
        fetch = decode_fetch_request(req.data)
        answers = [self.answer_fetch(server, fetch.replica_id, p) for p in fetch.partitions]
        self.send(server.id, src, Answer(encode_fetch_response(answers), req.req_id))

    def answer_fetch(
        self, server: Server, replica: str, p: PartitionFetch
    ) -> tuple[str, int, int, int, bytes] | PartitionRefusal:
        key = (p.stream, p.partition)
        core = server.leading.get(key)
        log = server.logs.get(key)
        if core is None or log is None:
            error = fetch_refusal(server.id, None, 0, 0, 0, p)
        else:
            start, end = log.log_start_offset, log.log_end_offset
            error = fetch_refusal(server.id, core.leader_epoch, server.incarnation[key], start, end, p)
        if error is not None:
            return PartitionRefusal(p.stream, p.partition, error)
        assert core is not None and log is not None
        self.check_served(server, key, "a fetch", p.leader_epoch, core.leader_epoch, p.created)
        try:
            served = core.fetch(replica, p.offset, p.leader_epoch, self.ns())
        except ValueError as exc:
            error = FetchError(FetchErrorCode.UNKNOWN_PARTITION, str(exc), core.leader_epoch, 0)
            return PartitionRefusal(p.stream, p.partition, error)
        data = b"" if served.empty else log.read_raw(p.offset, 4096)
        self.leader_did(server, key, served.actions)
        return (p.stream, p.partition, served.leader_epoch, served.hw, data)

    # --- partitions: a follower ---------------------------------------------------------------

    def follower_did(
        self, server: Server, schedule: FetchScheduler, m: Member, actions: list[FollowerAction], delay: int = 0
    ) -> None:
        """What the replicator's ``_carry_out`` does; ``delay`` in ticks."""
        key, log = m.key, server.logs[m.key]
        for action in schedule.schedule(m, actions, self.seconds(), delay * TICK_S):
            if isinstance(action, Truncate):
                self.note(f"{server.id} truncates {key} to {action.offset}")
                self.stats["truncations"] += 1
                log.truncate_to(action.offset)
            elif isinstance(action, SetHighWatermark):
                self.note(f"{server.id} follower HW {key} -> {action.hw}")
                log.set_high_watermark(action.hw)
                self.check_committed(server, key, log, action.hw)
            elif isinstance(action, ReportLeader):
                try:
                    meta = server.metadata.partition(*key)
                except MetadataError:
                    continue  # deleted, not yet reconciled
                self.stats["reports"] += 1
                self.to_controller(
                    server, LeaderReport(key[0], key[1], server.id, action.leader, meta.epoch, action.leader_epoch)
                )

    def follower_tick(self, server: Server) -> None:
        """The replicator's fetch loops: time out what went unanswered, then send what is due."""
        for req_id, (sent_at, schedule, out) in list(server.outstanding.items()):
            if self.now - sent_at <= self.fetch_timeout_ticks:
                continue
            del server.outstanding[req_id]
            if isinstance(out, FetchOut):
                failed = schedule.failed(out)
            else:
                failed = [out.member] if schedule.current(out.member) else []
            for m in failed:
                self.follower_did(server, schedule, m, m.core.failed(self.ns()), delay=RETRY_TICKS)
        for leader, schedule in server.fetching.items():
            due = schedule.poll(self.seconds())
            for question in due.questions:
                req_id = self.next_id()
                server.outstanding[req_id] = (self.now, schedule, question)
                self.send(server.id, leader, Request(encode_epoch_offset_request(question.question), req_id, True))
            for fetch in due.fetches:
                req_id = self.next_id()
                server.outstanding[req_id] = (self.now, schedule, fetch)
                self.send(server.id, leader, Request(encode_fetch_request(fetch.request), req_id, False))

    def on_answer(self, server: Server, answer: Answer) -> None:
        entry = server.outstanding.pop(answer.req_id, None)
        if entry is None:
            return  # late (timed out), or duplicated
        _, schedule, out = entry
        now = self.ns()
        if isinstance(out, EpochQuestion):
            m = out.member
            if not schedule.current(m):
                return  # for a follower that has moved on
            reply = decode_epoch_offset_reply(answer.data)
            if isinstance(reply, FetchError):
                self.follower_did(server, schedule, m, m.core.failed(now), delay=RETRY_TICKS)
                return
            log = server.logs[m.key]
            local = log.epoch_cache.end_offset_for(reply.leader_epoch, log.log_end_offset)[1]
            self.follower_did(server, schedule, m, m.core.epoch_offset(reply.leader_epoch, reply.end_offset, local))
            return
        for applied in schedule.answered(out, decode_fetch_response(answer.data).partitions):
            m, part, key = applied.member, applied.answer, applied.member.key
            core, log = m.core, server.logs[key]
            if isinstance(part, PartitionRefusal):
                if part.error.code is FetchErrorCode.OFFSET_OUT_OF_RANGE:
                    self.follow(server, key, core.leader, core.leader_epoch, log)  # truncate by epoch again
                else:
                    self.follower_did(server, schedule, m, core.failed(now), delay=RETRY_TICKS)
                continue
            actions = core.fetched(part.leader_epoch, part.hw, applied.sent.offset, not part.batches, now)
            if actions and isinstance(actions[0], Append):
                self.note(f"{server.id} appends fetched {key} from {applied.sent.offset} (leader HW {part.hw})")
                log.append_raw(bytes(part.batches))
                actions = actions[1:] + core.appended(log.log_end_offset, now)
            self.follower_did(server, schedule, m, actions)

    # --- receiving ---------------------------------------------------------------------------

    def receive(self, server: Server, src: str, body: object) -> None:
        if isinstance(body, Message):
            server.raft.step(body)
            self.process_raft(server)
        elif isinstance(body, Heartbeat):
            if server.liveness is not None:
                server.liveness.heard(body.server, self.ns())
        elif isinstance(body, Request):
            self.serve_request(server, src, body)
        elif isinstance(body, Answer):
            self.on_answer(server, body)
        elif isinstance(body, Notify):
            for schedule in server.fetching.values():
                schedule.notify(body.keys)
        elif isinstance(body, LogEndAsk):
            log = server.logs.get(body.key)
            leo = log.log_end_offset if log is not None else -1
            self.send(server.id, src, LogEndAnswer(body.key, body.ask_id, server.id, leo))
        elif isinstance(body, LogEndAnswer):
            ask = server.asking.get(body.key)
            if ask is not None and ask.ask_id == body.ask_id:
                ask.answers[body.replica] = body.leo
        elif isinstance(body, ToController):
            self.controller_receive(server, body.body)

    def controller_receive(self, server: Server, body: LeaderReport | LeaderConfirmation | IsrChange) -> None:
        core = server.failover
        if core is None:
            return
        try:
            if isinstance(body, LeaderReport):
                actions = core.report(body, self.ns())
                if actions:
                    self.stats["elections_from_reports"] += 1
                self.carry_out(server, actions)
            elif isinstance(body, LeaderConfirmation):
                self.carry_out(server, core.confirm(body))
            else:
                self.plan(server, body)
        except MetadataError:
            pass

    # --- checks ------------------------------------------------------------------------------------

    def check_served(self, server: Server, key: Key, what: str, asked: int, leads: int, created: int) -> None:
        """A leader answers a follower only in the leader epoch it leads, for the incarnation it holds."""
        if asked != leads or created != server.incarnation[key]:
            raise self.fail(
                f"{server.id} leading {key} in leader epoch {leads} answered {what} in leader epoch {asked} "
                f"for the stream created at {created}"
            )

    def min_isr_configured(self, stream: str) -> int:
        return next(min(self.min_isr, rf) for name, _, rf in self.streams if name == stream)

    def check_promise(self, key: Key, offset: int, in_sync: int) -> None:
        """Ack ALL promises min.insync.replicas copies: it was written while that many were in sync."""
        min_isr = self.min_isr_configured(key[0])
        if in_sync < min_isr:
            raise self.fail(
                f"ack ALL given for {key} offset {offset}, written with {in_sync} in-sync replicas: "
                f"min.insync.replicas is {min_isr}"
            )

    def clean(self, key: Key) -> bool:
        return not (self.unclean and key[0] == "orders")

    def check_committed(self, server: Server, key: Key, log: CommitLog, hw: int) -> None:
        """Everything ``server`` holds up to ``hw`` agrees with the one committed history of ``key``."""
        if not self.clean(key):
            return
        history = self.committed.setdefault((key, server.incarnation[key]), {})
        start = max(log.log_start_offset, 0)
        for record in log.read(start, max_offset=hw + 1, max_bytes=1 << 30):
            seen = history.setdefault(record.offset, record.value)
            if seen != record.value:
                raise self.fail(
                    f"{server.id} holds {record.value!r} at committed offset {record.offset} of {key}, "
                    f"the committed history has {seen!r}"
                )

    def check_isr(self, metadata: Metadata, key: Key) -> None:
        """Every live member of a committed ISR holds the whole committed history (it could be elected next)."""
        if not self.clean(key):
            return
        created = metadata.stream(key[0]).creation_timestamp
        history = self.committed.get((key, created))
        if not history:
            return
        end = max(history) + 1
        meta = metadata.partition(*key)
        for member in meta.isr:
            server = self.servers.get(member)
            log = server.logs.get(key) if server is not None else None
            if server is None or log is None or server.incarnation[key] != created:
                continue  # down, or not opened yet: checked when it next holds the log in an ISR
            if log.log_end_offset < end:
                raise self.fail(
                    f"{member} is in the ISR of {key} (epoch {meta.epoch}, leader {meta.leader} in leader epoch "
                    f"{meta.leader_epoch}) holding offsets below {log.log_end_offset} only; "
                    f"messages up to {end - 1} are committed"
                )
            self.check_committed(server, key, log, end - 1)

    def client(self) -> None:
        rng = self.rng
        if not self.servers:
            return
        for key in self.partition_keys():
            if rng.random() >= self.publish_rate:
                continue
            server = self.servers[rng.choice(sorted(self.servers))]  # a client that does not know the leader
            self.publish(server, key, ack_all=rng.random() < 0.7)
        if self.read_rate and rng.random() < self.read_rate:
            server = self.servers[rng.choice(sorted(self.servers))]
            for key, log in server.logs.items():
                if key in server.leading:
                    self.check_committed(server, key, log, log.high_watermark)
                    self.stats["reads"] += 1

    def partition_keys(self) -> list[Key]:
        return [(name, p) for name, partitions, _ in self.streams for p in range(partitions)]

    # --- faults and time -----------------------------------------------------------------------

    def faults(self) -> None:
        rng = self.rng
        for sid, at in list(self.restart_at.items()):
            if at <= self.now:
                del self.restart_at[sid]
                self.start(sid)
                self.stats["restarts"] += 1
        if self.crash_rate and len(self.servers) > 1 and rng.random() < self.crash_rate:
            leaders = [s for s in self.servers.values() if s.leading or s.failover is not None]
            pool = leaders if leaders and rng.random() < 0.5 else list(self.servers.values())
            self.crash(rng.choice(sorted(pool, key=lambda s: s.id)).id)
        if self.groups and self.now >= self.heal_at:
            self.groups = {}
        elif not self.groups and self.partition_rate and rng.random() < self.partition_rate:
            self.groups = {sid: rng.randint(0, 1) for sid in self.ids}
            self.heal_at = self.now + rng.randint(10, 80)
            self.stats["partitions"] += 1
        if self.cuts and self.now >= self.cut_heal_at:
            self.cuts = set()
        elif not self.cuts and self.cut_rate and rng.random() < self.cut_rate:
            a, b = rng.sample(self.ids, 2)
            self.cuts = {(a, b)}  # one direction only: a's messages to b are lost, b's to a arrive
            self.cut_heal_at = self.now + rng.randint(10, 80)
            self.stats["one_way_cuts"] += 1

    def step_time(self) -> None:
        for sid in sorted(self.servers):
            server = self.servers.get(sid)
            if server is None:
                continue
            if self.skew and self.rng.random() < self.skew:
                continue  # this server's clock runs slow
            server.raft.tick()
            if not server.may_lead and self.now - server.barrier_asked >= 20:
                server.barrier_asked = self.now
                with contextlib.suppress(NotLeader, ProposalDropped):
                    server.raft.read_index(b"barrier")
            self.process_raft(server)
            if self.now % self.heartbeat_ticks == 0 and server.raft.leader_id is not None:
                self.send(sid, server.raft.leader_id, Heartbeat(sid))
            self.controller_tick(server)
            self.follower_tick(server)
            now = self.ns()
            for key, core in list(server.leading.items()):
                self.leader_did(server, key, core.tick(now))
            if server.proposal_tasks:
                self.run_proposal_tasks(server)
        self.deliver_due()
        self.now += 1

    # --- run -------------------------------------------------------------------------------------

    def run(self) -> Counter[str]:
        try:
            for _ in range(PHASE1_TICKS):
                self.faults()
                self.client()
                self.step_time()
            self.heal()
            self.require_progress()
            return self.stats
        except SimFailure:
            raise
        except Exception as exc:  # a core or a log refused what the shells gave it: replayable like the rest
            raise self.fail(f"raised {exc!r}") from exc
        finally:
            for server in self.servers.values():
                for log in server.logs.values():
                    log.close()

    def heal(self) -> None:
        self.healed = True  # the controller resumes paused partitions from now on
        self.groups, self.cuts = {}, set()
        self.drop_rate = self.dup_rate = 0.0
        self.max_delay = min(self.max_delay, 1)
        self.skew = 0.0
        for sid in sorted(self.restart_at):
            self.start(sid)
        self.restart_at = {}

    def require_progress(self) -> None:
        """Healed, every partition gets a leader, takes an ack ALL publish, and keeps what was acked."""
        marks: dict[Key, tuple[str, int, int]] = {}  # (leader, incarnation, offset)
        keys = self.partition_keys()
        for _ in range(PHASE2_TICKS):
            self.step_time()
            for key in keys:
                if key in marks:
                    continue
                leaders = [s for s in self.servers.values() if key in s.leading]
                if len(leaders) != 1:
                    continue
                server = leaders[0]
                meta = server.metadata.partition(*key)
                if meta.state is not PartitionState.ONLINE or meta.leader != server.id:
                    continue
                offset = self.publish(server, key, ack_all=True)
                if offset is not None:  # else refused (too few in sync yet): again next tick
                    marks[key] = (server.id, server.incarnation[key], offset)
            if (
                len(marks) == len(keys)
                and all(offset in self.acked.get((key, created), {}) for key, (_, created, offset) in marks.items())
                and all(any(key in s.leading for s in self.servers.values()) for key in keys)
            ):
                self.final_check()
                self.stats["liveness_ticks"] += self.now - PHASE1_TICKS
                return
            for key, (sid, created, _) in list(marks.items()):
                holder = self.servers.get(sid)
                if holder is None or key not in holder.leading or holder.incarnation[key] != created:
                    # That leader is gone, or leads a stream created again since (it applied the
                    # deletion late, after the mark went into the old one): publish again.
                    del marks[key]
        state = {k: [(s.id, k in s.leading) for s in self.servers.values()] for k in keys}
        raise self.fail(f"liveness: not every partition took an ack ALL publish within {PHASE2_TICKS} ticks: {state}")

    def current(self, key: Key) -> tuple[Key, int]:
        """``key`` in the incarnation its leader holds now (-1 without a leader)."""
        leader = next((s for s in self.servers.values() if key in s.leading), None)
        return key, leader.incarnation[key] if leader is not None else -1

    def final_check(self) -> None:
        for (key, created), acked in self.acked.items():
            if not self.clean(key) or self.current(key) != (key, created):
                continue  # a deleted stream's messages went with it
            leader = next(s for s in self.servers.values() if key in s.leading)
            log = leader.logs[key]
            held = {r.offset: r.value for r in log.read(log.log_start_offset, max_bytes=1 << 30)}
            for offset, value in acked.items():
                if held.get(offset) != value:
                    raise self.fail(
                        f"acknowledged {value!r} at {key} offset {offset} lost: the leader has {held.get(offset)!r}"
                    )


def run_seed(seed: int, *, trace: bool = False) -> Counter[str]:
    """Run one seed in a throw-away directory; with ``trace`` a failure ends with the last events."""
    root = Path(tempfile.mkdtemp(prefix=f"cluster-sim-{seed}-", dir=_scratch()))
    try:
        return Simulation(seed, root, trace=trace).run()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _scratch() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None


def main(argv: list[str] | None = None) -> int:
    logging.getLogger("liftlog").setLevel(logging.CRITICAL)  # the cores log every election
    return soak(argv, "whole-cluster simulation", run_seed, SimFailure, REPLAY)


if __name__ == "__main__":
    raise SystemExit(main())
