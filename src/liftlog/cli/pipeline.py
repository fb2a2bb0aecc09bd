"""``liftlog pipeline``: run the reference pipeline, feed it, read its results back.

Importing this module imports neither pyspark nor gRPC: the commands import
what they need when they run, so ``liftlog --help`` stays quick and works
without the ``spark`` extra.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from liftlog.cli.common import DEFAULT_ADDR, CommandError, ReportingGroup, client_tls, fail, tls_options
from liftlog.cli.output import err_console, out_console

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from rich.console import RenderableType

    from liftlog.pipeline.runner import Snapshot, Summary

__all__ = ["pipeline"]

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_NATS = "nats://127.0.0.1:4222"
SPARK_MISSING = "the pipeline needs Spark: pip install 'liftlog[spark]' (and Java 17 or later)"


def _servers_option(f: F) -> F:
    f = tls_options(f)  # --tls-ca, --tls-cert, --tls-key, --tls-server-name: read with client_tls()
    return click.option(
        "--servers",
        default=DEFAULT_ADDR,
        show_default=True,
        metavar="HOST:PORT,...",
        help="liftlog servers (`make run` listens on the default).",
    )(f)


def _nats_option(f: F) -> F:
    return click.option(
        "--nats", default=DEFAULT_NATS, show_default=True, metavar="URL", help="NATS that liftlog records."
    )(f)


def _input_options(f: F) -> F:
    f = click.option("--partitions", type=click.IntRange(1, 64), default=4, show_default=True, help="Of new streams.")(
        f
    )
    f = click.option(
        "--subject-prefix",
        default="events",
        show_default=True,
        help="Events go to <prefix>.<kind>[.<partition>]; the input stream records <prefix>.*.",
    )(f)
    return click.option("--input-stream", default="pipeline-events", show_default=True)(f)


def _generator_options(interval_default: int | None) -> Callable[[F], F]:
    def decorate(f: F) -> F:
        f = click.option("--seed", type=int, default=7, show_default=True, help="Same seed, same events.")(f)
        f = click.option("--users", type=click.IntRange(1), default=50, show_default=True, help="Distinct keys.")(f)
        f = click.option(
            "--interval-ms",
            type=click.IntRange(1),
            default=interval_default,
            show_default=interval_default is not None,
            help="Event time between events"
            + (
                " (runs ahead of the clock to fill more windows)."
                if interval_default
                else " (default: 1000/rate, event time follows the clock)."
            ),
        )(f)
        f = click.option(
            "--rate", type=click.FloatRange(0), default=500.0, show_default=True, help="Events/s, 0 for flat out."
        )(f)
        return click.option("--events", type=click.IntRange(1), default=10_000, show_default=True)(f)

    return decorate


def _output_options(f: F) -> F:
    f = click.option("--parquet-dir", default="pipeline-out/parquet", show_default=True)(f)
    return click.option("--output-stream", default="pipeline-counts", show_default=True, help="Compacted.")(f)


@click.group(cls=ReportingGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def pipeline() -> None:
    """The reference pipeline: NATS -> liftlog -> Spark Structured Streaming -> liftlog and Parquet.

    With a server running (`make run`):

    \b
      liftlog pipeline run --events 10000    # everything, with progress
      liftlog pipeline results               # what it computed
      liftlog pipeline generate --events 1000   # only publish events (for a job run elsewhere)
    """


# -- run -----------------------------------------------------------------------------------


def _spark(master: str) -> SparkSession:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        fail(SPARK_MISSING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master)
    if master.startswith("local"):
        # One machine: keep Spark's driver on loopback, whatever the host name resolves to.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    spark = (
        builder.appName("liftlog-pipeline")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.streaming.numRecentProgressUpdates", "1000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _when(ms: Any) -> str:
    try:
        return dt.datetime.fromtimestamp(int(ms) / 1000, dt.UTC).strftime("%H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def _watermark(text: str) -> str:
    """Spark's ISO watermark as the time of day (UTC); "—" before there is one."""
    if not text or text.startswith("1970-01-01"):
        return "—"
    return text.partition("T")[2][:8] or text


