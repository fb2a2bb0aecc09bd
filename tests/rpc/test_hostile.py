"""Malformed and abusive clients on real sockets: hand-built frames over ``asyncio.open_connection``.

Every test checks what the server answered (GOAWAY, RST_STREAM, or a bound on
what it holds) and that a well-behaved grpcio client is still served on a new
connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, cast

import grpc
import hpack
import pytest

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.rpc import ConnectionLimits, RpcServer, ServerOptions, StatusCode, wire
from liftlog.rpc.server import WRITE_HIGH_WATER
from liftlog.rpc.wire import END_HEADERS, END_STREAM, ErrorCode, FrameType, Setting

from .frames import Frame, FrameReader, goaway_code, goaways, grpc_message, request_headers, resets
from .service import FakeAPI, serving, until

LIMITS = ConnectionLimits(max_concurrent_streams=16)
ATTACKER = "127.0.0.2"


class RawClient:
    """A client socket speaking hand-built frames; collects what the server sends back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.frames: list[Frame] = []
        self.eof = False
        self._parser = FrameReader()
        self.encoder = hpack.Encoder()

    @classmethod
    async def connect(
        cls, server: RpcServer, preface: bool = True, settings: Iterable[tuple[int, int]] = ()
    ) -> RawClient:
        # From an address of its own: the server cools down addresses it caught abusing it, and the
        # well-behaved clients of these tests come from 127.0.0.1.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, local_addr=(ATTACKER, 0))
        client = cls(reader, writer)
        if preface:
            client.send(wire.PREFACE + wire.settings_frame(settings))
        return client

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def headers(self, sid: int, path: str = "/proto.API/Publish", extra: Iterable[tuple[str, str]] = ()) -> bytes:
        return wire.frame(FrameType.HEADERS, END_HEADERS, sid, self.encoder.encode(request_headers(path, extra)))

    async def read(self, until: Callable[[list[Frame]], bool] | None = None, timeout: float = 5.0) -> list[Frame]:
        """Read frames until ``until(frames)`` holds, or (``until`` None) to the end of the connection."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while until is None or not until(self.frames):
            if self.eof:
                break
            try:
                chunk = await asyncio.wait_for(self.reader.read(1 << 16), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise AssertionError(f"timed out; the server sent {self.frames[-5:]}") from None
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.eof = True
            self.frames += self._parser.feed(chunk)
        return self.frames

    async def goaway(self, timeout: float = 5.0) -> ErrorCode | None:
        """The GOAWAY the server sends before it closes the connection."""
        await self.read(lambda frames: bool(goaways(frames)), timeout)
        return goaway_code(self.frames)

    async def closed(self, timeout: float = 5.0) -> bool:
        await self.read(None, timeout)
        return self.eof

    def close(self) -> None:
        self.writer.close()


def publish(action: str, correlation_id: str = "") -> bytes:
    return grpc_message(api_pb2.PublishRequest(stream=action, correlationId=correlation_id).SerializeToString())


def header_fields(decoder: hpack.Decoder, block: bytes) -> dict[str, str]:
    """A header block's fields: without ``raw=True`` hpack gives str names and values, not its annotation's bytes."""
    return cast(dict[str, str], dict(decoder.decode(block)))


async def assert_serving(server: RpcServer) -> None:
    """A well-behaved client is served on a new connection."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        reply = await api_pb2_grpc.APIStub(channel).Publish(
            api_pb2.PublishRequest(stream="echo", correlationId="ok"), timeout=5
        )
    assert reply.correlationId == "ok"


@pytest.fixture
async def server(service: FakeAPI) -> AsyncIterator[RpcServer]:
    async with serving(service, ServerOptions(limits=LIMITS)) as server:
        yield server


def server_connection(server: RpcServer) -> Any:
    """The server's one connection (white-box: its core and transport)."""
    (conn,) = server._connections
    return conn


# -- malformed input -------------------------------------------------------------------------


