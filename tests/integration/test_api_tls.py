"""TLS and mTLS on the gRPC API, end to end: our client, the CLI, grpcio, certificate reload, and the
errors a user gets for each way to get it wrong."""

from __future__ import annotations

import asyncio
import datetime as dt
import shutil
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme
from click.testing import CliRunner

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.cli.main import main
from liftlog.client import Client, TlsConfig, TlsError, UnavailableError

from .harness import LiftlogProcess, NatsProcess

pytestmark = pytest.mark.cluster


@dataclass
class Pki:
    root: Path
    ca: trustme.CA

    @property
    def ca_file(self) -> str:
        return str(self.root / "ca.pem")

    def issue(self, name: str, *hosts: str, expired: bool = False) -> tuple[str, str]:
        """A certificate and key for ``hosts`` (default 127.0.0.1 and localhost), written as <name>.pem/.key."""
        kwargs: dict[str, Any] = {}
        if expired:
            kwargs = {
                "not_before": dt.datetime(2019, 1, 1, tzinfo=dt.UTC),
                "not_after": dt.datetime(2020, 1, 1, tzinfo=dt.UTC),
            }
        cert = self.ca.issue_cert(*(hosts or ("127.0.0.1", "localhost")), **kwargs)
        pem, key = self.root / f"{name}.pem", self.root / f"{name}.key"
        cert.cert_chain_pems[0].write_to_path(str(pem))
        cert.private_key_pem.write_to_path(str(key))
        return str(pem), str(key)


def make_pki(root: Path) -> Pki:
    root.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(root / "ca.pem"))
    return Pki(root, ca)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


class TlsServerProcess(LiftlogProcess):
    """Ready once its port accepts connections: the server listens only when it serves, and the
    harness's own probe speaks plain text."""

    def _answers(self) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0


def tls_server(root: Path, nats: NatsProcess, cert: tuple[str, str], *settings: str) -> LiftlogProcess:
    args = ["--tls-cert", cert[0], "--tls-key", cert[1], "--set", "tls.reload.interval=200ms"]
    for setting in settings:
        args += ["--set", setting]
    return TlsServerProcess(root / "data", *args, nats_url=nats.url).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, nats_server: NatsProcess, pki: Pki) -> Iterator[LiftlogProcess]:
    proc = tls_server(tmp_path_factory.mktemp("tls"), nats_server, pki.issue("server"))
    yield proc
    proc.kill()


async def metadata(address: str, tls: object, **kwargs: object) -> object:
    async with Client(address, tls=tls, retries=0, timeout=5, **kwargs) as client:  # type: ignore[arg-type]
        return await client.fetch_metadata()


async def round_trip(address: str, tls: TlsConfig, name: str) -> None:
    async with Client(address, tls=tls) as client:
        await client.create_stream(name, name)
        ack = await client.publish(name, b"over TLS")
        assert ack is not None and ack.offset == 0
        async for columns in client.read_range(name):
            assert [bytes(v) for v in columns.values] == [b"over TLS"]


async def test_our_client_publishes_and_reads_over_tls(server: LiftlogProcess, pki: Pki) -> None:
    await round_trip(server.address, TlsConfig(ca=pki.ca_file), "tls-orders")


async def test_grpcio_with_tls_against_the_server(server: LiftlogProcess, pki: Pki) -> None:
    credentials = grpc.ssl_channel_credentials(root_certificates=Path(pki.ca_file).read_bytes())
    async with grpc.aio.secure_channel(server.address, credentials) as channel:
        reply = await api_pb2_grpc.APIStub(channel).FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=10)
    assert reply.brokers


async def test_wrong_ca(server: LiftlogProcess, tmp_path: Path) -> None:
    other = make_pki(tmp_path / "other")
    with pytest.raises(TlsError, match=r"not trusted.*--tls-ca"):
        await metadata(server.address, TlsConfig(ca=other.ca_file))
    with pytest.raises(TlsError, match="not trusted"):
        await metadata(server.address, True)  # the system's CAs do not know our test CA


async def test_name_mismatch(server: LiftlogProcess, pki: Pki) -> None:
    with pytest.raises(TlsError, match=r"not valid for the name 'db\.example\.com'"):
        await metadata(server.address, TlsConfig(ca=pki.ca_file, server_name="db.example.com"))


async def test_plain_client_against_a_tls_server(server: LiftlogProcess) -> None:
    with pytest.raises(UnavailableError, match=r"if it serves TLS, connect with TLS"):
        await metadata(server.address, None)


