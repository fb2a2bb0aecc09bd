"""The asyncio shell around :class:`ServerConnection`: sockets, handler tasks, timers.

One :class:`asyncio.Protocol` per client connection feeds the bytes it reads
to the connection core and writes what the core has to send, at most once per
loop turn (responses of many calls go out in one write). Each call runs its
handler in its own task with a :class:`ServerContext`, the subset of
``grpc.aio.ServicerContext`` liftlog's handlers use. Handlers are the methods
of a servicer object named as in the service's protobuf descriptor::

    async def Unary(self, request, context) -> Response
    async def ServerStream(self, request, context) -> AsyncIterator[Response]  # or context.write
    async def BidiStream(self, requests, context) -> None  # async-iterates requests, context.write

Backpressure: ``context.write`` returns at once while the call's queued output
is under a high-water mark and the socket takes data; otherwise it waits for
the client's window or socket to drain. A client that stops reading stops
being read from. What clients send is bounded server-wide by a
:class:`BufferBudget` (``max_buffered_bytes``): a connection gets no window
the budget cannot cover, waits until bytes come back, and one that holds
budget without progress while others wait is closed (ENHANCE_YOUR_CALM).
Call objects and contexts belong to the event loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sized
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NoReturn, Protocol, TypeVar

from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from .connection import BufferBudget
from .server_connection import (
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
from .shell import CoreProtocol
from .status import Metadata, RpcError, StatusCode
from .wire import ErrorCode

__all__ = ["Method", "RequestStream", "RpcServer", "ServerContext", "ServerOptions", "service_methods"]

log = logging.getLogger(__name__)

#: Queued output per call above which ``write`` waits (the windows or the socket are behind).
WRITE_HIGH_WATER = 256 << 10


@dataclass(frozen=True, slots=True)
class Method:
    path: str  # "/package.Service/Method"
    handler: Callable[..., Any]
    request_type: type[ProtoMessage]
    client_streaming: bool
    server_streaming: bool


def service_methods(service: ServiceDescriptor, servicer: object) -> list[Method]:
    """The servicer's handlers for every method of ``service``, as its descriptor defines them.

    A method the servicer lacks answers UNIMPLEMENTED.
    """
    methods = []
    for m in service.methods:
        methods.append(
            Method(
                path=f"/{service.full_name}/{m.name}",
                handler=getattr(servicer, m.name, None) or _unimplemented(f"{service.full_name}/{m.name}"),
                request_type=message_factory.GetMessageClass(m.input_type),
                client_streaming=m.client_streaming,
                server_streaming=m.server_streaming,
            )
        )
    return methods


def _unimplemented(name: str) -> Callable[[object, ServerContext], Awaitable[NoReturn]]:
    async def handler(request: object, context: ServerContext) -> NoReturn:
        raise RpcError(StatusCode.UNIMPLEMENTED, f"{name} is not implemented by this server")

    return handler


@dataclass(frozen=True, slots=True)
class ServerOptions:
    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    #: Ping a connection that sent nothing for this long; close it if the ping is not answered in time.
    keepalive_time: float = 60.0
    keepalive_timeout: float = 20.0
    #: Close (GOAWAY) a connection without calls for this long; 0: never.
    idle_timeout: float = 0.0
    #: Connections served at once; past it a new connection is closed at once (and counted). 0: no cap.
    max_connections: int = 0
    #: How long a PING ACK may wait to share a write with a call's response (seconds; 0: never waits).
    ping_ack_delay: float = 0.002
    #: Bytes all connections together may hold or have granted beyond 64 KiB each (0: no server-wide bound).
    max_buffered_bytes: int = 256 << 20
    #: While connections wait for budget, one holding budget without a message taken for this long is closed.
    stall_timeout: float = 5.0
    #: A client address whose connection was closed for abuse (ENHANCE_YOUR_CALM) has its new connections
    #: closed on arrival for this long, doubling with each repeat up to a minute (0: never).
    abuse_cooldown: float = 1.0


_libc: ctypes.CDLL | Literal[False] | None = None


def malloc_trim() -> None:
    """glibc's malloc_trim(0): freed heap pages back to the system; nothing where there is no glibc."""
    global _libc
    if _libc is False:
        return
    try:
        if _libc is None:
            _libc = ctypes.CDLL("libc.so.6")
        _libc.malloc_trim(0)
    except (OSError, AttributeError):
        _libc = False  # not glibc: never again


