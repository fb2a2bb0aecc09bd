"""Reading a stream partition: :class:`Subscription`, the ``Subscribe`` RPC.

A :class:`Subscription` is what :meth:`Client.subscribe <liftlog.client.Client.subscribe>`
returns: it opens the ``Subscribe`` call on the partition's leader (through
the client's routing and retries), waits for the server's set-up message,
then yields :class:`~liftlog.client.Message` values until the call ends, and
maps the ways a running subscription can end onto errors or a normal end.

Against a liftlog server it asks for batches (``liftlog.api.subscribe_batches``):
the server then sends its stored record batches as they are, and this module
checks and decodes them in bulk (``liftlog.client.batches``) into the same
``Message`` values, in the same order, with the same positions and ends.
Liftbridge servers ignore the request and send one message per record.

A subscription belongs to the event loop of its client. Iterate it from one
task at a time; :meth:`Subscription.close` (or closing the client) may come
from any task of that loop and ends the iteration.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import grpc  # type: ignore[import-untyped, unused-ignore]

from liftlog.api import api_pb2
from liftlog.api.subscribe_batches import BATCHES_HEADER, REQUEST_KEY, delivery_end
from liftlog.client.batches import Columns, decode_batches
from liftlog.client.errors import (
    CorruptDataError,
    DeadlineExceededError,
    FailedPreconditionError,
    LiftlogError,
    NotFoundError,
    PartitionPausedError,
    ReadonlyError,
    StreamDeletedError,
    UnavailableError,
    error_from_rpc,
)
from liftlog.client.stubs import EOF, Stub, being_cancelled
from liftlog.client.types import Message
from liftlog.rpc import RpcError

if TYPE_CHECKING:
    from liftlog.client.client import Client

__all__ = ["Subscription"]

_message_from_proto: Final = Message.from_proto


class Subscription:
    """A subscription to a stream partition: an async iterator of :class:`~liftlog.client.Message`.

    Created by :meth:`Client.subscribe`; nothing is sent until it is started
    by :meth:`started`, by ``async with`` or by the first ``__anext__``.
    Starting routes the request to the partition leader (retrying on
    :class:`NotLeaderError` / :class:`UnavailableError` with refreshed
    metadata) and waits for the server to confirm the subscription; errors
    such as :class:`NoSuchPartitionError` raise there. Iteration ends
    (``StopAsyncIteration``) when the server completes the call (stop
    positions, the end of a readonly partition) or the subscription or client
    is closed; a deleted stream raises :class:`StreamDeletedError`, a paused
    partition :class:`PartitionPausedError`. A running subscription is not
    resumed by itself: when its server goes away it raises
    :class:`UnavailableError`; subscribe again from the last offset + 1.

    Use it as ``async with client.subscribe(...) as sub: async for msg in sub: ...``;
    entering the block waits until the subscription is live, so messages
    published inside it are seen even with ``StartPosition.NEW_ONLY``.
    """

    def __init__(
        self,
        client: Client,
        request: api_pb2.SubscribeRequest,
        *,
        read_uncommitted: bool = False,
        batched: bool = True,
    ) -> None:
        self._client = client
        self._request = request
        # liftlog's own request metadata; Liftbridge servers ignore it (committed messages, one by one).
        metadata: list[tuple[str, str]] = []
        if read_uncommitted:
            metadata.append(("liftlog-read-uncommitted", "true"))
        if batched:
            metadata.append((REQUEST_KEY, "1"))
        self._metadata = tuple(metadata) or None
        #: Whether the server agreed to send batches (its set-up message says so).
        self._batched = False
        #: Decoded messages not yet returned, the next one last.
        self._pending: list[Message] = []
        self._call: Any = None
        self._lock = asyncio.Lock()
        self._done = False  # the call ended, failed or was closed
        self._closed = False

    @property
    def stream(self) -> str:
        """The stream subscribed to."""
        return self._request.stream

    @property
    def partition(self) -> int:
        """The partition subscribed to."""
        return self._request.partition

    @property
    def batched(self) -> bool:
        """Whether the server sends stored record batches (a liftlog server asked for them), once started."""
        return self._batched

    async def started(self) -> None:
        """Start the subscription if needed and wait until the server has set it up.

        Raises the error the server answered with (:class:`NoSuchPartitionError`,
        :class:`NotLeaderError` once retries are exhausted, ...). Returns at
        once when already started or ended.
        """
        if self._call is not None or self._done:
            return
        async with self._lock:
            if self._call is not None or self._done:
                return
            try:
                call = await self._open_call()
            except LiftlogError as err:
                self._done = True
                if err.code == grpc.StatusCode.RESOURCE_EXHAUSTED and err.reason is None:
                    return  # Liftbridge: stop position on an empty partition, end of a readonly one
                raise
            except BaseException:
                self._done = True
                raise
            if call is None:  # the server completed the call before confirming: nothing to read
                self._done = True
                return
            if self._closed:
                call.cancel()
                self._done = True
                return
            self._call = call

    async def _open_call(self) -> Any:
        """Start the Subscribe call on the right server and consume its set-up message.

        Returns the call, or None when the server completed it before
        confirming. A first message that is not the set-up message (a server
        that does not send one) is not expected and is skipped.
        """
        client = self._client
        request = self._request
        client.check_open()

        async def open_call(stub: Stub) -> Any:
            call = stub.subscribe(request, metadata=self._metadata)
            try:
                async with asyncio.timeout(client.timeout):
                    first = await call.read()
            except TimeoutError:
                call.cancel()
                raise DeadlineExceededError(
                    f"{stub.address} did not confirm the subscription to stream {request.stream!r} "
                    f"partition {request.partition} within {client.timeout:g} s"
                ) from None
            except BaseException:
                call.cancel()
                raise
            if first is EOF:
                return None
            self._batched = BATCHES_HEADER in first.headers
            return call

        return await client.call_leader(request.stream, request.partition, open_call, isr=request.readISRReplica)

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        pending = self._pending
        if pending:
            return pending.pop()
        while True:
            msg = await self._read()
            if not self._batched:
                return _message_from_proto(msg)
            pending = self._pending = self._decode(msg)
            if pending:
                return pending.pop()

    def _decode(self, msg: api_pb2.Message) -> list[Message]:
        """The records of one batches message, the first last; a corrupt one ends the subscription."""
        request = self._request
        try:
            cols, _ = decode_batches(
                msg.value,
                msg.offset,
                delivery_end(msg),
                msg.subject,
                out=Columns(request.stream, request.partition),
                headers=True,
                fields=True,
            )
        except (CorruptDataError, ValueError) as exc:
            self._done = True
            call, self._call = self._call, None
            if call is not None:
                call.cancel()
            raise CorruptDataError(
                f"subscription to stream {request.stream!r} partition {request.partition}: {exc}"
            ) from exc
        messages = cols.messages()
        messages.reverse()
        return messages

    async def _read(self) -> api_pb2.Message:
        """The next message of the call; StopAsyncIteration at its end."""
        call = self._call
        if call is None:
            if self._done:
                raise StopAsyncIteration
            await self.started()
            call = self._call
            if call is None:
                raise StopAsyncIteration
        try:
            msg = await call.read()
        except RpcError as exc:
            self._done = True
            self._call = None
            err = self._mid_stream_error(exc)
            if err is None:
                raise StopAsyncIteration from None
            raise err from exc
        except asyncio.CancelledError:
            if (self._closed or self._client.closed) and not being_cancelled():
                self._done = True
                self._call = None
                raise StopAsyncIteration from None
            raise
        if msg is EOF:
            self._done = True
            self._call = None
            raise StopAsyncIteration
        return msg  # type: ignore[no-any-return]

    @staticmethod
    def _mid_stream_error(exc: Any) -> LiftlogError | None:
        """The error that ends a running subscription, or None for a normal end."""
        err = error_from_rpc(exc)
        if isinstance(err, ReadonlyError):  # liftlog: the end of a partition made readonly is a normal end
            return None
        if err.reason is not None:
            return err
        # Liftbridge's codes once a subscription runs (no liftlog-error reason).
        code = err.code
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:  # "Stop offset reached", "End of readonly partition"
            return None
        if code == grpc.StatusCode.CANCELLED:  # by the server (ours raises asyncio.CancelledError): it went away
            return UnavailableError(f"the server cancelled the subscription: {err.message}", code=code)
        if isinstance(err, NotFoundError) and not isinstance(err, StreamDeletedError):
            return StreamDeletedError(err.message, code=code)
        if type(err) is FailedPreconditionError:  # the partition was paused (its log closed)
            return PartitionPausedError(err.message, code=code)
        return err

    async def close(self) -> None:
        """Cancel the subscription; iteration then ends. Idempotent."""
        self._closed = True
        self._done = True
        self._pending = []
        call, self._call = self._call, None
        if call is not None:
            call.cancel()

    async def __aenter__(self) -> Subscription:
        await self.started()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
