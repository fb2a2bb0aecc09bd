"""A publish to a partition this server is named to lead, before its intake listens, is not lost.

Seen in CI after a failover: the metadata named the new leader, a publish reached NATS before the
partition subscribed to its subject, no one received it, and its caller waited out the ack timeout.
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import grpc
import pytest

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.metadata.controller import CreateStreamRequest

from .conftest import in_process_server

pytestmark = pytest.mark.timeout(60)


async def test_a_publish_waits_for_the_leaders_intake(tmp_path: Path, nats_url: str) -> None:
    server = in_process_server(tmp_path / "data", nats_url, f"intake-{secrets.token_hex(4)}")
    await server.start()
    try:
        assert server.cluster is not None and server.streams is not None
        await asyncio.wait_for(server.cluster.create_stream(CreateStreamRequest("orders", "orders")), 10)
        part = server.streams.partitions[("orders", 0)]
        for _ in range(100):
            if part.accepting:
                break
            await asyncio.sleep(0.05)
        await part.stop_intake()  # named leader, not yet listening: as right after an election
        assert not part.accepting

        async with grpc.aio.insecure_channel(server.address) as channel:
            publish = asyncio.ensure_future(
                api_pb2_grpc.APIStub(channel).Publish(api_pb2.PublishRequest(stream="orders", value=b"v"), timeout=4)
            )
            await asyncio.sleep(0.3)
            assert not publish.done(), "the publish waits for the partition to listen"
            assert server._nc is not None
            await part.start_intake(server._nc)
            response = await publish
        assert response.ack.offset == 0
    finally:
        await server.stop()
