"""A blocking face on the asyncio client, for Spark's synchronous callbacks.

Spark calls a data source from plain Python code (planning on the driver,
``read``/``write`` in worker processes), so each caller that talks to liftlog
owns one :class:`BlockingClient`: a :class:`~liftlog.client.Client` on
the process's private event loop. It is not thread-safe and not
picklable: create it where it is used, never in ``__init__`` of an object
Spark ships to executors.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TypeVar

from liftlog.client import (
    Client,
    LiftlogError,
    NoSuchPartitionError,
    NoSuchStreamError,
    TlsConfig,
    TlsError,
    UnavailableError,
)

__all__ = ["BlockingClient", "LiftlogSparkError"]

T = TypeVar("T")

_loop: asyncio.AbstractEventLoop | None = None

#: Retries of the first request: is any server there at all?
CONNECT_RETRIES = 2
#: Retries afterwards, with backoff doubling from 50 ms to 2 s: about 15 s, longer than a leader failover.
RETRIES = 12


def _process_loop() -> asyncio.AbstractEventLoop:
    """One event loop per process, never closed.

    A client's channels (connections, timers, calls) belong to the loop they
    were first used on; Spark reuses its Python workers across tasks, and a
    loop that lives as long as the worker never closes under a channel that
    is still open.
    """
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    return _loop


async def _one_turn() -> None:
    await asyncio.sleep(0)


class LiftlogSparkError(RuntimeError):
    """A liftlog read or write in Spark failed; the message names the stream, partition and offsets involved."""


class BlockingClient:
    """A :class:`Client` on the process's event loop; :meth:`run` awaits a coroutine function of it."""

    def __init__(self, servers: Sequence[str], *, timeout: float = 10.0, tls: TlsConfig | None = None) -> None:
        self.servers = tuple(servers)
        self._loop = _process_loop()
        # Quick to say that no server answers at all; then patient (about 15 s of retries) while a
        # partition's leader moves to another server.
        self._client = Client(list(self.servers), timeout=timeout, retries=CONNECT_RETRIES, max_backoff=2.0, tls=tls)
        self._connected = False

    @property
    def client(self) -> Client:
        return self._client

    def run(self, work: Callable[[Client], Awaitable[T]]) -> T:
        """Run ``work(client)`` to completion, turning the client's errors into clear ones."""
        return self._loop.run_until_complete(self._guard(work))

    def start(self, work: Callable[[Client], Awaitable[T]]) -> asyncio.Task[T]:
        """Start ``work(client)`` without waiting: it advances in :meth:`pump`, :meth:`run` and :meth:`wait`."""
        task = self._loop.create_task(self._guard(work))
        self.pump()
        return task

    def pump(self) -> None:
        """Let started work advance for one turn of the loop (what the sockets have, what is ready to send)."""
        self._loop.run_until_complete(_one_turn())

    def wait(self, task: asyncio.Task[T]) -> T:
        """The result of started work, once it is done."""
        return self._loop.run_until_complete(task)

    def run_coroutine(self, coro: Coroutine[object, object, T]) -> T:
        """Run a coroutine on this client's loop (for iterating subscriptions step by step)."""
        return self._loop.run_until_complete(coro)

    async def _guard(self, work: Callable[[Client], Awaitable[T]]) -> T:
        if not self._connected:
            try:
                await self._client.connect()
            except (UnavailableError, TlsError) as exc:  # its message already names the addresses
                raise LiftlogSparkError(exc.message) from exc
            self._connected = True
            self._client.retries = RETRIES
        try:
            return await work(self._client)
        except UnavailableError as exc:
            raise LiftlogSparkError(f"no liftlog server answered at {', '.join(self.servers)}: {exc.message}") from exc
        except (NoSuchStreamError, NoSuchPartitionError) as exc:
            raise LiftlogSparkError(f"{exc.message} (servers {', '.join(self.servers)})") from exc

    def close(self) -> None:
        if self._client.closed:
            return
        with contextlib.suppress(LiftlogError):
            self._loop.run_until_complete(self._client.close())

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
