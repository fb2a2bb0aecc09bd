"""A leader whose NATS connection dropped takes no writes again until its metadata is proven current.

Seen in the chaos suite (``make chaos SEED=11``): a leader cut off from NATS is replaced by the
controller; when its connection comes back its intake subscribes again at once, and for the 100-200 ms
until the metadata telling it that it was replaced arrives, it writes the messages published on its
subject at offsets of its stale log (truncated soon after) and acknowledges them, while the new leader
stores the same messages elsewhere. Whichever ack reaches the publisher's server first is the answer: an
ack-LEADER message acknowledged at an offset where it is not, or an error for an ack-ALL message the new
leader committed (the old leader fails its commit waiters when it steps down).
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from liftlog.metadata.controller import CreateStreamRequest

from .conftest import in_process_server

pytestmark = pytest.mark.timeout(60)


async def until(condition: object, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_leader_takes_writes_after_a_nats_reconnect_only_once_its_metadata_is_current(
    tmp_path: Path, nats_url: str, nc: NatsClient
) -> None:
    server = in_process_server(tmp_path / "data", nats_url, f"reconnect-{secrets.token_hex(4)}")
    await server.start()
    try:
        assert server.cluster is not None and server.streams is not None and server._lean is not None
        await asyncio.wait_for(server.cluster.create_stream(CreateStreamRequest("orders", "orders")), 10)
        part = server.streams.partitions[("orders", 0)]
        await until(lambda: part.accepting and part.leader is not None)

        # The barrier that proves the metadata current waits for the test (as for a slow metadata leader).
        release = asyncio.Event()
        barriers = 0
        real_barrier = server.cluster.raft.read_barrier

        async def gated_barrier(timeout: float) -> int:
            nonlocal barriers
            barriers += 1
            await release.wait()
            return await real_barrier(timeout)

        server.cluster.raft.read_barrier = gated_barrier  # type: ignore[method-assign]

        lean = server._lean
        wire = lean._wire
        assert wire is not None and wire.transport is not None
        wire.transport.abort()  # the connection drops; the lean connection reconnects on its own
        await until(lambda: lean.reconnects == 1 and lean.is_connected)

        await nc.publish("orders", b"published while the leadership is unconfirmed")
        await nc.flush()
        await asyncio.sleep(0.3)
        assert part.log is not None
        assert part.log.newest_offset == -1, "written before the metadata was known current"
        assert not part.accepting and barriers == 1

        release.set()
        await until(lambda: part.accepting)
        await nc.publish("orders", b"published once confirmed")
        await nc.flush()
        await until(lambda: part.log is not None and part.log.newest_offset == 0)
        assert part.leader is not None
    finally:
        await server.stop()
