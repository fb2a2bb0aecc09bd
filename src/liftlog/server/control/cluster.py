"""The metadata service: the replicated metadata, the controller's duties and request forwarding.

Every server runs one. It is the metadata Raft group's state machine (apply
operations, snapshot, restore) and tells the StreamManager to follow each
change. Changes requested on any server go to the controller, the Raft
leader:

    API call -> request(...) -> this server leads?  -> _lead(): plan, propose, wait for commit
                                 else NATS request  -> <ns>.raft.metadata.<leader>.propose -> _lead() there
             -> the leader waits until every affected server reconciled the change
             -> this server waits until it reconciled it too, then answers

NATS subjects under ``<namespace>.raft.metadata.``: ``<id>`` (Raft messages,
see MetadataRaft), ``<id>.propose`` and ``<id>.applied`` (request/reply to one
server), ``join`` (answered by the leader: add me as a voter) and ``heartbeat``
(every server says it is alive; the controller records liveness).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from liftlog.metadata import (
    InvalidStreamError,
    Metadata,
    MetadataError,
    NoSuchGroupError,
    NoSuchPartitionError,
    NoSuchStreamError,
    PartitionMeta,
    RefusedError,
    StreamExistsError,
)
from liftlog.metadata.activity import apply_entry
from liftlog.metadata.codec import decode_operation, decode_snapshot, encode_operation, encode_snapshot
from liftlog.metadata.controller import (
    CreateStreamRequest,
    LivenessTracker,
    plan_create_stream,
)
from liftlog.metadata.limits import StreamLimits
from liftlog.metadata.model import (
    AddPolicy,
    Operation,
    Policy,
    RegisterServer,
    RemoveServer,
    RevokePolicy,
    ServerMeta,
)
from liftlog.metadata.planning import ChangePlanner
from liftlog.metadata.protocol import (
    Applied,
    AppliedQuery,
    Committed,
    ControlRequest,
    CreateStreamChange,
    DecommissionChange,
    DeleteStreamChange,
    GroupCoordinatorReport,
    GroupJoinChange,
    GroupLeaveChange,
    Heartbeat,
    IsrChange,
    JoinAnswer,
    JoinRequest,
    LeaderConfirmation,
    LeaderReport,
    LogEnd,
    PartitionMove,
    PauseChange,
    PolicyChange,
    PreferredLeadersChange,
    ProtocolError,
    ReadonlyChange,
    ReassignChange,
    Refusal,
    RefusalKind,
    ServerRegistration,
    decode_applied,
    decode_applied_query,
    decode_heartbeat,
    decode_join,
    decode_join_answer,
    decode_log_end_query,
    decode_reply,
    decode_request,
    encode_applied,
    encode_applied_query,
    encode_heartbeat,
    encode_join,
    encode_join_answer,
    encode_log_end,
    encode_reply,
    encode_request,
)
from liftlog.metadata.reassignment import (
    departures,
    reassignment_steps,
)
from liftlog.raft import NotLeader, ProposalDropped, Role
from liftlog.server.clock import SYSTEM_CLOCK, Clock
from liftlog.server.control.activity import ActivityPublisher, ActivitySettings
from liftlog.server.control.failover import Failover
from liftlog.server.control.metadata_raft import MetadataRaft, RaftSettings
from liftlog.server.nats.nats_types import NatsClient, NatsMessage, NatsSubscription
from liftlog.server.partitions.acks import AckRouter
from liftlog.server.partitions.streams import StreamManager
from liftlog.server.ratelimit import LogLimiter

__all__ = [
    "ChangeNotAppliedError",
    "ChangeOutcomeUnknownError",
    "ControllerFailedError",
    "MetadataService",
    "NoMetadataLeaderError",
]

T = TypeVar("T")

log = logging.getLogger(__name__)
#: Per-message warnings: whoever can publish on our subjects must not be able to flood the log.
_warn = LogLimiter(log)

NO_LEADER_MESSAGE = "no known metadata leader"
#: How long a change waits for a leader to appear, and for the leader to answer.
CHANGE_TIMEOUT_S = 5.0
#: How long the controller waits for an affected server to act on a change.
APPLY_WAIT_S = 5.0


class NoMetadataLeaderError(MetadataError):
    """No controller could take the change within the timeout: nothing was committed (see ``detail``).

    The message starts with Liftbridge's wording, which its clients know.
    """

    def __init__(self, detail: str = "") -> None:
        self.detail = detail
        super().__init__(f"{NO_LEADER_MESSAGE}: {detail}" if detail else NO_LEADER_MESSAGE)


class ChangeNotAppliedError(MetadataError):
    """The change is committed, but this server has not acted on it within the timeout.

    It will take effect: repeating the request would only meet its own result (a stream that exists).
    """

    def __init__(self, what: str, index: int, server_id: str, timeout: float, check: str) -> None:
        self.index = index
        super().__init__(
            f"{what} is committed (metadata index {index}) and will take effect, but server {server_id} has not "
            f"acted on it within {timeout:.3g} s (it may be busy opening or closing partitions); do not repeat "
            f"the request: retry reads in a moment, or check with {check}"
        )


class ChangeOutcomeUnknownError(MetadataError):
    """The controller took the change but could not say within the timeout whether it is committed."""

    @classmethod
    def of(cls, what: str, cause: str, check: str) -> ChangeOutcomeUnknownError:
        return cls(f"{what} may or may not take effect: {cause}; check with {check} before repeating it")


class ControllerFailedError(MetadataError):
    """The controller failed on the change for a reason of its own (a bug, a broken disk), not the request's."""


