"""``liftlog stream``: create, delete, list, describe, pause, resume and set streams read-only."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from liftlog.cli.common import CommandError, addr_option, connect, output_option, run
from liftlog.cli.output import format_time_ns, local_utc_offset, out_console, print_note, table_console
from liftlog.cli.params import DURATION, SIZE
from liftlog.cli.watch import WatchOptions, check_watch_options, run_watch, watch_options

if TYPE_CHECKING:
    from liftlog.client import Client, PartitionInfo, StreamInfo
    from liftlog.jsontypes import JSONObject

__all__ = ["stream"]

_partitions_option = click.option(
    "-p",
    "--partition",
    "partitions",
    type=click.IntRange(min=0),
    multiple=True,
    help="Partition to act on (repeatable; default: every partition).",
)


def _say(message: str) -> None:
    out_console().print(Text(message), soft_wrap=True)


def _which(partitions: Sequence[int]) -> str:
    if not partitions:
        return "all partitions"
    noun = "partition" if len(partitions) == 1 else "partitions"
    return f"{noun} {', '.join(map(str, partitions))}"


@click.group()
@addr_option
def stream() -> None:
    """Manage streams: create, delete, list, describe, pause, resume, readonly."""


# -- create / delete -----------------------------------------------------------


@stream.command()
@addr_option
@click.argument("name")
@click.option("-s", "--subject", required=True, help="NATS subject the stream records (wildcards allowed).")
@click.option("--partitions", type=click.IntRange(min=1), default=1, show_default=True, help="Number of partitions.")
@click.option(
    "--replication-factor",
    type=click.IntRange(min=-1),
    default=1,
    show_default=True,
    help="Replicas per partition; -1 for every server.",
)
@click.option("--group", default="", help="Load-balance group: members share the subject's messages.")
@click.option("--retention-max-bytes", type=SIZE, help="Delete old segments past this size (1073741824, 512MiB).")
@click.option("--retention-max-messages", type=click.IntRange(min=0), help="Delete old segments past this many.")
@click.option("--retention-max-age", type=DURATION, help="Delete segments older than this (24h, 7d is 168h).")
@click.option("--segment-max-bytes", type=SIZE, help="Roll a segment past this size.")
@click.option("--segment-max-age", type=DURATION, help="Roll a segment this old.")
@click.option("--compact/--no-compact", default=None, help="Keep only the newest message per key.")
@click.option("--auto-pause-time", type=DURATION, help="Pause partitions idle this long.")
@click.option("--occ", is_flag=True, default=None, help="Enable optimistic concurrency control (expected offsets).")
@click.option(
    "--encryption/--no-encryption",
    default=None,
    help="Encrypt stored messages (servers need a master key; default: their streams.encryption).",
)
@click.option("--exist-ok", is_flag=True, help="Succeed if the stream already exists.")
def create(
    name: str,
    subject: str,
    partitions: int,
    replication_factor: int,
    group: str,
    retention_max_bytes: int | None,
    retention_max_messages: int | None,
    retention_max_age: int | None,
    segment_max_bytes: int | None,
    segment_max_age: int | None,
    compact: bool | None,
    auto_pause_time: int | None,
    occ: bool | None,
    encryption: bool | None,
    exist_ok: bool,
) -> None:
    """Create stream NAME on a NATS subject.

    Settings not given use the server's defaults (its streams.* config keys).
    Sizes take units (512MiB, 1GB); durations are Go-style (90s, 1h30m, 168h).

    \b
      liftlog stream create orders --subject 'orders.*' --partitions 3 --retention-max-age 24h
    """

    async def go() -> None:
        async with connect() as client:
            await client.create_stream(
                subject,
                name,
                group=group,
                replication_factor=replication_factor,
                partitions=partitions,
                retention_max_bytes=retention_max_bytes,
                retention_max_messages=retention_max_messages,
                retention_max_age_ms=retention_max_age,
                segment_max_bytes=segment_max_bytes,
                segment_max_age_ms=segment_max_age,
                compact_enabled=compact,
                auto_pause_time_ms=auto_pause_time,
                optimistic_concurrency_control=occ,
                encryption=encryption,
                exist_ok=exist_ok,
            )

    run(go())
    noun = "partition" if partitions == 1 else "partitions"
    _say(f"stream {name} on subject {subject} ({partitions} {noun}) {'is ready' if exist_ok else 'created'}")


@stream.command()
@addr_option
@click.argument("name")
def delete(name: str) -> None:
    """Delete stream NAME and all its data."""

    async def go() -> None:
        async with connect() as client:
            await client.delete_stream(name)

    run(go())
    _say(f"stream {name} deleted")


# -- list / describe -----------------------------------------------------------


async def _partition(client: Client, name: str, info: PartitionInfo) -> PartitionInfo:
    """Fresh partition state from its leader; what the metadata said if the leader cannot answer."""
    from liftlog.client import LiftlogError

    try:
        return await client.fetch_partition_metadata(name, info.id)
    except LiftlogError:
        # Liftbridge's FetchMetadata does not always carry the HW and newest offset, the leader
        # does; a leaderless partition still gets a row.
        return info


async def _describe(client: Client, names: Sequence[str]) -> list[tuple[StreamInfo, list[PartitionInfo]]]:
    metadata = await client.fetch_metadata(*names)
    if metadata.unknown_streams:
        raise CommandError(f"no such stream: {', '.join(metadata.unknown_streams)}")
    result = []
    for name in sorted(metadata.streams):
        info = metadata.streams[name]
        partitions = [info.partitions[p] for p in sorted(info.partitions)]
        fresh = await asyncio.gather(*(_partition(client, name, p) for p in partitions))
        result.append((info, list(fresh)))
    return result


def _state(partition: PartitionInfo) -> str:
    flags = [flag for flag, on in (("paused", partition.paused), ("readonly", partition.readonly)) if on]
    return ", ".join(flags) or "active"


def _lines(values: Sequence[object]) -> Text:
    # Text, not str: rich would read brackets in stream names or subjects as markup.
    return Text("\n".join(str(v) for v in values))


@stream.command("list")
@addr_option
@output_option
def list_streams(output: str) -> None:
    """List every stream with one line per partition: leader, ISR, high watermark, newest offset, state.

    \b
      liftlog stream list
      liftlog stream list -o json | jq -r '.[].name'
    """

    async def go() -> list[tuple[StreamInfo, list[PartitionInfo]]]:
        async with connect() as client:
            return await _describe(client, ())

    streams = run(go())
    if output.lower() == "json":
        click.echo(json.dumps([_stream_json(info, parts) for info, parts in streams], ensure_ascii=False))
        return
    if not streams:
        print_note("no streams")
        return
    table = Table("Stream", "Subject", "Part.", "Leader", "ISR", "HW", "Newest", "State")
    for column in table.columns[:2]:
        column.overflow = "fold"  # a name too long for the terminal wraps; it is never cut short
    for info, parts in streams:
        table.add_row(
            Text(info.name),
            Text(info.subject),
            _lines([p.id for p in parts]),
            _lines([p.leader or "-" for p in parts]),
            _lines([",".join(p.isr) for p in parts]),
            _lines([p.high_watermark for p in parts]),
            _lines([p.newest_offset for p in parts]),
            _lines([_state(p) for p in parts]),
            end_section=True,
        )
    table_console().print(table)


def _stream_json(info: StreamInfo, parts: Sequence[PartitionInfo]) -> JSONObject:
    return {
        "name": info.name,
        "subject": info.subject,
        "creation_timestamp": info.creation_timestamp,
        "partitions": [dataclasses.asdict(p) for p in parts],
    }


def describe_view(info: StreamInfo, parts: Sequence[PartitionInfo]) -> list[RenderableType]:
    """The stream's name, subject and creation time, a row per partition, and a row per event that happened."""
    heading = Text.assemble(
        ("stream ", "bold"), info.name, ("  subject ", "bold"), info.subject, ("  created ", "bold")
    )
    heading.append(format_time_ns(info.creation_timestamp))
    table = Table("Part.", title="Partitions")
    for column in ("Leader", "Replicas", "ISR"):  # server ids are long; show them whole
        table.add_column(column, overflow="fold")
    for column in ("HW", "Newest", "State"):
        table.add_column(column)
    for p in parts:
        table.add_row(
            str(p.id),
            Text(p.leader or "-"),
            Text(",".join(p.replicas)),
            Text(",".join(p.isr)),
            str(p.high_watermark),
            str(p.newest_offset),
            _state(p),
        )
    view: list[RenderableType] = [heading, table]
    # Events get a table of their own, a row per event that happened: ISO times do not fit in 80
    # columns next to the offsets.
    events = Table("Part.", "Event", "First", "Latest", title=f"Events (local time, {local_utc_offset()})")
    for p in parts:
        for label, event in (
            ("message received", p.messages_received),
            ("paused", p.pause_timestamps),
            ("made read-only", p.readonly_timestamps),
        ):
            if event is not None and (event.first or event.latest):
                first, latest = (format_time_ns(t, offset=False) for t in (event.first, event.latest))
                events.add_row(str(p.id), label, first, latest)
    if events.row_count:
        view.append(events)
    return view


