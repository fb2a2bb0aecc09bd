"""``liftlog bench``: publish and consume throughput and latency against a server.

Every scenario (see :mod:`liftlog.cli.bench_scenarios`) runs on a fresh
stream (deleted afterwards) with ``--size``-byte values. The table goes to
stderr and exactly one JSON line to stdout, so ``liftlog bench --json-only >
result.json`` and ``liftlog bench | jq`` work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from liftlog.cli.bench_scenarios import DEFAULT_COUNTS, REFERENCE, RUNNERS, SCENARIOS, Settings
from liftlog.cli.common import CommandError, addr_option, addresses
from liftlog.cli.common import run as run_loop
from liftlog.cli.messages import ack_policy_option
from liftlog.cli.output import err_console, format_latency_us, format_rate, print_note

__all__ = ["bench"]

_READY_TIMEOUT_S = 30.0


def _scenario_errors() -> tuple[type[BaseException], ...]:
    import nats.errors

    from liftlog.api.envelope import EnvelopeError
    from liftlog.client import LiftlogError

    return (LiftlogError, OSError, CommandError, EnvelopeError, nats.errors.Error)


async def _run_all(
    addrs: list[str], s: Settings, scenarios: list[str], status: Callable[[str], None]
) -> dict[str, Any]:
    from liftlog.client import Client

    errors = _scenario_errors()
    run_id = uuid.uuid4().hex[:8]
    results: dict[str, Any] = {}
    async with Client(addrs) as client:
        for scenario in scenarios:
            count = s.counts[scenario]
            name, subject = f"bench-{run_id}-{scenario}", f"bench.{run_id}.{scenario}"
            status(f"{scenario}: {count:,} messages of {s.size} bytes")
            limit = 30 + count / 500  # generous: a stalled scenario fails instead of hanging the run
            try:
                async with asyncio.timeout(limit):
                    await client.create_stream(subject, name, partitions=s.partitions)
                    results[scenario] = (await RUNNERS[scenario](client, s, name, subject, count)).to_json()
            except TimeoutError:
                results[scenario] = {"error": f"timed out after {limit:.0f} s"}
            except errors as exc:
                results[scenario] = {"error": str(exc) or type(exc).__name__}
            finally:
                with contextlib.suppress(*errors):
                    await asyncio.wait_for(client.delete_stream(name), 10)
    return results


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _log_tail(path: Path, lines: int = 5) -> str:
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return " | ".join(line.strip() for line in tail if line.strip())


@contextlib.asynccontextmanager
async def _spawned_server() -> AsyncIterator[tuple[str, str]]:
    """A server with embedded NATS on free ports in a temporary directory: yields (address, NATS URL)."""
    from liftlog.client import Client, LiftlogError

    root = Path(tempfile.mkdtemp(prefix="liftlog-bench-"))
    port, nats_port = _free_port(), _free_port()
    address = f"127.0.0.1:{port}"
    log_path = root / "server.log"
    command = [sys.executable, "-m", "liftlog.cli.main", "server", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--embedded-nats", "--embedded-nats-port", str(nats_port), "--data-dir", str(root / "data")]
    command += ["--log-level", "warn"]
    with open(log_path, "wb") as log:
        # A session of its own: Ctrl-C reaches only us, and we stop the server in order below.
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise CommandError(f"the benchmark server exited with code {proc.returncode}: {_log_tail(log_path)}")
            try:
                async with Client([address], timeout=1.0, retries=0) as probe:
                    await probe.fetch_metadata()
                break
            except LiftlogError:
                if time.monotonic() > deadline:
                    raise CommandError(
                        f"the benchmark server did not answer within {_READY_TIMEOUT_S:.0f} s: {_log_tail(log_path)}"
                    ) from None
                await asyncio.sleep(0.2)
        yield address, f"nats://127.0.0.1:{nats_port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def _table(results: dict[str, Any]) -> Table:
    """One row per scenario, each followed by a dim row of Liftbridge's figures where we have them."""
    table = Table("Scenario", "msgs/s", "p50", "p99", "p99.9", "Notes", title="liftlog bench")
    quantiles = ("p50", "p99", "p99.9")
    for scenario, result in results.items():
        if "error" in result:
            table.add_row(scenario, "-", "-", "-", "-", Text(f"error: {result['error']}", style="red"))
        else:
            latency = result["latency_us"] or {}
            rate = format_rate(result["msgs_per_s"] or 0)
            table.add_row(scenario, rate, *(format_latency_us(latency.get(q)) for q in quantiles), result["notes"])
        ref = REFERENCE.get(scenario)
        if ref is not None:
            ref_latency = ref.get("latency_us", {})
            cells = (format_latency_us(ref_latency.get(q)) for q in quantiles)
            table.add_row("  Liftbridge", format_rate(ref["msgs_per_s"]), *cells, ref["notes"], style="dim")
    return table