class _CallGone(Exception):
    """The call ended (reset, deadline, connection lost) while its handler was still writing."""


T = TypeVar("T")


class RequestStream(Protocol[T]):
    """What a client-streaming handler gets: the call's request messages, an async iterator of them.

    ``next_batch`` takes every request already received at once (see :class:`_Requests`); ``items``
    holds those received and not yet taken (only its size and truthiness are of use to handlers).
    """

    def __aiter__(self) -> RequestStream[T]: ...

    async def __anext__(self) -> T: ...

    async def next_batch(self, limit: int) -> list[T]: ...

    @property
    def items(self) -> Sized: ...


class _Requests:
    """A call's request messages as an async iterator; taking one gives its bytes back to the client's window."""

    __slots__ = ("_call", "ended", "items", "waiter")

    def __init__(self, call: _Call) -> None:
        self._call = call
        self.items: deque[tuple[bytes, int]] = deque()
        self.ended = False
        self.waiter: asyncio.Future[None] | None = None

    def feed(self, data: bytes, size: int) -> None:
        self.items.append((data, size))
        self._wake()

    def end(self) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> ProtoMessage:
        items = self.items
        while not items:
            if self.ended:
                raise StopAsyncIteration
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        data, size = items.popleft()
        call = self._call
        call.conn.consumed(call.stream_id, size)
        try:
            return call.method.request_type.FromString(data)
        except DecodeError as exc:
            raise RpcError(StatusCode.INTERNAL, f"cannot parse request message: {exc}") from exc

    async def next_batch(self, limit: int) -> list[ProtoMessage]:
        """Every request already received (at least one, at most ``limit``); [] once the client is done.

        A handler that takes what one read of the socket brought at once pays its per-call costs (awaits,
        lookups, a NATS publish) per batch instead of per message.
        """
        items = self.items
        while not items:
            if self.ended:
                return []
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        parse = self._call.method.request_type.FromString
        out: list[ProtoMessage] = []
        taken = 0
        try:
            while items and len(out) < limit:
                data, size = items[0]
                out.append(parse(data))
                items.popleft()
                taken += size
        except DecodeError as exc:
            if not out:
                raise RpcError(StatusCode.INTERNAL, f"cannot parse request message: {exc}") from exc
            # The ones before it are served; the next call raises for it.
        finally:
            call = self._call
            call.conn.consumed(call.stream_id, taken)
        return out


if TYPE_CHECKING:

    def _conforms(requests: _Requests) -> RequestStream[ProtoMessage]:
        return requests  # _Requests is what client-streaming handlers get as their RequestStream


class ServerContext:
    """What a handler knows of its call and may do to it (a subset of ``grpc.aio.ServicerContext``)."""

    __slots__ = ("_call", "_trailing")

    def __init__(self, call: _Call) -> None:
        self._call = call
        self._trailing: Metadata = ()

    async def abort(self, code: StatusCode, details: str = "", trailing_metadata: Metadata = ()) -> NoReturn:
        raise RpcError(StatusCode(int(code)), details, trailing_metadata)

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._call.metadata

    def peer(self) -> str:
        return self._call.conn.peer

    def peer_certificate(self) -> dict[str, object] | None:
        """The client's verified TLS certificate as ``ssl`` decodes it; None for plain text or none given."""
        return self._call.conn.peer_certificate

    def time_remaining(self) -> float | None:
        deadline = self._call.deadline
        if deadline is None:
            return None
        return max(0.0, deadline - asyncio.get_running_loop().time())

    def set_trailing_metadata(self, metadata: Metadata) -> None:
        self._trailing = tuple(metadata)

    def cancelled(self) -> bool:
        return self._call.gone

    def done(self) -> bool:
        return self._call.finished

    async def write(self, message: ProtoMessage | bytes | list[bytes]) -> None:
        """Send one response message (or its encoding, or several encoded ones at once) on a streaming call."""
        kind = type(message)
        await self._call.write(message if kind is bytes or kind is list else message.SerializeToString())  # type: ignore[arg-type, union-attr]


