"""The example nats-server configurations of docs/security.md, run: liftlog serves through each, and the
users.conf permissions keep an application off the cluster's internal subjects."""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

import nats
import nkeys
import pytest
import trustme

from liftlog.api import api_pb2
from liftlog.api.envelope import decode_ack, encode_publish_message
from liftlog.client import Client

from .harness import LiftlogProcess, NatsProcess

pytestmark = pytest.mark.cluster

EXAMPLES = Path(__file__).parents[2] / "docs" / "examples" / "nats"
NAMESPACE = "liftbridge-default"  # the examples deny the default namespace


def example(name: str) -> str:
    return (EXAMPLES / name).read_text()


async def stores_what_apps_publish(address: str, nats_url: str, name: str, **app: object) -> None:
    """Create a stream, publish to its subject as an application on NATS and read the message back."""
    async with Client(address) as client:
        await client.create_stream(name, name)
        await asyncio.sleep(0.3)  # the partition subscribes to its subject
        app_conn = await nats.connect(nats_url, **app)
        await app_conn.publish(name, b"from an app")
        await app_conn.flush()
        await app_conn.close()
        for _ in range(100):
            values = [bytes(v) for cols in [c async for c in client.read_range(name)] for v in cols.values]
            if values:
                assert values == [b"from an app"]
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the application's message was not stored")


def user_passwords() -> dict[str, str]:
    """What users.conf reads from nats-server's environment (liftlog reads the first two too)."""
    return {
        name: secrets.token_hex(8)
        for name in ("LIFTLOG_NATS_PASSWORD", "LIFTLOG_NATS_ACKS_PASSWORD", "APP_NATS_PASSWORD")
    }


def started(tmp_path: Path, nats_url: str, *settings: str, env: dict[str, str] | None = None) -> LiftlogProcess:
    args = [arg for setting in settings for arg in ("--set", setting)]
    return LiftlogProcess(tmp_path / "data", *args, nats_url=nats_url, env=env).start()


def fails_to_start(tmp_path: Path, nats_url: str, *settings: str) -> str:
    with pytest.raises(RuntimeError) as info:
        started(tmp_path, nats_url, *settings)
    return str(info.value)


async def test_users_keep_applications_off_internal_subjects(tmp_path: Path) -> None:
    passwords = user_passwords()
    nats_server = NatsProcess(tmp_path / "nats.log", example("users.conf"), env=passwords)
    server = started(
        tmp_path, nats_server.url, "nats.user=liftlog", f"nats.password={passwords['LIFTLOG_NATS_PASSWORD']}"
    )
    try:
        app = {"user": "app", "password": passwords["APP_NATS_PASSWORD"]}
        await stores_what_apps_publish(server.address, nats_server.url, "orders", **app)

        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        conn = await nats.connect(nats_server.url, error_cb=on_error, **app)
        await conn.subscribe(f"{NAMESPACE}.>")
        await conn.publish(f"{NAMESPACE}.raft.metadata.join", b'{"id": null}')
        await conn.publish("_INBOX.liftlog.x.y", b"forged ack")
        await conn.flush()
        for _ in range(50):
            if len(errors) >= 3:
                break
            await asyncio.sleep(0.05)
        await conn.close()
        text = " ".join(errors).lower()
        assert "permissions violation for subscription" in text
        assert text.count("permissions violation for publish") == 2
    finally:
        server.kill()
        nats_server.stop()


async def test_acks_to_clients_go_out_with_the_acks_users_rights_only(tmp_path: Path) -> None:
    passwords = user_passwords()
    nats_server = NatsProcess(tmp_path / "nats.log", example("users.conf"), env=passwords)
    server = started(
        tmp_path,
        nats_server.url,
        "nats.user=liftlog",
        f"nats.password={passwords['LIFTLOG_NATS_PASSWORD']}",
        "nats.acks.user=liftlog-acks",
        f"nats.acks.password={passwords['LIFTLOG_NATS_ACKS_PASSWORD']}",
    )
    app = await nats.connect(nats_server.url, user="app", password=passwords["APP_NATS_PASSWORD"])
    try:
        async with Client(server.address) as client:
            await client.create_stream("orders", "orders")
            await asyncio.sleep(0.3)  # the partition subscribes to its subject
            inbox = app.new_inbox()
            # Not reserved and no stream listens on it, so liftlog's own checks let it through; the app may
            # read it but the acks user may not publish there.
            elsewhere = "payments.commands"
            acks = await app.subscribe(inbox)
            misdirected = await app.subscribe(elsewhere)
            await app.flush()
            for n, target in enumerate((elsewhere, inbox)):
                envelope = api_pb2.Message(
                    value=b"m%d" % n, ackInbox=target, correlationId=str(n), ackPolicy=api_pb2.LEADER
                )
                await app.publish("orders", encode_publish_message(envelope))
            ack = decode_ack((await acks.next_msg(timeout=10)).data)
            assert (ack.correlationId, ack.offset) == ("1", 1)
            with pytest.raises(nats.errors.TimeoutError):
                await misdirected.next_msg(timeout=0.5)
            # Stored all the same: the ack is what NATS refused, not the message.
            values = [bytes(v) for cols in [c async for c in client.read_range("orders")] for v in cols.values]
            assert values == [b"m0", b"m1"]
            # A gRPC call naming its own inbox gets its copy on the acks connection too.
            answer = await client.publish("orders", b"rpc", ack_inbox=inbox, correlation_id="rpc")
            copy = decode_ack((await acks.next_msg(timeout=10)).data)
            assert answer is not None
            assert (copy.correlationId, copy.offset) == ("rpc", answer.offset) == ("rpc", 2)
        log = server.log_path.read_text()
        assert "NATS refused an ack to a client's inbox" in log and elsewhere in log
    finally:
        await app.close()
        server.kill()
        nats_server.stop()


