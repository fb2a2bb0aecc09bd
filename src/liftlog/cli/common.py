"""What every command shares: the ``--addr`` option, the event loop runner and error reporting."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from liftlog.cli.output import print_error
from liftlog.cli.params import split_addresses
from liftlog.server.config import ConfigError

if TYPE_CHECKING:
    from liftlog.client import Client

__all__ = [
    "ADDR_ENV",
    "DEFAULT_ADDR",
    "CommandError",
    "ReportingGroup",
    "addr_option",
    "addresses",
    "connect",
    "fail",
    "reporting_errors",
    "root_addr_option",
    "run",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_ADDR = "127.0.0.1:9292"
#: The CLI's own variable. It shares the LIFTLOG_ prefix with the server's config variables, so
#: `liftlog server` leaves it out of the environment it hands to load_config.
ADDR_ENV = "LIFTLOG_ADDR"
_META_KEY = "liftlog.addresses"


def _store_addresses(ctx: click.Context, _param: click.Parameter, value: tuple[str, ...]) -> None:
    # ctx.meta is shared by the whole context chain, so `liftlog -a X stream list` and
    # `liftlog stream list -a X` both land here; the later (subcommand) one wins.
    if value:
        ctx.meta[_META_KEY] = split_addresses(value)


def _addr_option(root: bool) -> Callable[[F], F]:
    # Only the root group reads LIFTLOG_ADDR: were a subcommand to read it too, the
    # variable would override an explicit `liftlog -a X <command>`.
    return click.option(
        "--addr",
        "-a",
        multiple=True,
        envvar=ADDR_ENV if root else None,
        expose_value=False,
        callback=_store_addresses,
        metavar="HOST:PORT",
        help=f"Server address; repeat or comma-separate for several (env {ADDR_ENV}, default {DEFAULT_ADDR}).",
    )


#: ``--addr/-a`` for commands that talk to a server; also accepted on the root group.
addr_option = _addr_option(root=False)
root_addr_option = _addr_option(root=True)


class CommandError(Exception):
    """A failure a command detected itself (say, an unknown stream): one ``error:`` line, exit 1."""


def addresses() -> tuple[str, ...]:
    """The server addresses given with ``--addr`` or ``LIFTLOG_ADDR``, else the default."""
    found: tuple[str, ...] = click.get_current_context().meta.get(_META_KEY, ())
    return found or (DEFAULT_ADDR,)


def connect(**kwargs: Any) -> Client:
    """A client for the addresses in effect (use it with ``async with``)."""
    from liftlog.client import Client

    return Client(list(addresses()), **kwargs)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop when it is installed, else on asyncio's loop.

    Ctrl-C cancels the coroutine (its ``finally`` blocks and ``async with`` exits
    run), then surfaces as KeyboardInterrupt, which ``main`` turns into exit 130.
    """
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        pass
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(coro)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one ``error:`` line and exit with ``code``."""
    print_error(message)
    raise click.exceptions.Exit(code)


def _expected_errors() -> tuple[type[BaseException], ...]:
    """Errors that are the user's or the environment's fault: reported in one line, no traceback."""
    # Imported here: the client pulls in gRPC and NATS, which --help does not need.
    from liftlog.client import LiftlogError
    from liftlog.server.errors import ServerStartError

    return (OSError, CommandError, LiftlogError, ServerStartError)


def _silence_stdout() -> None:
    # After EPIPE, the interpreter's final flush of stdout would fail again and print a warning.
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


@contextlib.contextmanager
def reporting_errors() -> Iterator[None]:
    """Turn expected failures into one ``error:`` line (exit 1, or 2 for bad configuration)."""
    try:
        yield
    except KeyboardInterrupt:
        raise click.exceptions.Exit(130) from None
    except BrokenPipeError:  # `liftlog subscribe s | head`: the reader left, nothing to report
        _silence_stdout()
        raise click.exceptions.Exit(1) from None
    except ConfigError as exc:
        fail(str(exc), 2)
    except Exception as exc:
        if not isinstance(exc, _expected_errors()):
            raise
        message = str(exc) or type(exc).__name__
        if isinstance(exc, TimeoutError) and not str(exc):
            message = "timed out"
        fail(message)


class ReportingGroup(click.Group):
    """A group whose subcommands' expected failures become one ``error:`` line (see :func:`reporting_errors`).

    The root ``liftlog`` group, and ``liftlog pipeline`` for ``python -m liftlog.pipeline``.
    """

    def invoke(self, ctx: click.Context) -> Any:
        with reporting_errors():
            return super().invoke(ctx)
