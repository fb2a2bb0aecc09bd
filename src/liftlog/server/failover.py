"""The controller's partition failover: when to elect, whom, and walking the election to its end.

Runs only on the controller (``MetadataService`` creates it when this server
becomes the metadata leader). An election starts when a majority of a
partition's in-sync followers report its leader silent (seed 000), or when
the liveness tracking marks the leader's server dead, or when this
controller finds a partition mid-election that no one is driving (the
previous controller died). Then, as seed 002 describes:

  ELECTION -> ask the live candidates for their log end offsets
           -> CANDIDATE_FOUND(best) -> the candidate confirms -> ChangeLeader (ONLINE, new leader epoch)
           -> no confirmation in time: the next candidate; none left: OFFLINE
  OFFLINE  -> retried whenever a candidate's server is alive again

With ``unclean.leader.election`` a replica outside the ISR may take over an
offline partition; the messages it lacks are lost, and the log says which.
Every step is an epoch-checked metadata operation, so a stale step fails
harmlessly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from liftlog.metadata import (
    ChangeLeader,
    Metadata,
    MetadataError,
    Operation,
    PartitionMeta,
    PartitionState,
    SetPartitionState,
)
from liftlog.metadata.election import Candidate, Elections, LeaderReports, NoCandidate, PartitionKey, rank_candidates
from liftlog.metadata.protocol import (
    LeaderConfirmation,
    LeaderReport,
    LogEndQuery,
    decode_log_end,
    encode_log_end_query,
)

from .nats_types import NatsClient

__all__ = ["Failover"]

log = logging.getLogger(__name__)

Propose = Callable[[Operation], Awaitable[object]]


class Failover:
    def __init__(
        self,
        *,
        metadata: Callable[[], Metadata],
        propose: Propose,
        nats: NatsClient,
        prefix: str,
        clock: Callable[[], int],
        confirm_timeout_ns: int = 5_000_000_000,
        report_window_ns: int = 15_000_000_000,
        unclean_default: bool = False,
        rebalance_after_ns: int = 10_000_000_000,
    ) -> None:
        self._metadata = metadata
        self._propose = propose
        self._nats = nats
        self._prefix = prefix
        self._clock = clock
        self._unclean_default = unclean_default
        self.reports = LeaderReports(report_window_ns)
        self.elections = Elections(confirm_timeout_ns)
        self._busy: set[PartitionKey] = set()
        self._rebalance_after_ns = rebalance_after_ns
        #: When each partition's preferred replica was first seen able to lead again.
        self._eligible_since: dict[PartitionKey, int] = {}

    def _unclean(self, stream: str) -> bool:
        """The stream's unclean leader election setting, else the server's (clustering.unclean.leader.election)."""
        known = self._metadata().streams.get(stream)
        own = known.settings.unclean_leader_election if known is not None else None
        return self._unclean_default if own is None else own

    # -- triggers ---------------------------------------------------------

    async def report(self, report: LeaderReport) -> None:
        """A follower says the partition's leader is silent (or the leader says its log is fenced)."""
        meta = self._metadata().partition(report.name, report.partition)
        if meta.state is not PartitionState.ONLINE or meta.leader != report.leader:
            return
        if report.fenced and report.reporter == meta.leader and report.epoch == meta.epoch:
            # The leader's own log refuses writes: an in-sync replica elsewhere can take over. With none,
            # it keeps leading (readable, refusing publishes) rather than the partition going offline.
            alive = {s.id for s in self._metadata().servers.values() if s.alive}
            if rank_candidates(meta, alive, {}):
                await self.elect(meta, f"leader {meta.leader} is fenced: {report.fenced}")
            return
        enough = self.reports.report(meta, report.reporter, report.epoch, report.leader_epoch, self._clock())
        if enough:
            await self.elect(meta, f"in-sync followers report leader {meta.leader} silent")

    async def tick(self) -> None:
        """Start what liveness calls for, and move elections whose candidate did not confirm."""
        metadata = self._metadata()
        alive = {s.id for s in metadata.servers.values() if s.alive}
        for stream in list(metadata.streams.values()):
            for meta in list(stream.partitions.values()):
                key = (meta.stream, meta.id)
                if key in self._busy or key in self.elections or meta.paused:
                    continue
                if meta.state is PartitionState.ONLINE and meta.leader not in alive:
                    await self.elect(meta, f"leader {meta.leader} is not alive")
                elif meta.state in (PartitionState.ELECTION, PartitionState.CANDIDATE_FOUND):
                    await self.elect(meta, "resuming an election a previous controller started")
                elif meta.state is PartitionState.OFFLINE and rank_candidates(
                    meta, alive, {}, unclean=self._unclean(meta.stream), leader_may_return=True
                ):
                    await self.elect(meta, "a replica that may lead the offline partition is alive")
        for key, decision in self.elections.tick(self._clock()):
            try:
                await self._decided(key, decision)
            except MetadataError as exc:  # deleted or changed meanwhile: the other partitions still move on
                self.elections.abandon(key)
                log.info("partition %s/%d: election step not applied: %s", key[0], key[1], exc)
        if self._rebalance_after_ns:
            await self._rebalance(metadata, alive)

    async def _rebalance(self, metadata: Metadata, alive: set[str]) -> None:
        """Give leadership back to preferred replicas (seed 004), one partition per round.

        A preferred replica must have been alive and in sync for ``rebalance_after_ns`` first, so a
        server that flaps does not drag leaderships back and forth.
        """
        now = self._clock()
        eligible: dict[PartitionKey, int] = {}
        chosen: PartitionMeta | None = None
        for stream in metadata.streams.values():
            for meta in stream.partitions.values():
                key = (meta.stream, meta.id)
                preferred = meta.replicas[0]
                if (
                    meta.state is not PartitionState.ONLINE
                    or meta.paused
                    or meta.leader == preferred
                    or preferred not in alive
                    or preferred not in meta.isr
                    or key in self._busy
                ):
                    continue
                since = eligible[key] = self._eligible_since.get(key, now)
                if chosen is None and now - since >= self._rebalance_after_ns:
                    chosen = meta
        self._eligible_since = eligible
        if chosen is None:
            return
        key = (chosen.stream, chosen.id)
        self._eligible_since.pop(key, None)
        previous = chosen.leader  # the operation changes ``chosen`` in place when it applies
        result = await self._propose(
            ChangeLeader(chosen.stream, chosen.id, chosen.replicas[0], tuple(chosen.isr), chosen.epoch)
        )
        if not isinstance(result, MetadataError):
            log.info(
                "partition %s/%d: leadership back to its preferred replica %s (from %s)",
                chosen.stream,
                chosen.id,
                chosen.replicas[0],
                previous,
            )

    # -- the election -------------------------------------------------------

    async def elect(self, meta: PartitionMeta, why: str) -> None:
        key = (meta.stream, meta.id)
        # An offline partition's last leader has everything committed: it may lead again if it returns.
        leader_may_return = meta.state is PartitionState.OFFLINE
        if key in self._busy:
            return
        self._busy.add(key)
        try:
            log.warning("partition %s/%d: electing a new leader (%s)", meta.stream, meta.id, why)
            self.reports.forget(key)
            if meta.state is not PartitionState.ELECTION:
                await self._step(meta, PartitionState.ELECTION, "")
            meta = self._metadata().partition(meta.stream, meta.id)
            alive = {s.id for s in self._metadata().servers.values() if s.alive}
            leos = await self._log_end_offsets(meta, alive)
            ranked = rank_candidates(
                meta, alive, leos, unclean=self._unclean(meta.stream), leader_may_return=leader_may_return
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
            await self._decided(key, self.elections.begin(key, ranked, self._clock()))
        except MetadataError as exc:
            self.elections.abandon(key)
            log.info("partition %s/%d: election step not applied: %s", meta.stream, meta.id, exc)
        finally:
            self._busy.discard(key)

    async def confirm(self, confirmation: LeaderConfirmation) -> None:
        """The candidate says it is ready to lead."""
        name, pid, replica = confirmation.name, confirmation.partition, confirmation.replica
        key = (name, pid)
        meta = self._metadata().partition(name, pid)
        if meta.state is not PartitionState.CANDIDATE_FOUND or meta.candidate != replica:
            return
        if not self.elections.confirmed(key, replica):
            return
        unclean = replica not in meta.isr
        isr = (replica,) if unclean else tuple(r for r in meta.isr if r != meta.leader)
        epoch = meta.leader_epoch + 1  # read before the operation changes ``meta`` in place
        # Busy until ChangeLeader applies: a tick meanwhile would find CANDIDATE_FOUND with no election
        # and start one, refused by its epoch check but logged as a new election.
        self._busy.add(key)
        try:
            result = await self._propose(ChangeLeader(name, pid, replica, isr, meta.epoch))
        finally:
            self._busy.discard(key)
        if isinstance(result, MetadataError):
            log.info("partition %s/%d: handing over to %s not applied: %s", name, pid, replica, result)
            return
        log.warning(
            "partition %s/%d: %s leads from leader epoch %d%s",
            name,
            pid,
            replica,
            epoch,
            " (unclean: it was not in sync)" if unclean else "",
        )

    async def _decided(self, key: PartitionKey, decision: Candidate | NoCandidate) -> None:
        meta = self._metadata().partition(*key)
        if isinstance(decision, Candidate):
            await self._step(meta, PartitionState.CANDIDATE_FOUND, decision.replica)
        else:
            log.error("partition %s/%d is offline: %s", key[0], key[1], decision.reason)
            await self._step(meta, PartitionState.OFFLINE, "")

    async def _step(self, meta: PartitionMeta, state: PartitionState, candidate: str) -> None:
        result = await self._propose(SetPartitionState(meta.stream, meta.id, state, candidate, meta.epoch))
        if isinstance(result, MetadataError):
            raise result

    async def _log_end_offsets(self, meta: PartitionMeta, alive: set[str]) -> dict[str, int]:
        """Ask each live replica how far its log goes; silent ones are left out."""

        async def ask(replica: str) -> tuple[str, int] | None:
            try:
                reply = await self._nats.request(
                    f"{self._prefix}{replica}.leo", encode_log_end_query(LogEndQuery(meta.stream, meta.id)), timeout=1.0
                )
                return replica, decode_log_end(reply.data).leo
            except Exception:
                return None

        asked = [r for r in meta.replicas if r in alive]
        answers = await asyncio.gather(*(ask(r) for r in asked))
        return dict(a for a in answers if a is not None)
