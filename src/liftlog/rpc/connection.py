"""What both ends of an HTTP/2 connection carrying gRPC calls share, sans-IO.

:class:`Connection` parses frames, keeps the flow-control windows, splits
DATA into gRPC messages (1-byte compressed flag, 4-byte length, message) and
frames queued messages; :class:`~liftlog.rpc.server_connection.ServerConnection`
and :class:`~liftlog.rpc.client_connection.ClientConnection` add what differs:
who opens streams, what their headers mean, how a side ends its half. A
connection owns no socket, task or clock: bytes come in with :meth:`receive`
(and the time, for policing), events go out, and :meth:`data_to_send` is
what to write. Not safe to share between threads; nothing here awaits.

Rules both ends follow:

- Each complete message is a :class:`MessageReceived`. A message over
  ``max_message_bytes``, or one in an encoding the stream did not announce,
  ends the call with RESOURCE_EXHAUSTED or INTERNAL.
- Flow control, receiving: the bytes of a message count against the windows
  until the app says it took the message (:meth:`consumed`); window updates
  go out in batches of a quarter window. A stream whose messages the app does
  not take, or a connection holding ``max_buffered_bytes``, gets no more
  credit, so a peer can never make us buffer without bound. Connections that
  share a :class:`BufferBudget` (a server's) also get no credit the budget
  cannot cover: each may hold the protocol's initial window (64 KiB) on its
  own; beyond it, what it holds or has been granted comes from the budget.
- Flow control, sending: messages are queued per stream and framed when
  :meth:`data_to_send` is called, packed up to the peer's frame size and as
  far as both windows allow; :meth:`buffered` tells the app how far behind a
  stream is, :class:`WindowOpened` that it may write again.
- Frames for streams that ended are ignored, as RFC 9113 asks (DATA still
  counts against the connection window).
- PING ACKs go first in the next output; ``data_to_send(hold_acks=True)``
  lets them wait when they are all there is, so that a shell can send them
  with a response instead of alone (the server does, while a call runs and
  for at most ``ping_ack_delay``).
- Abuse is a connection error with GOAWAY ENHANCE_YOUR_CALM: more pings than
  ``max_ping_strikes`` less than ``ping_min_interval`` apart without data
  from us in between; more SETTINGS, resets (sent by the peer, or sent by us
  for its errors: one bucket), PRIORITY, empty DATA or unknown frames than
  their token buckets allow; a header block over
  ``max_header_block_bytes`` (CONTINUATION floods). Malformed frames are the
  errors RFC 9113 names (PROTOCOL_ERROR, FRAME_SIZE_ERROR,
  FLOW_CONTROL_ERROR, COMPRESSION_ERROR).
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import hpack
import hpack.exceptions

from . import wire
from .status import RpcError, StatusCode
from .wire import ACK, END_HEADERS, END_STREAM, PADDED, PRIORITY_FLAG, ErrorCode, FrameType, Setting

__all__ = [
    "ENCODINGS",
    "BufferBudget",
    "Connection",
    "ConnectionLimits",
    "ConnectionTerminated",
    "MessageReceived",
    "PingAcked",
    "StreamReset",
    "WindowOpened",
]

PREFIX: Final = struct.Struct(">BL")
_MEMORY_REPR: Final = re.compile(r":? ?<memory at 0x[0-9a-f]+>")
_DATA: Final = int(FrameType.DATA)
_U32 = struct.Struct(">L")
ENCODINGS: Final = "identity,gzip"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one connection may use; the defaults suit liftlog's API (a server's view of a client)."""

    max_concurrent_streams: int = 1024
    stream_window: int = 1 << 20  # receive window we advertise per stream
    connection_window: int = 8 << 20
    max_frame_size: int = wire.DEFAULT_MAX_FRAME  # largest frame we accept
    max_header_list_size: int = 16 << 10  # decoded request headers
    max_header_block_bytes: int = 64 << 10  # encoded, over HEADERS and CONTINUATION
    max_message_bytes: int = 64 << 20
    #: Said after the numbers when a message is over ``max_message_bytes`` (what the limit comes from).
    max_message_hint: str = ""
    max_buffered_bytes: int = 80 << 20  # received, not yet taken by the app, whole connection
    max_ping_strikes: int = 10
    ping_min_interval: float = 10.0  # seconds
    #: Token buckets (burst, per second) for frames that carry no data.
    settings_rate: tuple[int, float] = (100, 100.0)
    reset_rate: tuple[int, float] = (500, 200.0)
    junk_rate: tuple[int, float] = (1000, 1000.0)


