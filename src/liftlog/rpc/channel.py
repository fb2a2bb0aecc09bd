"""The asyncio shell around :class:`ClientConnection`: a gRPC channel to one server.

A :class:`Channel` keeps one HTTP/2 connection to its target, opened on the
first call and again after it is lost or the server said GOAWAY. Its method
objects look like grpc.aio's, so code written for those reads the same::

    fetch = channel.unary_unary("/proto.API/FetchMetadata", Request.SerializeToString, Response.FromString)
    response = await fetch(request, timeout=5)            # unary
    call = channel.unary_stream(...)(request)             # server streaming
    message = await call.read()                           # EOF once the call ended OK
    call = channel.stream_stream(...)()                   # bidirectional
    await call.write(request); await call.done_writing()

A call that ends with a status other than OK raises :class:`RpcError` (from
``read``, or from awaiting a unary call). ``call.cancel()`` ends a call;
reads then raise ``asyncio.CancelledError``, as grpc.aio's do. Failures of
the connection are UNAVAILABLE, a deadline is DEADLINE_EXCEEDED; so is a
server that stops answering while calls run (a PING after ``keepalive_time``
of silence, unanswered for ``keepalive_timeout``). Writes wait
while the server's windows or the socket are behind; a response message
counts against our window until it is read. Channels and calls belong to
the event loop they were first used on.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from .client_connection import (
    CallEnded,
    ClientConnection,
    ClientEvent,
    ConnectionTerminated,
    MessageReceived,
    StreamReset,
    WindowOpened,
    client_limits,
)
from .shell import CoreProtocol
from .status import Metadata, RpcError, StatusCode, TlsFailure
from .wire import ErrorCode

__all__ = ["EOF", "Channel", "StreamCall"]

#: What ``read()`` returns once the call ended with OK.
EOF: Final = object()
#: Queued request bytes per call above which ``write`` waits.
WRITE_HIGH_WATER: Final = 256 << 10
_RESET_STATUS: Final[dict[int, tuple[StatusCode, str]]] = {
    ErrorCode.REFUSED_STREAM: (StatusCode.UNAVAILABLE, "the server refused the call (REFUSED_STREAM)"),
    ErrorCode.CANCEL: (StatusCode.CANCELLED, "the server cancelled the call"),
    ErrorCode.ENHANCE_YOUR_CALM: (StatusCode.RESOURCE_EXHAUSTED, "the server reset the call (ENHANCE_YOUR_CALM)"),
    ErrorCode.INADEQUATE_SECURITY: (StatusCode.PERMISSION_DENIED, "the server reset the call (INADEQUATE_SECURITY)"),
}

Serializer = Callable[[Any], bytes]
Deserializer = Callable[[bytes], Any]


class StreamCall:
    """One call's state on the shell side: response messages in, status when it ends, writes out."""

    __slots__ = (
        "_cancelled",
        "_conn",
        "_deserialize",
        "_items",
        "_opening",
        "_serialize",
        "_status",
        "_timer",
        "_waiter",
        "id",
    )

    def __init__(self, serialize: Serializer, deserialize: Deserializer) -> None:
        self._serialize = serialize
        self._deserialize = deserialize
        self._conn: _Connection | None = None
        self.id = 0
        self._items: deque[tuple[bytes, int]] = deque()
        self._status: RpcError | None = None  # set when the call is over; OK too
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._opening: asyncio.Task[None] | None = None
        self._cancelled = False

    # -- what the connection tells the call ------------------------------------------

    def feed(self, data: bytes, size: int) -> None:
        self._items.append((data, size))
        self._wake()

    def finish(self, code: int, message: str, metadata: Metadata = ()) -> None:
        if self._status is not None:
            return
        self._status = RpcError(StatusCode(code) if code in _CODES else StatusCode.UNKNOWN, message, metadata)
        if self._timer is not None:
            self._timer.cancel()
        conn = self._conn
        if conn is not None:
            conn.calls.pop(self.id, None)
            conn.call_ended()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- grpc.aio's call interface ----------------------------------------------------

    def done(self) -> bool:
        return self._status is not None

    def cancel(self) -> bool:
        """End the call here (reads then raise ``CancelledError``); False if it was already over."""
        if self._status is not None:
            return False
        self._cancelled = True
        self._items.clear()  # grpc.aio's reads raise CancelledError from now on, whatever arrived before
        self._abandon(StatusCode.CANCELLED, "Locally cancelled by application!")
        return True

    def _expire(self) -> None:
        conn = self._conn
        why = "Deadline Exceeded"
        if conn is None or not conn.core.handshake_done:
            why += " (the server has not answered the HTTP/2 handshake)" if conn else " (while connecting)"
        self._abandon(StatusCode.DEADLINE_EXCEEDED, why)

    def _abandon(self, code: StatusCode, message: str) -> None:
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        conn = self._conn
        if conn is not None and self.id:
            conn.core.cancel(self.id)
            conn.want_flush()
        self.finish(code, message)

    async def read(self) -> Any:
        """The next response message; EOF once the call ended with OK. Raises RpcError otherwise."""
        if self._opening is not None:
            await self._opened()
        items = self._items
        while not items:
            if self._cancelled:
                raise asyncio.CancelledError
            status = self._status
            if status is not None:
                if status.code == StatusCode.OK:
                    return EOF
                raise status
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        data, size = items.popleft()
        conn = self._conn
        if conn is not None:
            conn.consumed(self.id, size)
        return self._deserialize(data)

    async def write(self, request: object) -> None:
        """Send one request message; ``asyncio.InvalidStateError`` if the call has ended."""
        if self._opening is not None:
            await self._opened()
        conn = self._conn
        if self._status is not None or conn is None or not conn.core.send_message(self.id, self._serialize(request)):
            raise asyncio.InvalidStateError("the call has ended")
        conn.want_flush()
        core = conn.core
        if core.buffered(self.id) > WRITE_HIGH_WATER or conn.paused:
            conn.flush()
            while self._status is None and (core.buffered(self.id) > WRITE_HIGH_WATER or conn.paused):
                await conn.writable()

    async def done_writing(self) -> None:
        """No more requests."""
        if self._opening is not None:
            await self._opened()
        conn = self._conn
        if conn is not None and self._status is None:
            conn.core.end_request(self.id)
            conn.want_flush()

    async def _opened(self) -> None:
        opening = self._opening
        assert opening is not None
        try:
            await asyncio.shield(opening)
        except asyncio.CancelledError:
            if opening.cancelled():  # cancel() before the call started: finish() said so
                return
            raise
        finally:
            if opening.done():
                self._opening = None


