"""Sans-IO tests of :class:`ServerConnection`: bytes piped in memory, no sockets, time passed in by hand.

Clients are an ``h2`` client connection (it also checks what the server sends
against RFC 9113: it fails on DATA beyond its windows, malformed headers, ...)
or hand-built frames for what a well-behaved client never sends.
"""

from __future__ import annotations

import gzip
import struct
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liftlog.rpc import wire
from liftlog.rpc.connection import BufferBudget
from liftlog.rpc.server_connection import (
    ConnectionLimits,
    ConnectionTerminated,
    Event,
    MessageReceived,
    PingAcked,
    RequestEnded,
    RequestReceived,
    ServerConnection,
    StreamReset,
    WindowOpened,
)
from liftlog.rpc.status import StatusCode
from liftlog.rpc.wire import ACK, END_HEADERS, END_STREAM, PADDED, PRIORITY_FLAG, ErrorCode, FrameType, Setting

from .frames import PATH, Frame, goaway_code, goaways, grpc_message, parse_frames, request_headers, resets


def check_accounting(conn: ServerConnection) -> None:
    """The connection's byte counters agree with its streams (white-box: drift would defeat max_buffered_bytes)."""
    streams = conn._streams.values()
    assert conn._partial == sum(len(s.buf) for s in streams)
    assert conn._buffered == sum(s.held for s in streams)
    budget = conn._budget
    if budget is not None and not conn.closed:  # what it holds or has open is charged beyond its floor
        assert conn._charged >= conn._footprint() - budget.floor


@dataclass
class Response:
    headers: dict[bytes, bytes] | None = None
    data: bytes = b""
    trailers: dict[bytes, bytes] | None = None
    ended: bool = False
    reset: int | None = None

    @property
    def status(self) -> int | None:
        block = self.trailers if self.trailers is not None else self.headers  # trailers-only: in the headers
        return None if block is None or b"grpc-status" not in block else int(block[b"grpc-status"])

    @property
    def message(self) -> str:
        block = self.trailers if self.trailers is not None else self.headers or {}
        return urllib.parse.unquote(block.get(b"grpc-message", b"").decode())


class Pair:
    """An h2 client and a ServerConnection, wired together in memory."""

    def __init__(
        self,
        limits: ConnectionLimits | None = None,
        client_settings: dict[int, int] | None = None,
        budget: BufferBudget | None = None,
    ):
        self.client = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.client.initiate_connection()
        if client_settings:
            self.client.update_settings(client_settings)
        self.server = ServerConnection(limits or ConnectionLimits(), budget)
        self.now = 0.0
        self.events: list[Event] = []  # the server's
        self.client_events: list[h2.events.Event] = []
        self.frames: list[Frame] = []  # all the server sent
        self._taken: set[int] = set()  # ids of MessageReceived events consumed
        self.pump()

    def pump(self) -> list[Event]:
        """Move bytes both ways until neither side has anything to say; the server's new events."""
        new: list[Event] = []
        while True:
            data = self.client.data_to_send()
            if data:
                new += self.server.receive(data, self.now)
                check_accounting(self.server)
            out = self.server.data_to_send()
            if out:
                self.frames += parse_frames(out)
                self.client_events += self.client.receive_data(out)
            if not data and not out:
                break
        self.events += new
        return new

    def start(self, path: str = PATH, extra: Iterable[tuple[str, str]] = (), end_stream: bool = False) -> int:
        sid = self.client.get_next_available_stream_id()
        self.client.send_headers(sid, request_headers(path, extra), end_stream=end_stream)
        self.pump()
        return sid

    def send(self, sid: int, data: bytes, end_stream: bool = False) -> int:
        """Send as much of ``data`` as the windows let the client, pumping in between; the bytes sent."""
        sent = 0
        while True:
            window = self.client.local_flow_control_window(sid)
            room = min(window, self.client.max_outbound_frame_size, len(data) - sent)
            if room <= 0 and sent < len(data):
                return sent
            last = sent + room == len(data)
            self.client.send_data(sid, data[sent : sent + room], end_stream=end_stream and last)
            sent += room
            self.pump()
            if last:
                return sent

    def messages(self, sid: int) -> list[MessageReceived]:
        return [e for e in self.events if isinstance(e, MessageReceived) and e.stream_id == sid]

    def consume(self, sid: int, count: int | None = None) -> int:
        """The app takes the messages of ``sid`` it has not taken yet (``count`` of them); their sizes."""
        total = 0
        for e in self.messages(sid):
            if id(e) not in self._taken and (count is None or count > 0):
                count = None if count is None else count - 1
                self._taken.add(id(e))
                self.server.consumed(sid, e.size)
                total += e.size
        self.pump()
        return total

    def response(self, sid: int) -> Response:
        r = Response()
        for e in self.client_events:
            if getattr(e, "stream_id", None) != sid:
                continue
            if isinstance(e, h2.events.ResponseReceived):
                r.headers = dict(e.headers)
            elif isinstance(e, h2.events.DataReceived):
                r.data += e.data
            elif isinstance(e, h2.events.TrailersReceived):
                r.trailers = dict(e.headers)
            elif isinstance(e, h2.events.StreamEnded):
                r.ended = True
            elif isinstance(e, h2.events.StreamReset):
                r.reset = e.error_code
        return r


class Raw:
    """Hand-built client frames into a ServerConnection; its output parsed."""

    def __init__(
        self, limits: ConnectionLimits | None = None, settings: Iterable[tuple[int, int]] = (), now: float = 0.0
    ) -> None:
        self.conn = ServerConnection(limits or ConnectionLimits())
        self.encoder = hpack.Encoder()
        self.frames: list[Frame] = []
        self.events: list[Event] = []
        self.send(wire.PREFACE + wire.settings_frame(settings), now)

    def send(self, data: bytes, now: float = 0.0) -> list[Event]:
        events = self.conn.receive(data, now)
        check_accounting(self.conn)
        self.events += events
        self.frames += parse_frames(self.conn.data_to_send())
        return events

    def headers(
        self, sid: int, headers: list[tuple[str, str]] | None = None, flags: int = END_HEADERS, prefix: bytes = b""
    ) -> bytes:
        block = self.encoder.encode(headers if headers is not None else request_headers())
        return wire.frame(FrameType.HEADERS, flags, sid, prefix + block)

    @property
    def goaway(self) -> ErrorCode | None:
        return goaway_code(self.frames)

    def sent(self, kind: int, sid: int | None = None) -> list[Frame]:
        return [f for f in self.frames if f.type == kind and (sid is None or f.stream_id == sid)]

    def decode_headers(self, sid: int) -> list[dict[bytes, bytes]]:
        """Header blocks the server sent on ``sid`` (HEADERS and CONTINUATION joined), decoded."""
        decoder = hpack.Decoder()
        blocks: list[dict[bytes, bytes]] = []
        block = b""
        for f in self.frames:
            if f.stream_id == sid and f.type in (FrameType.HEADERS, FrameType.CONTINUATION):
                block += f.payload
                if f.flags & END_HEADERS:
                    blocks.append(dict(decoder.decode(block, raw=True)))
                    block = b""
        return blocks


def data(sid: int, payload: bytes, flags: int = 0) -> bytes:
    return wire.frame(FrameType.DATA, flags, sid, payload)


def ping(payload: bytes = b"12345678", flags: int = 0, sid: int = 0) -> bytes:
    return wire.frame(FrameType.PING, flags, sid, payload)


