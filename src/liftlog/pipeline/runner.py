"""The whole reference pipeline on one machine: streams, generator, the job, and a read-back.

:class:`Pipeline` takes a SparkSession (the CLI builds one, a test passes
its own) and a :class:`PipelineConfig`. :meth:`Pipeline.run`:

1. creates the input stream (subject ``<prefix>.*``, several partitions) and
   the compacted output stream, unless they exist, and notes where each ends;
2. starts the job's two queries (:func:`liftlog.pipeline.job.start_queries`)
   reading the input from that end, with checkpoints of their own
   (``<checkpoint dir>/<run id>``), so a run counts only its own events;
3. publishes the events on NATS from a background thread, then the flush
   event, and waits for liftlog's acks;
4. lets both queries process everything (the last micro-batches close the
   last windows), stops them, and reads the results back: the output
   stream from where it ended before the run, and the run's Parquet files.

:meth:`Pipeline.snapshot` may be called from any thread meanwhile (the CLI's
progress display does).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from pyspark.sql import SparkSession

from liftlog.client import Client, TlsConfig
from liftlog.pipeline.generator import (
    FLUSH_KEY,
    EventSpec,
    PublishStats,
    expected_counts,
    make_events,
    publish_events,
)
from liftlog.pipeline.job import WINDOW_MS, JobConfig, Queries, start_queries
from liftlog.pipeline.results import Totals, read_latest, read_parquet, totals

__all__ = ["Pipeline", "PipelineConfig", "PipelineError", "QueryStatus", "Snapshot", "Summary"]

T = TypeVar("T")


class PipelineError(RuntimeError):
    """The pipeline cannot run as configured (say, the input stream exists with another subject)."""


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    servers: str = "127.0.0.1:9292"
    #: TLS to the liftlog servers (the driver's client and the Spark source and sink); None: plain text.
    tls: TlsConfig | None = None
    nats: str = "nats://127.0.0.1:4222"
    input_stream: str = "pipeline-events"
    output_stream: str = "pipeline-counts"
    #: Events go to ``<prefix>.<kind>[.<partition>]``; the input stream's subject is ``<prefix>.*``.
    subject_prefix: str = "events"
    partitions: int = 4
    parquet_dir: str = "pipeline-out/parquet"
    checkpoint_dir: str = "pipeline-out/checkpoints"
    events: int = 10_000
    #: Events published per second (0: as fast as possible).
    rate: float = 500.0
    #: Event time between consecutive events (event time runs faster than the clock, to fill more windows).
    interval_ms: int = 50
    seed: int = 7
    #: Distinct keys (users) of the events.
    users: int = 50
    #: Event time of the first event, Unix ms (None: now).
    start_ms: int | None = None
    #: Stop publishing after this many seconds even if not all events are out.
    duration: float | None = None
    trigger: str = "1 second"
    #: Names the run's checkpoints and Parquet output (None: the time it starts).
    run_id: str | None = None


@dataclass(frozen=True, slots=True)
class QueryStatus:
    name: str
    batches: int = 0
    rows_in: int = 0
    last_rows: int = 0
    rows_per_second: float = 0.0
    watermark: str = ""
    #: Windows held in state (open, or not yet cleaned up).
    state_rows: int = 0
    #: Windows written: updated ones (liftlog) or closed ones (Parquet).
    rows_out: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    run_id: str
    phase: str
    elapsed: float
    total: int
    published: int
    acked: int
    publish_rate: float
    recorded: int
    partitions: int
    queries: tuple[QueryStatus, ...] = ()


@dataclass(frozen=True, slots=True)
class Summary:
    run_id: str
    seconds: float
    #: Events published, not counting the flush event.
    events: int
    recorded: int
    expected: Totals
    #: Newest value per key written to the output stream during the run.
    stream: Totals
    parquet: Totals
    parquet_path: str
    queries: tuple[QueryStatus, ...]

    @property
    def complete(self) -> bool:
        """Both sinks counted every event, in the same windows as plain Python does."""
        return self.stream == self.expected and self.parquet == self.expected


class _LoopThread:
    """An asyncio loop in a daemon thread, with one liftlog client, for the driver's own liftlog calls."""

    def __init__(self, servers: str, tls: TlsConfig | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="liftlog-pipeline-io", daemon=True)
        self._thread.start()
        self.client = Client(servers.split(","), timeout=10.0, tls=tls)

    def submit(self, coro: Coroutine[object, object, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[object, object, T], timeout: float = 60.0) -> T:
        return self.submit(coro).result(timeout)

    def close(self) -> None:
        try:
            self.call(self.client.close(), timeout=10.0)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10.0)
            if not self._thread.is_alive():
                self.loop.close()