class BufferBudget:
    """Bytes every connection of a server together may hold or let their peers send, beyond a floor each.

    A connection's footprint is its receive window still open to the peer plus the bytes it holds (whole
    messages the app has not taken, unfinished ones). The first ``floor`` bytes of a footprint are the
    connection's own (the window HTTP/2 grants every connection before any WINDOW_UPDATE); the rest is
    charged here, and a window update the budget cannot cover is held back: the peer waits
    (backpressure). Connections waiting for budget are in ``waiting``, oldest first; the shell calls
    their ``grant_withheld`` once ``room`` shows budget again. Sans-IO, like the connections.
    """

    __slots__ = ("floor", "limit", "used", "waiting", "withheld")

    def __init__(self, limit: int, floor: int = wire.DEFAULT_WINDOW) -> None:
        self.limit = limit
        self.floor = floor
        self.used = 0
        self.waiting: dict[Connection, None] = {}
        #: Window updates held back for want of budget (for metrics).
        self.withheld = 0

    @property
    def room(self) -> int:
        return self.limit - self.used


# -- events both ends raise ------------------------------------------------------


@dataclass(slots=True)  # not frozen: a frozen dataclass takes three times as long to build, once per message
class MessageReceived:
    stream_id: int
    data: bytes
    size: int  # bytes it holds until the app takes it (inflated, if larger); pass to consumed()


@dataclass(frozen=True, slots=True)
class StreamReset:
    """The call is over without a proper end: reset by the peer, or ended here for a stream error."""

    stream_id: int
    code: int
    by_peer: bool


@dataclass(frozen=True, slots=True)
class WindowOpened:
    """The peer gave us credit: streams that were waiting to send can go on."""


@dataclass(frozen=True, slots=True)
class PingAcked:
    data: bytes


@dataclass(frozen=True, slots=True)
class ConnectionTerminated:
    """No more calls on this connection: GOAWAY received, or a connection error here (GOAWAY queued)."""

    code: int
    reason: str
    by_peer: bool
    last_stream_id: int


class _ConnectionError(Exception):
    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class _Bucket:
    __slots__ = ("burst", "level", "rate", "stamp")

    def __init__(self, burst: int, rate: float) -> None:
        self.burst = burst
        self.rate = rate
        self.level = float(burst)
        self.stamp: float | None = None

    def take(self, now: float) -> bool:
        if self.stamp is not None:
            self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        self.level -= 1
        return self.level >= 0


class _Stream:
    __slots__ = (
        "buf",
        "credit",
        "ending",
        "excess",
        "gzip",
        "headers_received",
        "headers_sent",
        "held",
        "id",
        "local_closed",
        "outbuf",
        "prepaid",
        "recv_window",
        "remote_closed",
        "send_window",
        "trailers",
    )

    def __init__(self, stream_id: int, recv_window: int, send_window: int) -> None:
        self.id = stream_id
        self.buf = bytearray()  # a received message not yet whole
        self.gzip = False
        self.recv_window = recv_window
        self.credit = 0  # received bytes not yet given back in a WINDOW_UPDATE
        self.held = 0  # bytes of messages handed to the app, not yet consumed
        self.excess = 0  # of held, bytes owed no credit: credited while partial, or added by inflating
        self.prepaid = 0  # bytes of the unfinished message in buf already credited
        self.send_window = send_window
        self.outbuf = bytearray()  # framed gRPC messages waiting for window
        self.trailers: bytes | None = None  # server: the trailers to send once outbuf is out
        self.ending = False  # our end of the stream is queued behind outbuf
        self.headers_sent = False
        self.headers_received = False  # the peer's (a request's, or a response's)
        self.remote_closed = False
        self.local_closed = False


