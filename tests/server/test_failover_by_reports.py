"""A leader that stays alive but stops serving its followers is replaced because they report it.

Liveness cannot see this fault: the leader's server keeps heartbeating. Only the
followers' reports (a majority of the in-sync followers, seed 000) can trigger the
election, so this is the one real-cluster test of that path.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from liftlog.client import AckPolicy, Client, StartPosition, StopPosition
from liftlog.metadata import PartitionState
from liftlog.server.partitions.partition import Partition
from liftlog.storage import StorageError
from liftlog.storage.faults import FaultyFileIO

from .conftest import replicated_stream, start_cluster, stop_all

pytestmark = [pytest.mark.timeout(90), pytest.mark.cluster]


async def test_followers_reports_replace_a_leader_that_is_alive_but_serves_no_fetch(
    tmp_path: Path, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings: dict[str, Any] = {
        "clustering.replica.max.leader.timeout": "2s",
        "clustering.replica.max.lag.time": "60s",  # the ISR keeps the followers whose reports count
        "clustering.replica.max.idle.wait": "500ms",
    }
    servers = await start_cluster(tmp_path, nats_url, {sid: FaultyFileIO() for sid in "abc"}, **settings)
    try:
        old_leader, _ = await replicated_stream(servers, "orders")
        controller = next(iter(servers.values())).cluster
        assert controller is not None
        async with Client([s.address for s in servers.values()]) as client:
            for i in range(3):
                await client.publish("orders", b"m%d" % i, ack_policy=AckPolicy.ALL)
            leading = servers[old_leader].streams.partitions[("orders", 0)]  # type: ignore[union-attr]
            real = Partition.serve_fetch

            def unreadable(part: Partition, *args: object, **kwargs: object) -> object:
                if part is leading:
                    raise StorageError("the leader's disk stopped answering reads")
                return real(part, *args, **kwargs)  # type: ignore[arg-type]

            monkeypatch.setattr(Partition, "serve_fetch", unreadable)
            new_leader = old_leader
            for _ in range(150):
                meta = controller.metadata.partition("orders", 0)
                if meta.leader != old_leader and meta.state is PartitionState.ONLINE:
                    new_leader = meta.leader
                    break
                await asyncio.sleep(0.1)
            assert new_leader != old_leader, "the followers' reports did not move the leadership"
            assert controller.metadata.servers[old_leader].alive, "liveness must not be what moved it"
            monkeypatch.setattr(Partition, "serve_fetch", real)
            await client.publish("orders", b"m3", ack_policy=AckPolicy.ALL)
            sub = client.subscribe(
                "orders",
                start_position=StartPosition.EARLIEST,
                stop_position=StopPosition.STOP_OFFSET,
                stop_offset=3,
            )
            async with sub:
                got = [m.value async for m in sub]
            assert got == [b"m0", b"m1", b"m2", b"m3"]
    finally:
        await stop_all(servers)