# -- calls ---------------------------------------------------------------------------


def test_server_preface_announces_limits() -> None:
    limits = ConnectionLimits(max_concurrent_streams=7, stream_window=100_000, connection_window=1 << 20)
    raw = Raw(limits)
    settings, update, ack = raw.frames[:3]
    assert settings.type == FrameType.SETTINGS and not settings.flags & ACK
    values = dict(struct.unpack(">HL", settings.payload[i : i + 6]) for i in range(0, len(settings.payload), 6))
    assert values[Setting.MAX_CONCURRENT_STREAMS] == 7
    assert values[Setting.INITIAL_WINDOW_SIZE] == 100_000
    assert values[Setting.MAX_HEADER_LIST_SIZE] == limits.max_header_list_size
    assert update.type == FrameType.WINDOW_UPDATE and update.stream_id == 0
    assert struct.unpack(">L", update.payload)[0] == (1 << 20) - wire.DEFAULT_WINDOW
    assert ack.type == FrameType.SETTINGS and ack.flags & ACK  # the client's SETTINGS acknowledged


def test_unary_call() -> None:
    p = Pair()
    sid = p.start(extra=[("x-request-id", "r7")])
    p.send(sid, grpc_message(b"request"), end_stream=True)
    request, message, ended = p.events
    assert request == RequestReceived(sid, PATH, (("x-request-id", "r7"),), None)
    assert isinstance(message, MessageReceived) and message.data == b"request" and message.size == 12
    assert ended == RequestEnded(sid)
    assert p.server.is_open(sid)
    p.consume(sid)
    assert p.server.send_message(sid, b"response")
    assert p.server.send_trailers(sid, StatusCode.OK)
    p.pump()
    r = p.response(sid)
    assert r.headers == {b":status": b"200", b"content-type": b"application/grpc"}
    assert r.data == grpc_message(b"response")
    assert r.trailers == {b"grpc-status": b"0"} and r.status == 0
    assert r.ended and r.reset is None
    assert p.server.open_streams == 0 and not p.server.is_open(sid)
    assert not p.server.send_message(sid, b"late") and not p.server.send_trailers(sid, StatusCode.OK)
    assert not resets(p.frames), "a call the client ended needs no reset"


def test_server_streaming_while_the_client_is_still_sending() -> None:
    p = Pair()
    sid = p.start()
    p.send(sid, grpc_message(b"req"))  # no END_STREAM: the client goes on sending
    for i in range(3):
        p.server.send_message(sid, b"m%d" % i)
    p.server.send_trailers(sid, StatusCode.OK, metadata=[("liftlog-error", "x"), ("trace-bin", b"\x00\xff")])
    p.pump()
    r = p.response(sid)
    assert r.data == b"".join(grpc_message(b"m%d" % i) for i in range(3))
    assert r.trailers == {b"grpc-status": b"0", b"liftlog-error": b"x", b"trace-bin": b"AP8"}
    assert p.server.open_streams == 0
    p.send(sid, grpc_message(b"late"))  # what it sends after our trailers is dropped
    assert len(p.messages(sid)) == 1 and not [e for e in p.events if isinstance(e, ConnectionTerminated)]


def test_message_split_across_data_frames() -> None:
    raw = Raw()
    body = grpc_message(b"x" * 1000)
    raw.send(raw.headers(1))
    pieces = [body[:2], body[2:4], body[4:10], body[10:600], body[600:]]
    for piece in pieces[:-1]:
        raw.send(data(1, piece))
        assert not [e for e in raw.events if isinstance(e, MessageReceived)]
    raw.send(data(1, pieces[-1], END_STREAM))
    (message,) = [e for e in raw.events if isinstance(e, MessageReceived)]
    assert message.data == b"x" * 1000 and message.size == len(body)
    assert raw.events[-1] == RequestEnded(1)


def test_large_message_spans_many_frames_and_windows() -> None:
    p = Pair(ConnectionLimits(stream_window=65_536, connection_window=65_536))
    sid = p.start()
    payload = bytes(range(256)) * 1000  # 256 kB: four stream windows
    assert p.send(sid, grpc_message(payload), end_stream=True) == len(payload) + 5
    (message,) = p.messages(sid)
    assert message.data == payload
    assert p.events[-1] == RequestEnded(sid)


def test_input_one_byte_at_a_time_means_the_same() -> None:
    encoder = hpack.Encoder()
    stream = (
        wire.PREFACE
        + wire.settings_frame([(Setting.INITIAL_WINDOW_SIZE, 1 << 20)])
        + wire.frame(FrameType.HEADERS, END_HEADERS, 1, encoder.encode(request_headers(extra=[("k", "v")])))
        + data(1, grpc_message(b"first") + grpc_message(b"sec"))
        + data(1, b"\x02\x00\x00", PADDED)  # padding only
        + data(1, grpc_message(b"ond")[:3])
        + data(1, grpc_message(b"ond")[3:], END_STREAM)
        + ping()
        + wire.window_update(0, 1000)
    )
    whole = ServerConnection()
    events_whole = whole.receive(stream, 0.0)
    out_whole = whole.data_to_send()
    drip = ServerConnection()
    events_drip: list[Event] = []
    for i in range(len(stream)):
        events_drip += drip.receive(stream[i : i + 1], 0.0)
    assert events_drip == events_whole
    assert drip.data_to_send() == out_whole
    assert [type(e) for e in events_whole] == [
        RequestReceived,
        MessageReceived,
        MessageReceived,
        MessageReceived,
        RequestEnded,
    ]
    assert [e.data for e in events_whole if isinstance(e, MessageReceived)] == [b"first", b"sec", b"ond"]
    assert [f.type for f in parse_frames(out_whole)].count(FrameType.PING) == 1  # the ACK


def test_several_messages_in_one_frame() -> None:
    raw = Raw()
    bodies = [b"", b"a", b"bb" * 100, b"ccc"]
    raw.send(raw.headers(1))
    raw.send(data(1, b"".join(grpc_message(b) for b in bodies)))
    messages = [e for e in raw.events if isinstance(e, MessageReceived)]
    assert [m.data for m in messages] == bodies
    assert sum(m.size for m in messages) == sum(5 + len(b) for b in bodies)


def test_padded_headers_with_priority_fields() -> None:
    raw = Raw()
    block = raw.encoder.encode(request_headers())
    payload = bytes([3]) + b"\0\0\0\0\x10" + block + b"\0\0\0"  # pad length, priority fields, block, padding
    raw.send(wire.frame(FrameType.HEADERS, END_HEADERS | PADDED | PRIORITY_FLAG, 1, payload))
    assert raw.events == [RequestReceived(1, PATH, (), None)]
    assert raw.goaway is None


def test_request_trailers_end_the_request() -> None:
    raw = Raw()
    raw.send(raw.headers(1) + data(1, grpc_message(b"m")))
    raw.send(raw.headers(1, [("x-trailer", "1")], END_HEADERS | END_STREAM))
    assert raw.events[-1] == RequestEnded(1)
    assert raw.goaway is None


