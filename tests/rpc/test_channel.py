"""liftlog.rpc's client channel over sockets on 127.0.0.1: against our own server and against grpcio's.

What the liftlog client relies on: statuses with their details and trailing
metadata, streams of thousands of messages, many calls in flight on one
connection, cancellation and deadlines that reach the server, a new
connection after the old one is lost, and bounded buffering both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.rpc import RpcError, RpcServer, StatusCode
from liftlog.rpc.channel import EOF, Channel

from .service import ERROR_DETAILS, FakeAPI, implemented_methods, serving, until


def publish(action: str, correlation_id: str = "", value: bytes = b"") -> api_pb2.PublishRequest:
    return api_pb2.PublishRequest(stream=action, correlationId=correlation_id, value=value)


class Api:
    """The three shapes of call on one channel."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.publish = channel.unary_unary(
            "/proto.API/Publish", api_pb2.PublishRequest.SerializeToString, api_pb2.PublishResponse.FromString
        )
        self.subscribe = channel.unary_stream(
            "/proto.API/Subscribe", api_pb2.SubscribeRequest.SerializeToString, api_pb2.Message.FromString
        )
        self.publish_async = channel.stream_stream(
            "/proto.API/PublishAsync", api_pb2.PublishRequest.SerializeToString, api_pb2.PublishResponse.FromString
        )


@pytest.fixture
async def server(service: FakeAPI) -> AsyncIterator[RpcServer]:
    async with serving(service) as server:
        yield server


@pytest.fixture
async def api(server: RpcServer) -> AsyncIterator[Api]:
    channel = Channel(f"127.0.0.1:{server.port}")
    yield Api(channel)
    await channel.close()


async def read_all(call: Any) -> list[Any]:
    out = []
    while (message := await call.read()) is not EOF:
        out.append(message)
    return out


async def test_unary_and_metadata(api: Api) -> None:
    assert (await api.publish(publish("echo", "c1"))).correlationId == "c1"
    reply = await api.publish(publish("metadata"), metadata=(("x-who", "me"), ("x-raw-bin", b"\x00\xff")))
    metadata = json.loads(reply.correlationId)["metadata"]
    assert ["x-who", "me"] in metadata
    assert ["x-raw-bin", "b64:AP8="] in metadata


async def test_error_status_details_and_trailing_metadata(api: Api) -> None:
    with pytest.raises(RpcError) as info:
        await api.publish(publish("abort", str(int(StatusCode.NOT_FOUND))))
    assert info.value.code == StatusCode.NOT_FOUND
    assert info.value.message == ERROR_DETAILS  # percent-encoded UTF-8 on the wire
    assert ("liftlog-error", "x") in info.value.trailing_metadata
    with pytest.raises(RpcError) as info:
        await api.publish(publish("raise"))
    assert info.value.code == StatusCode.UNKNOWN and "boom" in info.value.message


async def test_unknown_method_is_unimplemented(api: Api) -> None:
    missing = api.channel.unary_unary(
        "/proto.API/NoSuchMethod", api_pb2.PublishRequest.SerializeToString, api_pb2.PublishResponse.FromString
    )
    with pytest.raises(RpcError) as info:
        await missing(publish("echo"))
    assert info.value.code == StatusCode.UNIMPLEMENTED


async def test_server_streaming_thousands_then_status(api: Api) -> None:
    messages = await read_all(api.subscribe(api_pb2.SubscribeRequest(stream="n", startOffset=5000, stopOffset=100)))
    assert [m.offset for m in messages] == list(range(5000))
    call = api.subscribe(api_pb2.SubscribeRequest(stream="fail", startOffset=3, stopOffset=1))
    assert [(await call.read()).offset for _ in range(3)] == [0, 1, 2]
    with pytest.raises(RpcError) as info:
        await call.read()
    assert info.value.code == StatusCode.DATA_LOSS
    assert call.done()


async def test_bidi_many_in_flight_and_concurrent_unary(api: Api) -> None:
    call = api.publish_async()

    async def write() -> None:
        for i in range(3000):
            await call.write(publish("x", str(i)))
        await call.done_writing()

    writer = asyncio.create_task(write())
    unary = await asyncio.gather(*(api.publish(publish("echo", f"u{i}")) for i in range(200)))
    assert [r.correlationId for r in unary] == [f"u{i}" for i in range(200)]
    assert [r.correlationId for r in await read_all(call)] == [str(i) for i in range(3000)]
    await writer


async def test_large_messages_both_ways(api: Api) -> None:
    value = bytes(range(256)) * (24 << 10)  # 6 MiB: beyond every window
    reply = await api.publish(publish("digest", value=value))
    assert reply.correlationId.startswith(f"{len(value)}:")
    messages = await read_all(api.subscribe(api_pb2.SubscribeRequest(stream="n", startOffset=3, stopOffset=5 << 20)))
    assert [len(m.value) for m in messages] == [5 << 20] * 3


