"""Streams an older version committed with names or subjects today's rules refuse must not brick a server.

Older versions let ``.x`` or ``a..b`` (invalid in NATS subjects) and ``>`` (every subject, the cluster's
own traffic included) into the metadata. The entries are injected straight into the Raft log here, as such
a version would have committed them; the server must apply them, skip their partitions with a warning,
and keep taking metadata changes, also after a restart that replays them.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path

import pytest

from liftlog.metadata import CreateStream, PartitionMeta, StreamMeta, StreamSettings
from liftlog.metadata.controller import CreateStreamRequest
from liftlog.server.config import load_config
from liftlog.server.server import Server

LEGACY = [(".x", "legacy-x"), ("a..b", "legacy-ab"), ("wide", ">")]


def _server(data_dir: Path, nats_url: str, namespace: str) -> Server:
    config = load_config(
        None,
        {
            "data.dir": str(data_dir),
            "host": "127.0.0.1",
            "port": 0,
            "nats.servers": nats_url,
            "clustering.server.id": "s1",
            "clustering.namespace": namespace,
            "clustering.raft.bootstrap.seed": True,
            "clustering.raft.fsync": False,
        },
        env={},
    )
    return Server(config)


def _legacy_stream(name: str, subject: str) -> CreateStream:
    stream = StreamMeta(name=name, subject=subject, group="", creation_timestamp=1, settings=StreamSettings())
    stream.partitions[0] = PartitionMeta(name, 0, subject, "s1", ["s1"], ["s1"])
    return CreateStream(stream)


async def _create(server: Server, name: str) -> None:
    assert server.cluster is not None and server.streams is not None
    await asyncio.wait_for(server.cluster.create_stream(CreateStreamRequest(name, name)), 15)
    assert (name, 0) in server.streams.partitions


async def test_legacy_streams_are_skipped_and_metadata_changes_keep_working(
    tmp_path: Path, nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="liftlog.server.partitions.streams")
    namespace = f"legacy-{secrets.token_hex(4)}"
    server = _server(tmp_path / "data", nats_url, namespace)
    await server.start()
    try:
        await _create(server, "before")
        assert server.cluster is not None and server.streams is not None
        for name, subject in LEGACY:
            _, result = await server.cluster._propose(_legacy_stream(name, subject))
            assert not isinstance(result, Exception), result
        await _create(server, "after")
        assert not {name for name, _ in LEGACY} & {key[0] for key in server.streams.partitions}
        for name, _ in LEGACY:
            warnings = [r.getMessage() for r in caplog.records if f"not hosting stream {name!r}" in r.getMessage()]
            assert len(warnings) == 1, warnings  # once, not at every reconcile
            assert "delete it" in warnings[0]
    finally:
        await server.stop()

    # A restart replays the legacy entries from the Raft log.
    server = _server(tmp_path / "data", nats_url, namespace)
    await server.start()
    try:
        assert server.cluster is not None and server.streams is not None
        assert {name for name, _ in LEGACY} <= set(server.cluster.metadata.streams)
        await _create(server, "after-restart")
        for name, _ in LEGACY:
            await asyncio.wait_for(server.cluster.delete_stream(name), 15)
        assert set(server.cluster.metadata.streams) == {"before", "after", "after-restart"}
    finally:
        await server.stop()
