"""liftlog.rpc's server against real gRPC clients over sockets on 127.0.0.1: grpcio (aio and sync) and grpclib.

The server runs on the test's event loop; grpcio's sync client runs in a thread.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import grpc
import grpclib.client
import grpclib.const
import grpclib.exceptions
import hpack
import pytest

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.rpc import RpcServer, ServerOptions, wire
from liftlog.rpc.wire import END_HEADERS, END_STREAM, FrameType

from .frames import FrameReader, grpc_message, request_headers
from .service import ERROR_DETAILS, FakeAPI, make_certificates, serving, until

BIG = [("grpc.max_receive_message_length", 32 << 20), ("grpc.max_send_message_length", 32 << 20)]


def publish(action: str, correlation_id: str = "", value: bytes = b"") -> api_pb2.PublishRequest:
    return api_pb2.PublishRequest(stream=action, correlationId=correlation_id, value=value)


def target(server: RpcServer) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.fixture
async def server(service: FakeAPI) -> AsyncIterator[RpcServer]:
    async with serving(service) as server:
        yield server


@pytest.fixture
async def stub(server: RpcServer) -> AsyncIterator[api_pb2_grpc.APIStub]:
    async with grpc.aio.insecure_channel(target(server), options=BIG) as channel:
        yield api_pb2_grpc.APIStub(channel)


@pytest.fixture
async def grpclib_channel(server: RpcServer) -> AsyncIterator[grpclib.client.Channel]:
    channel = grpclib.client.Channel("127.0.0.1", server.port)
    yield channel
    channel.close()


async def aio_error(awaitable: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await awaitable
    return info.value


def grpclib_publish(channel: grpclib.client.Channel) -> grpclib.client.UnaryUnaryMethod[Any, Any]:
    return grpclib.client.UnaryUnaryMethod(
        channel, "/proto.API/Publish", api_pb2.PublishRequest, api_pb2.PublishResponse
    )


# -- unary ---------------------------------------------------------------------------------


async def test_unary_grpcio_aio(stub: api_pb2_grpc.APIStub) -> None:
    reply = await stub.FetchMetadata(api_pb2.FetchMetadataRequest(streams=["a", "b"]))
    assert [b.id for b in reply.brokers] == ["a", "b"]
    assert (await stub.Publish(publish("echo", "c1"))).correlationId == "c1"
    call = stub.Publish(publish("echo", "c2"))
    assert (await call).correlationId == "c2"
    assert await call.code() == grpc.StatusCode.OK


async def test_unary_grpcio_sync(server: RpcServer) -> None:
    def call() -> tuple[str, str]:
        with grpc.insecure_channel(target(server)) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            reply = stub.Publish(publish("echo", "sync"), timeout=10)
            metadata = stub.FetchMetadata(api_pb2.FetchMetadataRequest(streams=["s"]), timeout=10)
            return reply.correlationId, metadata.brokers[0].id

    assert await asyncio.to_thread(call) == ("sync", "s")


async def test_unary_grpclib(grpclib_channel: grpclib.client.Channel) -> None:
    reply = await grpclib_publish(grpclib_channel)(publish("echo", "lib"), timeout=10)
    assert reply.correlationId == "lib"


@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION],
)
async def test_error_code_details_and_trailing_metadata_grpcio_aio(
    stub: api_pb2_grpc.APIStub, code: grpc.StatusCode
) -> None:
    err = await aio_error(stub.Publish(publish("abort", str(code.value[0]))))
    assert err.code() == code
    assert err.details() == ERROR_DETAILS
    assert ("liftlog-error", "x") in tuple(err.trailing_metadata() or ())


async def test_error_grpcio_sync(server: RpcServer) -> None:
    def call() -> grpc.RpcError:
        with grpc.insecure_channel(target(server)) as channel:
            try:
                api_pb2_grpc.APIStub(channel).Publish(publish("abort", "9"), timeout=10)
            except grpc.RpcError as exc:
                return exc
        raise AssertionError("no error")

    err: Any = await asyncio.to_thread(call)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and err.details() == ERROR_DETAILS
    assert ("liftlog-error", "x") in tuple(err.trailing_metadata())


async def test_error_grpclib(grpclib_channel: grpclib.client.Channel) -> None:
    async with grpclib_publish(grpclib_channel).open(timeout=10) as stream:
        await stream.send_message(publish("abort", "5"), end=True)
        with pytest.raises(grpclib.exceptions.GRPCError) as info:
            await stream.recv_message()
        assert info.value.status == grpclib.const.Status.NOT_FOUND
        assert info.value.message == ERROR_DETAILS
        assert stream.trailing_metadata is not None and stream.trailing_metadata.get("liftlog-error") == "x"


async def test_handler_exception_is_unknown(stub: api_pb2_grpc.APIStub) -> None:
    err = await aio_error(stub.Publish(publish("raise")))
    assert err.code() == grpc.StatusCode.UNKNOWN and "boom" in (err.details() or "")


async def test_unknown_method_is_unimplemented(
    server: RpcServer, stub: api_pb2_grpc.APIStub, grpclib_channel: grpclib.client.Channel
) -> None:
    async with grpc.aio.insecure_channel(target(server)) as channel:
        method: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/proto.API/NoSuchMethod")
        err = await aio_error(method(b""))
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED and "/proto.API/NoSuchMethod" in (err.details() or "")
    missing = grpclib.client.UnaryUnaryMethod(
        grpclib_channel, "/other.Service/Call", api_pb2.PublishRequest, api_pb2.PublishResponse
    )
    with pytest.raises(grpclib.exceptions.GRPCError) as info:
        await missing(publish("echo"), timeout=10)
    assert info.value.status == grpclib.const.Status.UNIMPLEMENTED


async def test_a_method_the_servicer_lacks_is_unimplemented(stub: api_pb2_grpc.APIStub) -> None:
    err = await aio_error(stub.SetCursor(api_pb2.SetCursorRequest()))
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED and "proto.API/SetCursor" in (err.details() or "")
    assert (await stub.Publish(publish("echo", "after"))).correlationId == "after"  # the connection goes on


async def test_invocation_metadata_and_peer(stub: api_pb2_grpc.APIStub) -> None:
    metadata = (("x-client", "abc"), ("trace-bin", b"\x00\x01\xff"))
    reply = await stub.Publish(publish("metadata"), metadata=metadata)
    seen = json.loads(reply.correlationId)
    assert ["x-client", "abc"] in seen["metadata"]
    assert ["trace-bin", "b64:AAH/"] in seen["metadata"]
    assert not [k for k, _ in seen["metadata"] if k.startswith(":") or k in ("te", "content-type")]
    assert seen["peer"].startswith("ipv4:127.0.0.1:")


# -- streaming -------------------------------------------------------------------------------


@pytest.mark.slow
async def test_server_streaming_thousands_grpcio_aio(stub: api_pb2_grpc.APIStub) -> None:
    call = stub.Subscribe(api_pb2.SubscribeRequest(startOffset=20_000, stopOffset=100))
    offsets = [m.offset async for m in call]
    assert offsets == list(range(20_000))
    assert await call.code() == grpc.StatusCode.OK


async def test_server_streaming_grpclib_and_sync(server: RpcServer, grpclib_channel: grpclib.client.Channel) -> None:
    method = grpclib.client.UnaryStreamMethod(
        grpclib_channel, "/proto.API/Subscribe", api_pb2.SubscribeRequest, api_pb2.Message
    )
    replies = await method(api_pb2.SubscribeRequest(startOffset=3000, stopOffset=10), timeout=30)
    assert [m.offset for m in replies] == list(range(3000))

    def sync() -> list[int]:
        with grpc.insecure_channel(target(server)) as channel:
            stub = api_pb2_grpc.APIStub(channel)
            return [m.offset for m in stub.Subscribe(api_pb2.SubscribeRequest(startOffset=3000), timeout=30)]

    assert await asyncio.to_thread(sync) == list(range(3000))


async def test_server_stream_ending_in_an_error(stub: api_pb2_grpc.APIStub) -> None:
    call = stub.Subscribe(api_pb2.SubscribeRequest(stream="fail", startOffset=5, stopOffset=10))
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for message in call:
            received.append(message.offset)
    assert received == list(range(5))
    assert info.value.code() == grpc.StatusCode.DATA_LOSS and info.value.details() == ERROR_DETAILS
    assert ("liftlog-error", "x") in tuple(info.value.trailing_metadata() or ())


async def test_bidi_many_in_flight_grpcio_aio(stub: api_pb2_grpc.APIStub) -> None:
    ids = [f"c{i}" for i in range(3000)]

    async def requests() -> AsyncIterator[api_pb2.PublishRequest]:
        for cid in ids:  # all sent without waiting for a response
            yield api_pb2.PublishRequest(correlationId=cid, value=b"p" * 64)

    call = stub.PublishAsync(requests())
    assert [r.correlationId async for r in call] == ids
    assert await call.code() == grpc.StatusCode.OK


async def test_bidi_grpclib(grpclib_channel: grpclib.client.Channel) -> None:
    method = grpclib.client.StreamStreamMethod(
        grpclib_channel, "/proto.API/PublishAsync", api_pb2.PublishRequest, api_pb2.PublishResponse
    )
    async with method.open(timeout=30) as stream:
        for i in range(500):
            await stream.send_message(api_pb2.PublishRequest(correlationId=str(i)))
        await stream.end()
        replies = [r.correlationId async for r in stream]
    assert replies == [str(i) for i in range(500)]


# -- deadlines and cancellation ---------------------------------------------------------------


async def test_deadline_exceeded_cancels_the_handler(service: FakeAPI, stub: api_pb2_grpc.APIStub) -> None:
    started = time.monotonic()
    err = await aio_error(stub.Publish(publish("hang"), timeout=0.3))
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 3
    await until(lambda: service.cancelled == ["hang"])


async def test_handler_sees_time_remaining(service: FakeAPI, stub: api_pb2_grpc.APIStub) -> None:
    await stub.Publish(publish("deadline"), timeout=5)
    # grpcio rounds the grpc-timeout it sends up to its unit: a few ms over 5 s is the same deadline.
    assert service.time_remaining is not None and 3.5 < service.time_remaining <= 5.1
    await stub.Publish(publish("deadline"))
    assert service.time_remaining is None


async def test_client_cancellation_reaches_the_handler(service: FakeAPI, stub: api_pb2_grpc.APIStub) -> None:
    call = stub.Publish(publish("hang"))
    assert await asyncio.wait_for(service.started.get(), 5) == "hang"
    call.cancel()
    await until(lambda: service.cancelled == ["hang"])
    assert (await stub.Publish(publish("echo", "still"))).correlationId == "still"


async def test_client_cancelling_a_stream_reaches_the_handler(service: FakeAPI, stub: api_pb2_grpc.APIStub) -> None:
    call = stub.Subscribe(api_pb2.SubscribeRequest(stream="forever", stopOffset=10_000))
    await call.read()
    call.cancel()
    await until(lambda: service.cancelled == ["forever"])


# -- encodings and sizes -------------------------------------------------------------------


async def test_gzip_compressed_requests_grpcio(server: RpcServer, stub: api_pb2_grpc.APIStub) -> None:
    value = b"compressible " * 50_000
    reply = await stub.Publish(publish("digest", value=value), compression=grpc.Compression.Gzip)
    assert reply.correlationId.startswith(f"{len(value)}:")
    async with grpc.aio.insecure_channel(target(server), compression=grpc.Compression.Gzip) as channel:
        gzip_stub = api_pb2_grpc.APIStub(channel)
        assert (await gzip_stub.Publish(publish("echo", "gz"))).correlationId == "gz"
        call = gzip_stub.PublishAsync(iter([api_pb2.PublishRequest(correlationId=str(i)) for i in range(100)]))
        assert [r.correlationId async for r in call] == [str(i) for i in range(100)]


async def test_large_messages_both_ways(stub: api_pb2_grpc.APIStub) -> None:
    value = (b"0123456789abcdef" * (8 << 16))[: 8 << 20]  # 8 MB
    reply = await stub.Publish(publish("mirror", value=value))
    assert reply.correlationId.encode() == value
    call = stub.Subscribe(api_pb2.SubscribeRequest(startOffset=2, stopOffset=8 << 20))
    sizes = [len(m.value) async for m in call]
    assert sizes == [8 << 20, 8 << 20]


async def test_large_message_grpclib(grpclib_channel: grpclib.client.Channel) -> None:
    value = b"x" * (5 << 20)
    reply = await grpclib_publish(grpclib_channel)(publish("digest", value=value), timeout=30)
    assert reply.correlationId.startswith(f"{5 << 20}:")


# -- stopping ----------------------------------------------------------------------------


async def test_graceful_stop_lets_a_call_in_flight_finish(service: FakeAPI) -> None:
    async with serving(service) as server, grpc.aio.insecure_channel(target(server)) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        call = stub.Publish(publish("sleep", "0.3"))
        assert await asyncio.wait_for(service.started.get(), 5) == "sleep"
        started = time.monotonic()
        await server.stop(grace=10)
        assert time.monotonic() - started < 5, "stop waits for the call, not the whole grace"
        assert (await call).correlationId == "slept"
        err = await aio_error(stub.Publish(publish("echo"), timeout=2))
        assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert service.finished == ["sleep"]


async def test_stop_ends_calls_that_outlast_the_grace(service: FakeAPI) -> None:
    async with serving(service) as server, grpc.aio.insecure_channel(target(server)) as channel:
        call = api_pb2_grpc.APIStub(channel).Publish(publish("hang"))
        await asyncio.wait_for(service.started.get(), 5)
        await server.stop(grace=0.2)
        err = await aio_error(call)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert service.cancelled == ["hang"]


@pytest.mark.slow
async def test_idle_connection_is_closed(service: FakeAPI) -> None:
    """idle_timeout: GOAWAY to a connection without calls, and close it; the client reconnects."""
    options = ServerOptions(idle_timeout=0.5)
    async with serving(service, options) as server, grpc.aio.insecure_channel(target(server)) as channel:
        stub = api_pb2_grpc.APIStub(channel)
        assert (await stub.Publish(publish("sleep", "0.01"))).correlationId == "slept"
        await until(lambda: server.connections == 0, timeout=5)  # idle: GOAWAY and closed
        assert (await stub.Publish(publish("echo", "again"))).correlationId == "again"  # a new connection


# -- TLS ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    made = make_certificates(tmp_path_factory.mktemp("tls"))
    if made is None:
        pytest.skip("neither the cryptography package nor the openssl CLI is here to make certificates")
    return made


def server_tls(certs: dict[str, Path], require_client_cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs["server.pem"], certs["server.key"])
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(certs["ca.pem"])
    return context


async def test_tls_with_grpcio_and_alpn_h2(service: FakeAPI, certs: dict[str, Path]) -> None:
    async with serving(service, ssl_context=server_tls(certs)) as server:
        credentials = grpc.ssl_channel_credentials(root_certificates=certs["ca.pem"].read_bytes())
        async with grpc.aio.secure_channel(target(server), credentials) as channel:
            reply = await api_pb2_grpc.APIStub(channel).Publish(publish("echo", "tls"))
            assert reply.correlationId == "tls"
        client = ssl.create_default_context(cafile=str(certs["ca.pem"]))
        client.set_alpn_protocols(["h2", "http/1.1"])
        _, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client)
        try:
            assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        finally:
            writer.close()


async def test_tls_grpclib(service: FakeAPI, certs: dict[str, Path]) -> None:
    async with serving(service, ssl_context=server_tls(certs)) as server:
        client = ssl.create_default_context(cafile=str(certs["ca.pem"]))
        client.set_alpn_protocols(["h2"])
        channel = grpclib.client.Channel("127.0.0.1", server.port, ssl=client)
        try:
            reply = await grpclib_publish(channel)(publish("echo", "lib-tls"), timeout=10)
        finally:
            channel.close()
        assert reply.correlationId == "lib-tls"


async def test_mtls_requires_a_client_certificate(service: FakeAPI, certs: dict[str, Path]) -> None:
    async with serving(service, ssl_context=server_tls(certs, require_client_cert=True)) as server:
        root = certs["ca.pem"].read_bytes()
        with_cert = grpc.ssl_channel_credentials(
            root_certificates=root,
            private_key=certs["client.key"].read_bytes(),
            certificate_chain=certs["client.pem"].read_bytes(),
        )
        async with grpc.aio.secure_channel(target(server), with_cert) as channel:
            reply = await api_pb2_grpc.APIStub(channel).Publish(publish("echo", "mtls"))
            assert reply.correlationId == "mtls"
        without = grpc.ssl_channel_credentials(root_certificates=root)
        async with grpc.aio.secure_channel(target(server), without) as channel:
            err = await aio_error(api_pb2_grpc.APIStub(channel).Publish(publish("echo"), timeout=3))
            assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert service.started.qsize() == 1, "the call without a certificate never reached a handler"


async def test_graceful_stop_delivers_a_finished_stream_in_full(service: FakeAPI) -> None:
    """A call that finished within the grace still has its queued responses delivered before the close."""
    async with serving(service) as server, grpc.aio.insecure_channel(target(server), options=BIG) as channel:
        call = api_pb2_grpc.APIStub(channel).Subscribe(api_pb2.SubscribeRequest(startOffset=40, stopOffset=100_000))
        first = await call.read()
        assert isinstance(first, api_pb2.Message) and first.offset == 0
        stopping = asyncio.ensure_future(server.stop(grace=10))
        offsets = []
        while (message := await call.read()) is not grpc.aio.EOF:
            offsets.append(message.offset)
        assert offsets == list(range(1, 40))
        assert await call.code() == grpc.StatusCode.OK
        await stopping


async def test_graceful_stop_waits_for_a_slow_reader_to_get_its_responses(service: FakeAPI) -> None:
    """A client with the default 64 kB windows, reading slowly: stop(grace) must not cut what is queued."""
    async with serving(service) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        request = api_pb2.SubscribeRequest(startOffset=20, stopOffset=50_000).SerializeToString()
        block = hpack.Encoder().encode(request_headers("/proto.API/Subscribe"))
        writer.write(
            wire.PREFACE
            + wire.settings_frame([])
            + wire.frame(FrameType.HEADERS, END_HEADERS, 1, block)
            + wire.frame(FrameType.DATA, END_STREAM, 1, grpc_message(request))
        )
        await until(lambda: service.writes >= 5)  # the handler runs ahead of the window: its output is queued
        stopping = asyncio.ensure_future(server.stop(grace=10))
        frames = FrameReader()
        body = b""
        ended = False
        while not ended:
            chunk = await asyncio.wait_for(reader.read(1 << 16), 5)
            if not chunk:
                break
            for f in frames.feed(chunk):
                if f.type == FrameType.DATA and f.payload:
                    body += f.payload
                    writer.write(wire.window_update(0, len(f.payload)) + wire.window_update(1, len(f.payload)))
                ended = ended or (f.stream_id == 1 and bool(f.flags & END_STREAM))
            await asyncio.sleep(0.005)  # a slow reader
        writer.close()
        await stopping
        sent = [api_pb2.Message(offset=i, value=b"v" * 50_000).SerializeToString() for i in range(20)]
        assert ended, f"the connection closed after {len(body)} bytes"
        assert body == b"".join(grpc_message(m) for m in sent)
