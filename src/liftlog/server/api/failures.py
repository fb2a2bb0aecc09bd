"""RPC failures: a status code, liftlog's reason and a message, and how each reaches a client."""

from __future__ import annotations

from typing import NoReturn

from liftlog.api import api_pb2
from liftlog.api.errors import ERROR_KEY, Reason
from liftlog.metadata import (
    MetadataError,
    NoSuchGroupError,
    NoSuchPartitionError,
    NoSuchStreamError,
    RefusedError,
    StreamExistsError,
)
from liftlog.rpc import ServerContext, StatusCode
from liftlog.server.control.cluster import (
    ChangeNotAppliedError,
    ChangeOutcomeUnknownError,
    ControllerFailedError,
    NoMetadataLeaderError,
)
from liftlog.storage.encryption import EncryptionError

__all__ = ["RpcFailure", "abort_with", "async_error", "failure_from"]

Code = StatusCode
PAE = api_pb2.PublishAsyncError


class RpcFailure(Exception):
    """An RPC error: status code, liftlog reason and a message for people."""

    def __init__(self, code: StatusCode, reason: Reason, message: str) -> None:
        self.code = code
        self.reason = reason
        self.message = message
        super().__init__(message)


_ASYNC_CODES = {
    Reason.NO_SUCH_STREAM: PAE.NOT_FOUND,
    Reason.NO_SUCH_PARTITION: PAE.NOT_FOUND,
    Reason.READONLY: PAE.READONLY,
    Reason.INCORRECT_OFFSET: PAE.INCORRECT_OFFSET,
    Reason.TOO_LARGE: PAE.BAD_REQUEST,
    Reason.INVALID_ARGUMENT: PAE.BAD_REQUEST,
    Reason.INTERNAL: PAE.INTERNAL,
    Reason.PERMISSION_DENIED: PAE.PERMISSION_DENIED,
    Reason.ENCRYPTION: PAE.ENCRYPTION_FAILED,
}


def encryption_failure(stream: str, partition: int, exc: EncryptionError) -> RpcFailure:
    """A read of an encrypted partition this server cannot decrypt: which key it lacks, or what failed."""
    return RpcFailure(Code.INTERNAL, Reason.ENCRYPTION, f"stream {stream!r} partition {partition}: {exc}")


def failure_from(exc: MetadataError) -> RpcFailure:
    if isinstance(exc, NoMetadataLeaderError):
        # Liftbridge's code and wording (its clients know them); nothing was committed.
        return RpcFailure(Code.INTERNAL, Reason.INTERNAL, str(exc))
    # A change that is committed but not yet acted on here, or whose commit is uncertain: gRPC defines
    # DEADLINE_EXCEEDED as "may be returned even if the operation has completed", and neither Liftbridge's
    # clients (go-liftbridge's doResilientRPC) nor ours retry it, as they do UNAVAILABLE: a blind retry of
    # CreateStream would meet the stream it created and report ALREADY_EXISTS.
    if isinstance(exc, ChangeNotAppliedError):
        return RpcFailure(Code.DEADLINE_EXCEEDED, Reason.NOT_APPLIED, str(exc))
    if isinstance(exc, ChangeOutcomeUnknownError):
        return RpcFailure(Code.DEADLINE_EXCEEDED, Reason.OUTCOME_UNKNOWN, str(exc))
    if isinstance(exc, ControllerFailedError):
        return RpcFailure(Code.INTERNAL, Reason.INTERNAL, str(exc))
    if isinstance(exc, StreamExistsError):
        return RpcFailure(Code.ALREADY_EXISTS, Reason.STREAM_EXISTS, str(exc))
    if isinstance(exc, NoSuchPartitionError):
        return RpcFailure(Code.NOT_FOUND, Reason.NO_SUCH_PARTITION, str(exc))
    if isinstance(exc, NoSuchGroupError):
        return RpcFailure(Code.NOT_FOUND, Reason.NO_SUCH_GROUP, str(exc))
    if isinstance(exc, NoSuchStreamError):
        return RpcFailure(Code.NOT_FOUND, Reason.NO_SUCH_STREAM, str(exc))
    if isinstance(exc, RefusedError):
        return RpcFailure(Code.FAILED_PRECONDITION, Reason.REFUSED, str(exc))
    return RpcFailure(Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, str(exc))


async def abort_with(ctx: ServerContext, failure: RpcFailure) -> NoReturn:
    await ctx.abort(failure.code, failure.message, trailing_metadata=((ERROR_KEY, failure.reason.value),))
    raise AssertionError("unreachable")  # pragma: no cover  (abort raises)


def async_error(cid: str, failure: RpcFailure) -> bytes:
    """The encoded PublishResponse that answers a PublishAsync request with ``failure``."""
    code = _ASYNC_CODES.get(failure.reason, PAE.UNKNOWN)
    return api_pb2.PublishResponse(
        correlationId=cid, asyncError=api_pb2.PublishAsyncError(code=code, message=failure.message)
    ).SerializeToString()
