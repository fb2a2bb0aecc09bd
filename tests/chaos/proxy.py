"""A TCP proxy whose link can be cut, blackholed or slowed while both endpoints keep running.

Each liftlog server reaches NATS through its own ``TcpProxy`` (``--nats-servers proxy.url``), so a test can
partition one server from NATS without touching its process. The proxy runs its own asyncio loop in a daemon
thread: sync tests, pytest-asyncio tests and other threads drive it alike, and a blocked or paused test loop
does not stall forwarding.

Modes (one at a time; ``delay`` is independent of them):

* normal: every chunk is forwarded, after ``delay`` seconds if set.
* ``cut()``: every connection is aborted at once (both sides) and new ones are accepted and closed straight
  away; the listener stays bound so the port never changes. Clients see a reset and keep reconnecting.
* ``blackhole()``: connections stay open, but bytes read from either side are dropped (counted in
  ``bytes_dropped``), EOFs are not passed on, and new connections are accepted but never connected upstream.
  Clients see silence only, never an error, until their own timeouts fire.
* ``oneway("up")`` / ``oneway("down")``: like a blackhole in one direction only: bytes from the client to
  the target ("up") or from the target to the client ("down") are dropped, the other way flows. A server
  that can hear NATS but not be heard (or the reverse).
* ``heal()``: back to normal, ``delay`` back to 0. Leaving a blackhole aborts every connection open at that
  moment: each lost bytes mid-stream, so its protocol state is garbage and the only honest continuation is a
  reset (like a partition outlasting TCP's retransmission timeout). Clients then reconnect through the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

__all__ = ["TcpProxy"]

T = TypeVar("T")

NORMAL = "normal"
CUT = "cut"
BLACKHOLE = "blackhole"
UP_DROPPED = "oneway-up"
DOWN_DROPPED = "oneway-down"
#: Modes that lose bytes mid-stream: leaving one resets every connection.
_LOSSY = (BLACKHOLE, UP_DROPPED, DOWN_DROPPED)

_CHUNK = 64 * 1024
#: Chunks queued per direction before reading stops: backpressure, bounded memory under delay.
_QUEUE_CHUNKS = 256
_CONTROL_TIMEOUT = 10.0


class _Link:
    """One proxied connection: the accepted client side, the upstream side once dialled, and its pump tasks."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = asyncio.Event()

    def abort(self) -> None:
        """Close both sides without flushing and stop the pumps; idempotent."""
        if self.closed.is_set():
            return
        self.closed.set()
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target_host:target_port``, with faults switchable at run time.

    Control methods are thread-safe: they run on the proxy's loop and return once the change took effect
    (e.g. after ``cut()`` returns, every old connection is already aborted). Counters are plain ints written
    only by the proxy's loop; reading them from elsewhere is safe and at worst a moment stale.
    """

    def __init__(self, target_host: str, target_port: int, listen_port: int = 0) -> None:
        """``listen_port`` 0 picks a free port; pass an old ``port`` to bring a stopped proxy back in place."""
        self.target_host = target_host
        self.target_port = target_port
        self.port = listen_port
        self.mode = NORMAL
        self.latency = 0.0
        self.connections_accepted = 0
        #: Connections closed on arrival because the proxy was cut.
        self.connections_refused = 0
        #: Client -> target and target -> client bytes actually written.
        self.bytes_up = 0
        self.bytes_down = 0
        #: Bytes swallowed by a blackhole (either direction).
        self.bytes_dropped = 0
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._closing = False

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def active_connections(self) -> int:
        return len(self._links)

    # -- lifecycle ------------------------------------------------------------------------------------------

    def start(self) -> TcpProxy:
        if self._thread is not None:
            raise RuntimeError("proxy already started")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"TcpProxy->{self.target_host}:{self.target_port}", daemon=True
        )
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(_CONTROL_TIMEOUT)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Abort all connections, close the listener, join the thread; safe twice or after a failed start."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        if thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(_CONTROL_TIMEOUT)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(_CONTROL_TIMEOUT)
        if not thread.is_alive():
            loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> TcpProxy:
        return self if self._thread is not None else self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- faults ---------------------------------------------------------------------------------------------

    def cut(self) -> None:
        """Abort all connections now and close new ones on arrival until ``heal()``."""
        self._call(lambda: self._set_mode(CUT))

    def blackhole(self) -> None:
        """Keep connections up but drop every byte both ways until ``heal()``, which then resets them."""
        self._call(lambda: self._set_mode(BLACKHOLE))

    def oneway(self, direction: str) -> None:
        """Drop every byte going ``direction`` ("up": client to target, "down": target to client) until ``heal()``."""
        if direction not in ("up", "down"):
            raise ValueError("direction is 'up' or 'down'")
        self._call(lambda: self._set_mode(UP_DROPPED if direction == "up" else DOWN_DROPPED))

    def delay(self, seconds: float) -> None:
        """Hold every chunk read from now on ``seconds`` before writing it, both ways; 0 removes the delay.

        Order is kept and throughput is not throttled: chunks wait in a queue, not in the reader.
        """
        if seconds < 0:
            raise ValueError("delay must be >= 0")

        def apply() -> None:
            self.latency = float(seconds)

        self._call(apply)

    def heal(self) -> None:
        """Normal forwarding with no delay; connections that lived through a blackhole are reset."""

        def apply() -> None:
            self._set_mode(NORMAL)
            self.latency = 0.0

        self._call(apply)

    # -- loop side ------------------------------------------------------------------------------------------

    def _call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the proxy loop and wait for it (inline when already on that loop, to avoid deadlock)."""
        if self._loop is None or self._thread is None:
            raise RuntimeError("proxy not started")
        if threading.current_thread() is self._thread:
            return fn()

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(_CONTROL_TIMEOUT)

    async def _listen(self) -> None:
        """Accept in a plain reader callback, not ``asyncio.start_server``: on 3.11 a connection accepted just
        before ``Server.close()`` fails an assertion inside asyncio and its socket leaks."""
        listener = socket.create_server(("127.0.0.1", self.port), backlog=128)
        listener.setblocking(False)
        self.port = int(listener.getsockname()[1])
        self._listener = listener
        asyncio.get_running_loop().add_reader(listener.fileno(), self._on_listener_readable)

    def _on_listener_readable(self) -> None:
        assert self._listener is not None
        for _ in range(64):
            try:
                conn, _ = self._listener.accept()
            except OSError:  # nothing left to accept (or out of descriptors: retried on the next wakeup)
                return
            conn.setblocking(False)
            task = asyncio.get_running_loop().create_task(self._accept(conn))
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    async def _shutdown(self) -> None:
        """Let every task end by itself (handlers see ``_closing`` and close their socket); cancel only stragglers."""
        self._closing = True
        if self._listener is not None:
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
            self._listener.close()
        for link in list(self._links):
            link.abort()
        current = asyncio.current_task()
        deadline = asyncio.get_running_loop().time() + _CONTROL_TIMEOUT / 2
        # Repeat: a connection accepted just before the close spawns its handler task only a few steps later.
        while tasks := [t for t in asyncio.all_tasks() if t is not current]:
            _, stuck = await asyncio.wait(tasks, timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
            if stuck:
                for task in stuck:
                    task.cancel()
                await asyncio.gather(*stuck, return_exceptions=True)
                break
        for _ in range(3):  # aborted transports close their sockets in callbacks still queued
            await asyncio.sleep(0)

    def _set_mode(self, mode: str) -> None:
        previous, self.mode = self.mode, mode
        if mode == CUT or (previous in _LOSSY and mode != previous):
            for link in list(self._links):
                link.abort()

    async def _accept(self, conn: socket.socket) -> None:
        self.connections_accepted += 1
        if self.mode == CUT or self._closing:
            self.connections_refused += self.mode == CUT
            conn.close()
            return
        try:
            reader, client = await asyncio.open_connection(sock=conn, limit=_CHUNK)
        except OSError:
            conn.close()
            return
        if self.mode == CUT or self._closing:  # changed while wrapping the socket
            self.connections_refused += self.mode == CUT
            client.transport.abort()
            return
        link = _Link(client)
        self._links.add(link)
        try:
            if self.mode != BLACKHOLE:
                dialled = await self._dial(link)
                if dialled is None:
                    return  # target down, or cut/stopped while dialling: the client sees its connection close
                up_reader, upstream = dialled
                up: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_QUEUE_CHUNKS)
                down: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue(_QUEUE_CHUNKS)
                link.tasks = [
                    asyncio.create_task(self._read(link, reader, up, upward=True)),
                    asyncio.create_task(self._write(link, upstream, up, upward=True)),
                    asyncio.create_task(self._read(link, up_reader, down, upward=False)),
                    asyncio.create_task(self._write(link, client, down, upward=False)),
                ]
            # A connection accepted during a blackhole is held silent until heal() or cut() aborts it.
            await link.closed.wait()
        finally:
            link.abort()
            self._links.discard(link)

    async def _dial(self, link: _Link) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Connect upstream, giving up as soon as the link is aborted (a cut or stop must not wait for a dial)."""
        dial = asyncio.create_task(
            asyncio.wait_for(asyncio.open_connection(self.target_host, self.target_port), _CONTROL_TIMEOUT)
        )
        closed = asyncio.create_task(link.closed.wait())
        await asyncio.wait({dial, closed}, return_when=asyncio.FIRST_COMPLETED)
        closed.cancel()
        if not dial.done():
            dial.cancel()
        await asyncio.gather(dial, closed, return_exceptions=True)
        if dial.cancelled() or dial.exception() is not None:
            return None
        up_reader, upstream = dial.result()
        if link.closed.is_set():
            upstream.transport.abort()
            return None
        link.upstream = upstream
        return up_reader, upstream

    def _dropping(self, upward: bool) -> bool:
        """Bytes going this way are lost now."""
        return self.mode == BLACKHOLE or self.mode == (UP_DROPPED if upward else DOWN_DROPPED)

    async def _read(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        *,
        upward: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await reader.read(_CHUNK)
                if self._dropping(upward):
                    self.bytes_dropped += len(data)
                    if not data:
                        return  # the FIN is lost in the partition; heal() resets the link
                    continue
                if not data:
                    await queue.put(None)  # close once the delayed bytes before it are written
                    return
                await queue.put((loop.time() + self.latency, data))
        except (OSError, EOFError):
            link.abort()

    async def _write(
        self,
        link: _Link,
        writer: asyncio.StreamWriter,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        *,
        upward: bool,
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    link.abort()
                    return
                due, data = item
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                if self._dropping(upward):  # still queued when the blackhole began
                    self.bytes_dropped += len(data)
                    continue
                writer.write(data)
                await writer.drain()
                if upward:
                    self.bytes_up += len(data)
                else:
                    self.bytes_down += len(data)
        except OSError:
            link.abort()