def _progress_view(snap: Snapshot) -> RenderableType:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    head = Text.assemble(
        ("liftlog pipeline ", "bold"),
        (f"run {snap.run_id}", "cyan"),
        f"  {snap.phase}  ",
        (f"{snap.elapsed:.0f} s", "dim"),
    )
    flow = Table(box=None, show_header=False, pad_edge=False)
    flow.add_column(style="bold")
    flow.add_column()
    flow.add_row(
        "NATS",
        f"{snap.published:,}/{snap.total:,} events published ({snap.publish_rate:,.0f}/s), {snap.acked:,} acked",
    )
    flow.add_row("liftlog", f"{snap.recorded:,} recorded in {snap.partitions} partitions")
    queries = Table(box=None, header_style="bold")
    for name in ("query", "batches", "rows in", "last batch", "rows/s", "watermark", "in state", "rows out"):
        queries.add_column(name, justify="left" if name in ("query", "watermark") else "right")
    for q in snap.queries:
        queries.add_row(
            q.name,
            f"{q.batches:,}",
            f"{q.rows_in:,}",
            f"{q.last_rows:,}",
            f"{q.rows_per_second:,.0f}",
            _watermark(q.watermark),
            f"{q.state_rows:,}",
            f"{q.rows_out:,}",
        )
    return Group(head, flow, queries)


def _summary_view(s: Summary) -> RenderableType:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    t = Table(title=f"run {s.run_id}: {s.events:,} events in {s.seconds:.0f} s", title_justify="left")
    for name in ("", "windows", "users", "events counted", "amount"):
        t.add_column(name, justify="left" if not name else "right")
    for label, tot in (
        ("expected (plain Python)", s.expected),
        ("liftlog, latest per key", s.stream),
        ("Parquet, closed windows", s.parquet),
    ):
        t.add_row(label, f"{tot.windows:,}", f"{tot.keys:,}", f"{tot.events:,}", f"{tot.amount:,}")
    verdict = (
        Text("Both sinks agree with the events published.", style="green")
        if s.complete
        else Text("The sinks do not match the events published (events dropped as late?).", style="yellow")
    )
    where = Text(f"Parquet: {s.parquet_path}    read back: liftlog pipeline results", style="dim")
    return Group(t, verdict, where)


@pipeline.command()
@_servers_option
@_nats_option
@_input_options
@_output_options
@_generator_options(50)
@click.option("--checkpoint-dir", default="pipeline-out/checkpoints", show_default=True, help="One subdir per run.")
@click.option("--duration", type=click.FloatRange(0), help="Stop publishing after this many seconds.")
@click.option("--trigger", default="1 second", show_default=True, help="Micro-batch interval.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master of the job.")
@click.option("--run-id", help="Names the run's checkpoints and Parquet files (default: the start time).")
def run(
    servers: str,
    nats: str,
    input_stream: str,
    subject_prefix: str,
    partitions: int,
    output_stream: str,
    parquet_dir: str,
    events: int,
    rate: float,
    interval_ms: int,
    users: int,
    seed: int,
    checkpoint_dir: str,
    duration: float | None,
    trigger: str,
    master: str,
    run_id: str | None,
) -> None:
    """Publish events, record them, count them with Spark, write liftlog and Parquet, show progress.

    \b
    generator --NATS <prefix>.<kind>[.<p>]--> liftlog stream (N partitions)
      --> Spark: from_json, watermark 15 s, count per user per 10 s window
        --> update mode --> compacted liftlog stream (latest count per user|window)
        --> append mode --> Parquet (closed windows)

    Each run reads the input from where it ended before the run, with
    checkpoints of its own, so it counts only its own events.
    """
    spark = _spark(master)
    from rich.live import Live

    from liftlog.pipeline.generator import GeneratorError
    from liftlog.pipeline.runner import Pipeline, PipelineConfig, PipelineError

    cfg = PipelineConfig(
        servers=servers,
        tls=client_tls(),
        nats=nats,
        input_stream=input_stream,
        output_stream=output_stream,
        subject_prefix=subject_prefix,
        partitions=partitions,
        parquet_dir=parquet_dir,
        checkpoint_dir=checkpoint_dir,
        events=events,
        rate=rate,
        interval_ms=interval_ms,
        seed=seed,
        users=users,
        duration=duration,
        trigger=trigger,
        run_id=run_id,
    )
    job = Pipeline(spark, cfg)
    console = err_console()
    try:
        with Live(_progress_view(job.snapshot()), console=console, refresh_per_second=4, transient=False) as live:
            summary = job.run(on_tick=lambda: live.update(_progress_view(job.snapshot())))
    except (PipelineError, GeneratorError) as exc:  # expected failures: one error line, as for other commands
        raise CommandError(str(exc)) from exc
    finally:
        spark.stop()
    out_console().print(_summary_view(summary))
    if not summary.complete:
        raise click.exceptions.Exit(1)


# -- generate -------------------------------------------------------------------------------


def _clock_interval(rate: float) -> int:
    return max(1, round(1000 / rate)) if rate > 0 else 1


