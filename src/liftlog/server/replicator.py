"""The asyncio shell of partition replication: serving fetches, fetching, notifications, ISR proposals.

Leader side: for every partition it leads, the server answers fetches on
``<ns>.<stream>.<partition>.<leader epoch>.replicate`` and epoch questions on
``<ns>.<stream>.<partition>.<leader epoch>.offset`` from its ``LeaderReplica``
(the epoch in the subject keeps a deposed leader from hearing requests meant
for its successor); a caught-up follower's fetch is held until there is
data or ``clustering.replica.fetch.wait`` passes. Follower notifications go
out batched, one message per follower server, on ``<ns>.notify.<server>``;
ISR proposals go to the controller.

Follower side: one fetch loop per leader server, shared by every partition
this server follows there (seed 002). Each partition's request is a task of
its own, so a slow or held one does not delay the others; the loop carries
out what each ``FollowerReplica`` asks: truncate, append the raw batches,
move the HW, sleep until the idle wait ends or a notification arrives.

The cores decide; this module only moves bytes and calls the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from liftlog.replication.follower import (
    Append,
    Fetch,
    FollowerAction,
    FollowerReplica,
    ReportLeader,
    RequestEpochOffset,
    SetHighWatermark,
    Sleep,
    Truncate,
)
from liftlog.replication.leader import LeaderAction, NotifyFollowers, ProposeIsr
from liftlog.replication.protocol import (
    EpochOffsetRequest,
    EpochOffsetResponse,
    FetchError,
    FetchErrorCode,
    FetchRequest,
    ProtocolError,
    decode_epoch_offset_request,
    decode_epoch_offset_response,
    decode_fetch_reply,
    decode_fetch_request,
    decode_notification,
    encode_epoch_offset_request,
    encode_epoch_offset_response,
    encode_fetch_error,
    encode_fetch_request,
    encode_fetch_response,
    encode_notification,
    notify_subject,
    offset_subject,
    replicate_subject,
)
from liftlog.storage import StorageError

from .nats_types import NatsClient, NatsMessage, NatsSubscription
from .partition import Partition
from .ratelimit import LogLimiter

__all__ = ["Replicator", "ReplicatorSettings"]

log = logging.getLogger(__name__)
#: Per-message warnings: whoever can publish on our subjects must not be able to flood the log.
_warn = LogLimiter(log)

ProposeIsrCallback = Callable[[Partition, tuple[str, ...], str], Awaitable[None]]
ReportLeaderCallback = Callable[[Partition, ReportLeader], Awaitable[None]]


class _StorageFailed(Exception):
    """The follower's own log refused a write or truncation (not the network: those retry as usual)."""

    def __init__(self, cause: Exception) -> None:
        self.cause = cause
        super().__init__(str(cause))


@contextlib.contextmanager
def _storage() -> Iterator[None]:
    try:
        yield
    except (StorageError, OSError) as exc:
        raise _StorageFailed(exc) from exc


@dataclass(frozen=True, slots=True)
class ReplicatorSettings:
    max_lag_ns: int = 15_000_000_000
    max_lag_messages: int = 0
    idle_wait_s: float = 10.0
    fetch_timeout_s: float = 3.0
    leader_timeout_ns: int = 15_000_000_000
    max_bytes: int = 1 << 20
    retry_s: float = 0.25
    #: How long the leader holds a caught-up follower's fetch, answering it as soon as there is data
    #: (0: answer at once; the follower then sleeps until notified). Kept under ``fetch_timeout_s``.
    fetch_wait_s: float = 0.5


@dataclass(slots=True)
class _Following:
    part: Partition
    core: FollowerReplica
    #: The request to send next (RequestEpochOffset or Fetch), None while asleep or in flight.
    pending: FollowerAction | None = None
    sleeping: bool = False
    #: A notification arrived while a request was in flight: do not sleep after its (empty) answer.
    notified: bool = False
    due: float = 0.0


