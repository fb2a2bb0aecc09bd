"""``liftlog cursor``: read and move cursors, the offsets consumers checkpoint in ``__cursors``."""

from __future__ import annotations

import dataclasses
import json

import click
from rich import box
from rich.table import Table
from rich.text import Text

from liftlog.cli.common import addr_option, connect, fail, output_option, run
from liftlog.cli.output import out_console, print_note, table_console

__all__ = ["cursor"]


@click.group()
@addr_option
def cursor() -> None:
    """Cursors: named offsets consumers keep per stream partition, to resume where they stopped.

    Servers keep them in their __cursors stream when cursors.stream.partitions
    is more than 0 (`make run` sets it). A cursor holds the offset of the last
    message its consumer processed; -1 means none is stored.

    \b
      liftlog cursor set billing orders 41 --partition 0
      liftlog cursor get billing orders --partition 0
      liftlog cursor list orders
    """


@cursor.command(name="list")
@addr_option
@click.argument("stream", required=False)
@output_option
def list_(stream: str | None, output: str) -> None:
    """Every cursor stored (of STREAM only, if given): id, stream, partition, offset.

    Consumer groups' checkpoints are the cursors named __group:<group>.
    """
    from liftlog.client import CursorInfo, NoSuchStreamError

    async def go() -> list[CursorInfo]:
        async with connect() as client:
            try:
                return await client.cursors(stream)
            except NoSuchStreamError:
                fail("cursors are off on this cluster: set cursors.stream.partitions to more than 0 on the servers")

    found = run(go())
    if output.lower() == "json":
        click.echo(json.dumps([dataclasses.asdict(c) for c in found], ensure_ascii=False))
        return
    if not found:
        print_note("no cursors" + (f" of {stream}" if stream else ""))
        return
    table = Table("CURSOR", "STREAM", "PART.", "OFFSET", box=box.SIMPLE_HEAD)
    for column in table.columns[:2]:
        column.overflow = "fold"  # wrap long names, never cut them short
    for c in found:
        table.add_row(Text(c.cursor_id), Text(c.stream), str(c.partition), str(c.offset))
    table_console().print(table)


@cursor.command()
@addr_option
@click.argument("cursor_id")
@click.argument("stream")
@click.option("--partition", type=click.IntRange(min=0), default=0, show_default=True, help="Partition of STREAM.")
def get(cursor_id: str, stream: str, partition: int) -> None:
    """Print cursor CURSOR_ID of STREAM's partition (-1: none stored)."""

    async def go() -> int:
        async with connect() as client:
            return await client.fetch_cursor(cursor_id, stream, partition=partition)

    click.echo(run(go()))


@cursor.command(name="set")
@addr_option
@click.argument("cursor_id")
@click.argument("stream")
@click.argument("offset", type=click.IntRange(min=-1))
@click.option("--partition", type=click.IntRange(min=0), default=0, show_default=True, help="Partition of STREAM.")
def set_(cursor_id: str, stream: str, offset: int, partition: int) -> None:
    """Store OFFSET as cursor CURSOR_ID of STREAM's partition (durable on every in-sync replica)."""

    async def go() -> None:
        async with connect() as client:
            await client.set_cursor(cursor_id, stream, offset, partition=partition)

    run(go())
    out_console().print(f"cursor {cursor_id} of {stream}/{partition} is at {offset}")
