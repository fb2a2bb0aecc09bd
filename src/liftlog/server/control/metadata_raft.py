"""The asyncio shell around the Raft core for the metadata group: clock, NATS, disk, state machine.

One task owns the ``RaftNode``. Ticks, incoming messages and proposals are
queued to it; after each batch it drains ``Ready``s in the order the core
demands: persist (fsync, in a worker thread), then publish messages, apply
committed entries to the state machine, resolve proposals, ``advance``, and
compact into a snapshot every ``snapshot_threshold`` applied entries.

Transport: each server subscribes to ``<namespace>.raft.metadata.<id>`` and a
message for server X is published to X's subject. Raft tolerates loss, so no
replies are involved at this level.

A proposal resolves when the entry at its index is applied: with the state
machine's result if the entry is ours (same term), with ProposalDropped if
another leader's entry took that index.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from liftlog.histogram import Histogram
from liftlog.raft import (
    ConfChange,
    ConfChangeOp,
    EntryKind,
    MessageType,
    NotLeader,
    PersistedState,
    ProposalDropped,
    RaftConfig,
    RaftNode,
    Ready,
    Role,
)
from liftlog.raft.codec import CodecError, decode_message, encode_message
from liftlog.raft.disk import DiskStorage
from liftlog.server.changes import Changes
from liftlog.server.clock import SYSTEM_CLOCK, Clock
from liftlog.server.nats.nats_types import NatsClient, NatsMessage, NatsSubscription
from liftlog.server.ratelimit import LogLimiter

__all__ = ["MetadataRaft", "RaftSettings", "StateMachine"]

log = logging.getLogger(__name__)
#: Per-message warnings: whoever can publish on our subjects must not be able to flood the log.
_warn = LogLimiter(log)


class StateMachine(Protocol):
    def apply(self, index: int, data: bytes) -> object:
        """Apply one committed NORMAL entry; the returned value (or exception instance) goes to its proposer."""

    def applied_membership(self, index: int, voters: tuple[str, ...]) -> None:
        """A membership change (or a NOOP) was applied at ``index``."""

    def snapshot(self) -> bytes: ...

    def restore(self, index: int, data: bytes) -> None: ...

    def role_changed(self, role: Role, leader: str | None, term: int) -> None: ...


@dataclass(frozen=True, slots=True)
class RaftSettings:
    tick_seconds: float = 0.1
    election_ticks: int = 10
    snapshot_threshold: int = 8192
    snapshot_retain: int = 2
    fsync: bool = True


@dataclass(slots=True)
class _Pending:
    term: int
    future: asyncio.Future[tuple[int, object]]


class RaftStats:
    """What metrics report of the group's history as this server saw it."""

    __slots__ = ("_leaderless_since", "_seen_leader", "elections", "leader_changes", "leaderless")

    def __init__(self) -> None:
        #: Elections this server started (it became a candidate; pre-votes that failed are not counted).
        self.elections = 0
        #: Times this server learnt of a new leader (itself included).
        self.leader_changes = 0
        #: Seconds from losing sight of a leader to knowing the next one, per such gap: the controller's
        #: unavailability as this server lived it.
        self.leaderless = Histogram()
        self._leaderless_since: float | None = None
        self._seen_leader = False  # the wait for the first leader at start is no failover

    def changed(
        self, before: tuple[Role, str | None, int] | None, after: tuple[Role, str | None, int], now: float
    ) -> None:
        role, leader, _term = after
        if role is Role.CANDIDATE and (before is None or before[0] is not Role.CANDIDATE or before[2] != after[2]):
            self.elections += 1
        if leader is None:
            if self._leaderless_since is None:
                self._leaderless_since = now
        elif before is None or before[1] != leader:
            self.leader_changes += 1
            if self._leaderless_since is not None and self._seen_leader:
                self.leaderless.observe(now - self._leaderless_since)
            self._leaderless_since = None
            self._seen_leader = True


