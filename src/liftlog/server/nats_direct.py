"""The server's NATS connection: nats-py, with a direct path for the partitions' intake subscriptions.

nats-py hands each message to a subscription as a ``Msg`` object, through
an asyncio queue, to a task that awaits the subscription's callback: per
message, a few microseconds the intake spends again on every publish.
:meth:`DirectClient.subscribe_direct` makes a subscription whose messages go
straight from nats-py's protocol parser to a plain function,
``handler(subject, reply, payload)`` (bytes, as parsed), in arrival order; a
handler that only collects them can write everything one socket read
brought as one batch. Connecting, reconnecting and resubscribing, and every
other subscription, stay nats-py's.

This overrides nats-py's private ``_process_msg`` and ``_remove_sub``
(pinned release, ``nats-py~=2.16``); the tests in
``tests/server/test_nats_direct.py`` fail if their behaviour changes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.client import Client

__all__ = ["DirectClient", "DirectHandler", "connect"]

DirectHandler = Callable[[bytes, bytes, bytes], None]


class DirectClient(Client):
    def __init__(self) -> None:
        super().__init__()
        self._direct: dict[int, DirectHandler] = {}

    async def subscribe_direct(
        self, subject: str, queue: str, handler: DirectHandler, cb: Callable[[Any], Awaitable[None]]
    ) -> Any:
        """Subscribe; messages go to ``handler`` once any that reached ``cb`` first have been handed over.

        Messages can arrive between the SUB and the registration of
        ``handler``: those go the usual way, to ``cb`` (which must treat them
        as ``handler`` would), and the direct path waits until that queue is
        empty so the order of arrival is kept.
        """
        sub = await self.subscribe(subject, queue=queue, cb=cb)
        self._direct[sub._id] = handler
        return sub

    async def _process_msg(self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        handler = self._direct.get(sid)
        if handler is not None:
            sub = self._subs.get(sid)
            if sub is not None and not sub._pending_queue.qsize():
                stats = self.stats
                stats["in_msgs"] += 1
                stats["in_bytes"] += len(data)
                handler(subject, reply, data)
                return
        await super()._process_msg(sid, subject, reply, data, headers)  # type: ignore[arg-type]

    def _remove_sub(self, sid: int, max_msgs: int = 0) -> None:
        self._direct.pop(sid, None)
        super()._remove_sub(sid, max_msgs)


async def connect(**options: Any) -> DirectClient:
    """``nats.connect`` with a :class:`DirectClient`."""
    client = DirectClient()
    await client.connect(**options)
    return client
