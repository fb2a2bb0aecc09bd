"""The asyncio shell of partition replication: serving fetches, fetching, notifications, ISR proposals.

Leader side: a server answers every fetch of the partitions it leads on one
subject, ``<ns>.fetch.<server>``, and epoch questions on ``<ns>.offset.<server>``
(``replication.protocol``). A fetch names every partition one follower server
replicates from this leader; each partition is answered from its
``LeaderReplica`` or refused on its own (not the leader, another epoch, out of
range), so one partition's trouble never holds up the others. A fetch whose
partitions are all caught up is held until one of them has data or
``clustering.replica.fetch.wait`` passes. Notifications for followers without a
held fetch go out batched, one message per follower server, on
``<ns>.notify.<server>``; ISR proposals go to the controller.

Follower side: one fetch loop per leader server, shared by every partition
this server follows there (seed 002). It sends one fetch for all of them
(several if they do not fit one request) and carries out what each
``FollowerReplica`` asks: truncate, append the raw batches, move the HW, sleep
until the idle wait ends or a notification arrives. A partition that joins
while a fetch is out (a new follower, a retry, the end of a truncation) sends a
new fetch for everyone at once; the leader answers the earlier one straight
away and the follower ignores that answer.

The cores decide; this module only moves bytes and calls the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from liftlog.api.envelope import Buffer
from liftlog.metadata.protocol import IsrChange
from liftlog.replication.fetching import Applied, EpochQuestion, FetchOut, FetchScheduler, Member
from liftlog.replication.follower import (
    Append,
    FollowerAction,
    FollowerReplica,
    ReportLeader,
    SetHighWatermark,
    Truncate,
)
from liftlog.replication.leader import LeaderAction, NotifyFollowers, ProposeIsr
from liftlog.replication.protocol import (
    EpochOffsetResponse,
    FetchError,
    FetchErrorCode,
    FetchRequest,
    PartitionFetch,
    PartitionRefusal,
    ProtocolError,
    decode_epoch_offset_reply,
    decode_epoch_offset_request,
    decode_fetch_request,
    decode_fetch_response,
    decode_notification,
    encode_epoch_offset_request,
    encode_epoch_offset_response,
    encode_fetch_error,
    encode_fetch_request,
    encode_fetch_response,
    encode_notification,
    fetch_entry_size,
    fetch_subject,
    notify_subject,
    offset_subject,
)
from liftlog.replication.roles import isr_change
from liftlog.replication.serving import epoch_question_refusal, fetch_refusal
from liftlog.server.clock import SYSTEM_CLOCK, Clock
from liftlog.server.nats.nats_types import NatsClient, NatsMessage, NatsSubscription
from liftlog.server.partitions.partition import Partition
from liftlog.server.ratelimit import LogLimiter
from liftlog.server.throttle import ByteRate
from liftlog.storage import StorageError

__all__ = ["Replicator", "ReplicatorSettings"]

log = logging.getLogger(__name__)
#: Per-message warnings: whoever can publish on our subjects must not be able to flood the log.
_warn = LogLimiter(log)

ProposeIsrCallback = Callable[[Partition, IsrChange], Awaitable[None]]
ReportLeaderCallback = Callable[[Partition, ReportLeader], Awaitable[None]]

PartitionKey = tuple[str, int]
#: A data answer as the leader encodes it: (stream, partition, leader epoch, HW, batches).
_DataAnswer = tuple[str, int, int, int, Buffer]

#: Envelope (with a CRC), version and count: what a fetch response holds besides its answers.
_RESPONSE_OVERHEAD = 12 + 5
#: Followers whose answer rotation is remembered (more than any cluster has servers).
_MAX_FOLLOWERS = 1024


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
    #: Most bytes of record batches in one fetch response (all its partitions together); the
    #: connected nats-server's max_payload bounds it too.
    max_bytes: int = 1 << 20
    retry_s: float = 0.25
    #: How long the leader holds a caught-up follower's fetch, answering it as soon as there is data
    #: (0: answer at once; the follower then sleeps until notified). Kept under ``fetch_timeout_s``.
    fetch_wait_s: float = 0.5
    #: Bytes per second this server sends to replicas a reassignment is adding, all of them together
    #: (0: no limit). Followers in the ISR are never held back.
    reassignment_rate: int = 0


class _Wakeup:
    """An ``asyncio.Event`` for the one task that waits on it, with a timeout.

    The fetch loop waits twice per fetch round (after sending, and for the answer); ``wait_for`` on an
    Event made a task, two futures and a timer each time: 7% of a follower's profiled time with ack ALL
    one message at a time. This is one future and one timer.
    """

    __slots__ = ("_waiter", "is_set")

    def __init__(self) -> None:
        self.is_set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self.is_set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self.is_set = False

    async def wait(self, timeout: float) -> None:
        """Until ``set`` (at once if it is) or ``timeout`` seconds pass, whichever comes first."""
        if self.is_set:
            return
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, _resolve, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclass(slots=True)
class _Loop:
    """Fetching from one leader server: its schedule, the partitions in it and the task that serves them."""

    schedule: FetchScheduler
    parts: dict[PartitionKey, Partition] = field(default_factory=dict)
    wake: _Wakeup = field(default_factory=_Wakeup)
    task: asyncio.Task[None] | None = None

    def leave(self, key: PartitionKey) -> None:
        self.schedule.leave(key)
        self.parts.pop(key, None)


@dataclass(slots=True)
class _Held:
    """A fetch whose partitions were all caught up, answered when one of them has data or the wait ends."""

    req: FetchRequest
    msg: NatsMessage
    keys: frozenset[PartitionKey]
    timer: asyncio.TimerHandle


class Replicator:
    def __init__(
        self,
        *,
        server_id: str,
        namespace: str,
        settings: ReplicatorSettings,
        propose_isr: ProposeIsrCallback,
        report_leader: ReportLeaderCallback,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.server_id = server_id
        self._ns = namespace
        #: Replication fetches this server made as a follower, and the bytes of their answers (metrics).
        self.fetches = 0
        self.fetched_bytes = 0
        self.settings = settings
        self._propose_isr = propose_isr
        self._report_leader = report_leader
        self._clock = clock.wall_ns
        self._nats: NatsClient
        #: Led partitions, by key.
        self._served: dict[PartitionKey, Partition] = {}
        self._subs: list[NatsSubscription] = []
        self._loops: dict[str, _Loop] = {}
        self._outbox: dict[str, set[PartitionKey]] = {}
        self._flush_scheduled = False
        #: Held fetches, by follower and session.
        self._held: dict[str, dict[int, _Held]] = {}
        self._wake_held: set[tuple[str, int]] = set()
        #: Where the next answer to each follower starts, so that a partition with a backlog cannot
        #: take every response's byte budget.
        self._rotation: dict[str, int] = {}
        self._tasks: set[asyncio.Task[object]] = set()
        self._throttle = ByteRate(settings.reassignment_rate, clock=clock.monotonic)

    async def start(self, nats: NatsClient) -> None:
        self._nats = nats
        self._subs = [
            await nats.subscribe(notify_subject(self._ns, self.server_id), cb=self._on_notify),
            await nats.subscribe(fetch_subject(self._ns, self.server_id), cb=self._serve_fetch),
            await nats.subscribe(offset_subject(self._ns, self.server_id), cb=self._serve_epoch),
        ]

    async def stop(self) -> None:
        for sessions in self._held.values():
            for held in sessions.values():
                held.timer.cancel()
        self._held.clear()
        for loop in self._loops.values():
            if loop.task is not None:
                loop.task.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(
            *(lp.task for lp in self._loops.values() if lp.task is not None), *self._tasks, return_exceptions=True
        )
        self._loops.clear()
        self._served.clear()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs = []

    def _spawn(self, coro: Awaitable[object]) -> None:
        task: asyncio.Task[object] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- leader side -----------------------------------------------------

    def lead(self, part: Partition) -> None:
        """Serve followers' fetches of ``part`` (it already has its ``leader`` core) in its leader epoch."""
        assert part.leader is not None
        self._served[(part.stream, part.id)] = part
        self._answer_held_of(part)  # fetches held for an earlier epoch get refused now

    def stop_leading(self, part: Partition) -> None:
        key = (part.stream, part.id)
        if self._served.get(key) is part:
            del self._served[key]
        self._answer_held_of(part)  # a refusal now (not leading)

    def tick(self) -> None:
        """Let every led partition judge its followers' lag."""
        now = self._clock()
        for part in list(self._served.values()):
            part.leader_tick(now)

    async def _serve_fetch(self, msg: NatsMessage) -> None:
        try:
            req = decode_fetch_request(msg.data)
        except ProtocolError as exc:
            _warn.warning("malformed fetch request on %s: %s", msg.subject, exc)
            return
        # A newer fetch of the same session: its follower gave up on the earlier one (a timeout) or
        # added partitions to it. Answer that one now; the follower reads only the newest answer.
        self._answer_held(req.replica_id, req.session)
        reply, caught_up = self._fetch_reply(req)
        wait = min(self.settings.fetch_wait_s, self.settings.fetch_timeout_s / 2)
        if caught_up and wait > 0:
            # Held, the fetch is answered the moment data arrives: a notification and a second fetch
            # would take two more trips through NATS (what an ack ALL waits for).
            timer = asyncio.get_running_loop().call_later(wait, self._answer_held, req.replica_id, req.session, msg)
            keys = frozenset((p.stream, p.partition) for p in req.partitions)
            self._held.setdefault(req.replica_id, {})[req.session] = _Held(req, msg, keys, timer)
            return
        await self._respond(msg, reply)

    async def _respond(self, msg: NatsMessage, reply: bytes) -> None:
        try:
            await msg.respond(reply)
        except Exception as exc:
            _warn.warning("could not answer a fetch (%d bytes): %r", len(reply), exc)

    def _answer_held(self, replica: str, session: int, msg: NatsMessage | None = None) -> None:
        """Answer ``replica``'s held fetch of ``session`` now (``msg``: only if it is still that one)."""
        sessions = self._held.get(replica)
        held = sessions.get(session) if sessions is not None else None
        if held is None or (msg is not None and held.msg is not msg):
            return
        assert sessions is not None
        del sessions[session]
        if not sessions:
            del self._held[replica]
        held.timer.cancel()
        reply, _ = self._fetch_reply(held.req)
        self._spawn(self._respond(held.msg, reply))

    def _answer_held_of(self, part: Partition) -> None:
        key = (part.stream, part.id)
        for replica, sessions in list(self._held.items()):
            for session, held in list(sessions.items()):
                if key in held.keys:
                    self._answer_held(replica, session)

    def _response_limit(self) -> int:
        """Most bytes of answers in one fetch response."""
        return min(self.settings.max_bytes, int(self._nats.max_payload)) - _RESPONSE_OVERHEAD

    def _fetch_reply(self, req: FetchRequest) -> tuple[bytes, bool]:
        """The encoded answer to a fetch, and whether every partition in it is caught up.

        Answers partitions in turn from where the previous answer to this follower started, until
        the byte budget is spent; those left out are asked for again at once.
        """
        parts = req.partitions
        n = len(parts)
        start = self._rotation.get(req.replica_id, 0) % n
        if len(self._rotation) >= _MAX_FOLLOWERS and req.replica_id not in self._rotation:
            self._rotation.clear()  # ids from the wire: whoever can publish here must not grow it for ever
        self._rotation[req.replica_id] = start + 1
        room = self._response_limit()
        answers: list[_DataAnswer | PartitionRefusal] = []
        caught_up = True
        for i in range(n):
            p = parts[(start + i) % n]
            size = fetch_entry_size(p.stream)
            if room - size <= 0 and answers:
                caught_up = False
                break
            answer = self._answer_partition(req.replica_id, p, max(room - size, 1))
            if isinstance(answer, PartitionRefusal):
                caught_up = False
                size += len(answer.error.message.encode())
            elif answer[4]:
                caught_up = False
                size += len(answer[4])
                if size > room and answers:
                    continue  # a batch larger than what is left: it comes first in a later answer
            answers.append(answer)
            room -= size
        return encode_fetch_response(answers), caught_up

    def _answer_partition(self, replica: str, p: PartitionFetch, max_bytes: int) -> _DataAnswer | PartitionRefusal:
        part = self._served.get((p.stream, p.partition))
        leader = part.leader if part is not None else None
        log_ = part.log if part is not None else None
        if part is None or leader is None or log_ is None:
            error = fetch_refusal(self.server_id, None, 0, 0, 0, p)
            assert error is not None
            return PartitionRefusal(p.stream, p.partition, error)
        start = log_.log_start_offset
        error = fetch_refusal(self.server_id, leader.leader_epoch, part.options.created, start, log_.log_end_offset, p)
        if error is not None:
            return PartitionRefusal(p.stream, p.partition, error)
        moving = bool(part.meta.target) and replica not in leader.isr and self._throttle.limited
        if moving:
            # A replica a reassignment is adding, still catching up: it gets what the rate allows.
            max_bytes = min(max_bytes, self._throttle.available())
            if max_bytes <= 0:
                return self._refusal(p, FetchErrorCode.THROTTLED, "reassignment rate", leader.leader_epoch, start)
        try:
            answer, data = part.serve_fetch(replica, p.offset, p.leader_epoch, max_bytes)
        except (ValueError, StorageError) as exc:
            return self._refusal(p, FetchErrorCode.UNKNOWN_PARTITION, str(exc), leader.leader_epoch, start)
        if moving:
            self._throttle.spend(len(data))
        return (p.stream, p.partition, answer.leader_epoch, answer.hw, data)

    @staticmethod
    def _refusal(p: PartitionFetch, code: FetchErrorCode, message: str, epoch: int, start: int) -> PartitionRefusal:
        return PartitionRefusal(p.stream, p.partition, FetchError(code, message, epoch, start))

    async def _serve_epoch(self, msg: NatsMessage) -> None:
        try:
            req = decode_epoch_offset_request(msg.data)
        except ProtocolError as exc:
            _warn.warning("malformed epoch offset request on %s: %s", msg.subject, exc)
            return
        part = self._served.get((req.stream, req.partition))
        leader = part.leader if part is not None else None
        log_ = part.log if part is not None else None
        if part is None or leader is None or log_ is None:
            error = epoch_question_refusal(self.server_id, None, 0, 0, req)
        else:
            error = epoch_question_refusal(
                self.server_id, leader.leader_epoch, part.options.created, log_.log_start_offset, req
            )
        if error is not None:
            reply = encode_fetch_error(error)
        else:
            assert part is not None and log_ is not None
            epoch, end = part.epoch_end(req.leader_epoch)
            reply = encode_epoch_offset_response(EpochOffsetResponse(epoch, end, log_.log_start_offset))
        await self._respond(msg, reply)

    def on_leader_actions(self, part: Partition, actions: Sequence[LeaderAction]) -> None:
        """What led partitions' cores ask for: wake followers (answer held fetches, or notify), propose ISRs."""
        key = (part.stream, part.id)
        for action in actions:
            if isinstance(action, NotifyFollowers):
                for follower in action.replicas:
                    held = [s for s, h in self._held.get(follower, {}).items() if key in h.keys]
                    if held:
                        self._wake_held.update((follower, s) for s in held)
                    else:
                        self._outbox.setdefault(follower, set()).add(key)
                if not self._flush_scheduled:
                    self._flush_scheduled = True
                    asyncio.get_running_loop().call_soon(self._flush_notifications)
            elif isinstance(action, ProposeIsr):
                # Decided now, not when the sending task runs: by then the metadata may show a newer
                # partition epoch (a shrink that let the HW pass a joiner), and a request built
                # from it would admit a replica that lacks committed messages.
                change = isr_change(self.server_id, part.meta, action)
                if change is None:
                    log.debug("%s: ISR proposal %s is stale", part, ",".join(action.isr))
                    continue
                log.info("%s: proposing ISR %s (%s)", part, ",".join(action.isr), action.reason)
                self._spawn(self._propose_isr(part, change))

    def _flush_notifications(self) -> None:
        self._flush_scheduled = False
        wake, self._wake_held = self._wake_held, set()
        for follower, session in wake:
            self._answer_held(follower, session)
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
            schedule = FetchScheduler(self.server_id, meta.leader, self.settings.idle_wait_s)
            loop = self._loops[meta.leader] = _Loop(schedule)
            loop.task = asyncio.get_running_loop().create_task(self._fetch_loop(loop), name=f"fetch-from-{meta.leader}")
        key = (part.stream, part.id)
        member = loop.schedule.join(key, core, part.options.created, fetch_entry_size(part.stream))
        loop.parts[key] = part
        self._carry_out(loop, member, core.start())
        loop.wake.set()

    def unfollow(self, part: Partition) -> None:
        key = (part.stream, part.id)
        for loop in self._loops.values():
            loop.leave(key)
        part.follower = None

    async def _on_notify(self, msg: NatsMessage) -> None:
        try:
            pairs = decode_notification(msg.data)
        except ProtocolError as exc:
            _warn.warning("malformed notification on %s: %s", msg.subject, exc)
            return
        for loop in self._loops.values():
            if loop.schedule.notify(pairs):
                loop.wake.set()

    async def _fetch_loop(self, loop: _Loop) -> None:
        try:
            await self._fetch_rounds(loop)
        except asyncio.CancelledError:
            raise
        except BaseException:
            log.exception("the fetch loop from %s stopped", loop.schedule.leader)
            raise

    async def _fetch_rounds(self, loop: _Loop) -> None:
        """Send what the schedule says is due; wait until it is woken or the next partition is due."""
        clock = asyncio.get_running_loop().time
        in_flight: set[asyncio.Task[None]] = set()

        def run(coro: Awaitable[None]) -> None:
            task = asyncio.ensure_future(coro)
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)

        try:
            while True:
                loop.wake.clear()  # before looking: an answer that lands meanwhile sets it again
                due = loop.schedule.poll(clock())
                for question in due.questions:
                    run(self._request_epoch(loop, question))
                for out in due.fetches:
                    run(self._fetch(loop, out))
                if due.wait is not None:
                    await loop.wake.wait(due.wait)
        finally:
            for task in in_flight:
                task.cancel()

    async def _fetch(self, loop: _Loop, out: FetchOut) -> None:
        try:
            msg = await self._nats.request(
                fetch_subject(self._ns, loop.schedule.leader),
                encode_fetch_request(out.request),
                timeout=self.settings.fetch_timeout_s,
            )
            resp = decode_fetch_response(msg.data)
            self.fetches += 1
            self.fetched_bytes += len(msg.data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("a fetch of %d partitions from %s failed: %r", len(out.members), loop.schedule.leader, exc)
            for m in loop.schedule.failed(out):
                self._carry_out(loop, m, m.core.failed(self._clock()), delay=self.settings.retry_s)
            return
        finally:
            loop.wake.set()  # the next requests (if any) are due now or later
        for applied in loop.schedule.answered(out, resp.partitions):
            self._apply(loop, applied)

    def _apply(self, loop: _Loop, applied: Applied) -> None:
        member, sent, answer = applied.member, applied.sent, applied.answer
        if isinstance(answer, PartitionRefusal):
            self._refused(loop, member, answer.error)
            return
        part, core = loop.parts[member.key], member.core
        try:
            actions = core.fetched(answer.leader_epoch, answer.hw, sent.offset, not answer.batches, self._clock())
            if actions and isinstance(actions[0], Append):
                assert part.log is not None
                before = part.log.log_end_offset
                with _storage():
                    part.log.append_raw(answer.batches)
                part.messages_replicated += part.log.log_end_offset - before
                part.bytes_replicated += part.log.last_append_bytes
                part.write_succeeded()
                part.appended()
                actions = actions[1:] + core.appended(part.log.log_end_offset, self._clock())
            self._carry_out(loop, member, actions)
        except _StorageFailed as failed:
            self._storage_failed(part, failed.cause)

    def _refused(self, loop: _Loop, member: Member, error: FetchError) -> None:
        part, core = loop.parts[member.key], member.core
        if error.code is FetchErrorCode.THROTTLED:
            self._carry_out(loop, member, core.throttled(self._clock()), delay=self.settings.retry_s)
            return
        if error.code is FetchErrorCode.OFFSET_OUT_OF_RANGE:
            try:
                self._out_of_range(part, core, error)
            except _StorageFailed as failed:
                self._storage_failed(part, failed.cause)
            return
        log.debug("%s: %s refused a request: %s: %s", part, core.leader, error.code.name, error.message)
        self._carry_out(loop, member, core.failed(self._clock()), delay=self.settings.retry_s)

    async def _request_epoch(self, loop: _Loop, question: EpochQuestion) -> None:
        member = question.member
        part, core = loop.parts[member.key], member.core
        try:
            msg = await self._nats.request(
                offset_subject(self._ns, core.leader),
                encode_epoch_offset_request(question.question),
                timeout=self.settings.fetch_timeout_s,
            )
            reply = decode_epoch_offset_reply(msg.data)
            if not loop.schedule.current(member) or part.log is None:
                return
            if isinstance(reply, FetchError):
                self._refused(loop, member, reply)
                return
            local = part.epoch_end(reply.leader_epoch)[1]  # unused by the core when the epoch is -1
            self._carry_out(loop, member, core.epoch_offset(reply.leader_epoch, reply.end_offset, local))
        except asyncio.CancelledError:
            raise
        except _StorageFailed as failed:
            if loop.schedule.current(member):
                self._storage_failed(part, failed.cause)
        except Exception as exc:
            if loop.schedule.current(member):
                log.debug("%s: epoch offset request to %s failed: %r", part, core.leader, exc)
                self._carry_out(loop, member, core.failed(self._clock()), delay=self.settings.retry_s)
        finally:
            loop.wake.set()

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

    def _carry_out(self, loop: _Loop, member: Member, actions: list[FollowerAction], delay: float = 0.0) -> None:
        """Do what the core asks of the log; the schedule keeps its next request or sleep."""
        part = loop.parts[member.key]
        for action in loop.schedule.schedule(member, actions, asyncio.get_running_loop().time(), delay):
            if isinstance(action, Truncate):
                assert part.log is not None
                log.info("%s: truncating to offset %d (leader epoch check)", part, action.offset)
                with _storage():
                    part.log.truncate_to(action.offset)
            elif isinstance(action, SetHighWatermark):
                part.set_high_watermark(action.hw)
            elif isinstance(action, ReportLeader):
                log.warning("%s: leader %s silent for %d ms", part, action.leader, action.silent_ns // 1_000_000)
                self._spawn(self._report_leader(part, action))
