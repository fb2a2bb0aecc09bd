"""Encryption at rest with real servers: ciphertext on every replica's disk, clear records through every read,
failover, a missing or wrong master key failing clearly, and key rotation by restart and by SIGHUP."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.client import AckPolicy, Client, ClusterStatus, EncryptionFailedError, StartPosition, StopPosition
from liftlog.security.master_key import ENV_VAR, generate_master_key_file, parse_master_key
from liftlog.storage.encryption import MasterKey

from .harness import LiftlogProcess, NatsProcess, eventually
from .test_cluster import Cluster, agreed, formed, rpc

SECRET = b"pan-4111111111111111"
LIFTBRIDGE_KEY = "t7w!z%C*F-JaNcRf"  # a key as Liftbridge's documentation gives one: 16 bytes of text


def on_disk(data_dir: Path, stream: str) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((data_dir / "streams" / stream).rglob("*.log")))


def create_encrypted(address: str, name: str, rf: int = 1) -> None:
    """Liftbridge's wire: CreateStreamRequest.encryption (field 18), as its clients send it."""
    rpc(
        address,
        "CreateStream",
        api_pb2.CreateStreamRequest(
            name=name, subject=name, replicationFactor=rf, encryption=api_pb2.NullableBool(value=True)
        ),
    )


def publish(address: str, stream: str, values: list[bytes]) -> list[int]:
    with grpc.insecure_channel(address) as channel:
        api = api_pb2_grpc.APIStub(channel)
        return [
            api.Publish(api_pb2.PublishRequest(stream=stream, value=v, ackPolicy=api_pb2.ALL), timeout=10).ack.offset
            for v in values
        ]


def subscribe_values(address: str, stream: str, replica: bool = True) -> list[bytes]:
    """Every committed message, one gRPC message per record (the path Liftbridge's clients take)."""
    with grpc.insecure_channel(address) as channel:
        req = api_pb2.SubscribeRequest(
            stream=stream, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST, readISRReplica=replica
        )
        return [m.value for m in api_pb2_grpc.APIStub(channel).Subscribe(req, timeout=10)][1:]


async def client_reads(address: str, stream: str) -> tuple[list[bytes], list[bytes]]:
    """(a batched subscription's values, the Fetch API's values): both decrypted by the server."""
    async with Client(address) as client:
        sub = client.subscribe(stream, start_position=StartPosition.EARLIEST, stop_position=StopPosition.STOP_LATEST)
        subscribed = [m.value async for m in sub]
        fetched: list[bytes] = []
        async for cols in client.read_range(stream):
            fetched += cols.values
    return subscribed, fetched


@pytest.mark.slow
@pytest.mark.cluster
def test_an_encrypted_stream_is_ciphertext_on_every_replica_and_survives_failover(
    tmp_path: Path, nats_server: NatsProcess
) -> None:
    key_file = tmp_path / "master.key"
    generate_master_key_file(key_file)
    c = Cluster(tmp_path, nats_server.url)
    ids = ["a", "b", "c"]
    for sid in ids:
        c.add(
            sid,
            ",".join(ids),
            "--set",
            f"encryption.key.file={key_file}",
            "--set",
            "clustering.replica.max.lag.time=2s",
        )
    try:
        c.start_all()
        formed(c, set(ids))

        async def status() -> ClusterStatus:
            async with Client(c.servers["a"].address) as client:
                return await client.cluster_status()

        key_id = parse_master_key(key_file.read_text(), "test").id.hex()
        seen = asyncio.run(status())
        assert sorted(seen.encryption_keys) == [(sid, (key_id,)) for sid in ids] and not seen.encryption_keys_differ
        create_encrypted(c.servers["a"].address, "vault", rf=3)
        leader = eventually(lambda: agreed(c, "vault")["vault"][0][0] or None, 20, "a leader")
        first = [SECRET + b"-%d" % i for i in range(20)]
        assert publish(c.servers[leader].address, "vault", first) == list(range(20))

        async def batched_publish() -> None:  # records arrive encoded: the leader seals and encrypts them as they are
            async with Client(c.servers[leader].address) as client:
                await client.publish_many(
                    "vault", [SECRET + b"-many-%d" % i for i in range(30)], ack_policy=AckPolicy.ALL
                )

        asyncio.run(batched_publish())
        everything = first + [SECRET + b"-many-%d" % i for i in range(30)]
        for sid in ids:

            def replicated(sid: str = sid) -> bool | None:
                return subscribe_values(c.servers[sid].address, "vault") == everything or None

            assert eventually(replicated, 15, sid)
        assert asyncio.run(client_reads(c.servers[leader].address, "vault")) == (everything, everything)
        for sid in ids:
            stored = on_disk(c.servers[sid].data_dir, "vault")
            assert len(stored) > 50 * len(SECRET) and SECRET not in stored, f"{sid} stores the records in clear"

        c.servers[leader].kill()
        new = eventually(lambda: ((v := agreed(c, "vault")["vault"][0][0]) != leader and v) or None, 20, "a new leader")
        assert publish(c.servers[new].address, "vault", [SECRET + b"-after"]) == [50]
        assert subscribe_values(c.servers[new].address, "vault", replica=False) == [*everything, SECRET + b"-after"]

        c.servers[leader].start()  # the old leader catches up from the new one, ciphertext as it is stored there
        assert eventually(
            lambda: subscribe_values(c.servers[leader].address, "vault") == [*everything, SECRET + b"-after"] or None,
            20,
            "the old leader caught up",
        )
        assert SECRET not in on_disk(c.servers[leader].data_dir, "vault")
    finally:
        c.stop_all()