def _describe(change: ControlRequest) -> tuple[str, str]:
    """What a change does, for people, and the command that shows whether it happened."""
    match change:
        case CreateStreamChange(req):
            name, what = req.name, "creating stream"
        case DeleteStreamChange(name):
            what = "deleting stream"
        case PauseChange(name, _, pause, _):
            what = "pausing stream" if pause else "resuming stream"
        case ReadonlyChange(name):
            what = "changing the readonly flag of stream"
        case IsrChange(name, partition):
            return f"changing the ISR of stream {name!r} partition {partition}", f"`liftlog stream describe {name}`"
        case ServerRegistration(server):
            return f"registering server {server.id}", "`liftlog cluster status`"
        case LeaderReport(name, partition) | LeaderConfirmation(name, partition):
            return f"an election step of stream {name!r} partition {partition}", f"`liftlog stream describe {name}`"
        case ReassignChange():
            return "a reassignment", "`liftlog cluster reassignments`"
        case DecommissionChange(server):
            return f"decommissioning server {server}", "`liftlog cluster status`"
        case PreferredLeadersChange():
            return "electing preferred leaders", "`liftlog cluster status`"
        case PolicyChange(subject, resource, action, add):
            verb = "adding" if add else "revoking"
            return f"{verb} the policy {subject}, {resource}, {action}", "`liftlog acl list`"
        case GroupJoinChange(group, consumer) | GroupLeaveChange(group, consumer):
            verb = "joining" if isinstance(change, GroupJoinChange) else "leaving"
            return f"{consumer} {verb} consumer group {group!r}", f"`liftlog group describe {group}`"
        case GroupCoordinatorReport(group):
            return f"a coordinator report of consumer group {group!r}", f"`liftlog group describe {group}`"
    return f"{what} {name!r}", f"`liftlog stream describe {name}`"


class _NotLeaderReply(Exception):
    """The server asked to lead a change is not (or no longer) the leader."""


def _refusal_of(exc: MetadataError) -> Refusal:
    match exc:
        case StreamExistsError():
            return Refusal(RefusalKind.STREAM_EXISTS, name=exc.name)
        case NoSuchStreamError():
            return Refusal(RefusalKind.NO_SUCH_STREAM, name=exc.name)
        case NoSuchPartitionError():
            return Refusal(RefusalKind.NO_SUCH_PARTITION, name=exc.name, partition=exc.partition)
        case NoSuchGroupError():
            return Refusal(RefusalKind.NO_SUCH_GROUP, name=exc.group)
        case InvalidStreamError():
            return Refusal(RefusalKind.INVALID, message=str(exc))
        case RefusedError():
            return Refusal(RefusalKind.REFUSED, message=str(exc))
        case NoMetadataLeaderError():
            return Refusal(RefusalKind.NO_LEADER)
        case ChangeOutcomeUnknownError():
            return Refusal(RefusalKind.OUTCOME_UNKNOWN, message=str(exc))
        case ControllerFailedError():
            return Refusal(RefusalKind.FAILED, message=str(exc))
    return Refusal(RefusalKind.OTHER, message=str(exc))


