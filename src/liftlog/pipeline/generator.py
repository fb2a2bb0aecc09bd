"""Synthetic events for the reference pipeline, published as JSON on NATS subjects.

Each event is a user's ``click``, ``view`` or ``order``: a JSON object
``{"seq": 17, "kind": "order", "key": "user-007", "ts": 1700000001700, "value": 1299}``
where ``key`` is the user, ``ts`` the event time (Unix ms) and ``value`` an
amount in cents (orders) or 1. Events are made by :func:`make_events`, a pure
function of :class:`EventSpec`: the same seed gives the same events, so a test
can count them in plain Python. Event time advances ``interval_ms`` per
event; a fraction of the events is *late*: its event time lies up to
``max_lateness_ms`` before that, so they arrive out of order (the job's
watermark is longer than that, so none is dropped).

:func:`publish_events` sends them to NATS, where one liftlog stream with
subject ``<prefix>.*`` and N partitions records them. liftlog, like
Liftbridge, gives partition 0 the stream's subject and partition ``p`` the
subject ``<subject>.<p>``, so an event of kind ``k`` goes to
``<prefix>.<k>`` or ``<prefix>.<k>.<p>``, with ``p = crc32(key) % N``: all
of a user's events land in one partition, in order, as the Liftbridge clients'
key partitioner would put them. The payload is a Liftbridge *Publish*
envelope carrying the key and asking for an ack on one inbox; a plain NATS
publish of the JSON (``nats pub events.click '{...}'``) would be recorded
too, without key or ack.

After the events, :func:`flush_event` (key :data:`FLUSH_KEY`) moves event
time past the last window plus the watermark delay, so the job can close
every window; the job does not count it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import time
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "FLUSH_KEY",
    "KINDS",
    "WATERMARK_MS",
    "WINDOW_MS",
    "Event",
    "EventSpec",
    "GeneratorError",
    "PublishStats",
    "expected_counts",
    "flush_event",
    "make_events",
    "partition_for",
    "publish_events",
    "subject_for",
]

KINDS = ("view", "click", "order")
#: Share of each kind, in the order of KINDS.
_KIND_WEIGHTS = (6, 3, 1)
#: The key of the last event, which only moves event time on (the job leaves it out of its results).
FLUSH_KEY = "__flush__"
#: The job's tumbling window and watermark delay (:mod:`.job`), here so that the generator needs no Spark.
WINDOW_MS = 10_000
WATERMARK_MS = 15_000


class GeneratorError(RuntimeError):
    """Publishing the events failed, or liftlog did not acknowledge them all."""


@dataclass(frozen=True, slots=True)
class Event:
    seq: int
    kind: str
    #: The user: the aggregation key and the liftlog message key.
    key: str
    #: Event time, Unix ms.
    ts: int
    value: int

    def to_json(self) -> bytes:
        doc = {"seq": self.seq, "kind": self.kind, "key": self.key, "ts": self.ts, "value": self.value}
        return json.dumps(doc, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class EventSpec:
    """What :func:`make_events` makes: ``count`` events of ``keys`` users from ``seed``."""

    count: int
    seed: int = 7
    #: Event time of the first event, Unix ms (None: now).
    start_ms: int | None = None
    #: Event time between consecutive events.
    interval_ms: int = 10
    keys: int = 50
    #: Share of events whose event time lies in the past.
    late_fraction: float = 0.05
    #: How far in the past at most; must stay below the job's watermark delay.
    max_lateness_ms: int = 8_000


def make_events(spec: EventSpec) -> list[Event]:
    """The events of ``spec``, in publishing order; a few users are much busier than the rest."""
    rng = random.Random(spec.seed)
    start = int(time.time() * 1000) if spec.start_ms is None else spec.start_ms
    users = [f"user-{i:03d}" for i in range(1, spec.keys + 1)]
    # Cumulative weights, summed once: rng.choices(population, weights) would sum the same ones on every call.
    user_weights = list(itertools.accumulate(1 / (i + 1) for i in range(spec.keys)))  # Zipf-like: a long tail
    kind_weights = list(itertools.accumulate(_KIND_WEIGHTS))
    events = []
    for seq in range(spec.count):
        kind = rng.choices(KINDS, cum_weights=kind_weights)[0]
        key = rng.choices(users, cum_weights=user_weights)[0]
        ts = start + seq * spec.interval_ms
        if spec.max_lateness_ms > 0 and rng.random() < spec.late_fraction:
            ts -= rng.randint(1, spec.max_lateness_ms)
        value = rng.randint(100, 20_000) if kind == "order" else 1
        events.append(Event(seq, kind, key, ts, value))
    return events


def flush_event(events: list[Event], window_ms: int, delay_ms: int) -> Event:
    """An event late enough in event time that the watermark passes the end of every window of ``events``."""
    newest = max((e.ts for e in events), default=int(time.time() * 1000))
    return Event(len(events), "flush", FLUSH_KEY, newest + window_ms + delay_ms + 1_000, 0)


def expected_counts(events: Iterable[Event], window_ms: int) -> dict[tuple[str, int], tuple[int, int]]:
    """(key, window start ms) -> (events, sum of values): what the job computes, in plain Python."""
    counts: dict[tuple[str, int], tuple[int, int]] = {}
    for e in events:
        if e.key == FLUSH_KEY:
            continue
        window = e.ts - e.ts % window_ms
        n, total = counts.get((e.key, window), (0, 0))
        counts[(e.key, window)] = (n + 1, total + e.value)
    return counts


def partition_for(key: str, partitions: int) -> int:
    """The partition of a key: the Liftbridge clients' key partitioner."""
    return zlib.crc32(key.encode()) % partitions


