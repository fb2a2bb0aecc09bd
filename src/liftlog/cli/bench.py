"""``liftlog bench``: publish and consume throughput and latency against a server.

Every scenario (see :mod:`liftlog.cli.bench_scenarios`) runs on a fresh
stream (deleted afterwards) with ``--size``-byte values. The table goes to
stderr and exactly one JSON line to stdout, so ``liftlog bench --json-only >
result.json`` and ``liftlog bench | jq`` work. ``--start-cluster`` runs the
replication and failover scenarios of :mod:`liftlog.cli.bench_cluster` instead.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import platform
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource
from rich.table import Table
from rich.text import Text

from liftlog.cli.bench_plot import Series, check_plot, write_plot
from liftlog.cli.bench_processes import run_all, spawned_server
from liftlog.cli.bench_scenarios import ALL_SCENARIOS, DEFAULT_COUNTS, SCENARIOS, Settings
from liftlog.cli.common import CommandError, addr_option, addresses, client_tls
from liftlog.cli.common import run as run_loop
from liftlog.cli.messages import ack_policy_option
from liftlog.cli.output import err_console, format_latency_us, format_rate, print_note

if TYPE_CHECKING:
    pass

__all__ = ["bench"]

#: The scenarios of --start-cluster (liftlog.cli.bench_cluster.CLUSTER_SCENARIOS).
CLUSTER_SCENARIOS = ("single", "rf3-all", "rf3-leader", "failover", "group-failover")
#: What --start-cluster runs without --scenarios.
CLUSTER_DEFAULT_SCENARIOS = ("single", "rf3-all", "rf3-leader", "failover")
#: Options that mean nothing to --start-cluster's scenarios: given explicitly with it, they are an error.
_NOT_FOR_CLUSTER = ("partitions", "ack_policy", "concurrency", "nats_url")


async def _compare_encryption(
    address: str,
    settings: Settings,
    chosen: list[str],
    show: Callable[[str], None],
    encrypted: dict[str, Any],
    runs: dict[str, dict[str, Series]] | None = None,
) -> dict[str, Any]:
    """Each scenario on a clear stream, then on an encrypted one, on the same server: the clear results
    (returned) and the encrypted ones (into ``encrypted``). Alternating keeps drift out of the ratios.
    With `runs`, the series to plot go to its "clear" and "encrypted" runs."""
    clear: dict[str, Any] = {}
    for scenario in chosen:
        for on, out in ((False, clear), (True, encrypted)):
            settings.encryption = on
            label = "encrypted" if on else "clear"
            series = runs.setdefault(label, {}) if runs is not None else None
            show_run = functools.partial(_prefixed, show, f"{label}: ")
            out.update(await run_all([address], settings, [scenario], show_run, series=series))
    settings.encryption = False
    return clear


def _table(results: dict[str, Any], title: str = "liftlog bench") -> Table:
    """One row per scenario.

    No other system's figures beside ours: these come through liftlog's Python client, whose own cost
    shows in them; docs/performance.md compares servers with each system's own Go tools, in one run.
    """
    table = Table(
        "Scenario",
        "msgs/s",
        "p50",
        "p99",
        "p99.9",
        "Notes",
        title=title,
        caption="through liftlog's Python client; server against server with Go clients: docs/performance.md",
    )
    quantiles = ("p50", "p99", "p99.9")
    for scenario, result in results.items():
        if "error" in result:
            table.add_row(scenario, "-", "-", "-", "-", Text(f"error: {result['error']}", style="red"))
        else:
            latency = result["latency_us"] or {}
            rate = format_rate(result["msgs_per_s"] or 0)
            table.add_row(scenario, rate, *(format_latency_us(latency.get(q)) for q in quantiles), result["notes"])
    return table


FSYNC_POLICIES = ("never", "interval", "always")
#: The issue's goal: with group commit, "always" keeps at least half the PublishAsync throughput of "never".
FSYNC_GOAL = 0.5


def choose_fsync(value: str) -> list[str]:
    chosen = list(dict.fromkeys(p.strip().lower() for p in value.split(",") if p.strip()))
    unknown = [p for p in chosen if p not in FSYNC_POLICIES]
    if unknown or not chosen:
        raise click.BadParameter(
            f"unknown fsync polic(ies) {', '.join(unknown) or '(none given)'}; choose from {', '.join(FSYNC_POLICIES)}",
            param_hint="--fsync",
        )
    return chosen


def fsync_comparison(by_policy: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per scenario: each policy's throughput as a fraction of "never"'s, and whether "always" meets the goal."""
    never = by_policy.get("never", {})
    out: dict[str, Any] = {}
    for scenario, base in never.items():
        base_rate = base.get("msgs_per_s")
        if not base_rate:
            continue
        row: dict[str, Any] = {}
        for policy, results in by_policy.items():
            rate = results.get(scenario, {}).get("msgs_per_s")
            if policy != "never" and rate:
                row[f"{policy}_vs_never"] = round(rate / base_rate, 3)
        if "always_vs_never" in row:
            row["goal"] = FSYNC_GOAL
            row["met"] = row["always_vs_never"] >= FSYNC_GOAL
        out[scenario] = row
    return out


