"""``RaftNode``: Raft as a sans-IO state machine (the shape of etcd's ``raft``/``RawNode``).

Time comes in as ``tick()``, messages as ``step(msg)``, requests as ``propose``,
``propose_conf_change``, ``transfer_leadership`` and ``read_index``. Effects go out through
``ready()``/``advance()`` (see ``Ready`` for the persist-before-send rule). The node reads no
clock, does no I/O and draws randomness only from the injected ``random.Random``.

Rules:
- Terms: a message from a higher term makes us a follower of that term, except (a) PreVote
  traffic, which never changes terms, and (b) (pre)votes that arrive while we heard from a
  leader within an election timeout (CheckQuorum lease): those are ignored, unless the
  candidate was told to campaign by a leadership transfer. Messages from lower terms are
  ignored, but appends/heartbeats/pre-votes get an answer carrying our term so a stale
  leader or pre-candidate learns it is stale.
- Elections: a follower whose randomized timeout, drawn from [election_ticks,
  2*election_ticks), elapses without hearing from a leader first runs a PreVote round at
  term+1 without changing its term; only if a quorum would vote does it start a real election.
- Commit: the leader commits the largest index matched by a quorum, and only if that entry
  is from its own term (Raft §5.4.2, "Figure 8"). A new leader appends a NOOP to get there.
- CheckQuorum: a leader that has not heard from a quorum within an election timeout steps down.
- Membership: single-server changes, one at a time. A change takes effect on every node when
  its CONF_CHANGE entry becomes *committed* (as in etcd), not when appended. The leader
  refuses a new change while one is uncommitted, and until it has committed an entry of its
  own term (the fix for the single-server-change bug Ongaro described in 2015). A leader
  that commits its own removal broadcasts the commit and steps down; a node that is not a
  voter never campaigns.
- Read index: the leader records its commit index, confirms it is still leader with a
  heartbeat round that echoes the read's context, and then answers. Contexts must be unique.
  A new leader answers reads only after committing an entry of its own term.
- Not shared between tasks: one owner calls every method; nothing here awaits.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from . import quorum
from .errors import NotLeader, ProposalDropped
from .log import RaftLog
from .progress import Progress, ProgressState
from .read_index import PendingReads
from .types import (
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    HardState,
    Message,
    MessageType,
    PersistedState,
    ReadState,
    Ready,
    Role,
    Snapshot,
)

__all__ = ["RaftConfig", "RaftNode"]

MT = MessageType
TRANSFER_CONTEXT = b"transfer"


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Tuning for one node. ``peers`` bootstraps a brand-new cluster and is ignored when the
    persisted state is not empty; a node joining an existing cluster starts with no peers
    and learns the membership from the leader's log or snapshot."""

    election_ticks: int = 10
    heartbeat_ticks: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    max_inflight: int = 64
    max_entries_per_message: int = 64
    peers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_ticks < self.election_ticks:
            raise ValueError("need 0 < heartbeat_ticks < election_ticks")


