"""The lean NATS connection against a real nats-server: delivery a read buffer at a time, publishing,
limits, refusals and reconnecting. (Every authentication mode is run through the server in
tests/integration/test_nats_security.py, whose intake is this connection.)"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import nkeys
import pytest
from nats.aio.client import Client as NatsClient

from liftlog.natswire import Event, LeanNats, MaxPayloadError, NatsAuthError, NatsConnectError, NatsNotConnected
from liftlog.natswire.connection import _read_credentials, parse_servers
from tests.integration.harness import NatsProcess, free_port


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsProcess]:
    proc = NatsProcess(tmp_path / "nats.log", "max_payload: 4KB")
    yield proc
    proc.stop()


@pytest.fixture
async def lean(nats_server: NatsProcess) -> AsyncIterator[LeanNats]:
    conn = LeanNats([nats_server.url], name="test")
    await conn.connect()
    yield conn
    await conn.close()


async def fake_peer(
    handler: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> tuple[asyncio.Server, int]:
    """A TCP peer on loopback playing a (misbehaving) nats-server: (server, its port)."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def subscribed(url: str, subject: str) -> tuple[NatsClient, Any]:
    """A nats-py connection subscribed to ``subject`` (the subscription is in place on return)."""
    app = await nats.connect(url)
    sub = await app.subscribe(subject)
    await app.flush()
    return app, sub


