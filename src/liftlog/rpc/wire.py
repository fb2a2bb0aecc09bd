"""HTTP/2 frame layout (RFC 9113) and the few HPACK encodings (RFC 7541) a gRPC server sends.

A frame is a 9-byte header, then its payload::

    length (24 bits) | type (8) | flags (8) | R (1) stream id (31)

We decode header blocks with the ``hpack`` library (clients use its dynamic
table) but encode ours as literals that never enter a table: a response's
headers and trailers are then fixed bytes or a few concatenations, and the
peer's table size settings cannot affect us.
"""

from __future__ import annotations

import base64
import enum
import struct
from collections.abc import Iterable
from typing import Final

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER: Final = struct.Struct(">BHBBL")  # length split in 8 + 16 bits, type, flags, stream id
FRAME_HEADER_SIZE: Final = 9
SETTING: Final = struct.Struct(">HL")  # one SETTINGS entry: identifier, value
DEFAULT_WINDOW: Final = 65_535
DEFAULT_MAX_FRAME: Final = 16_384
MAX_WINDOW: Final = 2**31 - 1
MAX_FRAME_LIMIT: Final = 2**24 - 1
MAX_STREAM_ID: Final = 2**31 - 1


class FrameType(enum.IntEnum):
    DATA = 0
    HEADERS = 1
    PRIORITY = 2
    RST_STREAM = 3
    SETTINGS = 4
    PUSH_PROMISE = 5
    PING = 6
    GOAWAY = 7
    WINDOW_UPDATE = 8
    CONTINUATION = 9


# Flags (their meaning depends on the frame type).
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20


class ErrorCode(enum.IntEnum):
    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


class Setting(enum.IntEnum):
    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return FRAME_HEADER.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def frame_header(kind: int, flags: int, stream_id: int, length: int) -> bytes:
    return FRAME_HEADER.pack(length >> 16, length & 0xFFFF, kind, flags, stream_id)


def settings_frame(settings: Iterable[tuple[int, int]]) -> bytes:
    return frame(FrameType.SETTINGS, 0, 0, b"".join(struct.pack(">HL", k, v) for k, v in settings))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(FrameType.WINDOW_UPDATE, 0, stream_id, struct.pack(">L", increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(FrameType.RST_STREAM, 0, stream_id, struct.pack(">L", code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(FrameType.GOAWAY, 0, 0, struct.pack(">LL", last_stream_id, code) + debug)


# -- HPACK literals ------------------------------------------------------------


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(data: bytes) -> bytes:
    return _integer(len(data), 7, 0) + data  # no Huffman coding


def literal(name: bytes, value: bytes) -> bytes:
    """A header field "without indexing" with a literal name."""
    return b"\x00" + _string(name) + _string(value)


def literal_indexed_name(index: int, value: bytes) -> bytes:
    """A header field "without indexing" whose name is static-table entry ``index``."""
    return _integer(index, 4, 0) + _string(value)


STATUS_200: Final = b"\x88"  # static table entry 8, ":status: 200"
CONTENT_TYPE_GRPC: Final = literal_indexed_name(31, b"application/grpc")
RESPONSE_HEADERS: Final = STATUS_200 + CONTENT_TYPE_GRPC
GRPC_STATUS_OK: Final = literal(b"grpc-status", b"0")

_UNRESERVED = frozenset(range(0x20, 0x7F)) - {ord("%")}


def percent_encode(message: str) -> bytes:
    """``grpc-message`` encoding: UTF-8, with bytes outside printable ASCII and '%' as %XX."""
    raw = message.encode("utf-8", "replace")
    if all(b in _UNRESERVED for b in raw):
        return raw
    return b"".join(bytes([b]) if b in _UNRESERVED else b"%%%02X" % b for b in raw)


def metadata_block(metadata: Iterable[tuple[str, str | bytes]]) -> bytes:
    """Custom metadata as literals: keys lower-case, ``-bin`` values base64, others printable ASCII."""
    out = []
    for key, value in metadata:
        name = key.lower().encode("ascii")
        if name.endswith(b"-bin"):
            raw = value if isinstance(value, bytes) else value.encode()
            data = base64.b64encode(raw).rstrip(b"=")
        else:
            data = value.encode("ascii", "replace") if isinstance(value, str) else value
            if any(b < 0x20 or b > 0x7E for b in data):
                raise ValueError(f"metadata {key!r} has a value that is not printable ASCII")
        out.append(literal(name, data))
    return b"".join(out)


def trailers_block(status: int, message: str, metadata: Iterable[tuple[str, str | bytes]] = ()) -> bytes:
    block = GRPC_STATUS_OK if status == 0 else literal(b"grpc-status", str(status).encode())
    if message:
        block += literal(b"grpc-message", percent_encode(message))
    return block + metadata_block(metadata)
