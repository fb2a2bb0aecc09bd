"""The reference pipeline's Structured Streaming job: per-user counts over event-time windows.

It reads the events stream (format ``liftlog``), parses the JSON values,
keeps a watermark of :data:`WATERMARK` on the event time, and counts each
user's events (and sums their values) per :data:`WINDOW` tumbling window. Two
queries share that definition, one per sink, because the sinks want
different output modes:

- ``counts``: **update** mode to a *compacted* liftlog stream. Each
  micro-batch writes the windows it changed, key ``<user>|<window start ms>``,
  value ``{"key", "window_start", "window_end", "count", "amount"}`` (JSON,
  times in Unix ms). Compaction keeps the latest value per key, so readers
  get the current count of every window, open or closed, seconds after the
  events arrive.
- ``closed``: **append** mode to Parquet. Files cannot be updated, so they
  get each window once, when the watermark has passed its end and it can no
  longer change.

Both sinks are ``foreachBatch`` functions. Spark's Python data sources only
take append mode in a streaming write, so ``counts`` writes each update-mode
micro-batch with a batch write (format ``liftlog``). That write is at least
once: a micro-batch Spark re-runs after a failure is written again, with the
same values, which leaves the latest value per key (all a compacted stream
keeps) unchanged. ``closed`` writes micro-batch ``n`` to
``<parquet dir>/run=<run id>/batch=<n>`` with mode overwrite, so a re-run
replaces its own output.

The generator's last event (:data:`~liftlog.pipeline.generator.FLUSH_KEY`)
moves event time on so that the watermark closes the last windows. It must
reach the watermark, so it is left out of the results in ``foreachBatch``:
a filter in the streaming plan would be pushed below the watermark.

Run it on a cluster with spark-submit (executors need liftlog installed; see
docs/spark.md, "Running the pipeline on a Spark cluster")::

    spark-submit --master spark://host:7077 src/liftlog/pipeline/job.py \\
        --servers 10.0.0.5:9292 --parquet-dir s3a://bucket/pipeline --checkpoint-dir s3a://bucket/ckpt
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

import liftlog.spark
from liftlog.client.tls import TlsConfig
from liftlog.pipeline.generator import FLUSH_KEY, WATERMARK_MS, WINDOW_MS

__all__ = [
    "EVENT_SCHEMA",
    "WATERMARK",
    "WATERMARK_MS",
    "WINDOW",
    "WINDOW_MS",
    "JobConfig",
    "Queries",
    "ensure_output_stream",
    "main",
    "start_queries",
    "windowed_counts",
]

WINDOW = f"{WINDOW_MS // 1000} seconds"
#: Longer than the generator's largest lateness (8 s), so no event is dropped as too late.
WATERMARK = f"{WATERMARK_MS // 1000} seconds"
EVENT_SCHEMA = "seq long, kind string, key string, ts long, value long"


@dataclass(frozen=True, slots=True)
class JobConfig:
    servers: str
    input_stream: str
    output_stream: str
    parquet_dir: str
    checkpoint_dir: str
    #: TLS to the servers; every executor needs the files at the same paths.
    tls: TlsConfig | None = None
    #: Names this run's Parquet output (``run=<id>``): one per checkpoint directory.
    run_id: str = "job"
    #: ``startingOffsets`` of the first start (afterwards the checkpoint decides).
    starting_offsets: str = "earliest"
    trigger: str = "1 second"


@dataclass(slots=True)
class Tally:
    """Rows written by ``foreachBatch`` so far (it runs on the driver, in a thread of Spark's)."""

    rows: int = 0

    def add(self, rows: int) -> None:
        self.rows += rows


@dataclass(slots=True)
class Queries:
    """The two running queries, and the rows each has written."""

    counts: StreamingQuery
    closed: StreamingQuery
    liftlog: Tally
    parquet: Tally

    def all(self) -> tuple[StreamingQuery, StreamingQuery]:
        return self.counts, self.closed

    def check(self) -> None:
        """Raise the error of a query that failed."""
        for q in self.all():
            exc = q.exception()
            if exc is not None:
                raise exc

    def process_all_available(self) -> None:
        for q in self.all():
            q.processAllAvailable()

    def stop(self) -> None:
        for q in self.all():
            q.stop()


def windowed_counts(spark: SparkSession, cfg: JobConfig) -> DataFrame:
    """The streaming aggregate: key, window_start, window_end (Unix ms), count, amount."""
    raw = (
        spark.readStream.format("liftlog")
        .option("servers", cfg.servers)
        .options(**tls_options(cfg.tls))
        .option("stream", cfg.input_stream)
        .option("startingOffsets", cfg.starting_offsets)
        .load()
    )
    events = (
        raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
        .select("e.*")
        .where(F.col("key").isNotNull() & F.col("ts").isNotNull())  # not our JSON: skipped
        .withColumn("event_time", F.timestamp_millis(F.col("ts")))
    )
    return (
        events.withWatermark("event_time", WATERMARK)
        .groupBy(F.window("event_time", WINDOW), F.col("key"))
        .agg(F.count(F.lit(1)).alias("count"), F.sum("value").alias("amount"))
        .select(
            "key",
            F.unix_millis(F.col("window.start")).alias("window_start"),
            F.unix_millis(F.col("window.end")).alias("window_end"),
            "count",
            "amount",
        )
    )


def as_messages(counts: DataFrame) -> DataFrame:
    """Rows for the liftlog sink: key ``<user>|<window start ms>``, value the row as JSON."""
    return counts.select(
        F.concat_ws("|", F.col("key"), F.col("window_start").cast("string")).alias("key"),
        F.to_json(F.struct("key", "window_start", "window_end", "count", "amount")).alias("value"),
    )


def tls_options(tls: TlsConfig | None) -> dict[str, str]:
    """The liftlog Spark format's options for ``tls``."""
    if tls is None:
        return {}
    given = {"tls.ca": tls.ca, "tls.cert": tls.cert, "tls.key": tls.key, "tls.serverName": tls.server_name}
    return {name: value for name, value in given.items() if value}


def ensure_output_stream(servers: str, name: str, partitions: int = 1, tls: TlsConfig | None = None) -> None:
    """Create the compacted output stream (subject ``pipeline.<name>``) unless it exists."""
    from liftlog.client import Client

    async def create() -> None:
        async with Client(servers.split(","), tls=tls) as client:
            await client.create_stream(
                f"pipeline.{name}", name, partitions=partitions, compact_enabled=True, exist_ok=True
            )

    asyncio.run(create())


def _to_liftlog(cfg: JobConfig, tally: Tally) -> Callable[[DataFrame, int], None]:
    def write(batch: DataFrame, batch_id: int) -> None:
        updated = as_messages(batch.where(F.col("key") != FLUSH_KEY)).persist()
        try:
            n = updated.count()
            if n:
                (
                    updated.write.format("liftlog")
                    .option("servers", cfg.servers)
                    .options(**tls_options(cfg.tls))
                    .option("stream", cfg.output_stream)
                    .mode("append")
                    .save()
                )
            tally.add(n)
        finally:
            updated.unpersist()

    return write


def _to_parquet(cfg: JobConfig, tally: Tally) -> Callable[[DataFrame, int], None]:
    target = cfg.parquet_dir.rstrip("/") + f"/run={cfg.run_id}"

    def write(batch: DataFrame, batch_id: int) -> None:
        closed = batch.where(F.col("key") != FLUSH_KEY).persist()
        try:
            n = closed.count()
            if n:
                closed.write.mode("overwrite").parquet(f"{target}/batch={batch_id}")
            tally.add(n)
        finally:
            closed.unpersist()

    return write


def start_queries(spark: SparkSession, cfg: JobConfig) -> Queries:
    """Start the ``counts`` (liftlog, update) and ``closed`` (Parquet, append) queries on ``spark``."""
    liftlog.spark.register(spark)
    counts = windowed_counts(spark, cfg)
    ckpt = cfg.checkpoint_dir.rstrip("/")
    started: list[StreamingQuery] = []
    tallies = Tally(), Tally()
    try:
        for name, mode, sink, tally in (
            ("counts", "update", _to_liftlog, tallies[0]),
            ("closed", "append", _to_parquet, tallies[1]),
        ):
            query = (
                counts.writeStream.foreachBatch(sink(cfg, tally))
                .option("checkpointLocation", f"{ckpt}/{name}")
                .outputMode(mode)
                .trigger(processingTime=cfg.trigger)
                .queryName(f"pipeline-{name}-{cfg.run_id}")
                .start()
            )
            started.append(query)
    except BaseException:
        for query in started:
            query.stop()
        raise
    return Queries(started[0], started[1], liftlog=tallies[0], parquet=tallies[1])


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="job.py", description="The liftlog reference pipeline's streaming job (spark-submit job.py ...)."
    )
    p.add_argument("--servers", default="127.0.0.1:9292", help="liftlog servers, comma-separated host:port")
    p.add_argument("--tls-ca", help="connect to the servers with TLS, trusting this CA file")
    p.add_argument("--tls-cert", help="client certificate for servers that require one (mTLS)")
    p.add_argument("--tls-key", help="the key of --tls-cert")
    p.add_argument("--tls-server-name", help="check the servers' certificates against this name")
    p.add_argument("--input-stream", default="pipeline-events")
    p.add_argument("--output-stream", default="pipeline-counts")
    p.add_argument("--output-partitions", type=int, default=4, help="partitions of the output stream if created")
    p.add_argument("--parquet-dir", default="pipeline-out/parquet")
    p.add_argument("--checkpoint-dir", default="pipeline-out/checkpoints/job")
    p.add_argument("--run-id", default="job", help="names the Parquet output of this checkpoint: run=<id>")
    p.add_argument("--starting-offsets", default="earliest", help="where a new checkpoint starts reading")
    p.add_argument("--trigger", default="5 seconds", help="micro-batch interval")
    p.add_argument("--once", action="store_true", help="process what the input holds now, then stop")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run the job until it is stopped (or, with --once, until what the input holds now is processed)."""
    args = _args(argv)
    tls = None
    if args.tls_ca or args.tls_cert or args.tls_server_name:
        tls = TlsConfig(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, server_name=args.tls_server_name)
    cfg = JobConfig(
        servers=args.servers,
        tls=tls,
        input_stream=args.input_stream,
        output_stream=args.output_stream,
        parquet_dir=args.parquet_dir,
        checkpoint_dir=args.checkpoint_dir,
        run_id=args.run_id,
        starting_offsets=args.starting_offsets,
        trigger=args.trigger,
    )
    ensure_output_stream(cfg.servers, cfg.output_stream, args.output_partitions, cfg.tls)
    spark = SparkSession.builder.appName("liftlog-pipeline").getOrCreate()
    queries = start_queries(spark, cfg)
    print(
        f"liftlog pipeline job: {cfg.input_stream} -> {cfg.output_stream} (compacted) "
        f"and {cfg.parquet_dir}/run={cfg.run_id}",
        file=sys.stderr,
    )
    try:
        if args.once:
            queries.process_all_available()
        else:
            spark.streams.awaitAnyTermination()
        queries.check()
    finally:
        queries.stop()
    print(
        f"liftlog pipeline job: {queries.liftlog.rows} window updates written to {cfg.output_stream}, "
        f"{queries.parquet.rows} closed windows to Parquet",
        file=sys.stderr,
    )


if __name__ == "__main__":  # spark-submit .../liftlog/pipeline/job.py --servers ...
    main()