def test_trailers_only_error_percent_encodes_the_message() -> None:
    p = Pair()
    sid = p.start(end_stream=True)
    details = "no stream 'ü' at 100%\nsee\tlogs"
    p.server.send_trailers(sid, StatusCode.NOT_FOUND, details, [("liftlog-error", "stream_not_found")])
    p.pump()
    (headers,) = [f for f in p.frames if f.stream_id == sid]
    assert headers.type == FrameType.HEADERS and headers.flags & END_STREAM  # one frame: trailers-only
    r = p.response(sid)
    assert r.trailers is None and r.headers is not None and r.ended
    assert r.headers[b":status"] == b"200" and r.headers[b"content-type"] == b"application/grpc"
    assert r.headers[b"grpc-status"] == b"5"
    assert r.headers[b"grpc-message"] == b"no stream '%C3%BC' at 100%25%0Asee%09logs"
    assert r.message == details
    assert r.headers[b"liftlog-error"] == b"stream_not_found"
    assert wire.percent_encode("plain ascii: ok") == b"plain ascii: ok"


def test_response_headers_larger_than_a_frame_use_continuation() -> None:
    p = Pair()
    sid = p.start(end_stream=True)
    metadata = [(f"x-big-{i}", "v" * 5000) for i in range(8)]  # 40 kB of trailers
    p.server.send_trailers(sid, StatusCode.OK, metadata=metadata)
    p.pump()
    kinds = [f.type for f in p.frames if f.stream_id == sid]
    assert kinds[0] == FrameType.HEADERS and FrameType.CONTINUATION in kinds
    assert all(len(f.payload) <= wire.DEFAULT_MAX_FRAME for f in p.frames)
    r = p.response(sid)
    assert r.ended and r.headers is not None and r.headers[b"x-big-7"] == b"v" * 5000


def test_trailing_metadata_that_http2_cannot_carry_is_refused() -> None:
    p = Pair()
    sid = p.start(end_stream=True)
    with pytest.raises(ValueError):
        p.server.send_trailers(sid, StatusCode.OK, metadata=[("bad", "new\nline")])
    assert p.server.is_open(sid)  # the app may still end the call properly
    assert p.server.send_trailers(sid, StatusCode.INTERNAL, "bad trailing metadata")
    p.pump()
    assert p.response(sid).status == StatusCode.INTERNAL


# -- message limits and encodings ----------------------------------------------------------


def test_oversize_message_is_resource_exhausted() -> None:
    p = Pair(ConnectionLimits(max_message_bytes=1000))
    ok = p.start()
    p.send(ok, grpc_message(b"x" * 1000))
    assert p.messages(ok)[0].data == b"x" * 1000  # exactly the limit is fine
    sid = p.start()
    p.send(sid, grpc_message(b"x" * 1001))
    assert not p.messages(sid)
    assert StreamReset(sid, ErrorCode.CANCEL, by_peer=False) in p.events
    r = p.response(sid)
    assert r.status == StatusCode.RESOURCE_EXHAUSTED and "1001 vs. 1000" in r.message
    assert resets(p.frames)[sid] == ErrorCode.NO_ERROR  # the client was still sending
    assert p.server.open_streams == 1 and p.server.is_open(ok)


def test_rejected_messages_do_not_leak_the_connection_window() -> None:
    """Each call ended for a bad message gives its frame's bytes back to the connection window."""
    p = Pair(ConnectionLimits(max_message_bytes=100, stream_window=65_535, connection_window=65_535))
    for _ in range(8):  # 8 x 16 kB: twice the connection window
        sid = p.start()
        assert p.send(sid, grpc_message(b"x" * (16_384 - 5))) == 16_384
        assert p.response(sid).status == StatusCode.RESOURCE_EXHAUSTED
    assert p.client.local_flow_control_window(p.start()) > 65_535 // 2


def test_gzip_message_is_inflated() -> None:
    p = Pair()
    sid = p.start(extra=[("grpc-encoding", "gzip")])
    payload = b"compress me " * 1000
    p.send(sid, grpc_message(gzip.compress(payload), compressed=1) + grpc_message(b"plain"), end_stream=True)
    assert [m.data for m in p.messages(sid)] == [payload, b"plain"]  # flag 0 still means identity


def test_gzip_message_split_across_frames_that_fails_to_inflate() -> None:
    raw = Raw()
    raw.send(raw.headers(1, request_headers(extra=[("grpc-encoding", "gzip")])))
    body = grpc_message(gzip.compress(b"y" * 5000)[:-8] + b"garbage!", compressed=1)
    raw.send(data(1, body[:20]))
    raw.send(data(1, body[20:]))  # accounting checked by Raw.send: nothing left counted for the stream
    (block,) = raw.decode_headers(1)
    assert block[b"grpc-status"] == b"%d" % StatusCode.INTERNAL
    assert StreamReset(1, ErrorCode.CANCEL, by_peer=False) in raw.events


def test_gzip_bomb_is_resource_exhausted() -> None:
    p = Pair(ConnectionLimits(max_message_bytes=100_000))
    sid = p.start(extra=[("grpc-encoding", "gzip")])
    p.send(sid, grpc_message(gzip.compress(b"\0" * 100_001), compressed=1), end_stream=True)
    assert not p.messages(sid)
    assert p.response(sid).status == StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize(
    ("encoding", "flag", "status"),
    [
        (None, 1, StatusCode.INTERNAL),  # compressed without grpc-encoding
        ("gzip", 2, StatusCode.INTERNAL),  # no such flag
        ("gzip", 1, StatusCode.INTERNAL),  # not gzip data
    ],
)
def test_bad_compressed_message_is_internal(encoding: str | None, flag: int, status: StatusCode) -> None:
    p = Pair()
    sid = p.start(extra=[("grpc-encoding", encoding)] if encoding else [])
    p.send(sid, grpc_message(b"not gzip", compressed=flag), end_stream=True)
    assert not p.messages(sid)
    assert p.response(sid).status == status


def test_unknown_grpc_encoding_is_unimplemented() -> None:
    p = Pair()
    sid = p.start(extra=[("grpc-encoding", "snappy")])
    assert not any(isinstance(e, RequestReceived) for e in p.events)
    r = p.response(sid)
    assert r.status == StatusCode.UNIMPLEMENTED and "snappy" in r.message
    assert r.headers is not None and r.headers[b"grpc-accept-encoding"] == b"identity,gzip"


@pytest.mark.parametrize(
    ("headers", "http_status", "grpc_status"),
    [
        (request_headers(method="GET"), b"405", StatusCode.UNIMPLEMENTED),
        (request_headers(method="PUT"), b"405", StatusCode.UNIMPLEMENTED),
        (request_headers(content_type="text/html"), b"415", StatusCode.UNKNOWN),
        (request_headers(content_type=""), b"415", StatusCode.UNKNOWN),
        ([h for h in request_headers() if h[0] != ":path"], b"400", StatusCode.INTERNAL),
    ],
)
def test_a_request_that_is_not_grpc_gets_an_http_status(
    headers: list[tuple[str, str]], http_status: bytes, grpc_status: StatusCode
) -> None:
    raw = Raw()
    raw.send(raw.headers(1, headers, END_HEADERS | END_STREAM))
    assert not raw.events
    (block,) = raw.decode_headers(1)
    assert block[b":status"] == http_status
    assert block[b"grpc-status"] == b"%d" % grpc_status
    (frame,) = raw.sent(FrameType.HEADERS, 1)
    assert frame.flags & END_STREAM
    assert raw.conn.open_streams == 0 and raw.goaway is None


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("100m", 0.1),
        ("2S", 2.0),
        ("1H", 3600.0),
        ("3M", 180.0),
        ("250u", 250e-6),
        ("7n", 7e-9),
        ("99999999S", 99999999),
    ],
)
def test_grpc_timeout_is_parsed(value: str, seconds: float) -> None:
    raw = Raw()
    raw.send(raw.headers(1, request_headers(extra=[("grpc-timeout", value)])))
    (request,) = raw.events
    assert isinstance(request, RequestReceived) and request.timeout == pytest.approx(seconds)
    assert request.metadata == ()  # grpc-timeout is not metadata


