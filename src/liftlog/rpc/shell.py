"""What the server's and the client's asyncio shells share: writing a connection core's output.

The core's output goes to the socket at most once per event-loop turn
(:meth:`want_flush`), so the frames of many calls leave in one write; a
writer that is ahead of the peer's windows or of the socket waits in
:meth:`writable` until a flush or ``resume_writing`` frees it.
"""

from __future__ import annotations

import asyncio

from .connection import Connection

__all__ = ["CoreProtocol"]


class CoreProtocol(asyncio.Protocol):
    """An ``asyncio.Protocol`` around a sans-IO connection core; subclasses handle what the core reads."""

    def __init__(self, core: Connection) -> None:
        self.core = core
        self.transport: asyncio.Transport | None = None
        self.paused = False  # the socket's buffer is full (pause_writing)
        self._loop = asyncio.get_running_loop()
        self._flush_scheduled = False
        self._writers: list[asyncio.Future[None]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop: not an asyncio.Transport subclass
        self.flush()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.flush()
        self.wake_writers()

    def consumed(self, stream_id: int, size: int) -> None:
        """The app took a message: its bytes go back to the peer's window (in the next flush)."""
        self.core.consumed(stream_id, size)
        self.want_flush()

    def want_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        transport = self.transport
        if transport is None:
            return
        data = self.core.data_to_send(self.holds_acks())
        if data:
            transport.write(data)
        self.flushed()
        if self._writers and not self.paused:
            self.wake_writers()

    def holds_acks(self) -> bool:
        """Whether PING ACKs may wait for a later write (see Connection.has_urgent_output)."""
        return False

    def flushed(self) -> None:
        """After each flush (a server closes a draining connection here)."""

    async def writable(self) -> None:
        """Wait for a flush or the socket to drain; returns at once when there is no socket."""
        if self.transport is None:
            return
        waiter = self._loop.create_future()
        self._writers.append(waiter)
        await waiter

    def wake_writers(self) -> None:
        self.wake(self._writers)

    @staticmethod
    def wake(waiters: list[asyncio.Future[None]]) -> None:
        """Resolve every future waiting in ``waiters`` and empty the list."""
        pending = waiters[:]
        waiters.clear()
        for waiter in pending:
            if not waiter.done():
                waiter.set_result(None)

    def close_transport(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
