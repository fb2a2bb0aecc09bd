"""Clusters are authenticated unless told otherwise (issue 35): a lone founder makes its secret, a server that
joins (or founds with others) without one refuses to start and says how to fix it, and insecure is explicit."""

from __future__ import annotations

import stat
import time
import urllib.request
from pathlib import Path

import pytest

from liftlog.server.config import ConfigError, load_config

from .harness import LiftlogProcess, NatsProcess, free_port
from .test_cluster import status

pytestmark = pytest.mark.cluster


def server(tmp_path: Path, nats_url: str, sid: str, bootstrap: str | None, *settings: str) -> LiftlogProcess:
    args = ["--namespace", f"secure-{tmp_path.name}"]
    args += [arg for setting in settings for arg in ("--set", setting)]
    return LiftlogProcess(tmp_path / sid, *args, nats_url=nats_url, server_id=sid, bootstrap=bootstrap, test_key=False)


def refusal(proc: LiftlogProcess) -> str:
    with pytest.raises(RuntimeError) as info:
        proc.start()
    return str(info.value)


def test_a_lone_founder_makes_its_secret_and_joiners_need_a_copy(tmp_path: Path, nats_server: NatsProcess) -> None:
    seed = server(tmp_path, nats_server.url, "a", "seed").start()
    try:
        key = tmp_path / "a" / "cluster.key"
        assert key.exists() and stat.S_IMODE(key.stat().st_mode) == 0o600
        assert "wrote a new cluster secret to" in seed.output()
        assert status(seed.address).clusterAuth, "it signs its messages"

        output = refusal(server(tmp_path, nats_server.url, "b", None))
        assert "no cluster secret: this server joins a cluster" in output
        assert "clustering.auth.key.file" in output and "docs/security.md" in output
        assert not (tmp_path / "b" / "cluster.key").exists(), "a joiner never makes a secret of its own"

        joiner = server(tmp_path, nats_server.url, "c", None, f"clustering.auth.key.file={key}").start()
        try:
            for _ in range(100):
                if {s.id for s in status(seed.address).servers} == {"a", "c"}:
                    break
                time.sleep(0.1)
            assert {s.id for s in status(seed.address).servers} == {"a", "c"}
        finally:
            joiner.kill()
        seed.stop()
        seed.start()  # a restart finds its secret in its data directory, and keeps it
        assert status(seed.address).clusterAuth
        assert seed.log_path.read_text().count("wrote a new cluster secret") == 1
    finally:
        seed.kill()


def test_founding_with_others_needs_a_secret(tmp_path: Path, nats_server: NatsProcess) -> None:
    output = refusal(server(tmp_path, nats_server.url, "a", "a,b,c"))
    assert "no cluster secret: this server founds a cluster of 3 servers (clustering.raft.bootstrap.peers)" in output


def test_insecure_is_explicit_and_visible(tmp_path: Path, nats_server: NatsProcess) -> None:
    port = free_port()
    proc = server(
        tmp_path, nats_server.url, "a", "a,b", "clustering.auth.insecure=true", f"metrics.listen=127.0.0.1:{port}"
    )
    proc.start()
    try:
        assert "clustering.auth.insecure: NO CLUSTER SECRET" in proc.output()
        assert not (tmp_path / "a" / "cluster.key").exists()
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "liftlog_cluster_auth_insecure 1.0" in metrics
    finally:
        proc.kill()
    with pytest.raises(ConfigError, match="a cluster secret is configured too"):
        load_config(None, {"clustering.auth.insecure": True, "clustering.auth.key.file": "k"}, env={})


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("clustering.auth.key.file", "clustering.auth.key.file"),
        ("encryption.key.file", "encryption master key"),
        ("tls.cert", "TLS certificate"),
    ],
)
def test_a_missing_secret_stops_the_server_before_it_creates_its_data_directory(
    tmp_path: Path, nats_server: NatsProcess, setting: str, named: str
) -> None:
    """As a first start from an example configuration would: nothing left behind to clean up."""
    settings = [f"{setting}={tmp_path / 'nowhere.key'}"]
    if setting == "tls.cert":
        settings.append(f"tls.key={tmp_path / 'nowhere.key'}")
    proc = server(tmp_path, nats_server.url, "a", "seed", *settings)
    said = refusal(proc)
    assert named in said and "nowhere.key" in said
    assert not (tmp_path / "a").exists(), "the data directory was not created"