@pytest.mark.parametrize("value", ["", "S", "10", "10x", "-1S", "123456789S", "1.5S"])
def test_malformed_grpc_timeout_is_internal(value: str) -> None:
    raw = Raw()
    raw.send(raw.headers(1, request_headers(extra=[("grpc-timeout", value)])))
    assert not raw.events
    (block,) = raw.decode_headers(1)
    assert block[b"grpc-status"] == b"%d" % StatusCode.INTERNAL and b"grpc-timeout" in block[b"grpc-message"]


def test_metadata_bin_values_are_base64_decoded() -> None:
    raw = Raw()
    extra = [
        ("user-agent", "test/1"),
        ("grpc-accept-encoding", "gzip"),
        ("padded-bin", "AAEC/w=="),
        ("unpadded-bin", "AAEC/w"),
        ("x-text", "value with spaces"),
    ]
    raw.send(raw.headers(1, request_headers(extra=extra)))
    (request,) = raw.events
    assert isinstance(request, RequestReceived)
    assert request.metadata == (
        ("user-agent", "test/1"),
        ("padded-bin", b"\x00\x01\x02\xff"),
        ("unpadded-bin", b"\x00\x01\x02\xff"),
        ("x-text", "value with spaces"),
    )
    raw.send(raw.headers(3, request_headers(extra=[("broken-bin", "not base64!")])))
    assert len(raw.events) == 1
    (block,) = raw.decode_headers(3)
    assert block[b"grpc-status"] == b"%d" % StatusCode.INTERNAL and b"broken-bin" in block[b"grpc-message"]


# -- flow control: sending -------------------------------------------------------------------


def test_server_sends_no_more_than_the_stream_window_and_resumes_on_window_update() -> None:
    p = Pair(client_settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100})
    sid = p.start(end_stream=True)
    p.server.send_message(sid, b"z" * 1000)
    p.server.send_trailers(sid, StatusCode.OK)
    p.pump()
    assert len(p.response(sid).data) == 100  # h2 itself fails on DATA beyond its window
    assert p.server.buffered(sid) == 1005 - 100
    assert p.response(sid).trailers is None, "trailers wait behind the data"
    p.client.increment_flow_control_window(400, sid)
    assert WindowOpened() in p.pump()
    assert len(p.response(sid).data) == 500 and p.server.buffered(sid) == 505
    p.client.increment_flow_control_window(10_000, sid)
    p.pump()
    r = p.response(sid)
    assert r.data == grpc_message(b"z" * 1000) and r.status == 0 and r.ended
    assert p.server.open_streams == 0


def test_server_sends_no_more_than_the_connection_window() -> None:
    p = Pair(client_settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
    sids = [p.start(end_stream=True) for _ in range(2)]
    for sid in sids:
        p.server.send_message(sid, b"q" * 50_000)
    p.pump()
    received = sum(len(p.response(sid).data) for sid in sids)
    assert received == wire.DEFAULT_WINDOW
    assert all(len(f.payload) <= wire.DEFAULT_MAX_FRAME for f in p.frames)
    p.client.increment_flow_control_window(1 << 20)
    assert WindowOpened() in p.pump()
    assert [p.response(sid).data for sid in sids] == [grpc_message(b"q" * 50_000)] * 2


def test_settings_raising_the_initial_window_reopen_blocked_streams() -> None:
    p = Pair(client_settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    sid = p.start(end_stream=True)
    p.server.send_message(sid, b"w" * 10)
    p.pump()
    assert p.response(sid).data == b""
    p.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000})
    assert WindowOpened() in p.pump()
    assert p.response(sid).data == grpc_message(b"w" * 10)


def test_settings_shrinking_the_window_below_what_was_sent() -> None:
    p = Pair(client_settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000})
    sid = p.start(end_stream=True)
    p.server.send_message(sid, b"a" * 800)
    p.pump()
    p.client.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 100})  # the window goes negative
    p.pump()
    p.server.send_message(sid, b"b" * 100)
    p.pump()
    assert len(p.response(sid).data) == 805
    p.client.increment_flow_control_window(800, sid)  # back to +95: not enough for the whole message
    p.pump()
    assert len(p.response(sid).data) == 805 + 95
    p.client.increment_flow_control_window(1000, sid)
    p.pump()
    assert p.response(sid).data == grpc_message(b"a" * 800) + grpc_message(b"b" * 100)


def test_data_frames_grow_to_the_peer_max_frame_size() -> None:
    p = Pair(
        client_settings={
            h2.settings.SettingCodes.MAX_FRAME_SIZE: 65_536,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20,
        }
    )
    p.client.increment_flow_control_window(1 << 20)
    sid = p.start(end_stream=True)
    p.server.send_message(sid, b"f" * 200_000)
    p.pump()
    sizes = [len(f.payload) for f in p.frames if f.type == FrameType.DATA]
    assert max(sizes) == 65_536 and sum(sizes) == 200_005


# -- flow control: receiving ---------------------------------------------------------------


def test_client_cannot_send_past_the_stream_window() -> None:
    raw = Raw(ConnectionLimits(stream_window=65_536))
    raw.send(raw.headers(1))
    full = grpc_message(b"x" * (16_384 - 5))
    for _ in range(4):
        raw.send(data(1, full))
    assert not resets(raw.frames)
    raw.send(data(1, full))
    assert resets(raw.frames) == {1: ErrorCode.FLOW_CONTROL_ERROR}
    assert StreamReset(1, ErrorCode.FLOW_CONTROL_ERROR, by_peer=False) in raw.events
    assert raw.goaway is None and raw.conn.open_streams == 0


def test_client_cannot_send_past_the_connection_window() -> None:
    raw = Raw(ConnectionLimits(stream_window=1 << 20, connection_window=65_536))
    full = grpc_message(b"x" * (16_384 - 5))
    raw.send(raw.headers(1) + raw.headers(3))
    raw.send(data(1, full) + data(3, full) + data(1, full) + data(3, full))
    assert raw.goaway is None
    raw.send(data(1, full))
    assert raw.goaway == ErrorCode.FLOW_CONTROL_ERROR
    assert any(isinstance(e, ConnectionTerminated) and not e.by_peer for e in raw.events)


def test_window_updates_come_only_after_messages_are_consumed() -> None:
    p = Pair(ConnectionLimits(stream_window=65_536, connection_window=131_072))
    sid = p.start()
    updates = len([f for f in p.frames if f.type == FrameType.WINDOW_UPDATE])
    for _ in range(4):  # a message a frame: none is ever partial (and credited as it arrives)
        assert p.send(sid, grpc_message(b"a" * (16_384 - 5))) == 16_384
    assert len([f for f in p.frames if f.type == FrameType.WINDOW_UPDATE]) == updates
    assert p.client.local_flow_control_window(sid) == 0
    assert p.consume(sid, 1) == 16_384
    stream_updates = [f for f in p.frames[updates:] if f.type == FrameType.WINDOW_UPDATE and f.stream_id == sid]
    assert [struct.unpack(">L", f.payload)[0] for f in stream_updates] == [16_384]
    assert p.client.local_flow_control_window(sid) == 16_384
    p.consume(sid)
    assert p.client.local_flow_control_window(sid) == 65_536
    assert p.client.outbound_flow_control_window >= 65_536


