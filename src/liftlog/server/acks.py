"""Routes acks from partitions to whoever waits for them.

A Publish call waiting in this server registers ``(ack inbox, correlation
id)`` and gets a future; an ack for it is handed over directly, without a
trip through NATS. Every ack whose inbox is not this server's private one
is also published on NATS, where the client (or another server) listens.

Publishing is batched: ``deliver`` is synchronous (partitions call it from
their write path), so outgoing acks queue up and one task publishes them.

Event-loop only, not thread-safe.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable

from liftlog.api import api_pb2
from liftlog.api.envelope import EnvelopeError, decode_ack, encode_ack

from .nats_types import NatsClient, NatsMessage, NatsSubscription
from .ratelimit import LogLimiter

__all__ = ["AckRouter"]

log = logging.getLogger(__name__)
#: Per-message warnings: whoever can publish on our subjects must not be able to flood the log.
_warn = LogLimiter(log)

Publish = Callable[[str, bytes], Awaitable[None]]


class AckRouter:
    def __init__(self, server_id: str) -> None:
        # Private to this process: a restarted server must not get its predecessor's acks.
        self.inbox = f"_INBOX.liftlog.{server_id}.{secrets.token_hex(6)}"
        self._ids = itertools.count()
        self._id_prefix = secrets.token_hex(4) + "-"
        self._waiters: dict[tuple[str, str], asyncio.Future[api_pb2.Ack]] = {}
        self._outbox: list[tuple[str, bytes]] = []
        self._wake = asyncio.Event()
        self._publish: Publish | None = None
        self._sender: asyncio.Task[None] | None = None
        self._sub: NatsSubscription | None = None

    async def start(self, nats: NatsClient) -> None:
        """Publish outgoing acks through ``nats`` and listen on this server's inbox."""
        self._publish = nats.publish
        self._sender = asyncio.get_running_loop().create_task(self._send_loop(), name="ack sender")
        self._sub = await nats.subscribe(self.inbox, cb=self._on_nats_ack)

    async def stop(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception as exc:
                log.debug("unsubscribing the ack inbox: %s", exc)
            self._sub = None
        await self._flush()
        if self._sender is not None:
            self._sender.cancel()
            self._sender = None
        for fut in self._waiters.values():
            if not fut.done():
                fut.cancel()
        self._waiters.clear()

    def new_correlation_id(self) -> str:
        return f"{self._id_prefix}{next(self._ids)}"

    def expect(self, inbox: str, correlation_id: str) -> asyncio.Future[api_pb2.Ack]:
        """A future for the ack of the message sent with this inbox and correlation id."""
        fut: asyncio.Future[api_pb2.Ack] = asyncio.get_running_loop().create_future()
        key = (inbox, correlation_id)
        self._waiters[key] = fut
        fut.add_done_callback(lambda f: self._drop_cancelled(key, f))
        return fut

    def _drop_cancelled(self, key: tuple[str, str], fut: asyncio.Future[api_pb2.Ack]) -> None:
        # A waiter that gave up (timeout, cancelled call) must not stay in the table.
        if fut.cancelled() and self._waiters.get(key) is fut:
            del self._waiters[key]

    @property
    def waiting(self) -> int:
        """Acks awaited by calls in this server."""
        return len(self._waiters)

    def forget(self, inbox: str, correlation_id: str) -> None:
        self._waiters.pop((inbox, correlation_id), None)

    def deliver(self, ack: api_pb2.Ack) -> None:
        """Hand ``ack`` to a local waiter and/or queue it for its NATS inbox."""
        inbox = ack.ackInbox
        fut = self._waiters.pop((inbox, ack.correlationId), None)
        if fut is not None and not fut.done():
            fut.set_result(ack)
        if inbox != self.inbox:
            self._outbox.append((inbox, encode_ack(ack)))
            if len(self._outbox) == 1:
                self._wake.set()

    async def _on_nats_ack(self, msg: NatsMessage) -> None:
        try:
            ack = decode_ack(msg.data)
        except EnvelopeError as exc:
            _warn.warning("ignoring a malformed ack on %s: %s", msg.subject, exc)
            return
        fut = self._waiters.pop((ack.ackInbox, ack.correlationId), None)
        if fut is not None and not fut.done():
            fut.set_result(ack)

    async def _send_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._flush()

    async def _flush(self) -> None:
        publish = self._publish
        while self._outbox and publish is not None:
            batch, self._outbox = self._outbox, []
            for subject, data in batch:
                try:
                    await publish(subject, data)
                except Exception as exc:  # the publisher times out and retries; nothing else to do
                    _warn.warning("could not publish an ack to %s: %s", subject, exc)
