"""gRPC status codes and the error a handler raises to end its call with one.

The numbers are gRPC's (``grpc/status.h``); they travel as ``grpc-status`` in
the trailers. Handlers raise :class:`RpcError` (``context.abort`` does it for
them); anything else a handler raises ends the call with UNKNOWN.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

__all__ = ["Metadata", "RpcError", "StatusCode"]

#: Request or trailing metadata: (key, value) pairs; values of ``-bin`` keys are bytes.
Metadata = Sequence[tuple[str, str | bytes]]


class StatusCode(enum.IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class RpcError(Exception):
    """Ends a call with ``code``, ``message`` (sent as ``grpc-message``) and trailing metadata."""

    def __init__(self, code: StatusCode, message: str = "", trailing_metadata: Metadata = ()) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.trailing_metadata = tuple(trailing_metadata)


class TlsFailure(RpcError):
    """A connection whose TLS could not be set up (UNAVAILABLE): the message says which check failed and
    what to change. Retrying does not help."""

    def __init__(self, message: str) -> None:
        super().__init__(StatusCode.UNAVAILABLE, message)
