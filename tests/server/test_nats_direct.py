"""The server's NATS connection: direct intake subscriptions on a real nats-server, next to ordinary ones."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client

from liftlog.server import nats_direct
from tests.integration.harness import find_nats_server_binary, free_port, wait_for_port


async def until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_direct_messages_arrive_in_order_as_bytes(nats_url: str) -> None:
    nc = await nats_direct.connect(servers=[nats_url])
    try:
        got: list[tuple[bytes, bytes, bytes]] = []
        queued: list[Any] = []

        async def cb(msg: Any) -> None:
            queued.append(msg)

        sub = await nc.subscribe_direct("direct.>", "", lambda s, r, d: got.append((s, r, d)), cb)
        ordinary: list[bytes] = []

        async def plain(msg: Any) -> None:
            ordinary.append(msg.data)

        await nc.subscribe("plain", cb=plain)
        for i in range(2000):
            await nc.publish(f"direct.{i % 3}", b"%d" % i, reply="r" if i == 5 else "")
        await nc.publish("plain", b"still works")
        await until(lambda: len(got) + len(queued) == 2000 and ordinary)
        values = [m.data for m in queued] + [d for _, _, d in got]
        assert values == [b"%d" % i for i in range(2000)], "arrival order, across both paths"
        assert got and all(isinstance(s, bytes) for s, _, _ in got)
        assert (b"direct.2", b"r", b"5") in got or any(m.reply == "r" for m in queued)
        assert ordinary == [b"still works"]
        assert nc.stats["in_msgs"] >= 2001

        await sub.unsubscribe()
        assert not nc._direct, "an unsubscribed sid is forgotten"
        before = len(got)
        await nc.publish("direct.0", b"after")
        await nc.flush()
        await asyncio.sleep(0.1)
        assert len(got) == before
    finally:
        await nc.close()


async def test_messages_queued_for_the_callback_keep_the_direct_path_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    """While early messages wait in the subscription's queue, later ones must queue behind them."""
    nc = nats_direct.DirectClient()
    direct: list[bytes] = []
    usual: list[bytes] = []

    async def usual_path(self: Any, sid: int, subject: bytes, reply: bytes, data: bytes, headers: Any) -> None:
        usual.append(data)

    monkeypatch.setattr(Client, "_process_msg", usual_path)

    class Sub:
        _pending_queue: asyncio.Queue[bytes] = asyncio.Queue()

    sub = Sub()
    nc._subs[7] = sub
    nc._direct[7] = lambda s, r, d: direct.append(d)
    sub._pending_queue.put_nowait(b"early")
    await nc._process_msg(7, b"s", b"", b"one", None)
    sub._pending_queue.get_nowait()
    await nc._process_msg(7, b"s", b"", b"two", None)
    await nc._process_msg(8, b"s", b"", b"other sid", None)
    assert (usual, direct) == ([b"one", b"other sid"], [b"two"])


async def test_direct_subscriptions_survive_a_nats_restart(tmp_path: Path) -> None:
    port = free_port()

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [str(find_nats_server_binary()), "-a", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(port)
        return proc

    proc = start()
    reconnected = asyncio.Event()

    async def on_reconnect() -> None:
        reconnected.set()

    nc = await nats_direct.connect(
        servers=[f"nats://127.0.0.1:{port}"],
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.1,
        reconnected_cb=on_reconnect,
    )
    try:
        got: list[bytes] = []

        async def cb(msg: Any) -> None:
            got.append(msg.data)

        await nc.subscribe_direct("x", "q", lambda s, r, d: got.append(d), cb)
        await nc.publish("x", b"before")
        await until(lambda: got == [b"before"])
        proc.terminate()
        proc.wait(10)
        proc = start()
        await asyncio.wait_for(reconnected.wait(), 15)
        await nc.publish("x", b"after")
        await until(lambda: got == [b"before", b"after"])
    finally:
        await nc.close()
        proc.terminate()
        proc.wait(10)
