"""Sans-IO tests of :class:`ClientConnection`: a server played by hand-built frames, no sockets.

Well-behaved servers are covered over sockets (``test_channel``); here are the
answers a server should never give, and the rules the client must keep.
"""

from __future__ import annotations

import gzip
import struct
from typing import cast

import hpack
import pytest

from liftlog.rpc import wire
from liftlog.rpc.client_connection import (
    CallEnded,
    ClientConnection,
    ClientEvent,
    ConnectionTerminated,
    MessageReceived,
    StreamReset,
    WindowOpened,
)
from liftlog.rpc.status import StatusCode
from liftlog.rpc.wire import END_HEADERS, END_STREAM, ErrorCode, FrameType, Setting

from .frames import Frame, goaway_code, grpc_message, parse_frames, resets

OK_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]


class Server:
    """Frames from a pretend server to one ClientConnection, and what the client wrote."""

    def __init__(self, settings: dict[int, int] | None = None) -> None:
        self.client = ClientConnection("127.0.0.1:9292")
        self.encoder = hpack.Encoder()
        out = self.client.data_to_send()
        assert out.startswith(wire.PREFACE)
        self.sent = parse_frames(out[len(wire.PREFACE) :])
        assert self.sent[0].type == FrameType.SETTINGS
        self.events: list[ClientEvent] = []
        self.send(wire.settings_frame((settings or {}).items()))

    def send(self, data: bytes) -> list[ClientEvent]:
        events = self.client.receive(data, 0.0)
        self.events += events
        self.sent += parse_frames(self.client.data_to_send())
        return events

    def headers(self, sid: int, headers: list[tuple[str, str]], flags: int = 0) -> list[ClientEvent]:
        return self.send(wire.frame(FrameType.HEADERS, END_HEADERS | flags, sid, self.encoder.encode(headers)))

    def data(self, sid: int, payload: bytes, flags: int = 0) -> list[ClientEvent]:
        return self.send(wire.frame(FrameType.DATA, flags, sid, payload))

    def call(self, path: str = "/proto.API/Publish") -> int:
        sid = self.client.start_call(path, (("x-who", "me"),), timeout=2.5)
        self.sent += parse_frames(self.client.data_to_send())
        return sid

    def ended(self) -> list[CallEnded]:
        return [e for e in self.events if isinstance(e, CallEnded)]

    def frames(self, kind: int) -> list[Frame]:
        return [f for f in self.sent if f.type == kind]


def test_request_headers_and_a_whole_call() -> None:
    server = Server()
    sid = server.call()
    assert sid == 1
    (frame,) = server.frames(FrameType.HEADERS)
    # Decoded without raw=True the names and values are str, not the bytes hpack's annotation says.
    headers = cast(dict[str, str], dict(hpack.Decoder().decode(frame.payload)))
    assert headers[":method"] == "POST" and headers[":path"] == "/proto.API/Publish"
    assert headers[":authority"] == "127.0.0.1:9292" and headers["te"] == "trailers"
    assert headers["content-type"] == "application/grpc" and headers["x-who"] == "me"
    assert headers["grpc-timeout"] == "2500000u"
    server.client.send_message(sid, b"request")
    server.client.end_request(sid)
    server.sent += parse_frames(server.client.data_to_send())
    data = server.frames(FrameType.DATA)
    assert b"".join(f.payload for f in data) == grpc_message(b"request")
    assert data[-1].flags & END_STREAM
    server.headers(sid, OK_HEADERS)
    events = server.data(sid, grpc_message(b"one") + grpc_message(b"two"))
    assert [e.data for e in events if isinstance(e, MessageReceived)] == [b"one", b"two"]
    server.headers(sid, [("grpc-status", "0"), ("x-trail", "t")], END_STREAM)
    assert server.ended() == [CallEnded(sid, 0, "", (("x-trail", "t"),))]
    assert server.client.open_streams == 0
    assert server.call() == 3


@pytest.mark.parametrize(
    ("headers", "code", "wording"),
    [
        ([(":status", "503")], StatusCode.UNAVAILABLE, "HTTP status 503"),
        ([(":status", "404")], StatusCode.UNIMPLEMENTED, "404"),
        ([(":status", "418")], StatusCode.UNKNOWN, "418"),
        ([(":status", "200"), ("content-type", "text/html")], StatusCode.UNKNOWN, "not gRPC"),
        ([*OK_HEADERS, ("grpc-encoding", "snappy")], StatusCode.INTERNAL, "snappy"),
    ],
)
def test_a_response_that_is_not_grpc_ends_the_call(headers: list[tuple[str, str]], code: int, wording: str) -> None:
    server = Server()
    sid = server.call()
    server.headers(sid, headers)
    (ended,) = server.ended()
    assert ended.code == code and wording in ended.message
    assert resets(server.sent) == {sid: ErrorCode.NO_ERROR}  # our half was still open


def test_trailers_only_and_a_missing_status() -> None:
    server = Server()
    first, second = server.call(), server.call()
    server.headers(first, [*OK_HEADERS, ("grpc-status", "5"), ("grpc-message", "gone%20%C3%BC%25")], END_STREAM)
    server.headers(second, OK_HEADERS)
    server.headers(second, [("x-only", "metadata")], END_STREAM)
    assert [(e.code, e.message) for e in server.ended()] == [
        (StatusCode.NOT_FOUND, "gone ü%"),
        (StatusCode.UNKNOWN, "the server's trailers have no grpc-status"),
    ]