async def test_a_response_over_the_limit_is_resource_exhausted(server: RpcServer) -> None:
    channel = Channel(f"127.0.0.1:{server.port}", max_message_bytes=1 << 20)
    try:
        call = Api(channel).subscribe(api_pb2.SubscribeRequest(stream="n", startOffset=2, stopOffset=2 << 20))
        with pytest.raises(RpcError) as info:
            await call.read()
        assert info.value.code == StatusCode.RESOURCE_EXHAUSTED
        assert (await Api(channel).publish(publish("echo", "after"))).correlationId == "after"
    finally:
        await channel.close()


async def test_cancel_reaches_the_server_and_reads_raise_cancelled(api: Api, service: FakeAPI) -> None:
    call = api.subscribe(api_pb2.SubscribeRequest(stream="forever", stopOffset=10))
    assert (await call.read()).offset == 0
    assert call.cancel()
    assert not call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call.read()
    await until(lambda: "forever" in service.cancelled)
    # A read that waits when another task cancels the call raises CancelledError too.
    call = api.publish_async()
    reader = asyncio.create_task(call.read())
    await asyncio.sleep(0.05)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    # A task cancelled while awaiting a unary call cancels the call on the server.
    task = asyncio.create_task(api.publish(publish("hang")))
    assert await asyncio.wait_for(service.started.get(), 5) == "hang"
    task.cancel()
    await until(lambda: "hang" in service.cancelled)


async def test_deadline(api: Api, service: FakeAPI) -> None:
    with pytest.raises(RpcError) as info:
        await api.publish(publish("sleep", "5"), timeout=0.2)
    assert info.value.code == StatusCode.DEADLINE_EXCEEDED
    await until(lambda: "sleep" in service.cancelled)  # grpc-timeout reached the server too
    reply = await api.publish(publish("deadline"), timeout=30)
    assert 25 < float(reply.correlationId) <= 30


async def test_a_client_that_stops_reading_is_bounded(api: Api, service: FakeAPI) -> None:
    call = api.subscribe(api_pb2.SubscribeRequest(stream="forever", stopOffset=64 << 10))
    assert (await call.read()).offset == 0
    await until(lambda: service.write_blocked and service.writes > 10)
    await asyncio.sleep(0.2)
    stalled = service.writes
    assert stalled * (64 << 10) < 40 << 20  # the windows, not memory, hold the server back
    await asyncio.sleep(0.2)
    assert service.writes == stalled
    for _ in range(100):
        await call.read()
    await until(lambda: service.writes > stalled)
    call.cancel()


async def test_unreachable_server_is_unavailable_and_a_new_server_is_found() -> None:
    channel = Channel("127.0.0.1:1")
    try:
        with pytest.raises(RpcError) as info:
            await Api(channel).publish(publish("echo"))
        assert info.value.code == StatusCode.UNAVAILABLE and "127.0.0.1:1" in info.value.message
        call = Api(channel).subscribe(api_pb2.SubscribeRequest(stream="n", startOffset=1))
        with pytest.raises(RpcError) as info:
            await call.read()
        assert info.value.code == StatusCode.UNAVAILABLE
    finally:
        await channel.close()


