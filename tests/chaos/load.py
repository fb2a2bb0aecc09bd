"""A heavy workload for chaos runs: windowed PublishAsync on every partition of several streams, with every ack
policy, and concurrent committed-read consumers, all on one asyncio loop in a thread; and the ``Monitor``
that tracks leaders (for the publishers and for the checker's ack-LEADER rule) and fenced replicas.

Every message is recorded as a ``Publication`` with its outcome: acked (offset, acking server, times),
unknown (its call broke before the ack came, or the ack carried an error that may follow a write), refused
(an async error that certainly precedes the write). By default nothing is resent: a value is published
once, so any duplicate in a log is a violation, and an unknown outcome only excuses its absence. Ack NONE
messages get no answer: they are published at a bounded rate and only counted.

With ``LoadSpec.retry`` every ack-ALL and ack-LEADER message carries a message id (``Nats-Msg-Id``, its
value) and a message whose attempt ended unknown is sent again, the same bytes with the same id, now and
then through another server than the leader, until it is acked or refused or the run ends. Each partition
must then store it once (the duplicate window), and a ``duplicate`` ack must name the original's offset.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import random
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio  # type: ignore[import-untyped, unused-ignore]

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.replication.duplicates import MSG_ID_HEADER

from .checker import Attempt, Key, Outcome, Publication, Served
from .cluster import ChaosCluster, channel_options

__all__ = ["LoadSpec", "LoadWorkload", "Monitor"]

PAE = api_pb2.PublishAsyncError
#: Async errors given before the message is written: it is certainly not stored.
_REFUSALS = {PAE.BAD_REQUEST, PAE.READONLY, PAE.PERMISSION_DENIED}


class Monitor:
    """Every ``interval`` s: the freshest leader of every partition, their changes, and every fenced replica."""

    def __init__(self, cluster: ChaosCluster, streams: list[str], interval: float = 0.25) -> None:
        self.cluster = cluster
        self.streams = streams
        self.interval = interval
        self.leaders: dict[Key, str] = {}
        #: (monotonic time, key, leader) whenever a key's leader changed (including to none: "").
        self.history: list[tuple[float, Key, str]] = []
        #: (server, stream, partition) -> reason, for every fenced replica any status answer listed.
        self.fenced_seen: dict[tuple[str, str, int], str] = {}
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)

    def start(self) -> Monitor:
        self._poll()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._poll()
            except Exception:  # the next look may work; the monitor must not die
                time.sleep(self.interval)

    def _poll(self) -> None:
        self.polls += 1
        best: tuple[int, Any] | None = None
        for sid in self.cluster.reachable():
            try:
                status = self.cluster.status(sid, 0.5)
                for p in status.fenced:
                    self.fenced_seen.setdefault((p.server or sid, p.stream, p.partition), p.reason)
                meta = self.cluster.api(sid).FetchMetadata(
                    api_pb2.FetchMetadataRequest(streams=self.streams), timeout=0.5
                )
            except grpc.RpcError:
                continue
            if best is None or status.appliedIndex > best[0]:
                best = (status.appliedIndex, meta)
        if best is None:
            return
        now = time.monotonic()
        fresh: dict[Key, str] = {}
        for sm in best[1].streamMetadata:
            for pid, p in sm.partitions.items():
                fresh[(sm.name, pid)] = p.leader
        for key, leader in fresh.items():
            if self.leaders.get(key) != leader:
                self.history.append((now, key, leader))
        self.leaders = {k: v for k, v in fresh.items() if v}


@dataclass(frozen=True)
class LoadSpec:
    """What to run. Every partition of every stream gets an ack-ALL publisher; ``leader_streams`` also an
    ack-LEADER one, ``none_streams`` also an ack-NONE one (at ``none_rate`` messages/s); ``consumers`` of the
    streams' partitions (round robin) follow them with committed reads."""

    streams: tuple[str, ...] = ("chaos0", "chaos1", "chaos2")
    partitions: int = 2
    window: int = 200
    leader_streams: tuple[str, ...] = ("chaos1", "chaos2")
    none_streams: tuple[str, ...] = ("chaos2",)
    none_rate: float = 200.0
    consumers: int = 4
    #: Seconds without an ack while some are owed before a call is given up (its messages: unknown).
    stall_s: float = 5.0
    #: Resend every ack-ALL and ack-LEADER message whose attempt ended unknown (the call broke or stalled, or
    #: an error that may follow a write), with the same value and message id, until it is acked or refused
    #: or the run ends. Every such message then carries an id (``Nats-Msg-Id``).
    retry: bool = False
    #: With ``retry``: the share of the calls that resend something which go through a random other
    #: reachable server (its publishes reach the leader over NATS) instead of the leader.
    retry_elsewhere: float = 0.3
    #: With ``retry``: a message is resent no sooner than this after its last attempt ended, times the
    #: attempts so far (at most 10 times), so that a partition refusing everything is not hammered.
    retry_backoff_s: float = 0.1


