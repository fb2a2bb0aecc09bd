"""A lean NATS connection for the server's hot path: partition intake and clients' publishes.

nats-py hands every message through a StreamReader, a reading task and a queue and task per
subscription, and every publish through a flusher task: three task switches and about 37 us of
the 310 us one publish takes in the server (``docs/performance.md``). This connection is an
:class:`asyncio.Protocol`: it parses each read buffer whole (:mod:`.protocol`) and calls each
subscription once per buffer with every message the buffer held for it, from ``data_received``;
publishes made in one loop turn go out in one write at the end of the turn.

It does what the server needs and no more: publish and subscribe, the authentication modes of the
server's ``nats.*`` settings (user and password, token, nkey seed, credentials file, TLS with
client certificates), PING/PONG both ways, and reconnecting forever once connected, subscriptions
included. A publish while disconnected fails at once (the client sees UNAVAILABLE) instead of
waiting in a buffer. Requests, JetStream and the rest stay on nats-py's connection.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
import ssl
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlsplit

from .protocol import (
    ERR,
    INFO,
    MSG,
    PING,
    PING_COMMAND,
    PONG,
    PONG_COMMAND,
    Event,
    NatsParser,
    NatsProtocolError,
    connect_command,
    encode_headers,
    pub_command,
    sub_command,
    unsub_command,
)

if TYPE_CHECKING:
    from liftlog.jsontypes import JSONObject

__all__ = [
    "BatchHandler",
    "LeanNats",
    "LeanSubscription",
    "MaxPayloadError",
    "NatsAuthError",
    "NatsConnectError",
    "NatsNotConnected",
    "NatsServerAddress",
    "parse_servers",
]

log = logging.getLogger(__name__)

#: Called once per read buffer with the messages it held for the subscription, as the parser's events:
#: (MSG, sid, subject, reply, payload, raw headers or b"").
BatchHandler = Callable[[list[Event]], None]

_DEFAULT_PORT = 4222
_WHITESPACE = re.compile(r"\s")
#: Past this many bytes waiting in the socket's write buffer, publishers wait for it to drain.
_WRITE_HIGH = 32 << 20


class NatsConnectError(ConnectionError):
    """No configured nats-server could be reached, or one refused the connection."""


class NatsAuthError(NatsConnectError):
    """A nats-server refused our credentials."""


class NatsNotConnected(ConnectionError):
    """Publishing while the connection is down (it reconnects on its own)."""


class MaxPayloadError(ValueError):
    """A message larger than the nats-server's ``max_payload``."""


@dataclass(frozen=True)
class NatsServerAddress:
    host: str
    port: int
    tls: bool = False  # a tls:// URL: TLS is required even if the server's INFO does not ask for it
    user: str = ""
    password: str = ""

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_servers(urls: Sequence[str]) -> list[NatsServerAddress]:
    """``nats://[user:pass@]host[:port]``, ``tls://...`` or ``host[:port]``; ValueError for anything else."""
    out = []
    for url in urls:
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        if parts.scheme not in ("nats", "tls"):
            raise ValueError(f"NATS URL {url!r}: only nats:// and tls:// are supported here")
        if not parts.hostname:
            raise ValueError(f"NATS URL {url!r} names no host")
        out.append(
            NatsServerAddress(
                parts.hostname,
                parts.port or _DEFAULT_PORT,
                parts.scheme == "tls",
                unquote(parts.username or ""),
                unquote(parts.password or ""),
            )
        )
    return out


def _read_seed(path: str) -> bytes:
    return Path(path).read_bytes().strip()


def _read_credentials(path: str) -> tuple[str, bytes]:
    """(user JWT, nkey seed) from a NATS ``.creds`` file."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line.startswith("-----BEGIN"):
            current = []
        elif line.startswith("------END") or line.startswith("-----END"):
            if current is not None:
                blocks.append(current)
            current = None
        elif current is not None and line:
            current.append(line)
    if len(blocks) < 2 or not blocks[0] or not blocks[1]:
        raise NatsAuthError(f"{path} is not a NATS credentials file (a user JWT and an nkey seed)")
    return blocks[0][0], blocks[1][0].encode()


def _sign(seed: bytes, nonce: str) -> str:
    import nkeys  # only with nkey or credentials authentication

    kp = nkeys.from_seed(bytearray(seed))
    try:
        return base64.b64encode(kp.sign(nonce.encode())).decode()
    finally:
        kp.wipe()


def _public_key(seed: bytes) -> str:
    import nkeys

    kp = nkeys.from_seed(bytearray(seed))
    try:
        return str(kp.public_key.decode())
    finally:
        kp.wipe()


class LeanSubscription:
    """A subscription whose handler is called from the connection's ``data_received``."""

    __slots__ = ("_conn", "handler", "queue", "sid", "subject")

    def __init__(self, conn: LeanNats, sid: int, subject: str, queue: str, handler: BatchHandler) -> None:
        self._conn = conn
        self.sid = sid
        self.subject = subject
        self.queue = queue
        self.handler = handler

    @property
    def pending_msgs(self) -> int:
        return 0  # delivered as they are read: nothing waits

    async def unsubscribe(self, limit: int = 0) -> None:
        self._conn._unsubscribe(self.sid)

    async def drain(self) -> None:
        await self.unsubscribe()