@click.command()
@addr_option
@click.option("--start-server", is_flag=True, help="Start a throw-away server (embedded NATS, temp dir) to measure.")
@click.option("--size", type=click.IntRange(min=1), default=256, show_default=True, help="Bytes per message value.")
@click.option(
    "--count", type=click.IntRange(min=1), help="Messages for every scenario (default: per scenario, see above)."
)
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True, help="Partitions per stream.")
@ack_policy_option("What publishes wait for (consume prefills with all).")
@click.option(
    "--window", type=click.IntRange(min=1), default=100, show_default=True, help="In-flight messages (async, nats)."
)
@click.option(
    "--concurrency", type=click.IntRange(min=1), default=16, show_default=True, help="Publishers in 'concurrent'."
)
@click.option(
    "--nats-url",
    metavar="URL",
    help="NATS server for 'nats' (default: the started server's, else nats://127.0.0.1:4222).",
)
@click.option(
    "--scenarios",
    default=",".join(SCENARIOS),
    show_default=True,
    help="Comma-separated scenarios to run, in order.",
)
@click.option("--json-only", is_flag=True, help="Print only the JSON line.")
def bench(
    start_server: bool,
    size: int,
    count: int | None,
    partitions: int,
    ack_policy: str,
    window: int,
    concurrency: int,
    nats_url: str | None,
    scenarios: str,
    json_only: bool,
) -> None:
    """Measure publish and consume throughput and latency.

    Each scenario publishes --size-byte values to a new stream (deleted
    afterwards); partitions are used round-robin.

    \b
      sync        1 publisher, one Publish RPC at a time (3,000 messages)
      async       PublishAsync stream with --window in flight (20,000)
      concurrent  --concurrency publishers, one Publish RPC at a time each (8,000 in all)
      nats        Publish envelopes over plain NATS, acks on one inbox, --window in flight (50,000)
      consume     read back a prefilled stream, EARLIEST to STOP_LATEST (50,000)
      e2e         publish to receive latency of a following subscriber (3,000)

    --count N sets every scenario's message count (split among the
    publishers in 'concurrent'). Latencies run from sending to the ack (to
    receipt for e2e); 'async' infers them from when PublishAsync's window
    lets each message out (latency_method in the JSON). The table, with
    Liftbridge's figures on this machine class, goes to stderr; one JSON
    line goes to stdout.

    \b
      liftlog bench --start-server
      liftlog bench -a 127.0.0.1:9292 --nats-url nats://127.0.0.1:4222 --scenarios sync,nats --count 10000
    """
    chosen = [name.strip().lower() for name in scenarios.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown or not chosen:
        raise click.BadParameter(
            f"unknown scenario(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(SCENARIOS)}",
            param_hint="--scenarios",
        )
    console = err_console()
    settings = Settings(
        size=size,
        partitions=partitions,
        ack_policy=ack_policy.lower(),
        window=window,
        concurrency=concurrency,
        counts={name: count or default for name, default in DEFAULT_COUNTS.items()},
        nats_url=nats_url or "nats://127.0.0.1:4222",
    )

    # A spinner on a terminal, plain lines in a log, nothing with --json-only.
    status = console.status("") if console.is_terminal and not json_only else None

    def show(text: str) -> None:
        if status is not None:
            status.update(text)
        elif not json_only:
            print_note(text)

    async def go() -> tuple[str, dict[str, Any]]:
        with status or contextlib.nullcontext():
            if not start_server:
                return ", ".join(addresses()), await _run_all(list(addresses()), settings, chosen, show)
            show("starting a server")
            async with _spawned_server() as (address, url):
                settings.nats_url = nats_url or url
                return "started", await _run_all([address], settings, chosen, show)

    server, results = run_loop(go())
    if not json_only:
        console.print(_table(results))
    report = {
        "bench": "liftlog",
        "size": size,
        "partitions": partitions,
        "ack_policy": settings.ack_policy,
        "window": window,
        "concurrency": concurrency,
        "server": server,
        "scenarios": results,
        "liftbridge_reference": {name: ref for name, ref in REFERENCE.items() if name in results},
    }
    click.echo(json.dumps(report))
    if any("error" in result for result in results.values()):
        raise click.exceptions.Exit(1)
