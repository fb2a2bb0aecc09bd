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
    from liftlog.client import Client, TlsConfig

__all__ = [
    "ADDR_ENV",
    "CLIENT_ENV",
    "DEFAULT_ADDR",
    "CommandError",
    "ReportingGroup",
    "addr_option",
    "addresses",
    "client_tls",
    "connect",
    "connect_to",
    "fail",
    "output_option",
    "reporting_errors",
    "root_addr_option",
    "run",
    "tls_options",
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


def _store_tls(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.meta[f"{_TLS_META_PREFIX}{param.name}"] = value


def _tls_options(root: bool) -> Callable[[F], F]:
    def decorate(f: F) -> F:
        for name, var, metavar, help in reversed(_TLS_OPTIONS):
            f = click.option(
                f"--{name.replace('_', '-')}",
                name,
                envvar=var if root else None,
                expose_value=False,
                callback=_store_tls,
                metavar=metavar,
                help=f"{help} (env {var}).",
            )(f)
        return f

    return decorate


#: The client's TLS options (--tls-ca, --tls-cert, --tls-key, --tls-server-name) for a command; read them
#: with client_tls().
tls_options = _tls_options(root=False)


def _addr_option(root: bool) -> Callable[[F], F]:
    # Only the root group reads LIFTLOG_ADDR (and the TLS variables): were a subcommand to read them
    # too, the variable would override an explicit `liftlog -a X <command>`.
    def decorate(f: F) -> F:
        f = _tls_options(root)(f)
        return click.option(
            "--addr",
            "-a",
            multiple=True,
            envvar=ADDR_ENV if root else None,
            expose_value=False,
            callback=_store_addresses,
            metavar="HOST:PORT",
            help=f"Server address; repeat or comma-separate for several (env {ADDR_ENV}, default {DEFAULT_ADDR}).",
        )(f)

    return decorate


_TLS_META_PREFIX = "liftlog.tls."
#: The client's TLS options. Their variables are LIFTLOG_CLIENT_*: LIFTLOG_TLS_* are the server's tls.* keys.
_TLS_OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("tls_ca", "LIFTLOG_CLIENT_TLS_CA", "FILE", "Connect with TLS, trusting the CA in FILE"),
    ("tls_cert", "LIFTLOG_CLIENT_TLS_CERT", "FILE", "Connect with TLS, showing this client certificate (mTLS)"),
    ("tls_key", "LIFTLOG_CLIENT_TLS_KEY", "FILE", "The key of --tls-cert"),
    (
        "tls_server_name",
        "LIFTLOG_CLIENT_TLS_SERVER_NAME",
        "NAME",
        "Check the servers' certificates against NAME, not the host connected to",
    ),
)
#: Variables of the CLI, not of `liftlog server`: it leaves them out of the environment it hands to load_config.
CLIENT_ENV: tuple[str, ...] = (ADDR_ENV, *(var for _, var, _, _ in _TLS_OPTIONS))


#: ``--addr/-a`` for commands that talk to a server; also accepted on the root group.
addr_option = _addr_option(root=False)
root_addr_option = _addr_option(root=True)


class CommandError(Exception):
    """A failure a command detected itself (say, an unknown stream): one ``error:`` line, exit 1."""


def addresses() -> tuple[str, ...]:
    """The server addresses given with ``--addr`` or ``LIFTLOG_ADDR``, else the default."""
    found: tuple[str, ...] = click.get_current_context().meta.get(_META_KEY, ())
    return found or (DEFAULT_ADDR,)


def client_tls() -> TlsConfig | None:
    """The TLS settings given with --tls-* or LIFTLOG_CLIENT_TLS_*; None for plain connections."""
    meta = click.get_current_context().meta
    given = {name: meta.get(f"{_TLS_META_PREFIX}{name}") for name, _, _, _ in _TLS_OPTIONS}
    if not any(given.values()):
        return None
    from liftlog.client import TlsConfig

    return TlsConfig(
        ca=given["tls_ca"], cert=given["tls_cert"], key=given["tls_key"], server_name=given["tls_server_name"]
    )


def connect(**kwargs: Any) -> Client:
    """A client for the addresses and TLS settings in effect (use it with ``async with``)."""
    from liftlog.client import Client

    return Client(list(addresses()), tls=client_tls(), **kwargs)


def output_option(f: F) -> F:
    """``-o/--output text|json``; the command gets ``output`` (``--json``, where a command has it, is the same)."""
    return click.option(
        "-o",
        "--output",
        type=click.Choice(["text", "json"], case_sensitive=False),
        default="text",
        show_default=True,
        help="text: a table (names are never cut short); json: machine-readable.",
    )(f)


def connect_to(addresses: list[str], **kwargs: Any) -> Client:
    """A client for ``addresses`` (servers the command found) with the TLS settings in effect."""
    from liftlog.client import Client

    return Client(addresses, tls=client_tls(), **kwargs)


def run(coro: Coroutine[object, object, T]) -> T:
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