class _Wire(asyncio.Protocol):
    __slots__ = ("_owner", "drained", "lost", "parser", "paused", "transport")

    def __init__(self, owner: LeanNats) -> None:
        self._owner = owner
        self.parser = NatsParser()
        self.transport: asyncio.Transport | None = None
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.paused = False
        self.drained: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        self.transport.set_write_buffer_limits(high=_WRITE_HIGH)

    def data_received(self, data: bytes) -> None:
        try:
            events = self.parser.feed(data)
        except NatsProtocolError as exc:
            log.warning("NATS connection: %s; reconnecting", exc)
            assert self.transport is not None
            self.transport.abort()
            return
        self._owner._on_events(self, events)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        self.resume_writing()
        self._owner._on_lost(self, exc)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        self.drained = None


class LeanNats:
    """A NATS connection for publishing and for subscriptions handled a read buffer at a time."""

    def __init__(
        self,
        servers: Sequence[str],
        *,
        name: str = "",
        user: str = "",
        password: str = "",
        token: str = "",
        nkey_seed_file: str = "",
        credentials_file: str = "",
        tls: ssl.SSLContext | None = None,
        connect_timeout: float = 5.0,
        reconnect_wait: float = 0.5,
        ping_interval: float = 30.0,
        max_outstanding_pings: int = 2,
        on_disconnected: Callable[[], Awaitable[None]] | None = None,
        on_reconnected: Callable[[], Awaitable[None]] | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self._servers = parse_servers(servers)
        if not self._servers:
            raise ValueError("no NATS servers")
        self._name = name
        self._user = user
        self._password = password
        self._token = token
        self._nkey_seed_file = nkey_seed_file
        self._credentials_file = credentials_file
        self._tls = tls
        self._connect_timeout = connect_timeout
        self._reconnect_wait = reconnect_wait
        self._ping_interval = ping_interval
        self._max_outstanding_pings = max_outstanding_pings
        self._on_disconnected = on_disconnected
        self._on_reconnected = on_reconnected
        #: Told the text of each -ERR the server sends once connected (default: a warning per error).
        self._on_error = on_error
        self._wire: _Wire | None = None
        self._connected = False
        self._closing = False
        self._info: dict[str, Any] = {}
        #: Until connected: what the server said (INFO, PONG, -ERR), and a waiter for the next of it.
        self._handshake_events: deque[Event] = deque()
        self._handshake: asyncio.Future[None] | None = None
        self._subs: dict[int, LeanSubscription] = {}
        self._next_sid = 1
        self._out: list[bytes] = []
        self._flush_scheduled = False
        #: One entry per PING sent and not yet answered: a flush()'s waiter, or None for a keepalive.
        self._pongs: deque[asyncio.Future[None] | None] = deque()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ping_timer: asyncio.TimerHandle | None = None
        self.server: NatsServerAddress | None = None
        #: For metrics (the names of nats-py's ``stats``).
        self.in_msgs = 0
        self.in_bytes = 0
        self.out_msgs = 0
        self.out_bytes = 0
        self.reconnects = 0

    # -- state -----------------------------------------------------------

    @property
    def is_connected(self) -> bool:
        return self._connected

    @property
    def stats(self) -> dict[str, int]:
        return {
            "in_msgs": self.in_msgs,
            "in_bytes": self.in_bytes,
            "out_msgs": self.out_msgs,
            "out_bytes": self.out_bytes,
            "reconnects": self.reconnects,
        }

    @property
    def max_payload(self) -> int:
        return int(self._info.get("max_payload", 1 << 20))

    # -- connecting ------------------------------------------------------

    async def connect(self) -> None:
        """Connect to the first server that takes us; NatsConnectError naming each failure otherwise."""
        errors = []
        for address in self._servers:
            try:
                await self._connect_to(address)
                return
            except NatsAuthError:
                raise
            except (TimeoutError, OSError, NatsConnectError, NatsProtocolError, ssl.SSLError) as exc:
                errors.append(f"{address}: {exc or type(exc).__name__}")
        raise NatsConnectError("; ".join(errors))

    async def _connect_to(self, address: NatsServerAddress) -> None:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._connect_timeout):
            self._handshake_events.clear()
            transport, wire = await loop.create_connection(self._new_wire, address.host, address.port)
            try:
                info = await self._expect(wire, INFO)
                self._info = info[1]
                if address.tls or self._tls is not None or self._info.get("tls_required"):
                    context = self._tls or ssl.create_default_context()
                    new = await loop.start_tls(transport, wire, context, server_hostname=address.host)
                    if new is None:
                        raise NatsConnectError(f"{address}: TLS handshake failed")
                    transport = new
                    wire.transport = new
                    new.set_write_buffer_limits(high=_WRITE_HIGH)
                transport.write(connect_command(self._connect_options(address)) + PING_COMMAND)
                await self._expect(wire, PONG)
            except BaseException:
                self._wire = None
                transport.abort()
                raise
        self.server = address
        self._connected = True
        out = [sub_command(s.subject, s.queue, s.sid) for s in self._subs.values()]
        if out:
            transport.write(b"".join(out))
        self._arm_ping()

    def _new_wire(self) -> _Wire:
        # Current before the connection is made: the server's INFO may arrive before create_connection returns.
        self._wire = _Wire(self)
        return self._wire

    async def _expect(self, wire: _Wire, kind: int) -> Event:
        """The next handshake event, which must be ``kind`` (an -ERR is the server refusing us)."""
        while not self._handshake_events:
            if wire.lost.done():
                raise NatsConnectError("the server closed the connection")
            self._handshake = asyncio.get_running_loop().create_future()
            await self._handshake
        event = self._handshake_events.popleft()
        if event[0] == ERR:
            text = str(event[1])
            if "authoriz" in text.lower() or "authentic" in text.lower():
                raise NatsAuthError(f"NATS refused the credentials: {text}")
            raise NatsConnectError(f"NATS: {text}")
        if event[0] != kind:
            raise NatsConnectError(f"unexpected NATS handshake reply {event!r}")
        return event

    def _connect_options(self, address: NatsServerAddress) -> JSONObject:
        options: JSONObject = {
            "verbose": False,
            "pedantic": False,
            "lang": "python-liftlog",
            "version": "1",
            "protocol": 1,
            "headers": True,
            "no_responders": True,
            "echo": True,
        }
        if self._name:
            options["name"] = self._name
        if address.user or self._user:
            options["user"] = address.user or self._user
            options["pass"] = address.password if address.user else self._password
        if self._token:
            options["auth_token"] = self._token
        nonce = self._info.get("nonce")
        if self._credentials_file:
            jwt, seed = _read_credentials(self._credentials_file)
            options["jwt"] = jwt
            if nonce:
                options["sig"] = _sign(seed, nonce)
        elif self._nkey_seed_file:
            seed = _read_seed(self._nkey_seed_file)
            options["nkey"] = _public_key(seed)
            if nonce:
                options["sig"] = _sign(seed, nonce)
        return options

    # -- events from the wire ---------------------------------------------

    def _on_events(self, wire: _Wire, events: list[Event]) -> None:
        if wire is not self._wire:
            return
        batches: dict[int, list[Event]] = {}
        for event in events:
            kind = event[0]
            if kind == MSG:
                batch = batches.get(event[1])
                if batch is None:
                    batches[event[1]] = [event]
                else:
                    batch.append(event)
            elif kind == PING:
                self._write(PONG_COMMAND)
            elif not self._connected:
                self._handshake_events.append(event)
                if self._handshake is not None and not self._handshake.done():
                    self._handshake.set_result(None)
            elif kind == PONG:
                if self._pongs:
                    waiter = self._pongs.popleft()
                    if waiter is not None and not waiter.done():
                        waiter.set_result(None)
            elif kind == INFO:
                self._info.update(event[1])
            elif kind == ERR:
                if self._on_error is not None:
                    self._on_error(str(event[1]))
                else:
                    log.warning("NATS (lean connection): %s", event[1])
        if batches:
            subs = self._subs
            for sid, msgs in batches.items():
                sub = subs.get(sid)
                if sub is None:
                    continue  # unsubscribed while these were on their way
                self.in_msgs += len(msgs)
                self.in_bytes += sum(len(m[4]) for m in msgs)
                try:
                    sub.handler(msgs)
                except Exception:
                    log.exception("handling messages on %s failed", sub.subject)

    def _on_lost(self, wire: _Wire, exc: Exception | None) -> None:
        if wire is not self._wire:
            return
        self._wire = None
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(NatsConnectError(f"the server closed the connection: {exc or 'EOF'}"))
        was_connected, self._connected = self._connected, False
        self._out.clear()
        pongs, self._pongs = self._pongs, deque()
        for waiter in pongs:
            if waiter is not None and not waiter.done():
                waiter.set_exception(NatsNotConnected(f"the NATS connection to {self.server} was lost"))
        if self._ping_timer is not None:
            self._ping_timer.cancel()
            self._ping_timer = None
        if self._closing or not was_connected:
            return
        log.warning("NATS (lean connection) to %s lost: %s; reconnecting", self.server, exc or "closed")
        self._spawn(self._reconnect())

    async def _reconnect(self) -> None:
        if self._on_disconnected is not None:
            await self._on_disconnected()
        refused: set[NatsServerAddress] = set()  # warned once per outage, not every round
        while not self._closing:
            for address in self._servers:
                if self._closing:
                    return
                try:
                    await self._connect_to(address)
                except NatsAuthError as exc:
                    (log.debug if address in refused else log.warning)("NATS (lean connection) to %s: %s", address, exc)
                    refused.add(address)
                except (TimeoutError, OSError, NatsConnectError, NatsProtocolError, ssl.SSLError) as exc:
                    log.debug("reconnecting to %s: %s", address, exc or type(exc).__name__)
                else:
                    self.reconnects += 1
                    log.warning("NATS (lean connection) reconnected to %s", address)
                    if self._on_reconnected is not None:
                        await self._on_reconnected()
                    return
            await asyncio.sleep(self._reconnect_wait)

    def _arm_ping(self) -> None:
        self._ping_timer = asyncio.get_running_loop().call_later(self._ping_interval, self._ping)

    def _ping(self) -> None:
        self._ping_timer = None
        wire = self._wire
        if wire is None or wire.transport is None:
            return
        unanswered = sum(1 for w in self._pongs if w is None)
        if unanswered >= self._max_outstanding_pings:
            log.warning("NATS (lean connection) to %s: no PONG to %d PINGs; reconnecting", self.server, unanswered)
            wire.transport.abort()
            return
        self._pongs.append(None)
        self._write(PING_COMMAND)
        self._arm_ping()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- publishing and subscribing ----------------------------------------

    async def publish(
        self, subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None:
        if not self._connected:
            raise NatsNotConnected("the NATS connection is down (reconnecting)")
        if len(payload) > self.max_payload:
            raise MaxPayloadError(f"{len(payload)} bytes, the nats-server takes at most {self.max_payload}")
        if not subject or _WHITESPACE.search(subject) or (reply and _WHITESPACE.search(reply)):
            # A space ends the subject; CR or LF would end the command and start one of the sender's choosing.
            raise ValueError(f"invalid NATS subject {subject!r} (reply {reply!r})")
        self._write(pub_command(subject, payload, reply, encode_headers(headers) if headers else b""))
        self.out_msgs += 1
        self.out_bytes += len(payload)
        wire = self._wire
        if wire is not None and wire.paused:
            if wire.drained is None:
                wire.drained = asyncio.get_running_loop().create_future()
            await wire.drained

    async def subscribe_batches(self, subject: str, queue: str, handler: BatchHandler) -> LeanSubscription:
        sid = self._next_sid
        self._next_sid += 1
        sub = self._subs[sid] = LeanSubscription(self, sid, subject, queue, handler)
        if self._connected:
            self._write(sub_command(subject, queue, sid))
        return sub

    def _unsubscribe(self, sid: int) -> None:
        if self._subs.pop(sid, None) is not None and self._connected:
            self._write(unsub_command(sid))

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def send_now(self) -> None:
        """Write what was published so far now, instead of at the end of this loop turn."""
        self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        out = self._out
        if not out:
            return
        self._out = []
        wire = self._wire
        if wire is not None and wire.transport is not None and self._connected:
            wire.transport.write(out[0] if len(out) == 1 else b"".join(out))

    async def flush(self) -> None:
        """Write what is buffered, then wait for the server's PONG: everything before it was processed."""
        if not self._connected:
            raise NatsNotConnected("the NATS connection is down")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pongs.append(waiter)
        self._write(PING_COMMAND)
        await waiter

    async def close(self) -> None:
        self._closing = True
        self._connected_flush()
        for task in list(self._tasks):
            task.cancel()
        if self._ping_timer is not None:
            self._ping_timer.cancel()
            self._ping_timer = None
        wire, self._wire = self._wire, None
        self._connected = False
        if wire is not None and wire.transport is not None:
            wire.transport.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.shield(wire.lost), 2.0)

    def _connected_flush(self) -> None:
        if self._connected:
            self._flush()