@dataclass
class _Publisher:
    """One publisher's state across its PublishAsync calls (event loop only): the next sequence number and,
    with retries, the messages owed another attempt, each with the moment it may go (oldest first)."""

    name: str
    key: Key
    policy: api_pb2.AckPolicy
    seq: int = 0
    resend: deque[tuple[float, Publication]] = field(default_factory=deque)


def _frames(frame: Any, limit: int) -> list[Any]:
    out: list[Any] = []
    while frame is not None and len(out) < limit:
        out.append(frame)
        frame = frame.f_back
    return out


class LoadWorkload:
    """Runs a ``LoadSpec`` against a cluster until ``stop()``; exposes what the checker needs."""

    def __init__(
        self, cluster: ChaosCluster, monitor: Monitor, spec: LoadSpec = LoadSpec(), rng: random.Random | None = None
    ) -> None:
        self.cluster = cluster
        self.monitor = monitor
        self.spec = spec
        #: Which server a resending call goes through (seeded by the run).
        self.rng = rng or random.Random(0)
        self.publications: list[Publication] = []
        self.served: list[Served] = []
        self.errors: list[str] = []
        #: time.monotonic() of every ack, in order (for wait_acked).
        self.ack_times: list[float] = []
        self.calls = 0  # PublishAsync calls opened
        self._stop = False
        self._stopped_at = float("inf")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(),), daemon=True)
        self._channels: dict[str, Any] = {}

    @property
    def keys(self) -> list[Key]:
        return [(s, p) for s in self.spec.streams for p in range(self.spec.partitions)]

    @property
    def streams(self) -> list[str]:
        return list(self.spec.streams)

    def start(self) -> LoadWorkload:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop publishing, wait for the outstanding acks (or the calls to give up), and close."""
        if self._stop:
            return
        self._stopped_at = time.monotonic()
        self._stop = True
        self._thread.join(self.spec.stall_s + 15)
        if self._thread.is_alive():
            self.errors.append(f"the workload's loop did not stop in time; it is at {self.where()}; {self.waiting()}")
        now = time.monotonic()
        for pub in self.publications:
            if not pub.attempts:  # only if the loop did not finish: its answer never came
                pub.attempts.append(Attempt("", Outcome.UNKNOWN, now, now, detail="unanswered at the end"))

    def where(self) -> str:
        """Where the workload's thread is now (to tell a blocked loop from a quiet cluster)."""
        frame = sys._current_frames().get(self._thread.ident or -1)
        if frame is None:
            return "not running"
        return " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in _frames(frame, 8))

    def waiting(self) -> str:
        """What the loop's unfinished tasks await (read from another thread: a diagnosis, not exact)."""
        try:
            tasks = list(asyncio.all_tasks(self._loop))
        except RuntimeError:
            return "tasks unreadable"
        out = []
        for task in tasks[:8]:
            stack = task.get_stack(limit=3)
            out.append(" <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in stack) or repr(task))
        return f"{len(tasks)} tasks: " + " | ".join(out)

    def acked_between(self, start: float, end: float = float("inf")) -> int:
        return bisect.bisect_left(self.ack_times, end) - bisect.bisect_left(self.ack_times, start)

    def wait_acked(self, count: int, after: float, timeout: float = 20.0) -> float:
        """Wait until ``count`` messages were acked after ``after``; return how long it took."""
        started = time.monotonic()
        while self.acked_between(after) < count:
            if time.monotonic() - started > timeout:
                raise AssertionError(
                    f"only {self.acked_between(after)} of {count} acks within {timeout}s; errors: {self.errors[-3:]}; "
                    f"workload thread at: {self.where()}"
                )
            time.sleep(0.05)
        return time.monotonic() - started

    # -- the loop -------------------------------------------------------------------------------------------

    def _stub(self, sid: str) -> Any:
        channel = self._channels.get(sid)
        if channel is None:
            channel = grpc.aio.insecure_channel(self.cluster.address(sid), options=channel_options())
            self._channels[sid] = channel
        return api_pb2_grpc.APIStub(channel)

    async def _main(self) -> None:
        spec = self.spec
        tasks = []
        for n, key in enumerate(self.keys):
            tasks.append(self._publisher(_Publisher(f"a{n}", key, api_pb2.ALL)))
            if key[0] in spec.leader_streams:
                tasks.append(self._publisher(_Publisher(f"l{n}", key, api_pb2.LEADER)))
            if key[0] in spec.none_streams:
                tasks.append(self._publisher(_Publisher(f"n{n}", key, api_pb2.NONE)))
        keys = self.keys
        for c in range(spec.consumers):
            tasks.append(self._consumer(f"consumer-{c}", keys[(c * 3) % len(keys)]))
        try:
            await asyncio.gather(*tasks)
        finally:
            for channel in self._channels.values():
                await channel.close()

    async def _publisher(self, publisher: _Publisher) -> None:
        while not self._stop:
            leader = self.monitor.leaders.get(publisher.key)
            if leader is None:
                await asyncio.sleep(0.1)
                continue
            try:
                await self._publish_call(publisher, self._route(publisher, leader), leader)
            except Exception as exc:  # a bug in the workload must not look like a quiet cluster
                self.errors.append(f"{publisher.name}: {exc!r}")
            if not self._stop:
                await asyncio.sleep(0.1)

    def _route(self, publisher: _Publisher, leader: str) -> str:
        """The server the next call goes to: the leader, or (sometimes, when resending) another one."""
        if not publisher.resend or self.rng.random() >= self.spec.retry_elsewhere:
            return leader
        others = [sid for sid in self.cluster.reachable() if sid != leader]
        return self.rng.choice(others) if others else leader

    def _unanswered(self, publisher: _Publisher, pub: Publication) -> None:
        """``pub``'s last attempt ended without a definite answer: with retries, send it again later."""
        if self.spec.retry and pub.msg_id:
            backoff = self.spec.retry_backoff_s * min(len(pub.attempts), 10)
            publisher.resend.append((time.monotonic() + backoff, pub))

    def _next(self, publisher: _Publisher) -> Publication:
        """The oldest message owed another attempt if it is due, else a new one."""
        resend = publisher.resend
        if resend and resend[0][0] <= time.monotonic():
            return resend.popleft()[1]
        stream, partition = publisher.key
        value = b"%s-%d" % (publisher.name.encode(), publisher.seq)
        publisher.seq += 1
        with_id = self.spec.retry and publisher.policy != api_pb2.NONE
        pub = Publication(value, partition, stream=stream, policy=publisher.policy, msg_id=value if with_id else b"")
        self.publications.append(pub)
        return pub

    async def _publish_call(self, publisher: _Publisher, server: str, leader: str) -> None:
        """One PublishAsync call to ``server`` (``leader``'s partition leader, or another server that passes
        the publishes on over NATS) until it breaks, stalls, the leader moves (for a call to the leader) or
        the run stops."""
        spec = self.spec
        key, policy = publisher.key, publisher.policy
        stream, partition = key
        call = self._stub(server).PublishAsync()
        self.calls += 1
        pending: dict[str, tuple[Publication, float]] = {}
        window = asyncio.Semaphore(spec.window)
        progress = time.monotonic()
        ended = asyncio.Event()
        why = ""

        async def writer() -> None:
            while not self._stop and not ended.is_set():
                if policy == api_pb2.NONE:
                    await asyncio.sleep(1 / spec.none_rate)
                else:
                    await window.acquire()
                    if self._stop or ended.is_set():
                        return
                pub = self._next(publisher)
                # Unique per attempt: the server routes acks by correlation id, and a late answer to an
                # earlier attempt must not pass for this one's.
                cid = pub.value.decode() + (f"/{len(pub.attempts)}" if pub.attempts else "")
                started = time.monotonic()
                if policy == api_pb2.NONE:
                    pub.attempts.append(Attempt(server, Outcome.UNKNOWN, started, started, detail="ack NONE"))
                else:
                    pending[cid] = (pub, started)
                req = api_pb2.PublishRequest(
                    stream=stream, partition=partition, value=pub.value, ackPolicy=policy, correlationId=cid
                )
                if pub.msg_id:
                    req.headers[MSG_ID_HEADER] = pub.msg_id
                await call.write(req)
            if not ended.is_set():
                await call.done_writing()

        async def watchdog() -> None:
            nonlocal why
            moved_since: float | None = None
            while not ended.is_set():
                await asyncio.sleep(0.25)
                now = time.monotonic()
                if pending and now - progress > spec.stall_s:
                    why = f"no ack for {spec.stall_s}s"
                    call.cancel()
                    return
                current = self.monitor.leaders.get(key)
                moved = server == leader and current not in (None, leader)  # another server passes them on
                moved_since = (moved_since or now) if moved else None
                if moved_since is not None and now - moved_since > 1.0:
                    why = f"leader moved to {current}"
                    call.cancel()
                    return
                if self._stop and not pending:
                    call.cancel()
                    return
                if self._stop and now - self._stopped_at > spec.stall_s:
                    # Answers still trickle in (each one is progress), but the run is over.
                    why = f"{len(pending)} answers still owed {spec.stall_s}s after the stop"
                    call.cancel()
                    return

        write_task = asyncio.ensure_future(writer())
        dog = asyncio.ensure_future(watchdog())
        try:
            async for resp in call:
                item = pending.pop(resp.correlationId, None)
                if item is None:
                    continue
                pub, started = item
                now = time.monotonic()
                progress = now
                window.release()
                if resp.HasField("asyncError"):
                    err = resp.asyncError
                    outcome = Outcome.REFUSED if err.code in _REFUSALS else Outcome.UNKNOWN
                    detail = f"asyncError {PAE.Code.Name(err.code)}: {err.message}"
                    pub.attempts.append(Attempt(server, outcome, started, now, detail=detail))
                    if outcome is Outcome.UNKNOWN:
                        self._unanswered(publisher, pub)
                elif resp.ack.ackError != api_pb2.Ack.OK:
                    detail = f"ackError {resp.ack.ackError}"
                    pub.attempts.append(Attempt(server, Outcome.UNKNOWN, started, now, detail=detail))
                    self._unanswered(publisher, pub)
                else:
                    ack = resp.ack
                    pub.attempts.append(
                        Attempt(server, Outcome.ACKED, started, now, ack.offset, duplicate=ack.duplicate)
                    )
                    self.ack_times.append(now)
                if self._stop and not pending:
                    break
        except grpc.aio.AioRpcError as exc:
            why = why or f"{exc.code().name}: {exc.details()}"
        except asyncio.CancelledError:
            # grpc.aio raises CancelledError for a call whose status is CANCELLED (our own cancel, or a
            # server that went away mid-call); only a cancellation of this task itself may end the loop.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            why = why or "call cancelled"
        finally:
            ended.set()
            call.cancel()
            for task in (write_task, dog):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            now = time.monotonic()
            for pub, started in pending.values():
                pub.attempts.append(Attempt(server, Outcome.UNKNOWN, started, now, detail=why or "call ended"))
                self._unanswered(publisher, pub)
            pending.clear()

    async def _consumer(self, name: str, key: Key) -> None:
        stream, partition = key
        next_offset = 0
        while not self._stop:
            leader = self.monitor.leaders.get(key)
            if leader is None:
                await asyncio.sleep(0.1)
                continue
            req = api_pb2.SubscribeRequest(
                stream=stream, partition=partition, startPosition=api_pb2.OFFSET, startOffset=next_offset
            )
            # Bounded: a leader that is frozen or cut off serves nothing, so look again now and then.
            call = self._stub(leader).Subscribe(req, timeout=3.0)
            try:
                first = True
                async for msg in call:
                    if first:
                        first = False  # the empty message that opens every subscription
                        continue
                    self.served.append(Served(msg.offset, msg.value, leader, time.monotonic(), name, stream, partition))
                    next_offset = msg.offset + 1
                    if self._stop:
                        call.cancel()
                        break
            except grpc.aio.AioRpcError as exc:
                if exc.code() is not grpc.StatusCode.DEADLINE_EXCEEDED:
                    await asyncio.sleep(0.1)
            except Exception as exc:
                self.errors.append(f"{name}: {exc!r}")
                await asyncio.sleep(0.1)
