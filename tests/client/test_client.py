"""The asyncio client against in-process gRPC servers running a fake ``proto.API``.

Each fake server is a real ``grpc.aio`` server on a free localhost port; its
servicer records the requests it gets and answers with canned responses or
errors (with and without the ``liftlog-error`` trailing metadata of liftlog
servers), so routing, retries, error mapping and the streaming RPCs are
exercised over the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
import zlib
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import nats
import pytest

from liftlog.api import api_pb2, api_pb2_grpc, subscribe_batches
from liftlog.api.envelope import decode_publish_message, encode_ack
from liftlog.api.errors import ERROR_KEY, NOT_LEADER_MESSAGE, Reason
from liftlog.client import (
    Ack,
    AckError,
    AckPolicy,
    AckTimeoutError,
    Client,
    ClientClosedError,
    ConfigurationError,
    CorruptDataError,
    FailedPreconditionError,
    IncorrectOffsetError,
    InvalidArgumentError,
    LiftlogError,
    Message,
    MessageTooLargeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    NotLeaderError,
    OutgoingMessage,
    PartitionPausedError,
    PublishAsyncFailed,
    ReadonlyError,
    StartPosition,
    StopPosition,
    StreamDeletedError,
    StreamExistsError,
    UnavailableError,
)
from liftlog.storage import NewRecord
from liftlog.storage.records import encode_batch
from tests.integration.harness import nats_settled

pytestmark = pytest.mark.timeout(30)

# An error a fake RPC answers with: status code, details, liftlog reason (None: a Liftbridge-style error).
Failure = tuple[grpc.StatusCode, str, Reason | None]


@dataclass
class Cluster:
    """What the fake servers report in FetchMetadata: brokers and, per stream, partition -> leader id."""

    brokers: dict[str, int] = field(default_factory=dict)  # id -> port on 127.0.0.1
    streams: dict[str, dict[int, str]] = field(default_factory=dict)

    def metadata(self, wanted: list[str]) -> api_pb2.FetchMetadataResponse:
        resp = api_pb2.FetchMetadataResponse()
        for broker_id, port in self.brokers.items():
            resp.brokers.add(id=broker_id, host="127.0.0.1", port=port)
        for name in wanted or list(self.streams):
            s = resp.streamMetadata.add(name=name, subject=f"subj.{name}")
            if name not in self.streams:
                s.error = api_pb2.StreamMetadata.UNKNOWN_STREAM
                continue
            for pid, leader in self.streams[name].items():
                s.partitions[pid].CopyFrom(
                    api_pb2.PartitionMetadata(id=pid, leader=leader, replicas=[leader], isr=[leader])
                )
        return resp


class FakeAPI(api_pb2_grpc.APIServicer):
    """Records requests; answers from `cluster` or with queued failures."""

    def __init__(self, broker_id: str, cluster: Cluster) -> None:
        self.broker_id = broker_id
        self.cluster = cluster
        self.requests: dict[str, list[Any]] = defaultdict(list)
        self.failures: dict[str, list[Failure]] = defaultdict(list)  # method -> failures for its next calls
        self.on_failure: dict[str, Callable[[], None]] = {}  # method -> hook run when it fails
        self.subscribe_messages: list[api_pb2.Message] = []
        self.subscribe_end: Failure | None = None  # how Subscribe ends after its messages (None: OK)
        self.subscribe_hold = False  # keep Subscribe open after its messages, like STOP_ON_CANCEL
        self.subscribe_setup = api_pb2.Message()  # Liftbridge's (a liftlog server agreeing to batches adds a header)
        self.subscribe_metadata: list[tuple[tuple[str, str], ...]] = []
        # PublishAsync behaviour
        self.reverse = True  # answer held requests newest first
        self.idle = 0.02  # answer once no request came for this long
        self.async_errors: dict[bytes, api_pb2.PublishAsyncError] = {}  # value -> error
        self.max_in_flight = 0
        self.silent = False  # read requests, never answer
        self.linger = 0.0  # PublishAsync: keep the call open this long after answering everything

    async def _fail(self, method: str, context: Any) -> None:
        queued = self.failures[method]
        if not queued:
            return
        code, details, reason = queued.pop(0)
        hook = self.on_failure.get(method)
        if hook is not None:
            hook()
        trailing = ((ERROR_KEY, reason.value),) if reason is not None else ()
        await context.abort(code, details, trailing_metadata=trailing)

    async def CreateStream(self, request: Any, context: Any) -> Any:
        self.requests["CreateStream"].append(request)
        await self._fail("CreateStream", context)
        return api_pb2.CreateStreamResponse()

    async def DeleteStream(self, request: Any, context: Any) -> Any:
        self.requests["DeleteStream"].append(request)
        await self._fail("DeleteStream", context)
        return api_pb2.DeleteStreamResponse()

    async def FetchMetadata(self, request: Any, context: Any) -> Any:
        self.requests["FetchMetadata"].append(request)
        await self._fail("FetchMetadata", context)
        return self.cluster.metadata(list(request.streams))

    async def FetchPartitionMetadata(self, request: Any, context: Any) -> Any:
        self.requests["FetchPartitionMetadata"].append(request)
        await self._fail("FetchPartitionMetadata", context)
        return api_pb2.FetchPartitionMetadataResponse(
            metadata=api_pb2.PartitionMetadata(id=request.partition, leader=self.broker_id, highWatermark=41)
        )

    async def Publish(self, request: Any, context: Any) -> Any:
        self.requests["Publish"].append(request)
        await self._fail("Publish", context)
        if request.ackPolicy == api_pb2.NONE:
            return api_pb2.PublishResponse()
        ack = api_pb2.Ack(
            stream=request.stream,
            partitionSubject=f"subj.{request.stream}",
            msgSubject=f"subj.{request.stream}",
            offset=len(self.requests["Publish"]) - 1,
            correlationId=request.correlationId,
            ackPolicy=request.ackPolicy,
            receptionTimestamp=1,
            commitTimestamp=2,
        )
        return api_pb2.PublishResponse(ack=ack)

    async def PublishAsync(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        """Hold requests until none came for `idle` seconds, then answer them all (reversed if `reverse`).

        A client that respects its window stalls once `window` requests are
        unanswered, so the held count is the client's in-flight count.
        """
        if self.silent:
            async for req in request_iterator:
                self.requests["PublishAsync"].append(req)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(30)
            return
        await self._fail("PublishAsync", context)
        held: list[api_pb2.PublishRequest] = []
        incoming: asyncio.Queue[api_pb2.PublishRequest | None] = asyncio.Queue()

        async def pump() -> None:
            async for req in request_iterator:
                self.requests["PublishAsync"].append(req)
                await incoming.put(req)
            await incoming.put(None)

        reader = asyncio.get_running_loop().create_task(pump())
        ended = False
        try:
            while not ended or held:
                try:
                    req = await asyncio.wait_for(incoming.get(), self.idle) if not ended else None
                except TimeoutError:
                    req = None
                else:
                    if req is None:
                        ended = True
                    else:
                        held.append(req)
                        self.max_in_flight = max(self.max_in_flight, len(held))
                        continue
                batch, held = (held[::-1] if self.reverse else held), []
                for r in batch:
                    if r.ackPolicy == api_pb2.NONE:
                        continue
                    error = self.async_errors.get(r.value)
                    if error is not None:
                        yield api_pb2.PublishResponse(asyncError=error, correlationId=r.correlationId)
                        continue
                    ack = api_pb2.Ack(stream=r.stream, offset=int(r.value[1:]), correlationId=r.correlationId)
                    yield api_pb2.PublishResponse(ack=ack, correlationId=r.correlationId)
            await asyncio.sleep(self.linger)
        except asyncio.CancelledError:
            return  # the client cancelled the call (grpc would print the cancellation)
        finally:
            reader.cancel()

    async def Subscribe(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.requests["Subscribe"].append(request)
        self.subscribe_metadata.append(tuple(context.invocation_metadata() or ()))
        await self._fail("Subscribe", context)
        try:
            yield self.subscribe_setup  # the subscription is set up
            for msg in self.subscribe_messages:
                yield msg
            if self.subscribe_hold:
                await asyncio.sleep(30)
                return
        except asyncio.CancelledError:
            return  # the client cancelled the call (grpc would print the cancellation)
        if self.subscribe_end is not None:
            code, details, reason = self.subscribe_end
            await context.abort(code, details, trailing_metadata=((ERROR_KEY, reason.value),) if reason else ())


@dataclass
class Server:
    api: FakeAPI
    address: str
    server: Any


@contextlib.asynccontextmanager
async def serve(broker_id: str, cluster: Cluster) -> AsyncIterator[Server]:
    api = FakeAPI(broker_id, cluster)
    server = grpc.aio.server()
    api_pb2_grpc.add_APIServicer_to_server(api, server)
    port = server.add_insecure_port("127.0.0.1:0")
    cluster.brokers[broker_id] = port
    await server.start()
    try:
        yield Server(api, f"127.0.0.1:{port}", server)
    finally:
        await server.stop(None)


@pytest.fixture
async def one() -> AsyncIterator[Server]:
    """One fake server, broker "a", leading stream "s" (partition 0) and "multi" (partitions 0-2)."""
    cluster = Cluster(streams={"s": {0: "a"}, "multi": {0: "a", 1: "a", 2: "a"}})
    async with serve("a", cluster) as server:
        yield server


@pytest.fixture
async def client(one: Server) -> AsyncIterator[Client]:
    async with Client(one.address, timeout=5, retries=2, backoff=0.01) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# -- types ----------------------------------------------------------------------------------------------


def test_message_from_proto() -> None:
    proto = api_pb2.Message(
        offset=7,
        value=b"v",
        timestamp=123,
        stream="s",
        partition=2,
        subject="subj",
        replySubject="reply",
        headers={"h": b"1"},
        ackInbox="inbox",
        correlationId="c",
        ackPolicy=api_pb2.ALL,
    )
    msg = Message.from_proto(proto)
    assert msg == Message(7, None, b"v", 123, "s", 2, "subj", "reply", {"h": b"1"}, "inbox", "c", AckPolicy.ALL)
    assert msg.ack_policy is AckPolicy.ALL
    proto.headers["h"] = b"changed"  # the message owns a copy
    assert msg.headers == {"h": b"1"}
    assert Message.from_proto(api_pb2.Message(key=b"k")).key == b"k"
    with pytest.raises(AttributeError):
        msg.offset = 8  # type: ignore[misc]


# -- administration and error mapping ----------------------------------------------------------------


async def test_create_stream_sets_only_given_nullable_fields(client: Client, one: Server) -> None:
    await client.create_stream(
        "orders.*", "orders", partitions=3, retention_max_messages=10, compact_enabled=False, min_isr=2
    )
    req = one.api.requests["CreateStream"][-1]
    assert (req.subject, req.name, req.partitions, req.replicationFactor) == ("orders.*", "orders", 3, 1)
    assert req.HasField("retentionMaxMessages") and req.retentionMaxMessages.value == 10
    assert req.HasField("compactEnabled") and req.compactEnabled.value is False  # False is sent, not dropped
    assert req.HasField("minIsr") and req.minIsr.value == 2
    unset = [
        "retentionMaxBytes",
        "retentionMaxAge",
        "cleanerInterval",
        "segmentMaxBytes",
        "segmentMaxAge",
        "compactMaxGoroutines",
        "autoPauseTime",
        "autoPauseDisableIfSubscribers",
        "optimisticConcurrencyControl",
        "encryption",
    ]
    assert [name for name in unset if req.HasField(name)] == []


async def test_create_stream_exist_ok(client: Client, one: Server) -> None:
    exists: Failure = (grpc.StatusCode.ALREADY_EXISTS, "stream already exists", Reason.STREAM_EXISTS)
    one.api.failures["CreateStream"] = [exists, exists]
    await client.create_stream("x", "x", exist_ok=True)
    with pytest.raises(StreamExistsError, match="stream already exists"):
        await client.create_stream("x", "x")
    # exist_ok swallows nothing else
    one.api.failures["CreateStream"] = [(grpc.StatusCode.INVALID_ARGUMENT, "Subject is invalid", None)]
    with pytest.raises(InvalidArgumentError):
        await client.create_stream("", "x", exist_ok=True)


@pytest.mark.parametrize(
    ("failure", "expected"),
    [
        # liftlog servers: the reason decides, whatever the code and message say
        ((grpc.StatusCode.NOT_FOUND, "nope", Reason.NO_SUCH_PARTITION), NoSuchPartitionError),
        ((grpc.StatusCode.FAILED_PRECONDITION, "partition 0 is readonly", Reason.READONLY), ReadonlyError),
        ((grpc.StatusCode.FAILED_PRECONDITION, "no", Reason.INCORRECT_OFFSET), IncorrectOffsetError),
        ((grpc.StatusCode.FAILED_PRECONDITION, "is paused", Reason.PAUSED), PartitionPausedError),
        ((grpc.StatusCode.INVALID_ARGUMENT, "too big", Reason.TOO_LARGE), MessageTooLargeError),
        ((grpc.StatusCode.NOT_FOUND, "gone", Reason.STREAM_DELETED), StreamDeletedError),
        ((grpc.StatusCode.DEADLINE_EXCEEDED, "no ack", Reason.ACK_TIMEOUT), AckTimeoutError),
        # Liftbridge servers: status code and wording
        ((grpc.StatusCode.FAILED_PRECONDITION, NOT_LEADER_MESSAGE, None), NotLeaderError),
        ((grpc.StatusCode.NOT_FOUND, "No such stream: s", None), NoSuchStreamError),
        ((grpc.StatusCode.NOT_FOUND, "No such partition", None), NoSuchPartitionError),
        ((grpc.StatusCode.ALREADY_EXISTS, "stream already exists", None), StreamExistsError),
        ((grpc.StatusCode.INVALID_ARGUMENT, "Name cannot be empty", None), InvalidArgumentError),
        ((grpc.StatusCode.FAILED_PRECONDITION, "something else", None), FailedPreconditionError),
        ((grpc.StatusCode.UNKNOWN, "boom", None), LiftlogError),
    ],
)
async def test_error_mapping(client: Client, one: Server, failure: Failure, expected: type[LiftlogError]) -> None:
    one.api.failures["DeleteStream"] = [failure]
    with pytest.raises(LiftlogError) as info:
        await client.delete_stream("s")
    err = info.value
    assert type(err) is expected
    assert str(err) == failure[1]  # the server's message
    assert err.code == failure[0]
    assert err.reason == failure[2]


async def test_metadata_retries_unavailable_then_fails_over(one: Server) -> None:
    """A dead first address is skipped; an UNAVAILABLE answer is retried."""
    one.api.failures["FetchMetadata"] = [(grpc.StatusCode.UNAVAILABLE, "shutting down", Reason.UNAVAILABLE)]
    dead = f"127.0.0.1:{free_port()}"
    async with Client([dead, one.address], retries=2, backoff=0.01) as c:
        md = await c.fetch_metadata("s")
    assert "s" in md.streams
    assert len(one.api.requests["FetchMetadata"]) == 3  # connect: unavailable, retry ok; then fetch_metadata


async def test_connect_to_dead_address_raises_unavailable_quickly() -> None:
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    c = Client(address, retries=1, backoff=0.01, timeout=2)
    with pytest.raises(UnavailableError, match=address):
        await c.connect()
    assert time.monotonic() - started < 2
    await c.close()
    await c.close()  # idempotent
    with pytest.raises(ClientClosedError):
        await c.fetch_metadata()


async def test_fetch_metadata_conversion(client: Client, one: Server) -> None:
    md = await client.fetch_metadata("multi", "missing")
    assert [(b.id, b.host, b.port) for b in md.brokers] == [("a", "127.0.0.1", int(one.address.split(":")[1]))]
    assert md.broker("a") is md.brokers[0] and md.broker("zz") is None
    assert md.brokers[0].address == one.address
    assert md.unknown_streams == ["missing"]
    stream = md.streams["multi"]
    assert (stream.name, stream.subject) == ("multi", "subj.multi")
    assert list(stream.partitions) == [0, 1, 2]
    p = stream.partitions[1]
    assert (p.id, p.leader, p.replicas, p.isr, p.paused) == (1, "a", ("a",), ("a",), False)
    assert p.messages_received is None and p.pause_timestamps is None

    info = await client.fetch_partition_metadata("s", 0)
    assert (info.leader, info.high_watermark) == ("a", 41)


def test_partition_info_event_timestamps() -> None:
    from liftlog.client import EventTimestamps, PartitionInfo

    proto = api_pb2.PartitionMetadata(
        id=0, pauseTimestamps=api_pb2.PartitionEventTimestamps(firstTimestamp=1, latestTimestamp=2), paused=True
    )
    info = PartitionInfo.from_proto(proto)
    assert info.pause_timestamps == EventTimestamps(1, 2) == info.pause
    assert info.messages_received is None and info.readonly_timestamps is None


# -- publish ---------------------------------------------------------------------------------------------


async def test_publish_returns_ack(client: Client, one: Server) -> None:
    ack = await client.publish(
        "s", "héllo", key="k", headers={"a": "1", "b": b"2"}, ack_policy=AckPolicy.ALL, correlation_id="c1"
    )
    assert isinstance(ack, Ack)
    assert (ack.stream, ack.offset, ack.correlation_id, ack.ack_policy) == ("s", 0, "c1", AckPolicy.ALL)
    assert (ack.reception_timestamp, ack.commit_timestamp, ack.error) == (1, 2, AckError.OK)
    req = one.api.requests["Publish"][-1]
    assert (req.stream, req.partition, req.value, req.key) == ("s", 0, "héllo".encode(), b"k")
    msg_id = req.headers.pop("\x00msgid")  # idempotent by default: a random id (hidden), the same on every retry
    assert dict(req.headers) == {"a": b"1", "b": b"2"} and len(msg_id) == 16
    assert req.expectedOffset == -1  # None means "no expectation", as Liftbridge clients send

    await client.publish("s", b"x", expected_offset=5)
    assert one.api.requests["Publish"][-1].expectedOffset == 5

    assert await client.publish("s", b"y", ack_policy=AckPolicy.NONE) is None
    assert one.api.requests["Publish"][-1].ackPolicy == api_pb2.NONE


async def test_publish_partitions_by_key(client: Client, one: Server) -> None:
    await client.publish("multi", b"v", key=b"customer-7")
    assert one.api.requests["Publish"][-1].partition == zlib.crc32(b"customer-7") % 3
    await client.publish("multi", b"v", key=b"customer-7", partition=1)  # an explicit partition wins
    assert one.api.requests["Publish"][-1].partition == 1
    await client.publish("multi", b"v")
    assert one.api.requests["Publish"][-1].partition == 0


async def test_publish_errors_are_not_retried(client: Client, one: Server) -> None:
    one.api.failures["Publish"] = [(grpc.StatusCode.FAILED_PRECONDITION, "partition is readonly", Reason.READONLY)]
    with pytest.raises(ReadonlyError):
        await client.publish("s", b"v")
    assert len(one.api.requests["Publish"]) == 1
    with pytest.raises(NoSuchStreamError):
        await client.publish("missing", b"v")  # known from fresh metadata: no Publish sent
    assert len(one.api.requests["Publish"]) == 1


async def test_publish_retries_not_leader_on_the_new_leader() -> None:
    cluster = Cluster(streams={"s": {0: "a"}})
    async with serve("a", cluster) as a, serve("b", cluster) as b:
        # Liftbridge-style refusal (no reason): the client must recognise the message.
        a.api.failures["Publish"] = [(grpc.StatusCode.FAILED_PRECONDITION, NOT_LEADER_MESSAGE, None)]
        a.api.on_failure["Publish"] = lambda: cluster.streams["s"].update({0: "b"})  # leadership moved
        async with Client(a.address, retries=3, backoff=0.01) as c:  # only a is known up front
            ack = await c.publish("s", b"v")
        assert ack is not None and ack.offset == 0
        assert len(a.api.requests["Publish"]) == 1
        assert [r.value for r in b.api.requests["Publish"]] == [b"v"]
        assert len(a.api.requests["FetchMetadata"]) >= 2  # the refresh after the refusal


async def test_publish_gives_up_after_retries() -> None:
    cluster = Cluster(streams={"s": {0: "a"}})
    async with serve("a", cluster) as a:
        a.api.failures["Publish"] = [(grpc.StatusCode.FAILED_PRECONDITION, "not leader", Reason.NOT_LEADER)] * 5
        async with Client(a.address, retries=2, backoff=0.01) as c:
            with pytest.raises(NotLeaderError):
                await c.publish("s", b"v")
        assert len(a.api.requests["Publish"]) == 3  # first try + 2 retries


# -- publish_many --------------------------------------------------------------------------------------


async def test_publish_many_keeps_order_and_respects_window(client: Client, one: Server) -> None:
    n, window = 100, 8
    one.api.idle = 0.05
    acks = await client.publish_many("s", [f"m{i}" for i in range(n)], window=window, ack_policy=AckPolicy.ALL)
    assert [a.offset for a in acks] == list(range(n))  # input order although answered newest first
    assert one.api.max_in_flight == window
    reqs = one.api.requests["PublishAsync"]
    assert len({r.correlationId for r in reqs}) == n
    assert [a.correlation_id for a in acks] == [r.correlationId for r in reqs]
    assert all(r.ackPolicy == api_pb2.ALL and r.stream == "s" for r in reqs)


async def test_publish_many_async_iterable_and_shared_fields(client: Client, one: Server) -> None:
    async def values() -> AsyncIterator[bytes]:
        for i in range(5):
            await asyncio.sleep(0)
            yield f"m{i}".encode()

    acks = await client.publish_many("multi", values(), partition=2, key="k", headers={"h": "v"})
    assert [a.offset for a in acks] == [0, 1, 2, 3, 4]
    reqs = one.api.requests["PublishAsync"]
    assert {(r.partition, r.key, r.headers["h"]) for r in reqs} == {(2, b"k", b"v")}


async def test_publish_many_sends_a_messages_str_header_values_as_utf8(client: Client, one: Server) -> None:
    # Over PublishAsync protobuf refused str values with a TypeError, though publish_many took them over Batches.
    message = OutgoingMessage("m0", key="k", headers={"h": "é", "raw": b"\xff"})
    acks = await client.publish_many("s", [message], ack_policy=AckPolicy.ALL)
    assert [a.offset for a in acks] == [0]
    (req,) = one.api.requests["PublishAsync"]
    assert (req.key, dict(req.headers)) == (b"k", {"h": "é".encode(), "raw": b"\xff"})


async def test_publish_many_none_waits_for_no_ack(client: Client, one: Server) -> None:
    started = time.monotonic()
    assert await client.publish_many("s", [f"m{i}" for i in range(50)], ack_policy=AckPolicy.NONE) == []
    assert len(one.api.requests["PublishAsync"]) == 50
    assert time.monotonic() - started < 2


async def test_publish_many_raises_first_async_error(client: Client, one: Server) -> None:
    one.api.reverse = False
    one.api.async_errors[b"m5"] = api_pb2.PublishAsyncError(
        code=api_pb2.PublishAsyncError.READONLY, message="partition is readonly"
    )
    with pytest.raises(ReadonlyError) as info:
        await client.publish_many("s", [f"m{i}" for i in range(10)])
    err = info.value
    assert isinstance(err, PublishAsyncFailed)
    assert str(err) == "partition is readonly"
    assert err.async_code == api_pb2.PublishAsyncError.READONLY
    bad = next(r for r in one.api.requests["PublishAsync"] if r.value == b"m5")
    assert err.correlation_id == bad.correlationId
    assert [a.offset for a in err.acks] == [0, 1, 2, 3, 4]


async def test_publish_many_does_not_wait_for_a_server_that_lingers_after_the_last_ack(
    client: Client, one: Server
) -> None:
    """Liftbridge sometimes ends PublishAsync seconds after the client half-closed and had every ack."""
    one.api.linger = 30.0
    started = time.monotonic()
    acks = await client.publish_many("s", [f"m{i}" for i in range(20)], window=8)
    assert [a.offset for a in acks] == list(range(20))
    assert time.monotonic() - started < 2, "not the client's 5 s timeout"


async def test_publish_many_timeout_without_acks(client: Client, one: Server) -> None:
    one.api.silent = True
    started = time.monotonic()
    with pytest.raises(AckTimeoutError):
        await client.publish_many("s", [b"m0", b"m1"], timeout=0.2)
    assert time.monotonic() - started < 2


async def test_publish_many_source_error_propagates(client: Client) -> None:
    def values() -> Any:
        yield b"m0"
        raise RuntimeError("source broke")

    with pytest.raises(RuntimeError, match="source broke"):
        await client.publish_many("s", values())


async def test_publish_many_moves_to_the_new_leader() -> None:
    cluster = Cluster(streams={"s": {0: "a"}})
    async with serve("a", cluster) as a, serve("b", cluster) as b:
        a.api.failures["PublishAsync"] = [(grpc.StatusCode.FAILED_PRECONDITION, "not leader", Reason.NOT_LEADER)]
        a.api.on_failure["PublishAsync"] = lambda: cluster.streams["s"].update({0: "b"})
        async with Client(a.address, retries=3, backoff=0.01) as c:
            acks = await c.publish_many("s", [f"m{i}" for i in range(20)], window=5)
        assert [ack.offset for ack in acks] == list(range(20))
        # b got every message once, in order: the unacknowledged ones were resent first
        assert [r.value for r in b.api.requests["PublishAsync"]] == [f"m{i}".encode() for i in range(20)]


def test_async_error_classes() -> None:
    from liftlog.client.errors import error_from_async_error

    E = api_pb2.PublishAsyncError
    cases = {
        E.INCORRECT_OFFSET: IncorrectOffsetError,
        E.NOT_FOUND: NoSuchStreamError,
        E.BAD_REQUEST: InvalidArgumentError,
        E.READONLY: ReadonlyError,
    }
    for code, cls in cases.items():
        err = error_from_async_error(E(code=code, message="m"), "corr-1")
        assert isinstance(err, cls) and isinstance(err, PublishAsyncFailed)
        assert err.correlation_id == "corr-1"
    assert isinstance(error_from_async_error(E(code=E.NOT_FOUND, message="No such partition: 3")), NoSuchPartitionError)


# -- subscribe -------------------------------------------------------------------------------------------


async def test_subscribe_skips_setup_message_and_ends_with_the_call(client: Client, one: Server) -> None:
    one.api.subscribe_messages = [
        api_pb2.Message(offset=i, value=f"v{i}".encode(), stream="s", timestamp=10 + i) for i in range(3)
    ]
    sub = client.subscribe(
        "s", start_position=StartPosition.OFFSET, start_offset=0, stop_position=StopPosition.STOP_OFFSET, stop_offset=2
    )
    async with sub:
        got = [msg async for msg in sub]
    assert [(m.offset, m.value, m.key) for m in got] == [(0, b"v0", None), (1, b"v1", None), (2, b"v2", None)]
    req = one.api.requests["Subscribe"][-1]
    assert (req.stream, req.partition, req.startPosition, req.stopPosition, req.stopOffset) == (
        "s",
        0,
        api_pb2.OFFSET,
        api_pb2.STOP_OFFSET,
        2,
    )
    with pytest.raises(StopAsyncIteration):
        await sub.__anext__()


async def test_subscribe_asks_for_batches_and_reads_one_by_one_when_not_given_them(client: Client, one: Server) -> None:
    one.api.subscribe_messages = [api_pb2.Message(offset=0, value=b"v", stream="s")]
    got = [m.value async for m in client.subscribe("s", stop_position=StopPosition.STOP_LATEST)]
    assert got == [b"v"], "a server that ignores the request (Liftbridge) sends messages, read as such"
    assert (subscribe_batches.REQUEST_KEY, "1") in one.api.subscribe_metadata[-1]
    [m async for m in client.subscribe("s", stop_position=StopPosition.STOP_LATEST, batched=False)]
    assert subscribe_batches.REQUEST_KEY not in dict(one.api.subscribe_metadata[-1])


def _batches_message(batches: bytes, start: int, end: int) -> api_pb2.Message:
    return api_pb2.Message.FromString(subscribe_batches.batches_message("s", 0, "subj", batches, start, end))


async def test_batched_subscription_decodes_its_range(client: Client, one: Server) -> None:
    records = [
        NewRecord(b"v%d" % i, key=b"k" if i == 3 else None, headers={"h": b"1"} if i == 4 else {}) for i in range(6)
    ]
    one.api.subscribe_setup = subscribe_batches.SETUP_BATCHED
    one.api.subscribe_messages = [
        _batches_message(encode_batch(0, 0, records, 5), 2, 5),  # starts mid-batch, ends before its last record
        _batches_message(encode_batch(5, 0, records[:1], 6) + encode_batch(6, 0, records[:2], 7), 5, 8),
    ]
    got = [m async for m in client.subscribe("s", stop_position=StopPosition.STOP_LATEST)]
    assert [(m.offset, m.value) for m in got] == [
        (2, b"v2"),
        (3, b"v3"),
        (4, b"v4"),
        (5, b"v0"),
        (6, b"v0"),
        (7, b"v1"),
    ]
    assert got[1].key == b"k" and got[2].headers == {"h": b"1"} and got[0].subject == "subj"
    assert got[0].timestamp == 5 and got[-1].stream == "s"


@pytest.mark.parametrize("damage", ["crc", "no end", "truncated"])
async def test_batched_subscription_refuses_corrupt_batches(client: Client, one: Server, damage: str) -> None:
    good = encode_batch(0, 0, [NewRecord(b"v%d" % i) for i in range(3)], 1)
    bad = _batches_message(good, 0, 3)
    if damage == "crc":
        bad.value = good[:-1] + bytes([good[-1] ^ 1])
    elif damage == "no end":
        del bad.headers[subscribe_batches.END_HEADER]
    else:
        bad.value = good[:-5]
    one.api.subscribe_setup = subscribe_batches.SETUP_BATCHED
    one.api.subscribe_hold = True
    one.api.subscribe_messages = [_batches_message(good, 0, 3), bad]
    got: list[int] = []
    sub = client.subscribe("s")
    with pytest.raises(CorruptDataError, match="stream 's' partition 0"):
        async for m in sub:
            got.append(m.offset)
    assert got == [0, 1, 2], "what came before the corrupt message is delivered"
    with pytest.raises(StopAsyncIteration):
        await sub.__anext__()


@pytest.mark.parametrize(
    ("end", "expected"),
    [
        ((grpc.StatusCode.NOT_FOUND, "commit log deleted", None), StreamDeletedError),
        ((grpc.StatusCode.NOT_FOUND, "stream s was deleted", Reason.STREAM_DELETED), StreamDeletedError),
        ((grpc.StatusCode.FAILED_PRECONDITION, "commit log closed", None), PartitionPausedError),
        ((grpc.StatusCode.RESOURCE_EXHAUSTED, "End of readonly partition", None), None),  # Liftbridge: a normal end
        ((grpc.StatusCode.FAILED_PRECONDITION, "partition s/0 is readonly", Reason.READONLY), None),  # liftlog
        ((grpc.StatusCode.UNAVAILABLE, "server shutting down", Reason.UNAVAILABLE), UnavailableError),
    ],
)
async def test_subscribe_errors_after_start(
    client: Client, one: Server, end: Failure, expected: type[LiftlogError] | None
) -> None:
    one.api.subscribe_messages = [api_pb2.Message(offset=0, value=b"v", stream="s")]
    one.api.subscribe_end = end
    got: list[bytes] = []
    sub = client.subscribe("s", start_position=StartPosition.EARLIEST)
    if expected is None:
        got = [m.value async for m in sub]
    else:
        with pytest.raises(expected, match=end[1]):
            async for m in sub:
                got.append(m.value)
    assert got == [b"v"]


async def test_subscribe_started_then_close(client: Client, one: Server) -> None:
    one.api.subscribe_hold = True
    sub = client.subscribe("s")  # NEW_ONLY, never ends by itself
    await sub.started()
    assert len(one.api.requests["Subscribe"]) == 1

    async def close_soon() -> None:
        await asyncio.sleep(0.05)
        await sub.close()

    closer = asyncio.create_task(close_soon())
    assert [m async for m in sub] == []  # ends when closed
    await closer


async def test_subscription_ends_when_client_closes_and_cancellation_propagates(one: Server) -> None:
    one.api.subscribe_hold = True
    c = Client(one.address, retries=0)
    consumed = asyncio.Event()

    async def consume() -> list[Message]:
        async with c.subscribe("s") as sub:
            consumed.set()
            return [m async for m in sub]

    ended = asyncio.create_task(consume())
    await consumed.wait()
    await c.close()
    assert await asyncio.wait_for(ended, 2) == []

    async with Client(one.address, retries=0) as c2:
        sub = c2.subscribe("s")
        await sub.started()
        reader = asyncio.create_task(sub.__anext__())
        await asyncio.sleep(0.02)
        reader.cancel()
        await asyncio.wait([reader])
        assert reader.cancelled()  # a cancelled consumer is cancelled, not silently ended


async def test_subscribe_raises_no_such_partition_before_first_message(client: Client, one: Server) -> None:
    missing: Failure = (grpc.StatusCode.NOT_FOUND, "No such partition", Reason.NO_SUCH_PARTITION)
    one.api.failures["Subscribe"] = [missing, missing]
    sub = client.subscribe("s")
    with pytest.raises(NoSuchPartitionError):
        await sub.started()
    assert len(one.api.requests["Subscribe"]) == 2  # the cached route was refreshed and retried once
    # the same through iteration
    one.api.failures["Subscribe"] = [missing, missing]
    with pytest.raises(NoSuchPartitionError):
        async for _ in client.subscribe("s"):
            pass


async def test_subscribe_unknown_partition_from_metadata(client: Client, one: Server) -> None:
    with pytest.raises(NoSuchPartitionError):
        await client.subscribe("s", partition=9).started()
    assert one.api.requests["Subscribe"] == []


async def test_subscribe_goes_to_the_leader_and_retries_not_leader() -> None:
    cluster = Cluster(streams={"s": {0: "b"}})
    async with serve("a", cluster) as a, serve("b", cluster) as b:
        b.api.failures["Subscribe"] = [(grpc.StatusCode.FAILED_PRECONDITION, NOT_LEADER_MESSAGE, None)]
        b.api.subscribe_messages = [api_pb2.Message(offset=0, value=b"x", stream="s")]
        async with Client(a.address, retries=3, backoff=0.01) as c:
            sub = c.subscribe("s", stop_position=StopPosition.STOP_LATEST)
            async with sub:
                got = [m.value async for m in sub]
        assert got == [b"x"]
        assert a.api.requests["Subscribe"] == []
        assert len(b.api.requests["Subscribe"]) == 2


# -- plain NATS ----------------------------------------------------------------------------------------


async def test_nats_publish_needs_servers(client: Client) -> None:
    with pytest.raises(ConfigurationError):
        await client.nats_publish("subj", b"v")


@pytest.fixture
def nats_url() -> Any:
    try:
        from liftlog.server.nats.embedded_nats import find_nats_server_binary

        binary = find_nats_server_binary()
    except Exception as exc:  # pragma: no cover - depends on the environment
        pytest.skip(f"no nats-server binary: {exc}")
    port = free_port()
    proc = subprocess.Popen(
        [str(binary), "-a", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            time.sleep(0.02)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(5)


async def test_nats_publish_with_envelope_and_ack(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    received: list[Any] = []

    async def fake_server(msg: Any) -> None:
        message = decode_publish_message(msg.data)
        received.append(message if message is not None else msg.data)
        if message is not None and message.ackInbox:
            ack = api_pb2.Ack(stream="s", offset=3, correlationId=message.correlationId, ackPolicy=message.ackPolicy)
            await nc.publish(message.ackInbox, encode_ack(ack))

    await nc.subscribe("orders", cb=fake_server)
    await nats_settled(nc)
    c = Client("127.0.0.1:1", nats_servers=[nats_url], timeout=2)  # no gRPC server needed
    try:
        ack = await c.nats_publish("orders", "v", key="k", headers={"h": "1"}, ack_policy=AckPolicy.LEADER)
        assert ack is not None and ack.offset == 3 and ack.correlation_id
        first = received[0]
        headers = dict(first.headers)
        assert len(headers.pop("\x00msgid")) == 16  # the client's own message id rides in the envelope, hidden
        assert (first.value, first.key, headers) == (b"v", b"k", {"h": b"1"})
        assert first.correlationId == ack.correlation_id

        assert await c.nats_publish("orders", b"raw", envelope=False) is None
        with pytest.raises(AckTimeoutError):
            await c.nats_publish("nobody.listens", b"v", ack_policy=AckPolicy.ALL, timeout=0.2)
        for _ in range(250):  # sent on the client's own connection: no barrier of ours covers it
            if received[-1] == b"raw":
                break
            await asyncio.sleep(0.02)
        assert received[-1] == b"raw"
    finally:
        await c.close()
        await nc.close()
