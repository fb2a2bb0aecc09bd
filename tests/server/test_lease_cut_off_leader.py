"""A leader cut off from the controller stops acknowledging within its lease, before a successor leads.

The fault is the one the lease exists for, which liveness alone cannot bound: the leader's publishers and
followers still reach it, only the metadata group does not (a split NATS cluster; or its nats-py connection,
which carries Raft and heartbeats, dead while the lean one that carries intake and acks is up). Nothing tells
it that it was replaced, so before the lease it kept writing and acknowledging ack-LEADER messages at offsets
its successor fills with others. All servers run in this process, so one monotonic clock times both leaders.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from liftlog.api import api_pb2
from liftlog.api.envelope import encode_publish_message
from liftlog.metadata import PartitionState
from liftlog.server.server import Server
from liftlog.storage.faults import FaultyFileIO

from .conftest import replicated_stream, start_cluster, stop_all

pytestmark = [pytest.mark.timeout(90), pytest.mark.cluster]

LIVENESS_S = 2.0
LEASE_S = 1.0


class Muted:
    """A NATS client that sends nothing: what the metadata group hears of a server cut off from it."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def publish(self, *args: object, **kwargs: object) -> None:
        return None

    async def request(self, *args: object, **kwargs: object) -> None:
        raise TimeoutError("cut off from the metadata group")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def cut_from_metadata(server: Server) -> None:
    """Deaf and mute to the metadata group (Raft, heartbeats, requests); intake, acks and replication stay."""
    cluster = server.cluster
    assert cluster is not None
    raft = cluster.raft
    assert raft._sub is not None
    await raft._sub.unsubscribe()
    raft._nats = Muted(raft._nats)  # type: ignore[assignment]
    cluster._nats = Muted(cluster._nats)  # type: ignore[assignment]


async def test_a_leader_cut_off_from_the_controller_stops_acking_within_its_lease_before_a_successor_leads(
    tmp_path: Path, nats_url: str, nc: NatsClient
) -> None:
    settings: dict[str, Any] = {
        "clustering.server.liveness.timeout": f"{LIVENESS_S:g}s",
        "clustering.leader.lease.time": f"{LEASE_S:g}s",
        "clustering.replica.max.idle.wait": "500ms",
    }
    servers = await start_cluster(tmp_path, nats_url, {sid: FaultyFileIO() for sid in "abc"}, **settings)
    try:
        controller = servers["a"].cluster
        assert controller is not None
        name, old = "", ""
        for i in range(6):  # a stream led by a server that is not the controller
            old, _ = await replicated_stream(servers, f"s{i}")
            if old != controller.leader_id:
                name = f"s{i}"
                break
        assert name, "every stream was led by the controller"
        leading = servers[old].streams.partitions[(name, 0)]  # type: ignore[union-attr]
        subject = controller.metadata.partition(name, 0).subject

        acks = await nc.subscribe("lease-test.acks")
        stop = asyncio.Event()

        async def publish() -> None:
            i = 0
            while not stop.is_set():
                message = api_pb2.Message(
                    value=b"m%d" % i, ackInbox="lease-test.acks", correlationId=str(i), ackPolicy=api_pb2.LEADER
                )
                with contextlib.suppress(Exception):
                    await nc.publish(subject, encode_publish_message(message))
                i += 1
                await asyncio.sleep(0.005)

        publisher = asyncio.ensure_future(publish())
        await asyncio.sleep(0.5)
        assert leading.newest_offset > 10, "the leader takes writes before the cut"

        await cut_from_metadata(servers[old])
        cut = time.monotonic()
        last_write, written_at = leading.newest_offset, cut
        successor_at: float | None = None
        successor = ""
        while successor_at is None and time.monotonic() - cut < 15:
            await asyncio.sleep(0.01)
            if leading.newest_offset != last_write:
                last_write, written_at = leading.newest_offset, time.monotonic()
            meta = controller.metadata.partition(name, 0)
            if meta.leader != old and meta.state is PartitionState.ONLINE:
                part = servers[meta.leader].streams.partitions[(name, 0)]  # type: ignore[union-attr]
                if part.leader is not None:
                    successor, successor_at = meta.leader, time.monotonic()
        assert successor_at is not None, "no successor was elected"
        await asyncio.sleep(0.5)  # the new leader takes the publishes
        stop.set()
        await publisher
        await acks.unsubscribe()

        assert leading.leader is not None, "the cut-off leader never heard it was replaced"
        stopped_after = written_at - cut
        print(
            f"cut-off leader {old}: last write {stopped_after:.3f} s after the cut, "
            f"successor {successor} leads after {successor_at - cut:.3f} s"
        )
        assert written_at < successor_at, "both leaders took writes at once"
        assert stopped_after <= LEASE_S + 0.3, f"acknowledged {stopped_after:.2f} s after the cut (lease {LEASE_S} s)"
        # The publishes that kept reaching it were held (then dropped when it heard of its successor).
        assert leading.lease_refused + leading.lease_held > 0, "no publish reached it after the lease ran out"
        assert servers[old].streams.lease_lapses == 1  # type: ignore[union-attr]
        new = servers[successor].streams.partitions[(name, 0)]  # type: ignore[union-attr]
        assert new.newest_offset > 0
    finally:
        await stop_all(servers)