def test_data_before_headers_and_data_ending_without_trailers() -> None:
    server = Server()
    first, second = server.call(), server.call()
    server.data(first, grpc_message(b"early"))
    assert [e for e in server.events if isinstance(e, StreamReset)] == [
        StreamReset(first, ErrorCode.PROTOCOL_ERROR, False)
    ]
    server.headers(second, OK_HEADERS)
    server.data(second, grpc_message(b"x")[:3], END_STREAM)
    (ended,) = server.ended()
    assert ended.code == StatusCode.INTERNAL and "inside a message" in ended.message


def test_compressed_messages() -> None:
    server = Server()
    plain, zipped = server.call(), server.call()
    server.headers(plain, OK_HEADERS)
    server.data(plain, grpc_message(gzip.compress(b"payload"), compressed=1))  # no grpc-encoding announced
    server.headers(zipped, [*OK_HEADERS, ("grpc-encoding", "gzip")])
    events = server.data(zipped, grpc_message(gzip.compress(b"payload"), compressed=1))
    assert [e.data for e in events if isinstance(e, MessageReceived)] == [b"payload"]
    (ended,) = server.ended()
    assert ended.stream_id == plain and ended.code == StatusCode.INTERNAL
    assert resets(server.sent)[plain] == ErrorCode.CANCEL


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (wire.frame(FrameType.HEADERS, END_HEADERS, 2, hpack.Encoder().encode(OK_HEADERS)), ErrorCode.PROTOCOL_ERROR),
        (wire.frame(FrameType.PUSH_PROMISE, END_HEADERS, 1, b"\0\0\0\2"), ErrorCode.PROTOCOL_ERROR),
        (wire.frame(FrameType.HEADERS, END_HEADERS, 7, hpack.Encoder().encode(OK_HEADERS)), ErrorCode.PROTOCOL_ERROR),
        (wire.frame(FrameType.HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff"), ErrorCode.COMPRESSION_ERROR),
        (wire.frame(FrameType.DATA, 0, 1, b"x" * (5 << 20)), ErrorCode.FRAME_SIZE_ERROR),
        (wire.frame(FrameType.HEADERS, 0, 1, b"\x00" * (70 << 10)), ErrorCode.ENHANCE_YOUR_CALM),  # headers flood
        (wire.frame(FrameType.SETTINGS, 0, 0, b"\x00\x04\x80\x00\x00\x00"), ErrorCode.FLOW_CONTROL_ERROR),
    ],
)
def test_server_frames_that_break_the_connection(frame: bytes, code: ErrorCode) -> None:
    server = Server()
    server.call()
    events = server.send(frame)
    assert isinstance(events[-1], ConnectionTerminated) and not events[-1].by_peer
    assert goaway_code(server.sent) == code
    assert not server.client.accepting
    with pytest.raises(RuntimeError):
        server.client.start_call("/proto.API/Publish")


def test_the_server_must_start_with_settings() -> None:
    client = ClientConnection("h:1")
    client.data_to_send()
    events = client.receive(wire.frame(FrameType.PING, 0, 0, b"\0" * 8), 0.0)
    assert isinstance(events[-1], ConnectionTerminated)
    assert goaway_code(parse_frames(client.data_to_send())) == ErrorCode.PROTOCOL_ERROR


def test_goaway_and_the_servers_stream_limit() -> None:
    server = Server({Setting.MAX_CONCURRENT_STREAMS: 2})
    first, second = server.call(), server.call()
    assert not server.client.has_room
    server.headers(first, [*OK_HEADERS, ("grpc-status", "0")], END_STREAM)
    assert server.client.has_room
    server.send(wire.goaway(first, ErrorCode.NO_ERROR, b"shutting down"))
    (terminated,) = [e for e in server.events if isinstance(e, ConnectionTerminated)]
    assert terminated.by_peer and terminated.last_stream_id == first < second
    assert not server.client.accepting


def test_request_flow_control_follows_the_servers_windows() -> None:
    server = Server({Setting.INITIAL_WINDOW_SIZE: 1000})
    sid = server.call()
    server.client.send_message(sid, b"x" * 5000)
    server.client.end_request(sid)
    server.sent += parse_frames(server.client.data_to_send())
    assert sum(len(f.payload) for f in server.frames(FrameType.DATA)) == 1000
    assert server.client.buffered(sid) == 5005 - 1000
    events = server.send(wire.window_update(sid, 10_000))
    assert WindowOpened() in events
    server.sent += parse_frames(server.client.data_to_send())
    data = server.frames(FrameType.DATA)
    assert sum(len(f.payload) for f in data) == 5005 and data[-1].flags & END_STREAM


def test_response_credit_comes_back_as_the_app_reads() -> None:
    server = Server()
    sid = server.call()
    server.headers(sid, OK_HEADERS)
    window = server.client.limits.stream_window
    message = b"m" * (window // 8)  # a frame each: under our max frame size
    server.data(sid, grpc_message(message))
    server.data(sid, grpc_message(message))
    received = [e for e in server.events if isinstance(e, MessageReceived)]
    assert len(received) == 2
    updates = [f for f in server.frames(FrameType.WINDOW_UPDATE) if f.stream_id == sid]
    assert updates == []  # not read yet: no credit for the stream
    for event in received:  # a quarter window read: credit goes out in one update
        server.client.consumed(sid, event.size)
    server.sent += parse_frames(server.client.data_to_send())
    updates = [f for f in server.frames(FrameType.WINDOW_UPDATE) if f.stream_id == sid]
    assert sum(struct.unpack(">L", f.payload)[0] for f in updates) == sum(e.size for e in received)