def test_an_encrypted_stream_needs_a_master_key(tmp_path: Path, nats_server: NatsProcess) -> None:
    proc = LiftlogProcess(tmp_path / "nokey", nats_url=nats_server.url, server_id="nokey").start()
    try:
        with pytest.raises(grpc.RpcError) as info:
            create_encrypted(proc.address, "nokey")
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "no encryption master key" in (info.value.details() or "")
        assert "LIFTBRIDGE_ENCRYPTION_KEY" in (info.value.details() or "")
    finally:
        proc.kill()

    bad = LiftlogProcess(
        tmp_path / "bad", "--set", "streams.encryption=true", nats_url=nats_server.url, server_id="bad"
    )
    with pytest.raises(RuntimeError, match=r"streams\.encryption needs a master key"):
        bad.start()
    short = LiftlogProcess(tmp_path / "short", nats_url=nats_server.url, server_id="short", env={ENV_VAR: "too-short"})
    with pytest.raises(RuntimeError, match=f"the encryption master key in {ENV_VAR} is 9 bytes"):
        short.start()


def test_streams_encryption_makes_new_streams_encrypted(tmp_path: Path, nats_server: NatsProcess) -> None:
    proc = LiftlogProcess(
        tmp_path / "d", "--set", "streams.encryption=true", nats_url=nats_server.url, env={ENV_VAR: LIFTBRIDGE_KEY}
    ).start()
    try:
        rpc(proc.address, "CreateStream", api_pb2.CreateStreamRequest(name="dflt", subject="dflt"))
        rpc(
            proc.address,
            "CreateStream",
            api_pb2.CreateStreamRequest(name="open", subject="open", encryption=api_pb2.NullableBool(value=False)),
        )
        publish(proc.address, "dflt", [SECRET])
        publish(proc.address, "open", [SECRET])
        assert subscribe_values(proc.address, "dflt") == [SECRET] == subscribe_values(proc.address, "open")
        assert SECRET not in on_disk(proc.data_dir, "dflt")
        assert SECRET in on_disk(proc.data_dir, "open"), "an explicit encryption=false wins over the default"
    finally:
        proc.kill()


