"""The asyncio client: stream administration, publishing, subscriptions, metadata.

One :class:`Client` talks gRPC (``proto.API``) to a liftlog or Liftbridge
cluster. It keeps one channel per server address, learns the servers and the
partition leaders from ``FetchMetadata`` and sends partition requests
(publish, subscribe, partition metadata) to the leader. Everything else goes
to any server, failing over to the next address when one is unavailable.

Retries: requests that fail with :class:`UnavailableError` or
:class:`NotLeaderError` are retried up to ``retries`` times with exponential
backoff, refreshing the metadata in between; other errors are raised at once.
Publishing is therefore *at least once*: a publish retried after the server
became unavailable may have been written the first time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import weakref
import zlib
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any, Final, TypeVar

import grpc  # type: ignore[import-untyped, unused-ignore]
import grpc.aio  # type: ignore[import-untyped, unused-ignore]
import nats
import nats.errors
from nats.aio.client import Client as NatsClient

from liftlog.api import api_pb2
from liftlog.client.errors import (
    AckTimeoutError,
    ClientClosedError,
    ConfigurationError,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    LiftlogError,
    NoSuchPartitionError,
    NoSuchStreamError,
    NotFoundError,
    NotLeaderError,
    PartitionPausedError,
    PublishAsyncFailed,
    ReadonlyError,
    StreamDeletedError,
    StreamExistsError,
    UnavailableError,
    error_from_ack,
    error_from_async_error,
    error_from_rpc,
)
from liftlog.client.nats_helpers import encode_publish, publish_and_wait_ack, to_bytes, to_headers
from liftlog.client.types import (
    Ack,
    AckPolicy,
    Message,
    Metadata,
    PartitionInfo,
    StartPosition,
    StopPosition,
    StreamInfo,
)

__all__ = ["Client", "Subscription"]

T = TypeVar("T")

_MAX_MESSAGE_BYTES: Final = 64 << 20
_CHANNEL_OPTIONS: Final = (
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
)
_EOF: Final[Any] = grpc.aio.EOF
_message_from_proto: Final = Message.from_proto


_log = logging.getLogger("liftlog.client")


async def _log_nats_error(exc: Exception) -> None:
    """nats-py's error callback: a debug line instead of its default traceback on stderr."""
    _log.debug("NATS connection error: %s", exc)


def _request_writer(call: Any) -> Callable[[api_pb2.PublishRequest], Awaitable[None]]:
    """A ``write`` for a stream-request call that keeps the server's status when the server ends the call.

    ``grpc.aio``'s own ``call.write`` turns a send that fails because the
    server has just ended the call (say, refusing it as not the leader) into
    a local INTERNAL "Internal error from Core" status, losing the server's
    code and trailing metadata. This writer does what ``call.write`` does,
    minus that: a failed send raises ``asyncio.InvalidStateError`` and the
    reader gets the real status. It uses private attributes of grpc.aio's
    call; when they are missing it falls back to ``call.write``.
    """
    metadata_sent = getattr(call, "_metadata_sent", None)
    send = getattr(getattr(call, "_cython_call", None), "send_serialized_message", None)
    if metadata_sent is None or send is None:
        fallback: Callable[[api_pb2.PublishRequest], Awaitable[None]] = call.write
        return fallback

    async def write(request: api_pb2.PublishRequest) -> None:
        if call.done():
            raise asyncio.InvalidStateError("the call has ended")
        if not metadata_sent.is_set():
            await metadata_sent.wait()
            if call.done():
                raise asyncio.InvalidStateError("the call has ended")
        data = request.SerializeToString()
        try:
            await send(data)
        except asyncio.CancelledError:
            call.cancel()
            raise
        except Exception as exc:  # cygrpc.InternalError: the call ended under us; the reader reports why
            raise asyncio.InvalidStateError("the call has ended") from exc

    return write


