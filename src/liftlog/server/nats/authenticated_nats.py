"""The NATS client the server's internal traffic uses when a cluster secret is configured.

It wraps the real client: messages on internal subjects (the cluster
namespace ``<ns>.>`` and the servers' private ack inboxes ``_INBOX.liftlog.>``)
are sealed when published and opened when received (``liftlog.security.
cluster_auth``); replies to internal requests are sealed and checked too.
Whatever fails is dropped, counted in ``dropped`` by reason, and logged at
most once per interval per reason. Every other subject (stream subjects,
clients' ack inboxes) passes through unchanged, so clients never see a
trailer.

Requests: a message that names a reply subject is sealed over both subjects,
so a copy cannot be sent on with another reply subject. Internal requests
take their replies on an inbox of their own under ``_INBOX.liftlog.`` (which
applications are denied), and a reply that fails the check is dropped while
the request goes on waiting for a valid one until its timeout: whoever can
read the requests can no longer end them by answering first. A
no-responders status from nats-server still ends a request at once (callers
retry elsewhere); NATS does not sign it, so someone inside the NATS account
can forge one, which costs a retry, not a wrong answer.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import secrets
from collections.abc import Callable

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from liftlog.metadata.names import SERVER_INBOX_PREFIX
from liftlog.security.cluster_auth import TRAILER_SIZE, AuthError, ClusterAuth, ReplayGuard
from liftlog.server.clock import SYSTEM_CLOCK, Clock
from liftlog.server.nats.nats_types import MessageHandler, NatsClient, NatsMessage, NatsSubscription
from liftlog.server.ratelimit import LogLimiter

__all__ = ["SERVER_INBOX_PREFIX", "AuthenticatedNats", "internal_subjects"]

log = logging.getLogger(__name__)
_warn = LogLimiter(log)

#: How often (in opened messages) a guard forgets senders that fell silent.
_PRUNE_EVERY = 4096


def internal_subjects(namespace: str) -> Callable[[str], bool]:
    """Whether a subject carries server-to-server traffic, for a cluster in ``namespace``."""
    prefixes = (namespace + ".", SERVER_INBOX_PREFIX)
    return lambda subject: subject.startswith(prefixes)


class _Opened:
    """A received internal message with its trailer removed; its reply is sealed."""

    __slots__ = ("_owner", "data", "reply", "subject")

    def __init__(self, owner: AuthenticatedNats, subject: str, reply: str, data: bytes) -> None:
        self._owner = owner
        self.subject = subject
        self.reply = reply
        self.data = data

    async def respond(self, data: bytes) -> None:
        if not self.reply:
            raise ValueError(f"the message on {self.subject} asked for no reply")
        owner = self._owner
        await owner.inner.publish(self.reply, owner.auth.seal(self.reply, data, owner.clock()))


class AuthenticatedNats:
    """A NatsClient that signs and checks internal messages (see the module docstring)."""

    def __init__(
        self,
        inner: NatsClient,
        auth: ClusterAuth,
        is_internal: Callable[[str], bool],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.inner = inner
        self.auth = auth
        #: Seals carry wall-clock time: the receiving server judges their age on its own.
        self.clock = clock.wall_ns
        self._is_internal = is_internal
        self._replies = ReplayGuard()
        #: Where replies to this connection's internal requests come, one token per request.
        self._inbox = f"{SERVER_INBOX_PREFIX}r{secrets.token_hex(10)}."
        self._inbox_sub: NatsSubscription | None = None
        self._inbox_lock = asyncio.Lock()  # the first requests, at once: one subscription, not one each
        self._tokens = itertools.count()
        self._waiting: dict[str, asyncio.Future[NatsMessage]] = {}
        self._opened = 0
        #: Internal messages refused, by reason (unsigned, forged, stale, early, future, replayed).
        self.dropped: collections.Counter[str] = collections.Counter()

    @property
    def max_payload(self) -> int:
        return int(self.inner.max_payload) - TRAILER_SIZE

    async def publish(
        self, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None:
        if self._is_internal(subject):
            payload = self.auth.seal(subject, payload, self.clock(), reply)
        await self.inner.publish(subject, payload, reply=reply, headers=headers)

    async def subscribe(self, subject: str, queue: str = "", cb: MessageHandler | None = None) -> NatsSubscription:
        if not self._is_internal(subject):
            return await self.inner.subscribe(subject, queue=queue, cb=cb)
        if cb is None:  # messages taken without a callback would skip the check
            raise ValueError(f"an internal subscription ({subject}) needs a callback: its messages are checked there")
        guard = ReplayGuard()  # per subscription: its messages arrive in order, others' need not
        handler = cb

        async def opened(msg: NatsMessage) -> None:
            data = self._open(msg.subject, msg.data, guard, msg.reply)
            if data is not None:
                await handler(_Opened(self, msg.subject, msg.reply, data))

        return await self.inner.subscribe(subject, queue=queue, cb=opened)

    async def request(self, subject: str, payload: bytes = b"", timeout: float = 0.5) -> NatsMessage:
        """Send an internal request and wait for the first authentic reply (see the module docstring);
        nats.errors.TimeoutError if none came in time, NoRespondersError if nobody listens."""
        if not self._is_internal(subject):
            return await self.inner.request(subject, payload, timeout=timeout)
        if self._inbox_sub is None:
            async with self._inbox_lock:
                if self._inbox_sub is None:
                    self._inbox_sub = await self.inner.subscribe(self._inbox + "*", cb=self._on_reply)
        token = str(next(self._tokens))
        reply = self._inbox + token
        loop = asyncio.get_running_loop()
        future: asyncio.Future[NatsMessage] = loop.create_future()
        self._waiting[token] = future
        # A timer on the future, not asyncio.timeout(): followers send a request per fetch round.
        timer = loop.call_later(timeout, _expire, future)
        try:
            sealed = self.auth.seal(subject, payload, self.clock(), reply)
            await self.inner.publish(subject, sealed, reply=reply)
            return await future
        finally:
            timer.cancel()
            self._waiting.pop(token, None)

    async def _on_reply(self, msg: NatsMessage) -> None:
        future = self._waiting.get(msg.subject[len(self._inbox) :])
        if future is None or future.done():
            return  # late, or a second reply: nothing waits for it
        if not msg.data and _no_responders(msg):
            future.set_exception(NoRespondersError())
            return
        data = self._open(msg.subject, msg.data, self._replies)
        if data is not None:  # else dropped (and counted): the request waits on for an authentic reply
            future.set_result(_Opened(self, msg.subject, msg.reply, data))

    def _open(self, subject: str, data: bytes, guard: ReplayGuard, reply: str = "") -> bytes | None:
        now = self.clock()
        try:
            opened = self.auth.open(subject, data, now, guard, reply)
        except AuthError as exc:
            self.dropped[exc.reason] += 1
            _warn.warning(
                "dropped a %s internal message on %s: %s (%d dropped so far)",
                exc.reason,
                subject,
                exc,
                self.dropped.total(),
                key=f"auth:{exc.reason}",
            )
            return None
        self._opened += 1
        if self._opened % _PRUNE_EVERY == 0:
            guard.forget_before(now - self.auth.max_age)
            self._replies.forget_before(now - self.auth.max_age)
        return opened


def _expire(future: asyncio.Future[NatsMessage]) -> None:
    if not future.done():
        future.set_exception(NatsTimeoutError())


def _no_responders(msg: NatsMessage) -> bool:
    """nats-server's status for a request nobody listens to, as nats-py or the lean connection shows it."""
    raw = getattr(msg, "raw_headers", None)
    if raw is not None:
        return bool(raw.startswith(b"NATS/1.0 503"))
    headers = getattr(msg, "headers", None)
    return isinstance(headers, dict) and headers.get("Status") == "503"