class Pipeline:
    def __init__(self, spark: SparkSession, cfg: PipelineConfig) -> None:
        self.spark = spark
        self.cfg = cfg
        self.run_id = cfg.run_id or time.strftime("%Y%m%d-%H%M%S")
        self.phase = "starting"
        self.stats = PublishStats(total=cfg.events + 1)
        self.partitions = cfg.partitions
        self.recorded = 0
        self._started = time.monotonic()
        self._queries: Queries | None = None
        self._input_start: dict[int, int] = {}
        self._rows: dict[str, dict[int, int]] = {}  # query name -> batch id -> input rows
        self._last_progress: dict[str, tuple[object, object]] = {}  # query name -> (batch id, timestamp) scanned

    # -- progress ----------------------------------------------------------------------

    def _query_status(self, label: str, query: Any, rows_out: int) -> QueryStatus:
        seen = self._rows.setdefault(label, {})
        last = query.lastProgress or {}
        mark = (last.get("batchId"), last.get("timestamp"))
        if mark != self._last_progress.get(label):
            # recentProgress converts every retained entry from the JVM: only when there is a new one.
            self._last_progress[label] = mark
            for p in query.recentProgress:
                if p.get("numInputRows") is not None and p.get("batchId") is not None:
                    seen[p["batchId"]] = max(seen.get(p["batchId"], 0), int(p["numInputRows"]))
        state = last.get("stateOperators") or []
        state_rows = sum(int(op.get("numRowsTotal", 0)) for op in state)
        executed = [b for b, n in seen.items() if n > 0]
        return QueryStatus(
            name=label,
            batches=len(executed),
            rows_in=sum(seen.values()),
            last_rows=int(last.get("numInputRows") or 0),
            rows_per_second=float(last.get("processedRowsPerSecond") or 0.0),
            watermark=str((last.get("eventTime") or {}).get("watermark", "")),
            state_rows=state_rows,
            rows_out=rows_out,
        )

    def query_status(self) -> tuple[QueryStatus, ...]:
        q = self._queries
        if q is None:
            return ()
        return (
            self._query_status("counts → liftlog", q.counts, q.liftlog.rows),
            self._query_status("closed → Parquet", q.closed, q.parquet.rows),
        )

    def snapshot(self) -> Snapshot:
        s = self.stats
        return Snapshot(
            run_id=self.run_id,
            phase=self.phase,
            elapsed=time.monotonic() - self._started,
            total=s.total,
            published=s.published,
            acked=s.acked,
            publish_rate=s.rate,
            recorded=self.recorded,
            partitions=self.partitions,
            queries=self.query_status(),
        )

    # -- liftlog ---------------------------------------------------------------------

    async def _ends(self, client: Client, stream: str) -> dict[int, int]:
        meta = await client.fetch_metadata(stream)
        info = meta.streams[stream]
        ends = {}
        for pid in info.partitions:
            ends[pid] = (await client.fetch_partition_metadata(stream, pid)).high_watermark + 1
        return ends

    async def _prepare(self, client: Client) -> tuple[dict[int, int], dict[int, int]]:
        cfg = self.cfg
        subject = f"{cfg.subject_prefix}.*"
        await client.create_stream(subject, cfg.input_stream, partitions=cfg.partitions, exist_ok=True)
        info = (await client.fetch_metadata(cfg.input_stream)).streams[cfg.input_stream]
        if info.subject != subject:
            raise PipelineError(
                f"stream {cfg.input_stream!r} exists with subject {info.subject!r}, not {subject!r}: "
                "give another --input-stream or --subject-prefix"
            )
        self.partitions = len(info.partitions)
        await client.create_stream(
            f"pipeline.{cfg.output_stream}",
            cfg.output_stream,
            partitions=cfg.partitions,
            compact_enabled=True,
            exist_ok=True,
        )
        return await self._ends(client, cfg.input_stream), await self._ends(client, cfg.output_stream)

    async def _watch(self, stop: asyncio.Event, client: Client) -> None:
        """Keep ``recorded`` (input messages since the run began) up to date until ``stop``."""
        while not stop.is_set():
            ends = await self._ends(client, self.cfg.input_stream)
            self.recorded = sum(max(0, end - self._input_start.get(pid, 0)) for pid, end in ends.items())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    # -- the run ---------------------------------------------------------------------

    def run(self, on_tick: Callable[[], None] | None = None, tick: float = 0.25) -> Summary:
        """Run the pipeline to the end; ``on_tick`` is called every ``tick`` seconds meanwhile."""
        cfg = self.cfg
        tick_fn = on_tick or (lambda: None)
        io = _LoopThread(cfg.servers, cfg.tls)
        stop_watch: asyncio.Event | None = None
        watcher: concurrent.futures.Future[None] | None = None
        try:
            self.phase = "creating streams"
            tick_fn()
            self._input_start, output_start = io.call(self._prepare(io.client))
            starting = json.dumps({cfg.input_stream: {str(p): o for p, o in sorted(self._input_start.items())}})
            self.phase = "starting the Spark queries"
            tick_fn()
            self._queries = queries = start_queries(
                self.spark,
                JobConfig(
                    servers=cfg.servers,
                    tls=cfg.tls,
                    input_stream=cfg.input_stream,
                    output_stream=cfg.output_stream,
                    parquet_dir=cfg.parquet_dir,
                    checkpoint_dir=f"{cfg.checkpoint_dir.rstrip('/')}/{self.run_id}",
                    run_id=self.run_id,
                    starting_offsets=starting,
                    trigger=cfg.trigger,
                ),
            )
            stop_watch = io.call(_new_event())
            watcher = io.submit(self._watch(stop_watch, io.client))
            events = make_events(
                EventSpec(
                    count=cfg.events, seed=cfg.seed, start_ms=cfg.start_ms, interval_ms=cfg.interval_ms, keys=cfg.users
                )
            )
            deadline = None if cfg.duration is None else time.monotonic() + cfg.duration
            self.phase = "publishing events"
            generator = io.submit(
                publish_events(
                    cfg.nats,
                    events,
                    prefix=cfg.subject_prefix,
                    partitions=self.partitions,
                    rate=cfg.rate,
                    deadline=deadline,
                    stats=self.stats,
                )
            )
            while not generator.done():
                queries.check()
                tick_fn()
                time.sleep(tick)
            generator.result()

            self.phase = "waiting for liftlog"
            wait_until = time.monotonic() + 30
            while self.recorded < self.stats.published and time.monotonic() < wait_until:
                tick_fn()
                time.sleep(tick)

            self.phase = "processing the last micro-batches"
            errors: list[BaseException] = []

            def drain() -> None:
                try:
                    queries.process_all_available()
                except BaseException as exc:
                    errors.append(exc)

            drainer = threading.Thread(target=drain, name="liftlog-pipeline-drain", daemon=True)
            drainer.start()
            while drainer.is_alive():
                tick_fn()
                drainer.join(tick)
            if errors:
                raise errors[0]
            final = self.query_status()
            queries.stop()
            queries.check()

            self.phase = "reading the results back"
            tick_fn()
            latest = io.call(read_latest(io.client, cfg.output_stream, output_start))
            rows = read_parquet(cfg.parquet_dir, self.run_id)
            sent = [e for e in self.stats.sent if e.key != FLUSH_KEY]
            expected = [
                {"key": k, "window_start": w, "count": n, "amount": a}
                for (k, w), (n, a) in expected_counts(sent, WINDOW_MS).items()
            ]
            self.phase = "done"
            tick_fn()
            return Summary(
                run_id=self.run_id,
                seconds=time.monotonic() - self._started,
                events=len(sent),
                recorded=self.recorded,
                expected=totals(expected),
                stream=totals(list(latest.values())),
                parquet=totals(rows),
                parquet_path=f"{cfg.parquet_dir.rstrip('/')}/run={self.run_id}",
                queries=final,
            )
        finally:
            if self._queries is not None:
                for q in self._queries.all():
                    if q.isActive:
                        q.stop()
            if stop_watch is not None:
                io.loop.call_soon_threadsafe(stop_watch.set)
            if watcher is not None:
                concurrent.futures.wait([watcher], timeout=5)
            io.close()


async def _new_event() -> asyncio.Event:
    return asyncio.Event()  # made on the loop that waits on it
