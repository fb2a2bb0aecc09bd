"""A real nats-server per test module, a connection to it per test, and real servers in this process."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient

from liftlog.metadata.controller import CreateStreamRequest
from liftlog.server.config import load_config
from liftlog.server.server import Server
from liftlog.storage import FileIO
from liftlog.storage.faults import FaultyFileIO
from tests.integration.harness import NatsProcess, sets_cluster_auth, shared_cluster_key


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc = NatsProcess(tmp_path_factory.mktemp("nats") / "nats.log")
    yield proc.url
    proc.stop()


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[NatsClient]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()


def in_process_server(
    data_dir: Path,
    nats_url: str,
    namespace: str,
    server_id: str = "a",
    *,
    seed: bool = True,
    file_io: FileIO | None = None,
    **settings: Any,
) -> Server:
    """A real server for this process's event loop (not started), on ``nats_url`` in its own namespace; with
    the tests' shared cluster secret unless ``settings`` say otherwise."""
    if not sets_cluster_auth(settings):
        settings["clustering.auth.key.file"] = str(shared_cluster_key())
    values = {
        "data.dir": str(data_dir),
        "port": 0,
        "nats.servers": nats_url,
        "clustering.server.id": server_id,
        "clustering.namespace": namespace,
        "clustering.raft.bootstrap.seed": seed,
        "clustering.raft.fsync": False,
        **settings,
    }
    config = load_config(None, values, env={})
    return Server(config) if file_io is None else Server(config, file_io=file_io)


async def start_cluster(
    root: Path, nats_url: str, disks: dict[str, FaultyFileIO], timeout: float = 10.0, **settings: Any
) -> dict[str, Server]:
    """Started servers, one per key of ``disks`` (the first founds the cluster), once all have joined."""
    namespace = f"cluster-{secrets.token_hex(4)}"
    servers: dict[str, Server] = {}
    try:
        for i, (sid, disk) in enumerate(disks.items()):
            servers[sid] = in_process_server(
                root / sid, nats_url, namespace, sid, seed=i == 0, file_io=disk, **settings
            )
            await servers[sid].start()
        first = next(iter(servers.values())).cluster
        assert first is not None
        for _ in range(int(timeout * 10)):
            if len(first.metadata.servers) == len(servers):
                return servers
            await asyncio.sleep(0.1)
        raise AssertionError(f"only {sorted(first.metadata.servers)} of {sorted(servers)} joined within {timeout} s")
    except BaseException:
        await stop_all(servers)
        raise


async def replicated_stream(servers: dict[str, Server], name: str) -> tuple[str, str]:
    """Create stream ``name`` (one partition, a replica on every server) through the founding server;
    returns (leader, one follower)."""
    controller = next(iter(servers.values())).cluster
    assert controller is not None
    request = CreateStreamRequest(name, name, replication_factor=len(servers))
    await asyncio.wait_for(controller.create_stream(request), 15)
    leader = controller.metadata.partition(name, 0).leader
    return leader, next(sid for sid in servers if sid != leader)


async def stop_all(servers: dict[str, Server]) -> None:
    for server in servers.values():
        await server.stop()
