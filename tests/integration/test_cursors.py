"""Cursors (SetCursor, FetchCursor) against real servers: Liftbridge's wire and routing, durability across
restarts and leader failover, the servers' own __cursors stream guarded from users and from NATS."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import nats
import pytest

from liftlog.api import api_pb2
from liftlog.client import Client, FailedPreconditionError, InvalidArgumentError, NoSuchStreamError

from .harness import LiftlogProcess, NatsProcess, eventually
from .test_cluster import Cluster, agreed, create, formed, rpc

NAMESPACE = "cursors-test"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, nats_server: NatsProcess) -> Iterator[LiftlogProcess]:
    root = tmp_path_factory.mktemp("cursors")
    proc = LiftlogProcess(
        root / "data",
        "--namespace",
        NAMESPACE,
        "--set",
        "cursors.stream.partitions=3",
        nats_url=nats_server.url,
    ).start()
    eventually(lambda: "__cursors" in cursor_streams(proc.address) or None, 20, "__cursors created")
    create(proc.address, "orders", partitions=2)
    yield proc
    proc.kill()


def cursor_streams(address: str) -> dict[str, api_pb2.StreamMetadata]:
    meta = rpc(address, "FetchMetadata", api_pb2.FetchMetadataRequest())
    return {s.name: s for s in meta.streamMetadata}


def set_cursor(address: str, cursor_id: str, stream: str, offset: int, partition: int = 0) -> None:
    rpc(
        address,
        "SetCursor",
        api_pb2.SetCursorRequest(stream=stream, partition=partition, cursorId=cursor_id, offset=offset),
    )


def fetch_cursor(address: str, cursor_id: str, stream: str, partition: int = 0) -> int:
    req = api_pb2.FetchCursorRequest(stream=stream, partition=partition, cursorId=cursor_id)
    return int(rpc(address, "FetchCursor", req).offset)


def refused(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    return info.value


def test_the_cursors_stream_is_liftbridges(server: LiftlogProcess) -> None:
    stream = cursor_streams(server.address)["__cursors"]
    assert stream.subject == f"{NAMESPACE}.cursors"
    assert sorted(stream.partitions) == [0, 1, 2]


def test_set_and_fetch_on_liftbridges_wire(server: LiftlogProcess) -> None:
    assert fetch_cursor(server.address, "never-set", "orders") == -1
    set_cursor(server.address, "c1", "orders", 41)
    set_cursor(server.address, "c1", "orders", 7, partition=1)
    assert fetch_cursor(server.address, "c1", "orders") == 41
    assert fetch_cursor(server.address, "c1", "orders", partition=1) == 7
    set_cursor(server.address, "c1", "orders", 12)  # the newest write wins, also backwards
    assert fetch_cursor(server.address, "c1", "orders") == 12


def test_our_client_routes_cursors(server: LiftlogProcess) -> None:
    async def go() -> None:
        async with Client(server.address) as client:
            for i in range(30):
                await client.set_cursor(f"group-{i}", "orders", i * 10, partition=i % 2)
            assert [await client.fetch_cursor(f"group-{i}", "orders", partition=i % 2) for i in range(30)] == [
                i * 10 for i in range(30)
            ]
            assert await client.fetch_cursor("nobody", "orders") == -1
            with pytest.raises(NoSuchStreamError):
                await client.set_cursor("c", "no-such-stream", 1)
            with pytest.raises(InvalidArgumentError, match="No cursorId provided"):
                await client.set_cursor("", "orders", 1)

    asyncio.run(go())


def test_bad_cursor_requests_are_named(server: LiftlogProcess) -> None:
    a = server.address
    cases = [
        (lambda: set_cursor(a, "c", "", 1), grpc.StatusCode.INVALID_ARGUMENT, "No stream provided"),
        (lambda: fetch_cursor(a, "", "orders"), grpc.StatusCode.INVALID_ARGUMENT, "No cursorId provided"),
        (lambda: set_cursor(a, "c", "orders", -2), grpc.StatusCode.INVALID_ARGUMENT, "cursor offset -2 is negative"),
        (lambda: set_cursor(a, "x" * 1025, "orders", 1), grpc.StatusCode.INVALID_ARGUMENT, "at most 1024"),
        (lambda: set_cursor(a, "c", "ghost", 1), grpc.StatusCode.NOT_FOUND, "ghost"),
        (lambda: set_cursor(a, "c", "orders", 1, partition=9), grpc.StatusCode.NOT_FOUND, "partition"),
        (lambda: fetch_cursor(a, "c", "ghost"), grpc.StatusCode.NOT_FOUND, "ghost"),  # not -1: no such stream
        (lambda: fetch_cursor(a, "c", "orders", partition=9), grpc.StatusCode.NOT_FOUND, "partition"),
    ]
    for call, code, text in cases:
        err = refused(call)
        assert err.code() == code, (text, err)
        assert text in (err.details() or ""), err.details()


def test_the_cursors_stream_is_the_servers_own(server: LiftlogProcess) -> None:
    a = server.address
    for call, text in [
        (lambda: create(a, "__cursors"), "reserved"),
        (lambda: rpc(a, "DeleteStream", api_pb2.DeleteStreamRequest(name="__cursors")), "cannot be deleted"),
        (lambda: rpc(a, "Publish", api_pb2.PublishRequest(stream="__cursors", value=b"x")), "only they write it"),
    ]:
        err = refused(call)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and text in (err.details() or ""), err.details()


def test_nothing_on_nats_adds_to_the_cursors_stream(server: LiftlogProcess, nats_server: NatsProcess) -> None:
    set_cursor(server.address, "guarded", "orders", 5)
    before = {pid: p.newestOffset for pid, p in cursor_streams(server.address)["__cursors"].partitions.items()}

    async def forge() -> None:
        nc = await nats.connect(nats_server.url)
        forged = api_pb2.Message(key=b"guarded,orders,0", value=b"\x20\x63").SerializeToString()
        for pid in range(3):
            subject = f"{NAMESPACE}.cursors" + (f".{pid}" if pid else "")
            for payload in (b"garbage", forged):
                await nc.publish(subject, payload)
        await nc.flush()
        await nc.close()

    asyncio.run(forge())
    set_cursor(server.address, "after", "orders", 1)  # a write after the forgeries, so they had their chance
    after = {pid: p.newestOffset for pid, p in cursor_streams(server.address)["__cursors"].partitions.items()}
    assert sum(after.values()) - sum(before.values()) == 1
    assert fetch_cursor(server.address, "guarded", "orders") == 5


def test_cursors_survive_a_restart(tmp_path: Path, nats_server: NatsProcess) -> None:
    proc = LiftlogProcess(
        tmp_path / "data",
        "--namespace",
        "cursors-restart",
        "--set",
        "cursors.stream.partitions=2",
        nats_url=nats_server.url,
    ).start()
    try:
        eventually(lambda: "__cursors" in cursor_streams(proc.address) or None, 20, "__cursors created")
        create(proc.address, "s")
        for i in range(20):
            set_cursor(proc.address, f"c{i}", "s", i)
        set_cursor(proc.address, "c0", "s", 100)
        proc.stop()
        proc.start()
        assert eventually(lambda: fetch_cursor(proc.address, "c0", "s") == 100 or None, 20, "c0 back")
        assert [fetch_cursor(proc.address, f"c{i}", "s") for i in range(1, 20)] == list(range(1, 20))
    finally:
        proc.kill()


def test_cursors_off_is_a_clear_refusal(tmp_path: Path, nats_server: NatsProcess) -> None:
    proc = LiftlogProcess(tmp_path / "data", "--namespace", "cursors-off", nats_url=nats_server.url).start()
    try:
        create(proc.address, "s")
        err = refused(lambda: fetch_cursor(proc.address, "c", "s"))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "cursors are off: set cursors.stream.partitions" in (err.details() or "")

        async def ours() -> None:
            async with Client(proc.address) as client:
                with pytest.raises(FailedPreconditionError, match=r"cursors\.stream\.partitions"):
                    await client.set_cursor("c", "s", 1)
                with pytest.raises(FailedPreconditionError, match=r"cursors\.stream\.partitions"):
                    await client.consumer("g", ["s"]).start()  # a group member could not resume anywhere

        asyncio.run(ours())
    finally:
        proc.kill()


@pytest.mark.slow
@pytest.mark.cluster
def test_cursor_partitions_fail_over_without_losing_a_checkpoint(tmp_path: Path, nats_server: NatsProcess) -> None:
    c = Cluster(tmp_path, nats_server.url)
    ids = ["a", "b", "c"]
    for sid in ids:
        c.add(sid, ",".join(ids), "--set", "cursors.stream.partitions=4", "--set", "clustering.replica.max.lag.time=2s")
    try:
        c.start_all()
        formed(c, set(ids))
        views = eventually(lambda: agreed(c, "__cursors")["__cursors"] or None, 30, "__cursors created")
        assert all(sorted(replicas) == ids for _leader, replicas, _isr in views.values()), views
        create(c.servers["a"].address, "orders", partitions=2, rf=3)

        key = b"g1,orders,0"
        pid = zlib.crc32(key) % 4
        leader = agreed(c, "__cursors")["__cursors"][pid][0]
        other = next(sid for sid in ids if sid != leader)
        err = refused(lambda: set_cursor(c.servers[other].address, "g1", "orders", 3))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.details() == f"Server not leader for cursors partition {pid}"

        async def write(address: str) -> None:
            async with Client(address) as client:
                for i in range(40):
                    await client.set_cursor(f"g{i}", "orders", 1000 + i, partition=i % 2)

        asyncio.run(write(c.servers[other].address))  # our client routes each to its partition's leader
        c.servers[leader].kill()

        async def read(address: str) -> list[int]:
            async with Client(address, timeout=10) as client:
                return [await client.fetch_cursor(f"g{i}", "orders", partition=i % 2) for i in range(40)]

        survivor = c.servers[other].address
        assert eventually(lambda: agreed(c, "__cursors")["__cursors"][pid][0] != leader or None, 20, "new leader")
        assert asyncio.run(read(survivor)) == [1000 + i for i in range(40)]
        asyncio.run(write(survivor))
        c.servers[leader].start()
        assert asyncio.run(read(c.servers[leader].address)) == [1000 + i for i in range(40)]
    finally:
        c.stop_all()


def test_the_cursor_command(server: LiftlogProcess) -> None:
    from tests.cli.test_cli import assert_one_error_line, invoke

    assert invoke("cursor", "get", "cli", "orders", "-a", server.address).stdout.strip() == "-1"
    result = invoke("cursor", "set", "cli", "orders", "17", "--partition", "1", "-a", server.address)
    assert result.exit_code == 0 and "cursor cli of orders/1 is at 17" in result.stdout, result.output
    assert invoke("cursor", "get", "cli", "orders", "--partition", "1", "-a", server.address).stdout.strip() == "17"
    line = assert_one_error_line(invoke("cursor", "set", "cli", "ghost", "1", "-a", server.address), 1)
    assert "ghost" in line


def test_the_cli_names_a_missing_stream_partition_or_activity_stream(server: LiftlogProcess) -> None:
    from tests.cli.test_cli import assert_one_error_line, invoke

    a = server.address
    assert invoke("cursor", "set", "cli", "orders", "3", "-a", a).exit_code == 0
    assert invoke("cursor", "get", "cli", "orders", "-a", a).stdout.strip() == "3"
    assert "ghost" in assert_one_error_line(invoke("cursor", "get", "cli", "ghost", "-a", a), 1)
    assert "partition" in assert_one_error_line(
        invoke("cursor", "get", "cli", "orders", "--partition", "9", "-a", a), 1
    )
    line = assert_one_error_line(invoke("activity", "-a", a), 1)
    assert "activity stream is off" in line and "activity.stream.enabled=true" in line


def test_cursor_list_shows_the_newest_value_of_every_cursor(server: LiftlogProcess) -> None:
    import json

    from tests.cli.test_cli import invoke

    a = server.address
    for offset in (1, 2, 9):
        set_cursor(a, "lister", "orders", offset, partition=1)
    set_cursor(a, "lister-" + "x" * 60, "orders", 4)
    listed = json.loads(invoke("cursor", "list", "orders", "-o", "json", "-a", a).stdout)
    mine = {(c["cursor_id"], c["partition"]): c["offset"] for c in listed if c["cursor_id"].startswith("lister")}
    assert mine == {("lister", 1): 9, ("lister-" + "x" * 60, 0): 4}
    assert all(c["stream"] == "orders" for c in listed)
    text = invoke("cursor", "list", "-a", a).stdout
    assert "lister-" + "x" * 60 in text, "names are never cut short"
