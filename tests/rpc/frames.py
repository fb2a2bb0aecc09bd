"""Hand-built client frames and a parser for what the server sends, shared by the tests of liftlog.rpc."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from liftlog.rpc.wire import ErrorCode, FrameType

PATH = "/proto.API/Publish"


def request_headers(
    path: str = PATH,
    extra: Iterable[tuple[str, str]] = (),
    method: str = "POST",
    content_type: str = "application/grpc",
) -> list[tuple[str, str]]:
    headers = [(":method", method), (":scheme", "http"), (":path", path), (":authority", "127.0.0.1")]
    if content_type:
        headers.append(("content-type", content_type))
    return [*headers, ("te", "trailers"), *extra]


def grpc_message(data: bytes, compressed: int = 0) -> bytes:
    return struct.pack(">BL", compressed, len(data)) + data


@dataclass(frozen=True)
class Frame:
    type: int
    flags: int
    stream_id: int
    payload: bytes


def parse_frames(data: bytes) -> list[Frame]:
    """Every frame in ``data``, which must end on a frame boundary."""
    frames = []
    pos = 0
    while pos < len(data):
        assert len(data) - pos >= 9, "output ends inside a frame header"
        length = int.from_bytes(data[pos : pos + 3], "big")
        sid = int.from_bytes(data[pos + 5 : pos + 9], "big") & 0x7FFFFFFF
        payload = data[pos + 9 : pos + 9 + length]
        assert len(payload) == length, "output ends inside a frame"
        frames.append(Frame(data[pos + 3], data[pos + 4], sid, payload))
        pos += 9 + length
    return frames


class FrameReader:
    """Frames from a byte stream that arrives in pieces."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self.buf += data
        frames = []
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + length:
                break
            frames += parse_frames(bytes(self.buf[: 9 + length]))
            del self.buf[: 9 + length]
        return frames


def goaways(frames: Sequence[Frame]) -> list[tuple[int, int, bytes]]:
    """(last stream id, error code, debug data) of every GOAWAY."""
    out = []
    for f in frames:
        if f.type == FrameType.GOAWAY:
            last, code = struct.unpack_from(">LL", f.payload)
            out.append((last & 0x7FFFFFFF, code, f.payload[8:]))
    return out


def goaway_code(frames: Sequence[Frame]) -> ErrorCode | None:
    found = goaways(frames)
    assert len(found) <= 1, f"more than one GOAWAY: {found}"
    return ErrorCode(found[0][1]) if found else None


def resets(frames: Sequence[Frame]) -> dict[int, int]:
    """Stream id -> error code of every RST_STREAM."""
    return {f.stream_id: struct.unpack(">L", f.payload)[0] for f in frames if f.type == FrameType.RST_STREAM}