def _error_of(refusal: Refusal) -> MetadataError:
    match refusal.kind:
        case RefusalKind.STREAM_EXISTS:
            return StreamExistsError(refusal.name)
        case RefusalKind.NO_SUCH_STREAM:
            return NoSuchStreamError(refusal.name)
        case RefusalKind.NO_SUCH_PARTITION:
            return NoSuchPartitionError(refusal.name, refusal.partition)
        case RefusalKind.NO_SUCH_GROUP:
            return NoSuchGroupError(refusal.name)
        case RefusalKind.INVALID:
            return InvalidStreamError(refusal.message)
        case RefusalKind.REFUSED:
            return RefusedError(refusal.message)
        case RefusalKind.NO_LEADER:
            return NoMetadataLeaderError()
        case RefusalKind.OUTCOME_UNKNOWN:
            return ChangeOutcomeUnknownError(refusal.message)
        case RefusalKind.FAILED:
            return ControllerFailedError(refusal.message or "the controller failed")
    return MetadataError(refusal.message or "metadata change failed")


def _decoded(msg: NatsMessage, what: str, decode: Callable[[bytes], T]) -> T | None:
    """The message a request carries; None (and a rate-limited warning) for a malformed one."""
    try:
        return decode(msg.data)
    except ProtocolError as exc:
        _warn.warning("ignoring a malformed %s on %s: %s", what, msg.subject, exc, key=what)
        return None


@dataclass(frozen=True, slots=True)
class ActivityWiring:
    """What the activity publisher needs besides the metadata service: its settings and connections."""

    settings: ActivitySettings
    nats: NatsClient
    acks: AckRouter