async def test_a_wrong_acks_password_fails_the_start_clearly(tmp_path: Path) -> None:
    passwords = user_passwords()
    nats_server = NatsProcess(tmp_path / "nats.log", example("users.conf"), env=passwords)
    try:
        output = fails_to_start(
            tmp_path,
            nats_server.url,
            "nats.user=liftlog",
            f"nats.password={passwords['LIFTLOG_NATS_PASSWORD']}",
            "nats.acks.user=liftlog-acks",
            "nats.acks.password=wrong",
        )
        assert "as nats.acks.user" in output and "authorization" in output.lower()
    finally:
        nats_server.stop()


async def test_a_wrong_nats_password_fails_the_start_clearly(tmp_path: Path) -> None:
    passwords = {**user_passwords(), "LIFTLOG_NATS_PASSWORD": "right-password"}
    nats_server = NatsProcess(tmp_path / "nats.log", example("users.conf"), env=passwords)
    try:
        output = fails_to_start(tmp_path, nats_server.url, "nats.user=liftlog", "nats.password=wrong")
        assert "cannot connect to NATS" in output and "authorization" in output.lower()
    finally:
        nats_server.stop()


async def test_token(tmp_path: Path) -> None:
    token = secrets.token_hex(16)
    nats_server = NatsProcess(tmp_path / "nats.log", example("token.conf"), env={"NATS_TOKEN": token})
    server = started(tmp_path, nats_server.url, env={"LIFTLOG_NATS_TOKEN": token})
    try:
        await stores_what_apps_publish(server.address, nats_server.url, "orders", token=token)
    finally:
        server.kill()
        nats_server.stop()


async def test_nkeys(tmp_path: Path) -> None:
    seeds = {who: nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER) for who in ("liftlog", "app")}
    public = {who: nkeys.from_seed(bytearray(seed)).public_key.decode() for who, seed in seeds.items()}
    files = {}
    for who, seed in seeds.items():
        files[who] = tmp_path / f"{who}.nk"
        files[who].write_bytes(seed)
    env = {"LIFTLOG_NKEY": public["liftlog"], "APP_NKEY": public["app"]}
    nats_server = NatsProcess(tmp_path / "nats.log", example("nkeys.conf"), env=env)
    server = started(tmp_path, nats_server.url, f"nats.nkey.seed={files['liftlog']}")
    try:
        await stores_what_apps_publish(server.address, nats_server.url, "orders", nkeys_seed=str(files["app"]))
    finally:
        server.kill()
        nats_server.stop()


async def test_tls_to_nats_with_client_certificates(tmp_path: Path) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    paths = {}
    for who in ("nats", "liftlog", "app"):
        cert = ca.issue_cert("127.0.0.1", "localhost") if who == "nats" else ca.issue_cert(f"{who}.example")
        paths[who] = (tmp_path / f"{who}.pem", tmp_path / f"{who}.key")
        cert.cert_chain_pems[0].write_to_path(str(paths[who][0]))
        cert.private_key_pem.write_to_path(str(paths[who][1]))
    env = {"NATS_TLS_CERT": str(paths["nats"][0]), "NATS_TLS_KEY": str(paths["nats"][1]), "NATS_TLS_CA": str(ca_file)}
    nats_server = NatsProcess(tmp_path / "nats.log", example("tls.conf"), env=env)
    try:
        output = fails_to_start(tmp_path, nats_server.url, f"nats.tls.ca={ca_file}")
        assert "cannot connect to NATS" in output
        server = started(
            tmp_path,
            nats_server.url,
            f"nats.tls.ca={ca_file}",
            f"nats.tls.cert={paths['liftlog'][0]}",
            f"nats.tls.key={paths['liftlog'][1]}",
        )
        try:
            import ssl

            context = ssl.create_default_context(cafile=str(ca_file))
            context.load_cert_chain(str(paths["app"][0]), str(paths["app"][1]))
            await stores_what_apps_publish(server.address, nats_server.url, "orders", tls=context)
        finally:
            server.kill()
    finally:
        nats_server.stop()


async def test_embedded_nats_with_the_users_example(tmp_path: Path) -> None:
    # One environment for both: nats-server reads $LIFTLOG_NATS_PASSWORD in users.conf, liftlog reads the same
    # variable as nats.password.
    env = {
        "LIFTLOG_NATS_USER": "liftlog",
        "LIFTLOG_NATS_ACKS_USER": "liftlog-acks",
        **user_passwords(),
    }
    from .harness import free_port

    port = free_port()
    server = LiftlogProcess(
        tmp_path / "data",
        "--embedded-nats",
        "--embedded-nats-port",
        str(port),
        "--set",
        f"nats.embedded.config={EXAMPLES / 'users.conf'}",
        env=env,
    ).start()
    try:
        app = {"user": "app", "password": env["APP_NATS_PASSWORD"]}
        await stores_what_apps_publish(server.address, f"nats://127.0.0.1:{port}", "orders", **app)
        with pytest.raises(Exception, match=r"(?i)authorization"):
            await nats.connect(f"nats://127.0.0.1:{port}", max_reconnect_attempts=0, allow_reconnect=False)
    finally:
        server.kill()