class RaftNode:
    def __init__(self, node_id: str, config: RaftConfig, *, state: PersistedState, rng: random.Random) -> None:
        self._id = node_id
        self._cfg = config
        self._rng = rng
        hs = state.hard_state
        entries: tuple[Entry, ...] = state.entries
        fresh = hs == HardState() and state.snapshot is None and not entries
        if fresh and config.peers:
            # Bootstrap: every founding member writes the same ADD entries at term 1, already
            # committed, so the initial membership lives in the log like any later change.
            peers = sorted(set(config.peers))
            entries = tuple(
                Entry(1, i + 1, EntryKind.CONF_CHANGE, ConfChange(ConfChangeOp.ADD, p).encode())
                for i, p in enumerate(peers)
            )
            hs = HardState(term=1, vote=None, commit=len(entries))
            self._prev_hard_state = HardState()
        else:
            self._prev_hard_state = hs
        self._snapshot = state.snapshot
        self.log = RaftLog(state.snapshot, entries, hs.commit)
        if fresh and config.peers:
            self.log.unstable_from = 1
        self._term = hs.term
        self._vote = hs.vote
        self._role = Role.FOLLOWER
        self._voters: tuple[str, ...] = state.snapshot.voters if state.snapshot else ()
        for i in range(self.log.first_index(), self.log.committed + 1):
            self._apply_membership(self.log.entry(i))
        self._leader: str | None = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._timeout = config.election_ticks
        self._votes: dict[str, bool] = {}
        self._prs: dict[str, Progress] = {}
        self._transferee: str | None = None
        self._reads = PendingReads()
        self._reads_waiting_commit: list[tuple[bytes, str]] = []
        self._msgs: list[Message] = []
        self._read_states: list[ReadState] = []
        self._reset_timeout()

    # --- properties ----------------------------------------------------------------

    @property
    def id(self) -> str:
        return self._id

    @property
    def term(self) -> int:
        return self._term

    @property
    def role(self) -> Role:
        return self._role

    @property
    def leader_id(self) -> str | None:
        return self._leader

    @property
    def commit_index(self) -> int:
        return self.log.committed

    @property
    def applied_index(self) -> int:
        return self.log.applied

    @property
    def voters(self) -> tuple[str, ...]:
        return self._voters

    @property
    def progress(self) -> dict[str, Progress]:
        """The leader's per-follower progress (empty on other roles); read-only by convention."""
        return self._prs

    def __repr__(self) -> str:
        return (
            f"RaftNode({self._id} {self._role.value} term={self._term} leader={self._leader} "
            f"last={self.log.last_index()} commit={self.log.committed} voters={self._voters})"
        )

    # --- requests ------------------------------------------------------------------

    def tick(self) -> None:
        self._election_elapsed += 1
        if self._role is Role.LEADER:
            self._heartbeat_elapsed += 1
            for pr in self._prs.values():
                if pr.state is ProgressState.SNAPSHOT:
                    pr.snapshot_ticks += 1
                    if pr.snapshot_ticks >= self._cfg.election_ticks:
                        pr.become_probe()  # the snapshot or its answer was probably lost: probe again
            if self._election_elapsed >= self._cfg.election_ticks:
                self._election_elapsed = 0
                self._transferee = None
                if self._cfg.check_quorum and not self._quorum_active():
                    self._become_follower(self._term, None)
                    return
            if self._heartbeat_elapsed >= self._cfg.heartbeat_ticks:
                self._heartbeat_elapsed = 0
                # Carry the newest pending read's context so a lost read round still completes.
                self._broadcast_heartbeat(self._reads.last_context())
        elif self._election_elapsed >= self._timeout and self._promotable():
            self._campaign(transfer=False)

    def campaign(self) -> None:
        """Start an election now instead of after the timeout (a lone founding voter need not wait)."""
        if self._role is not Role.LEADER and self._promotable():
            self._campaign(transfer=False)

    def propose(self, data: bytes) -> int:
        """Append ``data`` as a NORMAL entry; returns its index (committed later, maybe never)."""
        return self._propose(EntryKind.NORMAL, data)

    def propose_conf_change(self, change: ConfChange) -> int:
        self._require_leader()
        if self.log.term(self.log.committed) != self._term:
            raise ProposalDropped("leader has not yet committed an entry of its own term")
        for i in range(self.log.committed + 1, self.log.last_index() + 1):
            if self.log.entry(i).kind is EntryKind.CONF_CHANGE:
                raise ProposalDropped(f"membership change at index {i} is still pending")
        if change.op is ConfChangeOp.ADD and change.node in self._voters:
            raise ProposalDropped(f"{change.node} is already a voter")
        if change.op is ConfChangeOp.REMOVE and change.node not in self._voters:
            raise ProposalDropped(f"{change.node} is not a voter")
        if change.op is ConfChangeOp.REMOVE and len(self._voters) == 1:
            raise ProposalDropped("cannot remove the last voter")
        return self._propose(EntryKind.CONF_CHANGE, change.encode())

    def transfer_leadership(self, to: str) -> None:
        """Catch ``to`` up, then tell it to campaign now. Aborted after one election timeout."""
        self._require_leader()
        if to == self._id or to == self._transferee:
            return
        if to not in self._voters:
            raise ProposalDropped(f"cannot transfer leadership to {to}: not a voter")
        self._transferee = to
        self._election_elapsed = 0
        if self._prs[to].match == self.log.last_index():
            self._send(MT.TIMEOUT_NOW, to)
        else:
            self._send_append(to)

    def read_index(self, context: bytes) -> None:
        """Request a linearizable read; a ``ReadState`` with this (unique) context follows in a
        later Ready, unless leadership changes first (then retry)."""
        if self._role is Role.LEADER:
            self._leader_read(context, self._id)
        elif self._leader is not None:
            self._send(MT.READ_INDEX, self._leader, context=context)
        else:
            raise NotLeader(None, self._id)

    def compact(self, index: int, data: bytes) -> Snapshot:
        """Record the application's snapshot ``data`` of applied index ``index`` and drop the log
        up to it. The driver persists the returned snapshot and may drop its entries <= index."""
        if not self.log.snapshot_index < index <= self.log.applied:
            raise ValueError(
                f"compact({index}): need snapshot index {self.log.snapshot_index} < index <= applied {self.log.applied}"
            )
        term = self.log.term(index)
        assert term is not None
        snap = Snapshot(index, term, self._voters_at(index), data)
        self.log.compact(index)
        self._snapshot = snap
        return snap

    # --- Ready / advance -------------------------------------------------------------

    def _hard_state(self) -> HardState:
        return HardState(self._term, self._vote, self.log.committed)

    def has_ready(self) -> bool:
        return bool(
            self._msgs
            or self._read_states
            or self.log.pending_snapshot is not None
            or self.log.unstable_from <= self.log.last_index()
            or self.log.committed > self.log.applied
            or self._hard_state() != self._prev_hard_state
        )

    def ready(self) -> Ready:
        hs = self._hard_state()
        msgs, self._msgs = self._msgs, []
        reads, self._read_states = self._read_states, []
        return Ready(
            hard_state=hs if hs != self._prev_hard_state else None,
            entries=self.log.unstable_entries(),
            snapshot=self.log.pending_snapshot,
            messages=msgs,
            committed=self.log.next_committed(),
            read_states=reads,
        )

    def advance(self, rd: Ready) -> None:
        if rd.hard_state is not None:
            self._prev_hard_state = rd.hard_state
        if rd.snapshot is not None and rd.snapshot is self.log.pending_snapshot:
            self.log.pending_snapshot = None
        if rd.entries:
            self.log.stable_to(rd.entries[-1].index, rd.entries[-1].term)
        if rd.committed:
            self.log.applied_to(rd.committed[-1].index)

    # --- step --------------------------------------------------------------------------

    def step(self, m: Message) -> None:
        if m.term > self._term:
            if m.type in (MT.VOTE, MT.PRE_VOTE) and m.context != TRANSFER_CONTEXT and self._in_lease():
                return  # we heard from a leader recently: do not let this candidate disrupt it
            if m.type is MT.PRE_VOTE or (m.type is MT.PRE_VOTE_RESP and not m.reject):
                pass  # PreVote never changes terms
            elif m.type in (MT.APPEND, MT.HEARTBEAT, MT.SNAPSHOT):
                self._become_follower(m.term, m.src)
            else:
                self._become_follower(m.term, None)
        elif m.term < self._term:
            if m.type in (MT.APPEND, MT.HEARTBEAT) and (self._cfg.check_quorum or self._cfg.pre_vote):
                self._send(MT.APPEND_RESP, m.src)  # carries our term: the stale leader steps down
            elif m.type is MT.PRE_VOTE:
                self._send(MT.PRE_VOTE_RESP, m.src, reject=True)
            return

        if m.type in (MT.VOTE, MT.PRE_VOTE):
            self._handle_vote_request(m)
        elif self._role is Role.LEADER:
            self._step_leader(m)
        elif self._role in (Role.CANDIDATE, Role.PRE_CANDIDATE):
            self._step_candidate(m)
        else:
            self._step_follower(m)

    def _handle_vote_request(self, m: Message) -> None:
        can_vote = (
            self._vote == m.src
            or (self._vote is None and self._leader is None)
            or (m.type is MT.PRE_VOTE and m.term > self._term)
        )
        resp = MT.VOTE_RESP if m.type is MT.VOTE else MT.PRE_VOTE_RESP
        if can_vote and self.log.is_up_to_date(m.index, m.log_term):
            # A granted PreVote answers at the candidate's future term so it can count it.
            self._send(resp, m.src, term=m.term)
            if m.type is MT.VOTE:
                self._vote = m.src
                self._election_elapsed = 0
        else:
            self._send(resp, m.src, reject=True)

    def _step_follower(self, m: Message) -> None:
        if m.type is MT.APPEND:
            self._hear_from_leader(m.src)
            self._handle_append(m)
        elif m.type is MT.HEARTBEAT:
            self._hear_from_leader(m.src)
            self._commit_to(m.commit)
            self._send(MT.HEARTBEAT_RESP, m.src, context=m.context)
        elif m.type is MT.SNAPSHOT:
            self._hear_from_leader(m.src)
            self._handle_snapshot(m)
        elif m.type is MT.TIMEOUT_NOW:
            if self._promotable():
                self._campaign(transfer=True)
        elif m.type is MT.READ_INDEX_RESP:
            self._read_states.append(ReadState(m.index, m.context))
        # READ_INDEX reaching a follower (the leader changed meanwhile) is dropped: the
        # requester is waiting on a context it will never see and retries.

    def _step_candidate(self, m: Message) -> None:
        if m.type in (MT.APPEND, MT.HEARTBEAT, MT.SNAPSHOT):
            self._become_follower(self._term, m.src)
            self._step_follower(m)
            return
        want = MT.PRE_VOTE_RESP if self._role is Role.PRE_CANDIDATE else MT.VOTE_RESP
        if m.type is not want:
            return
        if self._role is Role.PRE_CANDIDATE and not m.reject and m.term != self._term + 1:
            return  # a grant for some earlier pre-campaign
        self._votes[m.src] = not m.reject
        result = quorum.vote_result(self._voters, self._votes)
        if result is quorum.VoteResult.WON:
            if self._role is Role.PRE_CANDIDATE:
                self._start_election(transfer=False)
            else:
                self._become_leader()
        elif result is quorum.VoteResult.LOST:
            self._become_follower(self._term, None)

    def _step_leader(self, m: Message) -> None:
        if m.type is MT.READ_INDEX:
            self._leader_read(m.context, m.src)
            return
        pr = self._prs.get(m.src)
        if pr is None:
            return
        if m.type is MT.APPEND_RESP:
            pr.recent_active = True
            if m.reject:
                hint = self.log.find_conflict_by_term(m.reject_hint, m.log_term) if m.log_term else m.reject_hint
                if pr.maybe_decrease(m.index, hint):
                    self._send_append(m.src)
                return
            if pr.maybe_update(m.index):
                if pr.state is ProgressState.PROBE:
                    pr.become_replicate()
                elif pr.state is ProgressState.SNAPSHOT and pr.match >= pr.pending_snapshot:
                    pr.become_probe()
                    pr.become_replicate()
                if self._maybe_commit() or m.src not in self._prs:
                    return  # we stepped down, or the commit removed the follower
            if m.src == self._transferee and pr.match == self.log.last_index():
                self._send(MT.TIMEOUT_NOW, m.src)
            while pr.next <= self.log.last_index() and not pr.is_paused(self._cfg.max_inflight):
                if not self._send_append(m.src):
                    break
        elif m.type is MT.HEARTBEAT_RESP:
            pr.recent_active = True
            if pr.state is ProgressState.REPLICATE and pr.is_paused(self._cfg.max_inflight):
                pr.become_probe()  # the window is full and may all be lost: resume from match
            pr.paused = False
            if pr.match < self.log.last_index():
                self._send_append(m.src)
            if m.context:
                self._ack_read(m.context, m.src)

    # --- follower helpers ---------------------------------------------------------------

    def _hear_from_leader(self, leader: str) -> None:
        self._election_elapsed = 0
        self._leader = leader

    def _handle_append(self, m: Message) -> None:
        if m.index < self.log.committed:
            self._send(MT.APPEND_RESP, m.src, index=self.log.committed)
            return
        last_new = self.log.maybe_append(m.index, m.log_term, m.entries)
        if last_new is None:
            hint = self.log.find_conflict_by_term(min(m.index, self.log.last_index()), m.log_term)
            self._send(
                MT.APPEND_RESP,
                m.src,
                index=m.index,
                reject=True,
                reject_hint=hint,
                log_term=self.log.term(hint) or 0,
            )
            return
        self._commit_to(min(m.commit, last_new))
        self._send(MT.APPEND_RESP, m.src, index=last_new)

    def _handle_snapshot(self, m: Message) -> None:
        snap = m.snapshot
        assert snap is not None
        if snap.index <= self.log.committed:
            self._send(MT.APPEND_RESP, m.src, index=self.log.committed)
            return
        if self.log.matches(snap.index, snap.term):
            # We already have the entries: fast-forward the commit index instead.
            self._commit_to(snap.index)
        else:
            self.log.restore(snap)
            self._snapshot = snap
            self._voters = snap.voters
        self._send(MT.APPEND_RESP, m.src, index=self.log.last_index())

    # --- leader helpers -----------------------------------------------------------------

    def _require_leader(self) -> None:
        if self._role is not Role.LEADER:
            raise NotLeader(self._leader, self._id)

    def _propose(self, kind: EntryKind, data: bytes) -> int:
        self._require_leader()
        if self._transferee is not None:
            raise ProposalDropped(f"leadership transfer to {self._transferee} in progress")
        index = self._append_entry(kind, data)
        self._broadcast_append()
        return index

    def _append_entry(self, kind: EntryKind, data: bytes) -> int:
        index = self.log.last_index() + 1
        self.log.append([Entry(self._term, index, kind, data)])
        self._prs[self._id].maybe_update(index)
        self._maybe_commit()
        return index

    def _maybe_commit(self) -> bool:
        """Advance the commit index if a quorum matched an entry of this term; True if the
        leader stepped down (its own removal committed)."""
        advanced = False
        while self._role is Role.LEADER:
            match = {v: pr.match for v, pr in self._prs.items()}
            index = quorum.committed_index(self._voters, match)
            if index <= self.log.committed or self.log.term(index) != self._term:
                break
            old = self.log.committed
            self.log.commit_to(index)
            advanced = True
            self._on_commit_advanced(old)
        if advanced:
            self._broadcast_append()
            if self._id not in self._voters:
                self._become_follower(self._term, None)
                return True
            self._release_waiting_reads()
        return False

    def _send_append(self, to: str) -> bool:
        """Send the next batch (or a snapshot) to ``to``; False if nothing could be sent."""
        pr = self._prs[to]
        if pr.is_paused(self._cfg.max_inflight):
            return False
        prev = pr.next - 1
        prev_term = self.log.term(prev)
        if prev_term is None or pr.next < self.log.first_index():
            snap = self._snapshot
            if snap is None:
                return False
            pr.become_snapshot(snap.index)
            self._send(MT.SNAPSHOT, to, snapshot=snap)
            return True
        hi = min(self.log.last_index() + 1, pr.next + self._cfg.max_entries_per_message)
        entries = tuple(self.log.slice(pr.next, hi))
        self._send(MT.APPEND, to, index=prev, log_term=prev_term, entries=entries, commit=self.log.committed)
        if entries:
            pr.sent_entries(entries[-1].index)
        elif pr.state is ProgressState.PROBE:
            pr.paused = True
        return True

    def _broadcast_append(self) -> None:
        for peer in self._prs:
            if peer != self._id:
                self._send_append(peer)

    def _broadcast_heartbeat(self, context: bytes) -> None:
        for peer, pr in self._prs.items():
            if peer != self._id:
                commit = min(pr.match, self.log.committed)
                self._send(MT.HEARTBEAT, peer, commit=commit, context=context)

    def _quorum_active(self) -> bool:
        active = {v: (v == self._id or self._prs[v].recent_active) for v in self._voters if v in self._prs}
        for v, pr in self._prs.items():
            if v != self._id:
                pr.recent_active = False
        return quorum.vote_result(self._voters, active) is quorum.VoteResult.WON

    def _leader_read(self, context: bytes, requester: str) -> None:
        if self.log.term(self.log.committed) != self._term:
            self._reads_waiting_commit.append((context, requester))
            return
        if self._voters == (self._id,):
            self._answer_read(self.log.committed, context, requester)
            return
        self._reads.add(self.log.committed, context, requester, self._id)
        self._broadcast_heartbeat(context)

    def _release_waiting_reads(self) -> None:
        waiting, self._reads_waiting_commit = self._reads_waiting_commit, []
        for context, requester in waiting:
            self._leader_read(context, requester)

    def _ack_read(self, context: bytes, src: str) -> None:
        for req in self._reads.ack(context, src, self._voters):
            self._answer_read(req.index, req.context, req.requester)

    def _answer_read(self, index: int, context: bytes, requester: str) -> None:
        if requester == self._id:
            self._read_states.append(ReadState(index, context))
        else:
            self._send(MT.READ_INDEX_RESP, requester, index=index, context=context)

    # --- membership ------------------------------------------------------------------------

    def _commit_to(self, index: int) -> None:
        old = self.log.committed
        if self.log.commit_to(index):
            self._on_commit_advanced(old)

    def _on_commit_advanced(self, old_commit: int) -> None:
        """Apply membership changes committed in (old_commit, commit]."""
        for i in range(max(old_commit, self.log.snapshot_index) + 1, self.log.committed + 1):
            e = self.log.entry(i)
            if e.kind is EntryKind.CONF_CHANGE:
                self._apply_membership(e)

    def _apply_membership(self, e: Entry) -> None:
        if e.kind is not EntryKind.CONF_CHANGE:
            return
        self._voters = _changed(self._voters, ConfChange.decode(e.data))
        if self._role is Role.LEADER:
            for v in self._voters:
                if v not in self._prs:
                    self._prs[v] = Progress(self.log.last_index() + 1)
            for v in list(self._prs):
                if v not in self._voters and v != self._id:
                    del self._prs[v]
            if self._transferee is not None and self._transferee not in self._voters:
                self._transferee = None

    def _voters_at(self, index: int) -> tuple[str, ...]:
        voters = self._snapshot.voters if self._snapshot is not None else ()
        for i in range(self.log.first_index(), index + 1):
            e = self.log.entry(i)
            if e.kind is EntryKind.CONF_CHANGE:
                voters = _changed(voters, ConfChange.decode(e.data))
        return voters

    # --- roles -------------------------------------------------------------------------------

    def _promotable(self) -> bool:
        return self._id in self._voters

    def _in_lease(self) -> bool:
        return self._cfg.check_quorum and self._leader is not None and self._election_elapsed < self._cfg.election_ticks

    def _reset_timeout(self) -> None:
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._timeout = self._rng.randrange(self._cfg.election_ticks, 2 * self._cfg.election_ticks)

    def _reset(self, term: int) -> None:
        if term != self._term:
            self._term = term
            self._vote = None
        self._leader = None
        self._votes = {}
        self._prs = {}
        self._transferee = None
        self._reads.clear()
        self._reads_waiting_commit = []
        self._reset_timeout()

    def _become_follower(self, term: int, leader: str | None) -> None:
        self._reset(term)
        self._role = Role.FOLLOWER
        self._leader = leader

    def _campaign(self, *, transfer: bool) -> None:
        if self._cfg.pre_vote and not transfer:
            self._reset(self._term)
            self._role = Role.PRE_CANDIDATE
            self._request_votes(MT.PRE_VOTE, self._term + 1, b"")
        else:
            self._start_election(transfer=transfer)

    def _start_election(self, *, transfer: bool) -> None:
        self._reset(self._term + 1)
        self._role = Role.CANDIDATE
        self._vote = self._id
        self._request_votes(MT.VOTE, self._term, TRANSFER_CONTEXT if transfer else b"")

    def _request_votes(self, kind: MessageType, term: int, context: bytes) -> None:
        self._votes = {self._id: True}
        if quorum.vote_result(self._voters, self._votes) is quorum.VoteResult.WON:
            if kind is MT.PRE_VOTE:
                self._start_election(transfer=False)
            else:
                self._become_leader()
            return
        for v in self._voters:
            if v != self._id:
                self._send(
                    kind,
                    v,
                    term=term,
                    index=self.log.last_index(),
                    log_term=self.log.last_term(),
                    context=context,
                )

    def _become_leader(self) -> None:
        self._reset(self._term)
        self._role = Role.LEADER
        self._leader = self._id
        last = self.log.last_index()
        self._prs = {v: Progress(last + 1) for v in self._voters}
        self._prs.setdefault(self._id, Progress(last + 1))
        self._prs[self._id].match = last
        for pr in self._prs.values():
            pr.recent_active = True
        self._append_entry(EntryKind.NOOP, b"")
        self._broadcast_append()

    def _send(self, kind: MessageType, to: str, *, term: int | None = None, **fields: object) -> None:
        msg = Message(kind, self._id, to, self._term if term is None else term, **fields)  # type: ignore[arg-type]
        self._msgs.append(msg)


def _changed(voters: tuple[str, ...], change: ConfChange) -> tuple[str, ...]:
    if change.op is ConfChangeOp.ADD:
        return voters if change.node in voters else (*voters, change.node)
    return tuple(v for v in voters if v != change.node)