class Connection:
    """The frame layer of one end; subclasses say what headers mean and how their side ends a stream."""

    #: Whether the peer starts with the client preface (a server expects it; a client does not).
    expects_preface = False
    #: DATA frames holding one whole message take _receive's short way (a test turns it off to compare).
    fast_data = True

    def __init__(
        self, limits: ConnectionLimits, settings: list[tuple[int, int]], budget: BufferBudget | None = None
    ) -> None:
        self.limits = limits
        self._budget = budget
        self._charged = 0  # bytes of the footprint charged to the budget
        #: Messages the app took so far: a shell tells a connection that holds bytes without progress by it.
        self.consumptions = 0
        self._in = bytearray()
        self._out = bytearray()
        self._acks = bytearray()  # PING ACKs: they may wait for the next write (see has_urgent_output)
        self._preface = not self.expects_preface
        self._settings_seen = False
        self._decoder = hpack.Decoder(max_header_list_size=limits.max_header_list_size)
        self._streams: dict[int, _Stream] = {}
        self._dirty: dict[int, None] = {}  # streams with output to frame, in order
        self._blocked: dict[int, None] = {}  # streams with output the windows hold back
        self._last_stream = 0  # the highest stream id opened (by the client)
        self._continuation: tuple[int, int, bytearray] | None = None  # stream id, flags, block so far
        self._peer_window = wire.DEFAULT_WINDOW  # peer's initial stream window
        self._peer_max_frame = wire.DEFAULT_MAX_FRAME
        self._peer_max_streams: int | None = None  # streams the peer lets us open, once it said
        self._send_window = wire.DEFAULT_WINDOW  # connection level
        self._recv_window = wire.DEFAULT_WINDOW  # what the peer may still send (raised below)
        #: The connection window we keep open: recv_window + credit + bytes held against it. Without a budget
        #: it is connection_window from the start; with one it starts at the protocol's 64 KiB and doubles
        #: each time the peer nearly runs out of it, so idle connections (and slow talkers) hold no budget.
        self._window = limits.connection_window if budget is None else wire.DEFAULT_WINDOW
        self._credit = 0
        self._buffered = 0  # bytes of messages handed to the app and not consumed
        self._partial = 0  # bytes of unfinished messages
        self._ping_strikes = 0
        self._last_ping: float | None = None
        self._settings_bucket = _Bucket(*limits.settings_rate)
        self._reset_bucket = _Bucket(*limits.reset_rate)
        #: Streams this end reset because of the peer's errors (for metrics).
        self.resets_sent = 0
        self._junk_bucket = _Bucket(*limits.junk_rate)
        self._goaway_sent = False
        self._goaway_last = 0  # last stream id of the GOAWAY sent: a later one must not raise it
        self.closed = False
        self._now = 0.0
        settings = [
            *settings,
            (Setting.INITIAL_WINDOW_SIZE, limits.stream_window),
            (Setting.MAX_HEADER_LIST_SIZE, limits.max_header_list_size),
        ]
        if limits.max_frame_size != wire.DEFAULT_MAX_FRAME:
            settings.append((Setting.MAX_FRAME_SIZE, limits.max_frame_size))
        self._out += wire.settings_frame(settings)
        if self._window > wire.DEFAULT_WINDOW:
            self._credit = self._window - wire.DEFAULT_WINDOW
            self._grant_connection_credit()

    # -- what differs between the ends ----------------------------------------------

    def _on_headers(self, sid: int, flags: int, headers: Iterable[tuple[bytes, bytes]], events: list[Any]) -> None:
        raise NotImplementedError

    def _remote_ended(self, s: _Stream, events: list[Any]) -> None:
        """The peer ended its half of `s` with a DATA frame."""
        raise NotImplementedError

    def _call_error(self, s: _Stream, code: StatusCode, message: str, events: list[Any]) -> None:
        """End a call for a bad message from the peer."""
        raise NotImplementedError

    def _write_end(self, s: _Stream) -> None:
        """Write what ends our half of `s`, now that its messages are out."""
        raise NotImplementedError

    def _write_first_headers(self, s: _Stream) -> bool:
        """Write `s`'s headers before its first message; True if that ended the stream."""
        raise NotImplementedError

    def _reap(self, s: _Stream) -> None:
        """Forget `s` if it is over."""
        raise NotImplementedError

    def _peer_last_stream(self) -> int:
        """The last stream the peer opened that we took: what a GOAWAY from us names."""
        raise NotImplementedError

    # -- state the shell reads ----------------------------------------------------

    @property
    def handshake_done(self) -> bool:
        """Whether the peer's SETTINGS came: it speaks HTTP/2."""
        return self._settings_seen

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def last_stream_id(self) -> int:
        return self._last_stream

    def buffered(self, stream_id: int) -> int:
        """Bytes queued on a stream and not yet framed (0 for a stream that is gone)."""
        s = self._streams.get(stream_id)
        return len(s.outbuf) if s is not None else 0

    def is_open(self, stream_id: int) -> bool:
        s = self._streams.get(stream_id)
        return s is not None and not s.local_closed

    # -- input ----------------------------------------------------------------------

    def _receive(self, data: bytes, now: float) -> list[Any]:
        """Bytes from the peer; returns what they mean, in order. Output may be queued."""
        if self.closed:
            return []
        self._now = now
        buf = self._in
        buf += data
        events: list[Any] = []
        try:
            if not self._preface:
                if len(buf) < len(wire.PREFACE):
                    if not wire.PREFACE.startswith(bytes(buf)):
                        raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 client (bad preface)")
                    return events
                if buf[: len(wire.PREFACE)] != wire.PREFACE:
                    raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 client (bad preface)")
                self._preface = True
                del buf[: len(wire.PREFACE)]
            pos = 0
            end = len(buf)
            max_frame = self.limits.max_frame_size
            max_message = self.limits.max_message_bytes
            unpack = wire.FRAME_HEADER.unpack_from
            unpack_prefix = PREFIX.unpack_from
            streams = self._streams
            # Frames are views of one immutable copy of the input: a DATA frame's messages are copied
            # out of it once, not the frame first and then each message.
            view = memoryview(bytes(buf)) if end >= 9 else None
            while end - pos >= 9 and not self.closed:
                hi, lo, kind, flags, sid = unpack(buf, pos)
                length = (hi << 16) | lo
                if (
                    kind == _DATA
                    and not flags
                    and 5 < length <= end - pos - 9
                    and self._continuation is None
                    and self.fast_data
                ):
                    # The usual DATA frame (go-grpc sends one per message): one whole uncompressed message,
                    # on an open stream whose headers came, with nothing partial, within both windows. What
                    # _data and _messages would do for it, without their generality (half the time a message
                    # in a micro-benchmark); anything else takes their way.
                    s = streams.get(sid & 0x7FFFFFFF)
                    if (
                        s is not None
                        and s.headers_received
                        and not s.buf
                        and not s.prepaid
                        and not s.remote_closed
                        and s.recv_window >= length
                        and self._recv_window >= length
                        and self._settings_seen
                        and length <= max_frame
                        and unpack_prefix(buf, pos + 9) == (0, length - 5)
                        and length - 5 <= max_message
                    ):
                        self._recv_window -= length
                        s.recv_window -= length
                        s.held += length
                        self._buffered += length
                        assert view is not None
                        events.append(MessageReceived(s.id, view[pos + 14 : pos + 9 + length].tobytes(), length))
                        pos += 9 + length
                        continue
                if not self._settings_seen and (kind != FrameType.SETTINGS or flags & ACK):
                    # Say so before judging its "frame": a peer that speaks another protocol (HTTP/1, NATS).
                    start = bytes(buf[pos : pos + 24])
                    raise _ConnectionError(
                        ErrorCode.PROTOCOL_ERROR, f"not an HTTP/2 peer: it did not start with SETTINGS but {start!r}"
                    )
                if length > max_frame:
                    raise _ConnectionError(
                        ErrorCode.FRAME_SIZE_ERROR,
                        f"frame of {length} bytes exceeds our max frame size {max_frame}",
                    )
                if end - pos - 9 < length:
                    break
                assert view is not None
                payload = view[pos + 9 : pos + 9 + length]
                pos += 9 + length
                if kind == FrameType.DATA and self._settings_seen and self._continuation is None:
                    self._data(flags, sid & 0x7FFFFFFF, payload, events)
                else:
                    self._frame(kind, flags, sid & 0x7FFFFFFF, payload.tobytes(), events)
            del buf[:pos]
        except _ConnectionError as exc:
            self._fail(exc.code, exc.reason, events)
        return events

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes, events: list[Any]) -> None:
        if self._continuation is not None and kind != FrameType.CONTINUATION:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "a header block was interrupted by another frame")
        if not self._settings_seen:  # _receive made sure this is SETTINGS
            self._settings_seen = True
        if kind == FrameType.DATA:
            self._data(flags, sid, payload, events)
        elif kind == FrameType.WINDOW_UPDATE:
            self._window_update(sid, payload, events)
        elif kind == FrameType.PING:
            self._ping(flags, sid, payload, events)
        elif kind == FrameType.HEADERS:
            self._headers(flags, sid, payload, events)
        elif kind == FrameType.CONTINUATION:
            self._continue(flags, sid, payload, events)
        elif kind == FrameType.SETTINGS:
            self._settings(flags, sid, payload, events)
        elif kind == FrameType.RST_STREAM:
            self._rst_stream(sid, payload, events)
        elif kind == FrameType.GOAWAY:
            self._goaway(sid, payload, events)
        elif kind == FrameType.PRIORITY:
            if sid == 0:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                self._stream_error(sid, ErrorCode.FRAME_SIZE_ERROR, events)
            self._junk("PRIORITY")
        elif kind == FrameType.PUSH_PROMISE:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE, but push is not allowed")
        else:
            self._junk(f"frames of unknown type {kind}")

    def _junk(self, what: str) -> None:
        if not self._junk_bucket.take(self._now):
            raise _ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, f"too many {what}")

    @staticmethod
    def _unpad(flags: int, payload: bytes | memoryview, what: str) -> tuple[bytes | memoryview, int]:
        if not flags & PADDED:
            return payload, 0
        if not payload or payload[0] >= len(payload):
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"{what} padding longer than the frame")
        pad = payload[0]
        return payload[1 : len(payload) - pad], pad + 1

    def _closed_or_idle(self, sid: int, what: str) -> None:
        if sid == 0:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"{what} on stream 0")
        if sid > self._last_stream:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"{what} on idle stream {sid}")

    def _data(self, flags: int, sid: int, payload: bytes | memoryview, events: list[Any]) -> None:
        length = len(payload)
        self._recv_window -= length
        if self._recv_window < 0:
            raise _ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        s = self._streams.get(sid)
        if s is None or s.remote_closed:
            self._closed_or_idle(sid, "DATA")
            self._give_back(None, length)  # an ended call: drop it, but not the connection's credit
            if s is not None:  # half-closed (remote): the peer broke the stream's rules
                self._stream_error(sid, ErrorCode.STREAM_CLOSED, events)
            return
        s.recv_window -= length
        if s.recv_window < 0:
            self._give_back(None, length)
            self._stream_error(sid, ErrorCode.FLOW_CONTROL_ERROR, events)
            return
        body, padding = self._unpad(flags, payload, "DATA")
        if padding:
            self._give_back(s, padding)
        if body:
            self._messages(s, body, events)
        elif not flags & END_STREAM:
            self._junk("empty DATA frames")
        if flags & END_STREAM and sid in self._streams:
            self._remote_ended(s, events)

    def _messages(self, s: _Stream, body: bytes | memoryview, events: list[Any]) -> None:
        had = len(s.buf)
        if had:
            s.buf += body
            data: bytes | bytearray | memoryview = s.buf
        else:
            data = body
        pos = 0
        end = len(data)
        limit = self.limits.max_message_bytes
        prepaid = s.prepaid
        while end - pos >= 5:
            start = pos
            compressed, size = PREFIX.unpack_from(data, pos)
            try:
                if size > limit:
                    raise RpcError(
                        StatusCode.RESOURCE_EXHAUSTED,
                        f"received message larger than max ({size} vs. {limit}){self.limits.max_message_hint}",
                    )
                if end - pos - 5 < size:
                    break
                if type(data) is bytearray:  # slicing a bytearray copies: take the bytes in one copy, not two
                    with memoryview(data) as view, view[pos + 5 : pos + 5 + size] as part:
                        message = bytes(part)
                else:
                    message = bytes(data[pos + 5 : pos + 5 + size])
                pos += 5 + size
                if compressed:
                    message = self._inflate(s, compressed, message)
            except RpcError as exc:
                # The bytes of this frame from the bad message on were never credited (those in buf were).
                self._partial += len(s.buf) - had
                self._call_error(s, exc.code, exc.message, events)
                self._give_back(None, end - max(start, had))
                return
            # Until the app takes it, the whole message counts, inflated if larger: a message bigger than
            # the window was credited while it arrived, but must still hold back the next ones.
            cost = max(5 + size, len(message))
            s.held += cost
            s.excess += cost - (5 + size - prepaid)
            prepaid = 0
            self._buffered += cost
            if cost > 5 + size and self._budget is not None:
                self._settle_budget()
            events.append(MessageReceived(s.id, message, cost))
        rest = end - pos
        if data is body:
            if rest:
                s.buf = bytearray(body[pos:])
        else:
            del s.buf[:pos]
        self._partial += len(s.buf) - had
        if rest > prepaid:
            # The unfinished message's bytes are credited as they come: a message may be larger than a window.
            self._give_back(s, rest - prepaid)
        s.prepaid = rest

    def _inflate(self, s: _Stream, flag: int, message: bytes) -> bytes:
        """The message a compressed one stands for; RpcError if it cannot be had."""
        if flag != 1 or not s.gzip:
            why = "compressed flag set without grpc-encoding" if flag == 1 else f"invalid compressed flag {flag}"
            raise RpcError(StatusCode.INTERNAL, why)
        limit = self.limits.max_message_bytes
        # The windows count compressed bytes: a window of small gzip messages could stand for gigabytes.
        room = self.limits.max_buffered_bytes - self._buffered - self._partial
        if self._budget is not None:  # the inflated bytes count beyond what the window covered
            room = min(room, len(message) + max(0, self._budget.room))
        inflater = zlib.decompressobj(wbits=31)
        try:
            out = inflater.decompress(message, max(0, min(limit, room)) + 1)  # max_length 0 would mean all
        except zlib.error as exc:
            raise RpcError(StatusCode.INTERNAL, f"cannot decompress gzip message: {exc}") from exc
        if len(out) > limit:
            raise RpcError(StatusCode.RESOURCE_EXHAUSTED, f"decompressed message larger than max ({limit})")
        if len(out) > room:
            raise RpcError(StatusCode.RESOURCE_EXHAUSTED, "too many request messages not yet read on this connection")
        return out

    def _window_update(self, sid: int, payload: bytes, events: list[Any]) -> None:
        if len(payload) != 4:
            raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE must be 4 bytes")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if increment == 0:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > wire.MAX_WINDOW:
                raise _ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "connection window above 2^31-1")
            if self._dirty_waiting():
                events.append(WindowOpened())
            return
        s = self._streams.get(sid)
        if s is None:
            self._closed_or_idle(sid, "WINDOW_UPDATE")
            return
        if increment == 0:
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR, events)
            return
        s.send_window += increment
        if s.send_window > wire.MAX_WINDOW:
            self._stream_error(sid, ErrorCode.FLOW_CONTROL_ERROR, events)
            return
        if s.outbuf or s.ending:
            self._dirty[sid] = None
            events.append(WindowOpened())

    def _dirty_waiting(self) -> bool:
        """Streams the windows held back may send again; True if there were any."""
        if not self._blocked:
            return False
        self._dirty.update(self._blocked)
        self._blocked.clear()
        return True

    def _ping(self, flags: int, sid: int, payload: bytes, events: list[Any]) -> None:
        if sid != 0:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "PING must be 8 bytes")
        if flags & ACK:
            events.append(PingAcked(payload))
            return
        # Clients ping to measure bandwidth after our data, or now and then to keep the connection alive;
        # a ping sooner than ping_min_interval after the last, with nothing from us in between, is a strike.
        if self._last_ping is not None and self._now - self._last_ping < self.limits.ping_min_interval:
            self._ping_strikes += 1
        self._last_ping = self._now
        if self._ping_strikes > self.limits.max_ping_strikes:
            raise _ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "too many pings")
        self._acks += wire.frame(FrameType.PING, ACK, 0, payload)

    def _settings(self, flags: int, sid: int, payload: bytes, events: list[Any]) -> None:
        if sid != 0:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS length is not a multiple of 6")
        if not self._settings_bucket.take(self._now):
            raise _ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "too many SETTINGS frames")
        opened = False
        for pos in range(0, len(payload), 6):
            key, value = wire.SETTING.unpack_from(payload, pos)
            if key == Setting.INITIAL_WINDOW_SIZE:
                if value > wire.MAX_WINDOW:
                    raise _ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
                delta = value - self._peer_window
                self._peer_window = value
                for s in self._streams.values():
                    s.send_window += delta
                    if s.send_window > wire.MAX_WINDOW:
                        raise _ConnectionError(ErrorCode.FLOW_CONTROL_ERROR, "a stream window above 2^31-1")
                opened = opened or delta > 0
            elif key == Setting.MAX_FRAME_SIZE:
                if not wire.DEFAULT_MAX_FRAME <= value <= wire.MAX_FRAME_LIMIT:
                    raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"SETTINGS_MAX_FRAME_SIZE {value} out of range")
                self._peer_max_frame = value
            elif key == Setting.MAX_CONCURRENT_STREAMS:
                self._peer_max_streams = value
            elif key == Setting.ENABLE_PUSH and value > 1:
                raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH {value}")
            # HEADER_TABLE_SIZE: we never index; the others bound what the peer receives, which we respect.
        self._out += wire.frame(FrameType.SETTINGS, ACK, 0)
        if opened and self._dirty_waiting():
            events.append(WindowOpened())

    def _rst_stream(self, sid: int, payload: bytes, events: list[Any]) -> None:
        if len(payload) != 4:
            raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM must be 4 bytes")
        self._closed_or_idle(sid, "RST_STREAM")
        if not self._reset_bucket.take(self._now):
            raise _ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "too many stream resets")
        s = self._streams.pop(sid, None)
        if s is not None:
            self._forget(s)
            events.append(StreamReset(sid, _U32.unpack(payload)[0], by_peer=True))

    def _goaway(self, sid: int, payload: bytes, events: list[Any]) -> None:
        if sid != 0:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
        last, code = struct.unpack_from(">LL", payload)
        debug = payload[8:].decode("utf-8", "replace")
        events.append(ConnectionTerminated(code, debug, by_peer=True, last_stream_id=last & 0x7FFFFFFF))

    # -- requests -------------------------------------------------------------------

    def _headers(self, flags: int, sid: int, payload: bytes, events: list[Any]) -> None:
        if sid == 0:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        block, _ = self._unpad(flags, payload, "HEADERS")
        if flags & PRIORITY_FLAG:
            if len(block) < 5:
                raise _ConnectionError(ErrorCode.FRAME_SIZE_ERROR, "HEADERS priority fields missing")
            block = block[5:]
        if flags & END_HEADERS:
            self._header_block(sid, flags, bytes(block), events)
        else:
            self._continuation = (sid, flags, bytearray(block))
            self._check_block_size(len(block))

    def _check_block_size(self, size: int) -> None:
        if size > self.limits.max_header_block_bytes:
            raise _ConnectionError(
                ErrorCode.ENHANCE_YOUR_CALM,
                f"header block over {self.limits.max_header_block_bytes} bytes",
            )

    def _continue(self, flags: int, sid: int, payload: bytes, events: list[Any]) -> None:
        if self._continuation is None or self._continuation[0] != sid:
            raise _ConnectionError(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without a header block to continue")
        first_flags, block = self._continuation[1], self._continuation[2]
        block += payload
        self._check_block_size(len(block))
        if not payload and not flags & END_HEADERS:
            self._junk("empty CONTINUATION frames")
        if flags & END_HEADERS:
            self._continuation = None
            self._header_block(sid, first_flags, bytes(block), events)

    def _header_block(self, sid: int, flags: int, block: bytes, events: list[Any]) -> None:
        try:
            headers = self._decoder.decode(block, raw=True)
        except hpack.exceptions.OversizedHeaderListError as exc:
            raise _ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, f"headers too large: {exc}") from exc
        except hpack.exceptions.HPACKError as exc:
            # hpack may put the repr of its input buffer in the message: the bytes are the peer's, the address ours.
            why = _MEMORY_REPR.sub("", str(exc)).rstrip(": ")
            raise _ConnectionError(ErrorCode.COMPRESSION_ERROR, f"cannot decode headers: {why}") from exc
        self._on_headers(sid, flags, headers, events)

    # -- output ----------------------------------------------------------------------

    def send_message(self, stream_id: int, message: bytes) -> bool:
        """Queue one message; False if our half of the call is over (reset, or ended)."""
        s = self._streams.get(stream_id)
        if s is None or s.local_closed:
            return False
        out = s.outbuf
        out += PREFIX.pack(0, len(message))
        out += message
        self._dirty[stream_id] = None
        return True

    def send_messages(self, stream_id: int, messages: list[bytes]) -> bool:
        """Queue encoded messages; False if our half of the call is over."""
        s = self._streams.get(stream_id)
        if s is None or s.local_closed:
            return False
        out = s.outbuf
        pack = PREFIX.pack
        for message in messages:
            out += pack(0, len(message))
            out += message
        self._dirty[stream_id] = None
        return True

    def reset_stream(self, stream_id: int, code: int = ErrorCode.CANCEL) -> None:
        """Abandon a call (a server's handler crashed past sending trailers; a client cancels)."""
        s = self._streams.pop(stream_id, None)
        if s is not None:
            self._forget(s)
            self._out += wire.rst_stream(stream_id, code)

    def consumed(self, stream_id: int, size: int) -> None:
        """The app took a message of ``size`` bytes (its event's): the peer may send more."""
        self.consumptions += 1
        s = self._streams.get(stream_id)
        if s is None:
            return  # a stream that ended gave back what it held then
        s.held -= size
        self._buffered -= size
        repaid = min(size, s.excess)
        s.excess -= repaid
        self._give_back(s, size - repaid)

    def ping(self, data: bytes = b"\0" * 8) -> None:
        self._out += wire.frame(FrameType.PING, 0, 0, data)

    def close(self, code: int = ErrorCode.NO_ERROR, reason: str = "") -> None:
        """Say GOAWAY: calls begun so far may finish; later ones are refused."""
        if not self._goaway_sent and not self.closed:
            self._goaway_sent = True
            self._goaway_last = self._peer_last_stream()
            self._out += wire.goaway(self._goaway_last, code, reason.encode())

    @property
    def has_urgent_output(self) -> bool:
        """Output other than PING ACKs is waiting.

        A client pings after each DATA frame it receives (gRPC's bandwidth estimate); writing the
        ACK alone costs a send and a wakeup at both ends per call, so a shell may hold ACKs briefly
        for the next write. They go first in it: RFC 9113 asks that they be sent before other frames.
        """
        return bool(self._out or self._dirty)

    @property
    def has_output(self) -> bool:
        return bool(self._acks or self._out or self._dirty)

    def data_to_send(self, hold_acks: bool = False) -> bytes:
        """Everything to write now, framed as far as the windows allow; with ``hold_acks``, nothing
        if PING ACKs are all there is."""
        if hold_acks and not self.has_urgent_output:
            return b""
        if self._dirty:
            for sid in list(self._dirty):
                s = self._streams.get(sid)
                if s is not None:
                    self._frame_stream(s)  # a stream the windows hold back waits in _blocked, not here
            self._dirty.clear()
        if self._acks:
            out = bytes(self._acks + self._out)
            self._acks.clear()
        elif self._out:
            out = bytes(self._out)
        else:
            return b""
        self._out.clear()
        return out

    def _frame_stream(self, s: _Stream) -> bool:
        """Frame what the windows allow; True when the stream has nothing left to send."""
        out = self._out
        if not s.headers_sent and self._write_first_headers(s):
            return True
        pending = s.outbuf
        if pending:
            sent = 0
            total = len(pending)
            view = memoryview(pending)
            max_frame = self._peer_max_frame
            while sent < total:
                room = min(s.send_window, self._send_window, max_frame, total - sent)
                if room <= 0:
                    break
                out += wire.frame_header(FrameType.DATA, 0, s.id, room)
                out += view[sent : sent + room]
                sent += room
                s.send_window -= room
                self._send_window -= room
            view.release()
            del pending[:sent]
            if sent:
                self._ping_strikes = 0  # data the windows hold back does not excuse the peer's pings
            if pending:
                self._blocked[s.id] = None
                return False
        if s.ending:
            s.ending = False
            self._write_end(s)
            self._reap(s)
        return True

    def _write_headers(self, sid: int, block: bytes, flags: int) -> None:
        self._ping_strikes = 0
        out = self._out
        max_frame = self._peer_max_frame
        first = block[:max_frame]
        out += wire.frame(FrameType.HEADERS, flags | (END_HEADERS if len(block) <= max_frame else 0), sid, first)
        for pos in range(max_frame, len(block), max_frame):
            last = pos + max_frame >= len(block)
            out += wire.frame(FrameType.CONTINUATION, END_HEADERS if last else 0, sid, block[pos : pos + max_frame])

    # -- bookkeeping# -- bookkeeping -------------------------------------------------------------------

    def _give_back(self, s: _Stream | None, size: int) -> None:
        """Credit ``size`` received bytes; send WINDOW_UPDATEs once a quarter window has built up."""
        self._credit += size
        if self._budget is not None:
            self._settle_budget()
        if self._credit >= self._window // 4 and self._buffered + self._partial < self.limits.max_buffered_bytes:
            if self._recv_window < self._window // 4 and self._window < self.limits.connection_window:
                # The peer used most of its window before we could give any back: let it have twice as much.
                grow = min(self._window, self.limits.connection_window - self._window)
                self._window += grow
                self._credit += grow
            self._grant_connection_credit()
        if s is not None and not s.remote_closed and s.id in self._streams:
            s.credit += size
            if s.credit >= self.limits.stream_window // 4 and s.held < self.limits.stream_window:
                self._out += wire.window_update(s.id, s.credit)
                s.recv_window += s.credit
                s.credit = 0

    def _footprint(self) -> int:
        return self._recv_window + self._buffered + self._partial

    def _settle_budget(self) -> None:
        """Charge the budget what this connection holds or has open beyond its floor, no more, no less.

        Mostly a return (bytes taken by the app, streams gone); a charge only for inflated messages,
        which hold more than the window let in (``_inflate`` kept them within the budget's room).
        """
        budget = self._budget
        assert budget is not None
        need = max(0, self._footprint() - budget.floor)
        budget.used += need - self._charged
        self._charged = need

    def _grant_connection_credit(self) -> None:
        """Send the connection's credit as a WINDOW_UPDATE, as far as the budget covers it."""
        grant = self._credit
        budget = self._budget
        if budget is not None:
            floor_left = max(0, budget.floor - self._footprint())
            covered = floor_left + max(0, budget.room)
            if covered < grant:
                budget.withheld += 1
                budget.waiting[self] = None
                # Part of it if that is worth a frame (a peer at a standstill may finish a message with it),
                # and always what is left of the connection's own floor.
                if not floor_left and covered < min(grant, self.limits.connection_window // 16):
                    return
                grant = covered
                if grant <= 0:
                    return  # a WINDOW_UPDATE of 0 is a protocol error
            else:
                budget.waiting.pop(self, None)
            charge = max(0, self._footprint() + grant - budget.floor) - self._charged
            if charge > 0:
                budget.used += charge
                self._charged += charge
        self._out += wire.window_update(0, grant)
        self._recv_window += grant
        self._credit -= grant

    def grant_withheld(self) -> bool:
        """Try again to send credit held back for want of budget; True if a window update is now queued."""
        if self._budget is None or self.closed or not self._credit:
            if self._budget is not None:
                self._budget.waiting.pop(self, None)
            return False
        before = self._credit
        if self._buffered + self._partial < self.limits.max_buffered_bytes:
            self._grant_connection_credit()
        return self._credit < before

    def release_budget(self) -> None:
        """The connection is gone: everything it held or had granted goes back to the budget, and its buffers
        are dropped now (the shell's objects and this core form cycles that only a collection would free)."""
        budget = self._budget
        if budget is not None:
            budget.used -= self._charged
            self._charged = 0
            budget.waiting.pop(self, None)
        for s in self._streams.values():
            s.buf = bytearray()
            s.outbuf = bytearray()
        self._in = bytearray()
        self._partial = self._buffered = 0
        self.closed = True

    @property
    def budget_charged(self) -> int:
        """Bytes of the server's buffer budget this connection holds or has granted."""
        return self._charged

    def _police_reset(self) -> None:
        """A stream this end resets for the peer's error costs what a reset it sends does: a peer that makes
        us reset streams ("MadeYouReset", CVE-2025-8671) is stopped like one that resets them itself."""
        self.resets_sent += 1
        if not self._reset_bucket.take(self._now):
            raise _ConnectionError(ErrorCode.ENHANCE_YOUR_CALM, "too many streams reset for the peer's errors")

    def _stream_error(self, sid: int, code: ErrorCode, events: list[Any]) -> None:
        self._police_reset()
        self._out += wire.rst_stream(sid, code)
        s = self._streams.pop(sid, None)
        if s is not None:
            self._forget(s)
            events.append(StreamReset(sid, code, by_peer=False))

    def _forget(self, s: _Stream) -> None:
        """A stream is gone: what it held no longer counts, and the connection gets its credit back."""
        self._buffered -= s.held
        self._partial -= len(s.buf)
        self._dirty.pop(s.id, None)
        self._blocked.pop(s.id, None)
        held, s.held = s.held - s.excess, 0
        s.excess = 0
        s.buf.clear()
        self._give_back(None, held)  # even 0: credit withheld while the connection held too much may go out now

    def _fail(self, code: ErrorCode, reason: str, events: list[Any]) -> None:
        last = self._goaway_last if self._goaway_sent else self._peer_last_stream()  # refused since: still refused
        self._out += wire.goaway(last, code, reason.encode())
        self.closed = True
        events.append(ConnectionTerminated(code, reason, by_peer=False, last_stream_id=last))
