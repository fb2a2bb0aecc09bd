"""``--watch``: a command's view, fetched again every ``--interval`` seconds and redrawn in place.

On a terminal the view is a rich ``Live`` display; elsewhere (a pipe, a log,
the tests) each refresh is printed after the previous one, as ``Live`` would
otherwise print only the last. A refresh that fails (a server gone, a stream
deleted) keeps the last view, adds a red line saying why, and the next
refresh tries again. Ctrl-C ends the watch with exit code 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import click
from rich.console import Group, RenderableType
from rich.live import Live
from rich.text import Text

from liftlog.cli.common import CommandError, run
from liftlog.cli.output import out_console

__all__ = ["WatchOptions", "check_watch_options", "run_watch", "watch_frame", "watch_options"]

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_INTERVAL_S = 2.0


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """--watch, --interval and the hidden --count of a command."""

    watch: bool
    interval: float
    #: Refreshes before the watch ends by itself; None: until Ctrl-C.
    count: int | None


def watch_options(f: F) -> F:
    """Add ``--watch/-w``, ``--interval`` and the hidden ``--count`` (for scripts and tests) to a command."""
    f = click.option(
        "--count",
        "watch_count",
        type=click.IntRange(min=1),
        hidden=True,
        help="With --watch: refresh this many times, then exit (1 if the last refresh failed).",
    )(f)
    f = click.option(
        "--interval",
        type=click.FloatRange(min=0.1),
        default=DEFAULT_INTERVAL_S,
        show_default=True,
        metavar="SECONDS",
        help="Seconds between refreshes with --watch.",
    )(f)
    return click.option(
        "--watch", "-w", is_flag=True, help="Refresh the view in place every --interval seconds until Ctrl-C."
    )(f)


def check_watch_options(ctx: click.Context, options: WatchOptions) -> None:
    """--interval and --count mean something only with --watch."""
    if options.watch:
        return
    for name, flag in (("interval", "--interval"), ("watch_count", "--count")):
        if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE:
            raise click.UsageError(f"{flag} needs --watch")


def _clock(wall: float) -> str:
    return datetime.fromtimestamp(wall).strftime("%H:%M:%S")


def watch_frame(
    title: str,
    interval: float,
    body: RenderableType | None,
    error: str | None,
    updated: float | None,
    now: float,
    *,
    live: bool = False,
) -> Group:
    """The header (what, when, how often), a red line when the last refresh failed, and the last good view.

    `live`: the error line is cut to the width (a wrapping line would make the view jump as errors change);
    printed one after another, frames keep it whole.
    """
    header = Text.assemble((title, "bold"), f"  {_clock(now)}", (f"  every {interval:g} s, Ctrl-C to stop", "dim"))
    parts: list[RenderableType] = [header]
    if error is not None:
        since = f", showing the answer of {_clock(updated)}" if updated is not None else ""
        # What happens next first: a line cut at the width loses only the error's detail.
        message = f"error (retrying every {interval:g} s{since}): {' '.join(error.split())}"
        parts.append(Text(message, style="red", no_wrap=live, overflow="ellipsis" if live else "fold"))
    parts.append(body if body is not None else Text("waiting for a first answer", style="dim"))
    return Group(*parts)


def _expected_errors() -> tuple[type[BaseException], ...]:
    from liftlog.client import LiftlogError

    # OSError covers TimeoutError; CommandError is "no such stream" and the like.
    return (LiftlogError, OSError, CommandError)


async def _watch(
    title: str,
    fetch: Callable[[], Awaitable[RenderableType]],
    options: WatchOptions,
    cleanup: Callable[[], Awaitable[None]] | None,
) -> bool:
    """Refresh until cancelled or ``options.count`` refreshes are done; whether the last one succeeded."""
    try:
        return await _refresh(title, fetch, options)
    finally:
        if cleanup is not None:
            await cleanup()


async def _refresh(title: str, fetch: Callable[[], Awaitable[RenderableType]], options: WatchOptions) -> bool:
    errors = _expected_errors()
    console = out_console()
    live = Live(console=console, auto_refresh=False) if console.is_terminal else None
    body: RenderableType | None = None
    updated: float | None = None
    error: str | None = None
    done = 0
    with live or contextlib.nullcontext():
        while True:
            started = time.monotonic()
            try:
                body = await fetch()
                updated, error = time.time(), None
            except errors as exc:
                error = str(exc) or type(exc).__name__
            frame = watch_frame(title, options.interval, body, error, updated, time.time(), live=live is not None)
            if live is not None:
                live.update(frame, refresh=True)
            else:
                console.print(frame)
                console.print()
            done += 1
            if options.count is not None and done >= options.count:
                return error is None
            await asyncio.sleep(max(0.0, options.interval - (time.monotonic() - started)))


def run_watch(
    title: str,
    fetch: Callable[[], Awaitable[RenderableType]],
    options: WatchOptions,
    cleanup: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Run the watch, then `cleanup` (on the same event loop, which `fetch`'s clients belong to).

    Ctrl-C ends it with exit code 0; a --count run whose last refresh failed exits with 1.
    """
    try:
        succeeded = run(_watch(title, fetch, options, cleanup))
    except KeyboardInterrupt:  # the way to stop watching, not a failure (run() already cancelled the loop)
        return
    if not succeeded:
        raise click.exceptions.Exit(1)
