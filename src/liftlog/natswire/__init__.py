"""NATS's client protocol for the server's hot path: a sans-IO parser and encoders, and a lean asyncio connection."""

from .connection import (
    BatchHandler,
    LeanNats,
    LeanSubscription,
    MaxPayloadError,
    NatsAuthError,
    NatsConnectError,
    NatsNotConnected,
    parse_servers,
)
from .protocol import Event, NatsParser, NatsProtocolError

__all__ = [
    "BatchHandler",
    "Event",
    "LeanNats",
    "LeanSubscription",
    "MaxPayloadError",
    "NatsAuthError",
    "NatsConnectError",
    "NatsNotConnected",
    "NatsParser",
    "NatsProtocolError",
    "parse_servers",
]