def _being_cancelled() -> bool:
    """Whether the current task was asked to cancel (rather than a call it awaited being cancelled)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _task_error(task: asyncio.Task[Any]) -> BaseException | None:
    """The exception `task` ended with, if it is done and neither succeeded nor was cancelled."""
    if not task.done() or task.cancelled():
        return None
    return task.exception()


class _Stub:
    """The ``proto.API`` methods used by the client, bound to one channel.

    Built by hand rather than with ``api_pb2_grpc.APIStub`` (whose
    constructor is untyped) so each multicallable is created once per channel.
    """

    __slots__ = (
        "address",
        "channel",
        "create_stream",
        "delete_stream",
        "fetch_metadata",
        "fetch_partition_metadata",
        "pause_stream",
        "publish",
        "publish_async",
        "publish_to_subject",
        "set_stream_readonly",
        "subscribe",
    )

    def __init__(self, address: str, channel: Any) -> None:
        self.address = address
        self.channel = channel

        def unary(method: str, req: Any, resp: Any) -> Any:
            return channel.unary_unary(
                f"/proto.API/{method}", request_serializer=req.SerializeToString, response_deserializer=resp.FromString
            )

        self.create_stream = unary("CreateStream", api_pb2.CreateStreamRequest, api_pb2.CreateStreamResponse)
        self.delete_stream = unary("DeleteStream", api_pb2.DeleteStreamRequest, api_pb2.DeleteStreamResponse)
        self.pause_stream = unary("PauseStream", api_pb2.PauseStreamRequest, api_pb2.PauseStreamResponse)
        self.set_stream_readonly = unary(
            "SetStreamReadonly", api_pb2.SetStreamReadonlyRequest, api_pb2.SetStreamReadonlyResponse
        )
        self.fetch_metadata = unary("FetchMetadata", api_pb2.FetchMetadataRequest, api_pb2.FetchMetadataResponse)
        self.fetch_partition_metadata = unary(
            "FetchPartitionMetadata", api_pb2.FetchPartitionMetadataRequest, api_pb2.FetchPartitionMetadataResponse
        )
        self.publish = unary("Publish", api_pb2.PublishRequest, api_pb2.PublishResponse)
        self.publish_to_subject = unary(
            "PublishToSubject", api_pb2.PublishToSubjectRequest, api_pb2.PublishToSubjectResponse
        )
        self.subscribe = channel.unary_stream(
            "/proto.API/Subscribe",
            request_serializer=api_pb2.SubscribeRequest.SerializeToString,
            response_deserializer=api_pb2.Message.FromString,
        )
        self.publish_async = channel.stream_stream(
            "/proto.API/PublishAsync",
            request_serializer=api_pb2.PublishRequest.SerializeToString,
            response_deserializer=api_pb2.PublishResponse.FromString,
        )


@dataclass(slots=True)
class _CachedStream:
    info: StreamInfo
    fetched_at: float  # loop time


class _Batch:
    """What one ``publish_many`` has read from its input and what is still unacknowledged.

    It outlives a failed PublishAsync call: a retry resends ``pending``, then
    goes on reading the input.
    """

    __slots__ = ("acks", "async_values", "count", "exhausted", "pending", "prefix", "sync_values", "template")

    def __init__(
        self, values: Iterable[bytes | str] | AsyncIterable[bytes | str], template: dict[str, Any], want_acks: bool
    ) -> None:
        self.sync_values: Iterator[bytes | str] | None = None
        self.async_values: AsyncIterator[bytes | str] | None = None
        if isinstance(values, AsyncIterable):
            self.async_values = aiter(values)
        else:
            self.sync_values = iter(values)
        self.template = template  # PublishRequest fields shared by every message
        self.prefix = f"{secrets.token_hex(6)}-"
        self.count = 0  # messages taken from the input
        self.exhausted = False
        self.acks: list[Ack | None] = []  # by input index (only when acks are wanted)
        # correlation id -> (input index, request) until acknowledged (only when acks are wanted)
        self.pending: dict[str, tuple[int, api_pb2.PublishRequest]] | None = {} if want_acks else None


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

    def __init__(self, client: Client, request: api_pb2.SubscribeRequest) -> None:
        self._client = client
        self._request = request
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
                call = await self._client._open_subscription(self._request)
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

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
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
        except grpc.aio.AioRpcError as exc:
            self._done = True
            self._call = None
            err = self._mid_stream_error(exc)
            if err is None:
                raise StopAsyncIteration from None
            raise err from exc
        except asyncio.CancelledError:
            if (self._closed or self._client._closed) and not _being_cancelled():
                self._done = True
                self._call = None
                raise StopAsyncIteration from None
            raise
        if msg is _EOF:
            self._done = True
            self._call = None
            raise StopAsyncIteration
        return _message_from_proto(msg)

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


class Client:
    """An asyncio client for a liftlog (or Liftbridge) cluster.

    `addresses` are ``host:port`` gRPC addresses of one or more servers (a
    comma-separated string is accepted); the rest of the cluster is learned
    from metadata. `timeout` is the default deadline of each RPC in seconds.
    Failed requests are retried `retries` times on :class:`UnavailableError`
    and :class:`NotLeaderError`, waiting `backoff` seconds, doubling up to
    `max_backoff` (with a little jitter). Partition leaders are cached for
    `metadata_max_age` seconds. `nats_servers` are NATS URLs for
    :meth:`nats_publish`.

    Use it as ``async with Client("127.0.0.1:9292") as client: ...``; calling
    :meth:`connect` is optional (it checks a server answers), :meth:`close` is
    not.
    """

    def __init__(
        self,
        addresses: str | Sequence[str] = "127.0.0.1:9292",
        *,
        timeout: float = 10.0,
        retries: int = 5,
        backoff: float = 0.05,
        max_backoff: float = 2.0,
        metadata_max_age: float = 30.0,
        nats_servers: Sequence[str] = (),
    ) -> None:
        if isinstance(addresses, str):
            addresses = [a.strip() for a in addresses.split(",")]
        self.addresses: tuple[str, ...] = tuple(a for a in addresses if a)
        if not self.addresses:
            raise ConfigurationError("no server address given")
        if retries < 0:
            raise ConfigurationError(f"retries must be >= 0, got {retries}")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.metadata_max_age = metadata_max_age
        self.nats_servers: tuple[str, ...] = tuple(nats_servers)
        self._stubs: dict[str, _Stub] = {}
        self._brokers: dict[str, str] = {}  # broker id -> "host:port"
        self._streams: dict[str, _CachedStream] = {}
        self._refreshing: dict[str, asyncio.Task[Metadata]] = {}
        self._preferred: str | None = None  # the last address that answered a non-partition RPC
        self._subscriptions: weakref.WeakSet[Subscription] = weakref.WeakSet()
        self._nc: NatsClient | None = None
        self._nats_lock = asyncio.Lock()
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        """Check that a server answers, and load the cluster metadata.

        Tries each address in turn (``FetchMetadata``), for `retries` more
        rounds with backoff; raises :class:`UnavailableError` naming the
        addresses when none answers. Channels themselves are opened lazily.
        """
        try:
            await self.fetch_metadata()
        except UnavailableError as err:
            raise UnavailableError(
                f"no liftlog server answered at {', '.join(self.addresses)}: {err.message}", code=err.code
            ) from err

    async def close(self) -> None:
        """Close subscriptions, channels and the NATS connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for sub in list(self._subscriptions):
            await sub.close()
        for task in self._refreshing.values():
            task.cancel()
        stubs, self._stubs = list(self._stubs.values()), {}
        for stub in stubs:
            await stub.channel.close()
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(nats.errors.Error, OSError):
                await nc.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    # ------------------------------------------------------------------ stream administration

    async def create_stream(
        self,
        subject: str,
        name: str,
        *,
        group: str = "",
        replication_factor: int = 1,
        partitions: int = 1,
        retention_max_bytes: int | None = None,
        retention_max_messages: int | None = None,
        retention_max_age_ms: int | None = None,
        cleaner_interval_ms: int | None = None,
        segment_max_bytes: int | None = None,
        segment_max_age_ms: int | None = None,
        compact_enabled: bool | None = None,
        compact_max_goroutines: int | None = None,
        auto_pause_time_ms: int | None = None,
        auto_pause_disable_if_subscribers: bool | None = None,
        min_isr: int | None = None,
        optimistic_concurrency_control: bool | None = None,
        encryption: bool | None = None,
        exist_ok: bool = False,
    ) -> None:
        """Create stream `name` recording NATS `subject` (wildcards allowed).

        `group` spreads the subject over the streams of a queue group;
        `replication_factor` -1 means every server. The per-stream settings
        left None take the server's defaults. Raises
        :class:`StreamExistsError` when the name is taken, unless `exist_ok`.
        """
        req = api_pb2.CreateStreamRequest(
            subject=subject, name=name, group=group, replicationFactor=replication_factor, partitions=partitions
        )
        int64s = (
            (req.retentionMaxBytes, retention_max_bytes),
            (req.retentionMaxMessages, retention_max_messages),
            (req.retentionMaxAge, retention_max_age_ms),
            (req.cleanerInterval, cleaner_interval_ms),
            (req.segmentMaxBytes, segment_max_bytes),
            (req.segmentMaxAge, segment_max_age_ms),
            (req.autoPauseTime, auto_pause_time_ms),
        )
        for field64, value64 in int64s:
            if value64 is not None:
                field64.CopyFrom(api_pb2.NullableInt64(value=value64))
        for field32, value32 in ((req.compactMaxGoroutines, compact_max_goroutines), (req.minIsr, min_isr)):
            if value32 is not None:
                field32.CopyFrom(api_pb2.NullableInt32(value=value32))
        bools = (
            (req.compactEnabled, compact_enabled),
            (req.autoPauseDisableIfSubscribers, auto_pause_disable_if_subscribers),
            (req.optimisticConcurrencyControl, optimistic_concurrency_control),
            (req.encryption, encryption),
        )
        for field_b, value_b in bools:
            if value_b is not None:
                field_b.CopyFrom(api_pb2.NullableBool(value=value_b))
        try:
            await self._call_any("create_stream", req)
        except StreamExistsError:
            if not exist_ok:
                raise
        finally:
            self._streams.pop(name, None)

    async def delete_stream(self, name: str) -> None:
        """Delete stream `name` and its data (:class:`NoSuchStreamError` if there is none)."""
        try:
            await self._call_any("delete_stream", api_pb2.DeleteStreamRequest(name=name))
        finally:
            self._streams.pop(name, None)

    async def pause_stream(self, name: str, partitions: Sequence[int] = (), resume_all: bool = False) -> None:
        """Pause `partitions` of stream `name` (all of them when empty).

        A paused partition resumes when published to or subscribed to with
        ``resume=True``; with `resume_all`, resuming one resumes all.
        """
        req = api_pb2.PauseStreamRequest(name=name, partitions=list(partitions), resumeAll=resume_all)
        await self._call_any("pause_stream", req)

    async def set_stream_readonly(self, name: str, partitions: Sequence[int] = (), readonly: bool = True) -> None:
        """Set (or with ``readonly=False`` clear) the readonly flag of `partitions` (all when empty)."""
        req = api_pb2.SetStreamReadonlyRequest(name=name, partitions=list(partitions), readonly=readonly)
        await self._call_any("set_stream_readonly", req)

    # ------------------------------------------------------------------ publishing

    async def publish(
        self,
        stream: str,
        value: bytes | str,
        *,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Mapping[str, bytes | str] | None = None,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        expected_offset: int | None = None,
        ack_inbox: str = "",
        correlation_id: str = "",
        timeout: float | None = None,
    ) -> Ack | None:
        """Publish one message to a stream partition (the ``Publish`` RPC, sent to the leader).

        With `partition` None the message goes to partition 0, or, when a
        `key` is given and the stream has several partitions, to partition
        ``zlib.crc32(key) % partitions`` (the Liftbridge clients' key
        partitioner). `expected_offset` only matters on streams with
        optimistic concurrency control: the message is written only if it
        gets that offset; None sends -1, "no expectation", as Liftbridge's
        clients do. `timeout`
        (default: the client's) bounds the wait for the ack; it raises
        :class:`AckTimeoutError`. Returns the :class:`Ack`, or None with
        ``AckPolicy.NONE``. A message the server refuses raises (for example
        :class:`IncorrectOffsetError`, :class:`ReadonlyError`). Retried on
        :class:`NotLeaderError` and :class:`UnavailableError` (at least once).
        """
        self._check_open()
        req = api_pb2.PublishRequest(
            stream=stream,
            value=to_bytes(value),
            ackPolicy=int(ack_policy),  # type: ignore[arg-type]
            ackInbox=ack_inbox,
            correlationId=correlation_id,
        )
        key_bytes = to_bytes(key) if key is not None else b""
        if key_bytes:
            req.key = key_bytes
        if headers:
            req.headers.update(to_headers(headers))
        req.expectedOffset = -1 if expected_offset is None else expected_offset
        if partition is None:
            partition = await self._partition_for_key(stream, key_bytes)
        req.partition = partition
        deadline = self.timeout if timeout is None else timeout

        async def call(stub: _Stub) -> api_pb2.PublishResponse:
            resp: api_pb2.PublishResponse = await stub.publish(req, timeout=deadline)
            return resp

        resp = await self._call_leader(stream, partition, call, timeout_error=AckTimeoutError)
        if ack_policy == AckPolicy.NONE or not resp.HasField("ack"):
            return None
        err = error_from_ack(resp.ack)
        if err is not None:
            raise err
        return Ack.from_proto(resp.ack)

    async def publish_to_subject(
        self,
        subject: str,
        value: bytes | str,
        *,
        key: bytes | str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        ack_inbox: str = "",
        correlation_id: str = "",
        timeout: float | None = None,
    ) -> Ack | None:
        """Publish one message to NATS `subject` through any server (``PublishToSubject``).

        Every stream listening on the subject records it; the first ack is
        returned (None with ``AckPolicy.NONE`` or when no stream acked). Raises
        :class:`AckTimeoutError` when no ack comes within `timeout`.
        """
        self._check_open()
        req = api_pb2.PublishToSubjectRequest(
            subject=subject,
            value=to_bytes(value),
            headers=to_headers(headers),
            ackPolicy=int(ack_policy),  # type: ignore[arg-type]
            ackInbox=ack_inbox,
            correlationId=correlation_id,
        )
        if key is not None:
            req.key = to_bytes(key)
        deadline = self.timeout if timeout is None else timeout
        resp: api_pb2.PublishToSubjectResponse = await self._call_any(
            "publish_to_subject", req, timeout=deadline, timeout_error=AckTimeoutError
        )
        if ack_policy == AckPolicy.NONE or not resp.HasField("ack"):
            return None
        err = error_from_ack(resp.ack)
        if err is not None:
            raise err
        return Ack.from_proto(resp.ack)

    async def publish_many(
        self,
        stream: str,
        values: Iterable[bytes | str] | AsyncIterable[bytes | str],
        *,
        partition: int = 0,
        key: bytes | str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        window: int = 100,
        timeout: float | None = None,
    ) -> list[Ack]:
        """Publish many messages to one partition over a single ``PublishAsync`` call.

        At most `window` messages are unacknowledged at a time. Returns the
        acks in input order (an empty list with ``AckPolicy.NONE``, which gets
        no acks). `timeout` (default: the client's) is the longest wait for
        progress, not for the whole batch: :class:`AckTimeoutError` when no ack
        arrives for that long while some are owed.

        A refused message raises the :class:`PublishAsyncFailed` of the first
        refusal (also the specific class, e.g. :class:`ReadonlyError`), with
        ``correlation_id`` and ``acks``, the acks received so far. When the
        call fails with :class:`NotLeaderError` or :class:`UnavailableError`,
        it is retried on the (new) leader, resending the unacknowledged
        messages: delivery is at least once. With ``AckPolicy.NONE`` it is
        retried only if nothing was sent yet.
        """
        self._check_open()
        if window < 1:
            raise InvalidArgumentError(f"window must be at least 1, got {window}")
        want_acks = ack_policy != AckPolicy.NONE
        template: dict[str, Any] = {"stream": stream, "partition": partition, "ackPolicy": int(ack_policy)}
        if key is not None:
            template["key"] = to_bytes(key)
        if headers:
            template["headers"] = to_headers(headers)
        batch = _Batch(values, template, want_acks)
        deadline = self.timeout if timeout is None else timeout

        def retryable() -> bool:
            return want_acks or batch.count == 0

        async def attempt(stub: _Stub) -> None:
            await self._publish_many_attempt(stub, batch, window, deadline)

        await self._call_leader(stream, partition, attempt, timeout_error=AckTimeoutError, retryable=retryable)
        if not want_acks:
            return []
        acks = [a for a in batch.acks if a is not None]
        if len(acks) != len(batch.acks):  # cannot happen: the attempt raises while some are pending
            raise LiftlogError(f"{len(batch.acks) - len(acks)} messages were not acknowledged")
        return acks

    async def _publish_many_attempt(self, stub: _Stub, batch: _Batch, window_size: int, timeout: float) -> None:
        """One PublishAsync call: send what is pending then the rest of the input, collect acks."""
        loop = asyncio.get_running_loop()
        call = stub.publish_async()
        pending = batch.pending
        acks = batch.acks
        window = asyncio.Semaphore(window_size) if pending is not None else None
        template = batch.template
        prefix = batch.prefix
        make_request = api_pb2.PublishRequest
        stop = False
        in_source = False  # the writer waits on the caller's async iterable
        in_write = False
        writer_done = False
        progress = 0  # requests written + responses read, for the timeout watchdog
        timed_out = False

        async def write_all() -> None:
            nonlocal in_source, in_write, writer_done, progress
            write = _request_writer(call)
            try:
                if pending:
                    for _, req in sorted(pending.values(), key=lambda entry: entry[0]):
                        if window is not None:
                            await window.acquire()
                        if stop:
                            return
                        in_write = True
                        await write(req)
                        in_write = False
                        progress += 1
                sync_values = batch.sync_values
                async_values = batch.async_values
                while not batch.exhausted:
                    if window is not None:
                        await window.acquire()
                    if stop:
                        return
                    try:
                        if sync_values is not None:
                            value = next(sync_values)
                        else:
                            assert async_values is not None
                            in_source = True
                            try:
                                value = await anext(async_values)
                            finally:
                                in_source = False
                    except (StopIteration, StopAsyncIteration):
                        batch.exhausted = True
                        break
                    index = batch.count
                    batch.count = index + 1
                    if isinstance(value, str):
                        value = value.encode()
                    corr = prefix + str(index)
                    req = make_request(value=value, correlationId=corr, **template)
                    if pending is not None:
                        acks.append(None)
                        pending[corr] = (index, req)
                    in_write = True
                    await write(req)
                    in_write = False
                    progress += 1
                await call.done_writing()
                writer_done = True
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                return  # the call ended; the reader reports why

        writer = loop.create_task(write_all())

        def on_writer_done(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and task.exception() is not None:
                call.cancel()  # the caller's iterable failed: stop the reader, which re-raises it

        writer.add_done_callback(on_writer_done)

        async def watchdog() -> None:
            nonlocal timed_out
            last = -1
            since = loop.time()
            period = min(max(timeout / 4, 0.005), 1.0)
            while True:
                await asyncio.sleep(period)
                now = loop.time()
                waiting = bool(pending) or writer_done or in_write
                if progress != last or not waiting:
                    last = progress
                    since = now
                elif now - since >= timeout:
                    timed_out = True
                    call.cancel()
                    return

        dog = loop.create_task(watchdog())
        failure: BaseException | None = None
        try:
            read = call.read
            while True:
                resp = await read()
                if resp is _EOF:
                    break
                progress += 1
                if window is not None:
                    window.release()
                corr = resp.correlationId
                if resp.HasField("asyncError"):
                    if pending is not None:
                        pending.pop(corr, None)
                    raise error_from_async_error(resp.asyncError, corr, [a for a in acks if a is not None])
                if pending is not None:
                    entry = pending.pop(corr, None)
                    if entry is not None:
                        acks[entry[0]] = Ack.from_proto(resp.ack)
            # The server completed the call: normally after our half-close, with every ack sent.
            stop = True
            if window is not None:
                window.release()  # wake a writer waiting for room; it sees `stop`
            if not in_source:
                await asyncio.wait([writer])
            writer_error = _task_error(writer)
            if writer_error is not None:
                raise writer_error
            if pending:
                raise UnavailableError(f"the server ended PublishAsync with {len(pending)} messages unacknowledged")
            if not batch.exhausted:
                raise UnavailableError(f"the server ended PublishAsync after {batch.count} messages, before the last")
        except grpc.aio.AioRpcError as exc:
            failure = error_from_rpc(exc, timeout_error=AckTimeoutError)
            raise failure from exc
        except asyncio.CancelledError:
            if _being_cancelled():
                raise
            writer_error = _task_error(writer)
            if writer_error is not None:
                failure = writer_error
                raise writer_error from None
            if timed_out:
                if writer_done and not pending:
                    return  # everything sent and acknowledged; the server just did not end the call
                failure = AckTimeoutError(
                    f"no progress on PublishAsync to {stub.address} for {timeout:g} s "
                    f"({len(pending) if pending is not None else 0} messages unacknowledged)"
                )
                raise failure from None
            raise
        except BaseException as exc:
            failure = exc
            raise
        finally:
            stop = True
            dog.cancel()
            if not writer.done():
                if in_source and isinstance(failure, (NotLeaderError, UnavailableError)) and pending is not None:
                    # Let the caller's async iterable hand over its item (kept in pending for the retry)
                    # rather than cancelling it half-way.
                    if window is not None:
                        window.release()
                    await asyncio.wait([writer])
                else:
                    writer.cancel()
                    await asyncio.wait([writer])
            if not call.done():
                call.cancel()
            await asyncio.wait([dog])

    # ------------------------------------------------------------------ subscribing

    def subscribe(
        self,
        stream: str,
        *,
        partition: int = 0,
        start_position: StartPosition = StartPosition.NEW_ONLY,
        start_offset: int = 0,
        start_timestamp: int = 0,
        stop_position: StopPosition = StopPosition.STOP_ON_CANCEL,
        stop_offset: int = 0,
        stop_timestamp: int = 0,
        read_isr_replica: bool = False,
        resume: bool = False,
    ) -> Subscription:
        """Subscribe to a stream partition; see :class:`Subscription`.

        `start_position` picks where to begin (`start_offset`, or
        `start_timestamp` in Unix ns, for OFFSET and TIMESTAMP) and
        `stop_position` where to end. With `read_isr_replica` any in-sync
        replica may serve it; `resume` resumes a paused partition.
        """
        self._check_open()
        req = api_pb2.SubscribeRequest(
            stream=stream,
            partition=partition,
            startPosition=int(start_position),  # type: ignore[arg-type]
            startOffset=start_offset,
            startTimestamp=start_timestamp,
            stopPosition=int(stop_position),  # type: ignore[arg-type]
            stopOffset=stop_offset,
            stopTimestamp=stop_timestamp,
            readISRReplica=read_isr_replica,
            resume=resume,
        )
        sub = Subscription(self, req)
        self._subscriptions.add(sub)
        return sub

    async def _open_subscription(self, request: api_pb2.SubscribeRequest) -> Any:
        """Start a Subscribe call on the right server and consume its set-up message.

        Returns the call, or None when the server completed it before
        confirming. A first message that is not the empty set-up message
        (a server that does not send one) is not expected and is skipped.
        """
        self._check_open()

        async def open_call(stub: _Stub) -> Any:
            call = stub.subscribe(request)
            try:
                async with asyncio.timeout(self.timeout):
                    first = await call.read()
            except TimeoutError:
                call.cancel()
                raise DeadlineExceededError(
                    f"{stub.address} did not confirm the subscription to stream {request.stream!r} "
                    f"partition {request.partition} within {self.timeout:g} s"
                ) from None
            except BaseException:
                call.cancel()
                raise
            return None if first is _EOF else call

        return await self._call_leader(request.stream, request.partition, open_call, isr=request.readISRReplica)

    # ------------------------------------------------------------------ metadata

    async def fetch_metadata(self, *streams: str) -> Metadata:
        """Describe the brokers and the given streams (all streams when none are given).

        Refreshes the client's cache of partition leaders as a side effect.
        """
        self._check_open()
        req = api_pb2.FetchMetadataRequest(streams=list(streams))
        resp: api_pb2.FetchMetadataResponse = await self._call_any("fetch_metadata", req)
        md = Metadata.from_proto(resp)
        self._update_cache(md, all_streams=not streams)
        return md

    async def fetch_partition_metadata(self, stream: str, partition: int = 0) -> PartitionInfo:
        """Up-to-date metadata of one partition (high watermark, newest offset), asked of its leader."""
        self._check_open()
        req = api_pb2.FetchPartitionMetadataRequest(stream=stream, partition=partition)
        deadline = self.timeout

        async def call(stub: _Stub) -> api_pb2.FetchPartitionMetadataResponse:
            resp: api_pb2.FetchPartitionMetadataResponse = await stub.fetch_partition_metadata(req, timeout=deadline)
            return resp

        resp = await self._call_leader(stream, partition, call)
        return PartitionInfo.from_proto(resp.metadata)

    # ------------------------------------------------------------------ plain NATS

    async def nats_publish(
        self,
        subject: str,
        value: bytes | str,
        *,
        key: bytes | str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
        ack_policy: AckPolicy = AckPolicy.NONE,
        envelope: bool = True,
        timeout: float | None = None,
    ) -> Ack | None:
        """Publish on NATS `subject` directly (connecting to `nats_servers` on first use).

        The payload is a Publish envelope carrying key, headers and value, or,
        with ``envelope=False``, the raw value (no key, headers or ack then).
        With an `ack_policy` other than NONE it waits up to `timeout` for the
        Ack on a fresh inbox and returns it (:class:`AckTimeoutError`
        otherwise). Raises :class:`ConfigurationError` when the client has no
        NATS servers.
        """
        self._check_open()
        nc = await self._nats()
        if not envelope:
            if key is not None or headers or ack_policy != AckPolicy.NONE:
                raise InvalidArgumentError("key, headers and acks need an envelope (envelope=True)")
            try:
                await nc.publish(subject, to_bytes(value))
            except nats.errors.Error as exc:
                raise UnavailableError(f"NATS publish to {subject} failed: {exc}") from exc
            return None
        if ack_policy == AckPolicy.NONE:
            payload = encode_publish(value, key=key, headers=headers, ack_policy=ack_policy)
            try:
                await nc.publish(subject, payload)
            except nats.errors.Error as exc:
                raise UnavailableError(f"NATS publish to {subject} failed: {exc}") from exc
            return None
        inbox = nc.new_inbox()
        correlation_id = secrets.token_hex(8)
        payload = encode_publish(
            value, key=key, headers=headers, ack_inbox=inbox, correlation_id=correlation_id, ack_policy=ack_policy
        )
        deadline = self.timeout if timeout is None else timeout
        ack = await publish_and_wait_ack(nc, subject, payload, inbox, deadline)
        err = error_from_ack(ack)
        if err is not None:
            raise err
        return Ack.from_proto(ack)

    async def _nats(self) -> NatsClient:
        if self._nc is not None and not self._nc.is_closed:
            return self._nc
        if not self.nats_servers:
            raise ConfigurationError("no NATS servers configured: pass nats_servers=[...] to Client")
        async with self._nats_lock:
            if self._nc is None or self._nc.is_closed:
                try:
                    # Few, quick reconnection attempts: a connection that gives up is closed and
                    # replaced by a new one on the next publish.
                    self._nc = await nats.connect(
                        servers=list(self.nats_servers),
                        connect_timeout=max(1, round(self.timeout)),
                        max_reconnect_attempts=self.retries,
                        reconnect_time_wait=max(self.backoff, 0.1),
                        error_cb=_log_nats_error,
                    )
                except (nats.errors.Error, OSError) as exc:
                    raise UnavailableError(f"cannot connect to NATS at {', '.join(self.nats_servers)}: {exc}") from exc
            return self._nc

    # ------------------------------------------------------------------ routing, retries, cache

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the client is closed")

    def _stub(self, address: str) -> _Stub:
        stub = self._stubs.get(address)
        if stub is None:
            self._check_open()
            options = (
                *_CHANNEL_OPTIONS,
                # Reconnect about as eagerly as the client retries (gRPC waits 1 s, then longer, by
                # default, failing every call on the channel meanwhile).
                ("grpc.initial_reconnect_backoff_ms", max(10, int(self.backoff * 1000))),
                ("grpc.max_reconnect_backoff_ms", max(100, int(self.max_backoff * 1000))),
            )
            stub = _Stub(address, grpc.aio.insecure_channel(address, options=options))
            self._stubs[address] = stub
        return stub

    async def _sleep_backoff(self, attempt: int) -> None:
        delay = min(self.max_backoff, self.backoff * (2**attempt))
        await asyncio.sleep(delay * random.uniform(0.8, 1.2))

    def _any_addresses(self) -> list[str]:
        """Seed addresses then known brokers, starting with the last one that answered."""
        addresses = list(self.addresses)
        for address in self._brokers.values():
            if address not in addresses:
                addresses.append(address)
        preferred = self._preferred
        if preferred is not None and preferred in addresses:
            i = addresses.index(preferred)
            addresses = addresses[i:] + addresses[:i]
        return addresses

    async def _call_any(
        self,
        method: str,
        request: Any,
        *,
        timeout: float | None = None,
        timeout_error: type[DeadlineExceededError] = DeadlineExceededError,
    ) -> Any:
        """Call `method` on any server: the next address on UNAVAILABLE, `retries` more rounds with backoff."""
        self._check_open()
        deadline = self.timeout if timeout is None else timeout
        attempt = 0
        while True:
            last: UnavailableError | None = None
            for address in self._any_addresses():
                try:
                    result = await getattr(self._stub(address), method)(request, timeout=deadline)
                except grpc.aio.AioRpcError as exc:
                    err = error_from_rpc(exc, timeout_error=timeout_error)
                    if not isinstance(err, UnavailableError):
                        raise err from exc
                    last = err
                    continue
                self._preferred = address
                return result
            assert last is not None
            if attempt >= self.retries:
                raise last
            await self._sleep_backoff(attempt)
            attempt += 1

    async def _call_leader(
        self,
        stream: str,
        partition: int,
        fn: Callable[[_Stub], Awaitable[T]],
        *,
        timeout_error: type[DeadlineExceededError] = DeadlineExceededError,
        isr: bool = False,
        retryable: Callable[[], bool] | None = None,
    ) -> T:
        """Run `fn` against the partition's leader (or an ISR replica), re-routing on failure.

        NotLeader and Unavailable: refresh metadata, back off, retry up to
        `retries` times. NoSuchStream/NoSuchPartition from a route that came
        from the cache: refresh and retry once. `retryable` can veto retries.
        """
        attempt = 0
        refresh = False
        retried_not_found = False
        while True:
            fresh = True  # a NotFound raised by _route comes from metadata just fetched
            routing = True
            try:
                address, fresh = await self._route(stream, partition, refresh=refresh, isr=isr)
                routing = False
                try:
                    return await fn(self._stub(address))
                except grpc.aio.AioRpcError as exc:
                    raise error_from_rpc(exc, timeout_error=timeout_error) from exc
            except (NotLeaderError, UnavailableError) as err:
                if routing and err.code is not None:
                    raise  # no server answered FetchMetadata, even after _call_any's own retries
                if attempt >= self.retries or (retryable is not None and not retryable()):
                    raise
                await self._sleep_backoff(attempt)
                attempt += 1
                refresh = True
            except (NoSuchStreamError, NoSuchPartitionError) as err:
                if isinstance(err, PublishAsyncFailed) or fresh or retried_not_found:
                    raise
                if retryable is not None and not retryable():
                    raise
                retried_not_found = True
                refresh = True

    async def _route(self, stream: str, partition: int, *, refresh: bool, isr: bool = False) -> tuple[str, bool]:
        """The address serving `partition` of `stream`, and whether the metadata was just fetched."""
        fresh = False
        info = None if refresh else self._cached_stream(stream)
        if info is None or partition not in info.partitions:
            info = await self._refresh_stream(stream)
            fresh = True
        p = info.partitions.get(partition)
        if p is None:
            raise NoSuchPartitionError(f"no such partition: stream {stream!r} has no partition {partition}")
        broker_id = p.leader
        if isr:
            candidates = [b for b in p.isr if b in self._brokers]
            if candidates:
                broker_id = random.choice(candidates)
        if not broker_id:
            raise UnavailableError(f"partition {partition} of stream {stream!r} has no leader")
        address = self._brokers.get(broker_id)
        if address is None:
            raise UnavailableError(f"the leader {broker_id!r} of stream {stream!r} partition {partition} is unknown")
        return address, fresh

    def _cached_stream(self, stream: str) -> StreamInfo | None:
        entry = self._streams.get(stream)
        if entry is None or asyncio.get_running_loop().time() - entry.fetched_at > self.metadata_max_age:
            return None
        return entry.info

    async def _refresh_stream(self, stream: str) -> StreamInfo:
        """Fetch the metadata of `stream` (one request for all callers asking at once)."""
        task = self._refreshing.get(stream)
        if task is None:
            task = asyncio.get_running_loop().create_task(self.fetch_metadata(stream))
            self._refreshing[stream] = task
            task.add_done_callback(partial(self._refresh_done, stream))
        md = await asyncio.shield(task)
        info = md.streams.get(stream)
        if info is None:
            raise NoSuchStreamError(f"no such stream: {stream!r}")
        return info

    def _refresh_done(self, stream: str, task: asyncio.Task[Metadata]) -> None:
        if self._refreshing.get(stream) is task:
            del self._refreshing[stream]
        if not task.cancelled():
            task.exception()  # retrieved: every waiter got it, or none is left to care

    def _update_cache(self, md: Metadata, *, all_streams: bool) -> None:
        if md.brokers:
            self._brokers = {b.id: b.address for b in md.brokers}
        now = asyncio.get_running_loop().time()
        if all_streams:
            self._streams = {}
        for name, info in md.streams.items():
            self._streams[name] = _CachedStream(info, now)
        for name in md.unknown_streams:
            self._streams.pop(name, None)

    async def _partition_for_key(self, stream: str, key: bytes) -> int:
        """0, or ``crc32(key) % partitions`` for a keyed message on a multi-partition stream."""
        if not key:
            return 0
        info = self._cached_stream(stream)
        if info is None:
            info = await self._refresh_stream(stream)
        n = len(info.partitions)
        return zlib.crc32(key) % n if n > 1 else 0