_CODES: Final = frozenset(int(c) for c in StatusCode)


class _Connection(CoreProtocol):
    core: ClientConnection

    def __init__(self, channel: Channel) -> None:
        super().__init__(ClientConnection(channel.authority, limits=channel.limits, tls=channel.ssl is not None))
        self.channel = channel
        self.calls: dict[int, StreamCall] = {}
        self.lost = False
        self._room: list[asyncio.Future[None]] = []  # calls waiting for the server's stream limit
        self.failure: RpcError | None = None  # why the connection broke, when it did
        self._last_read = self._loop.time()
        self._heard = False  # anything from the server yet
        self._ping_sent: float | None = None
        self._keepalive: asyncio.TimerHandle | None = None

    @property
    def usable(self) -> bool:
        return not self.lost and self.core.accepting

    # -- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._schedule_keepalive()

    def data_received(self, data: bytes) -> None:
        self._last_read = now = self._loop.time()
        self._heard = True
        self._ping_sent = None  # anything from the server shows it is there
        events = self.core.receive(data, now)
        if events:
            self._handle(events)
        self.flush()
        if self.core.closed:
            self.close_transport()

    def eof_received(self) -> bool | None:
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._keepalive is not None:
            self._keepalive.cancel()
        self.transport = None
        self.paused = False
        why = f"the connection to {self.channel.target} was lost" + (f": {exc}" if exc else "")
        if not self._heard:
            why += _SILENT_CLOSE_HINT[self.channel.ssl is not None]
        if self.failure is None:
            self.failure = RpcError(StatusCode.UNAVAILABLE, why)
        for call in list(self.calls.values()):
            call.finish(StatusCode.UNAVAILABLE, why)
        self.calls.clear()
        self.wake_writers()
        self.wake(self._room)
        self.channel.connection_lost(self)

    def _handle(self, events: list[ClientEvent]) -> None:
        calls = self.calls
        for event in events:
            kind = type(event)
            if kind is MessageReceived:
                call = calls.get(event.stream_id)  # type: ignore[union-attr]
                if call is not None:
                    call.feed(event.data, event.size)  # type: ignore[union-attr]
                else:
                    self.core.consumed(event.stream_id, event.size)  # type: ignore[union-attr]
            elif kind is CallEnded:
                assert isinstance(event, CallEnded)
                call = calls.get(event.stream_id)
                if call is not None:
                    call.finish(event.code, event.message, event.metadata)
            elif kind is WindowOpened:
                self.want_flush()
            elif kind is StreamReset:
                assert isinstance(event, StreamReset)
                call = calls.get(event.stream_id)
                if call is not None:
                    if event.by_peer:
                        code, why = _RESET_STATUS.get(
                            event.code, (StatusCode.INTERNAL, f"the server reset the call (HTTP/2 error {event.code})")
                        )
                    else:
                        code, why = StatusCode.INTERNAL, f"the server broke HTTP/2's rules (error {event.code})"
                    call.finish(code, why)
            elif kind is ConnectionTerminated:
                assert isinstance(event, ConnectionTerminated)
                self._terminated(event)

    def _terminated(self, event: ConnectionTerminated) -> None:
        if event.by_peer:
            # Calls above the last stream the server took never ran: safe to send again.
            for sid, call in list(self.calls.items()):
                if sid > event.last_stream_id:
                    call.finish(StatusCode.UNAVAILABLE, f"the server is going away ({event.reason or 'GOAWAY'})")
            if not self.calls:
                self.flush()
                self.close_transport()
        else:
            if self.core.handshake_done:
                code, why = StatusCode.INTERNAL, f"the connection to {self.channel.target} broke: {event.reason}"
            else:  # not a gRPC server at all (an HTTP/1 server, NATS, TLS when we speak plain text)
                code, why = StatusCode.UNAVAILABLE, f"{self.channel.target} is not a gRPC server: {event.reason}"
            self.failure = RpcError(code, why)
            for call in list(self.calls.values()):
                call.finish(code, why)
        self.wake(self._room)

    # -- keepalive --------------------------------------------------------------------------

    def _schedule_keepalive(self) -> None:
        channel = self.channel
        if channel.keepalive_time > 0:
            period = min(channel.keepalive_time, channel.keepalive_timeout) / 2
            self._keepalive = self._loop.call_later(period, self._check_alive)

    def _check_alive(self) -> None:
        """While calls run, ping a server that has been quiet; give up on one that does not answer.

        Without this a call to a server that vanished (a network partition, a frozen host) would wait
        for ever: nothing arrives, and nothing fails either.
        """
        if self.lost:
            return
        now = self._loop.time()
        channel = self.channel
        if self._ping_sent is not None and now - self._ping_sent >= channel.keepalive_timeout:
            why = (
                f"the server at {channel.target} stopped answering: no reply to a PING "
                f"in {channel.keepalive_timeout:g} s"
            )
            self.failure = RpcError(StatusCode.UNAVAILABLE, why)
            for call in list(self.calls.values()):
                call.finish(StatusCode.UNAVAILABLE, why)
            if self.transport is not None:
                self.transport.abort()  # nothing to flush to a server that does not read
            return
        if self._ping_sent is None and self.calls and now - self._last_read >= channel.keepalive_time:
            self._ping_sent = now
            self.core.ping()
            self.flush()
        self._schedule_keepalive()

    # -- calls ----------------------------------------------------------------------------

    async def start(self, call: StreamCall, path: str, metadata: Metadata, timeout: float | None) -> None:
        while not self.core.has_room and self.usable:
            waiter = self._loop.create_future()
            self._room.append(waiter)
            await waiter
        if not self.usable:
            raise self.failure or RpcError(
                StatusCode.UNAVAILABLE, f"the connection to {self.channel.target} is closing"
            )
        self.begin(call, path, metadata, timeout)

    def begin(self, call: StreamCall, path: str, metadata: Metadata, timeout: float | None) -> None:
        try:
            sid = self.core.start_call(path, metadata, timeout)
        except ValueError as exc:
            raise RpcError(StatusCode.INTERNAL, f"bad metadata: {exc}") from None
        call._conn = self
        call.id = sid
        self.calls[sid] = call
        self.want_flush()

    def call_ended(self) -> None:
        if self._room:
            self.wake(self._room)
        if not self.calls and not self.core.accepting:
            self.flush()
            self.close_transport()

    def close(self) -> None:
        for call in list(self.calls.values()):
            call.cancel()
        self.core.close()
        self.flush()
        self.close_transport()


