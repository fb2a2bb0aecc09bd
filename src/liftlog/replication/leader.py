"""The partition leader's replication state: follower progress, the ISR's view, the high watermark.

Offsets follow Liftbridge: the *log end offset* (LEO) is the next offset to
write, the *high watermark* (HW) is the offset of the last committed message
(-1 when none). A follower's fetch for ``offset`` says it holds everything
below ``offset``, so its LEO is ``offset``.

Rules (seed 000, seed 003, seed 004):
- HW = min(LEO of every ISR member) - 1, and it never moves backwards while
  this replica leads. The leader's own LEO counts; so with an ISR of one,
  written is committed.
- A follower in the ISR is removed when it has not been caught up (fetched
  at or past the leader's LEO) for ``max_lag_ns``, or, when
  ``max_lag_messages`` > 0, when it is further behind than that. A follower
  outside the ISR is added back once it fetches at the leader's LEO.
- ISR changes are only *proposed* here (``ProposeIsr``); the controller
  commits them through Raft and the shell reports the committed ISR back
  with :meth:`LeaderReplica.isr_committed`. A proposal is repeated at most
  every ``retry_ns`` until the metadata reflects it. A follower whose
  admission is proposed counts for the HW from then on (KIP-497's maximal
  ISR), so that it never enters the ISR without every committed message;
  it stops counting once the metadata shows it in the ISR, or shows an ISR
  proposed later that leaves it out (then no earlier proposal can commit).
- A caught-up follower gets an empty answer and sleeps; the leader
  remembers it as *waiting* and asks the shell to notify it
  (``NotifyFollowers``) at the next append.
- The lease: a leader acknowledges (and writes) only while ``may_ack(now)``,
  i.e. before ``lease_until``. ``renewed(asked_at)`` moves it to
  ``asked_at + lease_ns``, never back. ``asked_at`` is when the shell *sent*
  the request whose answer is the evidence: a metadata read-index barrier,
  answered by a controller that confirmed its term with a quorum and counted
  the request as a sign of life, and applied here up to its index. The
  controller replaces a leader only after hearing nothing from it for the
  liveness timeout, so with ``lease_ns`` below that timeout a replaced
  leader's lease has run out before its successor is named. Follower fetches
  renew nothing: a follower that reaches us may be the very one a controller
  that cannot reach us is about to elect. Lease times are the shell's
  *monotonic* clock, not the ``now`` of the other events (a wall clock that
  can jump); ``lease_ns`` None means no lease (a leader nobody can replace).

Sans-IO: times come in as arguments (ns), effects go out as actions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "FetchAnswer",
    "FollowerProgress",
    "HighWatermark",
    "LeaderAction",
    "LeaderReplica",
    "NotifyFollowers",
    "ProposeIsr",
]


@dataclass(frozen=True, slots=True)
class HighWatermark:
    """The HW advanced to ``hw``: checkpoint it, release acks and wake readers up to it."""

    hw: int


@dataclass(frozen=True, slots=True)
class ProposeIsr:
    """Ask the controller for this ISR (the replica order of the partition is kept)."""

    isr: tuple[str, ...]
    reason: str
    #: The leader epoch it was decided in: a proposal that outlives its leadership must not be sent.
    leader_epoch: int
    #: The (replicas, ISR) it was decided against. Metadata is applied before the core hears of
    #: it, so the epoch to send is only right while the metadata still shows this membership.
    membership: tuple[tuple[str, ...], tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class NotifyFollowers:
    """New data: wake these idle followers now instead of after their idle wait."""

    replicas: tuple[str, ...]


LeaderAction = HighWatermark | ProposeIsr | NotifyFollowers


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    """How to answer one fetch: read from ``offset`` (nothing when ``empty``), piggyback ``hw``."""

    offset: int
    hw: int
    leader_epoch: int
    empty: bool
    actions: tuple[LeaderAction, ...] = ()


@dataclass(slots=True)
class FollowerProgress:
    leo: int = 0
    last_fetch: int = 0
    #: When the follower last fetched at (or past) the leader's LEO.
    caught_up_at: int = 0
    waiting: bool = False


@dataclass(slots=True)
class _Proposal:
    isr: tuple[str, ...]
    at: int


@dataclass
class LeaderReplica:
    replica_id: str
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    leader_epoch: int
    leo: int
    hw: int
    now: int
    max_lag_ns: int
    max_lag_messages: int = 0
    retry_ns: int = 1_000_000_000
    #: How long one renewal lets this leader acknowledge (None: no lease, acknowledge always).
    lease_ns: int | None = None
    #: Monotonic ns until which it may acknowledge; a new leader starts from its server's last renewal.
    lease_until: int = 0
    followers: dict[str, FollowerProgress] = field(init=False)
    _proposal: _Proposal | None = field(init=False, default=None)
    #: Followers whose admission to the ISR is proposed but not settled (KIP-497's maximal ISR), with the
    #: number of the latest proposal that admits them.
    _joining: dict[str, int] = field(init=False, default_factory=dict)
    #: Proposals sent and not yet known to be settled: (number, members).
    _sent: list[tuple[int, frozenset[str]]] = field(init=False, default_factory=list)
    _proposals: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if self.replica_id not in self.replicas:
            raise ValueError(f"{self.replica_id} is not a replica of the partition ({', '.join(self.replicas)})")
        # A new leader gives every follower a full lag window before judging it (Kafka does the same).
        self.followers = {
            r: FollowerProgress(leo=0, last_fetch=self.now, caught_up_at=self.now)
            for r in self.replicas
            if r != self.replica_id
        }

    # -- events ----------------------------------------------------------

    def appended(self, leo: int, now: int) -> list[LeaderAction]:
        """The leader wrote to its log; ``leo`` is its new log end offset."""
        self.leo = leo
        self.now = now
        actions: list[LeaderAction] = []
        waiting = tuple(r for r, p in self.followers.items() if p.waiting and p.leo < leo)
        for r in waiting:
            self.followers[r].waiting = False
        if waiting:
            actions.append(NotifyFollowers(waiting))
        actions.extend(self._advance_hw())
        return actions

    def fetch(self, follower: str, offset: int, follower_epoch: int, now: int) -> FetchAnswer:
        """A follower asks for data from ``offset`` (so it holds everything below).

        Raises ValueError for a replica that is not a follower, or an offset past the LEO
        (the follower's log diverged: it must truncate by epoch first).
        """
        progress = self.followers.get(follower)
        if progress is None:
            raise ValueError(f"{follower} is not a follower of this partition")
        if offset > self.leo:
            raise ValueError(f"fetch offset {offset} is past the log end offset {self.leo}")
        self.now = now
        progress.leo = offset
        progress.last_fetch = now
        caught_up = offset >= self.leo
        if caught_up:
            progress.caught_up_at = now
        progress.waiting = caught_up
        actions = list(self._advance_hw())
        if caught_up and follower not in self.isr and follower_epoch == self.leader_epoch:
            actions.extend(self._propose(self._with(follower), f"{follower} caught up at offset {offset}"))
        return FetchAnswer(offset, self.hw, self.leader_epoch, empty=caught_up, actions=tuple(actions))

    def tick(self, now: int) -> list[LeaderAction]:
        """Check followers' lag; propose removing those that fell behind."""
        self.now = now
        lagging = []
        for r in self.isr:
            if r == self.replica_id:
                continue
            p = self.followers[r]
            if now - p.caught_up_at > self.max_lag_ns:
                lagging.append((r, f"{r} not caught up for {(now - p.caught_up_at) // 1_000_000} ms"))
            elif self.max_lag_messages and self.leo - p.leo > self.max_lag_messages:
                lagging.append((r, f"{r} is {self.leo - p.leo} messages behind"))
        if not lagging:
            return self._retry()
        isr = tuple(r for r in self.isr if r not in {r for r, _ in lagging})
        return self._propose(isr, "; ".join(reason for _, reason in lagging))

    def isr_committed(self, isr: tuple[str, ...], now: int) -> list[LeaderAction]:
        """The controller committed ``isr`` for this partition (it may differ from what was proposed)."""
        self.now = now
        if set(isr) != set(self.isr):
            for r in set(isr) - set(self.isr):
                if r in self.followers:
                    # Just admitted: its lag window starts now, not at its last catch-up.
                    self.followers[r].caught_up_at = max(self.followers[r].caught_up_at, now)
        changed = set(isr) != set(self.isr)
        self.isr = isr
        self._settle(isr)
        if self._proposal is not None and (changed or set(self._proposal.isr) == set(isr)):
            # A proposal made against the ISR that just changed is stale: retried now, a shrink that
            # kept a follower could re-admit it after it fell behind the HW (found by the cluster
            # simulation, seed 2100). Lag checks and caught-up fetches propose afresh.
            self._proposal = None
        actions = self._advance_hw()
        waiting = tuple(r for r in self._joining if r not in self.isr and r in self.followers)
        if changed and waiting:
            # Admissions the change overtook (and may have made stale): propose them again against the
            # new ISR, so that a joiner that died meanwhile gets in and out, rather than hold the HW.
            members = set(self.isr) | set(waiting)
            isr = tuple(r for r in self.replicas if r in members)
            actions.extend(self._propose(isr, f"{', '.join(waiting)} waiting to be admitted"))
        return actions

    def _settle(self, isr: tuple[str, ...]) -> None:
        """Which proposed admissions the committed ``isr`` settles.

        A follower in it is admitted. One left out stops counting for the HW only if the committed ISR
        is a proposal made after the last one that admitted it: every ISR change is epoch-checked, so
        once a later proposal is committed, no earlier one can be. Until then an earlier admission may
        still commit (even while this leader cannot hear of it), and the follower must not miss a
        message the HW covers.
        """
        members = frozenset(isr)
        committed = max((n for n, proposed in self._sent if proposed == members), default=None)
        for r in [r for r, n in self._joining.items() if r in members or (committed is not None and committed > n)]:
            del self._joining[r]
        if committed is not None:
            self._sent = [(n, proposed) for n, proposed in self._sent if n > committed]

    def replicas_changed(self, replicas: tuple[str, ...], now: int) -> list[LeaderAction]:
        """The partition's replicas changed (a reassignment added new ones, or dropped the old ones).

        New followers start outside the ISR with nothing; they are admitted once they catch up.
        """
        if self.replica_id not in replicas:
            raise ValueError(f"{self.replica_id} is not a replica of the partition ({', '.join(replicas)})")
        self.now = now
        self.replicas = replicas
        for r in replicas:
            if r != self.replica_id and r not in self.followers:
                self.followers[r] = FollowerProgress(leo=0, last_fetch=now, caught_up_at=now)
        for r in [r for r in self.followers if r not in replicas]:
            del self.followers[r]
            self._joining.pop(r, None)
        return self._advance_hw()

    def renewed(self, asked_at: int) -> None:
        """Evidence that the controller heard from this server at or after ``asked_at`` (monotonic ns), and
        that this server has acted on every metadata change committed before then: lead until
        ``asked_at + lease_ns``."""
        if self.lease_ns is not None:
            self.lease_until = max(self.lease_until, asked_at + self.lease_ns)

    # -- queries ---------------------------------------------------------

    def may_ack(self, now: int) -> bool:
        """Whether the lease holds at ``now`` (monotonic ns): if not, write nothing and acknowledge nothing."""
        return self.lease_ns is None or now < self.lease_until

    def lease_left(self, now: int) -> int | None:
        """Nanoseconds the lease still holds at ``now`` (0 once run out; None without a lease)."""
        return None if self.lease_ns is None else max(self.lease_until - now, 0)

    def lag(self, replica: str) -> int:
        """Messages ``replica`` is behind the leader (0 for the leader)."""
        if replica == self.replica_id:
            return 0
        return self.leo - self.followers[replica].leo

    # -- helpers ---------------------------------------------------------

    def _advance_hw(self) -> list[LeaderAction]:
        # The maximal ISR: a follower whose admission is on its way counts as if it were in already.
        # Otherwise the HW could pass it while the change is in flight, and once committed it would be
        # an in-sync replica without all committed messages, electable (found by the cluster simulation).
        members = (*self.isr, *(r for r in self._joining if r not in self.isr)) if self._joining else self.isr
        leos = [self.leo if r == self.replica_id else self.followers[r].leo for r in members if r in self.replicas]
        if self.replica_id not in self.isr:
            leos.append(self.leo)  # a leader always counts itself
        hw = min(leos) - 1
        if hw > self.hw:
            self.hw = hw
            return [HighWatermark(hw)]
        return []

    def _with(self, replica: str) -> tuple[str, ...]:
        members = set(self.isr) | {replica}
        return tuple(r for r in self.replicas if r in members)

    def _propose(self, isr: tuple[str, ...], reason: str) -> list[LeaderAction]:
        p = self._proposal
        if p is not None and p.isr == isr and self.now - p.at < self.retry_ns:
            return []
        self._proposal = _Proposal(isr, self.now)
        return [self._sending(isr, reason)]

    def _sending(self, isr: tuple[str, ...], reason: str) -> ProposeIsr:
        """Record a proposal about to go out (a retry is a new one: it may carry a newer epoch)."""
        self._proposals += 1
        self._sent.append((self._proposals, frozenset(isr)))
        del self._sent[:-64]  # an unbounded history only matters to a leader nobody answers for long
        for r in isr:
            if r not in self.isr:
                self._joining[r] = self._proposals
        return ProposeIsr(isr, reason, self.leader_epoch, (self.replicas, self.isr))

    def _retry(self) -> list[LeaderAction]:
        p = self._proposal
        if p is None or self.now - p.at < self.retry_ns:
            return []
        if set(p.isr) == set(self.isr):
            self._proposal = None
            return []
        if any(r not in self.isr and self.followers[r].leo <= self.hw for r in p.isr if r in self.followers):
            # It would admit a follower that lacks committed messages (a joiner never does: it holds the HW).
            self._proposal = None
            return []
        self._proposal = _Proposal(p.isr, self.now)
        return [self._sending(p.isr, "retrying an ISR change the metadata does not show yet")]