@dataclass(slots=True)
class _Loop:
    """Fetching from one leader server: its partitions and the task that serves them."""

    leader: str
    members: dict[tuple[str, int], _Following] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class Replicator:
    def __init__(
        self,
        *,
        server_id: str,
        namespace: str,
        settings: ReplicatorSettings,
        propose_isr: ProposeIsrCallback,
        report_leader: ReportLeaderCallback,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.server_id = server_id
        self._ns = namespace
        self.settings = settings
        self._propose_isr = propose_isr
        self._report_leader = report_leader
        self._clock = clock
        self._nats: NatsClient
        #: Led partitions: the partition, its request subscriptions and the leader epoch they serve.
        self._served: dict[tuple[str, int], tuple[Partition, list[NatsSubscription], int]] = {}
        self._loops: dict[str, _Loop] = {}
        self._notify_sub: NatsSubscription | None = None
        self._outbox: dict[str, set[tuple[str, int]]] = {}
        self._flush_scheduled = False
        #: Fetches of caught-up followers held until there is data, by partition and follower.
        self._parked: dict[tuple[str, int], dict[str, _Parked]] = {}
        self._wake_parked: list[tuple[Partition, str]] = []
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self, nats: NatsClient) -> None:
        self._nats = nats
        self._notify_sub = await nats.subscribe(notify_subject(self._ns, self.server_id), cb=self._on_notify)

    async def stop(self) -> None:
        for held in self._parked.values():
            for parked in held.values():
                parked.timer.cancel()
        self._parked.clear()
        for loop in self._loops.values():
            if loop.task is not None:
                loop.task.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(
            *(lp.task for lp in self._loops.values() if lp.task is not None), *self._tasks, return_exceptions=True
        )
        self._loops.clear()
        for _, subs, _ in self._served.values():
            for sub in subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        self._served.clear()
        if self._notify_sub is not None:
            with contextlib.suppress(Exception):
                await self._notify_sub.unsubscribe()
            self._notify_sub = None

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- leader side -----------------------------------------------------

    async def lead(self, part: Partition) -> None:
        """Start serving followers of ``part`` (it already has its ``leader`` core) in its leader epoch."""
        assert part.leader is not None
        key = (part.stream, part.id)
        epoch = part.leader.leader_epoch
        part.leader_actions = self._on_leader_actions
        served = self._served.get(key)
        if served is not None:
            if served[2] == epoch:
                return
            await self.stop_leading(part)  # re-elected: serve the new epoch's subjects only
        subs = [
            await self._nats.subscribe(
                replicate_subject(self._ns, part.stream, part.id, epoch),
                cb=functools.partial(self._serve_fetch, part),
            ),
            await self._nats.subscribe(
                offset_subject(self._ns, part.stream, part.id, epoch),
                cb=functools.partial(self._serve_epoch, part),
            ),
        ]
        self._served[key] = (part, subs, epoch)

    async def stop_leading(self, part: Partition) -> None:
        for replica in list(self._parked.get((part.stream, part.id), ())):
            self._answer_parked(part, replica)  # a refusal now (not leading, or a stale epoch)
        _, subs, _ = self._served.pop((part.stream, part.id), (part, [], -1))
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    def tick(self) -> None:
        """Let every led partition judge its followers' lag."""
        now = self._clock()
        for part, _, _ in list(self._served.values()):
            part.leader_tick(now)

    async def _serve_fetch(self, part: Partition, msg: NatsMessage) -> None:
        try:
            req = decode_fetch_request(msg.data)
        except ProtocolError as exc:
            _warn.warning("malformed fetch request on %s: %s", msg.subject, exc)
            return
        reply, caught_up = self._fetch_reply(part, req)
        wait = min(self.settings.fetch_wait_s, self.settings.fetch_timeout_s / 2)
        if caught_up and wait > 0:
            # Held, the fetch is answered the moment data arrives: a notification and a second fetch
            # would take two more trips through NATS (what an ack ALL waits for).
            self._park(part, req, msg, wait)
            return
        with contextlib.suppress(Exception):
            await msg.respond(reply)

    def _park(self, part: Partition, req: FetchRequest, msg: NatsMessage, wait: float) -> None:
        held = self._parked.setdefault((part.stream, part.id), {})
        earlier = held.pop(req.replica_id, None)
        if earlier is not None:  # its follower gave up on it (a timeout) and asked again
            earlier.timer.cancel()
        timer = asyncio.get_running_loop().call_later(wait, self._answer_parked, part, req.replica_id, msg)
        held[req.replica_id] = _Parked(req, msg, timer)

    def _answer_parked(self, part: Partition, replica: str, msg: NatsMessage | None = None) -> None:
        """Answer ``replica``'s held fetch of ``part`` now (``msg``: only if it is still that one)."""
        key = (part.stream, part.id)
        held = self._parked.get(key, {})
        parked = held.get(replica)
        if parked is None or (msg is not None and parked.msg is not msg):
            return
        del held[replica]
        if not held:
            del self._parked[key]
        parked.timer.cancel()
        reply, _ = self._fetch_reply(part, parked.req)
        self._spawn(parked.msg.respond(reply))

    def _fetch_reply(self, part: Partition, req: FetchRequest) -> tuple[bytes, bool]:
        """The encoded answer to a fetch, and whether it is the empty answer of a caught-up follower."""
        leader = part.leader
        if leader is None or part.log is None:
            return encode_fetch_error(
                FetchError(FetchErrorCode.NOT_LEADER, f"{self.server_id} does not lead {part.stream}/{part.id}", -1, -1)
            ), False
        if req.leader_epoch != leader.leader_epoch:
            return encode_fetch_error(
                FetchError(
                    FetchErrorCode.STALE_EPOCH,
                    f"leader epoch is {leader.leader_epoch}, not {req.leader_epoch}",
                    leader.leader_epoch,
                    part.log.log_start_offset,
                )
            ), False
        if req.offset < part.log.log_start_offset or req.offset > part.log.log_end_offset:
            return encode_fetch_error(
                FetchError(
                    FetchErrorCode.OFFSET_OUT_OF_RANGE,
                    f"offset {req.offset} is outside {part.log.log_start_offset}..{part.log.log_end_offset}",
                    leader.leader_epoch,
                    part.log.log_start_offset,
                )
            ), False
        try:
            answer, data = part.serve_fetch(req.replica_id, req.offset, req.leader_epoch, self.settings.max_bytes)
        except (ValueError, StorageError) as exc:
            return encode_fetch_error(
                FetchError(FetchErrorCode.UNKNOWN_PARTITION, str(exc), leader.leader_epoch, part.log.log_start_offset)
            ), False
        return encode_fetch_response(answer.leader_epoch, answer.hw, data), answer.empty

    async def _serve_epoch(self, part: Partition, msg: NatsMessage) -> None:
        try:
            req = decode_epoch_offset_request(msg.data)
        except ProtocolError as exc:
            _warn.warning("malformed epoch offset request on %s: %s", msg.subject, exc)
            return
        if part.log is None or part.leader is None:
            # Stepped down, not yet unsubscribed: stay silent. "No such epoch" would make the follower
            # truncate its whole log; without an answer it asks again, and the new leader answers.
            return
        epoch, end = part.epoch_end(req.leader_epoch)
        start = part.log.log_start_offset
        with contextlib.suppress(Exception):
            await msg.respond(encode_epoch_offset_response(EpochOffsetResponse(epoch, end, start)))

    def _on_leader_actions(self, part: Partition, actions: Sequence[LeaderAction]) -> None:
        for action in actions:
            if isinstance(action, NotifyFollowers):
                held = self._parked.get((part.stream, part.id), {})
                for follower in action.replicas:
                    if follower in held:
                        self._wake_parked.append((part, follower))
                    else:
                        self._outbox.setdefault(follower, set()).add((part.stream, part.id))
                if not self._flush_scheduled:
                    self._flush_scheduled = True
                    asyncio.get_running_loop().call_soon(self._flush_notifications)
            elif isinstance(action, ProposeIsr):
                log.info("%s: proposing ISR %s (%s)", part, ",".join(action.isr), action.reason)
                self._spawn(self._propose_isr(part, action.isr, action.reason))

    def _flush_notifications(self) -> None:
        self._flush_scheduled = False
        wake, self._wake_parked = self._wake_parked, []
        for part, follower in wake:
            self._answer_parked(part, follower)
        outbox, self._outbox = self._outbox, {}
        for follower, pairs in outbox.items():
            self._spawn(self._nats.publish(notify_subject(self._ns, follower), encode_notification(sorted(pairs))))

    # -- follower side ---------------------------------------------------

    def follow(self, part: Partition) -> None:
        """Replicate ``part`` from its current leader (``part.meta``); restarts on a leader change."""
        self.unfollow(part)
        assert part.log is not None
        if part.log.fenced is not None and not part.log.repair():
            # The core must start from where the repaired log ends, never from before the repair.
            self._follow_later(part, 1.0)
            return
        meta = part.meta
        core = FollowerReplica(
            self.server_id,
            meta.leader,
            meta.leader_epoch,
            part.log.log_end_offset,
            part.log.high_watermark,
            part.log.epoch_cache.latest_epoch,
            self._clock(),
            idle_wait_s=self.settings.idle_wait_s,
            leader_timeout_ns=self.settings.leader_timeout_ns,
        )
        part.follower = core
        loop = self._loops.get(meta.leader)
        if loop is None:
            loop = self._loops[meta.leader] = _Loop(meta.leader)
            loop.task = asyncio.get_running_loop().create_task(self._fetch_loop(loop), name=f"fetch-from-{meta.leader}")
        member = _Following(part, core)
        loop.members[(part.stream, part.id)] = member
        self._carry_out(member, core.start())
        loop.wake.set()

    def unfollow(self, part: Partition) -> None:
        key = (part.stream, part.id)
        for loop in self._loops.values():
            loop.members.pop(key, None)
        part.follower = None

    async def _on_notify(self, msg: NatsMessage) -> None:
        try:
            pairs = decode_notification(msg.data)
        except ProtocolError as exc:
            _warn.warning("malformed notification on %s: %s", msg.subject, exc)
            return
        for loop in self._loops.values():
            woke = False
            for key in pairs:
                member = loop.members.get(key)
                if member is None:
                    continue
                if member.sleeping:
                    member.due = 0.0
                    woke = True
                else:
                    # The leader notifies once per wait; an empty answer already on its way must not
                    # put us to sleep past the data this notification announces.
                    member.notified = True
            if woke:
                loop.wake.set()

    async def _fetch_loop(self, loop: _Loop) -> None:
        try:
            await self._fetch_rounds(loop)
        except asyncio.CancelledError:
            raise
        except BaseException:
            log.exception("the fetch loop from %s stopped", loop.leader)
            raise

    async def _fetch_rounds(self, loop: _Loop) -> None:
        """Send every due request on its own: a fetch the leader holds (nothing new yet) must not hold
        up the other partitions' fetches from the same leader."""
        clock = asyncio.get_running_loop().time
        in_flight: set[asyncio.Task[None]] = set()
        try:
            while True:
                loop.wake.clear()  # before looking: an answer that lands meanwhile sets it again
                now = clock()
                for m in loop.members.values():
                    if m.sleeping and m.due <= now:
                        m.sleeping = False
                        self._carry_out(m, m.core.wake())
                due = [m for m in loop.members.values() if m.pending is not None and m.due <= now]
                for m in due:
                    action, m.pending = m.pending, None
                    assert action is not None
                    m.notified = False  # this request sees whatever was announced before it
                    task = asyncio.ensure_future(self._request_then_wake(m, action, loop))
                    in_flight.add(task)
                    task.add_done_callback(in_flight.discard)
                if not due:
                    waits = [m.due - now for m in loop.members.values() if m.due > now]
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(loop.wake.wait(), min(waits, default=self.settings.idle_wait_s))
        finally:
            for task in in_flight:
                task.cancel()

    async def _request_then_wake(self, member: _Following, action: FollowerAction, loop: _Loop) -> None:
        try:
            await self._request(member, action)
        finally:
            loop.wake.set()  # its next request (if any) is due now or later

    async def _request(self, member: _Following, action: FollowerAction) -> None:
        part, core = member.part, member.core
        try:
            if isinstance(action, Fetch):
                req = FetchRequest(self.server_id, part.stream, part.id, action.offset, action.leader_epoch)
                msg = await self._nats.request(
                    replicate_subject(self._ns, part.stream, part.id, core.leader_epoch),
                    encode_fetch_request(req),
                    timeout=self.settings.fetch_timeout_s,
                )
                reply = decode_fetch_reply(msg.data)
                if isinstance(reply, FetchError):
                    raise _Refused(reply)
                if part.follower is not core:
                    return  # unfollowed meanwhile
                first = action.offset
                actions = core.fetched(reply.leader_epoch, reply.hw, first, not reply.batches, self._clock())
                if actions and isinstance(actions[0], Append):
                    assert part.log is not None
                    with _storage():
                        part.log.append_raw(reply.batches)
                    part.write_succeeded()
                    part.appended()
                    actions = actions[1:] + core.appended(part.log.log_end_offset, self._clock())
                self._carry_out(member, actions)
            elif isinstance(action, RequestEpochOffset):
                msg = await self._nats.request(
                    offset_subject(self._ns, part.stream, part.id, core.leader_epoch),
                    encode_epoch_offset_request(EpochOffsetRequest(part.stream, part.id, action.epoch)),
                    timeout=self.settings.fetch_timeout_s,
                )
                resp = decode_epoch_offset_response(msg.data)
                if part.follower is not core or part.log is None:
                    return
                local = part.epoch_end(resp.leader_epoch)[1]  # unused by the core when the epoch is -1
                self._carry_out(member, core.epoch_offset(resp.leader_epoch, resp.end_offset, local))
        except asyncio.CancelledError:
            raise
        except _Refused as refused:
            if part.follower is not core:
                return
            if refused.error.code is FetchErrorCode.OFFSET_OUT_OF_RANGE:
                try:
                    self._out_of_range(part, core, refused.error)
                except _StorageFailed as failed:
                    self._storage_failed(part, failed.cause)
                return
            log.debug("%s: %s refused a fetch: %s", part, core.leader, refused)
            self._carry_out(member, core.failed(self._clock()), delay=self.settings.retry_s)
        except _StorageFailed as failed:
            if part.follower is not core:
                return
            self._storage_failed(part, failed.cause)
        except Exception as exc:
            if part.follower is not core:
                return
            log.debug("%s: replication request to %s failed: %r", part, core.leader, exc)
            self._carry_out(member, core.failed(self._clock()), delay=self.settings.retry_s)

    def _storage_failed(self, part: Partition, exc: Exception) -> None:
        """A write or truncation of the follower's log failed: the core may now think the log ends
        elsewhere than it does (it lowers its end before the shell truncates). Drop it, and start a new
        one from what the log holds once the retry delay has passed and the log is repaired."""
        part.write_failed(exc)
        self.unfollow(part)  # the stale core takes no more answers
        self._follow_later(part, self.settings.retry_s)

    def _follow_later(self, part: Partition, delay: float) -> None:
        def again() -> None:
            # Still a follower with an open log and no core (the role may have changed meanwhile).
            if part.follower is None and part.leader is None and part.is_open:
                self.follow(part)

        asyncio.get_running_loop().call_later(delay, again)

    def _out_of_range(self, part: Partition, core: FollowerReplica, error: FetchError) -> None:
        """The leader no longer has (or never had) what we asked for: start again from what it has."""
        assert part.log is not None
        if core.leo < error.log_start_offset:
            # Retention removed what we lack: nothing below the leader's log start can be fetched.
            log.warning(
                "%s: the leader's log starts at %d, past our end %d: restarting the replica there",
                part,
                error.log_start_offset,
                core.leo,
            )
            with _storage():
                part.log.reset(error.log_start_offset)
        # Otherwise we are past the leader's end: truncating by epoch (a restarted core) finds where we agree.
        self.follow(part)

    def _carry_out(self, member: _Following, actions: list[FollowerAction], delay: float = 0.0) -> None:
        """Do the local actions; keep the next request (RequestEpochOffset/Fetch) for the loop."""
        part = member.part
        now = asyncio.get_running_loop().time()
        for action in actions:
            if isinstance(action, Truncate):
                assert part.log is not None
                log.info("%s: truncating to offset %d (leader epoch check)", part, action.offset)
                with _storage():
                    part.log.truncate_to(action.offset)
            elif isinstance(action, SetHighWatermark):
                part.set_high_watermark(action.hw)
            elif isinstance(action, Sleep):
                member.sleeping = True
                member.due = now if member.notified else now + action.seconds
                member.notified = False
                return
            elif isinstance(action, ReportLeader):
                log.warning("%s: leader %s silent for %d ms", part, action.leader, action.silent_ns // 1_000_000)
                self._spawn(self._report_leader(part, action))
            elif isinstance(action, Fetch | RequestEpochOffset):
                member.pending = action
                member.due = now + delay


@dataclass(slots=True)
class _Parked:
    req: FetchRequest
    msg: NatsMessage
    timer: asyncio.TimerHandle


class _Refused(Exception):
    def __init__(self, error: FetchError) -> None:
        self.error = error
        super().__init__(f"{error.code.name}: {error.message}")
