"""A leader whose log fences itself hands the partition to an in-sync replica: publishes keep working.

Three real servers in this process on a real nats-server, each with its own FaultyFileIO.
"""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import pytest

from liftlog.client import AckPolicy, Client
from liftlog.storage.faults import FaultyFileIO

from .conftest import replicated_stream, start_cluster, stop_all

pytestmark = [pytest.mark.timeout(90), pytest.mark.cluster]


async def test_a_fenced_leader_hands_over_to_an_in_sync_replica(tmp_path: Path, nats_url: str) -> None:
    disks = {sid: FaultyFileIO() for sid in "abc"}
    servers = await start_cluster(tmp_path, nats_url, disks)
    try:
        controller = servers["a"].cluster
        assert controller is not None
        old, _ = await replicated_stream(servers, "orders")
        async with Client([s.address for s in servers.values()]) as client:
            first = await client.publish("orders", b"m0", ack_policy=AckPolicy.ALL)
            assert first is not None and first.offset == 0
            # The leader's disk fails mid-write and the torn bytes cannot be cut off.
            disks[old].fail("write", errno.ENOSPC, path="*.log", partial=True)
            disks[old].fail("ftruncate", errno.EIO, times=-1)
            with pytest.raises(Exception):  # noqa: B017 - refused (UNKNOWN ack) or unavailable: not acknowledged
                await client.publish("orders", b"torn", ack_policy=AckPolicy.ALL)
            for _ in range(150):
                meta = controller.metadata.partition("orders", 0)
                if meta.leader != old and meta.state.value == "online":
                    break
                await asyncio.sleep(0.1)
            assert meta.leader != old, "leadership stayed with the fenced replica"
            # The client finds the new leader; nothing acknowledged was lost.
            ack = await client.publish("orders", b"m1", ack_policy=AckPolicy.ALL)
            assert ack is not None and ack.offset == 1
            status = await client.cluster_status()
            assert [(p.stream, p.server) for p in status.fenced] == [("orders", old)]
            disks[old].clear()  # the old leader's disk recovers: it repairs and follows again
            for _ in range(150):
                part = servers[old].streams.partitions[("orders", 0)]  # type: ignore[union-attr]
                if part.fenced is None and part.log is not None and part.log.log_end_offset == 2:
                    break
                await asyncio.sleep(0.1)
            assert part.fenced is None
            assert part.log is not None
            assert [r.value for r in part.log.read(0)] == [b"m0", b"m1"]
    finally:
        await stop_all(servers)