def subject_for(prefix: str, event: Event, partitions: int) -> str:
    """The NATS subject that the stream ``<prefix>.*``'s partition for ``event.key`` listens on."""
    p = partition_for(event.key, partitions)
    return f"{prefix}.{event.kind}" if p == 0 else f"{prefix}.{event.kind}.{p}"


@dataclass(slots=True)
class PublishStats:
    """Counters of a running :func:`publish_events`, read by progress displays (from any thread)."""

    total: int = 0
    published: int = 0
    acked: int = 0
    started: float = 0.0
    finished: float = 0.0
    #: The events actually published (a deadline can stop the generator early), flush event last.
    sent: list[Event] = field(default_factory=list)

    @property
    def rate(self) -> float:
        end = self.finished or time.monotonic()
        return self.published / (end - self.started) if self.started and end > self.started else 0.0


async def publish_events(
    nats_url: str,
    events: list[Event],
    *,
    prefix: str,
    partitions: int,
    rate: float = 0.0,
    window_ms: int = WINDOW_MS,
    delay_ms: int = WATERMARK_MS,
    deadline: float | None = None,
    ack_timeout: float = 30.0,
    stats: PublishStats | None = None,
) -> PublishStats:
    """Publish ``events`` then a flush event on NATS, at ``rate`` events/s (0: as fast as possible).

    Every event asks liftlog for an ack on one inbox (ack policy LEADER);
    returns once each is acknowledged, raising :class:`GeneratorError` if some
    are not within ``ack_timeout`` seconds of the last publish (no stream on
    ``<prefix>.*``?). ``deadline`` (``time.monotonic()`` value) stops early;
    the flush event follows the events sent so far.
    """
    import nats
    import nats.errors

    from liftlog.api import api_pb2
    from liftlog.api.envelope import EnvelopeError, decode_ack
    from liftlog.client.nats_helpers import encode_publish
    from liftlog.client.types import AckPolicy

    stats = stats if stats is not None else PublishStats()
    stats.total = len(events) + 1
    nats_errors: list[Exception] = []

    async def remember(exc: Exception) -> None:  # instead of nats-py's traceback on stderr for each one
        nats_errors.append(exc)

    try:
        nc = await nats.connect(nats_url, connect_timeout=5, max_reconnect_attempts=3, error_cb=remember)
    except (nats.errors.Error, OSError) as exc:
        last = f" (last error: {nats_errors[-1]})" if nats_errors else ""
        raise GeneratorError(f"cannot connect to NATS at {nats_url}: {exc}{last}") from exc
    acked: set[str] = set()
    refused: list[str] = []
    all_acked = asyncio.Event()

    async def on_ack(msg: object) -> None:
        try:
            ack = decode_ack(msg.data)  # type: ignore[attr-defined]
        except EnvelopeError:
            return
        if ack.ackError != api_pb2.Ack.OK:
            refused.append(f"event {ack.correlationId}: {api_pb2.Ack.Error.Name(ack.ackError)}")
        acked.add(ack.correlationId)
        stats.acked = len(acked)
        if stats.finished and len(acked) >= stats.published:
            all_acked.set()

    try:
        inbox = nc.new_inbox()
        await nc.subscribe(inbox, cb=on_ack)
        stats.started = time.monotonic()
        batch = max(1, int(rate / 50)) if rate > 0 else 200  # publish in small bursts, 50 a second at most
        pending = list(events)
        i = 0
        while i < len(pending):
            if deadline is not None and time.monotonic() >= deadline:
                break
            for event in pending[i : i + batch]:
                payload = encode_publish(
                    event.to_json(),
                    key=event.key,
                    ack_inbox=inbox,
                    correlation_id=str(event.seq),
                    ack_policy=AckPolicy.LEADER,
                )
                await nc.publish(subject_for(prefix, event, partitions), payload)
                stats.sent.append(event)
                stats.published += 1
            i += batch
            if rate > 0:
                due = stats.started + stats.published / rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            else:
                await nc.flush()
        flush = flush_event(stats.sent, window_ms, delay_ms)
        payload = encode_publish(
            flush.to_json(), key=flush.key, ack_inbox=inbox, correlation_id="flush", ack_policy=AckPolicy.LEADER
        )
        await nc.publish(subject_for(prefix, flush, partitions), payload)
        stats.sent.append(flush)
        stats.published += 1
        await nc.flush()
        stats.finished = time.monotonic()
        if len(acked) >= stats.published:
            all_acked.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_acked.wait(), ack_timeout)
        if refused:
            raise GeneratorError(f"liftlog refused {len(refused)} events, first {refused[0]}")
        missing = stats.published - len(acked)
        if missing:
            raise GeneratorError(
                f"{missing} of {stats.published} events were not acknowledged within {ack_timeout:g} s: "
                f"does a liftlog stream with subject {prefix}.* and {partitions} partitions record them?"
            )
    except nats.errors.Error as exc:
        raise GeneratorError(f"publishing to NATS at {nats_url} failed: {exc}") from exc
    finally:
        with contextlib.suppress(nats.errors.Error, OSError):
            await nc.close()
    return stats