def test_a_wrong_key_fails_clearly_and_rotation_keeps_every_message_readable(
    tmp_path: Path, nats_server: NatsProcess
) -> None:
    """Liftbridge's env key first; then a new key without the old one (clear errors); then the old one kept as a
    previous key (all readable); then a rotation with SIGHUP, no restart."""
    key_a, key_b, key_c = parse_master_key(LIFTBRIDGE_KEY, "test"), MasterKey(b"B" * 32), MasterKey(b"C" * 32)
    proc = LiftlogProcess(tmp_path / "data", nats_url=nats_server.url, env={ENV_VAR: LIFTBRIDGE_KEY}).start()
    try:
        create_encrypted(proc.address, "rot")
        publish(proc.address, "rot", [b"a%d" % i for i in range(3)])
        proc.stop()

        current = tmp_path / "current.key"
        current.write_text("base64:" + __import__("base64").b64encode(b"B" * 32).decode())
        proc.env = {}
        proc.args = ["--set", f"encryption.key.file={current}"]
        proc.start()
        with pytest.raises(grpc.RpcError) as info:
            subscribe_values(proc.address, "rot")
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert info.value.details() == (
            f"stream 'rot' partition 0: encrypted batch at base offset 0 needs master key {key_a.id.hex()}, "
            f"which this server does not have (its master keys: {key_b.id.hex()})"
        )

        async def our_client_says_so() -> None:
            async with Client(proc.address) as client:
                with pytest.raises(EncryptionFailedError, match=key_a.id.hex()):
                    await client.fetch("rot")
                with pytest.raises(EncryptionFailedError, match=key_a.id.hex()):
                    async for _ in client.subscribe("rot", start_position=StartPosition.EARLIEST):
                        pass

        asyncio.run(our_client_says_so())
        publish(proc.address, "rot", [b"b%d" % i for i in range(3)])  # new batches use the new key
        proc.stop()

        old_a, old_b = tmp_path / "old-a.key", tmp_path / "old-b.key"
        old_a.write_text(LIFTBRIDGE_KEY)
        old_b.write_text(LIFTBRIDGE_KEY)  # a second slot for the next rotation
        for old in (old_a, old_b):
            old.chmod(0o600)  # a key others may read is refused
        proc.args = [
            "--set",
            f"encryption.key.file={current}",
            "--set",
            f"encryption.previous.key.files={old_a},{old_b}",
        ]
        proc.start()
        written = [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]
        assert subscribe_values(proc.address, "rot") == written

        # Rotate without a restart: C becomes the current key, B moves to a previous slot, SIGHUP.
        current.write_text("base64:" + __import__("base64").b64encode(b"C" * 32).decode())
        old_b.write_text("base64:" + __import__("base64").b64encode(b"B" * 32).decode())
        assert proc.proc is not None
        os.kill(proc.proc.pid, signal.SIGHUP)
        eventually(lambda: key_c.id.hex() in proc.output() or None, 10, "the keys reloaded")
        publish(proc.address, "rot", [b"c0"])
        assert subscribe_values(proc.address, "rot") == [*written, b"c0"]
        assert asyncio.run(client_reads(proc.address, "rot")) == ([*written, b"c0"], [*written, b"c0"])
        stored = on_disk(proc.data_dir, "rot")
        for key in (key_a, key_b, key_c):
            assert key.id in stored, f"a batch under master key {key.id.hex()}"
    finally:
        proc.kill()


def test_publishing_to_an_encrypted_stream_on_a_server_that_lost_its_key_is_refused(
    tmp_path: Path, nats_server: NatsProcess
) -> None:
    proc = LiftlogProcess(tmp_path / "data", nats_url=nats_server.url, env={ENV_VAR: LIFTBRIDGE_KEY}).start()
    try:
        create_encrypted(proc.address, "lost")
        publish(proc.address, "lost", [b"kept"])
        proc.stop()
        proc.env = {}
        proc.start()
        before = on_disk(proc.data_dir, "lost")

        async def refused() -> None:
            async with Client(proc.address) as client:
                with pytest.raises(EncryptionFailedError, match="has no encryption master key"):
                    await client.publish("lost", b"never stored", ack_policy=AckPolicy.LEADER)
                with pytest.raises(EncryptionFailedError, match="has no encryption master key"):
                    await client.publish_many("lost", [b"never stored"] * 50, ack_policy=AckPolicy.ALL)

        asyncio.run(refused())
        with grpc.insecure_channel(proc.address) as channel:  # Liftbridge's clients: PublishAsync's error code
            answers = list(
                api_pb2_grpc.APIStub(channel).PublishAsync(
                    iter([api_pb2.PublishRequest(stream="lost", value=b"never stored", correlationId="x")]), timeout=10
                )
            )
        assert [a.asyncError.code for a in answers] == [api_pb2.PublishAsyncError.ENCRYPTION_FAILED]
        assert "has no encryption master key" in answers[0].asyncError.message
        assert on_disk(proc.data_dir, "lost") == before
        assert "has no encryption master key" in proc.output()
    finally:
        proc.kill()


