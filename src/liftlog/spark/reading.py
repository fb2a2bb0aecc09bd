"""Finding what to read (driver side) and reading one offset range (task side).

Planning turns the subscription options into stream partitions and their
offset bounds: ``earliest`` is the first retained message, ``end`` is the high
watermark + 1, so only committed messages are ever read. A read task fetches
its range's stored record batches (``liftlog.Batches/Fetch``, about
:data:`FETCH_BYTES` a call) and hands Spark one Arrow record batch per fetch,
built from the decoded column lists. Against a server without that service
(Liftbridge) it subscribes from its range's start with a stop at its last
offset instead, an Arrow batch per :data:`BATCH_ROWS` messages.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from liftlog.client import (
    Client,
    Columns,
    DeadlineExceededError,
    FetchedBatches,
    LiftlogError,
    NoSuchStreamError,
    NotLeaderError,
    OffsetOutOfRangeError,
    StartPosition,
    StopPosition,
    UnavailableError,
    UnimplementedError,
)
from liftlog.client.batches import decode_batches
from liftlog.client.tls import TlsConfig

from .arrow_batches import arrow_batch
from .blocking import BlockingClient, LiftlogSparkError
from .offsets import EARLIEST, LATEST, OffsetRange, PartitionOffsets
from .options import Assign, OffsetSpec, StreamList, StreamPattern, Subscription

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "BATCH_ROWS",
    "Bounds",
    "RangeReader",
    "discover_partitions",
    "fetch_bounds",
    "resolve_offsets",
]

log = logging.getLogger("liftlog.spark")

#: Messages per Arrow record batch handed to Spark (reads through Subscribe).
BATCH_ROWS = 8192
#: Bytes a read task asks for per fetch (an Arrow record batch each).
FETCH_BYTES = 4 << 20
#: How often a read task subscribes again after its partition's leader went away, before it fails.
RESUBSCRIBES = 5
#: How long a read task waits for a partition's high watermark to reach its range's end.
HW_WAIT_S = 10.0


@dataclass(frozen=True, slots=True)
class Bounds:
    """The readable offsets of one partition: ``earliest`` to ``end`` (exclusive, high watermark + 1)."""

    earliest: int
    end: int


async def discover_partitions(client: Client, subscription: Subscription) -> dict[str, list[int]]:
    """Stream -> sorted partition ids for the subscription; raises LiftlogSparkError for unknown ones."""
    if isinstance(subscription, StreamPattern):
        meta = await client.fetch_metadata()
        found = {
            name: sorted(info.partitions) for name, info in meta.streams.items() if subscription.pattern.fullmatch(name)
        }
        return dict(sorted(found.items()))
    names = subscription.streams if isinstance(subscription, StreamList) else tuple(subscription.partitions)
    meta = await client.fetch_metadata(*names)
    result: dict[str, list[int]] = {}
    for name in names:
        info = meta.streams.get(name)
        if info is None:
            raise LiftlogSparkError(f"no such stream {name!r} on liftlog servers {', '.join(client.addresses)}")
        result[name] = sorted(info.partitions)
    if isinstance(subscription, Assign):
        for name, wanted in subscription.partitions.items():
            missing = sorted(set(wanted) - set(result[name]))
            if missing:
                raise LiftlogSparkError(
                    f"stream {name!r} has no partition {', '.join(map(str, missing))} "
                    f"(it has {len(result[name])}: {', '.join(map(str, result[name]))})"
                )
            result[name] = list(wanted)
    return result


async def _first_offset(client: Client, stream: str, partition: int, timestamp_ns: int | None, end: int) -> int:
    """The offset of the first message (received at or after ``timestamp_ns``); ``end`` if there is none."""
    if end == 0:
        return 0
    sub = client.subscribe(
        stream,
        partition=partition,
        start_position=StartPosition.EARLIEST if timestamp_ns is None else StartPosition.TIMESTAMP,
        start_timestamp=timestamp_ns or 0,
        stop_position=StopPosition.STOP_OFFSET,
        stop_offset=end - 1,
    )
    async with sub:
        async for msg in sub:
            return msg.offset
    return end


async def fetch_bounds(
    client: Client, partitions: dict[str, list[int]], *, earliest: bool = True, timestamp_ms: int | None = None
) -> dict[tuple[str, int], Bounds]:
    """Bounds of every partition, asked of the partition leaders concurrently.

    ``earliest`` is the log start offset: the first offset retention kept
    (compaction leaves gaps after it but never moves it). A Liftbridge server
    does not report it; then, only when ``earliest`` is asked for, it is the
    first message's offset (one subscription per partition), else 0. With
    ``timestamp_ms`` ``earliest`` is the first offset received at or after
    that time instead.
    """

    async def one(stream: str, partition: int) -> Bounds:
        info = await client.fetch_partition_metadata(stream, partition)
        end = info.high_watermark + 1
        if timestamp_ms is not None:
            return Bounds(await _first_offset(client, stream, partition, timestamp_ms * 1_000_000, end), end)
        if info.log_start_offset is not None:
            return Bounds(min(info.log_start_offset, end), end)
        if not earliest:
            return Bounds(0, end)
        # A Liftbridge server does not report its log start: take the first message's offset.
        return Bounds(await _first_offset(client, stream, partition, None, end), end)

    keys = [(s, p) for s, ids in partitions.items() for p in ids]
    try:
        found = await asyncio.gather(*(one(s, p) for s, p in keys))
    except NoSuchStreamError as exc:
        raise LiftlogSparkError(f"{exc.message}: it was deleted while the query was planned") from exc
    return dict(zip(keys, found, strict=True))


def resolve_offsets(spec: OffsetSpec, bounds: dict[tuple[str, int], Bounds], *, name: str) -> PartitionOffsets:
    """Concrete offsets for ``spec`` ('earliest', 'latest' or JSON) over the partitions in ``bounds``.

    JSON must name every partition read; a partition or stream it names that is not read is an
    error, as is an offset beyond the partition's end.
    """
    resolved: dict[str, dict[int, int]] = {}
    if isinstance(spec, dict):
        known_streams = {s for s, _ in bounds}
        for stream, parts in spec.items():
            if stream not in known_streams:
                raise LiftlogSparkError(f"{name}: stream {stream!r} is not among the streams read")
            for pid in parts:
                if (stream, pid) not in bounds:
                    raise LiftlogSparkError(f"{name}: stream {stream!r} has no partition {pid} among those read")
    for (stream, pid), b in bounds.items():
        if spec == "earliest":
            wanted = EARLIEST
        elif spec == "latest":
            wanted = LATEST
        else:
            got = spec.get(stream, {}).get(pid)
            if got is None:
                raise LiftlogSparkError(
                    f"{name} gives offsets for stream {stream!r} but not for its partition {pid}: "
                    "name every partition read (-2 for earliest, -1 for latest)"
                )
            wanted = got
        if wanted == EARLIEST:
            offset = b.earliest
        elif wanted == LATEST:
            offset = b.end
        else:
            if wanted > b.end:
                raise LiftlogSparkError(
                    f"{name}: offset {wanted} of stream {stream!r} partition {pid} is out of range: "
                    f"the partition's committed messages end at {b.end - 1} (earliest {b.earliest})"
                )
            offset = wanted
        resolved.setdefault(stream, {})[pid] = offset
    return PartitionOffsets(resolved)


# -- the read task ----------------------------------------------------------------


def arrow_schema(include_headers: bool) -> pa.Schema:
    import pyarrow as pa

    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("stream", pa.string()),
        pa.field("subject", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    ]
    if include_headers:
        header = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
        fields.append(pa.field("headers", pa.list_(header)))
    return pa.schema(fields)


class RangeReader:
    """Reads the messages of one :class:`OffsetRange` as Arrow record batches.

    Checks before reading that the range is still there: its end must not be
    past the high watermark (else the offsets are out of range), and its start
    not before the earliest retained offset (else data was lost to
    retention). With ``fail_on_data_loss`` a loss raises LiftlogSparkError
    naming the stream, partition and the offsets lost; without it the loss is
    logged and the rest is read.
    """

    def __init__(
        self,
        servers: tuple[str, ...],
        rng: OffsetRange,
        *,
        include_headers: bool,
        fail_on_data_loss: bool,
        tls: TlsConfig | None = None,
    ) -> None:
        self.servers = servers
        self.tls = tls
        self.range = rng
        self.include_headers = include_headers
        self.fail_on_data_loss = fail_on_data_loss

    def _lost(self, first: int, upto: int, why: str) -> None:
        r = self.range
        text = (
            f"data loss in stream {r.stream!r} partition {r.partition}: offsets {first} to {upto - 1} "
            f"are no longer in the log ({why}); this read needed offsets {r.start} to {r.end - 1}"
        )
        if self.fail_on_data_loss:
            raise LiftlogSparkError(text + ". Set failOnDataLoss=false to skip lost data, or start from newer offsets.")
        log.warning("%s; skipping them (failOnDataLoss=false)", text)

    def _bounds(self, bc: BlockingClient, *, wait: bool = True) -> Bounds:
        """The partition's bounds, waiting a little for its end to reach the range's.

        Right after a leader change the new leader's high watermark can lag
        the one the range was planned with, for a moment.
        """
        r = self.range
        deadline = time.monotonic() + HW_WAIT_S
        while True:
            (bounds,) = bc.run(lambda c: fetch_bounds(c, {r.stream: [r.partition]})).values()
            if not wait or bounds.end >= r.end or time.monotonic() >= deadline:
                return bounds
            time.sleep(0.2)

    def batches(self) -> Iterator[pa.RecordBatch]:
        r = self.range
        if r.size <= 0:
            return
        schema = arrow_schema(self.include_headers)
        with BlockingClient(self.servers, tls=self.tls) as bc:
            bounds = self._bounds(bc)
            end = r.end
            if end > bounds.end:
                if self.fail_on_data_loss:
                    raise LiftlogSparkError(
                        f"offsets out of range in stream {r.stream!r} partition {r.partition}: this read needs "
                        f"offsets {r.start} to {r.end - 1} but the partition's committed messages end at "
                        f"{bounds.end - 1} (was it truncated or recreated?)"
                    )
                self._lost(bounds.end, end, "the partition ends earlier than planned")
                end = bounds.end
            start = r.start
            if start < bounds.earliest:
                self._lost(start, min(bounds.earliest, end), "removed by retention")
                start = bounds.earliest
            if start >= end:
                return
            try:
                yield from self._fetched(bc, schema, start, end)
            except _NoBatchFetch:
                # A Liftbridge server: one Subscribe message per record instead.
                yield from self._subscribed(bc, schema, start, end)

    def _fetched(self, bc: BlockingClient, schema: pa.Schema, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """``[start, end)`` through ``liftlog.Batches/Fetch``: stored batches, decoded a fetch at a time.

        Raises _NoBatchFetch before yielding anything when the server does not offer it.
        """
        r = self.range
        expected = start
        checked_gap = False
        stalled_since: float | None = None
        while expected < end:
            try:
                got = bc.run(partial(_fetch, r, expected, end))
            except UnimplementedError as exc:
                if expected != start:
                    raise LiftlogSparkError(f"stream {r.stream!r} partition {r.partition}: {exc.message}") from exc
                raise _NoBatchFetch from exc
            except OffsetOutOfRangeError:
                # Retention removed what this read was about to take.
                now = self._bounds(bc, wait=False)
                if now.earliest <= expected:
                    raise
                self._lost(expected, min(now.earliest, end), "removed by retention during the read")
                expected = min(now.earliest, end)
                continue
            except LiftlogError as exc:
                raise LiftlogSparkError(
                    f"reading stream {r.stream!r} partition {r.partition} at offset {expected} failed: {exc.message}"
                ) from exc
            batch = self._decoded(schema, got)
            if batch is not None:
                first = batch.column("offset")[0].as_py()
                if first > expected and not checked_gap and got.log_start_offset > expected:
                    # Retention racing this read (compaction leaves gaps too, but never moves the start).
                    checked_gap = True
                    self._lost(expected, min(got.log_start_offset, first), "removed by retention during the read")
                yield batch
            if got.next_offset > expected:
                expected = got.next_offset
                stalled_since = None
                continue
            # Nothing committed at `expected` yet: a new leader whose high watermark lags the planned end.
            now_t = time.monotonic()
            if stalled_since is None:
                stalled_since = now_t
            elif now_t - stalled_since > HW_WAIT_S:
                raise LiftlogSparkError(
                    f"stream {r.stream!r} partition {r.partition}: offsets {expected} to {end - 1} were planned "
                    f"but are not committed after {HW_WAIT_S:.0f} s (high watermark {got.high_watermark})"
                )
            time.sleep(0.05)

    def _decoded(self, schema: pa.Schema, got: FetchedBatches) -> pa.RecordBatch | None:
        """One fetch's records as a record batch (None when it has none): column-wise when they allow it."""
        r = self.range
        if not self.include_headers:
            done = arrow_batch(got.batches, got.start, got.limit, schema, r.stream, r.partition, got.subject)
            if done is not None:
                return done[0]
        cols, _ = decode_batches(
            got.batches,
            got.start,
            got.limit,
            got.subject,
            out=Columns(r.stream, r.partition),
            headers=self.include_headers,
        )
        return columns_batch(schema, r, cols, self.include_headers) if cols else None

    def _subscribed(self, bc: BlockingClient, schema: pa.Schema, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """``[start, end)`` through Subscribe, for servers without ``liftlog.Batches``."""
        r = self.range
        expected = start
        checked_gap = False
        failures = 0
        while expected < end:
            sub = bc.client.subscribe(
                r.stream,
                partition=r.partition,
                start_position=StartPosition.OFFSET,
                start_offset=expected,
                stop_position=StopPosition.STOP_OFFSET,
                stop_offset=end - 1,
            )
            try:
                while True:
                    chunk, failure = bc.run_coroutine(_take(sub, BATCH_ROWS, self.include_headers))
                    if chunk is not None:
                        offsets = chunk[3]
                        if offsets[0] > expected and not checked_gap:
                            # A gap: compaction, or retention racing this read. Only retention moves the start.
                            checked_gap = True
                            now = self._bounds(bc, wait=False).earliest
                            if now > expected:
                                self._lost(expected, min(now, offsets[0]), "removed by retention during the read")
                        expected = offsets[-1] + 1
                        yield _record_batch(schema, r, chunk, self.include_headers)
                    if failure is not None:
                        # The leader went away mid-read: subscribe again, from the next offset, wherever it is now.
                        failures += 1
                        if failures > RESUBSCRIBES:
                            raise LiftlogSparkError(
                                f"reading stream {r.stream!r} partition {r.partition} failed {failures} times, "
                                f"last at offset {expected}: {failure.message}"
                            ) from failure
                        log.warning("stream %r partition %d: %s; resubscribing", r.stream, r.partition, failure)
                        break
                    if chunk is None:
                        return  # the server ended the subscription at the range's last offset
            finally:
                bc.run_coroutine(sub.close())


async def _fetch(r: OffsetRange, offset: int, end: int, client: Client) -> FetchedBatches:
    return await client.fetch_batches(
        r.stream, partition=r.partition, offset=offset, end_offset=end, max_bytes=FETCH_BYTES
    )


class _NoBatchFetch(Exception):
    """The server does not offer ``liftlog.Batches/Fetch`` (a Liftbridge server)."""


def columns_batch(schema: pa.Schema, r: OffsetRange, cols: Columns, include_headers: bool) -> Any:
    """An Arrow record batch of decoded columns: the column lists go to Arrow as they are."""
    import numpy as np
    import pyarrow as pa

    n = len(cols)
    subject = cols.subjects[0]
    if cols.subjects.count(subject) == n:  # one subject (no wildcard): no Python list for Arrow to walk
        subjects = pa.repeat(pa.scalar(subject, pa.string()), n)
    else:
        subjects = pa.array(cols.subjects, pa.string())
    micros = np.fromiter(cols.timestamps, np.int64, n) // 1000
    columns: list[Any] = [
        pa.array(cols.keys, pa.binary()),
        pa.array(cols.values, pa.binary()),
        pa.repeat(pa.scalar(r.stream, pa.string()), n),
        subjects,
        pa.repeat(pa.scalar(r.partition, pa.int32()), n),
        pa.array(np.fromiter(cols.offsets, np.int64, n)),
        pa.array(micros, pa.timestamp("us", tz="UTC")),
    ]
    if include_headers:
        rows = [[{"key": k, "value": v} for k, v in h.items()] for h in cols.headers]
        columns.append(pa.array(rows, schema.field("headers").type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _record_batch(schema: pa.Schema, r: OffsetRange, chunk: tuple[list[Any], ...], include_headers: bool) -> Any:
    import pyarrow as pa

    keys, values, subjects, offsets, stamps, headers = chunk
    n = len(offsets)
    columns: list[Any] = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.repeat(pa.scalar(r.stream, pa.string()), n),  # one value per batch: no Python list
        pa.array(subjects, pa.string()),
        pa.repeat(pa.scalar(r.partition, pa.int32()), n),
        pa.array(offsets, pa.int64()),
        pa.array(stamps, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
    ]
    if include_headers:
        columns.append(pa.array(headers, schema.field("headers").type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


async def _take(
    sub: Any, limit: int, include_headers: bool
) -> tuple[tuple[list[Any], ...] | None, LiftlogError | None]:
    """Up to ``limit`` messages from the subscription as column lists (None if none), and why it broke off.

    A failure that moving to another server can cure (the leader went away or
    changed) is returned with the messages read before it; others raise.
    """
    keys: list[bytes | None] = []
    values: list[bytes] = []
    subjects: list[str] = []
    offsets: list[int] = []
    stamps: list[int] = []
    headers: list[list[dict[str, Any]]] = []
    failure: LiftlogError | None = None
    try:
        async for msg in sub:
            keys.append(msg.key)
            values.append(msg.value)
            subjects.append(msg.subject)
            offsets.append(msg.offset)
            stamps.append(msg.timestamp // 1000)
            if include_headers:
                headers.append([{"key": k, "value": v} for k, v in msg.headers.items()])
            if len(offsets) >= limit:
                break
    except (UnavailableError, NotLeaderError, DeadlineExceededError) as exc:
        failure = exc
    if not offsets:
        return None, failure
    return (keys, values, subjects, offsets, stamps, headers), failure
