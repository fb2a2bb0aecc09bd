"""Routes acks from partitions to whoever waits for them, and only to them.

Rules (each is a promise a publisher relies on):

1. A call waiting in this server (a gRPC Publish, cursor or activity event)
   registers what it waits for with :meth:`AckRouter.expect`: the subject its
   message goes to, its ack policy and, when it names one, its stream. It gets
   this server's private inbox and a fresh route id (128 random bits, signed
   with the cluster secret: ``liftlog.security.ack_routes``). Ids are never
   reused; a second registration of one is refused, never replaces the first.
2. An ack completes a waiter only if its stream, subjects and policy match
   what the waiter registered, and, for a partition this server led when the
   call published, only if this server made it: a replaced leader that has
   not yet learned so (a "zombie") writes and acks the same message at an
   offset of its stale log, and its ack over NATS could win the race with
   ours. Anything else is dropped and counted in ``dropped`` by reason; the
   waiter keeps waiting.
3. An ack for this server's inbox never leaves the process: a local leader
   hands it over directly. An ack for another server's inbox goes out sealed
   on the internal connection, and only if its route id is signed for that
   inbox, subject and policy (a copied id does not let a client have its own
   message acked to someone else's call).
4. An ack for a client's inbox (a plain NATS envelope naming one, or a gRPC
   call that names one: the waiting server forwards its copy) goes out on the
   clients' connection, never sealed, and only to a subject that
   :func:`liftlog.metadata.validate_ack_inbox` (plus the server's own checks,
   ``check_inbox``) accepts. Refused ones are dropped, counted and logged at
   most once per interval. With ``nats.acks.*`` that connection is its own,
   as a NATS user with an application's rights, so NATS enforces the rest.

The inbox and route id are the server's business: answers carry the caller's
own inbox and correlation id (or none), and the leader stores neither with
the record (``liftlog.server.partitions.messages``).

Publishing is batched: ``deliver`` is synchronous (partitions call it from
their write path), so outgoing acks queue up and one task publishes them.

Event-loop only, not thread-safe.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from liftlog.api import api_pb2
from liftlog.api.envelope import EnvelopeError, decode_ack, encode_ack
from liftlog.metadata import SERVER_INBOX_PREFIX, InvalidStreamError
from liftlog.security.ack_routes import RouteIds
from liftlog.server.nats.nats_types import NatsClient, NatsMessage, NatsSubscription
from liftlog.server.ratelimit import LogLimiter

__all__ = ["DROP_REASONS", "AckRouter", "DuplicateRoute", "Expected"]

log = logging.getLogger(__name__)
#: Per-message warnings: whoever can publish on our subjects must not be able to flood the log.
_warn = LogLimiter(log)

Publish = Callable[[str, bytes], Awaitable[None]]
Ack = api_pb2.Ack

#: Why an ack was dropped (the ``reason`` label of liftlog_acks_dropped_total).
NO_WAITER = "no_waiter"  # late (its call gave up) or unknown
OTHER_STREAM = "other_stream"  # another stream on the same subject acked it too: expected, not an attack
MISMATCH = "mismatch"  # the id of a waiter, but another subject or policy
UNSIGNED_ROUTE = "unsigned_route"  # to another server's inbox without a valid signature
REFUSED_INBOX = "refused_inbox"  # a client-named inbox the server may not publish to
FOREIGN_LEADER = "foreign_leader"  # from another server, for a call whose partition was led here
NATS_REFUSED = "nats_refused"  # sent on the acks connection (nats.acks.*), and NATS refused its subject
DROP_REASONS = (NO_WAITER, OTHER_STREAM, MISMATCH, UNSIGNED_ROUTE, REFUSED_INBOX, FOREIGN_LEADER, NATS_REFUSED)


class DuplicateRoute(RuntimeError):
    """A route id registered twice: the second registration is refused (never replaces the first)."""


class Expected(NamedTuple):
    """What a waiting call's ack must say."""

    #: The subject the message was published on (the ack's msgSubject).
    subject: str
    policy: int
    #: The stream it was published for; None: any stream on the subject (PublishToSubject).
    stream: str | None
    #: The caller's own ack inbox and correlation id, which the ack it gets carries (None: neither, for
    #: an ack shared by several callers); with an inbox, the ack is published there too.
    forward: tuple[str, str] | None
    #: The partition was led here when the message was published: only this server's own ack counts.
    local: bool


