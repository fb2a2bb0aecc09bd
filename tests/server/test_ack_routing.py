"""Acks reach the call that sent the message, even when clients reuse correlation ids.

Found by the chaos suite: PublishAsync calls that numbered their messages "0", "1", ... got each other's
acks, because the server matched acks waiting on its shared inbox by the client's id alone.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.client import Client, StartPosition, StopPosition
from liftlog.metadata.controller import CreateStreamRequest

from .conftest import in_process_server

pytestmark = pytest.mark.timeout(60)
COUNT = 300


async def test_publishers_reusing_correlation_ids_get_their_own_acks(tmp_path: Path, nats_url: str) -> None:
    server = in_process_server(tmp_path / "data", nats_url, f"acks-{secrets.token_hex(4)}")
    await server.start()
    try:
        assert server.cluster is not None
        await asyncio.wait_for(server.cluster.create_stream(CreateStreamRequest("orders", "orders")), 10)

        async def publisher(tag: str) -> dict[str, api_pb2.PublishResponse]:
            async def requests() -> AsyncIterator[api_pb2.PublishRequest]:
                for i in range(COUNT):
                    yield api_pb2.PublishRequest(
                        stream="orders", value=f"{tag}-{i}".encode(), correlationId=str(i), ackPolicy=api_pb2.LEADER
                    )

            # A channel each: separate connections, as two client processes would have.
            async with grpc.aio.insecure_channel(server.address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
                call = api_pb2_grpc.APIStub(ch).PublishAsync(requests())
                return {resp.correlationId: resp async for resp in call}

        answers = await asyncio.gather(*(publisher(tag) for tag in ("A", "B", "C")))
        async with Client(server.address) as client:
            sub = client.subscribe(
                "orders", start_position=StartPosition.EARLIEST, stop_position=StopPosition.STOP_LATEST
            )
            stored = {m.offset: m.value.decode() async for m in sub}
        assert len(stored) == 3 * COUNT
        for tag, responses in zip(("A", "B", "C"), answers, strict=True):
            assert len(responses) == COUNT
            for cid, resp in responses.items():
                assert resp.ack.correlationId == cid  # the id the publisher sent, not the server's own
                assert stored[resp.ack.offset] == f"{tag}-{cid}", f"{tag}-{cid} was acked with another's offset"
    finally:
        await server.stop()
