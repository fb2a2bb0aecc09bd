"""The client's exceptions, and how failed RPCs map onto them.

Every error a :class:`~liftlog.client.Client` method raises is a
:class:`LiftlogError`. A liftlog server names the cause of a failed RPC in the
``liftlog-error`` trailing-metadata entry (:class:`~liftlog.api.errors.Reason`),
which :func:`error_from_rpc` maps first; for servers that do not send it
(Liftbridge) it falls back to the gRPC status code and Liftbridge's message
wording (for example ``Server not partition leader``).

The hierarchy::

    LiftlogError
    ├── StreamExistsError
    ├── NotFoundError
    │   ├── NoSuchStreamError
    │   ├── NoSuchPartitionError
    │   └── StreamDeletedError
    ├── FailedPreconditionError
    │   ├── NotLeaderError
    │   ├── ReadonlyError
    │   ├── PartitionPausedError
    │   └── IncorrectOffsetError
    ├── InvalidArgumentError (also ValueError)
    │   ├── MessageTooLargeError
    │   └── OffsetOutOfRangeError
    ├── DeadlineExceededError (also TimeoutError)
    │   └── AckTimeoutError
    ├── UnavailableError
    ├── UnimplementedError
    ├── LimitExceededError
    ├── PermissionDeniedError
    ├── InternalError
    ├── CorruptDataError
    ├── ConfigurationError (also ValueError)
    ├── ClientClosedError
    └── PublishAsyncFailed: one PublishAsync message refused; each raised
        instance is also the specific class above (ReadonlyError, ...)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

import grpc  # type: ignore[import-untyped, unused-ignore]

from liftlog.api import api_pb2
from liftlog.api.errors import ERROR_KEY, NOT_LEADER_MESSAGE, Reason
from liftlog.rpc import RpcError, TlsFailure

if TYPE_CHECKING:
    from liftlog.client.types import Ack

__all__ = [
    "AckTimeoutError",
    "ClientClosedError",
    "ConfigurationError",
    "CorruptDataError",
    "DeadlineExceededError",
    "EncryptionFailedError",
    "FailedPreconditionError",
    "IncorrectOffsetError",
    "InternalError",
    "InvalidArgumentError",
    "LiftlogError",
    "LimitExceededError",
    "MessageTooLargeError",
    "NoSuchPartitionError",
    "NoSuchStreamError",
    "NotFoundError",
    "NotLeaderError",
    "OffsetOutOfRangeError",
    "PartitionPausedError",
    "PermissionDeniedError",
    "PublishAsyncEncryptionError",
    "PublishAsyncFailed",
    "ReadonlyError",
    "StreamDeletedError",
    "StreamExistsError",
    "UnavailableError",
    "UnimplementedError",
    "as_publish_failure",
    "error_from_ack",
    "error_from_async_error",
    "error_from_rpc",
]


class LiftlogError(Exception):
    """Base of every error the client raises.

    ``code`` is the gRPC status code of the failed RPC and ``reason`` the
    liftlog server's machine-readable cause; either is None when unknown (a
    Liftbridge server sends no reason; client-side errors have no code).
    """

    code: grpc.StatusCode | None
    reason: Reason | None

    def __init__(self, message: str = "", *, code: grpc.StatusCode | None = None, reason: Reason | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason

    @property
    def message(self) -> str:
        """The error message (the server's, for a failed RPC)."""
        return str(self.args[0]) if self.args else ""


class StreamExistsError(LiftlogError):
    """A stream with this name already exists (ALREADY_EXISTS)."""


class NotFoundError(LiftlogError):
    """Something named in the request does not exist (NOT_FOUND)."""


class NoSuchStreamError(NotFoundError):
    """The stream does not exist."""


class NoSuchPartitionError(NotFoundError):
    """The stream or its partition does not exist."""


class StreamDeletedError(NotFoundError):
    """The stream was deleted while subscribed to it."""


class FailedPreconditionError(LiftlogError):
    """The request cannot be served in the partition's current state (FAILED_PRECONDITION)."""


class NotLeaderError(FailedPreconditionError):
    """The server is not the partition's leader; the client re-routes and retries these."""


class ReadonlyError(FailedPreconditionError):
    """The partition is readonly."""


class PartitionPausedError(FailedPreconditionError):
    """The partition is paused (or was paused while subscribed)."""


class IncorrectOffsetError(FailedPreconditionError):
    """The expected offset was not the partition's next offset (optimistic concurrency control)."""


class InvalidArgumentError(LiftlogError, ValueError):
    """The request is invalid (INVALID_ARGUMENT)."""


class MessageTooLargeError(InvalidArgumentError):
    """The message is larger than the server accepts."""


class OffsetOutOfRangeError(InvalidArgumentError):
    """The offset is outside the partition's log: removed by retention, or past its end (OUT_OF_RANGE)."""


class DeadlineExceededError(LiftlogError, TimeoutError):
    """The RPC did not complete before its deadline (DEADLINE_EXCEEDED)."""


class AckTimeoutError(DeadlineExceededError):
    """A published message was not acknowledged in time (it may still have been written)."""


class UnavailableError(LiftlogError):
    """No server could be reached, or it cannot serve now (UNAVAILABLE); retried by the client."""


class TlsError(LiftlogError):
    """A TLS connection could not be set up: an untrusted, expired or misnamed certificate, a server that
    wants a client certificate, or one side speaking plain text. Not retried: it needs a fix, not time."""


class UnimplementedError(LiftlogError):
    """The server does not implement this RPC (UNIMPLEMENTED)."""


class LimitExceededError(LiftlogError):
    """A server limit was reached (RESOURCE_EXHAUSTED, e.g. too many subscriptions); the message names the setting."""


class PermissionDeniedError(LiftlogError):
    """The server refused the request for lack of permission (PERMISSION_DENIED)."""


class InternalError(LiftlogError):
    """The server failed internally (INTERNAL)."""


class EncryptionFailedError(InternalError):
    """The server cannot encrypt or decrypt an encrypted stream's messages (no master key, or not the one
    the data needs); the message says which. Nothing was written or delivered."""


class CorruptDataError(LiftlogError):
    """Fetched record batches failed their CRC or structure check (client-side: nothing was decoded from them)."""


class ConfigurationError(LiftlogError, ValueError):
    """The client is not configured for this call (for example no NATS servers for ``nats_publish``)."""


class ClientClosedError(LiftlogError):
    """The client was closed."""


class PublishAsyncFailed(LiftlogError):
    """A message sent with PublishAsync (``Client.publish_many``) was refused.

    Raised as a subclass that is also the specific error (``ReadonlyError``,
    ``IncorrectOffsetError``, ``NoSuchStreamError``, ``InvalidArgumentError``,
    ...), so either can be caught. ``async_code`` is the
    ``PublishAsyncError.Code``, ``correlation_id`` the refused request's and
    ``acks`` the acks received before the failure, in input order.
    """

    async_code: int
    correlation_id: str
    acks: list[Ack]

    def __init__(
        self,
        message: str = "",
        *,
        async_code: int = api_pb2.PublishAsyncError.UNKNOWN,
        correlation_id: str = "",
        acks: Iterable[Ack] = (),
        code: grpc.StatusCode | None = None,
        reason: Reason | None = None,
    ) -> None:
        super().__init__(message, code=code, reason=reason)
        self.async_code = async_code
        self.correlation_id = correlation_id
        self.acks = list(acks)


class PublishAsyncUnknownError(PublishAsyncFailed):
    """PublishAsyncError UNKNOWN."""


class PublishAsyncInvalidArgumentError(PublishAsyncFailed, InvalidArgumentError):
    """PublishAsyncError BAD_REQUEST."""


class PublishAsyncTooLargeError(PublishAsyncFailed, MessageTooLargeError):
    """PublishAsyncError BAD_REQUEST: the message is too large."""


class PublishAsyncNoSuchStreamError(PublishAsyncFailed, NoSuchStreamError):
    """PublishAsyncError NOT_FOUND: no such stream."""


class PublishAsyncNoSuchPartitionError(PublishAsyncFailed, NoSuchPartitionError):
    """PublishAsyncError NOT_FOUND: no such partition."""


class PublishAsyncInternalError(PublishAsyncFailed, InternalError):
    """PublishAsyncError INTERNAL."""


class PublishAsyncReadonlyError(PublishAsyncFailed, ReadonlyError):
    """PublishAsyncError READONLY."""


class PublishAsyncIncorrectOffsetError(PublishAsyncFailed, IncorrectOffsetError):
    """PublishAsyncError INCORRECT_OFFSET."""


class PublishAsyncPermissionDeniedError(PublishAsyncFailed, PermissionDeniedError):
    """PublishAsyncError PERMISSION_DENIED."""


class PublishAsyncEncryptionError(PublishAsyncFailed, EncryptionFailedError):
    """PublishAsyncError ENCRYPTION_FAILED."""


_REASON_CLASSES: Final[dict[Reason, type[LiftlogError]]] = {
    Reason.STREAM_EXISTS: StreamExistsError,
    Reason.NO_SUCH_STREAM: NoSuchStreamError,
    Reason.NO_SUCH_PARTITION: NoSuchPartitionError,
    Reason.NO_SUCH_GROUP: NotFoundError,
    Reason.NOT_LEADER: NotLeaderError,
    Reason.READONLY: ReadonlyError,
    Reason.PAUSED: PartitionPausedError,
    Reason.INCORRECT_OFFSET: IncorrectOffsetError,
    Reason.REFUSED: FailedPreconditionError,
    Reason.TOO_LARGE: MessageTooLargeError,
    Reason.INVALID_ARGUMENT: InvalidArgumentError,
    Reason.OUT_OF_RANGE: OffsetOutOfRangeError,
    Reason.ACK_TIMEOUT: AckTimeoutError,
    Reason.NOT_APPLIED: DeadlineExceededError,
    Reason.OUTCOME_UNKNOWN: DeadlineExceededError,
    Reason.STREAM_DELETED: StreamDeletedError,
    Reason.UNAVAILABLE: UnavailableError,
    Reason.UNIMPLEMENTED: UnimplementedError,
    Reason.LIMIT_EXCEEDED: LimitExceededError,
    Reason.INTERNAL: InternalError,
    Reason.PERMISSION_DENIED: PermissionDeniedError,
    Reason.ENCRYPTION: EncryptionFailedError,
}

_CODE_CLASSES: Final[dict[grpc.StatusCode, type[LiftlogError]]] = {
    grpc.StatusCode.ALREADY_EXISTS: StreamExistsError,
    grpc.StatusCode.NOT_FOUND: NoSuchStreamError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgumentError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.UNIMPLEMENTED: UnimplementedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.UNAUTHENTICATED: PermissionDeniedError,
    grpc.StatusCode.INTERNAL: InternalError,
    grpc.StatusCode.DATA_LOSS: InternalError,
}


def _one_line(text: str | None) -> str:
    return " ".join(text.split()) if text else ""


#: grpcio's codes by number: the client's errors carry ``grpc.StatusCode``, as they always have.
_GRPC_CODES: Final = {code.value[0]: code for code in grpc.StatusCode}


def _status_of(exc: Any) -> tuple[grpc.StatusCode, str | None, Iterable[tuple[str, str | bytes]] | None]:
    """Code (a ``grpc.StatusCode``), details and trailing metadata of a failed call.

    Our transport raises :class:`liftlog.rpc.RpcError`; a ``grpc.aio.AioRpcError`` is read too.
    """
    if isinstance(exc, RpcError):
        return _GRPC_CODES.get(int(exc.code), grpc.StatusCode.UNKNOWN), exc.message, exc.trailing_metadata
    try:
        metadata = exc.trailing_metadata()
    except Exception:  # a hand-made AioRpcError may lack it
        metadata = None
    return exc.code(), exc.details(), metadata


def _reason_of(metadata: Iterable[tuple[str, str | bytes]] | None) -> Reason | None:
    """The ``liftlog-error`` trailing-metadata value of a failed call, if any."""
    if not metadata:
        return None
    for key, value in metadata:
        if key == ERROR_KEY:
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            try:
                return Reason(value)
            except ValueError:  # a reason newer than this client: use the status code
                return None
    return None


def _class_from_status(code: grpc.StatusCode, message: str) -> type[LiftlogError]:
    """Liftbridge's statuses: the code, refined by its message wording."""
    lowered = message.lower()
    if code == grpc.StatusCode.NOT_FOUND:
        if "deleted" in lowered:
            return StreamDeletedError
        if "partition" in lowered:
            return NoSuchPartitionError
        return NoSuchStreamError
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        # "Server not partition leader" (NOT_LEADER_MESSAGE), "... should be sent to partition leader", ...
        if NOT_LEADER_MESSAGE.lower() in lowered or "partition leader" in lowered:
            return NotLeaderError
        if "no such partition" in lowered:
            return NoSuchPartitionError
        if "incorrect offset" in lowered:
            return IncorrectOffsetError
        if "readonly" in lowered or "read-only" in lowered:
            return ReadonlyError
        if "paused" in lowered:
            return PartitionPausedError
        return FailedPreconditionError
    if code == grpc.StatusCode.INVALID_ARGUMENT and "too large" in lowered:
        return MessageTooLargeError
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in lowered:
        return MessageTooLargeError  # a request over the server's rpc.max.message.bytes
    return _CODE_CLASSES.get(code, LiftlogError)


def error_from_rpc(exc: Any, *, timeout_error: type[DeadlineExceededError] = DeadlineExceededError) -> LiftlogError:
    """Map a failed RPC (a :class:`liftlog.rpc.RpcError`) to a :class:`LiftlogError`.

    The ``liftlog-error`` trailing-metadata reason decides when present;
    otherwise the status code and the message's wording do. The exception's
    message is the server's, on one line. A DEADLINE_EXCEEDED without a reason
    becomes `timeout_error` (the client passes :class:`AckTimeoutError` for
    publishes).
    """
    code, details, metadata = _status_of(exc)
    message = _one_line(details) or (code.name if code is not None else "RPC failed")
    if isinstance(exc, TlsFailure):
        return TlsError(message, code=code)
    reason = _reason_of(metadata)
    cls: type[LiftlogError]
    if reason is not None:
        cls = _REASON_CLASSES[reason]
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        cls = timeout_error
    else:
        cls = _class_from_status(code, message)
    return cls(message, code=code, reason=reason)


_ASYNC_CLASSES: Final[dict[int, type[PublishAsyncFailed]]] = {
    api_pb2.PublishAsyncError.UNKNOWN: PublishAsyncUnknownError,
    api_pb2.PublishAsyncError.BAD_REQUEST: PublishAsyncInvalidArgumentError,
    api_pb2.PublishAsyncError.NOT_FOUND: PublishAsyncNoSuchStreamError,
    api_pb2.PublishAsyncError.INTERNAL: PublishAsyncInternalError,
    api_pb2.PublishAsyncError.READONLY: PublishAsyncReadonlyError,
    api_pb2.PublishAsyncError.INCORRECT_OFFSET: PublishAsyncIncorrectOffsetError,
    api_pb2.PublishAsyncError.ENCRYPTION_FAILED: PublishAsyncEncryptionError,
    api_pb2.PublishAsyncError.PERMISSION_DENIED: PublishAsyncPermissionDeniedError,
}


def error_from_async_error(
    error: api_pb2.PublishAsyncError, correlation_id: str = "", acks: Iterable[Ack] = ()
) -> PublishAsyncFailed:
    """Map the ``asyncError`` of a PublishAsync response to a :class:`PublishAsyncFailed`.

    The class is picked by the error code (READONLY gives a
    :class:`ReadonlyError`, INCORRECT_OFFSET an :class:`IncorrectOffsetError`,
    NOT_FOUND a :class:`NoSuchStreamError` or :class:`NoSuchPartitionError`,
    BAD_REQUEST an :class:`InvalidArgumentError`, ...).
    """
    code = error.code
    message = _one_line(error.message) or api_pb2.PublishAsyncError.Code.Name(code)
    lowered = message.lower()
    cls = _ASYNC_CLASSES.get(code, PublishAsyncUnknownError)
    if code == api_pb2.PublishAsyncError.NOT_FOUND and "partition" in lowered:
        cls = PublishAsyncNoSuchPartitionError
    elif code == api_pb2.PublishAsyncError.BAD_REQUEST and "too large" in lowered:
        cls = PublishAsyncTooLargeError
    return cls(message, async_code=code, correlation_id=correlation_id, acks=acks)


_AS_PUBLISH_FAILURE: Final[tuple[tuple[type[LiftlogError], type[PublishAsyncFailed], int], ...]] = (
    (MessageTooLargeError, PublishAsyncTooLargeError, api_pb2.PublishAsyncError.BAD_REQUEST),
    (InvalidArgumentError, PublishAsyncInvalidArgumentError, api_pb2.PublishAsyncError.BAD_REQUEST),
    (ReadonlyError, PublishAsyncReadonlyError, api_pb2.PublishAsyncError.READONLY),
    (IncorrectOffsetError, PublishAsyncIncorrectOffsetError, api_pb2.PublishAsyncError.INCORRECT_OFFSET),
    (NoSuchPartitionError, PublishAsyncNoSuchPartitionError, api_pb2.PublishAsyncError.NOT_FOUND),
    (NoSuchStreamError, PublishAsyncNoSuchStreamError, api_pb2.PublishAsyncError.NOT_FOUND),
    (PermissionDeniedError, PublishAsyncPermissionDeniedError, api_pb2.PublishAsyncError.PERMISSION_DENIED),
    (EncryptionFailedError, PublishAsyncEncryptionError, api_pb2.PublishAsyncError.ENCRYPTION_FAILED),
    (InternalError, PublishAsyncInternalError, api_pb2.PublishAsyncError.INTERNAL),
)


def as_publish_failure(err: LiftlogError, acks: Iterable[Ack] = ()) -> LiftlogError:
    """A refusal of a batched publish as the :class:`PublishAsyncFailed` ``publish_many`` raises for it.

    Errors that are not a refusal of the messages (NotLeader, Unavailable, deadlines) come back as they are.
    """
    for cls, failure_cls, async_code in _AS_PUBLISH_FAILURE:
        if isinstance(err, cls):
            return failure_cls(err.message, async_code=async_code, acks=acks, code=err.code, reason=err.reason)
    return err


_ACK_ERROR_MESSAGES: Final[dict[int, tuple[type[LiftlogError], str]]] = {
    api_pb2.Ack.INCORRECT_OFFSET: (
        IncorrectOffsetError,
        "incorrect offset: the expected offset was not the next offset",
    ),
    api_pb2.Ack.TOO_LARGE: (MessageTooLargeError, "message too large"),
    api_pb2.Ack.ENCRYPTION: (
        EncryptionFailedError,
        "message encryption failed: the partition's leader has no encryption master key (its log says more)",
    ),
}


def error_from_ack(ack: api_pb2.Ack) -> LiftlogError | None:
    """The error an ``Ack`` reports in ``ackError``, or None when it is OK."""
    if ack.ackError == api_pb2.Ack.OK:
        return None
    cls, message = _ACK_ERROR_MESSAGES.get(ack.ackError, (LiftlogError, "message refused by the server"))
    return cls(f"{message} (stream {ack.stream!r}, correlation id {ack.correlationId!r})")
