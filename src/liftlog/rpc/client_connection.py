"""The client side of one HTTP/2 connection carrying gRPC calls, sans-IO.

:class:`ClientConnection` opens calls (:meth:`start_call`: a stream and its
request headers), queues request messages (:meth:`send_message`), ends the
request (:meth:`end_request`) or cancels the call (:meth:`cancel`); the
bytes the server sends back (:meth:`receive`) become events: response
messages, and the call's end with its status (:class:`CallEnded`). The frame
layer, flow control and policing are :class:`~liftlog.rpc.connection.Connection`'s.

How a call ends, as gRPC's HTTP/2 protocol defines it:

- trailers (a HEADERS frame with END_STREAM), after the response headers,
  or alone (trailers-only): ``grpc-status``, ``grpc-message``, metadata;
- a response that is not gRPC (an HTTP status other than 200, another
  content type): the status gRPC maps that HTTP status to;
- RST_STREAM from the server (:class:`StreamReset`), a stream or
  connection error here, the connection's end: the shell picks the status.

A GOAWAY from the server (:class:`ConnectionTerminated`) names the last
stream it took: calls above it never ran and may be retried; no new call
can start on this connection (:attr:`accepting`).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from . import wire
from .connection import (
    ENCODINGS,
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
from .server_connection import b64decode
from .status import Metadata, StatusCode
from .wire import END_STREAM, ErrorCode, FrameType, Setting

__all__ = [
    "CallEnded",
    "ClientConnection",
    "ClientEvent",
    "ConnectionTerminated",
    "MessageReceived",
    "PingAcked",
    "StreamReset",
    "WindowOpened",
    "client_limits",
]

#: HTTP statuses that gRPC maps to a status code (gRPC's http-grpc-status-mapping.md).
_HTTP_STATUS: Final = {
    400: StatusCode.INTERNAL,
    401: StatusCode.UNAUTHENTICATED,
    403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.UNIMPLEMENTED,
    429: StatusCode.UNAVAILABLE,
    502: StatusCode.UNAVAILABLE,
    503: StatusCode.UNAVAILABLE,
    504: StatusCode.UNAVAILABLE,
}
_METHOD_POST: Final = b"\x83"  # static table entry 3
_SCHEME_HTTP: Final = b"\x86"  # static table entry 6
_SCHEME_HTTPS: Final = b"\x87"  # static table entry 7
_TE_TRAILERS: Final = wire.literal(b"te", b"trailers")
_ACCEPT_ENCODING: Final = wire.literal(b"grpc-accept-encoding", ENCODINGS.encode())
_USER_AGENT: Final = wire.literal(b"user-agent", b"liftlog-python")


def client_limits(max_message_bytes: int = 64 << 20) -> ConnectionLimits:
    """What a client lets its server use: big windows (catch-up reads stream megabytes), lenient pings."""
    return ConnectionLimits(
        stream_window=4 << 20,
        connection_window=16 << 20,
        max_frame_size=1 << 20,
        max_header_list_size=64 << 10,
        max_message_bytes=max_message_bytes,
        max_buffered_bytes=max_message_bytes + (32 << 20),
        max_ping_strikes=100,
        ping_min_interval=1.0,
    )


@dataclass(frozen=True, slots=True)
class CallEnded:
    """The server ended the call with this status (trailers, or a response that is not gRPC)."""

    stream_id: int
    code: int
    message: str
    metadata: tuple[tuple[str, str | bytes], ...]


ClientEvent = MessageReceived | CallEnded | StreamReset | WindowOpened | PingAcked | ConnectionTerminated


class ClientConnection(Connection):
    def __init__(self, authority: str, *, limits: ConnectionLimits | None = None, tls: bool = False) -> None:
        super().__init__(limits or client_limits(), [(Setting.ENABLE_PUSH, 0)])
        self._out[:0] = wire.PREFACE
        self._next_stream = 1
        self._goaway_received = False
        self._prefix = (
            _METHOD_POST + (_SCHEME_HTTPS if tls else _SCHEME_HTTP) + wire.literal_indexed_name(1, authority.encode())
        )
        self._suffix = wire.CONTENT_TYPE_GRPC + _TE_TRAILERS + _ACCEPT_ENCODING + _USER_AGENT

    def receive(self, data: bytes, now: float) -> list[ClientEvent]:
        """Bytes from the server; returns what they mean, in order. Output may be queued."""
        events: list[ClientEvent] = self._receive(data, now)
        return events

    @property
    def accepting(self) -> bool:
        """Whether a new call may start here (no GOAWAY either way, stream ids left)."""
        return (
            not (self.closed or self._goaway_received or self._goaway_sent) and self._next_stream < wire.MAX_STREAM_ID
        )

    @property
    def has_room(self) -> bool:
        """Whether the server's MAX_CONCURRENT_STREAMS allows another call now."""
        return self._peer_max_streams is None or len(self._streams) < self._peer_max_streams

    def _peer_last_stream(self) -> int:
        return 0  # servers open no streams

    # -- calls ------------------------------------------------------------------------

    def start_call(self, path: str, metadata: Metadata = (), timeout: float | None = None) -> int:
        """Open a stream for a call to ``path`` ("/package.Service/Method"); its id.

        Raises ValueError for metadata HTTP/2 cannot carry, RuntimeError when the connection takes no new calls.
        """
        if not self.accepting:
            raise RuntimeError("the connection takes no new calls")
        block = self._prefix + wire.literal_indexed_name(4, path.encode())
        if timeout is not None:
            block += wire.literal(b"grpc-timeout", _timeout_value(timeout))
        block += self._suffix
        if metadata:
            block += wire.metadata_block(metadata)
        sid = self._next_stream
        self._next_stream += 2
        self._last_stream = sid
        s = _Stream(sid, self.limits.stream_window, self._peer_window)
        s.headers_sent = True
        self._streams[sid] = s
        self._write_headers(sid, block, 0)
        return sid

    def end_request(self, stream_id: int) -> None:
        """No more request messages: END_STREAM once the queued ones are out."""
        s = self._streams.get(stream_id)
        if s is None or s.local_closed:
            return
        s.local_closed = s.ending = True
        self._dirty[stream_id] = None

    def cancel(self, stream_id: int) -> None:
        """Abandon a call: RST_STREAM CANCEL; nothing more is reported for it."""
        self.reset_stream(stream_id, ErrorCode.CANCEL)

    def _write_first_headers(self, s: _Stream) -> bool:
        raise AssertionError("a client writes a call's headers when it starts it")

    def _write_end(self, s: _Stream) -> None:
        self._out += wire.frame(FrameType.DATA, END_STREAM, s.id)

    # -- responses ----------------------------------------------------------------------

    def _closed_or_idle(self, sid: int, what: str) -> None:
        if sid % 2 == 0 and sid != 0:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"{what} on stream {sid}, which we never opened")
        super()._closed_or_idle(sid, what)

    def _goaway(self, sid: int, payload: bytes, events: list[Any]) -> None:
        self._goaway_received = True
        super()._goaway(sid, payload, events)

    def _on_headers(self, sid: int, flags: int, headers: Iterable[tuple[bytes, bytes]], events: list[Any]) -> None:
        if sid % 2 == 0 or sid > self._last_stream:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {sid}, which we never opened")
        s = self._streams.get(sid)
        if s is None or s.remote_closed:
            return  # a call we cancelled, or ended for an error here
        if not s.headers_received:
            s.headers_received = True
            ended = self._response_headers(s, headers, flags & END_STREAM != 0, events)
            if ended or not flags & END_STREAM:
                return
        elif not flags & END_STREAM:
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
            return
        self._end_call(s, *_status(headers), events)

    def _response_headers(
        self, s: _Stream, headers: Iterable[tuple[bytes, bytes]], trailers_only: bool, events: list[Any]
    ) -> bool:
        """Check a response's first headers; True if they ended the call (not gRPC, or trailers-only)."""
        http_status = content_type = b""
        encoding = b"identity"
        for name, value in headers:
            if name == b":status":
                http_status = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-encoding":
                encoding = value
        if http_status != b"200":
            code = _HTTP_STATUS.get(int(http_status) if http_status.isdigit() else 0, StatusCode.UNKNOWN)
            self._end_call(
                s, code, f"HTTP status {http_status.decode('latin-1') or 'missing'} from the server", (), events
            )
            return True
        if trailers_only:
            return False  # the status is in these headers
        if not content_type.startswith(b"application/grpc"):
            why = f"the server answered with content-type {content_type.decode('latin-1')!r}, not gRPC"
            self._end_call(s, StatusCode.UNKNOWN, why, (), events)
            return True
        if encoding == b"gzip":
            s.gzip = True
        elif encoding != b"identity":
            why = f"the server answered in grpc-encoding {encoding.decode('latin-1')!r}, which we did not offer"
            self._end_call(s, StatusCode.INTERNAL, why, (), events)
            return True
        return False

    def _end_call(
        self, s: _Stream, code: int, message: str, metadata: tuple[tuple[str, str | bytes], ...], events: list[Any]
    ) -> None:
        s.remote_closed = True
        if s.buf:  # the server ended inside a message
            code, message, metadata = StatusCode.INTERNAL, "the response ended inside a message", ()
        events.append(CallEnded(s.id, code, message, metadata))
        if not s.local_closed or s.outbuf:
            # The server is done with the call: what we still had to send is moot.
            self._out += wire.rst_stream(s.id, ErrorCode.NO_ERROR)
        self._streams.pop(s.id, None)
        self._forget(s)

    def _remote_ended(self, s: _Stream, events: list[Any]) -> None:
        why = "the server ended the response without trailers" if s.headers_received else "a response without headers"
        self._end_call(s, StatusCode.INTERNAL, why, (), events)

    def _data(self, flags: int, sid: int, payload: bytes | memoryview, events: list[Any]) -> None:
        s = self._streams.get(sid)
        if s is not None and not s.headers_received and not s.remote_closed:
            self._recv_window -= len(payload)
            self._give_back(None, len(payload))
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
            return
        super()._data(flags, sid, payload, events)

    def _call_error(self, s: _Stream, code: StatusCode, message: str, events: list[Any]) -> None:
        """A response message we cannot take: cancel the call and end it here with ``code``."""
        self._out += wire.rst_stream(s.id, ErrorCode.CANCEL)
        s.remote_closed = True
        events.append(CallEnded(s.id, code, message, ()))
        self._streams.pop(s.id, None)
        self._forget(s)

    def _reap(self, s: _Stream) -> None:
        done = s.local_closed and s.remote_closed and not s.outbuf and not s.ending
        if done and self._streams.pop(s.id, None) is not None:
            self._forget(s)


