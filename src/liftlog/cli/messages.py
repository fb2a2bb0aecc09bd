"""``liftlog publish`` and ``liftlog subscribe``."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from liftlog.cli.common import addr_option, connect, run
from liftlog.cli.output import (
    MessageLike,
    err_console,
    format_message_json,
    format_message_text,
    format_rate,
    print_note,
)
from liftlog.cli.params import HEADER, START, STOP, StartSpec, StopSpec

if TYPE_CHECKING:
    from liftlog.client import AckPolicy, Client

__all__ = ["ACK_POLICIES", "ack_policy_option", "publish", "read_lines", "subscribe", "to_ack_policy"]

F = TypeVar("F", bound=Callable[..., Any])

ACK_POLICIES = ("leader", "all", "none")
_READ_CHUNK = 1 << 16
#: Stdin lines per PublishAsync call.
_STDIN_BATCH = 100_000


def to_ack_policy(name: str) -> AckPolicy:
    """The client's AckPolicy for ``leader``, ``all`` or ``none``."""
    from liftlog.client import AckPolicy

    return {"leader": AckPolicy.LEADER, "all": AckPolicy.ALL, "none": AckPolicy.NONE}[name.lower()]


def ack_policy_option(help: str) -> Callable[[F], F]:
    """``--ack-policy``, one of :data:`ACK_POLICIES` (default leader), for :func:`to_ack_policy`."""
    return click.option(
        "--ack-policy",
        type=click.Choice(ACK_POLICIES, case_sensitive=False),
        default="leader",
        show_default=True,
        help=help,
    )


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():  # the fd may be reported readable again before the reader is removed
        future.set_result(None)


async def _read_chunks(fd: int) -> AsyncIterator[bytes]:
    """What ``fd`` holds, chunk by chunk, as it arrives.

    Pipes and terminals are polled by the event loop, then read once: ``os.read``
    returns whatever is there rather than waiting for a full buffer, so lines
    typed or piped in slowly go out at once. Not a thread: at Ctrl-C the loop
    would wait for a thread stuck reading a terminal. Regular files and
    /dev/null cannot be polled, and never block: they are read directly.
    """
    loop = asyncio.get_running_loop()
    while True:
        ready: asyncio.Future[None] = loop.create_future()
        try:
            loop.add_reader(fd, _set_once, ready)
        except (OSError, ValueError, NotImplementedError):
            ready.set_result(None)  # not pollable: a regular file, /dev/null (or a loop without add_reader)
        else:
            try:
                await ready
            finally:
                loop.remove_reader(fd)
        chunk = os.read(fd, _READ_CHUNK)
        if not chunk:
            return
        yield chunk


async def read_lines(fd: int, max_lines: int) -> AsyncIterator[list[bytes]]:
    """Lists of at most ``max_lines`` lines from ``fd`` (without their ``\\n`` / ``\\r\\n``), as they arrive."""
    pending = b""
    async for chunk in _read_chunks(fd):
        *lines, pending = (pending + chunk).split(b"\n")
        for start in range(0, len(lines), max_lines):
            yield [line.removesuffix(b"\r") for line in lines[start : start + max_lines]]
    if pending:  # a last line without a newline
        yield [pending.removesuffix(b"\r")]


@click.command()
@addr_option
@click.argument("stream")
@click.argument("values", nargs=-1)
@click.option("-k", "--key", help="Message key (UTF-8).")
@click.option("-H", "--header", "headers", type=HEADER, multiple=True, help="Header NAME=VALUE (repeatable).")
@click.option("-p", "--partition", type=click.IntRange(min=0), help="Partition to publish to.")
@ack_policy_option("Wait for the leader, for every in-sync replica, or for nothing.")
@click.option(
    "--expected-offset",
    type=int,
    help="Optimistic concurrency control: the offset the message must get (one VALUE only).",
)
@click.option("--subject", "to_subject", is_flag=True, help="STREAM is a NATS subject: publish to it directly.")
@click.option(
    "--window",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Messages in flight when publishing stdin lines.",
)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), help="Seconds to wait for each ack.")
def publish(
    stream: str,
    values: tuple[str, ...],
    key: str | None,
    headers: tuple[tuple[str, bytes], ...],
    partition: int | None,
    ack_policy: str,
    expected_offset: int | None,
    to_subject: bool,
    window: int,
    timeout: float | None,
) -> None:
    """Publish VALUES to STREAM, or each line of stdin when no VALUE is given.

    With VALUEs, prints the offset of each message as it is acknowledged.
    Stdin lines are sent pipelined, --window at a time, to --partition
    (default 0) and a summary is printed on stderr.

    \b
      liftlog publish orders '{"id": 1}' '{"id": 2}'
      liftlog publish orders -k customer-7 -H source=web hello
      seq 100000 | liftlog publish orders --ack-policy all
      liftlog publish --subject orders.eu hello
    """
    if expected_offset is not None and (len(values) != 1 or to_subject):
        raise click.UsageError("--expected-offset needs exactly one VALUE and a stream")
    options: dict[str, Any] = {
        "key": key.encode() if key is not None else None,
        "headers": dict(headers) or None,
        "ack_policy": to_ack_policy(ack_policy),
        "timeout": timeout,
    }
    if values:
        run(_publish_values(stream, [v.encode() for v in values], to_subject, partition, expected_offset, options))
    else:
        if sys.stdin.isatty():
            print_note("reading messages from stdin, one per line (Ctrl-D to end)")
        run(_publish_stdin(stream, to_subject, partition, window, options))


