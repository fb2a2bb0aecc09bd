"""The scenarios of ``liftlog bench``: what each one sends, and how it measures.

Each scenario is an async function of the client, the settings, a fresh
stream's name and subject and a message count, returning a :class:`Result`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from liftlog.cli.common import CommandError
from liftlog.cli.messages import to_ack_policy

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient
    from nats.aio.msg import Msg

    from liftlog.client import Client, Consumer, Subscription

__all__ = ["DEFAULT_COUNTS", "RUNNERS", "SCENARIOS", "Result", "Settings", "percentiles"]

#: Messages per scenario by default: the whole run, server start included, takes about half a minute on
#: 2 cores at today's gRPC speed (the consume prefill through PublishAsync dominates).
DEFAULT_COUNTS = {
    "sync": 3000,
    "async": 20_000,
    "concurrent": 8000,
    "nats": 50_000,
    "consume": 50_000,
    "e2e": 3000,
    "cursor": 2000,
    "rebalance": 5,
}
#: What runs without --scenarios; cursor (SetCursor calls) and rebalance (members joining) run when named.
SCENARIOS = ("sync", "async", "concurrent", "nats", "consume", "e2e")
ALL_SCENARIOS = tuple(DEFAULT_COUNTS)


@dataclass
class Settings:
    """The command line's choices, shared by every scenario."""

    size: int
    partitions: int
    ack_policy: str
    window: int
    concurrency: int
    counts: dict[str, int]
    nats_url: str
    #: Create the streams with encryption at rest (the server needs a master key).
    encryption: bool = False


@dataclass
class Result:
    """One scenario's figures; ``latencies_ns`` become percentiles in the JSON.

    ``completions_ns`` are when each message (ack, receipt, call) completed and ``started_ns`` when the
    measured part began, both ``time.perf_counter_ns()``: ``liftlog bench --plot`` draws throughput over
    time from them. They stay out of the JSON.
    """

    count: int
    seconds: float
    latencies_ns: list[int] | None = None
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    completions_ns: list[int] | None = None
    started_ns: int = 0
    #: (time, label) of events during the run worth marking on a plot, e.g. the kill of a leader.
    marks: list[tuple[int, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "seconds": round(self.seconds, 4),
            "msgs_per_s": round(self.count / self.seconds, 1) if self.seconds > 0 else None,
            "latency_us": percentiles(self.latencies_ns) if self.latencies_ns else None,
            **self.extra,
            "notes": "; ".join(self.notes),
        }


def percentiles(latencies_ns: list[int]) -> dict[str, float]:
    """p50, p99 and p99.9 in microseconds (nearest rank)."""
    ordered = sorted(latencies_ns)

    def rank(q: float) -> float:
        return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)] / 1000, 1)

    return {"p50": rank(0.50), "p99": rank(0.99), "p99.9": rank(0.999)}


def _partition_subject(subject: str, partition: int) -> str:
    # Liftbridge's partition subjects: the stream's subject for partition 0, "<subject>.<n>" for the others.
    return subject if partition == 0 else f"{subject}.{partition}"


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


# -- scenarios -----------------------------------------------------------------
# Each takes the client, the settings, the (new) stream's name and subject and its message count.


async def _warm_up(client: Client, s: Settings, stream: str) -> None:
    """One acked message per partition: the partitions are led and the connection is warm."""
    from liftlog.client import AckPolicy

    for partition in range(s.partitions):
        await client.publish(stream, b"warm-up", partition=partition, ack_policy=AckPolicy.LEADER)


async def _sync(client: Client, s: Settings, stream: str, subject: str, count: int) -> Result:
    await _warm_up(client, s, stream)
    value, policy = os.urandom(s.size), to_ack_policy(s.ack_policy)
    latencies, done = [], []
    started, started_ns = time.perf_counter(), time.perf_counter_ns()
    for i in range(count):
        t0 = time.perf_counter_ns()
        await client.publish(stream, value, partition=i % s.partitions, ack_policy=policy)
        t1 = time.perf_counter_ns()
        latencies.append(t1 - t0)
        done.append(t1)
    return Result(count, time.perf_counter() - started, latencies, ["1 publisher"], {}, done, started_ns)