class _Call:
    __slots__ = (
        "conn",
        "context",
        "deadline",
        "expired",
        "finished",
        "gone",
        "metadata",
        "method",
        "requests",
        "stream_id",
        "task",
        "timer",
    )

    def __init__(self, conn: _Connection, stream_id: int, method: Method, event: RequestReceived) -> None:
        self.conn = conn
        self.stream_id = stream_id
        self.method = method
        self.metadata = event.metadata
        loop = asyncio.get_running_loop()
        self.deadline = None if event.timeout is None else loop.time() + event.timeout
        self.timer = None if event.timeout is None else loop.call_later(event.timeout, self.expire)
        self.expired = False
        self.gone = False  # reset by the client, or its connection lost
        self.finished = False
        self.requests = _Requests(self)
        self.context = ServerContext(self)
        self.task: asyncio.Task[None] | None = None

    def expire(self) -> None:
        self.expired = True
        if self.task is not None:
            self.task.cancel()

    def abandon(self) -> None:
        self.gone = True
        if self.task is not None:
            self.task.cancel()

    async def write(self, data: bytes | list[bytes]) -> None:
        """Queue one encoded message, or several; wait while the client or socket is behind."""
        conn = self.conn
        core = conn.core
        if self.gone:
            raise _CallGone
        if isinstance(data, list):
            sent = core.send_messages(self.stream_id, data)
        else:
            sent = core.send_message(self.stream_id, data)
        if not sent:
            raise _CallGone
        conn.want_flush()
        if conn.core.buffered(self.stream_id) > WRITE_HIGH_WATER or conn.paused:
            conn.flush()
            while not self.gone and (conn.core.buffered(self.stream_id) > WRITE_HIGH_WATER or conn.paused):
                await conn.writable()

    async def run(self) -> None:
        method = self.method
        code, message = StatusCode.OK, ""
        trailing: Metadata = ()
        try:
            if method.client_streaming:
                request: object = self.requests
            else:
                request = await self._one_request()
            result = method.handler(request, self.context)
            if method.server_streaming:
                if hasattr(result, "__anext__"):
                    async for response in result:
                        # A handler may yield messages, or encoded ones (bytes), or lists of encoded ones.
                        if type(response) is list or type(response) is bytes:
                            await self.write(response)
                        else:
                            await self.write(response.SerializeToString())
                else:
                    await result
            else:
                response = await result
                await self.write(response.SerializeToString())
            trailing = self.context._trailing
        except RpcError as exc:
            code, message, trailing = exc.code, exc.message, exc.trailing_metadata
            if self.expired:  # the handler turned the deadline's cancellation into an error of its own
                code, message, trailing = StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", ()
        except _CallGone:
            return
        except asyncio.CancelledError:
            if not self.expired:
                if self.gone:
                    return
                raise  # the server is stopping; stop() answers the call
            code, message = StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        except Exception as exc:
            log.exception("handler %s failed", method.path)
            code, message = StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}"
        finally:
            self.finished = True
            if self.timer is not None:
                self.timer.cancel()
        self.conn.finish(self, code, message, trailing)

    async def _one_request(self) -> ProtoMessage:
        requests = self.requests
        while not requests.ended:
            requests.waiter = asyncio.get_running_loop().create_future()
            await requests.waiter
        if len(requests.items) != 1:
            raise RpcError(StatusCode.INTERNAL, f"expected one request message, received {len(requests.items)}")
        return await anext(requests)