def test_a_stream_whose_messages_are_not_consumed_stops_getting_credit() -> None:
    p = Pair(ConnectionLimits(stream_window=65_536, connection_window=1 << 20))
    reader, hoarder = p.start(), p.start()
    chunk = grpc_message(b"m" * 995)
    for _ in range(300):  # 300 kB through the reader: it never stalls
        assert p.send(reader, chunk) == len(chunk)
        p.consume(reader)
    assert p.send(hoarder, chunk * 300) == 65_536
    assert p.client.local_flow_control_window(hoarder) == 0
    assert p.send(reader, chunk) == len(chunk)  # the hoarder does not block the others
    p.consume(hoarder)
    assert p.client.local_flow_control_window(hoarder) > 0


def test_unconsumed_large_messages_stop_credit() -> None:
    """Messages larger than the window are credited while they arrive; whole, they still count until taken."""
    limits = ConnectionLimits(stream_window=65_536, connection_window=1 << 20, max_message_bytes=1 << 20)
    p = Pair(limits)
    sid = p.start()
    big = grpc_message(b"L" * 200_000)
    assert p.send(sid, big) == len(big)  # three windows' worth: arrives although nothing was consumed yet
    assert len(p.messages(sid)) == 1
    sent = p.send(sid, big * 20)
    assert sent <= limits.stream_window, f"the client sent {sent} more bytes while 200 kB were not taken"
    p.consume(sid)  # the app takes the big message: the client may go on
    assert p.send(sid, big[sent:]) == len(big) - sent
    assert len(p.messages(sid)) == 2 and p.messages(sid)[1].data == b"L" * 200_000


