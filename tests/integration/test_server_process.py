"""The server as a process: standalone mode, restarts without loss, shutdown, start-up errors."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.metadata import CreateStream, Metadata, MetadataFile, PartitionMeta, StreamMeta, StreamSettings
from liftlog.storage import CommitLog, LogConfig, NewRecord

from .harness import LiftlogProcess, NatsProcess, free_port

pytestmark = pytest.mark.slow


async def publish_many(address: str, name: str, count: int, policy: api_pb2.AckPolicy = api_pb2.LEADER) -> list[int]:
    async with grpc.aio.insecure_channel(address) as channel:
        api = api_pb2_grpc.APIStub(channel)

        async def requests() -> AsyncIterator[api_pb2.PublishRequest]:
            for i in range(count):
                yield api_pb2.PublishRequest(stream=name, value=b"m%d" % i, correlationId=str(i), ackPolicy=policy)

        return [r.ack.offset async for r in api.PublishAsync(requests())]


async def values(address: str, name: str, **kw: object) -> list[bytes]:
    async with grpc.aio.insecure_channel(address) as channel:
        api = api_pb2_grpc.APIStub(channel)
        req = api_pb2.SubscribeRequest(stream=name, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST)
        for k, v in kw.items():
            setattr(req, k, v)
        return [m.value async for m in api.Subscribe(req)][1:]


async def call(address: str, method: str, request: object, timeout: float | None = None) -> object:
    async with grpc.aio.insecure_channel(address) as channel:
        return await getattr(api_pb2_grpc.APIStub(channel), method)(request, timeout=timeout)


async def test_standalone_with_embedded_nats_survives_restarts(data_dir: Path) -> None:
    nats_port = free_port()
    server = LiftlogProcess(data_dir, "--embedded-nats", "--embedded-nats-port", str(nats_port)).start()
    try:
        await call(server.address, "CreateStream", api_pb2.CreateStreamRequest(subject="orders", name="orders"))
        acked = await publish_many(server.address, "orders", 500)
        assert acked == list(range(500))
        await call(server.address, "PauseStream", api_pb2.PauseStreamRequest(name="orders"))
        assert server.stop() == 0, server.output()
        assert "Traceback" not in server.output()

        server.start()  # paused state and every acked message survive a graceful restart
        meta = await call(server.address, "FetchMetadata", api_pb2.FetchMetadataRequest(streams=["orders"]))
        restarted = meta.streamMetadata[0].partitions[0]  # type: ignore[attr-defined]
        assert restarted.paused and restarted.newestOffset == 499
        got = await values(server.address, "orders", resume=True)
        assert got == [b"m%d" % i for i in range(500)]

        acked = await publish_many(server.address, "orders", 300)
        assert acked == list(range(500, 800))
        server.kill()  # SIGKILL: acked (LEADER) messages are in the OS page cache and must survive
        server.start()
        assert len(await values(server.address, "orders")) == 800
    finally:
        server.kill()
    # The embedded nats-server went away with a graceful stop.
    assert server.stop() is not None


async def test_graceful_stop_acks_everything_in_flight(data_dir: Path, nats_server: NatsProcess) -> None:
    server = LiftlogProcess(data_dir, nats_url=nats_server.url).start()
    try:
        await call(server.address, "CreateStream", api_pb2.CreateStreamRequest(subject="inflight", name="inflight"))
        publisher = asyncio.ensure_future(publish_many(server.address, "inflight", 20000))
        await asyncio.sleep(0.5)
        server.proc.send_signal(2)  # type: ignore[union-attr]  # SIGINT, as Ctrl-C
        try:
            acked = await publisher
        except grpc.aio.AioRpcError as exc:
            # After the grace period the server closes the connection; a grpcio client still sending its
            # requests then may report its own failed send ("Internal error from Core") instead.
            core = exc.code() == grpc.StatusCode.INTERNAL and "from Core" in (exc.details() or "")
            assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED) or core, exc
            acked = []
        assert server.proc.wait(20) == 0, server.output()  # type: ignore[union-attr]
        server.start()
        stored = await values(server.address, "inflight")
        assert len(stored) >= len(acked), "every acked message is stored after a graceful stop"
        assert stored[: len(acked)] == [b"m%d" % i for i in range(len(acked))]
    finally:
        server.kill()


async def test_auto_pause(data_dir: Path, nats_server: NatsProcess) -> None:
    server = LiftlogProcess(data_dir, nats_url=nats_server.url).start()
    try:
        req = api_pb2.CreateStreamRequest(subject="idle", name="idle", autoPauseTime=api_pb2.NullableInt64(value=300))
        await call(server.address, "CreateStream", req)
        for _ in range(50):
            resp = await call(
                server.address, "FetchPartitionMetadata", api_pb2.FetchPartitionMetadataRequest(stream="idle")
            )
            if resp.metadata.paused:  # type: ignore[attr-defined]
                break
            await asyncio.sleep(0.1)
        assert resp.metadata.paused, "an idle partition pauses after autoPauseTime"  # type: ignore[attr-defined]
        ack = await call(server.address, "Publish", api_pb2.PublishRequest(stream="idle", value=b"wake"))
        assert ack.ack.offset == 0  # type: ignore[attr-defined]

        # With autoPauseDisableIfSubscribers, a partition someone follows stays open.
        req = api_pb2.CreateStreamRequest(
            subject="watched",
            name="watched",
            autoPauseTime=api_pb2.NullableInt64(value=300),
            autoPauseDisableIfSubscribers=api_pb2.NullableBool(value=True),
        )
        await call(server.address, "CreateStream", req)
        async with grpc.aio.insecure_channel(server.address) as channel:
            api = api_pb2_grpc.APIStub(channel)
            follower = api.Subscribe(api_pb2.SubscribeRequest(stream="watched"))
            assert (await follower.read()) == api_pb2.Message()
            await asyncio.sleep(1.5)
            meta = await api.FetchPartitionMetadata(api_pb2.FetchPartitionMetadataRequest(stream="watched"))
            assert not meta.metadata.paused
            follower.cancel()
    finally:
        server.kill()


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "liftlog.cli.main", *args], capture_output=True, text=True, timeout=timeout
    )


def test_port_in_use_is_one_clear_line(data_dir: Path, nats_server: NatsProcess) -> None:
    first = LiftlogProcess(data_dir, nats_url=nats_server.url).start()
    try:
        other = data_dir.parent / "other"
        result = run_cli(
            "server", "--data-dir", str(other), "--port", str(first.port), "--nats-servers", nats_server.url,
            "--raft-bootstrap-seed",
        )  # fmt: skip
        assert result.returncode != 0
        assert "Traceback" not in result.stderr
        assert f"cannot listen on 127.0.0.1:{first.port}" in result.stderr

        same_dir = run_cli(
            "server", "--data-dir", str(data_dir), "--port", "0", "--nats-servers", nats_server.url,
            "--raft-bootstrap-seed",
        )  # fmt: skip
        assert same_dir.returncode != 0 and "in use by another liftlog server" in same_dir.stderr
    finally:
        first.kill()


def test_bootstrap_peers_without_this_server_is_one_clear_line(data_dir: Path, nats_server: NatsProcess) -> None:
    result = run_cli(
        "server", "--data-dir", str(data_dir), "--port", "0", "--id", "z", "--nats-servers", nats_server.url,
        "--raft-bootstrap-peers", "a,b",
    )  # fmt: skip
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "clustering.raft.bootstrap.peers (a, b) must include this server's id 'z'" in result.stderr


def test_unreachable_nats_is_one_clear_line(data_dir: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    result = run_cli(
        "server", "--data-dir", str(data_dir), "--port", "0", "--nats-servers", url, "--raft-bootstrap-seed"
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert f"cannot connect to NATS at {url}" in result.stderr


def test_embedded_nats_port_taken_is_one_clear_line(data_dir: Path, nats_server: NatsProcess) -> None:
    args = ["--data-dir", str(data_dir), "--port", "0", "--embedded-nats", "--embedded-nats-port"]
    result = run_cli("server", *args, str(nats_server.port))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "embedded nats-server" in result.stderr and str(nats_server.port) in result.stderr


def test_bad_config_key_names_the_key(tmp_path: Path) -> None:
    config = tmp_path / "liftlog.yaml"
    config.write_text("streams:\n  retention.max.bytez: 10\n")
    result = run_cli("server", "-c", str(config))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "retention.max.bytez" in result.stderr


async def test_embedded_nats_crash_is_survived(data_dir: Path) -> None:
    nats_port = free_port()
    server = LiftlogProcess(data_dir, "--embedded-nats", "--embedded-nats-port", str(nats_port)).start()
    try:
        await call(server.address, "CreateStream", api_pb2.CreateStreamRequest(subject="crash", name="crash"))
        await call(server.address, "Publish", api_pb2.PublishRequest(stream="crash", value=b"before"))
        children = Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children").read_text().split()  # type: ignore[union-attr]
        (nats_pid,) = [int(pid) for pid in children if "nats-server" in Path(f"/proc/{pid}/cmdline").read_text()]
        os.kill(nats_pid, signal.SIGKILL)
        for _ in range(100):  # the supervisor restarts it on the same port; the connection comes back
            try:
                ack = await call(
                    server.address, "Publish", api_pb2.PublishRequest(stream="crash", value=b"after"), timeout=1
                )
                break
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.1)
        assert ack.ack.offset == 1  # type: ignore[attr-defined]
        assert await values(server.address, "crash") == [b"before", b"after"]
    finally:
        server.kill()


async def test_restart_without_an_id_keeps_the_data_dirs_id(data_dir: Path, nats_server: NatsProcess) -> None:
    server = LiftlogProcess(data_dir, nats_url=nats_server.url, server_id=None).start()
    try:
        await call(server.address, "CreateStream", api_pb2.CreateStreamRequest(subject="anon", name="anon"))
        assert server.stop() == 0
        server.start()
        ack = await call(server.address, "Publish", api_pb2.PublishRequest(stream="anon", value=b"x"))
        assert ack.ack.offset == 0  # type: ignore[attr-defined]  # still the partition's leader
        server.stop()
        other = run_cli(
            "server", "--data-dir", str(data_dir), "--id", "someone-else", "--nats-servers", nats_server.url
        )
        assert other.returncode != 0 and "Traceback" not in other.stderr
        assert "belongs to server" in other.stderr
    finally:
        server.kill()


async def test_a_pre_raft_data_directory_keeps_its_streams_and_messages(data_dir: Path) -> None:
    # What a server before the metadata Raft group left behind: metadata.json and partition logs.
    legacy = Metadata()
    legacy.apply(
        CreateStream(
            StreamMeta(
                name="old",
                subject="old",
                group="",
                creation_timestamp=1,
                settings=StreamSettings(),
                partitions={0: PartitionMeta("old", 0, "old", "s1", ["s1"], ["s1"])},
            )
        )
    )
    data_dir.mkdir(parents=True)
    MetadataFile(data_dir / "metadata.json").save(legacy)
    log = CommitLog.open(data_dir / "streams" / "old" / "0", LogConfig())
    log.append([NewRecord(b"kept-%d" % i) for i in range(3)])
    log.close()
    nats_port = free_port()
    server = LiftlogProcess(data_dir, "--embedded-nats", "--embedded-nats-port", str(nats_port)).start()
    try:
        assert await values(server.address, "old") == [b"kept-0", b"kept-1", b"kept-2"]
        assert not (data_dir / "metadata.json").exists() and (data_dir / "metadata.json.imported").exists()
        server.stop()
        server.start()  # imported once, then kept by the Raft log
        assert await values(server.address, "old") == [b"kept-0", b"kept-1", b"kept-2"]
    finally:
        server.kill()


def test_the_harness_moves_a_first_start_off_a_port_taken_meanwhile(data_dir: Path, nats_server: NatsProcess) -> None:
    # free_port() only finds a port that is free at that moment; another socket may take it before the
    # server binds (seen when two test runs shared the machine). A restart must keep its port, though.
    server = LiftlogProcess(data_dir, nats_url=nats_server.url)
    taken = server.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        server.start()
        try:
            assert server.port != taken and server.address.endswith(f":{server.port}")
            server.stop()
            server.port, server.address = taken, f"127.0.0.1:{taken}"
            with pytest.raises(RuntimeError, match="could not listen on its port again"):
                server.start()
        finally:
            server.kill()


def test_liftbridges_flags_and_the_listen_host_split(tmp_path: Path, nats_server: NatsProcess) -> None:
    """Liftbridge's flag names, and listen (bound: every interface) apart from host (advertised)."""
    port = free_port()
    proc = LiftlogProcess(
        tmp_path / "unused",
        "-d",
        str(tmp_path / "data"),
        "--ns",
        "flags-test",
        "-l",
        "debug",
        "--set",
        f"listen=0.0.0.0:{port}",
        "--host",
        "localhost",
        nats_url=nats_server.url,
        server_id=None,
        bootstrap=None,
    )
    proc.args += ["--server-id", "lb-flags", "--raft-bootstrap-seed"]
    proc.port, proc.address = port, f"127.0.0.1:{port}"  # reachable on loopback through the wildcard bind
    proc.start()
    try:
        with grpc.insecure_channel(proc.address) as channel:
            meta = api_pb2_grpc.APIStub(channel).FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=5)
        assert [(b.id, b.host, b.port) for b in meta.brokers] == [("lb-flags", "localhost", port)]
        assert (tmp_path / "data").is_dir() and "DEBUG" in proc.output()
    finally:
        proc.kill()
