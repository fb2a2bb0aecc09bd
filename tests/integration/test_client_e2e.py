"""liftlog.client against a real server and nats-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from liftlog.client import (
    AckPolicy,
    Client,
    FailedPreconditionError,
    IncorrectOffsetError,
    InvalidArgumentError,
    MessageTooLargeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    NotFoundError,
    PartitionPausedError,
    ReadonlyError,
    StartPosition,
    StopPosition,
    StreamExistsError,
    UnavailableError,
)

from .harness import LiftlogProcess, NatsProcess, free_port

pytestmark = pytest.mark.slow


@pytest.fixture
async def client(server: LiftlogProcess, nats_server: NatsProcess) -> AsyncIterator[Client]:
    async with Client(server.address, nats_servers=[nats_server.url]) as c:
        yield c


async def read(client: Client, name: str, partition: int = 0) -> list[bytes]:
    sub = client.subscribe(
        name, partition=partition, start_position=StartPosition.EARLIEST, stop_position=StopPosition.STOP_LATEST
    )
    return [m.value async for m in sub]


async def test_stream_lifecycle(client: Client, name: str) -> None:
    await client.create_stream(name, name, partitions=2, retention_max_messages=1000)
    with pytest.raises(StreamExistsError, match=name):
        await client.create_stream(name, name)
    await client.create_stream(name, name, exist_ok=True)
    md = await client.fetch_metadata(name)
    assert sorted(md.streams[name].partitions) == [0, 1]
    await client.delete_stream(name)
    with pytest.raises(NoSuchStreamError):
        await client.delete_stream(name)
    assert name in (await client.fetch_metadata(name)).unknown_streams


async def test_publish_and_subscribe(client: Client, name: str) -> None:
    await client.create_stream(name, name)
    ack = await client.publish(name, "hello", key="k", headers={"trace": "1"})
    assert ack is not None and ack.offset == 0 and ack.stream == name
    assert await client.publish(name, b"fire and forget", ack_policy=AckPolicy.NONE) is None
    acks = await client.publish_many(name, (b"m%d" % i for i in range(500)), window=50)
    assert [a.offset for a in acks] == list(range(2, 502))
    sub = client.subscribe(name, start_position=StartPosition.EARLIEST, stop_position=StopPosition.STOP_LATEST)
    messages = [m async for m in sub]
    assert len(messages) == 502
    first = messages[0]
    assert (first.key, first.value, first.headers, first.subject) == (b"k", b"hello", {"trace": b"1"}, name)


async def test_follow_new_messages(client: Client, name: str) -> None:
    await client.create_stream(name, name)
    await client.publish(name, b"old")
    async with client.subscribe(name) as sub:  # NEW_ONLY; entering waits until it is live
        await client.publish(name, b"new")
        message = await asyncio.wait_for(sub.__anext__(), 5)
    assert (message.offset, message.value) == (1, b"new")


async def test_key_partitioning_is_stable(client: Client, name: str) -> None:
    await client.create_stream(name, name, partitions=3)
    first = await client.publish(name, b"a", key=b"customer-7")
    second = await client.publish(name, b"b", key=b"customer-7")
    assert first is not None and second is not None
    assert first.partition_subject == second.partition_subject
    assert second.offset == first.offset + 1


async def test_errors_are_specific(client: Client, name: str) -> None:
    with pytest.raises(NoSuchStreamError):
        await client.publish(name, b"x")
    with pytest.raises(InvalidArgumentError, match="stream name"):
        await client.create_stream("x", "bad name")
    await client.create_stream(name, name, optimistic_concurrency_control=True)
    with pytest.raises(MessageTooLargeError):
        await client.publish(name, b"x" * (2 << 20))
    assert (await client.publish(name, b"0", expected_offset=0)) is not None
    with pytest.raises(IncorrectOffsetError):
        await client.publish(name, b"stale", expected_offset=0)
    assert (await client.publish(name, b"no expectation")) is not None  # -1: not checked
    with pytest.raises(NoSuchPartitionError):
        await client.fetch_partition_metadata(name, 4)
    await client.set_stream_readonly(name)
    with pytest.raises(ReadonlyError):
        await client.publish(name, b"x")
    await client.pause_stream(name)
    with pytest.raises(PartitionPausedError):
        async with client.subscribe(name):
            pass
    # Cursors off on this server: a FAILED_PRECONDITION naming the setting, not a generic error.
    with pytest.raises(FailedPreconditionError, match=r"cursors\.stream\.partitions"):
        await client.fetch_cursor("c", name)
    with pytest.raises(NotFoundError, match="consumer group does not exist"):
        await client.fetch_group_metadata("no-such-group")


async def test_nats_publish_with_ack(client: Client, name: str) -> None:
    await client.create_stream(f"{name}.*", name)
    ack = await client.nats_publish(f"{name}.a", b"via nats", ack_policy=AckPolicy.LEADER, timeout=5)
    assert ack is not None and ack.offset == 0 and ack.msg_subject == f"{name}.a"
    await client.nats_publish(f"{name}.b", b"raw", envelope=False)
    for _ in range(50):
        if (await client.fetch_partition_metadata(name)).newest_offset == 1:
            break
        await asyncio.sleep(0.05)
    assert await read(client, name) == [b"via nats", b"raw"]


async def test_the_cli_reads_every_partition_unless_told(client: Client, name: str, server: LiftlogProcess) -> None:
    from tests.cli.test_cli import invoke

    await client.create_stream(name, name, partitions=2)
    await client.publish(name, b"zero", partition=0)
    await client.publish(name, b"one", partition=1)
    await client.publish(name, b"two", partition=0)
    everything = await asyncio.to_thread(invoke, "subscribe", name, "-a", server.address)
    assert everything.stdout.splitlines() == ["0:0  -  zero", "1:0  -  one", "0:1  -  two"]
    one = await asyncio.to_thread(invoke, "subscribe", name, "-p", "1", "-a", server.address)
    assert one.stdout.splitlines() == ["0  -  one"]


async def test_unreachable_server_is_unavailable() -> None:
    client = Client(f"127.0.0.1:{free_port()}", retries=1, backoff=0.01)
    with pytest.raises(UnavailableError):
        await client.connect()
    await client.close()


async def test_subscribe_all_reads_every_partition_in_time_order(client: Client, name: str) -> None:
    await client.create_stream(name, name, partitions=3)
    sent = []
    for i in range(30):  # round the partitions, so time order differs from partition order
        await client.publish(name, b"m%d" % i, partition=i % 3)
        sent.append(b"m%d" % i)
    async with client.subscribe_all(
        name, start_position=StartPosition.EARLIEST, stop_position=StopPosition.STOP_LATEST
    ) as sub:
        assert sub.partitions == [0, 1, 2]
        got = [m async for m in sub]
    assert [m.value for m in got] == sent
    assert [m.partition for m in got] == [i % 3 for i in range(30)]
    timestamps = [m.timestamp for m in got]
    assert timestamps == sorted(timestamps)

    some = client.subscribe_all(
        name, partitions=[2], start_position=StartPosition.EARLIEST, stop_position=StopPosition.STOP_LATEST
    )
    assert [m.value async for m in some] == sent[2::3]
    with pytest.raises(NoSuchPartitionError, match="no partition 7"):
        await client.subscribe_all(name, partitions=[7]).started()
    with pytest.raises(NoSuchStreamError):
        await client.subscribe_all(name + "-missing").started()


async def test_following_every_partition_an_idle_one_holds_nothing_back(client: Client, name: str) -> None:
    await client.create_stream(name, name, partitions=2)
    for i in range(5):
        await client.publish(name, b"old%d" % i, partition=0)
    async with client.subscribe_all(name, start_position=StartPosition.EARLIEST) as sub:  # follows: STOP_ON_CANCEL
        got = [(await asyncio.wait_for(anext(sub), 5)).value for _ in range(5)]
        assert got == [b"old%d" % i for i in range(5)], "partition 1 is empty: it does not hold the backlog back"
        await client.publish(name, b"new-on-1", partition=1)
        fresh = await asyncio.wait_for(anext(sub), 2)
        assert (fresh.value, fresh.partition) == (b"new-on-1", 1)