ENCRYPTION_MODES = ("off", "on", "compare")


def encryption_comparison(clear: dict[str, Any], encrypted: dict[str, Any]) -> dict[str, Any]:
    """Per scenario: the encrypted stream's throughput and p99 latency as multiples of the clear one's."""
    out: dict[str, Any] = {}
    for scenario, base in clear.items():
        other = encrypted.get(scenario, {})
        if not base.get("msgs_per_s") or not other.get("msgs_per_s"):
            continue
        row = {"encrypted_vs_clear": round(other["msgs_per_s"] / base["msgs_per_s"], 3)}
        p99, p99_enc = (base.get("latency_us") or {}).get("p99"), (other.get("latency_us") or {}).get("p99")
        if p99 and p99_enc:
            row["p99_encrypted_vs_clear"] = round(p99_enc / p99, 3)
        out[scenario] = row
    return out


def _fsync_table(by_policy: dict[str, dict[str, Any]]) -> Table:
    """msgs/s and p99 of every scenario under each fsync policy, side by side."""
    policies = list(by_policy)
    table = Table("Scenario", *(f"{p} msgs/s" for p in policies), *(f"{p} p99" for p in policies))
    table.title = "liftlog bench: fsync policies side by side (streams.fsync.policy)"
    scenarios = list(dict.fromkeys(name for results in by_policy.values() for name in results))
    for scenario in scenarios:
        rates, p99s = [], []
        for policy in policies:
            result = by_policy[policy].get(scenario, {})
            if "error" in result or not result:
                rates.append(Text("error", style="red"))
                p99s.append("-")
            else:
                rates.append(Text(format_rate(result["msgs_per_s"] or 0)))
                p99s.append(format_latency_us((result["latency_us"] or {}).get("p99")))
        table.add_row(scenario, *rates, *p99s)
    return table


def _plot(path: str, runs: dict[str, dict[str, Series]], title: str, quiet: bool) -> None:
    """Write the --plot file, saying where (or that no scenario had anything to draw)."""
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    title += f"\n{platform.node() or 'this machine'}, {os.cpu_count() or '?'} cores, {when}"
    drawn = write_plot(path, runs, title)
    if not drawn:
        raise CommandError(f"--plot: no scenario recorded per-message times, so {path} was not written")
    if not quiet:
        print_note(f"wrote {drawn} scenario{'s' if drawn > 1 else ''} to {path}")


def _prefixed(show: Callable[[str], None], prefix: str, text: str) -> None:
    show(prefix + text)


def _given(ctx: click.Context, name: str) -> bool:
    """Whether option `name` was given on the command line (or, for --addr, on the root group's)."""
    current: click.Context | None = ctx
    while current is not None:
        if current.get_parameter_source(name) == ParameterSource.COMMANDLINE:
            return True
        current = current.parent
    return False


def choose_scenarios(scenarios: str | None, start_cluster: bool, servers: int) -> list[str]:
    """The --scenarios list for the mode, checked; raises click.BadParameter."""
    valid = CLUSTER_SCENARIOS if start_cluster else ALL_SCENARIOS
    if scenarios is None:
        return list(CLUSTER_DEFAULT_SCENARIOS if start_cluster else SCENARIOS)
    chosen = [name.strip().lower() for name in scenarios.split(",") if name.strip()]
    chosen = list(dict.fromkeys(chosen))
    unknown = [name for name in chosen if name not in valid]
    if unknown or not chosen:
        mode = "with --start-cluster" if start_cluster else "without --start-cluster"
        hint = ""
        if unknown and all(name in (ALL_SCENARIOS if start_cluster else CLUSTER_SCENARIOS) for name in unknown):
            hint = " (those are the scenarios " + ("without" if start_cluster else "with") + " --start-cluster)"
        raise click.BadParameter(
            f"unknown scenario(s) {', '.join(unknown) or '(none given)'} {mode}{hint}; choose from {', '.join(valid)}",
            param_hint="--scenarios",
        )
    if "failover" in chosen and servers < 3:
        raise click.BadParameter(
            f"failover needs --servers 3 or more (a metadata quorum must survive the kill), got {servers}",
            param_hint="--scenarios",
        )
    return chosen