class _Server(Protocol):
    def admit(self, conn: _Connection, host: str) -> bool: ...

    def penalize(self, host: str) -> None: ...

    methods: dict[str, Method]
    options: ServerOptions
    budget: BufferBudget | None

    def connection_closed(self, conn: _Connection) -> None: ...

    def budget_returned(self) -> None: ...


class _Connection(CoreProtocol):
    core: ServerConnection

    def __init__(self, server: _Server) -> None:
        super().__init__(ServerConnection(server.options.limits, server.budget))
        self.server = server
        self._consumptions = 0
        self.last_progress = self._loop.time()  # a message taken by a handler (see tick)
        self.calls: dict[int, _Call] = {}
        self.peer = "unknown"
        self.peer_host = ""
        #: The client's verified certificate (``ssl.SSLObject.getpeercert()``), None without TLS or without one.
        self.peer_certificate: dict[str, object] | None = None
        self.last_read = self._loop.time()
        self.last_active = self.last_read
        self.ping_sent: float | None = None
        self.closing = False
        self.done: asyncio.Future[None] = self._loop.create_future()  # set when the connection is lost
        self._ack_timer: asyncio.TimerHandle | None = None  # flushes PING ACKs no response took along
        self._acks_due = False  # while that timer's flush runs: it takes them whatever else there is
        self._ack_delay = server.options.ping_ack_delay
        self._acks_held: float | None = None  # since when PING ACKs wait for a write

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            host, port = peer[0], peer[1]
            self.peer_host = host
            self.peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        if not self.server.admit(self, self.peer_host):
            self.closing = True
            transport.abort()  # type: ignore[attr-defined]  # not even the preface: it costs a socket, briefly
            return
        self.peer_certificate = transport.get_extra_info("peercert") or None
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return  # refused on arrival (max_connections), or gone
        now = self._loop.time()
        self.last_read = now
        events = self.core.receive(data, now)
        if events:
            self._handle(events)
        self.flush()
        if self.core.closed:
            self.close_transport()

    def eof_received(self) -> bool | None:
        return None  # close

    def pause_writing(self) -> None:
        super().pause_writing()
        if self.transport is not None:
            self.transport.pause_reading()  # a client that does not read is not read from

    def resume_writing(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
        super().resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.core.release_budget()
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        self._ack_timer = None
        self.paused = False
        for call in list(self.calls.values()):
            call.abandon()
        self.calls.clear()
        self.wake_writers()
        if not self.done.done():
            self.done.set_result(None)
        self.server.connection_closed(self)

    # -- events ------------------------------------------------------------------------

    def _handle(self, events: list[Event]) -> None:
        calls = self.calls
        for event in events:
            if type(event) is MessageReceived:
                call = calls.get(event.stream_id)
                if call is not None:
                    call.requests.feed(event.data, event.size)
                else:
                    self.core.consumed(event.stream_id, event.size)
            elif type(event) is RequestReceived:
                self._start(event)
            elif type(event) is RequestEnded:
                call = calls.get(event.stream_id)
                if call is not None:
                    call.requests.end()
            elif type(event) is WindowOpened:
                self.want_flush()
            elif type(event) is StreamReset:
                call = calls.pop(event.stream_id, None)
                if call is not None:
                    call.abandon()
            elif type(event) is PingAcked:
                self.ping_sent = None
            elif type(event) is ConnectionTerminated:
                if event.by_peer:
                    self.closing = True
                    self.core.close()
                    self._close_if_idle()
                else:
                    log.info("closing connection from %s: %s", self.peer, event.reason)
                    if event.code == ErrorCode.ENHANCE_YOUR_CALM:
                        self.server.penalize(self.peer_host)

    def _start(self, event: RequestReceived) -> None:
        method = self.server.methods.get(event.path)
        if method is None:
            self.core.send_trailers(event.stream_id, StatusCode.UNIMPLEMENTED, f"Method not found: {event.path}")
            return
        call = _Call(self, event.stream_id, method, event)
        self.calls[event.stream_id] = call
        self.last_active = self._loop.time()
        call.task = self._loop.create_task(call.run())

    def finish(self, call: _Call, code: StatusCode, message: str, trailing: Metadata) -> None:
        if self.calls.get(call.stream_id) is call:
            del self.calls[call.stream_id]
        try:
            sent = self.core.send_trailers(call.stream_id, code, message, trailing)
        except ValueError as exc:  # trailing metadata that HTTP/2 cannot carry
            log.error("handler %s: %s", call.method.path, exc)
            sent = self.core.send_trailers(call.stream_id, StatusCode.INTERNAL, f"bad trailing metadata: {exc}")
        if sent:
            self.want_flush()
        self.last_active = self._loop.time()
        if self.closing:
            self._close_if_idle()

    # -- output ------------------------------------------------------------------------

    def holds_acks(self) -> bool:
        # Only while a call runs: its response will soon be written, and the ACKs go with it.
        return self._ack_delay > 0 and bool(self.calls) and not self.closing and not self._acks_due

    def _flush_acks(self) -> None:
        held = self._acks_held
        if held is not None:
            wait = held + self._ack_delay - self._loop.time()
            if wait > 0:  # the ACKs this timer was set for left with a response; these came later
                self._ack_timer = self._loop.call_later(wait, self._flush_acks)
                return
        self._ack_timer = None
        self._acks_due = True
        self.flush()
        self._acks_due = False

    def flushed(self) -> None:
        if not self.core.has_output:
            self._acks_held = None
        elif self._acks_held is None:
            self._acks_held = self._loop.time()
            if self._ack_timer is None and not self._acks_due:
                self._ack_timer = self._loop.call_later(self._ack_delay, self._flush_acks)
        if self.closing and not self.calls and self.core.open_streams == 0:
            # A call's trailers leave the core only here: finish() came too early to close.
            self.close_transport()
        budget = self.server.budget
        # Only room enough for a useful grant wakes the waiting (below it they would all decline, one by one).
        if budget is not None and budget.waiting and budget.room >= self.core.limits.connection_window // 16:
            self.server.budget_returned()

    async def writable(self) -> None:
        if self.transport is None:
            raise _CallGone
        await super().writable()

    # -- ending ------------------------------------------------------------------------

    def go_away(self) -> None:
        """No new calls; the connection closes once its calls are done."""
        self.closing = True
        self.core.close()
        self.flush()
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if not self.calls and self.core.open_streams == 0:
            self.flush()
            self.close_transport()

    def abort(self) -> None:
        """Stop now: end the calls still running with UNAVAILABLE, then close."""
        for call in list(self.calls.values()):
            self.core.send_trailers(call.stream_id, StatusCode.UNAVAILABLE, "the server is shutting down")
            call.abandon()
        self.calls.clear()
        self.flush()
        self.close_transport()

    def tick(self, now: float) -> None:
        """Keepalive and idle policing, once a second."""
        options = self.server.options
        if self.core.consumptions != self._consumptions:
            self._consumptions = self.core.consumptions
            self.last_progress = now
        if self.ping_sent is not None:
            if now - self.ping_sent > options.keepalive_timeout:
                log.info("closing connection from %s: keepalive ping not answered", self.peer)
                self.core.close(ErrorCode.NO_ERROR, "keepalive timeout")
                self.flush()
                self.close_transport()
            return
        if options.keepalive_time and now - self.last_read > options.keepalive_time:
            self.ping_sent = now
            self.core.ping()
            self.flush()
        if options.idle_timeout and not self.calls and now - self.last_active > options.idle_timeout:
            self.go_away()

    def calm_down(self, reason: str) -> None:
        """Close at once with GOAWAY ENHANCE_YOUR_CALM: the client misuses what the server shares."""
        log.info("closing connection from %s: %s", self.peer, reason)
        self.server.penalize(self.peer_host)
        self.core.close(ErrorCode.ENHANCE_YOUR_CALM, reason)
        self.flush()
        self.core.release_budget()  # now, not when the socket is gone: others wait for it
        for call in list(self.calls.values()):
            call.abandon()
        self.calls.clear()
        self.close_transport()


class RpcServer:
    """Serves gRPC methods on one listening address; ``start`` binds, ``stop`` drains."""

    def __init__(self, methods: Iterable[Method], options: ServerOptions = ServerOptions()) -> None:
        self.methods = {m.path: m for m in methods}
        self.options = options
        self.port = 0
        self._sockets: list[socket.socket] = []
        self._servers: list[asyncio.Server] = []
        self._connections: set[_Connection] = set()
        self._ticker: asyncio.Task[None] | None = None
        #: Connections closed on arrival because ``max_connections`` were open (for metrics).
        self.refused_connections = 0
        #: Streams reset for their clients' errors on connections now closed (``resets_sent`` adds open ones).
        self._resets_sent_closed = 0
        #: What all connections may hold beyond their own 64 KiB (None: unbounded server-wide).
        self.budget = BufferBudget(options.max_buffered_bytes) if options.max_buffered_bytes else None
        self._by_core: dict[object, _Connection] = {}  # a waiting core's shell
        #: Connections closed for holding budget without progress while others waited (for metrics).
        self.stalled_connections = 0
        self._budget_peak = 0  # the most the budget held since memory was last handed back
        #: Client address -> (refused until, the next cooldown, last penalized): see ``abuse_cooldown``.
        self._cooling: dict[str, tuple[float, float, float]] = {}
        #: Connections closed on arrival because their address was cooling down after abuse (for metrics).
        self.cooled_connections = 0

    def add_methods(self, methods: Iterable[Method]) -> None:
        for m in methods:
            self.methods[m.path] = m

    def bind(self, host: str, port: int) -> int:
        """Bind (not yet listen) every address ``host`` names; returns the port (``port`` 0 picks one).

        Binding first lets a server advertise its port before it serves. OSError if the address is taken.
        """
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        seen: set[tuple[object, ...]] = set()
        try:
            for family, kind, proto, _, address in infos:
                if (family, address) in seen:
                    continue
                seen.add((family, address))
                sock = socket.socket(family, kind, proto)
                self._sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not SO_REUSEPORT: one owner
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                if port == 0 and len(self._sockets) > 1:
                    address = (address[0], self.port, *address[2:])
                sock.bind(address)
                self.port = sock.getsockname()[1]
                port = self.port
        except OSError:
            self._close_sockets()
            raise
        return self.port

    async def start(self, ssl_context: ssl.SSLContext | None = None) -> None:
        """Serve on the bound addresses; with ``ssl_context``, TLS (ALPN h2 is set on it)."""
        if ssl_context is not None:
            ssl_context.set_alpn_protocols(["h2"])
        loop = asyncio.get_running_loop()
        for sock in self._sockets:
            sock.listen(1024)
            self._servers.append(await loop.create_server(self._connection, sock=sock, ssl=ssl_context))
        self._ticker = loop.create_task(self._tick(), name="rpc keepalive")

    def _close_sockets(self) -> None:
        for sock in self._sockets:
            sock.close()
        self._sockets.clear()

    def _connection(self) -> _Connection:
        return _Connection(self)

    def admit(self, conn: _Connection, host: str) -> bool:
        cooling = self._cooling.get(host) if self._cooling else None
        if cooling is not None and asyncio.get_running_loop().time() < cooling[0]:
            self.cooled_connections += 1
            return False
        cap = self.options.max_connections
        if cap and len(self._connections) >= cap:
            self.refused_connections += 1
            if self.refused_connections % 1000 == 1:
                log.warning(
                    "refused a connection: %d are open (rpc.max.connections); %d refused so far",
                    len(self._connections),
                    self.refused_connections,
                )
            return False
        self._connections.add(conn)
        self._by_core[conn.core] = conn
        return True

    def connection_closed(self, conn: _Connection) -> None:
        if conn in self._connections:
            self._connections.discard(conn)
            self._by_core.pop(conn.core, None)
            self._resets_sent_closed += conn.core.resets_sent
        self.budget_returned()

    def penalize(self, host: str) -> None:
        """``host``'s connection was closed for abuse: refuse its next ones for a while (a reconnecting flood
        would otherwise get a fresh allowance each time)."""
        base = self.options.abuse_cooldown
        if not base or not host:
            return
        now = asyncio.get_running_loop().time()
        until, cooldown, last = self._cooling.get(host, (0.0, base, now))
        if now < until:
            return  # its other connections, closed in the same breath: one offence
        self._cooling.pop(host, None)  # re-inserted last: the dict stays in order of offence
        if now - last > 600:  # behaved for ten minutes: start over
            cooldown = base
        self._cooling[host] = (now + cooldown, min(cooldown * 2, 60.0), now)
        if len(self._cooling) > 10_000:  # bounded: the longest-forgiven go first
            del self._cooling[next(iter(self._cooling))]
        log.warning("refusing connections from %s for %.0f s: it was closed for abuse", host, cooldown)

    def budget_returned(self) -> None:
        """Budget came back: connections that wait for it get their window updates, oldest first."""
        budget = self.budget
        if budget is None:
            return
        for core in list(budget.waiting):
            if budget.room <= 0:
                break
            conn = self._by_core.get(core)
            if conn is None:
                budget.waiting.pop(core, None)
            elif conn.core.grant_withheld():
                conn.want_flush()

    def _hand_back_memory(self) -> None:
        """Once the budget has been mostly full and is mostly free again, give freed heap pages back.

        Buffers of many connections grow and are freed in no order; glibc keeps the freed pages of such a
        heap, so without this the process would stay at its peak (hundreds of MB) after an attack ends.
        """
        budget = self.budget
        if budget is None:
            return
        self._budget_peak = max(self._budget_peak, budget.used)
        if self._budget_peak > budget.limit // 2 and budget.used < budget.limit // 8:
            self._budget_peak = 0
            gc.collect()  # closed connections are cycles (protocol, core, calls): freed only by a collection
            malloc_trim()

    def _reclaim(self, now: float) -> None:
        """While connections wait for budget, close those that hold budget without taking messages."""
        budget = self.budget
        if budget is None or not budget.waiting or budget.room > budget.limit // 16:
            return
        stall = self.options.stall_timeout
        stalled = [
            c for c in self._connections if c.core.budget_charged and now - c.last_progress > stall and c.transport
        ]
        for conn in sorted(stalled, key=lambda c: -c.core.budget_charged):
            self.stalled_connections += 1
            conn.calm_down(
                f"holds {conn.core.budget_charged} bytes of the server's buffer budget (rpc.max.buffered.bytes) "
                f"and took no message for {now - conn.last_progress:.0f} s while other connections wait"
            )
            if budget.room > budget.limit // 8:
                break

    @property
    def resets_sent(self) -> int:
        """Streams reset for their clients' errors (a client provoking many is stopped: ENHANCE_YOUR_CALM)."""
        return self._resets_sent_closed + sum(c.core.resets_sent for c in self._connections)

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(1.0)
            now = loop.time()
            for conn in list(self._connections):
                conn.tick(now)
            self._reclaim(now)
            self._hand_back_memory()

    async def stop(self, grace: float | None = None) -> None:
        """Stop listening, let calls in flight finish for ``grace`` seconds, then end the rest."""
        for server in self._servers:
            server.close()
        if not self._servers:
            self._close_sockets()
        if self._ticker is not None:
            self._ticker.cancel()
        connections = list(self._connections)
        for conn in connections:
            conn.go_away()
        tasks = [c.task for conn in connections for c in conn.calls.values() if c.task is not None]
        if connections and grace:
            # Not only the calls' tasks: their queued responses must reach slow readers too. A connection
            # closes itself once its calls are over and their last bytes are written.
            await asyncio.wait([conn.done for conn in connections], timeout=grace)
        for conn in connections:
            conn.abort()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        self._servers.clear()
        self._sockets.clear()

    @property
    def connections(self) -> int:
        return len(self._connections)