async def _async(client: Client, s: Settings, stream: str, subject: str, count: int) -> Result:
    from liftlog.client import AckPolicy

    await _warm_up(client, s, stream)
    value, policy = os.urandom(s.size), to_ack_policy(s.ack_policy)
    latencies: list[int] = []
    done: list[int] = []

    async def feed(partition: int, n: int) -> None:
        # publish_many returns every ack at the end, but it takes message i + window from this
        # generator only once a window slot is free, and acks come in order: so message i's ack
        # arrived at about the time message i + window is taken. The gap is its latency (an upper
        # bound: it includes waking the writer).
        taken: list[int] = []

        async def values() -> AsyncIterator[bytes]:
            for _ in range(n):
                taken.append(time.perf_counter_ns())
                yield value

        await client.publish_many(stream, values(), partition=partition, ack_policy=policy, window=s.window)
        finished = time.perf_counter_ns()
        latencies.extend(taken[i + s.window] - taken[i] for i in range(len(taken) - s.window))
        # Completion times by the same inference; the last window's acks came by the time publish_many returned.
        done.extend(taken[s.window :])
        done.extend([finished] * min(s.window, len(taken)))

    started, started_ns = time.perf_counter(), time.perf_counter_ns()
    await asyncio.gather(*(feed(p, n) for p, n in enumerate(_split(count, s.partitions)) if n))
    elapsed = time.perf_counter() - started
    notes = [f"window {s.window}"]
    extra: dict[str, Any] = {}
    if policy == AckPolicy.NONE:
        latencies = []
        notes.append("no acks, no latency")
    elif latencies:
        extra["latency_method"] = (
            "message i's latency is when message i+window was taken from the input (a window slot freed by "
            "i's ack) minus when i was: publish_many reports no per-message ack times; the last window of "
            "messages per partition has no figure"
        )
    else:
        notes.append("no latency: count <= window")
    return Result(count, elapsed, latencies or None, notes, extra, done, started_ns)


