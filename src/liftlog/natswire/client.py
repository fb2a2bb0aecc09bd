"""nats-py's shape on the lean connection: per-message callbacks, requests and replies.

The replicator (fetches and their answers between leaders and followers) was built on nats-py's
client: ``subscribe(cb=...)`` with an async callback per message, ``request()`` and
``msg.respond()``, wrapped by ``AuthenticatedNats`` when the cluster has a secret. This module gives
it that interface on :class:`~.connection.LeanNats`: each subscription's messages go to its
callback in order from one task, woken once per read buffer rather than once per message, and
requests share one wildcard inbox subscription, answered by token. A request that nobody listens
to fails at once (nats-server's no-responders status) instead of waiting out its timeout.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections import deque
from collections.abc import Awaitable, Callable

from .connection import LeanNats, LeanSubscription
from .protocol import Event

__all__ = ["LeanMessage", "LeanNatsClient", "NatsNoResponders", "NatsRequestTimeout"]

log = logging.getLogger(__name__)

#: A drain hands over what was received for at most this long (a stuck callback must not hold up a stop).
_DRAIN_TIMEOUT_S = 10.0


class NatsRequestTimeout(TimeoutError):
    """No reply to a request in time."""


class NatsNoResponders(ConnectionError):
    """Nobody subscribes to the subject a request was sent to."""


class LeanMessage:
    __slots__ = ("_conn", "data", "raw_headers", "reply", "subject")

    def __init__(self, conn: LeanNats, subject: str, reply: str, data: bytes, raw_headers: bytes = b"") -> None:
        self._conn = conn
        self.subject = subject
        self.reply = reply
        self.data = data
        #: The NATS headers block as received (``NATS/1.0 503`` for a no-responders status), or b"".
        self.raw_headers = raw_headers

    async def respond(self, data: bytes) -> None:
        if not self.reply:
            raise ValueError(f"the message on {self.subject} asked for no reply")
        await self._conn.publish(self.reply, data)


MessageCallback = Callable[[LeanMessage], Awaitable[None]]


class _CallbackSubscription:
    """Messages queued by the connection, handed one at a time to an async callback by one task."""

    def __init__(self, conn: LeanNats, cb: MessageCallback) -> None:
        self._conn = conn
        self._cb = cb
        self._queue: deque[Event] = deque()
        self._wake: asyncio.Future[None] | None = None
        self._busy = False  # a callback is running
        self._task = asyncio.get_running_loop().create_task(self._run(), name="nats subscription")
        self.sub: LeanSubscription | None = None

    @property
    def pending_msgs(self) -> int:
        return len(self._queue)

    def take(self, msgs: list[Event]) -> None:
        self._queue.extend(msgs)
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def _run(self) -> None:
        queue, conn, cb = self._queue, self._conn, self._cb
        while True:
            while queue:
                event = queue.popleft()
                self._busy = True
                try:
                    await cb(LeanMessage(conn, event[2], event[3], event[4], event[5]))
                except Exception:
                    log.exception("handling a message on %s failed", event[2])
                finally:
                    self._busy = False
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake

    async def unsubscribe(self, limit: int = 0) -> None:
        if self.sub is not None:
            await self.sub.unsubscribe()
        self._task.cancel()

    async def drain(self) -> None:
        """Stop taking messages, hand over those already received, then stop."""
        if self.sub is not None:
            await self.sub.unsubscribe()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _DRAIN_TIMEOUT_S
        while (self._queue or self._busy) and not self._task.done() and loop.time() < deadline:
            await asyncio.sleep(0.001)
        self._task.cancel()


def _expire(future: asyncio.Future[LeanMessage], subject: str, timeout: float) -> None:
    if not future.done():
        future.set_exception(NatsRequestTimeout(f"no reply on {subject} within {timeout:.3g}s"))


class LeanNatsClient:
    """The subset of nats-py's client the replicator uses (``NatsClient``), on a lean connection."""

    def __init__(self, conn: LeanNats) -> None:
        self.conn = conn
        self._inbox = ""
        self._tokens = itertools.count()
        self._waiting: dict[str, asyncio.Future[LeanMessage]] = {}
        self._inbox_sub: LeanSubscription | None = None

    @property
    def max_payload(self) -> int:
        return self.conn.max_payload

    async def publish(
        self, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None:
        await self.conn.publish(subject, payload, reply, headers)

    async def subscribe(
        self, subject: str, queue: str = "", cb: MessageCallback | None = None
    ) -> _CallbackSubscription:
        if cb is None:
            raise ValueError(f"a subscription on the lean connection ({subject}) needs a callback")
        runner = _CallbackSubscription(self.conn, cb)
        runner.sub = await self.conn.subscribe_batches(subject, queue, runner.take)
        return runner

    async def request(self, subject: str, payload: bytes = b"", timeout: float = 0.5) -> LeanMessage:
        if self._inbox_sub is None:
            self._inbox = f"_INBOX.{secrets.token_hex(11)}."
            self._inbox_sub = await self.conn.subscribe_batches(self._inbox + "*", "", self._on_replies)
        token = str(next(self._tokens))
        loop = asyncio.get_running_loop()
        future: asyncio.Future[LeanMessage] = loop.create_future()
        self._waiting[token] = future
        # A timer on the future, not asyncio.timeout(): a follower sends a request per fetch round.
        timer = loop.call_later(timeout, _expire, future, subject, timeout)
        try:
            await self.conn.publish(subject, payload, self._inbox + token)
            return await future
        finally:
            timer.cancel()
            self._waiting.pop(token, None)

    def _on_replies(self, msgs: list[Event]) -> None:
        prefix = len(self._inbox)
        for event in msgs:
            future = self._waiting.get(event[2][prefix:])
            if future is None or future.done():
                continue  # late, or a second reply
            headers: bytes = event[5]
            if headers.startswith(b"NATS/1.0 503") and not event[4]:
                future.set_exception(NatsNoResponders(f"no one listens on the subject of request {event[2]}"))
            else:
                future.set_result(LeanMessage(self.conn, event[2], event[3], event[4]))