@pipeline.command()
@_servers_option
@_nats_option
@_input_options
@_generator_options(None)
def generate(
    servers: str,
    nats: str,
    input_stream: str,
    subject_prefix: str,
    partitions: int,
    events: int,
    rate: float,
    interval_ms: int | None,
    users: int,
    seed: int,
) -> None:
    """Only publish events on NATS (creating the input stream if needed), for a job running elsewhere.

    Event time follows the clock, so a long-running job (spark-submit job.py)
    can be fed again and again. Each run ends with a flush event that moves
    event time 26 s on to close its windows: wait that long before the next
    run, or its first events are behind the watermark and dropped.
    """
    from liftlog.client import Client
    from liftlog.pipeline.generator import EventSpec, GeneratorError, PublishStats, make_events, publish_events

    async def work() -> PublishStats:
        async with Client(servers.split(","), tls=client_tls()) as client:
            await client.create_stream(f"{subject_prefix}.*", input_stream, partitions=partitions, exist_ok=True)
            info = (await client.fetch_metadata(input_stream)).streams[input_stream]
        spec = EventSpec(count=events, seed=seed, interval_ms=interval_ms or _clock_interval(rate), keys=users)
        batch = make_events(spec)
        return await publish_events(
            nats,
            batch,
            prefix=subject_prefix,
            partitions=len(info.partitions),
            rate=rate,
        )

    try:
        stats = asyncio.run(work())
    except GeneratorError as exc:  # an expected failure: one error line, as for other commands
        raise CommandError(str(exc)) from exc
    out_console().print(
        f"{stats.published - 1:,} events and a flush event published to {subject_prefix}.* "
        f"({stats.rate:,.0f}/s), all acknowledged by liftlog stream {input_stream}"
    )


# -- results --------------------------------------------------------------------------------


@pipeline.command()
@_servers_option
@_output_options
@click.option("--run-id", help="Only this run's Parquet files (default: all runs).")
@click.option("--top", type=click.IntRange(1), default=10, show_default=True, help="Rows per table.")
def results(servers: str, output_stream: str, parquet_dir: str, run_id: str | None, top: int) -> None:
    """Read the results back: the compacted stream's latest count per window, and the Parquet files."""
    from rich.table import Table

    from liftlog.client import Client
    from liftlog.pipeline.results import read_latest, read_parquet, totals

    async def latest() -> dict[str, dict[str, Any]]:
        async with Client(servers.split(","), tls=client_tls()) as client:
            return await read_latest(client, output_stream)

    stream_rows = list(asyncio.run(latest()).values())
    try:
        parquet_rows = read_parquet(parquet_dir, run_id)
    except ImportError:
        parquet_rows = []
        err_console().print(f"[yellow]pyarrow is missing, not reading {parquet_dir}:[/] {SPARK_MISSING}")
    console = out_console()

    title = f"Busiest windows (liftlog stream {output_stream}, latest value per key)"
    windows = Table(title=title, title_justify="left")
    for name in ("user", "window (UTC)", "events", "amount"):
        windows.add_column(name, justify="left" if name in ("user", "window (UTC)") else "right")
    ranked = sorted(stream_rows, key=lambda r: (-int(r.get("count") or 0), str(r.get("key")), r.get("window_start")))
    for r in ranked[:top]:
        span = f"{_when(r.get('window_start'))} to {_when(r.get('window_end'))}"
        windows.add_row(str(r.get("key")), span, f"{int(r.get('count') or 0):,}", f"{int(r.get('amount') or 0):,}")
    console.print(windows)

    users: dict[str, list[int]] = {}
    for r in parquet_rows:
        acc = users.setdefault(str(r.get("key")), [0, 0, 0])
        acc[0] += 1
        acc[1] += int(r.get("count") or 0)
        acc[2] += int(r.get("amount") or 0)
    where = f"{parquet_dir}" + (f"/run={run_id}" if run_id else "")
    per_user = Table(title=f"Busiest users (Parquet {where}, closed windows)", title_justify="left")
    for name in ("user", "windows", "events", "amount"):
        per_user.add_column(name, justify="left" if name == "user" else "right")
    for key, (n, events, amount) in sorted(users.items(), key=lambda kv: (-kv[1][1], kv[0]))[:top]:
        per_user.add_row(key, f"{n:,}", f"{events:,}", f"{amount:,}")
    console.print(per_user)

    s, p = totals(stream_rows), totals(parquet_rows)
    runs = len({r.get("run") for r in parquet_rows})
    console.print(
        f"liftlog {output_stream}: {s.windows:,} windows, {s.keys:,} users, {s.events:,} events\n"
        f"Parquet {where}: {p.windows:,} closed windows, {p.keys:,} users, {p.events:,} events"
        + (f" ({runs} runs)" if runs > 1 else "")
    )
