"""``liftlog group``: consumer groups, their members, and who holds which partitions."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING

import click
from rich import box
from rich.table import Table
from rich.text import Text

from liftlog.cli.common import addr_option, connect, fail, output_option, run
from liftlog.cli.output import out_console, table_console

if TYPE_CHECKING:
    from liftlog.client import GroupInfo

__all__ = ["group"]


@click.group()
@addr_option
def group() -> None:
    """Consumer groups: members share the partitions of their streams, one member per partition.

    \b
      liftlog group list
      liftlog group describe billing
      liftlog subscribe orders --group billing      # join as a member
    """


@group.command(name="list")
@addr_option
@click.option("--json", "as_json", is_flag=True, help="One JSON object per group (as --output json).")
@output_option
def list_(as_json: bool, output: str) -> None:
    """Every consumer group: coordinator, epoch, members."""
    as_json = as_json or output.lower() == "json"

    async def go() -> list[GroupInfo]:
        async with connect() as client:
            return await client.groups()

    groups = run(go())
    if as_json:
        for g in groups:
            click.echo(json.dumps(asdict(g)))
        return
    table = Table("GROUP", "COORDINATOR", "EPOCH", "MEMBERS", box=box.SIMPLE_HEAD)
    for column in (table.columns[0], table.columns[3]):
        column.overflow = "fold"  # wrap long names, never cut them short
    for g in groups:
        table.add_row(Text(g.id), g.coordinator, str(g.epoch), Text(", ".join(m.consumer_id for m in g.members)))
    table_console().print(table if groups else "no consumer groups")


@group.command()
@addr_option
@click.argument("group_id")
def describe(group_id: str) -> None:
    """GROUP_ID's members, their streams and the partitions each holds now."""

    async def go() -> list[GroupInfo]:
        async with connect() as client:
            return await client.groups(group_id)

    found = run(go())
    if not found:
        fail(f"consumer group does not exist: {group_id!r}")
    g = found[0]
    console = out_console()
    console.print(f"group {g.id}  coordinator {g.coordinator}  epoch {g.epoch}")
    table = Table("MEMBER", "STREAMS", "PARTITIONS HELD", box=box.SIMPLE_HEAD)
    for m in g.members:
        held = "; ".join(f"{s}: {','.join(map(str, ps))}" for s, ps in m.assignments.items()) or "—"
        table.add_row(m.consumer_id, ", ".join(m.streams), held)
    console.print(table)
