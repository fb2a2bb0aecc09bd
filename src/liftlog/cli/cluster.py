"""``liftlog cluster``: the cluster as a server sees it (liftlog's own ``liftlog.Cluster`` API)."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

import click
from rich import box
from rich.table import Table
from rich.text import Text

from liftlog.cli.common import addr_option, connect, run
from liftlog.cli.output import out_console

if TYPE_CHECKING:
    from liftlog.client import ClusterStatus, ServerStatus

__all__ = ["cluster", "status_json", "status_summary", "status_table"]

_NONE = "—"


@click.group()
@addr_option
def cluster() -> None:
    """Inspect the cluster (liftlog servers only; Liftbridge has no such API)."""


def _sorted_servers(status: ClusterStatus) -> list[ServerStatus]:
    return sorted(status.servers, key=lambda s: s.id)


def _role(server: ServerStatus) -> str:
    if server.controller:
        return "controller"
    return "voter" if server.voter else _NONE


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


@cluster.command()
@addr_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the table.")
def status(as_json: bool) -> None:
    """Show the servers of the cluster and who leads it, as the answering server sees it.

    Each server's role (controller = metadata leader, voter = member of the
    metadata Raft group), whether the controller considers it alive, and the
    partitions it holds and leads. It works while no controller is known,
    which it reports. Liftbridge servers do not offer this.

    \b
      liftlog cluster status -a 127.0.0.1:9292
      liftlog cluster status --json | jq '.servers[] | select(.alive | not) | .id'
    """

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
    console = out_console()
    console.print(status_summary(result), soft_wrap=True)
    console.print(status_table(result))
    if result.attention:
        console.print(attention_table(result))
    if result.fenced:
        console.print(fenced_table(result))
    if result.segment_files_budget:
        limit = result.open_files_limit or "unlimited"
        console.print(
            Text(
                f"{result.server_id}: open-file limit {limit}; sealed segments hold {result.segment_files_open} "
                f"of {result.segment_files_budget} descriptors (streams.segment.files.max)",
                style="dim",
            )
        )
    if result.unreachable:
        console.print(
            Text(f"fenced replicas unknown for {', '.join(result.unreachable)} (did not answer)", style="yellow")
        )
