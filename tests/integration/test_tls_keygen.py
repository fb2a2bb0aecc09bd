"""docs/security.md's TLS walkthrough: certificates from `liftlog keygen --tls`, a server requiring client
certificates, the CLI with and without them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .harness import free_port
from .test_api_tls import TlsServerProcess


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "liftlog.cli.main", *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_the_tls_walkthrough(tmp_path: Path) -> None:
    made = cli(
        "keygen", "--tls", "tls", "--host", "127.0.0.1", "--host", "localhost", "--client-name", "alice", cwd=tmp_path
    )
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in (tmp_path / "tls").iterdir()) == [
        "ca.key",
        "ca.pem",
        "client.key",
        "client.pem",
        "server.key",
        "server.pem",
    ]
    assert (tmp_path / "tls" / "server.key").stat().st_mode & 0o077 == 0, "private keys are the owner's only"
    again = cli("keygen", "--tls", "tls", cwd=tmp_path)
    assert again.returncode == 1 and "exists" in again.stderr

    tls = tmp_path / "tls"
    server = TlsServerProcess(
        tmp_path / "data",
        "--embedded-nats",
        "--embedded-nats-port",
        str(free_port()),
        "--tls-cert",
        str(tls / "server.pem"),
        "--tls-key",
        str(tls / "server.key"),
        "--set",
        "tls.client.auth.enabled=true",
        "--set",
        f"tls.client.auth.ca={tls / 'ca.pem'}",
        bootstrap=None,
    )
    server.start()
    try:
        a = ["-a", server.address]
        with_cert = ["--tls-ca", "tls/ca.pem", "--tls-cert", "tls/client.pem", "--tls-key", "tls/client.key"]
        listed = cli("stream", "list", *a, *with_cert, cwd=tmp_path)
        assert listed.returncode == 0 and "no streams" in listed.stderr, listed.stderr
        without = cli("stream", "list", *a, "--tls-ca", "tls/ca.pem", cwd=tmp_path)
        assert without.returncode == 1 and "client certificate" in without.stderr, without.stderr
    finally:
        server.kill()