@pytest.mark.parametrize(
    ("greeting", "code", "wording"),
    [
        (b'INFO {"server_id":"x"}\r\n', StatusCode.UNAVAILABLE, "not a gRPC server"),  # NATS
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", StatusCode.UNAVAILABLE, "HTTP/1.1 400"),
        (None, StatusCode.DEADLINE_EXCEEDED, "has not answered the HTTP/2 handshake"),  # accepts, says nothing
    ],
)
async def test_a_server_that_does_not_speak_grpc(greeting: bytes | None, code: StatusCode, wording: str) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if greeting is not None:
            writer.write(greeting)
        await reader.read()  # keep it open until the client goes

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    channel = Channel(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
    try:
        with pytest.raises(RpcError) as info:
            await Api(channel).publish(publish("echo"), timeout=1)
        assert info.value.code == code and wording in info.value.message
    finally:
        await channel.close()
        server.close()


async def test_lost_connection_fails_calls_then_reconnects() -> None:
    service = FakeAPI()
    async with serving(service) as first:
        port = first.port
        channel = Channel(f"127.0.0.1:{port}")
        api = Api(channel)
        assert (await api.publish(publish("echo", "a"))).correlationId == "a"
        call = api.subscribe(api_pb2.SubscribeRequest(stream="forever", stopOffset=10))
        assert (await call.read()).offset == 0
    with pytest.raises(RpcError) as info:  # the server stopped under a running call
        while True:
            await call.read()
    assert info.value.code in (StatusCode.UNAVAILABLE, StatusCode.CANCELLED)
    server = RpcServer(implemented_methods(service))
    server.bind("127.0.0.1", port)
    await server.start()
    try:
        assert (await api.publish(publish("echo", "b"))).correlationId == "b"
    finally:
        await channel.close()
        await server.stop(0)


class _Proxy:
    """A TCP relay to a server that can freeze: it keeps the connections open and passes nothing on."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.frozen = asyncio.Event()

    async def relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if self.frozen.is_set():
                await asyncio.Event().wait()  # swallow it, and everything after
            writer.write(data)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        with contextlib.suppress(Exception):
            await asyncio.gather(self.relay(reader, up_writer), self.relay(up_reader, writer))


async def test_a_server_that_stops_answering_fails_running_calls(server: RpcServer) -> None:
    proxy = _Proxy(server.port)
    relay = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    channel = Channel(f"127.0.0.1:{relay.sockets[0].getsockname()[1]}", keepalive_time=0.2, keepalive_timeout=0.3)
    try:
        api = Api(channel)
        call = api.subscribe(api_pb2.SubscribeRequest(stream="forever", stopOffset=10))
        assert (await call.read()).offset == 0
        proxy.frozen.set()
        started = asyncio.get_running_loop().time()
        with pytest.raises(RpcError) as info:
            while True:
                await call.read()
        assert info.value.code == StatusCode.UNAVAILABLE and "stopped answering" in info.value.message
        assert asyncio.get_running_loop().time() - started < 3
    finally:
        await channel.close()
        relay.close()


async def test_closing_the_channel_while_a_call_connects_ends_the_call() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accepts, never says a word: the handshake waits

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    channel = Channel(f"127.0.0.1:{server.sockets[0].getsockname()[1]}")
    try:
        call = Api(channel).subscribe(api_pb2.SubscribeRequest(stream="n", startOffset=1))
        reader = asyncio.create_task(call.read())
        await asyncio.sleep(0.1)
        await channel.close()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(reader, 2)  # as grpc.aio's reads do after the channel closed, not a hang
        assert call.done()
    finally:
        server.close()


async def test_closing_the_channel_before_it_connected_ends_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    async def never(self: Channel) -> None:
        await asyncio.sleep(3600)  # a connect that does not finish (a host that drops SYNs)

    monkeypatch.setattr(Channel, "_connect", never)
    channel = Channel("127.0.0.1:1")
    call = Api(channel).subscribe(api_pb2.SubscribeRequest(stream="n", startOffset=1))
    reader = asyncio.create_task(call.read())
    await asyncio.sleep(0.05)
    await channel.close()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(reader, 2)
    assert call.done()


async def test_closed_channel_refuses_calls(api: Api) -> None:
    call = api.subscribe(api_pb2.SubscribeRequest(stream="forever", stopOffset=10))
    assert (await call.read()).offset == 0
    await api.channel.close()
    with pytest.raises(asyncio.CancelledError):
        await call.read()
    with pytest.raises(RpcError) as info:
        await api.publish(publish("echo"))
    assert info.value.code == StatusCode.UNAVAILABLE and "closed" in info.value.message


# -- against grpcio's server --------------------------------------------------------------


class _GrpcioAPI(api_pb2_grpc.APIServicer):
    async def Publish(self, request: api_pb2.PublishRequest, context: grpc.aio.ServicerContext) -> Any:
        if request.stream == "abort":
            context.set_trailing_metadata((("liftlog-error", "x"),))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, ERROR_DETAILS)
        return api_pb2.PublishResponse(correlationId=request.correlationId)

    async def Subscribe(self, request: api_pb2.SubscribeRequest, context: grpc.aio.ServicerContext) -> Any:
        for i in range(request.startOffset):
            yield api_pb2.Message(offset=i, value=b"v" * request.stopOffset)

    async def PublishAsync(self, requests: Any, context: grpc.aio.ServicerContext) -> Any:
        async for request in requests:
            yield api_pb2.PublishResponse(correlationId=request.correlationId)


@pytest.mark.parametrize("compression", [grpc.Compression.NoCompression, grpc.Compression.Gzip])
async def test_against_grpcio_server(compression: grpc.Compression) -> None:
    server = grpc.aio.server(compression=compression)
    api_pb2_grpc.add_APIServicer_to_server(_GrpcioAPI(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = Channel(f"127.0.0.1:{port}")
    api = Api(channel)
    try:
        replies = await asyncio.gather(*(api.publish(publish("echo", str(i))) for i in range(100)))
        assert [r.correlationId for r in replies] == [str(i) for i in range(100)]
        with pytest.raises(RpcError) as info:
            await api.publish(publish("abort"))
        assert info.value.code == StatusCode.FAILED_PRECONDITION and info.value.message == ERROR_DETAILS
        assert ("liftlog-error", "x") in info.value.trailing_metadata
        messages = await read_all(api.subscribe(api_pb2.SubscribeRequest(startOffset=2000, stopOffset=300)))
        assert [m.offset for m in messages] == list(range(2000))
        assert all(m.value == b"v" * 300 for m in messages)
        call = api.publish_async()
        for i in range(500):
            await call.write(publish("x", str(i)))
        await call.done_writing()
        assert [r.correlationId for r in await read_all(call)] == [str(i) for i in range(500)]
    finally:
        await channel.close()
        await server.stop(0)