def _status(headers: Iterable[tuple[bytes, bytes]]) -> tuple[int, str, tuple[tuple[str, str | bytes], ...]]:
    """``grpc-status``, ``grpc-message`` and the custom metadata of a call's trailers."""
    code: int | None = None
    message = ""
    metadata: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        if name.startswith(b":"):
            continue
        if name == b"grpc-status":
            code = int(value) if value.isdigit() else StatusCode.UNKNOWN
        elif name == b"grpc-message":
            message = urllib.parse.unquote(value.decode("latin-1"), encoding="utf-8", errors="replace")
        elif name in (b"content-type", b"grpc-encoding", b"grpc-accept-encoding"):
            continue
        else:
            key = name.decode("latin-1")
            if key.endswith("-bin"):
                try:
                    metadata.append((key, b64decode(value)))
                except ValueError:
                    continue  # a value we cannot read is dropped, as grpcio drops it
            else:
                metadata.append((key, value.decode("latin-1")))
    if code is None:
        return StatusCode.UNKNOWN, message or "the server's trailers have no grpc-status", tuple(metadata)
    return code, message, tuple(metadata)


def _timeout_value(seconds: float) -> bytes:
    """``grpc-timeout``: at most 8 digits, in the finest unit that holds them."""
    for unit, scale in ((b"u", 1e6), (b"m", 1e3), (b"S", 1.0), (b"M", 1 / 60), (b"H", 1 / 3600)):
        value = max(0, int(seconds * scale + 0.999))
        if value < 100_000_000:
            return str(value).encode() + unit
    return b"99999999H"