def check_cluster_options(ctx: click.Context, start_cluster: bool, start_server: bool) -> None:
    """Raise click.UsageError for options that contradict --start-cluster (or need it)."""
    if not start_cluster:
        for name in ("servers", "server_set"):
            if _given(ctx, name):
                raise click.UsageError(f"--{name.replace('_', '-')} needs --start-cluster")
        return
    if start_server:
        raise click.UsageError("--start-cluster and --start-server exclude each other")
    if _given(ctx, "addr"):
        raise click.UsageError("--start-cluster measures its own servers: leave out --addr")
    for name in _NOT_FOR_CLUSTER:
        if _given(ctx, name):
            flag = "--" + name.replace("_", "-")
            raise click.UsageError(f"{flag} does not apply to --start-cluster (its scenarios fix it)")


def check_server_settings(settings: tuple[str, ...]) -> None:
    """Each --server-set is KEY=VALUE (the servers check the key and value themselves)."""
    for setting in settings:
        key, eq, _ = setting.partition("=")
        if not eq or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {setting!r}", param_hint="--server-set")


def cluster_report(
    servers: int, size: int, window: int, results: dict[str, Any], overrides: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The JSON line of a --start-cluster run."""
    from liftlog.cli.bench_cluster import comparison

    return {
        "bench": "liftlog",
        "size": size,
        "partitions": 1,
        "window": window,
        "server": "started cluster",
        "cluster": {
            "servers": servers,
            "replication_factor": servers,
            "server_settings": list(overrides) or "defaults",
        },
        "scenarios": results,
        "comparison": comparison(results),
    }


def _goal_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    if "rf3_all_vs_single" in summary:
        met = "met" if summary["rf3_all_vs_single_met"] else "NOT met"
        lines.append(
            f"rf3-all runs at {summary['rf3_all_vs_single']:.2f}x the single-node throughput "
            f"(goal >= {summary['rf3_all_vs_single_goal']}: {met})"
        )
    if "failover_s" in summary:
        met = "met" if summary["failover_met"] else "NOT met"
        lines.append(
            f"a new leader acked {summary['failover_s']:.2f} s after the old one was killed "
            f"(goal < {summary['failover_goal_s']:g} s: {met})"
        )
    return lines


@click.command()
@addr_option
@click.option("--start-server", is_flag=True, help="Start a throw-away server (embedded NATS, temp dir) to measure.")
@click.option(
    "--start-cluster",
    is_flag=True,
    help="Start a throw-away cluster (nats-server and --servers liftlog servers) for the cluster scenarios.",
)
@click.option(
    "--servers",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Servers of --start-cluster; the stream is replicated to all of them.",
)
@click.option(
    "--server-set",
    "server_set",
    multiple=True,
    metavar="KEY=VALUE",
    help="A server setting for --start-cluster's servers (repeatable; default: none, the servers' defaults).",
)
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
    help=(
        f"Comma-separated scenarios to run, in order [default: {','.join(SCENARIOS)}; "
        f"with --start-cluster: {','.join(CLUSTER_DEFAULT_SCENARIOS)}]; also cursor, rebalance "
        "(and group-failover with --start-cluster)."
    ),
)
@click.option(
    "--fsync",
    "fsync",
    default="never",
    show_default=True,
    metavar="POLICIES",
    help=(
        "With --start-server: the streams.fsync.policy of the started server; a comma-separated list "
        "(never,interval,always) runs the scenarios once per policy on a server of its own and compares them."
    ),
)
@click.option(
    "--encryption",
    type=click.Choice(ENCRYPTION_MODES),
    default="off",
    show_default=True,
    help=(
        "Create the streams encrypted at rest (on; the server needs a master key, --start-server gives its one), "
        "or, with --start-server, run each scenario on a clear and on an encrypted stream, alternately, and compare."
    ),
)
@click.option(
    "--plot",
    "plot_path",
    metavar="FILE",
    help=(
        "Also draw each scenario's throughput over time and latency percentiles into FILE (.png, .svg or .pdf), "
        "every run of --fsync or --encryption compare in its own colour; needs matplotlib "
        "(pip install 'liftlog[plot]')."
    ),
)
@click.option("--json-only", is_flag=True, help="Print only the JSON line.")
@click.pass_context
def bench(
    ctx: click.Context,
    start_server: bool,
    start_cluster: bool,
    servers: int,
    server_set: tuple[str, ...],
    size: int,
    count: int | None,
    partitions: int,
    ack_policy: str,
    window: int,
    concurrency: int,
    nats_url: str | None,
    scenarios: str | None,
    fsync: str,
    encryption: str,
    plot_path: str | None,
    json_only: bool,
) -> None:
    """Measure publish and consume throughput and latency.

    Each scenario publishes --size-byte values to a new stream (deleted
    afterwards); partitions are used round-robin.

    \b
      sync        1 publisher, one Publish RPC at a time (3,000 messages)
      async       publish_many with --window in flight (20,000): batched publish
                  requests on liftlog, a PublishAsync stream on Liftbridge
      concurrent  --concurrency publishers, one Publish RPC at a time each (8,000 in all)
      nats        Publish envelopes over plain NATS, acks on one inbox, --window in flight (50,000)
      consume     read back a prefilled stream, EARLIEST to STOP_LATEST (50,000)
      e2e         publish to receive latency of a following subscriber (3,000)
      cursor      SetCursor calls, one after another (2,000; only when named; servers need cursors on,
                  --start-server's has them)
      rebalance   a member joins a consumer group of a 4-partition stream under load: time from its
                  join to its first message (5 joins; only when named)

    --count N sets every scenario's message count (split among the
    publishers in 'concurrent'). Latencies run from sending to the ack (to
    receipt for e2e); 'async' infers them from when publish_many's window
    lets each message out (latency_method in the JSON). The table goes to
    stderr (figures through this Python client: to compare servers, see
    docs/performance.md, which uses each system's own Go tools); one JSON
    line goes to stdout.

    --start-cluster starts a nats-server and --servers liftlog servers
    (default settings, temp dirs) and runs, on one partition replicated to
    every server:

    \b
      single      'async' with ack ALL on a standalone server, run first (20,000)
      rf3-all     'async' on the replicated stream, ack ALL (20,000)
      rf3-leader  the same with ack LEADER (20,000)
      failover    sequential ack-ALL publishes; halfway, kill -9 the leader and
                  time the first ack of a new leader (2,000 acks; runs last)
      group-failover  a 2-member consumer group on a cluster of its own: kill -9 the
                  group's coordinator and time until another coordinates it and until both
                  members process messages again (only when named)

    \b
      liftlog bench --start-server
      liftlog bench -a 127.0.0.1:9292 --nats-url nats://127.0.0.1:4222 --scenarios sync,nats --count 10000
      liftlog bench --start-cluster --servers 3 --scenarios rf3-all,failover
      liftlog bench --start-server --fsync never,always --plot fsync.png
    """
    check_cluster_options(ctx, start_cluster, start_server)
    check_server_settings(server_set)
    policies = choose_fsync(fsync)
    if _given(ctx, "fsync") and not start_server:
        raise click.UsageError("--fsync sets the policy of the server it starts: it needs --start-server")
    if encryption == "compare" and (not start_server or len(policies) > 1):
        raise click.UsageError("--encryption compare needs --start-server and one --fsync policy")
    if encryption != "off" and start_cluster:
        raise click.UsageError(
            "--start-cluster takes encryption as server settings: --server-set streams.encryption=true "
            "--server-set encryption.key.file=FILE"
        )
    chosen = choose_scenarios(scenarios, start_cluster, servers)
    if plot_path is not None:
        check_plot(plot_path)  # before minutes of measuring, not after
    #: What --plot draws: run label ("" for a single run) -> scenario -> series.
    runs: dict[str, dict[str, Series]] | None = {} if plot_path is not None else None
    console = err_console()
    settings = Settings(
        size=size,
        partitions=partitions,
        ack_policy=ack_policy.lower(),
        window=window,
        concurrency=concurrency,
        counts={name: count or default for name, default in DEFAULT_COUNTS.items()},
        nats_url=nats_url or "nats://127.0.0.1:4222",
        encryption=encryption == "on",
    )
    compared: dict[str, dict[str, Any]] = {}

    # A spinner on a terminal, plain lines in a log, nothing with --json-only.
    status = console.status("") if console.is_terminal and not json_only else None

    def show(text: str) -> None:
        if status is not None:
            status.update(text)
        elif not json_only:
            print_note(text)

    if start_cluster:
        from liftlog.cli.bench_cluster import CLUSTER_DEFAULT_COUNTS, run_cluster_bench

        settings.counts = {name: count or default for name, default in CLUSTER_DEFAULT_COUNTS.items()}

        async def go_cluster() -> dict[str, Any]:
            with status or contextlib.nullcontext():
                series = runs.setdefault("", {}) if runs is not None else None
                return await run_cluster_bench(servers, settings, chosen, show, server_set, series)

        results = run_loop(go_cluster())
        report = cluster_report(servers, size, window, results, server_set)
        if not json_only:
            console.print(_table(results, f"liftlog bench: cluster of {servers}, replication factor {servers}"))
            for line in _goal_lines(report["comparison"]):
                print_note(line)
        click.echo(json.dumps(report))
        if plot_path is not None and runs is not None:
            title = (
                f"liftlog bench --start-cluster: {servers} servers, replication factor {servers}, "
                f"{size}-byte values, window {window}"
            )
            _plot(plot_path, runs, title, json_only)
        if any("error" in result for result in results.values()):
            raise click.exceptions.Exit(1)
        return

    async def go() -> tuple[str, dict[str, dict[str, Any]]]:
        with status or contextlib.nullcontext():
            if not start_server:
                series = runs.setdefault("", {}) if runs is not None else None
                return ", ".join(addresses()), {
                    "": await run_all(list(addresses()), settings, chosen, show, client_tls(), series)
                }
            by_policy: dict[str, dict[str, Any]] = {}
            for policy in policies:
                show(f"starting a server (fsync {policy})")
                keyed = encryption != "off"
                server_settings = (f"streams.fsync.policy={policy}", "cursors.stream.partitions=1")
                async with spawned_server(server_settings, keyed) as (address, url):
                    settings.nats_url = nats_url or url
                    if encryption == "compare":
                        by_policy[policy] = await _compare_encryption(address, settings, chosen, show, compared, runs)
                        continue
                    label = f"fsync {policy}" if len(policies) > 1 else ""
                    series = runs.setdefault(label, {}) if runs is not None else None
                    show_run = functools.partial(_prefixed, show, f"{label}: " if label else "")
                    by_policy[policy] = await run_all([address], settings, chosen, show_run, series=series)
            return "started", by_policy

    server, by_policy = run_loop(go())
    results = next(iter(by_policy.values()))
    if not json_only:
        console.print(_table(results, "liftlog bench" + (f" (fsync {policies[0]})" if start_server else "")))
        if len(by_policy) > 1:
            console.print(_fsync_table(by_policy))
            for scenario, row in fsync_comparison(by_policy).items():
                if "met" in row:
                    print_note(
                        f"{scenario}: fsync always runs at {row['always_vs_never']:.2f}x of never "
                        f"(goal >= {FSYNC_GOAL}: {'met' if row['met'] else 'NOT met'})"
                    )
    report = {
        "bench": "liftlog",
        "size": size,
        "partitions": partitions,
        "ack_policy": settings.ack_policy,
        "window": window,
        "concurrency": concurrency,
        "server": server,
        "scenarios": results,
    }
    if start_server:
        report["fsync_policy"] = policies[0]
    report["encryption"] = encryption
    if compared:
        report["encrypted_scenarios"] = compared
        report["encryption_comparison"] = encryption_comparison(results, compared)
        if not json_only:
            for scenario, row in report["encryption_comparison"].items():
                print_note(
                    f"{scenario}: an encrypted stream runs at {row['encrypted_vs_clear']:.2f}x of a clear one"
                    + (f", p99 {row['p99_encrypted_vs_clear']:.2f}x" if "p99_encrypted_vs_clear" in row else "")
                )
    if len(by_policy) > 1:
        report["fsync"] = by_policy
        report["fsync_comparison"] = fsync_comparison(by_policy)
    click.echo(json.dumps(report))
    if plot_path is not None and runs is not None:
        title = (
            f"liftlog bench: {size}-byte values, {partitions} partition{'s' if partitions > 1 else ''}, "
            f"ack {settings.ack_policy.upper()}, window {window}"
        )
        if start_server and len(policies) == 1:
            title += f", fsync {policies[0]}"
        _plot(plot_path, runs, title, json_only)
    if any("error" in result for results in by_policy.values() for result in results.values()):
        raise click.exceptions.Exit(1)
