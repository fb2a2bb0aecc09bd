"""logging.raft and logging.nats do what their help says: they were once accepted and ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import LiftlogProcess, free_port

pytestmark = pytest.mark.cluster


def server_log(tmp_path: Path, *settings: str) -> str:
    args = ["--embedded-nats", "--embedded-nats-port", str(free_port())]
    args += [arg for setting in settings for arg in ("--set", setting)]
    tmp_path.mkdir()
    server = LiftlogProcess(tmp_path / "data", *args).start()
    try:
        return server.log_path.read_text()
    finally:
        server.stop()


def test_raft_and_nats_logging_show_the_metadata_group_and_the_embedded_nats_server(tmp_path: Path) -> None:
    quiet = server_log(tmp_path / "quiet")
    assert "raft: " not in quiet and "[INF]" not in quiet
    loud = server_log(tmp_path / "loud", "logging.raft=true", "logging.nats=true")
    assert "raft: term " in loud and "raft: applying entries" in loud, "the metadata group's steps"
    assert "nats-server: " in loud and "[INF]" in loud, "the embedded nats-server's banner, at info"
    debug_from = {line.split()[3].rstrip(":") for line in loud.splitlines() if " DEBUG " in line}
    assert debug_from and all(
        name.startswith(
            ("liftlog.server.nats.embedded_nats", "liftlog.server.control.metadata_raft", "liftlog.natswire", "nats")
        )
        for name in debug_from
    ), debug_from
