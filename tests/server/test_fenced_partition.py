"""A partition whose log fences itself (a failed write it cannot undo) refuses writes, stays readable,
shows up in the partition metadata and the cluster status, and resumes once the disk recovers."""

from __future__ import annotations

import asyncio
import errno
import secrets
from pathlib import Path

import grpc
import pytest

from liftlog.api import api_pb2, api_pb2_grpc, cluster_pb2, cluster_pb2_grpc
from liftlog.client import Client, StartPosition, StopPosition
from liftlog.metadata.controller import CreateStreamRequest
from liftlog.storage.faults import FaultyFileIO

from .conftest import in_process_server

pytestmark = pytest.mark.timeout(60)


async def read_all(address: str, stream: str) -> list[bytes]:
    async with Client(address) as client:
        sub = client.subscribe(stream, start_position=StartPosition.EARLIEST, stop_position=StopPosition.STOP_LATEST)
        return [m.value async for m in sub]


async def test_a_fenced_partition_refuses_writes_serves_reads_reports_and_resumes(
    tmp_path: Path, nats_url: str
) -> None:
    io = FaultyFileIO()
    server = in_process_server(tmp_path / "data", nats_url, f"fenced-{secrets.token_hex(4)}", file_io=io)
    await server.start()
    try:
        assert server.cluster is not None
        for name in ("disk", "other"):
            await asyncio.wait_for(server.cluster.create_stream(CreateStreamRequest(name, name)), 10)
        async with grpc.aio.insecure_channel(server.address) as channel:
            api = api_pb2_grpc.APIStub(channel)

            async def publish(stream: str, value: bytes) -> api_pb2.PublishResponse:
                return await api.Publish(
                    api_pb2.PublishRequest(stream=stream, value=value, ackPolicy=api_pb2.LEADER), timeout=10
                )

            assert (await publish("disk", b"before")).ack.offset == 0
            # The disk fills mid-write and the torn bytes cannot be cut off again.
            io.fail("write", errno.ENOSPC, path="*.log", partial=True)
            io.fail("ftruncate", errno.EIO, times=-1)
            with pytest.raises(grpc.aio.AioRpcError):
                await publish("disk", b"torn" * 100)

            meta = await api.FetchPartitionMetadata(api_pb2.FetchPartitionMetadataRequest(stream="disk"), timeout=5)
            reason = meta.metadata.fenced
            assert "is fenced" in reason and "ENOSPC" in reason and "00000000000000000000.log" in reason
            status = await cluster_pb2_grpc.ClusterStub(channel).Status(cluster_pb2.ClusterStatusRequest())
            assert [(p.stream, p.partition, p.server, p.state) for p in status.fenced] == [("disk", 0, "a", "fenced")]

            # Refused at once with the reason, not after an ack timeout; reads still serve what was whole.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await publish("disk", b"refused")
            assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
            assert "ENOSPC" in (refused.value.details() or "")
            assert await read_all(server.address, "disk") == [b"before"]
            # Other partitions on the same server are untouched.
            assert (await publish("other", b"fine")).ack.offset == 0

            io.clear()  # space freed: the periodic repair brings the partition back
            for _ in range(100):
                meta = await api.FetchPartitionMetadata(api_pb2.FetchPartitionMetadataRequest(stream="disk"), timeout=5)
                if not meta.metadata.fenced:
                    break
                await asyncio.sleep(0.1)
            assert meta.metadata.fenced == ""
            assert (await publish("disk", b"after")).ack.offset == 1
            assert await read_all(server.address, "disk") == [b"before", b"after"]
    finally:
        await server.stop()


async def test_a_partition_the_server_cannot_set_up_is_fenced_and_holds_back_no_other(
    tmp_path: Path, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug (here: intake that cannot start) in one partition used to stall reconcile for every stream."""
    from liftlog.server.partitions.partition import Partition

    real_start = Partition.start_intake
    broken = {"yes": True}

    async def start_intake(self: Partition, nats: object) -> None:
        if self.stream == "buggy" and broken["yes"]:
            raise RuntimeError("intake cannot start")
        await real_start(self, nats)  # type: ignore[arg-type]

    monkeypatch.setattr(Partition, "start_intake", start_intake)
    server = in_process_server(tmp_path / "data", nats_url, f"isolated-{secrets.token_hex(4)}")
    await server.start()
    try:
        assert server.cluster is not None and server.streams is not None
        # Both changes take effect here in time: the broken partition does not hold the server back.
        await asyncio.wait_for(server.cluster.create_stream(CreateStreamRequest("buggy", "buggy")), 10)
        await asyncio.wait_for(server.cluster.create_stream(CreateStreamRequest("fine", "fine")), 10)
        buggy = server.streams.partitions[("buggy", 0)]
        assert buggy.fenced is not None and "intake cannot start" in buggy.fenced
        async with Client(server.address) as client:
            ack = await client.publish("fine", b"ok")
            assert ack is not None and ack.offset == 0
            broken["yes"] = False  # fixed: the retry sets it up
            for _ in range(50):
                if buggy.fenced is None:
                    break
                await asyncio.sleep(0.1)
            assert buggy.fenced is None
            assert (await client.publish("buggy", b"works")).offset == 0
    finally:
        await server.stop()
