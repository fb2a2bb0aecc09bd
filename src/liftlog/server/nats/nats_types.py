"""The NATS boundary of the server, as the Protocols its modules need (nats-py's client satisfies them).

Typed here rather than as ``Any`` so that strict mypy checks the I/O seam,
and so that tests can hand the cores a fake that says what it implements.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from liftlog.natswire import LeanNats

__all__ = ["IntakeNats", "MessageHandler", "NatsClient", "NatsMessage", "NatsSubscription"]


class NatsMessage(Protocol):
    subject: str
    reply: str
    data: bytes

    async def respond(self, data: bytes) -> None: ...


MessageHandler = Callable[[NatsMessage], Awaitable[None]]


class NatsSubscription(Protocol):
    @property
    def pending_msgs(self) -> int:
        """Messages received and not yet handed to the callback."""
        ...

    async def unsubscribe(self, limit: int = 0) -> None: ...

    async def drain(self) -> None: ...


class NatsClient(Protocol):
    @property
    def max_payload(self) -> int:
        """The largest message the connected nats-server takes (from its INFO)."""
        ...

    async def publish(
        self, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None: ...

    async def subscribe(
        self,
        subject: str,
        queue: str = "",
        cb: MessageHandler | None = None,
    ) -> NatsSubscription: ...

    async def request(self, subject: str, payload: bytes = b"", timeout: float = 0.5) -> NatsMessage: ...


if TYPE_CHECKING:
    import nats.aio.client
    import nats.aio.msg
    import nats.aio.subscription

    from liftlog.natswire.client import LeanMessage, LeanNatsClient

    def _the_lean_client_keeps_it_too(client: LeanNatsClient, msg: LeanMessage) -> tuple[NatsClient, NatsMessage]:
        return client, msg

    def _nats_py_keeps_the_contract(
        client: nats.aio.client.Client, msg: nats.aio.msg.Msg, sub: nats.aio.subscription.Subscription
    ) -> tuple[NatsClient, NatsMessage, NatsSubscription]:
        return client, msg, sub


#: Where partitions subscribe: nats-py's client (or a fake), or the lean connection (``subscribe_batches``).
IntakeNats = NatsClient | LeanNats
