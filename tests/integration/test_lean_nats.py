"""The server's hot path on the lean NATS connection (``nats.lean.connection``, the default) and on
nats-py's alone: both store what clients and NATS applications publish, and both keep storing across
a nats-server restart (the intake subscribes again)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import grpc
import nats
import pytest

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.client import Client, LiftlogError

from .harness import LiftlogProcess, NatsProcess, free_port

pytestmark = pytest.mark.slow


async def values(client: Client, name: str) -> list[bytes]:
    return [bytes(v) for cols in [c async for c in client.read_range(name)] for v in cols.values]


async def publish_until_stored(client: Client, name: str, value: bytes, timeout: float = 30.0) -> None:
    """Publish ``value`` until one attempt is acknowledged (NATS may still be reconnecting)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            await client.publish(name, value, timeout=2)
            return
        except LiftlogError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("lean", ["true", "false"])
async def test_intake_and_publishes_survive_a_nats_restart(tmp_path: Path, lean: str) -> None:
    monitor = free_port()
    nats_server = NatsProcess(tmp_path / "nats.log", f"http_port: {monitor}")
    metrics_port = free_port()
    server = LiftlogProcess(
        tmp_path / "data",
        "--set",
        f"nats.lean.connection={lean}",
        "--set",
        f"metrics.listen=127.0.0.1:{metrics_port}",
        nats_url=nats_server.url,
    ).start()
    try:
        async with Client(server.address) as client:
            await client.create_stream("orders", "orders")
            await publish_until_stored(client, "orders", b"from a client")
            app = await nats.connect(nats_server.url)
            await app.publish("orders", b"from an app")
            await app.flush()
            await app.close()
            for _ in range(100):
                if len(await values(client, "orders")) == 2:
                    break
                await asyncio.sleep(0.05)
            assert await values(client, "orders") == [b"from a client", b"from an app"]
            connz = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{monitor}/connz", timeout=5).read())
            names = sorted(c.get("name", "") for c in connz["connections"] if c.get("name", "").startswith("liftlog-"))
            assert any(n.endswith("-intake") for n in names) == (lean == "true"), names

            nats_server.stop()
            # While NATS is away a publish fails at once, on either connection: nats-py would buffer it and
            # deliver it after the reconnect, long after its caller was told it timed out.
            async with grpc.aio.insecure_channel(server.address) as ch:
                started = asyncio.get_running_loop().time()
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await api_pb2_grpc.APIStub(ch).Publish(
                        api_pb2.PublishRequest(stream="orders", value=b"during the outage"), timeout=10
                    )
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value
                assert asyncio.get_running_loop().time() - started < 8  # at most the ack timeout (5 s)
            nats_server = NatsProcess(tmp_path / "nats2.log", f"http_port: {monitor}", port=nats_server.port)
            await publish_until_stored(client, "orders", b"after the restart")
            stored = await values(client, "orders")
            assert stored[:2] == [b"from a client", b"from an app"]
            assert b"after the restart" in stored[2:]
            assert b"during the outage" not in stored

            text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
            received = next(
                float(line.split()[-1])
                for line in text.splitlines()
                if line.startswith("liftlog_nats_messages_received")
            )
            assert received >= 3  # the intake's messages count, on whichever connection they came
            assert "liftlog_nats_connected 1.0" in text
    finally:
        server.kill()
        nats_server.stop()