async def until(check: object, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():  # type: ignore[operator]
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_messages_arrive_in_order_a_read_buffer_at_a_time(lean: LeanNats, nats_server: NatsProcess) -> None:
    calls: list[list[Event]] = []
    await lean.subscribe_batches("orders.*", "", calls.append)
    await lean.flush()
    app = await nats.connect(nats_server.url)
    for i in range(2000):
        await app.publish(f"orders.{i % 3}", str(i).encode(), reply="r" if i == 5 else "")
    await app.publish("orders.x", b"with headers", headers={"K": "v"})
    await app.flush()
    await app.close()
    await until(lambda: sum(map(len, calls)) == 2001)
    messages = [m[2:5] for batch in calls for m in batch]
    assert [int(m[2]) for m in messages[:2000]] == list(range(2000))
    assert messages[5] == ("orders.2", "r", b"5")
    assert messages[-1] == ("orders.x", "", b"with headers")  # headers are not the payload
    assert len(calls) < 2000  # many messages per call: the point of it
    assert lean.in_msgs == 2001


async def test_published_messages_reach_nats_subscribers_with_their_headers(
    lean: LeanNats, nats_server: NatsProcess
) -> None:
    app, sub = await subscribed(nats_server.url, "events.>")
    await lean.publish("events.a", b"one")
    await lean.publish("events.b", b"two", reply="back.here", headers={"Liftlog-Id": "9"})
    await asyncio.wait_for(lean.flush(), 30)  # the nats-server has both (its PONG follows them)
    # Generous waits: a busy CI machine once took over 5 s to hand nats-py's reader the messages.
    first = await sub.next_msg(timeout=30)
    second = await sub.next_msg(timeout=30)
    await app.close()
    assert (first.subject, first.data) == ("events.a", b"one")
    assert (second.subject, second.reply, second.data) == ("events.b", "back.here", b"two")
    assert second.headers == {"Liftlog-Id": "9"}
    assert lean.out_msgs == 2


async def test_send_now_writes_what_was_published_without_waiting_for_the_loop(
    lean: LeanNats, nats_server: NatsProcess
) -> None:
    app, sub = await subscribed(nats_server.url, "events.>")
    await lean.publish("events.a", b"one")
    await lean.publish("events.b", b"two")
    assert len(lean._out) == 2  # queued for the end of the loop turn
    lean.send_now()
    assert lean._out == []  # gone to the socket, in order, in one write
    lean.send_now()  # nothing queued: nothing to do
    first = await sub.next_msg(timeout=30)
    second = await sub.next_msg(timeout=30)
    await app.close()
    assert [(first.subject, first.data), (second.subject, second.data)] == [("events.a", b"one"), ("events.b", b"two")]


async def test_queue_groups_and_unsubscribing(lean: LeanNats) -> None:
    a: list[bytes] = []
    b: list[bytes] = []
    sub_a = await lean.subscribe_batches("jobs", "workers", lambda ms: a.extend(m[4] for m in ms))
    await lean.subscribe_batches("jobs", "workers", lambda ms: b.extend(m[4] for m in ms))
    for i in range(100):
        await lean.publish("jobs", b"%d" % i)
    await lean.flush()
    await until(lambda: len(a) + len(b) == 100)
    assert sorted(a + b, key=int) == [b"%d" % i for i in range(100)]  # each once, not twice
    await sub_a.unsubscribe()
    for _ in range(10):
        await lean.publish("jobs", b"after")
    await lean.flush()
    await until(lambda: len(a) + len(b) == 110)
    assert b.count(b"after") == 10


async def test_a_handler_that_raises_does_not_stop_delivery(lean: LeanNats) -> None:
    seen: list[bytes] = []

    def handler(msgs: list[Event]) -> None:
        seen.extend(m[4] for m in msgs)
        if b"bad" in seen:
            raise RuntimeError("boom")

    await lean.subscribe_batches("h", "", handler)
    await lean.publish("h", b"bad")
    await lean.flush()
    await lean.publish("h", b"good")
    await lean.flush()
    await until(lambda: b"good" in seen)


async def test_limits_and_bad_subjects(lean: LeanNats) -> None:
    assert lean.max_payload == 4096
    with pytest.raises(MaxPayloadError, match="4097 bytes, the nats-server takes at most 4096"):
        await lean.publish("big", b"x" * 4097)
    await lean.publish("fits", b"x" * 4096)
    for subject in ("", "a b", "a\tb", "a\r\nPUB evil 1\r\nx", "a\n"):
        with pytest.raises(ValueError, match="invalid NATS subject"):
            await lean.publish(subject, b"x")
    with pytest.raises(ValueError, match="invalid NATS subject"):
        await lean.publish("fine", b"x", reply="r\r\nUNSUB 1")
    await lean.flush()  # the connection is still good
    assert lean.is_connected


async def test_connecting_nowhere_names_every_address() -> None:
    ports = [free_port(), free_port()]
    conn = LeanNats([f"nats://127.0.0.1:{p}" for p in ports], connect_timeout=2)
    with pytest.raises(NatsConnectError) as info:
        await conn.connect()
    assert all(f"127.0.0.1:{p}" in str(info.value) for p in ports)


async def test_wrong_credentials_are_refused_clearly(tmp_path: Path) -> None:
    server = NatsProcess(tmp_path / "auth.log", "authorization { user: liftlog, password: right }")
    try:
        with pytest.raises(NatsAuthError, match="refused the credentials"):
            await LeanNats([server.url], user="liftlog", password="wrong").connect()
        good = LeanNats([f"nats://liftlog:right@127.0.0.1:{server.port}"])  # credentials in the URL
        await good.connect()
        await good.flush()
        await good.close()
    finally:
        server.stop()


async def test_it_reconnects_and_resubscribes_and_refuses_publishes_meanwhile(tmp_path: Path) -> None:
    server = NatsProcess(tmp_path / "a.log")
    port = server.port
    down, up = asyncio.Event(), asyncio.Event()

    async def on_down() -> None:
        down.set()

    async def on_up() -> None:
        up.set()

    got: list[bytes] = []
    conn = LeanNats([f"nats://127.0.0.1:{port}"], reconnect_wait=0.1, on_disconnected=on_down, on_reconnected=on_up)
    await conn.connect()
    try:
        await conn.subscribe_batches("r", "", lambda ms: got.extend(m[4] for m in ms))
        await conn.publish("r", b"before")
        await conn.flush()
        server.stop()
        await asyncio.wait_for(down.wait(), 10)
        with pytest.raises(NatsNotConnected, match="down"):
            await conn.publish("r", b"lost")
        server = NatsProcess(tmp_path / "b.log", port=port)
        await asyncio.wait_for(up.wait(), 10)
        await conn.publish("r", b"after")
        await conn.flush()
        await until(lambda: got == [b"before", b"after"])
        assert conn.reconnects == 1
    finally:
        await conn.close()
        server.stop()


async def test_a_server_that_stops_answering_pings_is_left(tmp_path: Path) -> None:
    # A peer that accepts, says INFO and PONG once, then goes silent: after two unanswered PINGs we leave.
    pongs = 0

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal pongs
        writer.write(b'INFO {"max_payload": 1024}\r\n')
        while line := await reader.readline():
            if line.startswith(b"PING") and pongs == 0:
                pongs += 1
                writer.write(b"PONG\r\n")
        writer.close()

    server, port = await fake_peer(silent)
    down = asyncio.Event()

    async def on_down() -> None:
        down.set()

    conn = LeanNats([f"127.0.0.1:{port}"], ping_interval=0.05, on_disconnected=on_down, reconnect_wait=5)
    await conn.connect()
    try:
        await asyncio.wait_for(down.wait(), 5)
        assert not conn.is_connected
    finally:
        await conn.close()
        server.close()


async def test_a_peer_that_is_not_nats_fails_the_connect() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await writer.drain()
        writer.close()

    server, port = await fake_peer(garbage)
    try:
        with pytest.raises(NatsConnectError, match=r"127\.0\.0\.1"):
            await LeanNats([f"127.0.0.1:{port}"], connect_timeout=2).connect()
    finally:
        server.close()


def test_server_urls() -> None:
    first, second, third = parse_servers(["nats://u:p%40ss@h1:4333", "tls://h2", "h3:5"])
    assert (first.host, first.port, first.user, first.password, first.tls) == ("h1", 4333, "u", "p@ss", False)
    assert (second.port, second.tls) == (4222, True)
    assert (third.host, third.port) == ("h3", 5)
    with pytest.raises(ValueError, match="only nats:// and tls://"):
        parse_servers(["ws://h:80"])
    with pytest.raises(ValueError, match="no host"):
        parse_servers(["nats://:4222"])


def test_credentials_files_give_the_jwt_and_a_signature_the_public_key_verifies(tmp_path: Path) -> None:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    creds = tmp_path / "user.creds"
    creds.write_text(
        "-----BEGIN NATS USER JWT-----\neyJ0eXAi.payload.sig\n------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{seed.decode()}\n------END USER NKEY SEED------\n"
    )
    assert _read_credentials(str(creds)) == ("eyJ0eXAi.payload.sig", seed)
    conn = LeanNats(["127.0.0.1:1"], credentials_file=str(creds))
    conn._info = {"nonce": "n0nce"}
    options = conn._connect_options(parse_servers(["127.0.0.1:1"])[0])
    assert options["jwt"] == "eyJ0eXAi.payload.sig"
    kp = nkeys.from_seed(bytearray(seed))
    sig = options["sig"]
    assert isinstance(sig, str)
    assert kp.verify(b"n0nce", base64.b64decode(sig))
    bad = tmp_path / "bad.creds"
    bad.write_text("not a creds file")
    with pytest.raises(NatsAuthError, match="not a NATS credentials file"):
        _read_credentials(str(bad))


async def test_garbage_after_the_handshake_drops_the_connection_and_reconnects() -> None:
    connections = 0

    async def turns_bad(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.write(b'INFO {"max_payload": 1024}\r\n')
        while line := await reader.readline():
            if line.startswith(b"PING"):
                writer.write(b"PONG\r\n")
                if connections == 1:
                    await asyncio.sleep(0.1)  # connected by now
                    writer.write(b"MSG a 1 not-a-size\r\n")
        writer.close()

    server, port = await fake_peer(turns_bad)
    up = asyncio.Event()

    async def on_up() -> None:
        up.set()

    conn = LeanNats([f"127.0.0.1:{port}"], on_reconnected=on_up, reconnect_wait=0.05)
    await conn.connect()
    try:
        await asyncio.wait_for(up.wait(), 5)
        assert conn.is_connected and connections == 2 and conn.reconnects == 1
    finally:
        await conn.close()
        server.close()
