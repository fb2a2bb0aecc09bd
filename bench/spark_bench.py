"""Spark read benchmark: prints one JSON line.

    python bench/spark_bench.py [--messages N] [--size B] [--partitions P] [--runs N] [--addr HOST:PORT]

Publishes --messages values of --size bytes over --partitions partitions of
a new stream (PublishAsync per partition, all partitions at once, ack ALL so
every message is committed before the reads), then times reading all of it
back:

  raw_1proc            our asyncio Client, one process, every partition at once: read_range
                       (liftlog.Batches/Fetch), a Message object per record
  raw_2proc            the same split over 2 processes (Spark's local[2] gets 2 cores too)
  raw_columns_1proc    read_range's column lists only (the client's fastest read)
  raw_subscribe_1proc  a Subscribe call per partition, a Message per record
  raw_arrow_1proc      not the client's: Client.fetch_batches decoded by the Spark source's own
                       column-wise decoder (liftlog.spark.arrow_batches) into Arrow record batches,
                       outside Spark; shown for what Spark itself costs, not part of the goal
  spark_batch   spark.read.format("liftlog")...load().count() in local[2]
  spark_stream  readStream ... writeStream.format("noop"), Trigger.AvailableNow; timed whole, with the
                query's start (Spark starts a new Python process for the stream reader of every query);
                micro_batch_rows_per_s is the same rows over the micro-batches' own time (addBatch)
  spark_stream_write  readStream ... writeStream.format("liftlog") into a new stream, exactly once

Each read goes from offset 0 to the end. Spark's session start, a warm-up read of a tiny stream and a
warm-up copy of it are not timed. Every read runs --runs times (default 3) and the best counts: a
session's first Spark run also warms the JVM's JIT. Unless
--addr is given, a server with embedded NATS is started in a temporary
directory on free loopback ports. Progress goes to stderr; so does anything
Spark prints, and stdout carries only the JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import platform
import queue
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Console

from liftlog.cli.bench_processes import spawned_server
from liftlog.client import AckPolicy, Client, LiftlogError, StartPosition, StopPosition

GOAL = 0.8  # Spark should read at >= 80% of the raw client's best rate
SPARK_BATCH_GOAL = 300_000  # rows/s, issue 13
SPARK_WRITE_GOAL = 100_000  # rows/s, exactly once, issue 13
WARM_MESSAGES = 400  # the warm-up stream, spread over the same partitions
console = Console(stderr=True, highlight=False)


def note(text: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {text}")


# -- the server -------------------------------------------------------------------


@contextlib.contextmanager
def started_server() -> Iterator[str]:
    """`liftlog server` with embedded NATS on free loopback ports, as `liftlog bench` starts it: yields its address."""
    loop = asyncio.new_event_loop()
    server = spawned_server()
    try:
        address, _ = loop.run_until_complete(server.__aenter__())
        try:
            yield address
        finally:
            loop.run_until_complete(server.__aexit__(None, None, None))
    finally:
        loop.close()


# -- publishing and the raw client --------------------------------------------------


async def publish(address: str, stream: str, messages: int, size: int, partitions: int, window: int) -> float:
    """Create `stream` and fill it: each partition gets its share through PublishAsync, all at once."""
    value = os.urandom(size)
    async with Client([address], timeout=30.0) as client:
        await client.create_stream(stream, stream, partitions=partitions)
        shares = [messages // partitions + (1 if p < messages % partitions else 0) for p in range(partitions)]

        async def fill(partition: int, n: int) -> None:
            for begin in range(0, n, 50_000):  # bounded calls keep the acks in memory small
                k = min(50_000, n - begin)
                batch = [value] * k
                await client.publish_many(stream, batch, partition=partition, ack_policy=AckPolicy.ALL, window=window)

        started = time.perf_counter()
        await asyncio.gather(*(fill(p, n) for p, n in enumerate(shares)))
        return time.perf_counter() - started


async def partition_ends(address: str, stream: str) -> dict[int, int]:
    """Partition -> high watermark + 1 (the number of committed messages, logs starting at 0)."""
    async with Client([address]) as client:
        meta = await client.fetch_metadata(stream)
        info = meta.streams.get(stream)
        if info is None:
            raise SystemExit(f"no stream {stream!r} at {address}")
        ends = {}
        for p in sorted(info.partitions):
            ends[p] = (await client.fetch_partition_metadata(stream, p)).high_watermark + 1
        return ends


async def _raw_read(
    address: str, stream: str, ends: dict[int, int], barrier: Any, mode: str
) -> tuple[int, float, float]:
    """Read `ends`' partitions from 0 to their end concurrently: (messages, start, end).

    `mode`: "messages" (``read_range``, a Message object per record), "columns" (``read_range``, the
    column lists only), "subscribe" (a Subscribe call per partition, a Message per record) or "arrow"
    (``fetch_batches`` and the Spark source's decoder into Arrow record batches).
    """
    async with Client([address], timeout=30.0) as client:
        await client.fetch_metadata(stream)  # channel up and leaders known before the clock starts
        await asyncio.get_running_loop().run_in_executor(None, barrier.wait)
        started = time.monotonic()

        async def fetched(partition: int, end: int) -> int:
            n = 0
            full = mode == "messages"
            async for cols in client.read_range(
                stream, partition=partition, end_offset=end, headers=full, fields=full, max_bytes=4 << 20
            ):
                n += len(cols.messages()) if full else len(cols)
            return n

        async def subscribed(partition: int, end: int) -> int:
            n = 0
            sub = client.subscribe(
                stream,
                partition=partition,
                start_position=StartPosition.OFFSET,
                start_offset=0,
                stop_position=StopPosition.STOP_OFFSET,
                stop_offset=end - 1,
            )
            async with sub:
                async for _ in sub:
                    n += 1
            return n

        async def arrow(partition: int, end: int) -> int:
            from liftlog.spark.arrow_batches import arrow_batch
            from liftlog.spark.reading import FETCH_BYTES, arrow_schema

            schema = arrow_schema(False)
            n = offset = 0
            while offset < end:
                got = await client.fetch_batches(
                    stream, partition=partition, offset=offset, end_offset=end, max_bytes=FETCH_BYTES
                )
                done = arrow_batch(got.batches, got.start, got.limit, schema, stream, partition, got.subject)
                if done is None:
                    raise SystemExit("raw_arrow_1proc: the records need the per-record decoder")
                n += 0 if done[0] is None else done[0].num_rows
                offset = got.next_offset
            return n

        one = {"subscribe": subscribed, "arrow": arrow}.get(mode, fetched)
        counts = await asyncio.gather(*(one(p, e) for p, e in ends.items() if e > 0))
        return sum(counts), started, time.monotonic()


def _raw_worker(address: str, stream: str, ends: dict[int, int], barrier: Any, results: Any, mode: str) -> None:
    results.put(asyncio.run(_raw_read(address, stream, ends, barrier, mode)))


def raw_read(address: str, stream: str, ends: dict[int, int], processes: int, mode: str) -> tuple[int, float]:
    """Read everything with `processes` processes, partitions dealt round robin: (messages, seconds).

    The clock runs from when every process is connected to when the last one is done.
    """
    ctx = multiprocessing.get_context("spawn")  # no fork: grpc does not survive it
    shares = [{p: e for i, (p, e) in enumerate(ends.items()) if i % processes == k} for k in range(processes)]
    shares = [s for s in shares if s]
    barrier = ctx.Barrier(len(shares))
    results = ctx.Queue()
    workers = [ctx.Process(target=_raw_worker, args=(address, stream, s, barrier, results, mode)) for s in shares]
    for w in workers:
        w.start()
    got: list[tuple[int, float, float]] = []
    while len(got) < len(workers):
        try:
            got.append(results.get(timeout=1))
        except queue.Empty:
            failed = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if failed:
                raise SystemExit(f"a raw reader process failed (exit code {failed[0]})") from None
    for w in workers:
        w.join()
    return sum(g[0] for g in got), max(g[2] for g in got) - min(g[1] for g in got)


#: The raw client reads: name -> (processes, mode).
RAW_READS = {
    "raw_1proc": (1, "messages"),
    "raw_2proc": (2, "messages"),
    "raw_columns_1proc": (1, "columns"),
    "raw_subscribe_1proc": (1, "subscribe"),
}
#: Reads shown beside them but not the client's: no goal is judged against them.
OTHER_READS = {"raw_arrow_1proc": (1, "arrow")}


# -- Spark --------------------------------------------------------------------------


def spark_session() -> Any:
    from liftlog.spark.source import local_session

    return local_session("liftlog-bench-spark")


def spark_batch(spark: Any, address: str, stream: str, options: dict[str, str]) -> tuple[int, float]:
    started = time.perf_counter()
    reader = spark.read.format("liftlog").option("servers", address).option("stream", stream)
    rows = reader.option("startingOffsets", "earliest").options(**options).load().count()
    return int(rows), time.perf_counter() - started


def spark_stream(
    spark: Any, address: str, stream: str, options: dict[str, str], checkpoint: str
) -> tuple[int, float, float]:
    """An AvailableNow read into the noop sink: (rows, seconds, seconds in its micro-batches' addBatch)."""
    started = time.perf_counter()
    reader = spark.readStream.format("liftlog").option("servers", address).option("stream", stream)
    df = reader.option("startingOffsets", "earliest").options(**options).load()
    query = df.writeStream.format("noop").option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    if query.exception() is not None:
        raise SystemExit(f"the streaming query failed: {query.exception()}")
    rows = 0
    batch_ms = 0
    for progress in query.recentProgress:
        rows += progress.numInputRows
        batch_ms += progress.durationMs.get("addBatch", 0)
    return rows, elapsed, batch_ms / 1000


def spark_stream_write(
    spark: Any, address: str, source: str, target: str, partitions: int, checkpoint: str
) -> tuple[int, float]:
    """An AvailableNow copy of `source` into a new stream `target` with the exactly-once sink: (rows, seconds)."""

    async def create() -> None:
        async with Client([address]) as client:
            await client.create_stream(target, target, partitions=partitions)

    asyncio.run(create())
    started = time.perf_counter()
    reader = spark.readStream.format("liftlog").option("servers", address).option("stream", source)
    df = reader.option("startingOffsets", "earliest").load()
    writer = df.writeStream.format("liftlog").option("servers", address).option("stream", target)
    query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    if query.exception() is not None:
        raise SystemExit(f"the streaming write failed: {query.exception()}")
    return sum(asyncio.run(partition_ends(address, target)).values()), elapsed


# -- the run ------------------------------------------------------------------------


def best(name: str, runs: list[tuple[int, float]], expected: int) -> dict[str, Any]:
    """The fastest run's figures; every run must have read `expected` rows."""
    for rows, _ in runs:
        if rows != expected:
            raise SystemExit(f"{name} read {rows} rows, expected {expected}")
    seconds = min(s for _, s in runs)
    return {
        "rows_per_s": round(expected / seconds),
        "seconds": round(seconds, 3),
        "runs_s": [round(s, 3) for _, s in runs],
    }


def run(args: argparse.Namespace, address: str, tmp: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"server": "started" if args.addr is None else address}
    options = {} if args.min_partitions is None else {"minPartitions": str(args.min_partitions)}
    run_id = uuid.uuid4().hex[:8]
    stream = args.stream or f"bench-spark-{run_id}"
    warm = f"bench-spark-warm-{run_id}"
    copies: list[str] = []
    try:
        if args.skip_publish:
            note(f"reading the existing stream {stream!r}")
        else:
            where = f"{args.partitions} partitions of {stream!r}"
            note(f"publishing {args.messages:,} messages of {args.size} B to {where}")
            publish_s = asyncio.run(publish(address, stream, args.messages, args.size, args.partitions, args.window))
            report["publish"] = {
                "ack_policy": "all",
                "window": args.window,
                "seconds": round(publish_s, 3),
                "msgs_per_s": round(args.messages / publish_s),
            }
            note(f"published in {publish_s:.1f} s ({args.messages / publish_s:,.0f} msgs/s)")
        ends = asyncio.run(partition_ends(address, stream))
        total = sum(ends.values())
        report.update(messages=total, size=args.size, partitions=len(ends))
        asyncio.run(publish(address, warm, WARM_MESSAGES, args.size, len(ends), args.window))
        warm_ends = asyncio.run(partition_ends(address, warm))

        raw: dict[str, list[tuple[int, float]]] = {name: [] for name in {**RAW_READS, **OTHER_READS}}
        for i in range(args.runs):
            for name, (procs, mode) in {**RAW_READS, **OTHER_READS}.items():
                if i == 0:
                    raw_read(address, warm, warm_ends, procs, mode)
                rows, seconds = raw_read(address, stream, ends, procs, mode)
                raw[name].append((rows, seconds))
                note(f"{name}: {rows:,} messages in {seconds:.2f} s ({rows / seconds:,.0f}/s)")
        for name, runs in raw.items():
            report[name] = best(name, runs, total)

        note("starting Spark (local[2])")
        started = time.perf_counter()
        spark = spark_session()
        report["spark_startup_s"] = round(time.perf_counter() - started, 3)
        try:
            started = time.perf_counter()
            spark_batch(spark, address, warm, options)
            spark_stream(spark, address, warm, options, str(tmp / "checkpoint-warm"))
            report["spark_warmup_s"] = round(time.perf_counter() - started, 3)
            batch: list[tuple[int, float]] = []
            streaming: list[tuple[int, float]] = []
            micro_batches: list[float] = []
            for i in range(args.runs):
                rows, seconds = spark_batch(spark, address, stream, options)
                batch.append((rows, seconds))
                note(f"spark_batch: {rows:,} rows in {seconds:.2f} s ({rows / seconds:,.0f}/s)")
                rows, seconds, in_batches = spark_stream(spark, address, stream, options, str(tmp / f"checkpoint-{i}"))
                streaming.append((rows, seconds))
                micro_batches.append(in_batches)
                note(
                    f"spark_stream: {rows:,} rows in {seconds:.2f} s ({rows / seconds:,.0f}/s; "
                    f"{in_batches:.2f} s in micro-batches)"
                )
            report["spark_batch"] = best("spark_batch", batch, total)
            report["spark_stream"] = best("spark_stream", streaming, total)
            fastest = min(micro_batches)
            report["spark_stream"].update(
                micro_batch_s=round(fastest, 3), micro_batch_rows_per_s=round(total / fastest)
            )
            # As the reads do, the copy is timed warm: its first run in a session starts the Python workers
            # of the write tasks (imports, connections), which a long-running query pays once.
            started = time.perf_counter()
            copies.append(f"{stream}-copy-warm")
            spark_stream_write(spark, address, warm, copies[-1], len(warm_ends), str(tmp / "checkpoint-write-warm"))
            report["spark_write_warmup_s"] = round(time.perf_counter() - started, 3)
            writes: list[tuple[int, float]] = []
            for i in range(args.runs):
                target = f"{stream}-copy-{i}"
                copies.append(target)
                rows, seconds = spark_stream_write(
                    spark, address, stream, target, len(ends), str(tmp / f"checkpoint-write-{i}")
                )
                writes.append((rows, seconds))
                note(f"spark_stream_write: {rows:,} rows in {seconds:.2f} s ({rows / seconds:,.0f}/s)")
            report["spark_stream_write"] = best("spark_stream_write", writes, total)
        finally:
            spark.stop()
    finally:
        if args.addr is not None:  # a started server's data goes with its directory; a named stream stays
            with contextlib.suppress(LiftlogError):
                asyncio.run(_delete(address, [warm, *copies] if args.stream else [warm, *copies, stream]))

    raw_best = max(report[name]["rows_per_s"] for name in RAW_READS)
    ratios = {}
    for spark_name in ("spark_batch", "spark_stream"):
        for raw_name in {**RAW_READS, **OTHER_READS}:
            ratio = report[spark_name]["rows_per_s"] / report[raw_name]["rows_per_s"]
            ratios[f"{spark_name}/{raw_name}"] = round(ratio, 3)
    report["ratios"] = ratios
    report["goal"] = {
        "min_ratio": GOAL,
        "vs": "best raw client rate (" + ", ".join(RAW_READS) + ")",
        "spark_batch_met": report["spark_batch"]["rows_per_s"] >= GOAL * raw_best,
        "spark_stream_met": report["spark_stream"]["rows_per_s"] >= GOAL * raw_best,
        "spark_batch_min_rows_per_s": SPARK_BATCH_GOAL,
        "spark_batch_rate_met": report["spark_batch"]["rows_per_s"] >= SPARK_BATCH_GOAL,
        "spark_stream_write_min_rows_per_s": SPARK_WRITE_GOAL,
        "spark_stream_write_rate_met": report["spark_stream_write"]["rows_per_s"] >= SPARK_WRITE_GOAL,
    }
    return report


async def _delete(address: str, streams: list[str]) -> None:
    async with Client([address]) as client:
        for name in streams:
            with contextlib.suppress(LiftlogError):
                await client.delete_stream(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages to publish (default 1,000,000)")
    parser.add_argument("--size", type=int, default=256, help="bytes per message value")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--window", type=int, default=2000, help="unacknowledged messages per partition (publish)")
    parser.add_argument("--runs", type=int, default=3, help="times to run each read; the best counts")
    parser.add_argument("--min-partitions", type=int, default=None, help="the source's minPartitions option")
    parser.add_argument("--addr", default=None, help="use this server (host:port) instead of starting one")
    parser.add_argument("--stream", default=None, help="stream name (default: a new one, deleted after)")
    parser.add_argument("--skip-publish", action="store_true", help="read --stream as it is (needs --stream)")
    args = parser.parse_args()
    if args.skip_publish and not (args.stream and args.addr):
        parser.error("--skip-publish needs --addr and --stream")
    if min(args.messages, args.size, args.partitions, args.window, args.runs) < 1:
        parser.error("--messages, --size, --partitions, --window and --runs must be >= 1")

    # Spark's JVM and Python workers inherit our stdout: point it at stderr and keep the real one for the JSON line.
    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    tmp = Path(tempfile.mkdtemp(prefix="liftlog-bench-spark-"))
    try:
        if args.addr is not None:
            report = run(args, args.addr, tmp)
        else:
            note("starting a liftlog server (embedded NATS)")
            with started_server() as address:
                report = run(args, address, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = {
        "bench": "spark",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "spark_master": "local[2]",
        **report,
    }
    with os.fdopen(real_stdout, "w") as out:
        out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