class MetadataRaft:
    def __init__(
        self,
        *,
        server_id: str,
        directory: Path,
        namespace: str,
        settings: RaftSettings,
        state_machine: StateMachine,
        bootstrap_peers: tuple[str, ...] = (),
        rng: random.Random | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        on_read_request: Callable[[str], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.server_id = server_id
        self._clock = clock
        #: Told the sender of every read-index request that reaches this server (a sign of life, when it
        #: leads: the senders' leader leases count on the controller treating it as one).
        self._on_read_request = on_read_request
        self._dir = directory
        self._prefix = f"{namespace}.raft.metadata."
        self._settings = settings
        self._sm = state_machine
        self._peers = bootstrap_peers
        self._rng = rng or random.Random()
        self._nats: NatsClient
        self._storage: DiskStorage | None = None
        self.node: RaftNode | None = None
        self._inbox: asyncio.Queue[Callable[[RaftNode], None]] = asyncio.Queue()
        #: Notified after each round of Raft work: applied index, leader and voters may have changed.
        self.changes = Changes()
        self._pending: dict[int, _Pending] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._sub: NatsSubscription | None = None
        self._role: tuple[Role, str | None, int] | None = None
        self._snapshot_index = 0
        self.failed: BaseException | None = None
        self._on_failure = on_failure
        self._reads: dict[bytes, asyncio.Future[int]] = {}
        self._read_seq = 0
        self.stats = RaftStats()

    # -- lifecycle -------------------------------------------------------

    async def start(self, nats: NatsClient) -> None:
        self._nats = nats
        self._storage = await asyncio.to_thread(
            DiskStorage.open, self._dir, fsync=self._settings.fsync, retain_snapshots=self._settings.snapshot_retain
        )
        state: PersistedState = self._storage.state()
        if state.snapshot is not None:
            self._sm.restore(state.snapshot.index, state.snapshot.data)
            self._snapshot_index = state.snapshot.index
        config = RaftConfig(election_ticks=self._settings.election_ticks, peers=self._peers)
        self.node = RaftNode(self.server_id, config, state=state, rng=self._rng)
        if self.node.voters == (self.server_id,):
            self.node.campaign()  # alone: no one to wait for
        self._sub = await nats.subscribe(self._prefix + self.server_id, cb=self._on_message)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._run(), name="raft-metadata"),
            loop.create_task(self._tick(), name="raft-metadata-tick"),
        ]
        self._inbox.put_nowait(lambda node: None)  # process the bootstrap / replayed entries at once

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(ProposalDropped("the server is shutting down"))
        self._pending.clear()
        if self._storage is not None:
            self._storage.close()
            self._storage = None

    # -- state -----------------------------------------------------------

    @property
    def leader_id(self) -> str | None:
        return self.node.leader_id if self.node else None

    @property
    def is_leader(self) -> bool:
        return self.node is not None and self.node.role is Role.LEADER

    # -- requests --------------------------------------------------------

    async def propose(self, data: bytes) -> tuple[int, object]:
        """Replicate ``data``; returns its index and the state machine's result once applied here.

        Raises NotLeader when this server is not the leader, ProposalDropped when the entry was lost.
        """
        return await self._submit(lambda node: node.propose(data))

    async def add_voter(self, server_id: str) -> None:
        """Propose ``ADD server_id``; returns once committed and applied here."""
        await self._submit(lambda node: node.propose_conf_change(ConfChange(ConfChangeOp.ADD, server_id)))

    async def remove_voter(self, server_id: str) -> None:
        """Propose ``REMOVE server_id`` (a decommissioned server); returns once committed and applied here."""
        await self._submit(lambda node: node.propose_conf_change(ConfChange(ConfChangeOp.REMOVE, server_id)))

    async def _submit(self, append: Callable[[RaftNode], int]) -> tuple[int, object]:
        """Run ``append`` (a proposal returning its index) in the loop; resolve when that index applies."""
        future: asyncio.Future[tuple[int, object]] = asyncio.get_running_loop().create_future()

        def do(node: RaftNode) -> None:
            try:
                index = append(node)
            except Exception as exc:
                future.set_exception(exc)
                return
            self._pending[index] = _Pending(node.term, future)

        self._inbox.put_nowait(do)
        return await future

    async def read_barrier(self, timeout: float) -> int:
        """Wait until this server has applied everything the group had committed when we asked (read index).

        Raises NotLeader when no leader is known, TimeoutError when the leader did not answer in time.
        """
        loop = asyncio.get_running_loop()
        self._read_seq += 1
        context = f"{self.server_id}:{self._read_seq}".encode()
        future: asyncio.Future[int] = loop.create_future()

        def do(node: RaftNode) -> None:
            try:
                node.read_index(context)
            except Exception as exc:
                future.set_exception(exc)
                return
            self._reads[context] = future

        self._inbox.put_nowait(do)
        try:
            index = await asyncio.wait_for(future, timeout)
        finally:
            self._reads.pop(context, None)
        if not await self.changes.until(lambda: self.node is None or self.node.applied_index >= index, timeout):
            raise TimeoutError(f"applying the metadata log up to index {index} took more than {timeout} s")
        return index

    def transfer_leadership(self, to: str) -> None:
        self._inbox.put_nowait(lambda node: node.transfer_leadership(to))

    def best_successor(self) -> str | None:
        """The most caught-up other voter, when this server leads."""
        node = self.node
        if node is None or node.role is not Role.LEADER:
            return None
        others = [(pr.match, peer) for peer, pr in node.progress.items() if peer != self.server_id]
        return max(others)[1] if others else None

    # -- the loop --------------------------------------------------------

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self._settings.tick_seconds)
            self._inbox.put_nowait(RaftNode.tick)

    async def _on_message(self, msg: NatsMessage) -> None:
        try:
            message = decode_message(msg.data)
        except CodecError as exc:
            _warn.warning("dropping a malformed Raft message on %s: %s", msg.subject, exc)
            return
        if message.type is MessageType.READ_INDEX and self._on_read_request is not None:
            self._on_read_request(message.src)
        self._inbox.put_nowait(lambda node: node.step(message))

    async def _run(self) -> None:
        node = self.node
        assert node is not None
        try:
            while True:
                work = [await self._inbox.get()]
                while not self._inbox.empty():
                    work.append(self._inbox.get_nowait())
                for job in work:
                    # e.g. a transfer request that arrived after we lost leadership
                    with contextlib.suppress(NotLeader, ProposalDropped):
                        job(node)
                while node.has_ready():
                    await self._handle(node, node.ready())
                self._report_role(node)
                self.changes.notify()  # applied index, leader, voters
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            # A failed fsync or a broken state machine: this server must not go on voting.
            self.failed = exc
            log.critical("the metadata Raft loop stopped: %s", exc, exc_info=True)
            if self._on_failure is not None:
                self._on_failure(exc)
            raise

    async def _handle(self, node: RaftNode, rd: Ready) -> None:
        storage = self._storage
        assert storage is not None
        if rd.snapshot is not None or rd.entries or rd.hard_state is not None:
            await asyncio.to_thread(storage.save, rd)
        if log.isEnabledFor(logging.DEBUG):  # logging.raft
            _log_ready(rd)
        for m in rd.messages:
            try:
                await self._nats.publish(self._prefix + m.dst, encode_message(m))
            except Exception as exc:  # NATS closed or reconnecting: Raft copes with lost messages
                log.debug("Raft message to %s not sent: %s", m.dst, exc)
        if rd.snapshot is not None:
            log.info("installing the leader's metadata snapshot at index %d", rd.snapshot.index)
            self._sm.restore(rd.snapshot.index, rd.snapshot.data)
            self._snapshot_index = rd.snapshot.index
            for index in [i for i in self._pending if i <= rd.snapshot.index]:
                self._resolve(index, None, ProposalDropped("replaced by a snapshot from the leader; retry"))
        for entry in rd.committed:
            result: object = None
            if entry.kind is EntryKind.NORMAL:
                result = self._sm.apply(entry.index, entry.data)
            else:
                self._sm.applied_membership(entry.index, node.voters)
            pending = self._pending.get(entry.index)
            if pending is not None:
                if pending.term == entry.term:
                    self._resolve(entry.index, result, None)
                else:
                    self._resolve(entry.index, None, ProposalDropped("a new leader overwrote the proposal; retry"))
        for rs in rd.read_states:
            waiter = self._reads.pop(rs.context, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(rs.index)
        node.advance(rd)
        applied = node.applied_index
        if applied - self._snapshot_index >= self._settings.snapshot_threshold:
            snap = node.compact(applied, self._sm.snapshot())
            await asyncio.to_thread(storage.compact, snap)
            self._snapshot_index = applied
            log.info("metadata snapshot at index %d (%d bytes)", applied, len(snap.data))

    def _resolve(self, index: int, result: object, error: BaseException | None) -> None:
        pending = self._pending.pop(index)
        if pending.future.done():
            return
        if error is not None:
            pending.future.set_exception(error)
        else:
            pending.future.set_result((index, result))

    def _report_role(self, node: RaftNode) -> None:
        now = (node.role, node.leader_id, node.term)
        if now != self._role:
            self.stats.changed(self._role, now, self._clock.monotonic())
            self._role = now
            self._sm.role_changed(*now)


def _log_ready(rd: Ready) -> None:
    """What one Raft step decided: its new term and vote, what it appends and commits, what it sends."""
    if rd.hard_state is not None:
        log.debug("raft: term %d, vote %s, commit %d", rd.hard_state.term, rd.hard_state.vote, rd.hard_state.commit)
    if rd.entries:
        log.debug("raft: appending entries %d..%d", rd.entries[0].index, rd.entries[-1].index)
    if rd.committed:
        log.debug("raft: applying entries %d..%d", rd.committed[0].index, rd.committed[-1].index)
    for m in rd.messages:
        log.debug(
            "raft: %s to %s (term %d, index %d, %d entries, commit %d%s)",
            m.type.value,
            m.dst,
            m.term,
            m.index,
            len(m.entries),
            m.commit,
            ", rejected" if m.reject else "",
        )