async def _concurrent(client: Client, s: Settings, stream: str, subject: str, count: int) -> Result:
    await _warm_up(client, s, stream)
    value, policy = os.urandom(s.size), to_ack_policy(s.ack_policy)
    per_task = max(1, count // s.concurrency)
    latencies: list[int] = []
    done: list[int] = []

    async def publisher(task: int) -> None:
        for _ in range(per_task):
            t0 = time.perf_counter_ns()
            await client.publish(stream, value, partition=task % s.partitions, ack_policy=policy)
            t1 = time.perf_counter_ns()
            latencies.append(t1 - t0)
            done.append(t1)

    started, started_ns = time.perf_counter(), time.perf_counter_ns()
    await asyncio.gather(*(publisher(t) for t in range(s.concurrency)))
    notes = [f"{s.concurrency} publishers x {per_task}"]
    elapsed = time.perf_counter() - started
    return Result(per_task * s.concurrency, elapsed, latencies, notes, {}, done, started_ns)


async def _nats(client: Client, s: Settings, stream: str, subject: str, count: int) -> Result:
    import nats

    from liftlog.api import api_pb2
    from liftlog.api.envelope import EnvelopeError, decode_ack, encode_publish_message

    errors: list[Exception] = []

    async def remember(exc: Exception) -> None:  # instead of nats-py's logging of every connection error
        errors.append(exc)

    try:
        # max_reconnect_attempts=0 would mean "forever" to nats-py; 1 gives up after a second try.
        nc = await nats.connect(
            s.nats_url, connect_timeout=3, max_reconnect_attempts=1, reconnect_time_wait=0.2, error_cb=remember
        )
    except nats.errors.NoServersError:
        why = f": {errors[-1]}" if errors else ""
        raise CommandError(f"cannot connect to NATS at {s.nats_url}{why} (see --nats-url)") from None
    try:
        value = os.urandom(s.size)
        subjects = [_partition_subject(subject, p) for p in range(s.partitions)]
        policy = s.ack_policy.upper()  # the protobuf constructor takes enum names
        inbox = nc.new_inbox()
        window = asyncio.Semaphore(s.window)
        sent_at: dict[str, int] = {}
        latencies: list[int] = []
        done_at: list[int] = []
        failed = 0
        done = asyncio.Event()

        async def on_ack(msg: Msg) -> None:
            nonlocal failed
            received = time.perf_counter_ns()
            try:
                ack = decode_ack(msg.data)
            except EnvelopeError:
                return
            started_ns = sent_at.pop(ack.correlationId, None)
            if started_ns is None:  # a warm-up ack
                return
            latencies.append(received - started_ns)
            done_at.append(received)
            failed += ack.ackError != api_pb2.Ack.OK
            window.release()
            if len(latencies) == count:
                done.set()

        await nc.subscribe(inbox, cb=on_ack)
        await _nats_warm_up(nc, subjects, inbox)
        with_acks = s.ack_policy != "none"  # Liftbridge sends no ack with AckPolicy NONE
        started, begun_ns = time.perf_counter(), time.perf_counter_ns()
        for i in range(count):
            cid = str(i)
            message = api_pb2.Message(value=value, ackPolicy=policy, correlationId=cid)
            if with_acks:
                message.ackInbox = inbox
                await window.acquire()
                sent_at[cid] = time.perf_counter_ns()
            await nc.publish(subjects[i % len(subjects)], encode_publish_message(message))
        await nc.flush()
        if with_acks:
            await done.wait()
        elapsed = time.perf_counter() - started
    finally:
        await nc.close()
    notes = [f"window {s.window}"]
    if not with_acks:
        notes.append("send rate only (ack policy none)")
    if failed:
        notes.append(f"{failed} acks carried an error")
    return Result(count, elapsed, latencies or None, notes, {}, done_at or None, begun_ns)


async def _nats_warm_up(nc: NatsClient, subjects: list[str], inbox: str) -> None:
    """Publish until an ack comes back on every partition subject: the server is subscribed."""
    from liftlog.api import api_pb2
    from liftlog.api.envelope import encode_publish_message

    for subject in subjects:
        cid = f"warm-up-{subject}"
        acked = asyncio.Event()

        async def on_ack(_msg: Msg, acked: asyncio.Event = acked) -> None:
            acked.set()

        warm_inbox = f"{inbox}.warm"
        sub = await nc.subscribe(warm_inbox, cb=on_ack)
        message = api_pb2.Message(value=b"warm-up", ackInbox=warm_inbox, correlationId=cid, ackPolicy=api_pb2.LEADER)
        deadline = time.monotonic() + 10
        while not acked.is_set():
            if time.monotonic() > deadline:
                raise CommandError(f"no ack from the server for NATS subject {subject} within 10 s")
            await nc.publish(subject, encode_publish_message(message))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(acked.wait(), 0.5)
        await sub.unsubscribe()


async def _consume(client: Client, s: Settings, stream: str, subject: str, count: int) -> Result:
    from liftlog.client import AckPolicy, StartPosition, StopPosition

    value = os.urandom(s.size)
    shares = _split(count, s.partitions)
    started = time.perf_counter()
    for partition, n in enumerate(shares):
        for begin in range(0, n, 10_000):  # bounded batches keep the client's memory in check
            k = min(10_000, n - begin)
            await client.publish_many(stream, [value] * k, partition=partition, ack_policy=AckPolicy.ALL, window=1000)
    prefill_s = time.perf_counter() - started

    done: list[int] = []

    async def read(partition: int) -> tuple[int, int]:
        n = size = 0
        sub = client.subscribe(
            stream, partition=partition, start_position=StartPosition.EARLIEST, stop_position=StopPosition.STOP_LATEST
        )
        # Bound once: a receive time costs about 80 ns a message, under 1% of this loop's time at 100k msgs/s.
        now, received = time.perf_counter_ns, done.append
        async with sub:
            async for msg in sub:
                received(now())
                n += 1
                size += len(msg.value)
        return n, size

    started, started_ns = time.perf_counter(), time.perf_counter_ns()
    read_counts = await asyncio.gather(*(read(p) for p in range(s.partitions)))
    elapsed = time.perf_counter() - started
    got, size = sum(n for n, _ in read_counts), sum(b for _, b in read_counts)
    mb_per_s = size / elapsed / 1e6
    notes = [f"{mb_per_s:.1f} MB/s"]
    if got != count:
        notes.append(f"read {got} of {count} messages")
    extra = {"mb_per_s": round(mb_per_s, 2), "prefill_msgs_per_s": round(count / prefill_s, 1)}
    return Result(got, elapsed, None, notes, extra, done, started_ns)


async def _e2e(client: Client, s: Settings, stream: str, subject: str, count: int) -> Result:
    from liftlog.client import StartPosition

    await _warm_up(client, s, stream)
    policy = to_ack_policy(s.ack_policy)
    padding = os.urandom(max(0, s.size - 8))
    latencies: list[int] = []
    done: list[int] = []

    async def receive(sub: Subscription) -> None:
        async for msg in sub:
            received = time.perf_counter_ns()
            latencies.append(received - struct.unpack_from(">q", msg.value)[0])
            done.append(received)
            if len(latencies) >= count:
                return

    # Entering the block waits until the subscription is live, so NEW_ONLY sees every message below.
    async with client.subscribe(stream, partition=0, start_position=StartPosition.NEW_ONLY) as sub:
        receiver = asyncio.create_task(receive(sub))
        try:
            started, started_ns = time.perf_counter(), time.perf_counter_ns()
            for _ in range(count):
                # The value carries its send time; the receiver subtracts it from its receive time.
                value = struct.pack(">q", time.perf_counter_ns()) + padding
                await client.publish(stream, value, partition=0, ack_policy=policy)
            await receiver
            elapsed = time.perf_counter() - started
        finally:
            receiver.cancel()
    notes = ["publish to receive"]
    if s.size < 8:
        notes.append("8-byte values (they carry the send time)")
    return Result(count, elapsed, latencies, notes, {}, done, started_ns)


async def _cursors_ready(client: Client, stream: str) -> None:
    """Wait (up to 20 s) until the server's __cursors stream exists: it is created after the server starts."""
    from liftlog.client import UnavailableError

    for _ in range(200):
        try:
            await client.fetch_cursor("bench", stream)
            return
        except UnavailableError:
            await asyncio.sleep(0.1)


async def _cursor(client: Client, s: Settings, stream: str, subject: str, count: int) -> Result:
    """SetCursor calls one after another (16 cursors), each durable (ack ALL) before the next."""
    await _cursors_ready(client, stream)
    latencies, done = [], []
    started, started_ns = time.perf_counter(), time.perf_counter_ns()
    for i in range(count):
        t0 = time.perf_counter_ns()
        await client.set_cursor(f"bench-{i % 16}", stream, i, partition=i % s.partitions)
        t1 = time.perf_counter_ns()
        latencies.append(t1 - t0)
        done.append(t1)
    notes = ["SetCursor, 1 caller, 16 cursors"]
    return Result(count, time.perf_counter() - started, latencies, notes, {}, done, started_ns)


async def _rebalance(client: Client, s: Settings, stream: str, subject: str, count: int) -> Result:
    """A member joins a group whose one member reads a 4-partition stream under load: join to its first message.

    ``count`` joins, one after another (each member leaves before the next joins); the latencies are
    the join-to-first-message times.
    """
    from liftlog.client import AckPolicy, StartPosition

    shared = f"{stream}-g"
    await client.create_stream(f"{subject}.g", shared, partitions=4)
    value = os.urandom(s.size)
    stop = asyncio.Event()

    async def publish() -> None:
        i = 0
        while not stop.is_set():
            await client.publish(shared, value, partition=i % 4, ack_policy=AckPolicy.LEADER)
            i += 1
            await asyncio.sleep(0.001)

    async def drain(consumer: Consumer) -> None:
        async for _ in consumer:
            pass

    publisher = asyncio.create_task(publish())
    first = client.consumer(f"{stream}-group", [shared], auto_checkpoint=None, start_position=StartPosition.NEW_ONLY)
    await first.start()
    reader = asyncio.create_task(drain(first))
    latencies: list[int] = []
    done: list[int] = []
    started, started_ns = time.perf_counter(), time.perf_counter_ns()
    try:
        for _ in range(count):
            t0 = time.perf_counter_ns()
            joiner = client.consumer(
                f"{stream}-group", [shared], auto_checkpoint=None, start_position=StartPosition.NEW_ONLY
            )
            await joiner.start()
            await joiner.__anext__()
            t1 = time.perf_counter_ns()
            latencies.append(t1 - t0)
            done.append(t1)
            await joiner.close()
            await asyncio.sleep(0.3)
        elapsed = time.perf_counter() - started
    finally:
        stop.set()
        reader.cancel()
        await asyncio.gather(publisher, reader, return_exceptions=True)
        await first.close()
        with contextlib.suppress(Exception):
            await client.delete_stream(shared)
    notes = ["join of a 2nd member to its first message, 4 partitions"]
    return Result(count, elapsed, latencies, notes, {}, done, started_ns)


RUNNERS: dict[str, Callable[[Client, Settings, str, str, int], Awaitable[Result]]] = {
    "sync": _sync,
    "async": _async,
    "concurrent": _concurrent,
    "nats": _nats,
    "consume": _consume,
    "e2e": _e2e,
    "cursor": _cursor,
    "rebalance": _rebalance,
}