def test_gzip_messages_hold_back_credit_by_their_inflated_size() -> None:
    p = Pair(ConnectionLimits(stream_window=65_536, connection_window=1 << 20))
    sid = p.start(extra=[("grpc-encoding", "gzip")])
    bomb = grpc_message(gzip.compress(b"\0" * 20_000), compressed=1)  # 20 kB from a few dozen bytes
    count = 0
    while p.send(sid, bomb) == len(bomb):  # until the stream window is spent
        count += 1
    assert count * len(bomb) <= 65_536 and len(p.messages(sid)) == count
    p.consume(sid, count // 2)  # half a window of wire bytes taken, but 20 kB each still held
    assert p.client.local_flow_control_window(sid) < len(bomb)
    p.consume(sid)
    assert p.client.local_flow_control_window(sid) >= 65_536 // 4


def test_gzip_messages_cannot_make_a_connection_hold_more_than_max_buffered_bytes() -> None:
    p = Pair(ConnectionLimits(max_buffered_bytes=1 << 20))
    sid = p.start(extra=[("grpc-encoding", "gzip")])
    bomb = grpc_message(gzip.compress(b"\0" * 300_000), compressed=1)
    p.send(sid, bomb * 4)  # 1.2 MB when inflated, from 1 kB
    assert len(p.messages(sid)) == 3
    r = p.response(sid)
    assert r.status == StatusCode.RESOURCE_EXHAUSTED and "not yet read" in r.message
    other = p.start(extra=[("grpc-encoding", "gzip")])  # the failed call's messages no longer count
    p.send(other, bomb * 3)
    assert len(p.messages(other)) == 3


def test_connection_stops_crediting_at_max_buffered_bytes() -> None:
    limits = ConnectionLimits(
        stream_window=65_536, connection_window=65_536, max_buffered_bytes=150_000, max_message_bytes=1 << 20
    )
    p = Pair(limits)
    sids = [p.start() for _ in range(4)]
    big = grpc_message(b"B" * 500_000)  # never whole: held as partial messages
    sent = sum(p.send(sid, big) for sid in sids)
    assert 150_000 <= sent <= 150_000 + 65_536
    assert p.client.outbound_flow_control_window < 16_384
    p.client.reset_stream(sids[0])
    p.pump()  # a stream gone: its bytes no longer count, the client gets credit again
    assert p.client.outbound_flow_control_window > 16_384


def test_data_after_the_call_ended_is_dropped_but_credited() -> None:
    raw = Raw(ConnectionLimits(connection_window=65_536))
    raw.send(raw.headers(1))
    raw.conn.send_trailers(1, StatusCode.OK)
    raw.send(b"")
    assert raw.decode_headers(1)[-1][b"grpc-status"] == b"0"
    before = len(raw.frames)
    # DATA the client sends after our trailers: ignored, but the connection window comes back
    late = data(1, grpc_message(b"z" * (16_384 - 5)))
    for _ in range(3):
        raw.send(late * 4)  # a connection window each time
    assert raw.goaway is None and not [e for e in raw.events if isinstance(e, MessageReceived)]
    credit = [struct.unpack(">L", f.payload)[0] for f in raw.frames[before:] if f.type == FrameType.WINDOW_UPDATE]
    assert sum(credit) == 3 * 65_536


# -- streams ---------------------------------------------------------------------------


def test_streams_past_max_concurrent_are_refused() -> None:
    raw = Raw(ConnectionLimits(max_concurrent_streams=2))
    raw.send(raw.headers(1) + raw.headers(3) + raw.headers(5))
    assert [e.stream_id for e in raw.events if isinstance(e, RequestReceived)] == [1, 3]
    assert resets(raw.frames) == {5: ErrorCode.REFUSED_STREAM}
    raw.send(data(5, grpc_message(b"ignored"), END_STREAM))  # frames of the refused stream are ignored
    raw.conn.send_trailers(1, StatusCode.OK)
    raw.send(data(1, b"", END_STREAM))
    raw.send(raw.headers(7))  # a slot is free again
    assert [e.stream_id for e in raw.events if isinstance(e, RequestReceived)] == [1, 3, 7]
    assert raw.goaway is None


def test_client_reset_ends_the_call() -> None:
    p = Pair()
    sid = p.start()
    p.client.reset_stream(sid, error_code=ErrorCode.CANCEL)
    assert p.pump() == [StreamReset(sid, ErrorCode.CANCEL, by_peer=True)]
    assert not p.server.send_message(sid, b"x") and not p.server.is_open(sid)
    assert p.server.open_streams == 0


def test_client_goaway_is_reported() -> None:
    p = Pair()
    p.client.close_connection(error_code=ErrorCode.NO_ERROR)
    (event,) = p.pump()
    assert event == ConnectionTerminated(ErrorCode.NO_ERROR, "", by_peer=True, last_stream_id=0)


def test_server_ping_is_acked() -> None:
    p = Pair()
    p.server.ping(b"pingpong")
    assert PingAcked(b"pingpong") in p.pump()


def test_a_held_ping_ack_leaves_with_the_next_output_and_ahead_of_it() -> None:
    raw = Raw()
    raw.send(raw.headers(1))
    raw.conn.receive(ping(b"pingpong"), 0.0)
    assert raw.conn.has_output and not raw.conn.has_urgent_output
    assert raw.conn.data_to_send(hold_acks=True) == b""  # only the ACK: it may wait
    raw.conn.send_message(1, b"answer")
    assert raw.conn.has_urgent_output
    frames = parse_frames(raw.conn.data_to_send(hold_acks=True))
    assert (frames[0].type, frames[0].flags & ACK, frames[0].payload) == (FrameType.PING, ACK, b"pingpong")
    assert FrameType.DATA in [f.type for f in frames[1:]]
    assert not raw.conn.has_output and raw.conn.data_to_send() == b""


def test_without_holding_a_ping_ack_goes_at_once() -> None:
    raw = Raw()
    raw.send(ping(b"pingpong"))
    (ack,) = raw.sent(FrameType.PING)
    assert (ack.flags & ACK, ack.payload) == (ACK, b"pingpong")


def test_graceful_close_refuses_new_streams_and_lets_open_ones_finish() -> None:
    raw = Raw()
    raw.send(raw.headers(1))
    raw.conn.close()
    raw.send(b"")
    assert goaways(raw.frames) == [(1, ErrorCode.NO_ERROR, b"")]
    raw.send(raw.headers(3, flags=END_HEADERS | END_STREAM))
    assert resets(raw.frames) == {3: ErrorCode.REFUSED_STREAM}
    assert [e.stream_id for e in raw.events if isinstance(e, RequestReceived)] == [1]
    raw.send(data(1, grpc_message(b"req"), END_STREAM))
    assert raw.events[-1] == RequestEnded(1)
    assert raw.conn.send_message(1, b"resp") and raw.conn.send_trailers(1, StatusCode.OK)
    raw.send(b"")
    assert raw.decode_headers(1)[-1] == {b"grpc-status": b"0"}
    assert raw.conn.open_streams == 0 and not raw.conn.closed
    raw.conn.close()
    raw.send(ping(sid=1))  # a connection error after the graceful GOAWAY
    assert [g[:2] for g in goaways(raw.frames)] == [(1, ErrorCode.NO_ERROR), (1, ErrorCode.PROTOCOL_ERROR)], (
        "a later GOAWAY must not raise the last stream id (RFC 9113 6.8)"
    )


# -- protocol errors --------------------------------------------------------------------------


def test_bad_preface() -> None:
    conn = ServerConnection()
    (event,) = conn.receive(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0.0)
    assert isinstance(event, ConnectionTerminated) and event.code == ErrorCode.PROTOCOL_ERROR and not event.by_peer
    assert goaway_code(parse_frames(conn.data_to_send())) == ErrorCode.PROTOCOL_ERROR
    assert conn.closed and conn.receive(wire.PREFACE, 0.0) == []


def test_short_garbage_preface_is_refused_at_once() -> None:
    conn = ServerConnection()
    assert conn.receive(wire.PREFACE[:10], 0.0) == []  # a preface in pieces is fine
    (event,) = conn.receive(b"X", 0.0)
    assert isinstance(event, ConnectionTerminated) and event.code == ErrorCode.PROTOCOL_ERROR


def _bad(raw: Raw) -> dict[str, bytes]:
    """Frames that break RFC 9113, after a preface and an open stream 1."""
    enc = hpack.Encoder()
    return {
        "no settings first": b"",  # replaced below: the preface is followed by a PING
        "data on stream 0": data(0, b"x"),
        "data on an idle stream": data(5, b"x"),
        "headers on stream 0": wire.frame(FrameType.HEADERS, END_HEADERS, 0, enc.encode(request_headers())),
        "even stream id": raw.headers(2),
        "push promise": wire.frame(FrameType.PUSH_PROMISE, END_HEADERS, 1, b"\0\0\0\x02"),
        "frame over max size": data(1, b"x" * (wire.DEFAULT_MAX_FRAME + 1)),
        "continuation interrupted": raw.headers(3, flags=0) + ping(),
        "continuation interrupted by data": raw.headers(3, flags=0) + data(1, b""),
        "continuation without headers": wire.frame(FrameType.CONTINUATION, END_HEADERS, 1, b""),
        "continuation of another stream": raw.headers(3, flags=0)
        + wire.frame(FrameType.CONTINUATION, END_HEADERS, 5, b""),
        "initial window too large": wire.settings_frame([(Setting.INITIAL_WINDOW_SIZE, 2**31)]),
        "max frame size too small": wire.settings_frame([(Setting.MAX_FRAME_SIZE, 16_383)]),
        "max frame size too large": wire.settings_frame([(Setting.MAX_FRAME_SIZE, 2**24)]),
        "enable push 2": wire.settings_frame([(Setting.ENABLE_PUSH, 2)]),
        "settings length": wire.frame(FrameType.SETTINGS, 0, 0, b"\0" * 5),
        "settings ack with payload": wire.frame(FrameType.SETTINGS, ACK, 0, b"\0" * 6),
        "settings on a stream": wire.frame(FrameType.SETTINGS, 0, 1, b""),
        "window update of 0": wire.window_update(0, 0),
        "window update length": wire.frame(FrameType.WINDOW_UPDATE, 0, 0, b"\0\0\1"),
        "window update on an idle stream": wire.window_update(9, 1),
        "connection window overflow": wire.window_update(0, 2**31 - 1),
        "ping length": ping(b"1234567"),
        "ping on a stream": ping(sid=1),
        "rst_stream on stream 0": wire.rst_stream(0, ErrorCode.CANCEL),
        "rst_stream on an idle stream": wire.rst_stream(7, ErrorCode.CANCEL),
        "rst_stream length": wire.frame(FrameType.RST_STREAM, 0, 1, b"\0\0\0\0\0"),
        "goaway on a stream": wire.frame(FrameType.GOAWAY, 0, 1, b"\0" * 8),
        "goaway too short": wire.frame(FrameType.GOAWAY, 0, 0, b"\0" * 7),
        "priority on stream 0": wire.frame(FrameType.PRIORITY, 0, 0, b"\0" * 5),
        "bad hpack index": wire.frame(FrameType.HEADERS, END_HEADERS, 3, b"\xff\xff\xff\x7f"),
        "padding longer than the frame": data(1, b"\x05abc", PADDED),
        "headers priority fields missing": wire.frame(FrameType.HEADERS, END_HEADERS | PRIORITY_FLAG, 3, b"\0\0"),
        "second headers without end_stream": raw.headers(1),
    }


_EXPECTED = {
    "no settings first": ErrorCode.PROTOCOL_ERROR,
    "data on stream 0": ErrorCode.PROTOCOL_ERROR,
    "data on an idle stream": ErrorCode.PROTOCOL_ERROR,
    "headers on stream 0": ErrorCode.PROTOCOL_ERROR,
    "even stream id": ErrorCode.PROTOCOL_ERROR,
    "push promise": ErrorCode.PROTOCOL_ERROR,
    "frame over max size": ErrorCode.FRAME_SIZE_ERROR,
    "continuation interrupted": ErrorCode.PROTOCOL_ERROR,
    "continuation interrupted by data": ErrorCode.PROTOCOL_ERROR,
    "continuation without headers": ErrorCode.PROTOCOL_ERROR,
    "continuation of another stream": ErrorCode.PROTOCOL_ERROR,
    "initial window too large": ErrorCode.FLOW_CONTROL_ERROR,
    "max frame size too small": ErrorCode.PROTOCOL_ERROR,
    "max frame size too large": ErrorCode.PROTOCOL_ERROR,
    "enable push 2": ErrorCode.PROTOCOL_ERROR,
    "settings length": ErrorCode.FRAME_SIZE_ERROR,
    "settings ack with payload": ErrorCode.FRAME_SIZE_ERROR,
    "settings on a stream": ErrorCode.PROTOCOL_ERROR,
    "window update of 0": ErrorCode.PROTOCOL_ERROR,
    "window update length": ErrorCode.FRAME_SIZE_ERROR,
    "window update on an idle stream": ErrorCode.PROTOCOL_ERROR,
    "connection window overflow": ErrorCode.FLOW_CONTROL_ERROR,
    "ping length": ErrorCode.FRAME_SIZE_ERROR,
    "ping on a stream": ErrorCode.PROTOCOL_ERROR,
    "rst_stream on stream 0": ErrorCode.PROTOCOL_ERROR,
    "rst_stream on an idle stream": ErrorCode.PROTOCOL_ERROR,
    "rst_stream length": ErrorCode.FRAME_SIZE_ERROR,
    "goaway on a stream": ErrorCode.PROTOCOL_ERROR,
    "goaway too short": ErrorCode.FRAME_SIZE_ERROR,
    "priority on stream 0": ErrorCode.PROTOCOL_ERROR,
    "bad hpack index": ErrorCode.COMPRESSION_ERROR,
    "padding longer than the frame": ErrorCode.PROTOCOL_ERROR,
    "headers priority fields missing": ErrorCode.FRAME_SIZE_ERROR,
    "second headers without end_stream": ErrorCode.PROTOCOL_ERROR,
}


@pytest.mark.parametrize("case", list(_EXPECTED))
def test_protocol_error_is_the_goaway_rfc_9113_names(case: str) -> None:
    if case == "no settings first":
        conn = ServerConnection()
        events = conn.receive(wire.PREFACE + ping(), 0.0)
        frames = parse_frames(conn.data_to_send())
    else:
        raw = Raw()
        raw.send(raw.headers(1))
        events = raw.send(_bad(raw)[case])
        frames = raw.frames
        conn = raw.conn
    assert goaway_code(frames) == _EXPECTED[case]
    last, _, debug = goaways(frames)[0]
    assert last == conn.last_stream_id and debug  # the reason travels as debug data
    assert conn.closed
    (terminated,) = [e for e in events if isinstance(e, ConnectionTerminated)]
    assert terminated.code == _EXPECTED[case] and not terminated.by_peer
    assert conn.receive(ping(), 1.0) == [] and conn.data_to_send() == b"", "a closed connection says nothing more"


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (wire.window_update(1, 0), ErrorCode.PROTOCOL_ERROR),
        (wire.window_update(1, 2**31 - 1), ErrorCode.FLOW_CONTROL_ERROR),
        (wire.frame(FrameType.PRIORITY, 0, 1, b"\0" * 4), ErrorCode.FRAME_SIZE_ERROR),
    ],
    ids=["window update of 0", "stream window overflow", "priority length"],
)
def test_stream_errors_reset_only_the_stream(frame: bytes, code: ErrorCode) -> None:
    raw = Raw()
    raw.send(raw.headers(1))
    raw.send(frame)
    assert resets(raw.frames) == {1: code}
    assert StreamReset(1, code, by_peer=False) in raw.events
    assert raw.goaway is None and not raw.conn.closed


