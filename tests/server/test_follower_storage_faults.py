"""A follower whose log fails a truncation or an append starts again from what its log holds.

Found by the chaos suite: the follower's core lowers its log end before the shell truncates; when the
truncation failed, the core fetched from below the log's real end and every append was refused as
"below the log end offset" for ever. Two real servers in this process on a real nats-server.
"""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path
from typing import Any

import pytest

from liftlog.client import AckPolicy, Client
from liftlog.server.partitions.partition import Partition
from liftlog.storage import NewRecord
from liftlog.storage.faults import FaultyFileIO

from .conftest import replicated_stream, start_cluster, stop_all

pytestmark = [pytest.mark.timeout(90), pytest.mark.cluster]


async def stored(part: Partition, count: int, timeout: float = 10.0) -> list[tuple[int, bytes]]:
    """(offset, value) of the replica's records, once it holds ``count`` of them (or the timeout passed)."""
    records: list[tuple[int, bytes]] = []
    for _ in range(int(timeout * 10)):
        records = [(r.offset, r.value) for r in part.log.read(0)] if part.log is not None else []
        if len(records) >= count:
            break
        await asyncio.sleep(0.1)
    return records


async def test_a_follower_whose_truncation_failed_converges_once_its_disk_recovers(
    tmp_path: Path, nats_url: str
) -> None:
    disks = {sid: FaultyFileIO() for sid in "ab"}
    servers = await start_cluster(tmp_path, nats_url, disks)
    try:
        _, follower_id = await replicated_stream(servers, "orders")
        async with Client([s.address for s in servers.values()]) as client:
            for i in range(3):
                await client.publish("orders", b"m%d" % i, ack_policy=AckPolicy.ALL)
            follower = servers[follower_id].streams.partitions[("orders", 0)]  # type: ignore[union-attr]
            assert follower.log is not None
            # A tail only this replica has, in an epoch the leader never had (as a deposed leader keeps one).
            follower.log.append([NewRecord(b"divergent-1"), NewRecord(b"divergent-2")], follower.meta.leader_epoch + 1)
            disks[follower_id].fail("ftruncate", errno.EIO, times=-1)
            servers[follower_id].replicator.follow(follower)  # type: ignore[union-attr]  # truncation by epoch
            await asyncio.sleep(1.5)  # it fails, and fails again on every restart
            assert follower.fenced is not None or follower.write_error is not None
            disks[follower_id].clear()
            for i in range(3, 6):
                await client.publish("orders", b"m%d" % i, ack_policy=AckPolicy.LEADER)
            want = [b"m%d" % i for i in range(6)]
            assert await stored(follower, len(want)) == list(enumerate(want))
    finally:
        await stop_all(servers)


async def test_a_follower_fenced_by_a_failed_fsync_rejoins_without_a_hole(tmp_path: Path, nats_url: str) -> None:
    """Found by the chaos suite (seed 16): the repair of a fenced follower log moved its end under a core
    that then fetched from the old end, leaving the follower unable to catch up."""
    disks = {sid: FaultyFileIO() for sid in "ab"}
    settings: dict[str, Any] = {"streams.fsync.policy": "always"}
    servers = await start_cluster(tmp_path, nats_url, disks, **settings)
    try:
        _, follower_id = await replicated_stream(servers, "orders")
        follower = servers[follower_id].streams.partitions[("orders", 0)]  # type: ignore[union-attr]
        async with Client([s.address for s in servers.values()]) as client:
            await client.publish("orders", b"m0", ack_policy=AckPolicy.ALL)
            # The follower's next fsync fails, and so does cutting the unsynced batch back off: it fences.
            disks[follower_id].fail("fsync", errno.EIO, path="*.log")
            disks[follower_id].fail("ftruncate", errno.EIO, times=-1)
            for i in range(1, 4):
                await client.publish("orders", b"m%d" % i, ack_policy=AckPolicy.LEADER)
            for _ in range(50):
                if follower.fenced is not None:
                    break
                await asyncio.sleep(0.1)
            assert follower.fenced is not None and "is fenced" in follower.fenced
            disks[follower_id].clear()
            for i in range(4, 7):
                await client.publish("orders", b"m%d" % i, ack_policy=AckPolicy.LEADER)
            want = [b"m%d" % i for i in range(7)]
            assert await stored(follower, len(want)) == list(enumerate(want))
            assert follower.fenced is None
    finally:
        await stop_all(servers)
