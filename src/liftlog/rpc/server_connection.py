"""The server side of one HTTP/2 connection carrying gRPC calls, sans-IO.

:class:`ServerConnection` takes the bytes a client sent (:meth:`receive`)
and returns events: a call started, a request message, the request ended, a
call reset. The application answers with :meth:`send_message` and
:meth:`send_trailers` and writes :meth:`data_to_send` to the socket. The
frame layer, flow control and policing are :class:`~liftlog.rpc.connection.Connection`'s.

Rules of its own:

- Streams are opened by the client (odd ids, each above the last) with a
  HEADERS frame that is a gRPC request: POST, ``content-type:
  application/grpc*``, a ``:path``. Other requests get an HTTP error status;
  a stream past ``max_concurrent_streams`` is refused (REFUSED_STREAM).
- A call ends when its trailers are out; a bad request message ends it with
  trailers and a reset (:class:`StreamReset` to the app).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from . import wire
from .connection import (
    ENCODINGS,
    BufferBudget,
    Connection,
    ConnectionLimits,
    ConnectionTerminated,
    MessageReceived,
    PingAcked,
    StreamReset,
    WindowOpened,
    _ConnectionError,
    _Stream,
)
from .status import Metadata, StatusCode
from .wire import END_STREAM, ErrorCode, Setting

__all__ = [
    "ENCODINGS",
    "ConnectionLimits",
    "ConnectionTerminated",
    "Event",
    "MessageReceived",
    "PingAcked",
    "RequestEnded",
    "RequestReceived",
    "ServerConnection",
    "StreamReset",
    "WindowOpened",
]

_TIMEOUT_UNITS: Final = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


@dataclass(frozen=True, slots=True)
class RequestReceived:
    stream_id: int
    path: str
    metadata: tuple[tuple[str, str | bytes], ...]
    timeout: float | None  # seconds, from grpc-timeout


@dataclass(frozen=True, slots=True)
class RequestEnded:
    stream_id: int


Event = RequestReceived | MessageReceived | RequestEnded | StreamReset | WindowOpened | PingAcked | ConnectionTerminated


class ServerConnection(Connection):
    expects_preface = True

    def __init__(self, limits: ConnectionLimits | None = None, budget: BufferBudget | None = None) -> None:
        limits = limits or ConnectionLimits()
        super().__init__(limits, [(Setting.MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams)], budget)

    def receive(self, data: bytes, now: float) -> list[Event]:
        """Bytes from the client; returns what they mean, in order. Output may be queued."""
        events: list[Event] = self._receive(data, now)
        return events

    def _peer_last_stream(self) -> int:
        return self._last_stream

    # -- requests -------------------------------------------------------------------

    def _on_headers(self, sid: int, flags: int, headers: Iterable[tuple[bytes, bytes]], events: list[Any]) -> None:
        if sid % 2 == 0:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"client opened even-numbered stream {sid}")
        if sid <= self._last_stream:
            s = self._streams.get(sid)
            if s is None or s.remote_closed:
                if s is not None:
                    self._stream_error(sid, ErrorCode.STREAM_CLOSED, events)
                return  # trailers for a call that ended here: ignored
            if not flags & END_STREAM:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "a second HEADERS without END_STREAM")
            s.remote_closed = True  # request trailers: gRPC defines none, so nothing to pass on
            events.append(RequestEnded(sid))
            self._reap(s)
            return
        self._last_stream = sid
        if self._goaway_sent:
            self._out += wire.rst_stream(sid, ErrorCode.REFUSED_STREAM)
            return
        if len(self._streams) >= self.limits.max_concurrent_streams:
            self._out += wire.rst_stream(sid, ErrorCode.REFUSED_STREAM)
            return
        s = _Stream(sid, self.limits.stream_window, self._peer_window)
        s.headers_received = True  # the request's: its DATA may follow
        self._streams[sid] = s
        if flags & END_STREAM:
            s.remote_closed = True
        request = self._request(s, headers)
        if request is None:
            return
        events.append(request)
        if s.remote_closed:
            events.append(RequestEnded(sid))

    def _request(self, s: _Stream, headers: Iterable[tuple[bytes, bytes]]) -> RequestReceived | None:
        """Check a gRPC request's headers; answer a bad one here and return None."""
        method = path = content_type = b""
        timeout: float | None = None
        encoding = b"identity"
        metadata: list[tuple[str, str | bytes]] = []
        for name, value in headers:
            if name.startswith(b":"):
                if name == b":method":
                    method = value
                elif name == b":path":
                    path = value
                continue
            if name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout = _parse_timeout(value)
                if timeout is None:
                    self._answer(s, 200, StatusCode.INTERNAL, f"malformed grpc-timeout {value!r}")
                    return None
            elif name == b"grpc-encoding":
                encoding = value
            elif name in (b"te", b"grpc-accept-encoding", b"connection"):
                continue
            else:
                key = name.decode("latin-1")
                if key.endswith("-bin"):
                    try:
                        metadata.append((key, b64decode(value)))
                    except ValueError:
                        self._answer(s, 200, StatusCode.INTERNAL, f"metadata {key!r} is not valid base64")
                        return None
                else:
                    metadata.append((key, value.decode("latin-1")))
        if method != b"POST":
            self._answer(s, 405, StatusCode.UNIMPLEMENTED, f"method {method.decode('latin-1')!r}: gRPC uses POST")
            return None
        if not content_type.startswith(b"application/grpc"):
            self._answer(s, 415, StatusCode.UNKNOWN, f"invalid gRPC request content-type {content_type!r}")
            return None
        if not path:
            self._answer(s, 400, StatusCode.INTERNAL, "request without :path")
            return None
        if encoding == b"gzip":
            s.gzip = True
        elif encoding != b"identity":
            self._answer(
                s,
                200,
                StatusCode.UNIMPLEMENTED,
                f"grpc-encoding {encoding.decode('latin-1')!r} is not supported (supported: {ENCODINGS})",
                extra=wire.literal(b"grpc-accept-encoding", ENCODINGS.encode()),
            )
            return None
        return RequestReceived(s.id, path.decode("latin-1"), tuple(metadata), timeout)

    def _answer(self, s: _Stream, http_status: int, code: StatusCode, message: str, extra: bytes = b"") -> None:
        """End a call that never reached the app with a trailers-only response."""
        status = wire.STATUS_200 if http_status == 200 else wire.literal_indexed_name(8, str(http_status).encode())
        block = status + wire.CONTENT_TYPE_GRPC + wire.trailers_block(code, message) + extra
        self._write_headers(s.id, block, END_STREAM)
        s.headers_sent = s.local_closed = True
        self._reap(s)

    def _remote_ended(self, s: _Stream, events: list[Any]) -> None:
        s.remote_closed = True
        if s.buf:
            self._call_error(s, StatusCode.INTERNAL, "the request ended inside a message", events)
            return
        events.append(RequestEnded(s.id))
        self._reap(s)

    # -- responses -------------------------------------------------------------------

    def send_trailers(self, stream_id: int, code: int, message: str = "", metadata: Metadata = ()) -> bool:
        """End the call after the messages queued before; False if it is already over."""
        s = self._streams.get(stream_id)
        if s is None or s.local_closed:
            return False
        s.trailers = wire.trailers_block(code, message, metadata)
        s.local_closed = s.ending = True
        self._dirty[stream_id] = None
        return True

    def _write_first_headers(self, s: _Stream) -> bool:
        s.headers_sent = True
        if not s.outbuf and s.trailers is not None:  # trailers-only response
            self._write_headers(s.id, wire.RESPONSE_HEADERS + s.trailers, END_STREAM)
            s.trailers = None
            s.ending = False
            self._reap(s)
            return True
        self._write_headers(s.id, wire.RESPONSE_HEADERS, 0)
        return False

    def _write_end(self, s: _Stream) -> None:
        assert s.trailers is not None
        self._write_headers(s.id, s.trailers, END_STREAM)
        s.trailers = None

    def _call_error(self, s: _Stream, code: StatusCode, message: str, events: list[Any]) -> None:
        """End a call for a bad request message: trailers with ``code``, reset, and tell the app."""
        self._police_reset()
        if not s.local_closed:
            if not s.headers_sent:
                self._write_headers(s.id, wire.RESPONSE_HEADERS + wire.trailers_block(code, message), END_STREAM)
            else:
                self._write_headers(s.id, wire.trailers_block(code, message), END_STREAM)
        s.headers_sent = s.local_closed = True
        s.ending = False
        s.trailers = None
        s.outbuf.clear()
        if not s.remote_closed:
            self._out += wire.rst_stream(s.id, ErrorCode.NO_ERROR)
        self._streams.pop(s.id, None)
        self._forget(s)
        events.append(StreamReset(s.id, ErrorCode.CANCEL, by_peer=False))

    def _reap(self, s: _Stream) -> None:
        """Forget a stream whose response is complete.

        A client still sending on it is not reset: RFC 9113 allows RST_STREAM NO_ERROR here, but a
        client that is mid-write (grpcio's) then reports its failed write, INTERNAL, instead of our
        status. What it sends later is dropped, and clients stop sending once they have the trailers.
        """
        if not (s.local_closed and s.headers_sent and not s.ending and not s.outbuf):
            return
        if self._streams.pop(s.id, None) is not None:
            self._forget(s)


def _parse_timeout(value: bytes) -> float | None:
    if not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS.get(chr(value[-1]))
    return None if unit is None else int(value[:-1]) * unit


def b64decode(value: bytes) -> bytes:
    """A ``-bin`` metadata value: base64, padded or not."""
    try:
        return base64.b64decode(value + b"=" * (-len(value) % 4), validate=True)
    except binascii.Error as exc:
        raise ValueError(str(exc)) from exc