async def test_garbage_instead_of_the_preface(server: RpcServer) -> None:
    client = await RawClient.connect(server, preface=False)
    client.send(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert await client.goaway() == ErrorCode.PROTOCOL_ERROR
    assert await client.closed()
    await assert_serving(server)


async def test_tls_hello_to_a_plaintext_server(server: RpcServer) -> None:
    client = await RawClient.connect(server, preface=False)
    client.send(bytes.fromhex("160301020001") + b"\x00" * 64)  # the start of a TLS ClientHello
    assert await client.goaway() == ErrorCode.PROTOCOL_ERROR
    assert await client.closed()


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (wire.frame(FrameType.DATA, 0, 0, b"x"), ErrorCode.PROTOCOL_ERROR),
        (wire.frame(FrameType.DATA, 0, 9, b"x"), ErrorCode.PROTOCOL_ERROR),
        (wire.frame(FrameType.PUSH_PROMISE, END_HEADERS, 1, b"\0\0\0\2"), ErrorCode.PROTOCOL_ERROR),
        (wire.frame_header(FrameType.DATA, 0, 1, 1 << 20), ErrorCode.FRAME_SIZE_ERROR),  # the header is enough
        (wire.frame(FrameType.HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff\x0f"), ErrorCode.COMPRESSION_ERROR),
        (wire.frame(FrameType.HEADERS, END_HEADERS, 2, b"\x82"), ErrorCode.PROTOCOL_ERROR),
        (wire.frame(FrameType.SETTINGS, 0, 0, b"\0" * 7), ErrorCode.FRAME_SIZE_ERROR),
        (wire.settings_frame([(Setting.INITIAL_WINDOW_SIZE, 1 << 31)]), ErrorCode.FLOW_CONTROL_ERROR),
        (wire.window_update(0, 0), ErrorCode.PROTOCOL_ERROR),
        (wire.window_update(0, (1 << 31) - 1), ErrorCode.FLOW_CONTROL_ERROR),
        (wire.frame(FrameType.PING, 0, 0, b"short"), ErrorCode.FRAME_SIZE_ERROR),
    ],
    ids=[
        "data on stream 0",
        "data on an idle stream",
        "push promise",
        "frame over max size",
        "bad hpack",
        "even stream id",
        "settings length",
        "initial window too large",
        "window update of 0",
        "window overflow",
        "ping length",
    ],
)
async def test_malformed_frame_is_a_goaway(server: RpcServer, frame: bytes, code: ErrorCode) -> None:
    client = await RawClient.connect(server)
    client.send(frame)
    assert await client.goaway() == code
    assert await client.closed()
    await assert_serving(server)


async def test_continuation_interrupted(server: RpcServer) -> None:
    client = await RawClient.connect(server)
    client.send(wire.frame(FrameType.HEADERS, 0, 1, b"\x83") + wire.frame(FrameType.PING, 0, 0, b"\0" * 8))
    assert await client.goaway() == ErrorCode.PROTOCOL_ERROR
    await assert_serving(server)


async def test_oversize_headers(server: RpcServer, service: FakeAPI) -> None:
    client = await RawClient.connect(server)
    block = client.encoder.encode(request_headers(extra=[("x-huge", "h" * 40_000)]))
    frames = [block[i : i + 16_384] for i in range(0, len(block), 16_384)]
    client.send(wire.frame(FrameType.HEADERS, 0, 1, frames[0]))
    for i, piece in enumerate(frames[1:], 1):
        client.send(wire.frame(FrameType.CONTINUATION, END_HEADERS if i == len(frames) - 1 else 0, 1, piece))
    assert await client.goaway() == ErrorCode.ENHANCE_YOUR_CALM
    assert service.started.empty()
    await assert_serving(server)


async def test_continuation_flood(server: RpcServer) -> None:
    client = await RawClient.connect(server)
    client.send(wire.frame(FrameType.HEADERS, 0, 1, b"\x83"))
    client.send(wire.frame(FrameType.CONTINUATION, 0, 1, b"\x00" * 16_000) * 100)  # 1.6 MB of header block
    assert await client.goaway() == ErrorCode.ENHANCE_YOUR_CALM
    assert await client.closed()
    await assert_serving(server)


# -- floods ---------------------------------------------------------------------------------


async def test_streams_past_the_concurrent_limit_are_refused(server: RpcServer, service: FakeAPI) -> None:
    client = await RawClient.connect(server)
    sids = range(1, 2 * 40, 2)
    client.send(
        b"".join(client.headers(sid) + wire.frame(FrameType.DATA, END_STREAM, sid, publish("hang")) for sid in sids)
    )
    refused = list(sids)[LIMITS.max_concurrent_streams :]
    await client.read(lambda frames: len(resets(frames)) >= len(refused))
    assert resets(client.frames) == dict.fromkeys(refused, ErrorCode.REFUSED_STREAM)
    await until(lambda: service.started.qsize() == LIMITS.max_concurrent_streams)
    assert goaway_code(client.frames) is None
    await assert_serving(server)
    client.close()
    await until(lambda: len(service.cancelled) == LIMITS.max_concurrent_streams)  # connection gone: calls cancelled


async def test_rapid_reset_flood(server: RpcServer, service: FakeAPI) -> None:
    client = await RawClient.connect(server)
    burst = LIMITS.reset_rate[0]
    client.send(
        b"".join(client.headers(sid) + wire.rst_stream(sid, ErrorCode.CANCEL) for sid in range(1, 2 * (burst + 100), 2))
    )
    assert await client.goaway() == ErrorCode.ENHANCE_YOUR_CALM
    assert await client.closed()
    await assert_serving(server)
    assert server.connections <= 1


async def test_connections_past_the_cap_are_closed_on_arrival(service: FakeAPI) -> None:
    async with serving(service, ServerOptions(limits=LIMITS, max_connections=3)) as server:
        held = [await RawClient.connect(server) for _ in range(3)]
        await until(lambda: server.connections == 3)
        extra = await RawClient.connect(server)
        assert await extra.closed(), "closed at once, not served"
        assert server.refused_connections == 1 and server.connections == 3
        held.pop().close()
        await until(lambda: server.connections == 2)
        await assert_serving(server)  # room again: a well-behaved client is served
        for client in held:
            client.close()


async def test_made_you_reset_flood(server: RpcServer) -> None:
    """Streams the server must reset (WINDOW_UPDATE 0 on each): policed like the client's own resets."""
    client = await RawClient.connect(server)
    burst = LIMITS.reset_rate[0]
    client.send(
        b"".join(
            client.headers(sid) + wire.frame(FrameType.WINDOW_UPDATE, 0, sid, b"\0\0\0\0")
            for sid in range(1, 2 * (burst + 100), 2)
        )
    )
    assert await client.goaway() == ErrorCode.ENHANCE_YOUR_CALM
    assert await client.closed()
    await assert_serving(server)
    assert server.connections <= 1
    assert server.resets_sent >= burst


async def test_ping_flood(server: RpcServer) -> None:
    client = await RawClient.connect(server)
    client.send(wire.frame(FrameType.PING, 0, 0, b"\0" * 8) * (LIMITS.max_ping_strikes + 5))
    assert await client.goaway() == ErrorCode.ENHANCE_YOUR_CALM
    acks = [f for f in client.frames if f.type == FrameType.PING and f.flags & wire.ACK]
    assert len(acks) == LIMITS.max_ping_strikes + 1  # the first ping is no strike
    await assert_serving(server)


def acks(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f.type == FrameType.PING and f.flags & wire.ACK]


async def test_a_ping_ack_waits_for_a_running_calls_answer_and_goes_ahead_of_it(service: FakeAPI) -> None:
    async with serving(service, ServerOptions(limits=LIMITS, ping_ack_delay=30.0)) as server:
        client = await RawClient.connect(server)
        await client.read(lambda frames: any(f.type == FrameType.SETTINGS for f in frames))
        client.send(client.headers(1, "/proto.API/PublishAsync"))
        await until(lambda: bool(server_connection(server).calls))
        client.send(wire.frame(FrameType.PING, 0, 0, b"pingpong"))
        with pytest.raises(AssertionError):  # held: a response is coming
            await client.read(lambda frames: bool(acks(frames)), timeout=0.3)
        request = api_pb2.PublishRequest(correlationId="c1").SerializeToString()
        client.send(wire.frame(FrameType.DATA, 0, 1, grpc_message(request)))
        frames = await client.read(lambda frames: any(f.type == FrameType.DATA for f in frames))
        kinds = [(f.type, f.flags & wire.ACK) for f in frames]
        assert kinds.index((FrameType.PING, wire.ACK)) < kinds.index((FrameType.DATA, 0))
        await assert_serving(server)


async def test_a_held_ping_ack_goes_alone_after_the_delay(service: FakeAPI) -> None:
    async with serving(service, ServerOptions(limits=LIMITS, ping_ack_delay=0.05)) as server:
        client = await RawClient.connect(server)
        client.send(client.headers(1, "/proto.API/PublishAsync"))  # a call that never answers
        await until(lambda: bool(server_connection(server).calls))
        started = time.monotonic()
        client.send(wire.frame(FrameType.PING, 0, 0, b"pingpong"))
        frames = await client.read(lambda frames: bool(acks(frames)))
        assert acks(frames)[0].payload == b"pingpong"
        assert time.monotonic() - started < 2.0


async def test_a_ping_with_no_call_running_is_acked_at_once(service: FakeAPI) -> None:
    async with serving(service, ServerOptions(limits=LIMITS, ping_ack_delay=30.0)) as server:
        client = await RawClient.connect(server)
        client.send(wire.frame(FrameType.PING, 0, 0, b"pingpong"))
        frames = await client.read(lambda frames: bool(acks(frames)), timeout=5.0)
        assert acks(frames)[0].payload == b"pingpong"


async def test_a_ping_flood_while_a_call_runs_is_still_refused_and_its_acks_are_bounded(service: FakeAPI) -> None:
    async with serving(service, ServerOptions(limits=LIMITS, ping_ack_delay=30.0)) as server:
        client = await RawClient.connect(server)
        client.send(client.headers(1, "/proto.API/PublishAsync"))  # acks are held while it runs
        await until(lambda: bool(server_connection(server).calls))
        client.send(wire.frame(FrameType.PING, 0, 0, b"\0" * 8) * 10_000)
        assert await client.goaway() == ErrorCode.ENHANCE_YOUR_CALM
        assert len(acks(client.frames)) <= LIMITS.max_ping_strikes + 1  # held ones left with the GOAWAY
        await assert_serving(server)


async def test_settings_flood(server: RpcServer) -> None:
    client = await RawClient.connect(server)
    client.send(wire.settings_frame([(Setting.HEADER_TABLE_SIZE, 4096)]) * 1000)
    assert await client.goaway() == ErrorCode.ENHANCE_YOUR_CALM
    await assert_serving(server)


@pytest.mark.parametrize(
    "junk",
    [wire.frame(0x42, 0, 0, b"?"), wire.frame(FrameType.PRIORITY, 0, 3, b"\0\0\0\0\1")],
    ids=["unknown frame type", "priority"],
)
async def test_junk_frame_flood(server: RpcServer, junk: bytes) -> None:
    client = await RawClient.connect(server)
    client.send(junk * 5000)
    assert await client.goaway() == ErrorCode.ENHANCE_YOUR_CALM
    await assert_serving(server)


async def test_empty_data_flood(server: RpcServer) -> None:
    client = await RawClient.connect(server)
    client.send(client.headers(1) + wire.frame(FrameType.DATA, 0, 1, b"") * 5000)
    assert await client.goaway() == ErrorCode.ENHANCE_YOUR_CALM
    await assert_serving(server)


# -- slow and stalled clients -----------------------------------------------------------------


async def _forever(client: RawClient, service: FakeAPI, message_bytes: int) -> None:
    request = api_pb2.SubscribeRequest(stream="forever", stopOffset=message_bytes).SerializeToString()
    client.send(
        client.headers(1, "/proto.API/Subscribe") + wire.frame(FrameType.DATA, END_STREAM, 1, grpc_message(request))
    )
    await until(lambda: service.writes > 0)


async def _stalled(service: FakeAPI) -> int:
    """Wait until the handler stops getting its writes through; the count it reached."""
    while True:
        before = service.writes
        await asyncio.sleep(0.2)
        if service.writes == before and service.write_blocked:
            return before


async def test_client_that_never_reads_gets_no_more_than_its_window(server: RpcServer, service: FakeAPI) -> None:
    """Default windows: what the server queues for the call stays under the write high-water mark."""
    client = await RawClient.connect(server)
    await _forever(client, service, 10_000)
    count = await _stalled(service)
    conn = server_connection(server)
    assert conn.core.buffered(1) <= WRITE_HIGH_WATER + 10_100
    assert conn.transport.get_write_buffer_size() < 256 << 10
    assert count * 10_000 < wire.DEFAULT_WINDOW + WRITE_HIGH_WATER + 20_000
    await assert_serving(server)
    client.close()
    await until(lambda: service.cancelled == ["forever"])  # the connection's end cancels the handler


async def test_client_that_opens_its_windows_but_never_reads(server: RpcServer, service: FakeAPI) -> None:
    """Huge windows, socket never read: the socket's buffers fill, then the transport's; writes stop."""
    client = await RawClient.connect(server, settings=[(Setting.INITIAL_WINDOW_SIZE, wire.MAX_WINDOW)])
    client.send(wire.window_update(0, wire.MAX_WINDOW - wire.DEFAULT_WINDOW))
    await _forever(client, service, 50_000)
    count = await _stalled(service)
    conn = server_connection(server)
    assert conn.paused, "the transport asked us to stop writing"
    assert conn.transport.get_write_buffer_size() < 1 << 20
    assert conn.core.buffered(1) <= WRITE_HIGH_WATER + 50_100
    await asyncio.sleep(0.3)
    assert service.writes == count, "the handler's write stays blocked"
    await assert_serving(server)
    client.close()
    await until(lambda: service.cancelled == ["forever"])


@pytest.mark.slow
async def test_half_a_frame_then_silence_is_closed_by_keepalive(service: FakeAPI) -> None:
    options = ServerOptions(limits=LIMITS, keepalive_time=0.5, keepalive_timeout=0.5)
    async with serving(service, options) as server:
        client = await RawClient.connect(server)
        headers = client.headers(1)
        client.send(headers[: len(headers) // 2])  # and nothing more, not even a PING ACK
        await assert_serving(server)  # meanwhile, others are served
        assert await client.closed(timeout=5)
        assert any(f.type == FrameType.PING and not f.flags & wire.ACK for f in client.frames)
        assert goaway_code(client.frames) == ErrorCode.NO_ERROR
        assert service.started.qsize() == 1  # only assert_serving's call reached a handler


async def test_server_enforces_the_deadline_of_a_client_that_does_not(server: RpcServer, service: FakeAPI) -> None:
    client = await RawClient.connect(server)
    client.send(client.headers(1, extra=[("grpc-timeout", "200m")]))
    client.send(wire.frame(FrameType.DATA, END_STREAM, 1, publish("hang")))
    started = time.monotonic()
    await client.read(lambda frames: any(f.stream_id == 1 and f.flags & END_STREAM for f in frames))
    assert time.monotonic() - started < 2
    decoder = hpack.Decoder()
    (block,) = [header_fields(decoder, f.payload) for f in client.frames if f.type == FrameType.HEADERS]
    assert block["grpc-status"] == str(StatusCode.DEADLINE_EXCEEDED.value)
    await until(lambda: service.cancelled == ["hang"])


async def test_client_goaway_lets_its_calls_finish_then_closes(server: RpcServer, service: FakeAPI) -> None:
    client = await RawClient.connect(server)
    client.send(client.headers(1) + wire.frame(FrameType.DATA, END_STREAM, 1, publish("sleep", "0.2")))
    assert await asyncio.wait_for(service.started.get(), 5) == "sleep"
    client.send(wire.goaway(0, ErrorCode.NO_ERROR))
    assert await client.closed(timeout=3), "the server closes the connection once its last call is done"
    trailers = [f for f in client.frames if f.stream_id == 1 and f.flags & END_STREAM]
    assert trailers and service.finished == ["sleep"]
    assert goaways(client.frames)[0][:2] == (1, ErrorCode.NO_ERROR)


class _BatchTaker:
    """PublishAsync that takes what one read brought, as liftlog's handler does; answers how many it got."""

    async def PublishAsync(self, requests: Any, context: Any) -> None:
        while batch := await requests.next_batch(1000):
            await context.write(api_pb2.PublishResponse(correlationId=f"{len(batch)}:{batch[-1].correlationId}"))


async def test_a_malformed_message_among_good_ones_in_one_read() -> None:
    """The messages before it are served; then the call fails with INTERNAL naming the parse error."""
    async with serving(_BatchTaker()) as server:
        client = await RawClient.connect(server)
        body = publish("a", "1") + publish("a", "2") + grpc_message(b"\xff\xff\xff") + publish("a", "3")
        client.send(client.headers(1, "/proto.API/PublishAsync") + wire.frame(FrameType.DATA, END_STREAM, 1, body))
        await client.read(lambda frames: any(f.stream_id == 1 and f.flags & END_STREAM for f in frames))
        data = b"".join(f.payload for f in client.frames if f.stream_id == 1 and f.type == FrameType.DATA)
        assert api_pb2.PublishResponse.FromString(data[5:]).correlationId == "2:2"
        decoder = hpack.Decoder()
        (block,) = [header_fields(decoder, f.payload) for f in client.frames if f.type == FrameType.HEADERS][-1:]
        assert block["grpc-status"] == str(StatusCode.INTERNAL.value)
        assert "cannot parse request message" in urllib.parse.unquote(block["grpc-message"])


# -- server-wide bounds: abusive addresses cool down, the buffer budget holds ----------------------------


async def test_an_address_closed_for_abuse_is_refused_for_a_while(service: FakeAPI) -> None:
    """A flood that reconnects after each GOAWAY would get a fresh allowance each time: its address waits."""
    async with serving(service, ServerOptions(limits=LIMITS, abuse_cooldown=0.5)) as server:
        client = await RawClient.connect(server)
        burst = LIMITS.reset_rate[0]
        client.send(b"".join(client.headers(sid) + wire.rst_stream(sid, 8) for sid in range(1, 4 * burst, 2)))
        assert await client.goaway() == ErrorCode.ENHANCE_YOUR_CALM
        again = await RawClient.connect(server)
        assert await again.closed(), "closed on arrival"
        assert not again.frames, "not even the server's SETTINGS: it costs the server nothing"
        assert server.cooled_connections == 1
        await assert_serving(server)  # another address is served meanwhile
        await asyncio.sleep(0.6)
        later = await RawClient.connect(server)
        later.send(later.headers(1) + wire.frame(FrameType.DATA, END_STREAM, 1, publish("echo", "late")))
        await later.read(lambda frames: any(f.type == FrameType.DATA for f in frames))
        later.close()


async def _hoard(server: RpcServer, streams: int = 8) -> RawClient:
    """A client that announces 1 MB messages on ``streams`` calls and sends what the windows allow, never all."""
    client = await RawClient.connect(server)
    client.send(b"".join(client.headers(sid) for sid in range(1, 2 * streams, 2)))
    window, stream_window = wire.DEFAULT_WINDOW, dict.fromkeys(range(1, 2 * streams, 2), wire.DEFAULT_WINDOW)
    first = dict.fromkeys(stream_window, True)
    for _ in range(40):
        for sid in stream_window:
            room = min(window, stream_window[sid], 16_384)
            if room < 5:
                continue
            prefix = b"\0" + (1_000_000).to_bytes(4, "big") if first[sid] else b""  # never finished
            payload = (prefix + b"h" * room)[:room]
            first[sid] = False
            client.send(wire.frame(FrameType.DATA, 0, sid, payload))
            window -= room
            stream_window[sid] -= room
        with contextlib.suppress(AssertionError):  # timed out: nothing more came
            await client.read(lambda frames: False, timeout=0.05)
        for f in client.frames:
            if f.type == FrameType.WINDOW_UPDATE:
                inc = int.from_bytes(f.payload, "big") & 0x7FFFFFFF
                if f.stream_id == 0:
                    window += inc
                elif f.stream_id in stream_window:
                    stream_window[f.stream_id] += inc
        # a slow machine may close a hoarder while it still hoards: its GOAWAY stays for the test to read
        client.frames = [f for f in client.frames if f.type == FrameType.GOAWAY]
        if client.eof:
            break
    return client


async def test_hoarding_connections_get_no_more_than_the_budget_and_stalled_ones_are_closed(
    service: FakeAPI,
) -> None:
    budget = 2 << 20
    options = ServerOptions(limits=LIMITS, max_buffered_bytes=budget, stall_timeout=1.0, abuse_cooldown=0.0)
    async with serving(service, options) as server:
        hoarders = await asyncio.gather(*(_hoard(server) for _ in range(6)))
        assert server.budget is not None
        assert server.budget.used <= budget
        held = sum(c.core._partial + c.core._buffered for c in server._connections)
        assert held <= budget + len(hoarders) * wire.DEFAULT_WINDOW
        assert server.budget.waiting, "the hoarders want more than there is"
        await assert_serving(server)  # a newcomer publishes within its own 64 KiB
        await until(lambda: server.stalled_connections > 0, timeout=5)
        calmed = 0
        for h in hoarders:
            with contextlib.suppress(AssertionError):  # still open: it was not among the ones closed
                calmed += await h.goaway(timeout=0.5) == ErrorCode.ENHANCE_YOUR_CALM
        assert 1 <= calmed <= server.stalled_connections
        assert server.budget.used <= budget
        for h in hoarders:
            h.close()
        await until(lambda: server.connections == 0 and server.budget is not None and server.budget.used == 0)
