"""The controller's partition failover as a sans-IO core: events and time in, proposals and questions out.

Runs only on the controller (the metadata Raft leader). An election starts when
a majority of a partition's in-sync followers report its leader silent (seed
000), when liveness marks the leader's server dead, when the leader says its own
log is fenced and an in-sync replica can take over, or when this controller finds
a partition mid-election that nobody drives (the previous controller died).
Then, as seed 002 describes::

  ELECTION -> ask the live replicas for their log end offsets
           -> CANDIDATE_FOUND(best) -> the candidate confirms -> ChangeLeader (ONLINE, new leader epoch)
           -> no confirmation in time: the next candidate; none left: OFFLINE
  OFFLINE  -> retried whenever a replica that may lead is alive again

With ``unclean.leader.election`` a replica outside the ISR may take over an
offline partition; the messages it lacks are lost, and the log says which. Every
step is an epoch-checked metadata operation, so a stale step fails harmlessly.
Separately, leadership goes back to a partition's preferred replica once that
replica has been alive and in sync for ``rebalance_after_ns`` (seed 004).

The driver (``server/control/failover.py`` on a real server, the simulation in tests)
carries out the actions: :class:`Propose` goes through Raft and its result comes
back through :meth:`FailoverCore.proposed`; :class:`AskLogEnds` asks the replicas
and their answers come back through :meth:`FailoverCore.log_ends`. No clocks, no
I/O: times are arguments (ns) and the metadata is read through a callable.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .election import Candidate, Elections, LeaderReports, NoCandidate, PartitionKey, rank_candidates
from .model import ChangeLeader, Metadata, MetadataError, Operation, PartitionMeta, PartitionState, SetPartitionState
from .protocol import LeaderConfirmation, LeaderReport
from .reassignment import preferred_can_lead

__all__ = ["AskLogEnds", "FailoverAction", "FailoverCore", "Propose", "Step"]

log = logging.getLogger(__name__)


class Step(enum.Enum):
    """What a proposal is for: it says what follows once it is applied."""

    ENTER_ELECTION = "enter election"  # then ask for log end offsets
    CANDIDATE = "candidate"  # then wait for the candidate's confirmation (or its timeout)
    OFFLINE = "offline"
    HAND_OVER = "hand over"  # ChangeLeader to the confirmed candidate
    REBALANCE = "rebalance"  # ChangeLeader back to the preferred replica


@dataclass(frozen=True, slots=True)
class Propose:
    """Propose ``op`` through the metadata group; hand its result (or exception) to ``proposed``."""

    key: PartitionKey
    op: Operation
    step: Step


@dataclass(frozen=True, slots=True)
class AskLogEnds:
    """Ask each of ``replicas`` how far its log of ``key`` goes; hand the answers to ``log_ends``
    (replicas that do not answer in time are left out)."""

    key: PartitionKey
    replicas: tuple[str, ...]


FailoverAction = Propose | AskLogEnds


@dataclass(frozen=True, slots=True)
class _Busy:
    """A partition with a step under way: nothing else starts for it until the step's result is in."""

    waiting_for: Step | None  # None: the log end offsets
    leader_may_return: bool = False
    #: Logged (as a warning) once the step is applied.
    applied_note: str = ""


