"""``liftlog cluster``: the cluster as a server sees it (liftlog's own ``liftlog.Cluster`` API)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from liftlog.cli.common import addr_option, connect, connect_to, output_option, run
from liftlog.cli.output import out_console, print_note, table_console
from liftlog.cli.params import DURATION
from liftlog.cli.watch import WatchOptions, check_watch_options, run_watch, watch_options

if TYPE_CHECKING:
    from rich.progress import TaskID

    from liftlog.client import Client, ClusterStatus, PartitionInfo, Reassignment, Reassignments, ServerStatus

__all__ = [
    "PartitionRow",
    "cluster",
    "partitions_table",
    "reassignments_table",
    "status_json",
    "status_notes",
    "status_summary",
    "status_table",
    "watch_view",
]

_NONE = "—"


@click.group()
@addr_option
def cluster() -> None:
    """Inspect and administer the cluster (liftlog servers only; Liftbridge has no such API)."""


def _sorted_servers(status: ClusterStatus) -> list[ServerStatus]:
    return sorted(status.servers, key=lambda s: s.id)


def _role(server: ServerStatus) -> Text:
    role = "controller" if server.controller else "voter" if server.voter else _NONE
    if server.leaving:
        return Text(f"{role}, leaving", style="yellow")
    return Text(role)


def _live(server: ServerStatus) -> Text:
    return Text("yes", style="green") if server.alive else Text("no", style="red")


def status_summary(status: ClusterStatus) -> Text:
    """The line above the table: who leads, the Raft positions, the counts and who answered."""
    line = Text()
    if status.controller is None:
        line.append("no known metadata leader", style="bold red")
    else:
        line.append("controller ", style="bold").append(status.controller)
    line.append(f"  term {status.term}  commit {status.commit_index}  applied {status.applied_index}")
    streams = "stream" if status.stream_count == 1 else "streams"
    partitions = "partition" if status.partition_count == 1 else "partitions"
    line.append(f"  {status.stream_count} {streams}, {status.partition_count} {partitions}")
    answered = status.server(status.server_id)
    line.append("  answered by ", style="dim").append(status.server_id or "?")
    if answered is not None:
        line.append(f" ({answered.address})")
    return line


def status_table(status: ClusterStatus) -> Table:
    """One row per server, sorted by id."""
    # No vertical rules or edge padding: 16-character ids and full headers fit in 80 columns.
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    # On a narrow terminal the long ids fold onto more lines, rather than lose characters; addresses,
    # short and copied into --addr, stay on one line.
    table.add_column("ID", overflow="fold")
    table.add_column("ADDRESS", no_wrap=True)
    for heading in ("RACK", "ROLE", "LIVE"):
        table.add_column(heading)
    for heading in ("PARTITIONS", "LEADERS"):
        table.add_column(heading, justify="right")
    for s in _sorted_servers(status):
        table.add_row(
            Text(s.id),  # Text, not str: rich would read brackets in ids as markup
            Text(s.address),
            Text(s.rack or _NONE),
            _role(s),
            _live(s),
            str(s.partition_count),
            str(s.leader_count),
        )
    return table


def attention_table(status: ClusterStatus) -> Table:
    """Partitions not online or under-replicated, so an operator sees at once what to look at."""
    table = Table(title="Partitions needing attention", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for heading in ("STREAM", "PART.", "STATE", "LEADER", "ISR", "REPLICAS"):
        table.add_column(heading, overflow="fold")
    for p in status.attention:
        state = Text(p.state, style="red" if p.state == "offline" else "yellow" if p.state != "online" else "")
        if p.candidate:
            state.append(f" ({p.candidate})")
        isr = Text(",".join(p.isr), style="yellow" if p.under_replicated else "")
        table.add_row(Text(p.stream), str(p.partition), state, Text(p.leader), isr, Text(",".join(p.replicas)))
    return table


def fenced_table(status: ClusterStatus) -> Table:
    """Replicas whose logs refuse writes, with the file and OS error that caused it."""
    table = Table(title="Fenced replicas (refusing writes)", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for heading in ("STREAM", "PART.", "SERVER", "LEADER", "REASON"):
        table.add_column(heading, overflow="fold")
    for p in status.fenced:
        table.add_row(Text(p.stream), str(p.partition), Text(p.server), Text(p.leader), Text(p.reason, style="red"))
    return table


def status_json(status: ClusterStatus) -> str:
    """One JSON object with the fields of :class:`~liftlog.client.ClusterStatus`, servers sorted by id."""
    obj: dict[str, Any] = dataclasses.asdict(status)
    obj["servers"] = [dataclasses.asdict(s) for s in _sorted_servers(status)]
    return json.dumps(obj, ensure_ascii=False)


def status_notes(result: ClusterStatus) -> list[RenderableType]:
    """What the status shows below the servers: partitions needing attention, fenced replicas, warnings."""
    notes: list[RenderableType] = []
    if result.attention:
        notes.append(attention_table(result))
    if result.fenced:
        notes.append(fenced_table(result))
    if result.segment_files_budget:
        limit = result.open_files_limit or "unlimited"
        notes.append(
            Text(
                f"{result.server_id}: open-file limit {limit}; sealed segments hold {result.segment_files_open} "
                f"of {result.segment_files_budget} descriptors (streams.segment.files.max)",
                style="dim",
            )
        )
    if result.unreachable:
        notes.append(
            Text(f"fenced replicas unknown for {', '.join(result.unreachable)} (did not answer)", style="yellow")
        )
    if result.without_secret:
        notes.append(
            Text(
                f"no cluster secret on {', '.join(result.without_secret)}: anyone who can publish on NATS can act "
                "as a server (clustering.auth.key.file; docs/security.md)",
                style="yellow",
            )
        )
    if result.dropped:
        per_server: dict[str, list[str]] = {}
        for server, reason, count in result.dropped:
            per_server.setdefault(server, []).append(f"{count} {reason}")
        parts = "; ".join(f"{server}: {', '.join(counts)}" for server, counts in per_server.items())
        notes.append(
            Text(f"server-to-server messages dropped since start ({parts}): see the servers' logs", style="yellow")
        )
    if result.encryption_keys_differ:
        parts = "; ".join(f"{server}: {keys[0] if keys else 'none'}" for server, keys in result.encryption_keys)
        notes.append(
            Text(
                f"servers encrypt with different master keys ({parts}): every server of an encrypted stream needs "
                "the same key (encryption.key.file; docs/security.md)",
                style="yellow",
            )
        )
    return notes


# -- cluster status --watch ----------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class PartitionRow:
    """A partition as the watch shows it; ``fresh``: its offsets come from its leader, not from metadata."""

    stream: str
    info: PartitionInfo
    fresh: bool
    #: The controller's state of the partition ("online", "election", "candidate-found", "offline").
    state: str = "online"

    @property
    def lag(self) -> int:
        """Messages the leader has written but not yet committed (newest offset minus high watermark)."""
        return max(0, self.info.newest_offset - self.info.high_watermark)

    @property
    def under_replicated(self) -> bool:
        return len(self.info.isr) < len(self.info.replicas)


def partition_state(row: PartitionRow) -> Text:
    """``online``, or what is not as it should be: the controller's state (red when offline, yellow in an
    election), paused, readonly, under-replicated."""
    text = Text()
    if row.state != "online":
        text.append(row.state, style="red" if row.state == "offline" else "yellow")
    for flag, on in (("paused", row.info.paused), ("readonly", row.info.readonly)):
        if on:
            text.append(", " if text else "").append(flag, style="yellow")
    if row.under_replicated:
        text.append(", " if text else "").append("under-replicated", style="yellow")
    return text or Text("online", style="green")


def _isr(p: PartitionInfo) -> Text:
    """The in-sync replicas, then the replicas out of sync, marked: no separate column of replicas repeats the
    (long) server ids."""
    text = Text(",".join(p.isr))
    out = [r for r in p.replicas if r not in p.isr]
    if out:
        text.append(f" (out: {','.join(out)})", style="yellow")
    return text


def partitions_table(rows: Sequence[PartitionRow]) -> Table:
    """One row per partition: leader, in-sync replicas, high watermark, newest offset, lag and state."""
    table = Table(title="Partitions", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("STREAM", overflow="fold")
    table.add_column("PART.", justify="right")
    for heading in ("LEADER", "ISR"):
        table.add_column(heading, overflow="fold")
    for heading in ("HW", "NEWEST", "LAG"):
        table.add_column(heading, justify="right")
    table.add_column("STATE")
    for row in rows:
        p = row.info
        # Offsets from the metadata, not the leader, may be stale or -1: dim, and no lag is claimed.
        offsets = "" if row.fresh else "dim"
        table.add_row(
            Text(row.stream),
            str(p.id),
            Text(p.leader or _NONE, style="" if p.leader else "red"),
            _isr(p),
            Text(str(p.high_watermark), style=offsets),
            Text(str(p.newest_offset), style=offsets),
            Text(str(row.lag), style="yellow" if row.lag else "") if row.fresh else Text("?", style="dim"),
            partition_state(row),
        )
    return table


async def _partition_rows(client: Client, status: ClusterStatus) -> list[PartitionRow]:
    """Every partition, its offsets asked of its leader (a few at a time), its state from the status."""
    from liftlog.client import LiftlogError

    metadata = await client.fetch_metadata()
    states = {(p.stream, p.partition): p.state for p in status.attention}
    at_once = asyncio.Semaphore(16)

    async def row(stream: str, info: PartitionInfo) -> PartitionRow:
        state = states.get((stream, info.id), "online")
        async with at_once:
            try:
                return PartitionRow(stream, await client.fetch_partition_metadata(stream, info.id), True, state)
            except LiftlogError:  # leaderless, or its leader is gone: what the metadata says
                return PartitionRow(stream, info, False, state)

    return list(
        await asyncio.gather(
            *(
                row(name, metadata.streams[name].partitions[pid])
                for name in sorted(metadata.streams)
                for pid in sorted(metadata.streams[name].partitions)
            )
        )
    )


def watch_view(result: ClusterStatus, rows: Sequence[PartitionRow]) -> Group:
    """The summary line, the servers, every partition, then what needs attention."""
    parts: list[RenderableType] = [status_summary(result), status_table(result)]
    if rows:
        parts.append(partitions_table(rows))
    # The partitions table already shows the states; the attention table would repeat them.
    parts.extend(status_notes(dataclasses.replace(result, attention=())))
    return Group(*parts)


@cluster.command()
@addr_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table (as --output json).")
@output_option
@watch_options
@click.pass_context
def status(
    ctx: click.Context, as_json: bool, output: str, watch: bool, interval: float, watch_count: int | None
) -> None:
    """Show the servers of the cluster and who leads it, as the answering server sees it.

    Each server's role (controller = metadata leader, voter = member of the
    metadata Raft group), whether the controller considers it alive, and the
    partitions it holds and leads. It works while no controller is known,
    which it reports. Liftbridge servers do not offer this.

    With --watch it also lists every partition (leader, ISR, high watermark,
    newest offset, lag = messages written but not yet committed, state) and
    refreshes every --interval seconds until Ctrl-C; a server that stops
    answering shows as an error line until one answers again.

    \b
      liftlog cluster status -a 127.0.0.1:9292
      liftlog cluster status --watch --interval 1
      liftlog cluster status --json | jq '.servers[] | select(.alive | not) | .id'
    """
    as_json = as_json or output.lower() == "json"
    options = WatchOptions(watch, interval, watch_count)
    check_watch_options(ctx, options)
    if watch:
        if as_json:
            raise click.UsageError("--json and --watch exclude each other")
        _watch_status(options)
        return

    async def go() -> ClusterStatus:
        # No `async with connect()`: its FetchMetadata is not needed, and this must answer
        # even when the rest of the API cannot.
        client = connect()
        try:
            return await client.cluster_status()
        finally:
            await client.close()

    result = run(go())
    if as_json:
        click.echo(status_json(result))
        return
    console = table_console()
    console.print(status_summary(result), soft_wrap=True)
    console.print(status_table(result))
    for note in status_notes(result):
        console.print(note)


def _watch_status(options: WatchOptions) -> None:
    client: Client | None = None

    async def fetch() -> RenderableType:
        nonlocal client
        if client is None:
            # One client for the whole watch: its channels reconnect once a server answers again. Short
            # deadlines and one retry: a refresh that cannot get through says so instead of hanging.
            client = connect(timeout=max(2.0, options.interval), retries=1)
        result = await client.cluster_status()
        return watch_view(result, await _partition_rows(client, result))

    async def close() -> None:
        if client is not None:
            await client.close()

    run_watch("liftlog cluster status", fetch, options, close)


def _replicas(value: str) -> list[str]:
    replicas = [r.strip() for r in value.split(",") if r.strip()]
    if not replicas:
        raise click.BadParameter("name at least one server, e.g. --replicas b,c")
    return replicas


def reassignments_table(moving: Sequence[Reassignment]) -> Table:
    """One row per partition on the move: where to, its leader, and each replica's copy so far."""
    table = Table(title="Reassignments", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for heading in ("STREAM", "PART.", "REPLICAS", "TARGET", "LEADER", "COPIED"):
        table.add_column(heading, overflow="fold")
    for r in moving:
        if r.progress:
            total = r.messages_to_copy
            copied = Text()
            for replica in r.target:
                done = r.copied(replica)
                style = "green" if r.in_sync(replica) else "yellow"
                copied.append(f"{replica} {done}/{total} ", style=style)
        else:
            copied = Text("leader did not answer", style="dim")
        table.add_row(
            Text(r.stream),
            str(r.partition),
            Text(",".join(r.replicas)),
            Text(",".join(r.target)),
            Text(r.leader),
            copied,
        )
    return table


async def _follow(client: Client, leaving: str | None, interval: float = 0.5) -> None:
    """Show each new replica's copy as a progress bar until every reassignment (and the departure) is done."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = out_console()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        tasks: dict[tuple[str, int, str], TaskID] = {}
        departure = progress.add_task(f"server {leaving} leaving", total=None) if leaving else None
        while True:
            state = await client.reassignments()
            for r in state.moving:
                for replica in r.target:
                    key = (r.stream, r.partition, replica)
                    if key not in tasks:
                        tasks[key] = progress.add_task(
                            f"{r.stream}/{r.partition} → {replica}", total=r.messages_to_copy
                        )
                    done = r.messages_to_copy if r.in_sync(replica) else r.copied(replica)
                    progress.update(tasks[key], total=max(r.messages_to_copy, 1), completed=done)
            moving = {(r.stream, r.partition) for r in state.moving}
            for (stream, partition, _), task in tasks.items():
                if (stream, partition) not in moving:
                    total = progress.tasks[task].total or 1
                    progress.update(task, total=total, completed=total)
            gone = True
            if leaving is not None:
                status = await client.cluster_status()
                gone = status.server(leaving) is None
                if gone and departure is not None:
                    progress.update(departure, total=1, completed=1, description=f"server {leaving} left the cluster")
            if not moving and gone:
                return
            await asyncio.sleep(interval)


@cluster.command()
@addr_option
@click.argument("stream", required=False)
@click.argument("partition", type=int, required=False)
@click.option(
    "--replicas", help="The partition's new replicas, comma-separated; the first becomes its preferred leader."
)
@click.option("--spread", is_flag=True, help="Even out replica counts over the live servers (after adding servers).")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Show the copy's progress until it is done.")
def reassign(stream: str | None, partition: int | None, replicas: str | None, spread: bool, wait: bool) -> None:
    """Move a partition to other servers, or spread partitions over the live servers.

    The new replicas copy the partition's log from its leader and join its
    in-sync set; then leadership moves to a new replica (if the old leader is
    not one) and the old replicas are dropped, so every acknowledged message
    stays on as many in-sync replicas as before. Set
    clustering.reassignment.max.rate on the servers to cap the copy's
    bandwidth.

    \b
      liftlog cluster reassign orders 0 --replicas b,c
      liftlog cluster reassign --spread
    """
    if stream is None and not spread:
        raise click.UsageError("name STREAM PARTITION and --replicas, or use --spread")
    moves: dict[tuple[str, int], list[str]] = {}
    if stream is not None:
        if partition is None or replicas is None:
            raise click.UsageError("moving a partition needs STREAM, PARTITION and --replicas")
        moves[(stream, partition)] = _replicas(replicas)

    async def go() -> None:
        client = connect()
        try:
            started = await client.reassign(moves, spread=spread)
            console = out_console()
            if not started:
                console.print("nothing to move: the replicas are already spread evenly")
                return
            console.print(reassignments_table(started))
            if wait:
                await _follow(client, None)
                console.print("done")
        finally:
            await client.close()

    run(go())


@cluster.command()
@addr_option
@click.argument("server")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Show the progress until the server has left.")
def decommission(server: str, wait: bool) -> None:
    """Move every replica off SERVER, then remove it from the cluster.

    Refused, saying why, when it would leave the metadata group without a
    live quorum, lose the last in-sync replica of a partition, or leave a
    partition with nowhere to go. Once the server has left, stop its process.

    \b
      liftlog cluster decommission s3
    """

    async def go() -> None:
        client = connect()
        try:
            status = await client.cluster_status()  # before: the server leaving may be the one asked
            started = await client.decommission(server)
            console = out_console()
            if started:
                console.print(reassignments_table(started))
            if wait:
                # Follow through the other servers, the controller first: the one leaving stops hearing of the
                # cluster once it has left, and would report its departure as pending for ever.
                others = sorted(
                    (s for s in status.servers if s.id != server), key=lambda s: (not s.controller, not s.alive)
                )
                if not others:
                    raise click.ClickException(f"server {server} is the only server: it cannot leave")
                watcher = connect_to([s.address for s in others])
                try:
                    await _follow(watcher, server)
                finally:
                    await watcher.close()
                console.print(f"server {server} has left the cluster; stop its process")
        finally:
            await client.close()

    run(go())


@cluster.command()
@addr_option
@click.option("--servers", type=click.IntRange(min=1), default=1, show_default=True, help="Live servers to wait for.")
@click.option("--timeout", type=DURATION, default="60s", show_default=True, help="Give up after this long.")
def wait(servers: int, timeout: int) -> None:
    """Wait until the cluster answers with a controller and SERVERS live servers (for scripts).

    Servers just started take a moment to find each other and elect a
    controller; a command sent before then is refused. Exit status 1 (saying
    what was missing) if that does not happen within --timeout.

    \b
      liftlog server --id a ... &
      liftlog cluster wait --servers 3 && liftlog stream create orders ...
    """

    from liftlog.client import LiftlogError

    async def go() -> str:
        client = connect(timeout=2.0, retries=0)
        deadline = asyncio.get_running_loop().time() + timeout / 1000
        seen = "no server answered"
        try:
            while True:
                try:
                    status = await client.cluster_status()
                    live = [s.id for s in status.servers if s.alive]
                    if status.controller and len(live) >= servers:
                        return f"controller {status.controller}, {len(live)} live servers: {', '.join(sorted(live))}"
                    seen = f"controller {status.controller or 'unknown'}, {len(live)} live servers of {servers} wanted"
                except LiftlogError as exc:
                    seen = str(exc)  # not up yet, or refusing until it has found the others
                if asyncio.get_running_loop().time() > deadline:
                    raise click.ClickException(f"the cluster was not ready within {timeout / 1000:g} s: {seen}")
                await asyncio.sleep(0.2)
        finally:
            await client.close()

    print_note(run(go()))


@cluster.command()
@addr_option
def rebalance() -> None:
    """Give leadership back to each partition's preferred replica where it is alive and in sync.

    The controller also does this on its own after clustering.leader.rebalance.delay.
    """

    async def go() -> int:
        client = connect()
        try:
            return await client.elect_preferred_leaders()
        finally:
            await client.close()

    changed = run(go())
    out_console().print(f"{changed} leadership{'s' if changed != 1 else ''} handed back to preferred replicas")


@cluster.command()
@addr_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def reassignments(as_json: bool) -> None:
    """Show the reassignments under way and how far each new replica has copied."""

    async def go() -> Reassignments:
        client = connect()
        try:
            return await client.reassignments()
        finally:
            await client.close()

    state = run(go())
    if as_json:
        click.echo(json.dumps(dataclasses.asdict(state), ensure_ascii=False))
        return
    console = out_console()
    if not state.moving:
        console.print("no reassignment under way")
    else:
        console.print(reassignments_table(state.moving))
    if state.leaving:
        console.print(Text(f"leaving: {', '.join(state.leaving)}", style="yellow"))
