"""A partition whose log cannot be opened answers UNAVAILABLE with the reason, and bricks nothing else."""

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


async def test_a_log_that_cannot_open_answers_unavailable_and_other_streams_work(tmp_path: Path, nats_url: str) -> None:
    data = tmp_path / "data"
    # A file where the partition's directory belongs: opening its log fails.
    (data / "streams" / "broken").mkdir(parents=True)
    (data / "streams" / "broken" / "0").write_text("not a directory")
    server = in_process_server(data, nats_url, f"failed-{secrets.token_hex(4)}")
    await server.start()
    try:
        assert server.cluster is not None and server.streams is not None
        await asyncio.wait_for(server.cluster.create_stream(CreateStreamRequest("broken", "broken")), 10)
        # The server still follows the metadata: a later stream opens and serves.
        await asyncio.wait_for(server.cluster.create_stream(CreateStreamRequest("fine", "fine")), 10)
        async with grpc.aio.insecure_channel(server.address) as channel:
            api = api_pb2_grpc.APIStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as sub:
                call = api.Subscribe(api_pb2.SubscribeRequest(stream="broken", startPosition=api_pb2.EARLIEST))
                await call.read()
            assert sub.value.code() is grpc.StatusCode.UNAVAILABLE
            details = sub.value.details() or ""
            assert "partition broken/0 is unavailable on server a: its log in" in details
            assert dict(sub.value.trailing_metadata() or ()).get("liftlog-error") == "unavailable"

            with pytest.raises(grpc.aio.AioRpcError) as pub:
                await api.Publish(api_pb2.PublishRequest(stream="broken", value=b"x"), timeout=10)
            assert pub.value.code() is grpc.StatusCode.UNAVAILABLE
            assert "cannot be opened" in (pub.value.details() or "")

            ack = await api.Publish(
                api_pb2.PublishRequest(stream="fine", value=b"ok", ackPolicy=api_pb2.LEADER), timeout=10
            )
            assert ack.ack.offset == 0
    finally:
        await server.stop()
