"""MetadataRaft, the asyncio shell of the Raft core: three of them in one event loop over a real nats-server."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from liftlog.raft import NotLeader, Role
from liftlog.server.control.metadata_raft import MetadataRaft, RaftSettings

pytestmark = pytest.mark.slow

_namespaces = itertools.count()
FAST = RaftSettings(tick_seconds=0.02, election_ticks=10, snapshot_threshold=8, fsync=False)


class Log:
    """A state machine that records what it applied."""

    def __init__(self) -> None:
        self.applied: list[bytes] = []
        self.restored_at = 0
        self.roles: list[Role] = []

    def apply(self, index: int, data: bytes) -> object:
        self.applied.append(data)
        return len(self.applied)

    def applied_membership(self, index: int, voters: tuple[str, ...]) -> None:
        pass

    def snapshot(self) -> bytes:
        return b"\n".join(self.applied)

    def restore(self, index: int, data: bytes) -> None:
        self.applied = data.split(b"\n") if data else []
        self.restored_at = index

    def role_changed(self, role: Role, leader: str | None, term: int) -> None:
        self.roles.append(role)


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def group(tmp_path: Path, ids: list[str], namespace: str) -> dict[str, tuple[MetadataRaft, Log]]:
    out = {}
    for i, sid in enumerate(ids):
        sm = Log()
        out[sid] = (
            MetadataRaft(
                server_id=sid,
                directory=tmp_path / sid,
                namespace=namespace,
                settings=FAST,
                state_machine=sm,
                bootstrap_peers=tuple(ids),
                rng=random.Random(i),
            ),
            sm,
        )
    return out


async def test_three_drivers_elect_replicate_snapshot_and_restart(tmp_path: Path, nc: NatsClient) -> None:
    ns = f"drv{next(_namespaces)}"
    nodes = group(tmp_path, ["a", "b", "c"], ns)
    for raft, _ in nodes.values():
        await raft.start(nc)
    try:
        await until(lambda: sum(r.is_leader for r, _ in nodes.values()) == 1)
        leader = next(r for r, _ in nodes.values() if r.is_leader)
        follower = next(r for r, _ in nodes.values() if not r.is_leader)
        with pytest.raises(NotLeader):
            await follower.propose(b"x")
        results = [await leader.propose(b"op%d" % i) for i in range(20)]
        assert [count for _, count in results] == list(range(1, 21))
        assert [index for index, _ in results] == sorted({index for index, _ in results})
        await until(lambda: all(len(sm.applied) == 20 for _, sm in nodes.values()))
        assert all(sm.applied == [b"op%d" % i for i in range(20)] for _, sm in nodes.values())
        # Snapshots were taken (threshold 8) and written to disk.
        assert list((tmp_path / leader.server_id).glob("snapshot-*"))
    finally:
        for raft, _ in nodes.values():
            await raft.stop()

    # A restart recovers from the snapshot plus the log on disk, with nothing lost or applied twice.
    again = group(tmp_path, ["a", "b", "c"], ns)
    for raft, _ in again.values():
        await raft.start(nc)
    try:
        await until(lambda: all(sm.applied == [b"op%d" % i for i in range(20)] for _, sm in again.values()))
        assert all(sm.restored_at > 0 for _, sm in again.values())
        await until(lambda: sum(r.is_leader for r, _ in again.values()) == 1)
    finally:
        for raft, _ in again.values():
            await raft.stop()


async def test_a_lone_founder_leads_at_once_and_a_storage_failure_is_reported(tmp_path: Path, nc: NatsClient) -> None:
    failures: list[BaseException] = []
    sm = Log()
    raft = MetadataRaft(
        server_id="solo",
        directory=tmp_path / "solo",
        namespace=f"drv{next(_namespaces)}",
        settings=RaftSettings(tick_seconds=10, fsync=False),  # no tick will fire: leadership must not need one
        state_machine=sm,
        bootstrap_peers=("solo",),
        on_failure=failures.append,
    )
    await raft.start(nc)
    try:
        await until(lambda: raft.is_leader, 2)
        assert await raft.propose(b"one") == (3, 1)  # after the bootstrap ADD and the leader's NOOP
        storage = raft._storage
        assert storage is not None

        def broken(ready: object) -> None:
            raise OSError(28, "No space left on device")

        storage.save = broken  # type: ignore[method-assign]
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(raft.propose(b"two"), 1)
        assert failures and "No space left" in str(failures[0])
        assert sm.applied == [b"one"]  # nothing applied that was not persisted
    finally:
        await raft.stop()