def liftlog_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    return subprocess.run(
        [sys.executable, "-m", "liftlog.cli.main", *args], capture_output=True, text=True, timeout=60, env=env
    )


def test_rewrap_moves_a_stopped_servers_data_to_a_new_master_key(tmp_path: Path, nats_server: NatsProcess) -> None:
    """The key rotation that lets the old key go: stop, rewrap (refused while running; dry run first), start with
    only the new key, and every message reads."""
    old_file, new_file = tmp_path / "old.key", tmp_path / "new.key"
    generate_master_key_file(old_file)
    generate_master_key_file(new_file)
    old_key, new_key = (parse_master_key(f.read_text(), str(f)) for f in (old_file, new_file))
    proc = LiftlogProcess(tmp_path / "data", "--set", f"encryption.key.file={old_file}", nats_url=nats_server.url)
    proc.start()
    try:
        create_encrypted(proc.address, "pay")
        written = [SECRET + b"-%d" % i for i in range(30)]
        publish(proc.address, "pay", written)
        rewrap = ["encryption", "rewrap", "--data-dir", str(proc.data_dir), "--key-file", str(new_file)]
        rewrap += ["--previous-key-file", str(old_file)]

        running = liftlog_cli(*rewrap)
        assert running.returncode == 1
        assert "is in use by a liftlog server" in running.stderr and "stop it first" in running.stderr
        proc.stop()

        stored = on_disk(proc.data_dir, "pay")
        dry = liftlog_cli(*rewrap, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert "30 batches would be rewrapped" in dry.stdout.replace("\n", " ")
        assert on_disk(proc.data_dir, "pay") == stored, "a dry run writes nothing"

        done = liftlog_cli(*rewrap)
        assert done.returncode == 0, done.stderr
        assert "30 batches were rewrapped" in done.stdout.replace("\n", " ")
        rewrapped = on_disk(proc.data_dir, "pay")
        assert len(rewrapped) == len(stored) and old_key.id not in rewrapped and new_key.id in rewrapped

        proc.args = [a.replace(str(old_file), str(new_file)) for a in proc.args]  # the new key only
        proc.start()
        assert subscribe_values(proc.address, "pay") == written
        publish(proc.address, "pay", [b"after"])
        assert asyncio.run(client_reads(proc.address, "pay")) == ([*written, b"after"], [*written, b"after"])
    finally:
        proc.kill()


def test_data_under_a_typed_key_as_stored_before_hkdf_still_reads_and_rewraps(
    tmp_path: Path, nats_server: NatsProcess
) -> None:
    """A stream written when typed keys were used as their bytes: a server with the same typed key reads it
    (the old form decrypts), and rewrap moves it to the derived key."""
    from liftlog.storage import CommitLog
    from liftlog.storage.encryption import BatchCipher, partition_context
    from liftlog.storage.records import NewRecord

    proc = LiftlogProcess(tmp_path / "data", nats_url=nats_server.url, env={ENV_VAR: LIFTBRIDGE_KEY}).start()
    try:
        create_encrypted(proc.address, "old")
        publish(proc.address, "old", [b"new-0"])  # under the derived key
        proc.stop()
        created = int((proc.data_dir / "streams" / "old" / ".created").read_text())
        raw_key = MasterKey(LIFTBRIDGE_KEY.encode())  # what servers before HKDF made of the same text
        log = CommitLog.open(
            proc.data_dir / "streams" / "old" / "0",
            cipher=BatchCipher(raw_key).bind(partition_context("old", 0, created)),
            encrypt=True,
        )
        log.append([NewRecord(b"written-the-old-way")])
        log.set_high_watermark(log.newest_offset)
        log.close()
        proc.start()
        assert subscribe_values(proc.address, "old") == [b"new-0", b"written-the-old-way"]
        proc.stop()
        key_file = tmp_path / "typed.key"
        key_file.write_text(LIFTBRIDGE_KEY)
        key_file.chmod(0o600)
        done = liftlog_cli("encryption", "rewrap", "--data-dir", str(proc.data_dir), "--key-file", str(key_file))
        assert done.returncode == 0, done.stderr
        assert raw_key.id not in on_disk(proc.data_dir, "old")
        proc.start()
        assert subscribe_values(proc.address, "old") == [b"new-0", b"written-the-old-way"]
    finally:
        proc.kill()