async def _send(
    client: Client, target: str, value: bytes, to_subject: bool, partition: int | None, options: Mapping[str, Any]
) -> int | None:
    """Publish one message; its offset, or None without an ack."""
    if to_subject:
        ack = await client.publish_to_subject(target, value, **options)
    else:
        ack = await client.publish(target, value, partition=partition, **options)
    return None if ack is None else ack.offset


async def _publish_values(
    target: str,
    values: list[bytes],
    to_subject: bool,
    partition: int | None,
    expected_offset: int | None,
    options: Mapping[str, Any],
) -> None:
    if expected_offset is not None:
        options = {**options, "expected_offset": expected_offset}
    async with connect() as client:
        for value in values:
            offset = await _send(client, target, value, to_subject, partition, options)
            if offset is not None:
                click.echo(offset)


async def _publish_stdin(
    target: str, to_subject: bool, partition: int | None, window: int, options: Mapping[str, Any]
) -> None:
    console = err_console()
    lines = _flatten(read_lines(sys.stdin.fileno(), _STDIN_BATCH))
    sent = 0
    offsets: list[int] = []
    started = time.perf_counter()
    with Progress(
        SpinnerColumn(),
        TextColumn("sent {task.completed:,.0f} messages"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,  # off a terminal it would only leave a blank line behind
    ) as progress:
        task = progress.add_task("publish")
        async with connect() as client:
            if to_subject:  # PublishToSubject has no streaming form: one RPC per line
                async for line in lines:
                    offset = await _send(client, target, line, True, None, options)
                    if offset is not None:
                        offsets.append(offset)
                    sent += 1
                    progress.update(task, completed=sent)
            else:
                # One PublishAsync call per _STDIN_BATCH lines keeps the window full across reads, and bounds
                # the acks held in memory.
                exhausted = False
                while not exhausted:

                    async def batch() -> AsyncIterator[bytes]:
                        nonlocal sent, exhausted
                        for _ in range(_STDIN_BATCH):
                            try:
                                line = await anext(lines)
                            except StopAsyncIteration:
                                exhausted = True
                                return
                            sent += 1
                            if sent % 256 == 0:
                                progress.update(task, completed=sent)
                            yield line

                    acks = await client.publish_many(
                        target, batch(), partition=partition or 0, window=window, **options
                    )
                    offsets.extend(ack.offset for ack in acks)
    elapsed = time.perf_counter() - started
    where = f"subject {target}" if to_subject else f"{target}/{partition or 0}"
    span = f", offsets {min(offsets)}-{max(offsets)}" if offsets else ""
    rate = f" ({format_rate(sent / elapsed)} msgs/s)" if sent and elapsed > 0 else ""
    print_note(f"published {sent} messages to {where} in {elapsed:.2f} s{rate}{span}")


async def _flatten(batches: AsyncIterator[list[bytes]]) -> AsyncIterator[bytes]:
    async for batch in batches:
        for line in batch:
            yield line


# -- subscribe -----------------------------------------------------------------


@click.command()
@addr_option
@click.argument("stream")
@click.option(
    "-p",
    "--partition",
    type=click.IntRange(min=0),
    default=None,
    help="Read only this partition.  [default: every partition, merged by time]",
)
@click.option(
    "--from",
    "start",
    type=START,
    default="earliest",
    show_default=True,
    help="Start at earliest, latest, new (only messages published from now on), offset:N or time:T.",
)
@click.option(
    "--until",
    "stop",
    type=STOP,
    help="Stop after latest (the newest message when subscribing), offset:N or time:T.  [default: latest]",
)
@click.option("-f", "--follow/--no-follow", default=False, help="Keep waiting for new messages until Ctrl-C.")
@click.option("-n", "--count", type=click.IntRange(min=1), help="Stop after this many messages.")
@click.option("--resume", is_flag=True, help="Resume the partition if it is paused (else that is an error).")
@click.option(
    "-g",
    "--group",
    metavar="GROUP",
    help="Read as a member of consumer GROUP: its share of STREAM's partitions, from the group's checkpoint, "
    "checkpointing as it goes, until Ctrl-C (or --count).",
)
@click.option(
    "-o",
    "--output",
    type=click.Choice(["text", "json"], case_sensitive=False),
    default="text",
    show_default=True,
    help="text: `offset  key  value`; json: one object per line (offset, key, value, timestamp, subject, headers).",
)
def subscribe(
    stream: str,
    partition: int | None,
    start: StartSpec,
    stop: StopSpec | None,
    follow: bool,
    count: int | None,
    resume: bool,
    group: str | None,
    output: str,
) -> None:
    """Print messages of STREAM (or, with --group, of the partitions a group member holds).

    Reads every partition, merged in the order the server received the
    messages (each partition's in its own order), or only -p's. Lines are
    `offset  key  value`, `partition:offset  key  value` when the stream has
    more than one partition. By default reads from the earliest message to
    the newest one and exits;
    --follow keeps printing new messages until Ctrl-C. Times T are ISO 8601
    (2024-05-01T12:00:00Z; local time without an offset), a Unix time with
    its unit (time:1700000000s, ms, us or ns), or -DURATION for that long
    ago (time:-15m).

    JSON values (and keys and header values) that are not UTF-8 come as
    value_b64 (key_b64, headers_b64), base64-encoded, instead.

    \b
      liftlog subscribe orders
      liftlog subscribe orders --from time:-1h --output json
      liftlog subscribe orders -p 2 --from new --follow  # one partition
      liftlog subscribe orders --group billing          # run it twice: the partitions are shared
    """
    formatter = format_message_json if output.lower() == "json" else format_message_text
    if group is not None:
        if stop is not None or resume:
            raise click.UsageError("--group reads until Ctrl-C (or --count): not with --until or --resume")
        run(_consume(group, stream, start, count, formatter))
        return
    if follow and stop is not None:
        raise click.UsageError("--follow and --until exclude each other")
    stop = StopSpec("STOP_ON_CANCEL") if follow else stop or StopSpec("STOP_LATEST")
    run(_subscribe(stream, partition, start, stop, count, resume, formatter, flush_each=follow))


async def _consume(
    group: str, stream: str, start: StartSpec, count: int | None, formatter: Callable[[MessageLike], str]
) -> None:
    from liftlog.client import StartPosition

    position = StartPosition.NEW_ONLY if start.position == "NEW_ONLY" else StartPosition.EARLIEST
    received = 0
    async with connect() as client, client.consumer(group, [stream], start_position=position) as consumer:
        print_note(f"consumer {consumer.consumer_id} of group {group} (coordinator {consumer.coordinator})")
        async for msg in consumer:
            sys.stdout.write(formatter(msg) + "\n")
            sys.stdout.flush()
            received += 1
            if count is not None and received >= count:
                break


async def _subscribe(
    stream: str,
    partition: int | None,
    start: StartSpec,
    stop: StopSpec,
    count: int | None,
    resume: bool,
    formatter: Callable[[MessageLike], str],
    flush_each: bool,
) -> None:
    from liftlog.client import MergedSubscription, StartPosition, StopPosition, Subscription

    out = sys.stdout
    received = 0
    async with connect() as client:
        sub: Subscription | MergedSubscription
        options: dict[str, Any] = {
            "start_position": getattr(StartPosition, start.position),
            "start_offset": start.offset,
            "start_timestamp": start.timestamp_ns,
            "stop_position": getattr(StopPosition, stop.position),
            "stop_offset": stop.offset,
            "stop_timestamp": stop.timestamp_ns,
            "resume": resume,
        }
        if partition is not None:
            sub = client.subscribe(stream, partition=partition, **options)
        else:
            sub = client.subscribe_all(stream, **options)
        async with sub:
            # Several partitions in text: each line says which (JSON always does).
            several = isinstance(sub, MergedSubscription) and len(sub.partitions) > 1
            prefix = several and formatter is format_message_text
            async for msg in sub:
                out.write((f"{msg.partition}:" if prefix else "") + formatter(msg) + "\n")
                if flush_each:  # someone is watching (or piping to grep): show each message now
                    out.flush()
                received += 1
                if count is not None and received >= count:
                    break
    out.flush()