class MetadataService:
    def __init__(
        self,
        *,
        server_id: str,
        advertise: ServerMeta,
        raft_dir: Path,
        namespace: str,
        raft_settings: RaftSettings,
        bootstrap_peers: tuple[str, ...],
        streams: StreamManager,
        heartbeat_interval: float = 1.0,
        liveness_timeout: float = 5.0,
        clock: Clock = SYSTEM_CLOCK,
        on_failure: Callable[[BaseException], None] | None = None,
        unclean_leader_election: bool = False,
        rebalance_delay: float = 10.0,
        limits: StreamLimits | None = None,
        internal_streams: tuple[CreateStreamRequest, ...] = (),
        group_coordinator_timeout: float = 15.0,
        activity: ActivityWiring | None = None,
    ) -> None:
        self.server_id = server_id
        #: The servers' own streams this server creates when it leads and they are missing (cursors).
        self._internal_streams = internal_streams
        self._internal_waits: set[str] = set()
        self.advertise = advertise
        #: clustering.namespace: internal subjects live under it, so stream subjects must not.
        self.namespace = namespace
        self._prefix = f"{namespace}.raft.metadata."
        self._streams = streams
        self._clock = clock.wall_ns
        #: Liveness is a duration: measured on the monotonic clock, which no NTP step moves.
        self._monotonic = clock.monotonic_ns
        self.clock = clock
        self._heartbeat_interval = heartbeat_interval
        self._liveness = LivenessTracker(int(liveness_timeout * 1e9))
        self._unclean = unclean_leader_election
        self._rebalance_delay = rebalance_delay
        self._limits = limits or StreamLimits()
        #: Plans requested changes; it keeps members' reports of silent group coordinators.
        self._planner = ChangePlanner(namespace, self._limits, int(group_coordinator_timeout * 1e9))
        self._failover: Failover | None = None
        self.metadata = Metadata()
        streams.metadata = self.metadata
        self.raft = MetadataRaft(
            server_id=server_id,
            directory=raft_dir,
            namespace=namespace,
            settings=raft_settings,
            state_machine=self,
            bootstrap_peers=bootstrap_peers,
            on_failure=on_failure,
            on_read_request=self._on_read_request,
            clock=clock,
        )
        self._nats: NatsClient
        self._subs: list[NatsSubscription] = []
        self._join_sub: NatsSubscription | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self._leader_task: asyncio.Task[None] | None = None
        self._leader_changed = asyncio.Event()
        self.registered = asyncio.Event()
        #: Called with every policy whenever the metadata's authorization policies change (access control).
        self.policies_changed: Callable[[tuple[Policy, ...]], None] | None = None
        #: Publishes the activity stream while this server leads (None: no stream).
        self.activity = (
            ActivityPublisher(
                activity.settings,
                metadata=lambda: self.metadata,
                propose=self.propose_result,
                nats=activity.nats,
                acks=activity.acks,
                resume=self.resume,
            )
            if activity is not None
            else None
        )
        self._activity_task: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------

    async def start(self, nats: NatsClient) -> None:
        self._nats = nats
        for subject, handler in (
            (f"{self._prefix}{self.server_id}.propose", self._on_propose),
            (f"{self._prefix}{self.server_id}.applied", self._on_applied),
            (f"{self._prefix}{self.server_id}.leo", self._on_leo),
            (f"{self._prefix}heartbeat", self._on_heartbeat),
        ):
            self._subs.append(await nats.subscribe(subject, cb=handler))
        await self.raft.start(nats)
        self._spawn(self._announce())
        self._spawn(self._heartbeats())

    async def stop(self) -> None:
        await self._hand_over_leadership()
        for task in list(self._tasks):
            task.cancel()
        if self._activity_task is not None:
            self._activity_task.cancel()
        if self._leader_task is not None:
            self._leader_task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sub in [*self._subs, self._join_sub]:
            if sub is not None:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        self._subs = []
        self._join_sub = None
        await self.raft.stop()

    async def _hand_over_leadership(self, timeout: float = 2.0) -> None:
        """A leader that stops hands over first, so the others need not wait out an election timeout."""
        successor = self.raft.best_successor()
        if successor is None:
            return
        self.raft.transfer_leadership(successor)
        if await self._wait(lambda: self.raft.leader_id not in (self.server_id, None), timeout):
            log.info("handed the metadata leadership to %s", self.raft.leader_id)

    def _spawn(self, coro: Coroutine[object, object, object]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- the state machine (called by MetadataRaft) ---------------------

    def apply(self, index: int, data: bytes) -> object:
        try:
            op = decode_operation(data)
            changed = apply_entry(self.metadata, index, op)
        except MetadataError as exc:
            result: object = exc
        else:
            result = changed
            if isinstance(op, RegisterServer) and op.server.id == self.server_id:
                self.registered.set()
            elif isinstance(op, (AddPolicy, RevokePolicy)) and self.policies_changed is not None:
                self.policies_changed(tuple(self.metadata.policies))
        self._streams.metadata_changed(index)
        if self.activity is not None:
            self.activity.applied()
        return result

    def applied_membership(self, index: int, voters: tuple[str, ...]) -> None:
        self._streams.metadata_changed(index)

    def snapshot(self) -> bytes:
        return encode_snapshot(self.metadata)

    def restore(self, index: int, data: bytes) -> None:
        self.metadata = decode_snapshot(data)
        self._streams.metadata = self.metadata
        if self.server_id in self.metadata.servers:
            self.registered.set()
        if self.policies_changed is not None:
            self.policies_changed(tuple(self.metadata.policies))
        self._streams.metadata_changed(index)

    def role_changed(self, role: Role, leader: str | None, term: int) -> None:
        log.info("metadata group: %s is %s at term %d", self.server_id, role.value, term)
        self._leader_changed.set()
        self._leader_changed = asyncio.Event()
        if role is Role.LEADER and self._leader_task is None:
            self._liveness.reset(self._monotonic())
            self._failover = Failover(
                metadata=lambda: self.metadata,
                propose=self.propose_result,
                nats=self._nats,
                prefix=self._prefix,
                clock=self._clock,
                unclean_default=self._unclean,
                rebalance_after_ns=int(self._rebalance_delay * 1e9),
            )
            self._leader_task = asyncio.get_running_loop().create_task(self._lead_cluster(), name="controller")
            if self.activity is not None:
                self._activity_task = asyncio.get_running_loop().create_task(self.activity.run(), name="activity")
        elif role is not Role.LEADER and self._leader_task is not None:
            self._leader_task.cancel()
            self._leader_task = None
            self._failover = None
            if self._activity_task is not None:
                self._activity_task.cancel()
                self._activity_task = None

    # -- status ----------------------------------------------------------

    @property
    def leader_id(self) -> str | None:
        return self.raft.leader_id

    @property
    def voters(self) -> tuple[str, ...]:
        return self.raft.node.voters if self.raft.node else ()

    # -- changes, from the API ------------------------------------------

    async def create_stream(self, req: CreateStreamRequest) -> None:
        await self.request(CreateStreamChange(req))

    async def delete_stream(self, name: str) -> None:
        await self.request(DeleteStreamChange(name))

    async def pause(self, name: str, partitions: tuple[int, ...] = (), resume_all: bool = False) -> None:
        await self.request(PauseChange(name, partitions, pause=True, resume_all=resume_all))

    async def resume(self, name: str, partition: int) -> None:
        """Resume a paused partition (all of the stream's with resumeAll); no-op when not paused."""
        if self.metadata.partition(name, partition).paused:
            await self.request(PauseChange(name, (partition,), pause=False))

    async def set_readonly(self, name: str, partitions: tuple[int, ...], readonly: bool) -> None:
        await self.request(ReadonlyChange(name, partitions, readonly))

    async def reassign(self, moves: tuple[PartitionMove, ...], spread: bool) -> None:
        await self.request(ReassignChange(moves, spread))

    async def decommission(self, server: str) -> None:
        await self.request(DecommissionChange(server))

    async def elect_preferred_leaders(self) -> None:
        await self.request(PreferredLeadersChange())

    async def join_group(self, group: str, consumer: str, streams: tuple[str, ...]) -> None:
        await self.request(GroupJoinChange(group, consumer, streams))

    async def leave_group(self, group: str, consumer: str, expired: bool = False) -> None:
        await self.request(GroupLeaveChange(group, consumer, expired))

    async def report_group_coordinator(self, group: str, consumer: str, coordinator: str, epoch: int) -> None:
        await self.request(GroupCoordinatorReport(group, consumer, coordinator, epoch))

    async def change_policy(self, subject: str, resource: str, action: str, *, add: bool) -> None:
        await self.request(PolicyChange(subject, resource, action, add))

    async def request(self, change: ControlRequest, timeout: float = CHANGE_TIMEOUT_S) -> int:
        """Have the controller apply ``change``; returns its index once reconciled here.

        Raises, besides the controller's own refusals (StreamExistsError, InvalidStreamError, ...):
        NoMetadataLeaderError when no controller took the change within ``timeout`` (nothing was
        committed), ChangeOutcomeUnknownError when the controller took it but could not commit it in
        time, ChangeNotAppliedError when it is committed but this server has not acted on it in time.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        what, check = _describe(change)
        why = "no server has been elected metadata leader (an election is under way, or too few servers are up)"
        while True:
            leader = self.raft.leader_id
            try:
                if leader == self.server_id:
                    index = await self._lead(change, max(deadline - loop.time(), 0.1))
                elif leader is not None:
                    index = await self._forward(leader, change, deadline - loop.time(), what, check)
                else:
                    raise _NotLeaderReply()
            except (_NotLeaderReply, NotLeader, ProposalDropped, NoRespondersError) as exc:
                # Nothing was committed: try again once a leader is known, until the deadline.
                if leader is not None:
                    why = f"the last known leader, server {leader}, did not take it ({type(exc).__name__})"
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise NoMetadataLeaderError(f"{what} was not committed within {timeout:.3g} s: {why}") from exc
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._leader_changed.wait(), min(remaining, 0.25))
                continue
            except ChangeOutcomeUnknownError as exc:
                if leader == self.server_id and self.raft.leader_id is None:
                    # The usual cause, said first: this server lost its quorum with the change still pending.
                    raise NoMetadataLeaderError(
                        f"this server lost the metadata leadership (too few servers answer) before {what} was "
                        "committed; it is kept in this server's log and takes effect if this server is elected "
                        f"again: check with {check} before repeating it"
                    ) from exc
                raise
            if not await self._streams.wait_reconciled(index, max(deadline - loop.time(), 0.1)):
                raise ChangeNotAppliedError(what, index, self.server_id, timeout, check)
            return index

    async def _forward(self, leader: str, change: ControlRequest, timeout: float, what: str, check: str) -> int:
        # The controller answers within its share of our deadline, so a timeout here means it is stuck or
        # unreachable after it may have received the change.
        timeout = max(timeout, 0.5)
        ask = encode_request(change, timeout=max(timeout - 0.25, 0.1))
        try:
            reply = await self._nats.request(f"{self._prefix}{leader}.propose", ask, timeout=timeout)
        except NatsTimeoutError:
            raise ChangeOutcomeUnknownError.of(
                what, f"the metadata leader, server {leader}, did not answer within {timeout:.3g} s", check
            ) from None
        try:
            answer = decode_reply(reply.data)
        except ProtocolError as exc:
            raise ChangeOutcomeUnknownError.of(what, f"the metadata leader, server {leader}, {exc}", check) from None
        if isinstance(answer, Committed):
            return answer.index
        if answer.kind in (RefusalKind.NOT_LEADER, RefusalKind.NO_LEADER):
            raise _NotLeaderReply()
        raise _error_of(answer)

    async def _on_propose(self, msg: NatsMessage) -> None:
        # One task per request: a subscription's callbacks run one at a time.
        self._spawn(self._answer_propose(msg))

    async def _answer_propose(self, msg: NatsMessage) -> None:
        decoded = _decoded(msg, "metadata change", decode_request)
        if decoded is None:
            return
        change, asked_timeout = decoded
        answer: Committed | Refusal
        try:
            # Within the forwarding server's deadline, so it hears the outcome rather than a timeout.
            timeout = min(asked_timeout or CHANGE_TIMEOUT_S, CHANGE_TIMEOUT_S)
            if not self.raft.is_leader:
                answer = Refusal(RefusalKind.NOT_LEADER)
            else:
                answer = Committed(await self._lead(change, timeout))
        except (NotLeader, ProposalDropped):
            answer = Refusal(RefusalKind.NOT_LEADER)
        except MetadataError as exc:
            answer = _refusal_of(exc)
        except Exception as exc:
            log.exception("serving a forwarded metadata change")
            answer = _refusal_of(
                ControllerFailedError(f"the controller, server {self.server_id}, failed on the change: {exc}")
            )
        with contextlib.suppress(Exception):
            await msg.respond(encode_reply(answer))

    # -- the controller --------------------------------------------------

    def _plan(self, change: ControlRequest) -> list[Operation]:
        """The operations that carry out ``change``, in order; raises a MetadataError it refuses with."""
        return self._planner.plan(self.metadata, change, self._clock(), self.voters)

    async def _lead(self, change: ControlRequest, timeout: float = CHANGE_TIMEOUT_S) -> int:
        """Plan, replicate and apply one change as the leader; wait (within ``timeout``) for the affected servers.

        Raises ChangeOutcomeUnknownError when the change is not committed within ``timeout``: a leader
        that lost its quorum keeps the proposal, which may still be committed.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            if isinstance(change, (LeaderReport, LeaderConfirmation)):
                return await asyncio.wait_for(self._failover_request(change), timeout)
            changed: list[PartitionMeta] = []
            index = self.raft.node.applied_index if self.raft.node is not None else 0
            for op in self._plan(change):
                index, result = await asyncio.wait_for(self._propose(op), max(deadline - loop.time(), 0.1))
                if isinstance(result, MetadataError):
                    raise result
                changed += result if isinstance(result, list) else []
        except TimeoutError:
            what, check = _describe(change)
            raise ChangeOutcomeUnknownError.of(
                what,
                f"the metadata leader, server {self.server_id}, proposed it but could not commit it within "
                f"{timeout:.3g} s (fewer than a majority of the metadata group answer)",
                check,
            ) from None
        affected = {r for p in changed for r in p.replicas}
        # Committed: from here on the answer is the index, whether or not every server has caught up.
        await self._wait_applied(affected, index, min(APPLY_WAIT_S, deadline - loop.time()))
        return index

    async def _propose(self, op: Operation) -> tuple[int, object]:
        return await self.raft.propose(encode_operation(op))

    async def propose_result(self, op: Operation) -> object:
        """Propose ``op`` as the leader; its apply result (a MetadataError if refused). Raises NotLeader."""
        return (await self._propose(op))[1]

    async def _failover_request(self, change: LeaderReport | LeaderConfirmation) -> int:
        """A follower's report of a silent leader, or a candidate's confirmation (no operation of their own)."""
        failover = self._failover
        if failover is None:
            raise NotLeader(self.raft.leader_id, self.server_id)
        if isinstance(change, LeaderReport):
            await failover.report(change)
        else:
            await failover.confirm(change)
        node = self.raft.node
        return node.applied_index if node is not None else 0

    async def _on_leo(self, msg: NatsMessage) -> None:
        """The controller asks how far this replica's log goes (to pick the least lagging candidate)."""
        query = _decoded(msg, "log end query", decode_log_end_query)
        if query is None:
            return
        part = self._streams.partitions.get((query.name, query.partition))
        leo = part.log.log_end_offset if part is not None and part.log is not None else -1
        with contextlib.suppress(Exception):
            await msg.respond(encode_log_end(LogEnd(leo)))

    async def _wait_applied(self, servers: set[str], index: int, timeout: float = APPLY_WAIT_S) -> None:
        timeout = max(timeout, 0.1)

        async def one(server_id: str) -> None:
            if server_id == self.server_id:
                ok = await self._streams.wait_reconciled(index, timeout)
            else:
                server = self.metadata.servers.get(server_id)
                if server is None or not server.alive:
                    return  # it acts on the change when it comes back
                try:
                    reply = await self._nats.request(
                        f"{self._prefix}{server_id}.applied",
                        encode_applied_query(AppliedQuery(index, max(timeout - 0.25, 0.05))),
                        timeout=timeout,
                    )
                    ok = decode_applied(reply.data).ok
                except Exception:
                    ok = False
            if not ok:
                log.warning("server %s has not acted on metadata index %d yet", server_id, index)

        await asyncio.gather(*(one(s) for s in sorted(servers)))

    async def _on_applied(self, msg: NatsMessage) -> None:
        self._spawn(self._answer_applied(msg))

    async def _answer_applied(self, msg: NatsMessage) -> None:
        query = _decoded(msg, "applied query", lambda data: decode_applied_query(data, APPLY_WAIT_S - 0.5))
        if query is None:
            return
        ok = await self._streams.wait_reconciled(query.index, min(query.timeout, APPLY_WAIT_S))
        with contextlib.suppress(Exception):
            await msg.respond(encode_applied(Applied(ok)))

    async def _lead_cluster(self) -> None:
        """Controller duties while this server leads: admit joiners, track liveness."""
        try:
            self._join_sub = await self._nats.subscribe(f"{self._prefix}join", cb=self._on_join)
            while True:
                # Checked more often than servers heartbeat: a dead leader's partitions move sooner.
                await asyncio.sleep(min(self._heartbeat_interval, 0.25))
                now = self._monotonic()
                self._liveness.heard(self.server_id, now)
                for op in self._liveness.changes(self.metadata, now, self._clock()):
                    log.warning("server %s is %s", op.id, "alive again" if op.alive else "not answering")
                    try:
                        await self.raft.propose(encode_operation(op))
                    except (NotLeader, ProposalDropped) as exc:
                        # Stepping down cancels this task; anything else is retried next round.
                        log.info("recording liveness of %s: %s", op.id, exc)
                        break
                if self._failover is not None:
                    await self._failover.tick()
                try:
                    await self._reassignment_round()
                    await self._internal_streams_round()
                except (NotLeader, ProposalDropped) as exc:
                    log.info("reassignment round: %s", exc)
        finally:
            if self._join_sub is not None:
                with contextlib.suppress(Exception):
                    await self._join_sub.unsubscribe()
                self._join_sub = None

    async def _internal_streams_round(self) -> None:
        """Create the servers' own streams that are configured and missing, as Liftbridge's leader does.

        One replicated to every server (-1) waits until every voter is alive: created while some are still
        starting, it would have fewer replicas for good.
        """
        for req in self._internal_streams:
            if req.name in self.metadata.streams:
                self._internal_waits.discard(req.name)
                continue
            alive = {s.id for s in self.metadata.servers.values() if s.alive and not s.leaving}
            missing = set(self.voters) - alive
            if req.replication_factor == -1 and missing:
                if req.name not in self._internal_waits:
                    self._internal_waits.add(req.name)
                    log.info("creating %s once servers %s are up", req.name, ", ".join(sorted(missing)))
                continue
            try:
                op = plan_create_stream(
                    self.metadata, req, self._clock(), namespace=self.namespace, limits=self._limits, internal=True
                )
            except MetadataError as exc:
                log.warning("cannot create %s yet: %s", req.name, exc)
                continue
            result = await self.propose_result(op)
            if isinstance(result, MetadataError):
                log.info("creating %s: %s", req.name, result)
            else:
                log.info("created %s (%d partitions)", req.name, len(op.stream.partitions))

    async def _reassignment_round(self) -> None:
        """Move reassignments on (leader onto the new replicas, then completion), and let servers that
        were decommissioned and hold nothing any more leave: first the Raft group, then the metadata."""
        for op in reassignment_steps(self.metadata):
            result = await self.propose_result(op)
            if isinstance(result, MetadataError):
                log.info("reassignment step %s not applied: %s", type(op).__name__, result)
            else:
                log.info("reassignment step applied: %s", op)
        for server_id in departures(self.metadata):
            if server_id in self.voters:
                log.warning("server %s is decommissioned: removing it from the metadata group", server_id)
                await self.raft.remove_voter(server_id)
                return  # one membership change at a time; this server may have just removed itself
            result = await self.propose_result(RemoveServer(server_id))
            if not isinstance(result, MetadataError):
                log.warning("server %s is decommissioned and has left the cluster", server_id)

    async def _on_join(self, msg: NatsMessage) -> None:
        self._spawn(self._answer_join(msg))

    async def _answer_join(self, msg: NatsMessage) -> None:
        join = _decoded(msg, "join request", decode_join)
        if join is None:
            return
        try:
            if join.server_id not in self.voters:
                log.info("adding server %s to the metadata group", join.server_id)
                await self.raft.add_voter(join.server_id)
            answer = JoinAnswer(ok=True)
        except (NotLeader, ProposalDropped) as exc:
            answer = JoinAnswer(ok=False, error=str(exc))
        except Exception as exc:
            log.exception("admitting a server")
            answer = JoinAnswer(ok=False, error=str(exc))
        with contextlib.suppress(Exception):
            await msg.respond(encode_join_answer(answer))

    def _on_heartbeat_from(self, server_id: str) -> None:
        self._liveness.heard(server_id, self._monotonic())

    def _on_read_request(self, server_id: str) -> None:
        # A read-index request is a sign of life: a server renews its leader lease with one, and the lease
        # is only safe if the controller that answers it waits a full liveness timeout from here.
        if self.raft.is_leader:
            self._on_heartbeat_from(server_id)

    async def _on_heartbeat(self, msg: NatsMessage) -> None:
        if self.raft.is_leader:
            beat = _decoded(msg, "heartbeat", decode_heartbeat)
            if beat is not None:
                self._on_heartbeat_from(beat.server_id)

    # -- this server's part ---------------------------------------------

    async def _announce(self) -> None:
        """Join the metadata group if needed, then register this server's address (retrying)."""
        if self.server_id not in self.voters:
            await self._join_group()
        registration = ServerRegistration(self.advertise)
        while True:
            known = self.metadata.servers.get(self.server_id)
            if known is not None and (known.host, known.port, known.rack) == (
                self.advertise.host,
                self.advertise.port,
                self.advertise.rack,
            ):
                self.registered.set()
                return
            try:
                await self.request(registration)
                self.registered.set()
                return
            except MetadataError as exc:
                log.info("registering with the controller: %s; retrying", exc)
                await asyncio.sleep(1.0)

    async def _join_group(self) -> None:
        attempts = 0
        while self.server_id not in self.voters:
            try:
                reply = await self._nats.request(
                    f"{self._prefix}join", encode_join(JoinRequest(self.server_id)), timeout=5.0
                )
                answer = decode_join_answer(reply.data)
                if answer.ok:
                    # Added: the leader's log (or snapshot) reaches us next and makes us a voter.
                    await self._wait(lambda: self.server_id in self.voters, 10.0)
                    continue
                log.info("joining the cluster: %s", answer.error)
            except (NoRespondersError, NatsTimeoutError, ProtocolError):
                if attempts % 10 == 0:
                    log.info(
                        "waiting for a metadata leader to join (start one server with --raft-bootstrap-seed; "
                        "a cluster answers only servers with its secret: clustering.auth.key.file must name a copy "
                        "of it, which a server that founded the cluster alone keeps as cluster.key in its data.dir)"
                    )
            attempts += 1
            await asyncio.sleep(1.0)
        log.info("server %s is a member of the metadata group", self.server_id)

    async def _wait(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``condition`` on the Raft node's state holds; False after ``timeout`` s."""
        return await self.raft.changes.until(condition, timeout)

    async def _heartbeats(self) -> None:
        payload = encode_heartbeat(Heartbeat(self.server_id))
        while True:
            with contextlib.suppress(Exception):
                await self._nats.publish(f"{self._prefix}heartbeat", payload)
            await asyncio.sleep(self._heartbeat_interval)