def test_data_on_a_half_closed_stream_is_stream_closed() -> None:
    raw = Raw()
    raw.send(raw.headers(1, flags=END_HEADERS | END_STREAM))
    raw.send(data(1, b"more"))
    assert resets(raw.frames) == {1: ErrorCode.STREAM_CLOSED}
    assert raw.goaway is None


def test_request_ending_inside_a_message_is_internal() -> None:
    raw = Raw()
    raw.send(raw.headers(1))
    raw.send(data(1, grpc_message(b"truncated")[:8], END_STREAM))
    (block,) = raw.decode_headers(1)
    assert block[b"grpc-status"] == b"%d" % StatusCode.INTERNAL


# -- floods ------------------------------------------------------------------------------


def test_ping_flood_is_enhance_your_calm() -> None:
    limits = ConnectionLimits(max_ping_strikes=10)
    raw = Raw(limits)
    for _ in range(11):  # the first ping is no strike: nothing came before it
        raw.send(ping())
    assert len(raw.sent(FrameType.PING)) == 11 and raw.goaway is None
    raw.send(ping())
    assert raw.goaway == ErrorCode.ENHANCE_YOUR_CALM


def test_keepalive_pings_far_apart_are_not_strikes() -> None:
    raw = Raw(ConnectionLimits(max_ping_strikes=2, ping_min_interval=10.0))
    for i in range(50):
        raw.send(ping(), now=i * 10.0)
    assert raw.goaway is None and len(raw.sent(FrameType.PING)) == 50


def test_pings_between_our_data_are_not_strikes() -> None:
    raw = Raw(ConnectionLimits(max_ping_strikes=2))
    raw.send(raw.headers(1, flags=END_HEADERS | END_STREAM))
    for _ in range(20):
        raw.conn.send_message(1, b"tick")
        raw.send(ping() + ping())
    assert raw.goaway is None


def test_pings_while_our_data_is_blocked_are_strikes() -> None:
    """Data we could not send (the client gives no window) does not excuse its pings."""
    raw = Raw(ConnectionLimits(max_ping_strikes=3), settings=[(Setting.INITIAL_WINDOW_SIZE, 0)])
    raw.send(raw.headers(1, flags=END_HEADERS | END_STREAM))
    raw.conn.send_message(1, b"stuck")
    raw.send(b"")  # the response headers go out, the message cannot
    assert raw.sent(FrameType.HEADERS, 1) and not raw.sent(FrameType.DATA, 1)
    assert not raw.conn._dirty, "(white-box) a blocked stream waits for a WINDOW_UPDATE, not for every flush"
    for _ in range(4):
        raw.send(ping())
    assert raw.goaway is None
    raw.send(ping())
    assert raw.goaway == ErrorCode.ENHANCE_YOUR_CALM


def test_settings_flood_is_enhance_your_calm() -> None:
    raw = Raw()  # its preface SETTINGS took one of 100
    for _ in range(99):
        raw.send(wire.settings_frame([]))
    assert raw.goaway is None
    raw.send(wire.settings_frame([]))
    assert raw.goaway == ErrorCode.ENHANCE_YOUR_CALM


def test_settings_at_the_allowed_rate_are_fine() -> None:
    raw = Raw()
    for i in range(1, 1000):
        raw.send(wire.settings_frame([]), now=i * 0.011)  # 100/s allowed
    assert raw.goaway is None and len(raw.sent(FrameType.SETTINGS)) == 1 + 1000  # ours, and an ACK each


def test_rapid_reset_flood_is_enhance_your_calm() -> None:
    raw = Raw()
    burst = b"".join(raw.headers(sid) + wire.rst_stream(sid, ErrorCode.CANCEL) for sid in range(1, 1001, 2))
    raw.send(burst)  # 500 resets: the burst
    assert raw.goaway is None
    assert len([e for e in raw.events if isinstance(e, StreamReset) and e.by_peer]) == 500
    raw.send(raw.headers(1001) + wire.rst_stream(1001, ErrorCode.CANCEL))
    assert raw.goaway == ErrorCode.ENHANCE_YOUR_CALM


