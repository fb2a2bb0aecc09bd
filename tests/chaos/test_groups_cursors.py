"""Issue 16: cursors and a consumer group under the chaos workload, through a server crash.

Alongside the producers (ack ALL on a 2-partition, rf=3 stream), a cursor writer moves a few cursors
forward and records every SetCursor that was acknowledged, and a two-member consumer group (our client's
``Consumer``) processes the stream and checkpoints. The server that coordinates the group and leads a
cursor partition is killed and later restarted. Checked afterwards, besides the usual data invariants:

- no acknowledged cursor is lost: each reads back at least its last acknowledged value and at most the
  last value tried (a SetCursor without an answer may or may not have been stored);
- the group processed every acknowledged message (at least once, nothing skipped), and each partition
  changed hands only at rebalances, never message by message as two concurrent readers would make it.
"""

from __future__ import annotations

import asyncio
import threading
import time
import zlib
from pathlib import Path

import grpc
import pytest

from liftlog.api import api_pb2
from liftlog.client import Client, StartPosition
from tests.integration.harness import NatsProcess

from .checker import Workload
from .cluster import ChaosCluster
from .test_scenarios import ENOUGH, PARTITIONS, STREAM, finish, full_isr

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(150)]

CURSORS = ("alpha", "beta", "gamma", "delta")


class CursorWriter:
    """A thread that sets each cursor to 1, 2, 3, ... on its partition's leader, recording the outcomes."""

    def __init__(self, cluster: ChaosCluster) -> None:
        self.cluster = cluster
        self.acked: dict[str, int] = {}
        self.tried: dict[str, int] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cursors", daemon=True)

    def start(self) -> CursorWriter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)

    def _leader(self, cursor: str) -> str | None:
        pid = zlib.crc32(f"{cursor},{STREAM},0".encode()) % 2
        return self.cluster.leader("__cursors", pid)

    def _run(self) -> None:
        value = 0
        while not self._stop.is_set():
            value += 1
            for cursor in CURSORS:
                self.tried[cursor] = value
                leader = self._leader(cursor)
                if leader is None:
                    continue
                req = api_pb2.SetCursorRequest(stream=STREAM, partition=0, cursorId=cursor, offset=value)
                try:
                    self.cluster.api(leader).SetCursor(req, timeout=3)
                except grpc.RpcError:
                    continue  # not the leader any more, or no answer: stored or not
                except Exception as exc:
                    self.errors.append(repr(exc))
                    continue
                self.acked[cursor] = value
            time.sleep(0.02)

    def read(self, cursor: str) -> int:
        leader = self._leader(cursor)
        assert leader is not None
        req = api_pb2.FetchCursorRequest(stream=STREAM, partition=0, cursorId=cursor)
        return int(self.cluster.api(leader).FetchCursor(req, timeout=5).offset)


class GroupReaders:
    """Two members of one consumer group in a thread of their own, recording what each processed."""

    def __init__(self, cluster: ChaosCluster) -> None:
        self.cluster = cluster
        self.events: list[tuple[str, int, int]] = []  # (member, partition, offset), in processing order
        self.coordinators: set[str] = set()
        self.errors: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(),), daemon=True)

    def start(self) -> GroupReaders:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def processed(self, partition: int) -> set[int]:
        return {o for _, p, o in list(self.events) if p == partition}

    def runs(self, partition: int) -> list[str]:
        out: list[str] = []
        for member, p, _ in list(self.events):
            if p == partition and (not out or out[-1] != member):
                out.append(member)
        return out

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        addresses = [self.cluster.address(sid) for sid in self.cluster.ids]
        try:
            async with Client(addresses, timeout=5) as client:
                members = [
                    client.consumer(
                        "chaos", [STREAM], consumer_id=name, auto_checkpoint=0.5, start_position=StartPosition.EARLIEST
                    )
                    for name in ("m1", "m2")
                ]
                for member in members:
                    await member.start()
                tasks = [asyncio.create_task(self._consume(m)) for m in members]
                await self._stop.wait()
                for task in tasks:
                    task.cancel()
                for member in members:
                    self.coordinators.add(member.coordinator)
                    await member.close()
        except Exception as exc:
            self.errors.append(repr(exc))

    async def _consume(self, member: object) -> None:
        async for msg in member:  # type: ignore[attr-defined]
            self.events.append((member.consumer_id, msg.partition, msg.offset))  # type: ignore[attr-defined]
            await asyncio.sleep(0.001)


def group_coordinator(cluster: ChaosCluster) -> str:
    def ask() -> str | None:
        for sid in cluster.reachable():
            try:
                resp = cluster.api(sid).FetchMetadata(api_pb2.FetchMetadataRequest(groups=["chaos"]), timeout=2)
            except grpc.RpcError:
                continue
            if resp.groupMetadata and resp.groupMetadata[0].coordinator:
                return resp.groupMetadata[0].coordinator
        return None

    found: str = cluster.eventually(ask, 20, "the group's coordinator")
    return found


@pytest.fixture
def cluster(tmp_path: Path, nats_server: NatsProcess) -> object:
    settings = ("cursors.stream.partitions=2", "groups.consumer.timeout=3s", "groups.coordinator.timeout=3s")
    with ChaosCluster(tmp_path, nats_server, *(a for s in settings for a in ("--set", s))) as c:
        c.start()
        c.create_stream(STREAM, partitions=PARTITIONS, rf=3)
        c.eventually(lambda: c.leader("__cursors", 1) is not None, 30, "__cursors created")
        yield c


def test_cursors_and_a_group_survive_a_killed_coordinator(cluster: ChaosCluster) -> None:
    workload = Workload(cluster, STREAM, PARTITIONS).start()
    cursors = CursorWriter(cluster).start()
    group = GroupReaders(cluster).start()
    try:
        workload.wait_acked(ENOUGH, after=0)
        cluster.eventually(lambda: len(cursors.acked) == len(CURSORS), 20, "every cursor set once")
        victim = group_coordinator(cluster)
        cluster.kill(victim)
        killed_at = time.monotonic()
        workload.wait_acked(ENOUGH, after=killed_at, timeout=30)
        time.sleep(6)  # past the group timeouts: members report a dead coordinator, the group moves on
        cluster.restart(victim)
        full_isr(cluster)
    finally:
        cursors.stop()
    finish(cluster, workload, time.monotonic())

    for cursor in CURSORS:
        stored = cursors.read(cursor)
        assert cursors.acked[cursor] <= stored <= cursors.tried[cursor], (cursor, stored, cursors.acked)
    assert cursors.errors == []

    acked = {p: {a.offset for pub in workload.publications if pub.partition == p and (a := pub.ack)} for p in (0, 1)}
    deadline = time.monotonic() + 40
    while any(not acked[p] <= group.processed(p) for p in (0, 1)):
        assert time.monotonic() < deadline, {p: sorted(acked[p] - group.processed(p))[:5] for p in (0, 1)}
        time.sleep(0.5)
    group.stop()
    assert group.errors == []
    assert victim not in group.coordinators  # the members moved the group to a live coordinator
    for p in (0, 1):
        assert len(group.runs(p)) <= 6, (p, group.runs(p))
