"""The NATS client the server's internal traffic uses when a cluster secret is configured.

It wraps the real client: messages on internal subjects (the cluster
namespace ``<ns>.>`` and the servers' private ack inboxes ``_INBOX.liftlog.>``)
are sealed when published and opened when received (``liftlog.security.
cluster_auth``); replies to internal requests are sealed and checked too.
Whatever fails is dropped, counted in ``dropped`` by reason, and logged at
most once per interval per reason. Every other subject (stream subjects,
clients' ack inboxes) passes through unchanged, so clients never see a
trailer.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

from nats.errors import TimeoutError as NatsTimeoutError

from liftlog.metadata.names import SERVER_INBOX_PREFIX
from liftlog.security.cluster_auth import TRAILER_SIZE, AuthError, ClusterAuth, ReplayGuard

from .nats_types import MessageHandler, NatsClient, NatsMessage, NatsSubscription
from .ratelimit import LogLimiter

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
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.inner = inner
        self.auth = auth
        self.clock = clock
        self._is_internal = is_internal
        self._replies = ReplayGuard()
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
            payload = self.auth.seal(subject, payload, self.clock())
        await self.inner.publish(subject, payload, reply=reply, headers=headers)

    async def subscribe(self, subject: str, queue: str = "", cb: MessageHandler | None = None) -> NatsSubscription:
        if not self._is_internal(subject):
            return await self.inner.subscribe(subject, queue=queue, cb=cb)
        if cb is None:  # messages taken without a callback would skip the check
            raise ValueError(f"an internal subscription ({subject}) needs a callback: its messages are checked there")
        guard = ReplayGuard()  # per subscription: its messages arrive in order, others' need not
        handler = cb

        async def opened(msg: NatsMessage) -> None:
            data = self._open(msg.subject, msg.data, guard)
            if data is not None:
                await handler(_Opened(self, msg.subject, msg.reply, data))

        return await self.inner.subscribe(subject, queue=queue, cb=opened)

    async def request(self, subject: str, payload: bytes = b"", timeout: float = 0.5) -> NatsMessage:
        if not self._is_internal(subject):
            return await self.inner.request(subject, payload, timeout=timeout)
        reply = await self.inner.request(subject, self.auth.seal(subject, payload, self.clock()), timeout=timeout)
        data = self._open(reply.subject, reply.data, self._replies)
        if data is None:
            # As if no answer came: callers already retry after a timeout.
            raise NatsTimeoutError
        return _Opened(self, reply.subject, reply.reply, data)

    def _open(self, subject: str, data: bytes, guard: ReplayGuard) -> bytes | None:
        now = self.clock()
        try:
            opened = self.auth.open(subject, data, now, guard)
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