@pytest.mark.parametrize("provoke", ["window_update_0", "data_after_end"])
def test_made_you_reset_flood_is_enhance_your_calm(provoke: str) -> None:
    """CVE-2025-8671: streams the client makes the server reset cost the reset budget, as its own resets do."""
    raw = Raw()

    def made_reset(sid: int) -> bytes:
        if provoke == "window_update_0":
            return raw.headers(sid) + wire.frame(FrameType.WINDOW_UPDATE, 0, sid, b"\0\0\0\0")
        return raw.headers(sid) + data(sid, b"", END_STREAM) + data(sid, b"x")

    raw.send(b"".join(made_reset(sid) for sid in range(1, 1001, 2)))  # 500: the burst
    assert raw.goaway is None and raw.conn.resets_sent == 500
    raw.send(made_reset(1001))
    assert raw.goaway == ErrorCode.ENHANCE_YOUR_CALM


def test_resets_at_the_allowed_rate_are_fine() -> None:
    raw = Raw()
    for i, sid in enumerate(range(1, 4001, 2)):
        raw.send(raw.headers(sid) + wire.rst_stream(sid, ErrorCode.CANCEL), now=i * 0.0055)  # 200/s allowed
    assert raw.goaway is None and raw.conn.open_streams == 0


@pytest.mark.parametrize(
    "junk",
    [
        data(1, b""),
        wire.frame(0x20, 0, 0, b"unknown"),
        wire.frame(FrameType.PRIORITY, 0, 1, b"\0\0\0\0\x10"),
    ],
    ids=["empty data", "unknown type", "priority"],
)
def test_junk_frame_flood_is_enhance_your_calm(junk: bytes) -> None:
    raw = Raw()
    raw.send(raw.headers(1))
    raw.send(junk * 1000)
    assert raw.goaway is None, "a burst of 1000 is allowed"
    raw.send(junk * 5, now=0.001)
    assert raw.goaway == ErrorCode.ENHANCE_YOUR_CALM
    raw2 = Raw()
    raw2.send(raw2.headers(1))
    for i in range(3000):
        raw2.send(junk, now=i * 0.0011)  # 1000/s allowed
    assert raw2.goaway is None


def test_continuation_flood_is_enhance_your_calm() -> None:
    raw = Raw()
    raw.send(raw.headers(1, flags=0))
    chunk = wire.frame(FrameType.CONTINUATION, 0, 1, b"\x00" * 16_384)
    raw.send(chunk * 3)
    assert raw.goaway is None
    raw.send(chunk)
    assert raw.goaway == ErrorCode.ENHANCE_YOUR_CALM
    assert not [e for e in raw.events if isinstance(e, RequestReceived)]


def test_empty_continuation_flood_is_enhance_your_calm() -> None:
    raw = Raw()
    raw.send(raw.headers(1, flags=0) + wire.frame(FrameType.CONTINUATION, 0, 1, b"") * 1001)
    assert raw.goaway == ErrorCode.ENHANCE_YOUR_CALM


def test_oversize_header_list_is_enhance_your_calm() -> None:
    raw = Raw()
    block = raw.encoder.encode(request_headers(extra=[("x-huge", "h" * 20_000)]))  # over 16 kB decoded
    raw.send(
        wire.frame(FrameType.HEADERS, 0, 1, block[:16_000])
        + wire.frame(FrameType.CONTINUATION, END_HEADERS, 1, block[16_000:])
    )
    assert raw.goaway == ErrorCode.ENHANCE_YOUR_CALM
    assert not [e for e in raw.events if isinstance(e, RequestReceived)]


# One DATA frame the short way takes (most often), or one of the ways around it: a message split over
# frames, half a message (the next frame continues it), two in a frame, padding, END_STREAM, a compressed
# flag without an encoding, a message over the limit, an empty one; and the app taking what it was given,
# a reset, or a window update in between.
_FRAME_KINDS = st.sampled_from(
    ["one"] * 6 + ["split", "half", "two", "padded", "end", "gzip-flag", "oversize", "empty"]
)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([1, 3]),
            _FRAME_KINDS,
            st.one_of(st.integers(1, 2000), st.sampled_from([1200, 1900, 2400])),  # large ones fill the windows
            st.integers(0, 3).map(lambda n: n == 0),  # the app takes what it has
            st.integers(0, 9).map(lambda n: n == 0),  # the stream is reset
        ),
        max_size=40,
    ),
    st.lists(st.integers(1, 200), min_size=1, max_size=10),
)
def test_one_message_data_frames_mean_the_same_the_short_way(
    steps: list[tuple[int, str, int, bool, bool]], chunks: list[int]
) -> None:
    limits = ConnectionLimits(stream_window=4000, connection_window=5000, max_message_bytes=2500)
    encoder = hpack.Encoder()
    stream = wire.PREFACE + wire.settings_frame(())
    for sid in (1, 3):
        stream += wire.frame(FrameType.HEADERS, END_HEADERS, sid, encoder.encode(request_headers()))
    cuts: list[int] = []  # where the app takes its messages, or a stream is reset
    takes: list[bool] = []
    for sid, kind, size, take, reset in steps:
        body = grpc_message(bytes([size % 251]) * size)
        if kind == "one":
            stream += data(sid, body)
        elif kind == "split":
            stream += data(sid, body[: size // 2]) + data(sid, body[size // 2 :])
        elif kind == "half":
            stream += data(sid, body[: size // 2 + 1])
        elif kind == "two":
            stream += data(sid, body + grpc_message(b"tail"))
        elif kind == "padded":
            stream += data(sid, b"\x03" + body + b"\0\0\0", PADDED)
        elif kind == "end":
            stream += data(sid, body, END_STREAM)
        elif kind == "gzip-flag":
            stream += data(sid, b"\x01" + body[1:])
        elif kind == "oversize":
            stream += data(sid, grpc_message(b"o" * 2600))
        else:
            stream += data(sid, grpc_message(b""))
        if reset:
            stream += wire.rst_stream(sid, ErrorCode.CANCEL)
        elif take:
            stream += wire.window_update(0, 100)
        cuts.append(len(stream))
        takes.append(take)
    short, general = ServerConnection(limits), ServerConnection(limits)
    general.fast_data = False
    results = []
    for conn in (short, general):
        events: list[Event] = []
        out = b""
        pos, i, c = 0, 0, 0
        while pos < len(stream):
            step = chunks[c % len(chunks)]
            c += 1
            new = conn.receive(stream[pos : pos + step], 0.0)
            pos += step
            events += new
            while i < len(cuts) and cuts[i] <= pos:  # the app takes what it has, when the step says so
                if takes[i]:
                    for e in events:
                        if isinstance(e, MessageReceived) and e.size:
                            conn.consumed(e.stream_id, e.size)
                            e.size = 0
                i += 1
            out += conn.data_to_send()
            check_accounting(conn)
        state = (
            conn._recv_window,
            conn._buffered,
            conn._partial,
            conn._credit,
            sorted(
                (s.id, s.recv_window, s.held, s.excess, s.credit, bytes(s.buf), s.prepaid)
                for s in conn._streams.values()
            ),
        )
        results.append((events, out, state, conn.closed))
    assert results[0] == results[1]


def test_an_undecodable_header_block_is_named_without_our_memory_addresses() -> None:
    """Found by the fuzzer: hpack's message held the repr of its buffer, so the same bytes gave other reasons."""
    raw = Raw()
    raw.send(wire.frame(FrameType.HEADERS, END_HEADERS, 1, b"\x3f" + b"\xff" * 12))
    assert raw.goaway == ErrorCode.COMPRESSION_ERROR
    (terminated,) = [e for e in raw.events if isinstance(e, ConnectionTerminated)]
    assert terminated.reason.startswith("cannot decode headers: ")
    assert "memory at" not in terminated.reason and "0x" not in terminated.reason
