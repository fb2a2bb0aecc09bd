"""Publishing to a stream's NATS subject directly, with Liftbridge envelopes.

Any NATS client can publish to a stream's subject: the server stores the raw
payload as the message value. To set a key, headers or ask for an ack, the
payload must be a *Publish* envelope (``liftlog.api.envelope``) holding an
``api_pb2.Message``; the server then publishes the ``Ack`` in an *Ack*
envelope to the message's ack inbox. These helpers build the envelope and
wait for the ack on a nats-py connection, which :func:`connect_nats` opens;
:meth:`liftlog.client.Client.nats_publish` wraps them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence

import nats
import nats.errors
from nats.aio.client import Client as NatsClient

from liftlog.api import api_pb2
from liftlog.api.envelope import EnvelopeError, decode_ack, encode_publish_message
from liftlog.client.errors import AckTimeoutError, LiftlogError, UnavailableError
from liftlog.client.types import AckPolicy

__all__ = ["connect_nats", "encode_publish", "publish_and_wait_ack", "to_bytes", "to_headers"]

_log = logging.getLogger("liftlog.client")


def to_bytes(value: bytes | str) -> bytes:
    """`value` as bytes: a str is UTF-8 encoded."""
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def to_headers(headers: Mapping[str, bytes | str] | None) -> dict[str, bytes]:
    """Header values as bytes (str values are UTF-8 encoded)."""
    if not headers:
        return {}
    return {k: v.encode() if isinstance(v, str) else bytes(v) for k, v in headers.items()}


def encode_publish(
    value: bytes | str,
    *,
    key: bytes | str | None = None,
    headers: Mapping[str, bytes | str] | None = None,
    ack_inbox: str = "",
    correlation_id: str = "",
    ack_policy: AckPolicy = AckPolicy.NONE,
) -> bytes:
    """A Publish envelope carrying the message, to publish on a stream's NATS subject.

    With an `ack_inbox` and an `ack_policy` other than NONE, the server
    publishes the message's Ack (in an Ack envelope) to that inbox.
    """
    msg = api_pb2.Message(
        value=to_bytes(value),
        headers=to_headers(headers),
        ackInbox=ack_inbox,
        correlationId=correlation_id,
        ackPolicy=int(ack_policy),  # type: ignore[arg-type]  # the stubs want the proto enum type
    )
    if key is not None:
        msg.key = to_bytes(key)
    return encode_publish_message(msg)


async def publish_and_wait_ack(
    nc: NatsClient, subject: str, payload: bytes, ack_inbox: str, timeout: float
) -> api_pb2.Ack:
    """Publish `payload` (a Publish envelope naming `ack_inbox`) and wait for its Ack.

    Subscribes to `ack_inbox` before publishing, so the ack cannot be missed.
    Raises :class:`AckTimeoutError` when no ack arrives within `timeout`
    seconds, :class:`UnavailableError` when NATS fails and
    :class:`LiftlogError` when the reply is not an Ack envelope.
    """
    try:
        sub = await nc.subscribe(ack_inbox, max_msgs=1)
    except nats.errors.Error as exc:
        raise UnavailableError(f"NATS subscribe to {ack_inbox} failed: {exc}") from exc
    try:
        try:
            await nc.publish(subject, payload)
            reply = await sub.next_msg(timeout=timeout)
        except nats.errors.TimeoutError as exc:
            raise AckTimeoutError(
                f"no ack on {ack_inbox} within {timeout:g} s for the message published to {subject}"
            ) from exc
        except nats.errors.Error as exc:
            raise UnavailableError(f"NATS publish to {subject} failed: {exc}") from exc
        try:
            return decode_ack(reply.data)
        except EnvelopeError as exc:
            raise LiftlogError(f"the reply on {ack_inbox} is not an Ack envelope: {exc}") from exc
    finally:
        with contextlib.suppress(nats.errors.Error):  # already gone (max_msgs reached, connection closed)
            await sub.unsubscribe()


async def _log_nats_error(exc: Exception) -> None:
    """nats-py's error callback: a debug line instead of its default traceback on stderr."""
    _log.debug("NATS connection error: %s", exc)


async def connect_nats(servers: Sequence[str], *, timeout: float, retries: int, backoff: float) -> NatsClient:
    """Connect to the NATS `servers`, with the client's `timeout` and few, quick reconnection attempts.

    Raises :class:`UnavailableError` when no server can be reached.
    """
    try:
        return await nats.connect(
            servers=list(servers),
            connect_timeout=max(1, round(timeout)),
            max_reconnect_attempts=retries,
            reconnect_time_wait=max(backoff, 0.1),
            error_cb=_log_nats_error,
        )
    except (nats.errors.Error, OSError) as exc:
        raise UnavailableError(f"cannot connect to NATS at {', '.join(servers)}: {exc}") from exc