class FailoverCore:
    def __init__(
        self,
        metadata: Callable[[], Metadata],
        *,
        confirm_timeout_ns: int = 5_000_000_000,
        report_window_ns: int = 15_000_000_000,
        unclean_default: bool = False,
        rebalance_after_ns: int = 10_000_000_000,
    ) -> None:
        self._metadata = metadata
        self._unclean_default = unclean_default
        self._rebalance_after_ns = rebalance_after_ns
        self.reports = LeaderReports(report_window_ns)
        self.elections = Elections(confirm_timeout_ns)
        self._busy: dict[PartitionKey, _Busy] = {}
        #: When each partition's preferred replica was first seen able to lead again.
        self._eligible_since: dict[PartitionKey, int] = {}

    def busy(self, key: PartitionKey) -> bool:
        """Whether a step for ``key`` is under way (its result not yet handed back)."""
        return key in self._busy

    # -- events -----------------------------------------------------------

    def report(self, report: LeaderReport, now: int) -> list[FailoverAction]:
        """A follower says the partition's leader is silent (or the leader says its log is fenced)."""
        metadata = self._metadata()
        meta = metadata.partition(report.name, report.partition)
        if meta.state is not PartitionState.ONLINE or meta.leader != report.leader:
            return []
        if report.fenced and report.reporter == meta.leader and report.epoch == meta.epoch:
            # The leader's own log refuses writes: an in-sync replica elsewhere can take over. With none,
            # it keeps leading (readable, refusing publishes) rather than the partition going offline.
            if rank_candidates(meta, self._alive(metadata), {}):
                return self.elect(meta, f"leader {meta.leader} is fenced: {report.fenced}")
            return []
        if self.reports.report(meta, report.reporter, report.epoch, report.leader_epoch, now):
            return self.elect(meta, f"in-sync followers report leader {meta.leader} silent")
        return []

    def tick(self, now: int) -> list[FailoverAction]:
        """Start what liveness calls for, move elections whose candidate did not confirm, rebalance."""
        metadata = self._metadata()
        alive = self._alive(metadata)
        actions: list[FailoverAction] = []
        for stream in metadata.streams.values():
            for meta in stream.partitions.values():
                key = (meta.stream, meta.id)
                if key in self._busy or key in self.elections or meta.paused:
                    continue
                if meta.state is PartitionState.ONLINE and meta.leader not in alive:
                    actions += self.elect(meta, f"leader {meta.leader} is not alive")
                elif meta.state in (PartitionState.ELECTION, PartitionState.CANDIDATE_FOUND):
                    actions += self.elect(meta, "resuming an election a previous controller started")
                elif meta.state is PartitionState.OFFLINE and rank_candidates(
                    meta, alive, {}, unclean=self._unclean(meta.stream), leader_may_return=True
                ):
                    actions += self.elect(meta, "a replica that may lead the offline partition is alive")
        for key, decision in self.elections.tick(now):
            actions += self._decided(key, decision)
        if self._rebalance_after_ns:
            actions += self._rebalance(metadata, alive, now)
        return actions

    def elect(self, meta: PartitionMeta, why: str) -> list[FailoverAction]:
        """Start an election for ``meta`` (nothing if one of its steps is under way)."""
        key = (meta.stream, meta.id)
        if key in self._busy:
            return []
        log.warning("partition %s/%d: electing a new leader (%s)", meta.stream, meta.id, why)
        self.reports.forget(key)
        # An offline partition's last leader has everything committed: it may lead again if it returns.
        leader_may_return = meta.state is PartitionState.OFFLINE
        if meta.state is not PartitionState.ELECTION:
            self._busy[key] = _Busy(Step.ENTER_ELECTION, leader_may_return)
            op = SetPartitionState(meta.stream, meta.id, PartitionState.ELECTION, "", meta.epoch)
            return [Propose(key, op, Step.ENTER_ELECTION)]
        return self._ask(key, leader_may_return)

    def log_ends(self, key: PartitionKey, leos: Mapping[str, int], now: int) -> list[FailoverAction]:
        """The answers to :class:`AskLogEnds`: rank the candidates and propose the best."""
        busy = self._busy.get(key)
        if busy is None or busy.waiting_for is not None:
            return []
        del self._busy[key]
        metadata = self._metadata()
        try:
            meta = metadata.partition(*key)
        except MetadataError as exc:  # deleted meanwhile
            log.info("partition %s/%d: election abandoned: %s", key[0], key[1], exc)
            return []
        ranked = rank_candidates(
            meta,
            self._alive(metadata),
            leos,
            unclean=self._unclean(meta.stream),
            leader_may_return=busy.leader_may_return,
        )
        if ranked and ranked[0].unclean:
            behind = {c.replica: leos.get(c.replica, -1) for c in ranked}
            log.error(
                "partition %s/%d: no in-sync replica is alive; unclean election among %s (log end offsets %s); "
                "messages the old leader %s committed beyond them are lost",
                meta.stream,
                meta.id,
                ", ".join(behind),
                behind,
                meta.leader,
            )
        return self._decided(key, self.elections.begin(key, ranked, now))

    def confirm(self, confirmation: LeaderConfirmation) -> list[FailoverAction]:
        """The candidate says it is ready to lead."""
        name, pid, replica = confirmation.name, confirmation.partition, confirmation.replica
        key = (name, pid)
        meta = self._metadata().partition(name, pid)
        if meta.state is not PartitionState.CANDIDATE_FOUND or meta.candidate != replica:
            return []
        if not self.elections.confirmed(key, replica):
            return []
        unclean = replica not in meta.isr
        isr = (replica,) if unclean else tuple(r for r in meta.isr if r != meta.leader)
        note = f"partition {name}/{pid}: {replica} leads from leader epoch {meta.leader_epoch + 1}"
        # Busy until ChangeLeader applies: a tick meanwhile would find CANDIDATE_FOUND with no election
        # and start one, refused by its epoch check but logged as a new election.
        self._busy[key] = _Busy(
            Step.HAND_OVER, applied_note=note + (" (unclean: it was not in sync)" if unclean else "")
        )
        return [Propose(key, ChangeLeader(name, pid, replica, isr, meta.epoch), Step.HAND_OVER)]

    def proposed(self, action: Propose, result: object) -> list[FailoverAction]:
        """The result of a :class:`Propose`: what the operation returned, or the error it raised."""
        key = action.key
        busy = self._busy.get(key)
        if busy is not None and busy.waiting_for is action.step:
            del self._busy[key]
        if isinstance(result, BaseException):
            if action.step not in (Step.HAND_OVER, Step.REBALANCE):
                # Deleted, changed under the election, or this server stopped leading: the next tick
                # looks at the partition afresh, and the other partitions move on meanwhile.
                self.elections.abandon(key)
            log.info("partition %s/%d: %s not applied: %s", key[0], key[1], action.step.value, result)
            return []
        if action.step is Step.ENTER_ELECTION:
            assert busy is not None
            return self._ask(key, busy.leader_may_return)
        if busy is not None and busy.applied_note:
            log.warning("%s", busy.applied_note)
        return []

    # -- helpers ----------------------------------------------------------

    @staticmethod
    def _alive(metadata: Metadata) -> set[str]:
        return {s.id for s in metadata.servers.values() if s.alive}

    def _unclean(self, stream: str) -> bool:
        """The stream's unclean leader election setting, else the server's (clustering.unclean.leader.election)."""
        known = self._metadata().streams.get(stream)
        own = known.settings.unclean_leader_election if known is not None else None
        return self._unclean_default if own is None else own

    def _ask(self, key: PartitionKey, leader_may_return: bool) -> list[FailoverAction]:
        metadata = self._metadata()
        try:
            meta = metadata.partition(*key)
        except MetadataError as exc:
            log.info("partition %s/%d: election abandoned: %s", key[0], key[1], exc)
            return []
        alive = self._alive(metadata)
        self._busy[key] = _Busy(None, leader_may_return)
        return [AskLogEnds(key, tuple(r for r in meta.replicas if r in alive))]

    def _decided(self, key: PartitionKey, decision: Candidate | NoCandidate) -> list[FailoverAction]:
        try:
            meta = self._metadata().partition(*key)
        except MetadataError as exc:
            self.elections.abandon(key)
            log.info("partition %s/%d: election abandoned: %s", key[0], key[1], exc)
            return []
        if isinstance(decision, Candidate):
            step, state, candidate = Step.CANDIDATE, PartitionState.CANDIDATE_FOUND, decision.replica
        else:
            log.error("partition %s/%d is offline: %s", key[0], key[1], decision.reason)
            step, state, candidate = Step.OFFLINE, PartitionState.OFFLINE, ""
        self._busy[key] = _Busy(step)
        return [Propose(key, SetPartitionState(meta.stream, meta.id, state, candidate, meta.epoch), step)]

    def _rebalance(self, metadata: Metadata, alive: set[str], now: int) -> list[FailoverAction]:
        """Give leadership back to preferred replicas (seed 004), one partition per round.

        A preferred replica must have been alive and in sync for ``rebalance_after_ns`` first, so a
        server that flaps does not drag leaderships back and forth.
        """
        eligible: dict[PartitionKey, int] = {}
        chosen: PartitionMeta | None = None
        for stream in metadata.streams.values():
            for meta in stream.partitions.values():
                key = (meta.stream, meta.id)
                if not preferred_can_lead(meta, alive) or key in self._busy:
                    continue
                since = eligible[key] = self._eligible_since.get(key, now)
                if chosen is None and now - since >= self._rebalance_after_ns:
                    chosen = meta
        self._eligible_since = eligible
        if chosen is None:
            return []
        key = (chosen.stream, chosen.id)
        self._eligible_since.pop(key, None)
        preferred = chosen.replicas[0]
        note = (
            f"partition {key[0]}/{key[1]}: leadership back to its preferred replica {preferred} (from {chosen.leader})"
        )
        self._busy[key] = _Busy(Step.REBALANCE, applied_note=note)
        op = ChangeLeader(chosen.stream, chosen.id, preferred, tuple(chosen.isr), chosen.epoch)
        return [Propose(key, op, Step.REBALANCE)]