@stream.command()
@addr_option
@click.argument("name")
@watch_options
@click.pass_context
def describe(ctx: click.Context, name: str, watch: bool, interval: float, watch_count: int | None) -> None:
    """Show stream NAME's partitions: replicas, offsets, state and when events last happened.

    Offsets are -1 on an empty partition. Times are local. With --watch the
    view refreshes every --interval seconds until Ctrl-C.

    \b
      liftlog stream describe orders
      liftlog stream describe orders --watch --interval 1
    """
    options = WatchOptions(watch, interval, watch_count)
    check_watch_options(ctx, options)
    if watch:
        _watch_describe(name, options)
        return

    async def go() -> tuple[StreamInfo, list[PartitionInfo]]:
        async with connect() as client:
            return (await _describe(client, (name,)))[0]

    heading, *tables = describe_view(*run(go()))
    console = out_console()
    console.print(heading, soft_wrap=True)  # one line, however narrow the terminal
    for table in tables:
        console.print(table)


def _watch_describe(name: str, options: WatchOptions) -> None:
    client: Client | None = None

    async def fetch() -> RenderableType:
        nonlocal client
        if client is None:
            # One client for the whole watch (no connect(): a server that does not answer yet is an
            # error line to retry, not the end); short deadlines so a refresh does not hang.
            client = connect(timeout=max(2.0, options.interval), retries=1)
        return Group(*describe_view(*(await _describe(client, (name,)))[0]))

    async def close() -> None:
        if client is not None:
            await client.close()

    run_watch(f"liftlog stream describe {name}", fetch, options, close)