class Channel:
    """Calls to one server over one HTTP/2 connection, opened when needed."""

    def __init__(
        self,
        target: str,
        *,
        max_message_bytes: int = 64 << 20,
        connect_timeout: float = 20.0,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        keepalive_time: float = 360.0,
        keepalive_timeout: float = 20.0,
    ) -> None:
        self.target = target
        #: With calls running and nothing heard for ``keepalive_time`` s, ping; no answer in ``keepalive_timeout``
        #: s fails the calls with UNAVAILABLE (0 turns this off). Not under 5 minutes by default: grpc-go
        #: servers (Liftbridge's) close a connection that pings more often than that with no data between.
        self.keepalive_time = keepalive_time
        self.keepalive_timeout = keepalive_timeout
        self.host, self.port = _split_target(target)
        self.authority = target
        self.limits = client_limits(max_message_bytes)
        self.connect_timeout = connect_timeout
        self.ssl = ssl_context
        self.server_hostname = server_hostname
        self._conn: _Connection | None = None
        self._connecting: asyncio.Task[_Connection] | None = None
        self._closed = False

    # -- method objects -----------------------------------------------------------------

    def unary_unary(
        self, path: str, request_serializer: Serializer, response_deserializer: Deserializer
    ) -> Callable[..., Any]:
        async def call(request: object, *, timeout: float | None = None, metadata: Metadata | None = None) -> Any:
            stream = StreamCall(request_serializer, response_deserializer)
            try:
                await self._start(stream, path, metadata or (), timeout)
                self._first_request(stream, request)
                response = await stream.read()
                if response is EOF:
                    raise RpcError(StatusCode.INTERNAL, f"{path}: the server ended the call without a response")
                if await stream.read() is not EOF:
                    raise RpcError(StatusCode.INTERNAL, f"{path}: the server sent more than one response")
                return response
            except BaseException:
                stream.cancel()
                raise

        return call

    def unary_stream(
        self, path: str, request_serializer: Serializer, response_deserializer: Deserializer
    ) -> Callable[..., StreamCall]:
        def call(request: object, *, timeout: float | None = None, metadata: Metadata | None = None) -> StreamCall:
            stream = StreamCall(request_serializer, response_deserializer)
            self._open(stream, path, metadata or (), timeout, request)
            return stream

        return call

    def stream_stream(
        self, path: str, request_serializer: Serializer, response_deserializer: Deserializer
    ) -> Callable[..., StreamCall]:
        def call(*, timeout: float | None = None, metadata: Metadata | None = None) -> StreamCall:
            stream = StreamCall(request_serializer, response_deserializer)
            self._open(stream, path, metadata or (), timeout, None)
            return stream

        return call

    # -- calls ------------------------------------------------------------------------

    def _open(self, stream: StreamCall, path: str, metadata: Metadata, timeout: float | None, request: object) -> None:
        """Start `stream` now if a connection is ready, else in a task its first read or write waits for."""
        if timeout is not None:
            stream._timer = asyncio.get_running_loop().call_later(timeout, stream._expire)
        conn = self._conn
        if conn is not None and conn.usable and conn.core.has_room and not self._closed:
            try:
                conn.begin(stream, path, metadata, timeout)
            except RpcError as exc:
                stream.finish(exc.code, exc.message)
                return
            self._first_request(stream, request)
            return

        async def opening() -> None:
            try:
                await self._start(stream, path, metadata, None if timeout is None else _remaining(stream, timeout))
            except RpcError as exc:
                stream.finish(exc.code, exc.message, exc.trailing_metadata)
                return
            except asyncio.CancelledError:
                if stream._status is None:  # the channel closed under it (cancel() finishes the call itself)
                    stream._cancelled = True
                    stream.finish(StatusCode.CANCELLED, f"the channel to {self.target} was closed")
                raise
            except BaseException as exc:
                stream.finish(StatusCode.INTERNAL, f"starting the call failed: {exc!r}")
                raise
            self._first_request(stream, request)

        stream._opening = asyncio.get_running_loop().create_task(opening())

    @staticmethod
    def _first_request(stream: StreamCall, request: object) -> None:
        if request is None:
            return
        conn = stream._conn
        assert conn is not None
        conn.core.send_message(stream.id, stream._serialize(request))
        conn.core.end_request(stream.id)
        conn.want_flush()

    async def _start(self, stream: StreamCall, path: str, metadata: Metadata, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        if timeout is not None and stream._timer is None:
            stream._timer = loop.call_at(deadline, stream._expire)  # type: ignore[arg-type]
        for attempt in range(2):
            conn = await self._connection(deadline)
            try:
                await conn.start(stream, path, metadata, None if deadline is None else max(0.0, deadline - loop.time()))
                return
            except RpcError:
                if attempt or conn.failure is not None or conn.usable:
                    raise
                # The server said GOAWAY while we waited for room on its connection: once more, on a new one.

    async def _connection(self, deadline: float | None) -> _Connection:
        if self._closed:
            raise RpcError(StatusCode.UNAVAILABLE, f"the channel to {self.target} is closed")
        conn = self._conn
        if conn is not None and conn.usable:
            return conn
        if self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._connect())
        connecting = self._connecting
        try:
            if deadline is None:
                return await asyncio.shield(connecting)
            async with asyncio.timeout_at(deadline):
                return await asyncio.shield(connecting)
        except TimeoutError:
            raise RpcError(
                StatusCode.DEADLINE_EXCEEDED, f"Deadline Exceeded while connecting to {self.target}"
            ) from None
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, protocol = await loop.create_connection(
                    lambda: _Connection(self),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.server_hostname if self.ssl is not None else None,
                )
        except TimeoutError:
            raise RpcError(
                StatusCode.UNAVAILABLE, f"cannot connect to {self.target}: no answer in {self.connect_timeout:g} s"
            ) from None
        except ssl.SSLError as exc:
            raise _tls_failure(self.target, exc, self.server_hostname or self.host) from None
        except OSError as exc:
            raise RpcError(StatusCode.UNAVAILABLE, f"cannot connect to {self.target}: {exc}") from None
        if self._closed:
            protocol.close()
            raise RpcError(StatusCode.UNAVAILABLE, f"the channel to {self.target} is closed")
        if protocol.failure is not None:  # it broke at once (not a gRPC server)
            raise protocol.failure
        self._conn = protocol
        return protocol

    def connection_lost(self, conn: _Connection) -> None:
        if self._conn is conn:
            self._conn = None

    async def close(self, grace: float | None = None) -> None:
        """Cancel the calls still running and close the connection."""
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