class AckRouter:
    def __init__(
        self,
        server_id: str,
        route_ids: RouteIds | None = None,
        check_inbox: Callable[[str], None] = lambda inbox: None,
    ) -> None:
        # Private to this process: a restarted server must not get its predecessor's acks.
        self.inbox = f"{SERVER_INBOX_PREFIX}{server_id}.{secrets.token_hex(8)}"
        self._ids = route_ids or RouteIds(None)
        #: Raises InvalidStreamError if the server may not publish an ack to this client-named inbox.
        self.check_inbox = check_inbox
        self._waiters: dict[str, tuple[asyncio.Future[Ack], Expected]] = {}
        self._internal: list[tuple[str, bytes]] = []
        self._external: list[tuple[str, bytes]] = []
        self._wake = asyncio.Event()
        self._publish_internal: Publish | None = None
        self._publish_external: Publish | None = None
        self._sender: asyncio.Task[None] | None = None
        self._sub: NatsSubscription | None = None
        #: Acks dropped, by reason (see the module docstring).
        self.dropped: collections.Counter[str] = collections.Counter()

    async def start(self, internal: NatsClient, clients: Publish | None = None) -> None:
        """Listen on this server's inbox and send other servers' acks through ``internal`` (sealed when the
        cluster has a secret), clients' through ``clients`` (by default ``internal``'s, for tests)."""
        self._publish_internal = internal.publish
        self._publish_external = clients or internal.publish
        self._sender = asyncio.get_running_loop().create_task(self._send_loop(), name="ack sender")
        self._sub = await internal.subscribe(self.inbox, cb=self._on_nats_ack)

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
        for fut, _ in self._waiters.values():
            if not fut.done():
                fut.cancel()
        self._waiters.clear()

    def expect(
        self,
        subject: str,
        policy: int,
        stream: str | None = None,
        forward: tuple[str, str] | None = None,
        *,
        local: bool = False,
    ) -> tuple[str, str, asyncio.Future[Ack]]:
        """(inbox, correlation id, future of the ack) for a message about to be published on ``subject``.

        ``forward``: the caller's own (ack inbox, correlation id), the inbox checked with ``check_inbox``.
        ``local``: this server leads the partition, so its ack comes from here and none over NATS counts.
        """
        correlation_id = self._ids.new(self.inbox, subject, policy)
        if correlation_id in self._waiters:  # 128 random bits: only a broken random source gets here
            raise DuplicateRoute(f"ack route id {correlation_id} is already awaited")
        fut: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        self._waiters[correlation_id] = (fut, Expected(subject, policy, stream, forward, local))
        fut.add_done_callback(lambda f: self._drop_cancelled(correlation_id, f))
        return self.inbox, correlation_id, fut

    def _drop_cancelled(self, correlation_id: str, fut: asyncio.Future[Ack]) -> None:
        # A waiter that gave up (timeout, cancelled call) must not stay in the table.
        entry = self._waiters.get(correlation_id)
        if fut.cancelled() and entry is not None and entry[0] is fut:
            del self._waiters[correlation_id]

    @property
    def waiting(self) -> int:
        """Acks awaited by calls in this server."""
        return len(self._waiters)

    def forget(self, correlation_id: str) -> None:
        entry = self._waiters.pop(correlation_id, None)
        if entry is not None and not entry[0].done():
            entry[0].cancel()

    def deliver(self, ack: Ack) -> None:
        """Route an ack a partition led here made (see the rules in the module docstring)."""
        inbox = ack.ackInbox
        if inbox == self.inbox:
            self._complete(ack, True)
        elif inbox.startswith(SERVER_INBOX_PREFIX):
            if self._server_route(ack):
                self._queue(self._internal, inbox, encode_ack(ack))
            else:
                self.dropped[UNSIGNED_ROUTE] += 1
                _warn.warning(
                    "not acking a message on %s to %s: its route id is not signed by a server of this cluster "
                    "(a client copied a server's inbox into its own envelope?)",
                    ack.msgSubject,
                    inbox,
                    key="unsigned-route",
                )
        else:
            try:
                self.check_inbox(inbox)
            except InvalidStreamError as exc:
                self.dropped[REFUSED_INBOX] += 1
                _warn.warning("stored a message on %s without its ack: %s", ack.msgSubject, exc, key="refused-inbox")
                return
            self._queue(self._external, inbox, encode_ack(ack))

    def refused_by_nats(self, error: str) -> None:
        """NATS refused something sent on the acks connection (``nats.acks.*``): an ack whose inbox the acks
        user may not publish to. Counted, not fatal: that connection has an application's rights on purpose."""
        if "permissions violation" in error.lower():
            self.dropped[NATS_REFUSED] += 1
            _warn.warning("NATS refused an ack to a client's inbox (nats.acks.user): %s", error, key="nats-refused")
        else:
            _warn.warning("NATS (acks connection): %s", error, key="acks-nats-error")

    def _server_route(self, ack: Ack) -> bool:
        """Whether an ack may go to another server's inbox: its route id is signed for it or, without a
        cluster secret (no signatures to check, and anyone on the NATS account can act as a server), the
        inbox at least has a server inbox's shape. Not "a server the metadata knows": a server that is
        joining or leaving still waits for acks its calls are owed."""
        if self._ids.signed:
            return self._ids.valid(ack.correlationId, ack.ackInbox, ack.msgSubject, ack.ackPolicy)
        server_id, _, suffix = ack.ackInbox[len(SERVER_INBOX_PREFIX) :].rpartition(".")
        return bool(server_id) and len(suffix) == 16 and suffix.isalnum()

    def _queue(self, queue: list[tuple[str, bytes]], subject: str, data: bytes) -> None:
        queue.append((subject, data))
        if len(self._internal) + len(self._external) == 1:
            self._wake.set()

    def _complete(self, ack: Ack, here: bool) -> None:
        """Hand ``ack`` (made here, or received over NATS) to its waiter if it matches."""
        entry = self._waiters.get(ack.correlationId)
        if entry is None:
            self.dropped[NO_WAITER] += 1
            return
        fut, expected = entry
        if expected.local and not here:
            self.dropped[FOREIGN_LEADER] += 1
            _warn.warning(
                "dropped an ack from another server for %s/%s, led here when the message was published "
                "(a replaced leader that had not learned it yet?)",
                ack.stream,
                ack.partitionSubject,
                key="foreign-leader",
            )
            return
        if ack.msgSubject != expected.subject or ack.ackPolicy != expected.policy:
            self.dropped[MISMATCH] += 1
            _warn.warning(
                "dropped an ack for %s (policy %d) sent to a call waiting for one for %s (policy %d)",
                ack.msgSubject,
                ack.ackPolicy,
                expected.subject,
                expected.policy,
                key="ack-mismatch",
            )
            return
        if expected.stream is not None and (ack.stream != expected.stream or ack.partitionSubject != expected.subject):
            # Streams sharing a subject each ack what they store; the call waits for its own stream's.
            self.dropped[OTHER_STREAM] += 1
            return
        del self._waiters[ack.correlationId]
        if fut.done():
            return
        # From here on the ack is the caller's: its own inbox and id, or none.
        inbox, ack.correlationId = expected.forward or ("", "")
        ack.ackInbox = inbox
        fut.set_result(ack)
        if inbox:
            self._queue(self._external, inbox, encode_ack(ack))

    async def _on_nats_ack(self, msg: NatsMessage) -> None:
        try:
            ack = decode_ack(msg.data)
        except EnvelopeError as exc:
            _warn.warning("ignoring a malformed ack on %s: %s", msg.subject, exc)
            return
        if ack.ackInbox != self.inbox:
            self.dropped[MISMATCH] += 1
            return
        self._complete(ack, False)

    async def _send_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._flush()

    async def _flush(self) -> None:
        while self._internal or self._external:
            for queue, publish in ((self._internal, self._publish_internal), (self._external, self._publish_external)):
                if not queue or publish is None:
                    continue
                batch = queue[:]
                queue.clear()
                for subject, data in batch:
                    try:
                        await publish(subject, data)
                    except Exception as exc:  # the publisher times out and retries; nothing else to do
                        _warn.warning("could not publish an ack to %s: %s", subject, exc)
            if self._publish_internal is None:
                return