# -- pause / resume / readonly -------------------------------------------------


@stream.command()
@addr_option
@click.argument("name")
@_partitions_option
@click.option("--resume-all", is_flag=True, help="When any paused partition resumes, resume them all.")
def pause(name: str, partitions: tuple[int, ...], resume_all: bool) -> None:
    """Pause partitions of stream NAME: they stop recording until resumed.

    A paused partition resumes when it is published to, or with `liftlog stream resume`.
    """

    async def go() -> None:
        async with connect() as client:
            await client.pause_stream(name, partitions, resume_all=resume_all)

    run(go())
    _say(f"stream {name}: {_which(partitions)} paused")


@stream.command()
@addr_option
@click.argument("name")
@_partitions_option
def resume(name: str, partitions: tuple[int, ...]) -> None:
    """Resume paused partitions of stream NAME.

    Liftbridge has no resume call: a partition resumes when published to or
    subscribed to with resume set. This subscribes to each partition with
    resume set (new messages only) and leaves once the server confirms.
    """

    async def go() -> list[int]:
        from liftlog.client import StartPosition

        async with connect() as client:
            chosen = list(partitions)
            if not chosen:
                metadata = await client.fetch_metadata(name)
                if name not in metadata.streams:
                    raise CommandError(f"no such stream: {name}")
                chosen = sorted(metadata.streams[name].partitions)
            for partition in chosen:
                sub = client.subscribe(name, partition=partition, start_position=StartPosition.NEW_ONLY, resume=True)
                async with sub:
                    await sub.started()
            return chosen

    resumed = run(go())
    _say(f"stream {name}: {_which(resumed)} resumed")


@stream.command()
@addr_option
@click.argument("name")
@_partitions_option
@click.option("--off", is_flag=True, help="Make the partitions writable again.")
def readonly(name: str, partitions: tuple[int, ...], off: bool) -> None:
    """Make partitions of stream NAME read-only (or writable again with --off).

    Publishes to a read-only partition fail; subscribers read to its end.
    """

    async def go() -> None:
        async with connect() as client:
            await client.set_stream_readonly(name, partitions, readonly=not off)

    run(go())
    _say(f"stream {name}: {_which(partitions)} {'writable' if off else 'read-only'}")