#: Why a server may close a new connection without a word: it is our TLS set-up it did not like.
_SILENT_CLOSE_HINT: Final = {
    False: " before the server said anything (if it serves TLS, connect with TLS: a CA, --tls-ca)",
    True: (
        " before the server said anything (if it requires client certificates, give one: a certificate "
        "and key signed by the CA it trusts, --tls-cert and --tls-key)"
    ),
}


def _tls_failure(target: str, exc: ssl.SSLError, name: str) -> TlsFailure:
    """What failed in a TLS handshake, in words that say what to change."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        detail = exc.verify_message or exc.reason or str(exc)
        if exc.verify_code in (_X509_HOSTNAME_MISMATCH, _X509_IP_MISMATCH):
            return TlsFailure(
                f"TLS: the certificate of {target} is not valid for the name {name!r}; connect by a name it was "
                "issued for, or give that name as the server name (--tls-server-name)"
            )
        if exc.verify_code in (_X509_EXPIRED, _X509_NOT_YET_VALID):
            return TlsFailure(f"TLS: the certificate of {target} is not valid now: {detail}")
        return TlsFailure(
            f"TLS: the certificate of {target} is not trusted ({detail}); give the CA that signed it (--tls-ca)"
        )
    reason = exc.reason or str(exc)
    if reason in _NOT_TLS_REASONS:
        return TlsFailure(
            f"TLS: {target} does not speak TLS ({reason}); connect without TLS, or give the server a "
            "certificate (tls.cert and tls.key)"
        )
    if "CERTIFICATE_REQUIRED" in reason or "HANDSHAKE_FAILURE" in reason:
        return TlsFailure(
            f"TLS: {target} refused the connection ({reason}); it requires a client certificate signed by a "
            "CA it trusts (--tls-cert and --tls-key)"
        )
    return TlsFailure(f"TLS: cannot set up TLS with {target}: {exc}")


# OpenSSL's X509_V_ERR_* codes for the checks users get wrong.
_X509_NOT_YET_VALID: Final = 9
_X509_EXPIRED: Final = 10
_X509_HOSTNAME_MISMATCH: Final = 62
_X509_IP_MISMATCH: Final = 64
#: OpenSSL's reasons when the bytes that came back are not TLS at all.
_NOT_TLS_REASONS: Final = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"})


def _remaining(stream: StreamCall, timeout: float) -> float:
    timer = stream._timer
    if timer is None:
        return timeout
    return max(0.0, timer.when() - asyncio.get_running_loop().time())


def _split_target(target: str) -> tuple[str, int]:
    """``host:port`` or ``[v6 address]:port``."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"server address {target!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)