async def test_tls_client_against_a_plain_server(nats_server: NatsProcess, tmp_path: Path, pki: Pki) -> None:
    plain = LiftlogProcess(tmp_path / "data", nats_url=nats_server.url).start()
    try:
        with pytest.raises(TlsError, match="does not speak TLS"):
            await metadata(plain.address, TlsConfig(ca=pki.ca_file))
    finally:
        plain.kill()


async def test_bad_client_files_fail_before_connecting(pki: Pki, tmp_path: Path) -> None:
    from liftlog.client import ConfigurationError

    with pytest.raises(ConfigurationError, match="cannot load the TLS CA file"):
        Client("127.0.0.1:1", tls=TlsConfig(ca=str(tmp_path / "missing.pem")))
    with pytest.raises(ConfigurationError, match="needs its certificate"):
        TlsConfig(key="k.pem")


async def test_expired_server_certificate(nats_server: NatsProcess, tmp_path: Path, pki: Pki) -> None:
    proc = tls_server(tmp_path, nats_server, pki.issue("expired", expired=True))
    try:
        with pytest.raises(TlsError, match="not valid now: certificate has expired"):
            await metadata(proc.address, TlsConfig(ca=pki.ca_file))
    finally:
        proc.kill()


async def test_mtls_requires_a_client_certificate_from_the_ca(
    nats_server: NatsProcess, tmp_path: Path, pki: Pki
) -> None:
    proc = tls_server(
        tmp_path,
        nats_server,
        pki.issue("mtls-server"),
        "tls.client.auth.enabled=true",
        f"tls.client.auth.ca={pki.ca_file}",
    )
    try:
        with pytest.raises(UnavailableError, match="requires client certificates"):
            await metadata(proc.address, TlsConfig(ca=pki.ca_file))
        stranger = make_pki(tmp_path / "stranger")
        cert, key = stranger.issue("client", "client.example")
        with pytest.raises((UnavailableError, TlsError)):
            await metadata(proc.address, TlsConfig(ca=pki.ca_file, cert=cert, key=key))
        cert, key = pki.issue("client", "client.example")
        await round_trip(proc.address, TlsConfig(ca=pki.ca_file, cert=cert, key=key), "mtls-orders")
    finally:
        proc.kill()


async def test_a_renewed_certificate_serves_new_connections_without_a_restart(
    nats_server: NatsProcess, tmp_path: Path, pki: Pki
) -> None:
    cert, key = pki.issue("renewed")
    proc = tls_server(tmp_path, nats_server, (cert, key))
    try:
        async with Client(proc.address, tls=TlsConfig(ca=pki.ca_file)) as before:
            await before.fetch_metadata()
            # The operator renews the certificate from another CA, in place.
            successor = make_pki(tmp_path / "successor")
            new_cert, new_key = successor.issue("next")
            shutil.copy(new_key, key)
            shutil.copy(new_cert, cert)
            for _ in range(100):
                try:
                    await metadata(proc.address, TlsConfig(ca=successor.ca_file))
                    break
                except (TlsError, UnavailableError):
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("the renewed certificate was not served")
            with pytest.raises(TlsError, match="not trusted"):
                await metadata(proc.address, TlsConfig(ca=pki.ca_file))
            await before.fetch_metadata()  # a connection made before the renewal keeps working
        assert proc.proc is not None and proc.proc.poll() is None
        assert "reloaded the API's TLS certificate" in proc.output()
    finally:
        proc.kill()


def test_the_cli_talks_tls(server: LiftlogProcess, pki: Pki) -> None:
    clean = {"LIFTLOG_ADDR": None, "LIFTLOG_CLIENT_TLS_CA": None}
    ok = CliRunner(env=clean).invoke(main, ["-a", server.address, "--tls-ca", pki.ca_file, "stream", "list"])
    assert ok.exit_code == 0, ok.output
    by_env = CliRunner(env={"LIFTLOG_ADDR": server.address, "LIFTLOG_CLIENT_TLS_CA": pki.ca_file}).invoke(
        main, ["stream", "list"]
    )
    assert by_env.exit_code == 0, by_env.output
    other = make_pki(pki.root / "cli-other")
    bad = CliRunner(env=clean).invoke(main, ["-a", server.address, "--tls-ca", other.ca_file, "stream", "list"])
    assert bad.exit_code == 1
    assert "error: TLS: the certificate of" in bad.stderr and "not trusted" in bad.stderr
    assert "Traceback" not in bad.output


def test_a_context_of_ones_own_works_too(server: LiftlogProcess, pki: Pki) -> None:
    context = ssl.create_default_context(cafile=pki.ca_file)
    context.set_alpn_protocols(["h2"])
    assert asyncio.run(metadata(server.address, context))
