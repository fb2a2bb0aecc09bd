"""``liftlog cursor``: read and move cursors, the offsets consumers checkpoint in ``__cursors``."""

from __future__ import annotations

import click

from liftlog.cli.common import addr_option, connect, run
from liftlog.cli.output import out_console

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
    """


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
