"""Every RPC through the generated stubs against a real server and nats-server: the raw wire.

Marked slow: each module starts real processes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import nats
import pytest
from nats.aio.msg import Msg

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.api.envelope import MsgType, decode_ack, encode_envelope, encode_publish_message

from .harness import LiftlogProcess, NatsProcess

pytestmark = pytest.mark.slow


@pytest.fixture
async def api(server: LiftlogProcess) -> AsyncIterator[api_pb2_grpc.APIStub]:
    async with grpc.aio.insecure_channel(server.address) as channel:
        yield api_pb2_grpc.APIStub(channel)


async def rpc_error(awaitable: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await awaitable  # type: ignore[misc]
    return info.value


def reason(err: grpc.aio.AioRpcError) -> str | None:
    return dict(err.trailing_metadata() or ()).get("liftlog-error")


async def create(api: api_pb2_grpc.APIStub, name: str, **kw: Any) -> None:
    await api.CreateStream(api_pb2.CreateStreamRequest(subject=kw.pop("subject", name), name=name, **kw))


async def read_all(api: api_pb2_grpc.APIStub, name: str, partition: int = 0, **kw: Any) -> list[api_pb2.Message]:
    req = api_pb2.SubscribeRequest(
        stream=name, partition=partition, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST
    )
    for k, v in kw.items():
        setattr(req, k, v)
    call = api.Subscribe(req)
    out = [m async for m in call]
    assert out and out[0] == api_pb2.Message(), "the first message must be the empty set-up message"
    return out[1:]


async def newest(api: api_pb2_grpc.APIStub, name: str, partition: int = 0) -> int:
    resp = await api.FetchPartitionMetadata(api_pb2.FetchPartitionMetadataRequest(stream=name, partition=partition))
    return resp.metadata.newestOffset


# -- streams ----------------------------------------------------------------


async def test_create_stream_twice_is_already_exists(api: api_pb2_grpc.APIStub, name: str) -> None:
    await create(api, name)
    err = await rpc_error(create(api, name))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS and reason(err) == "stream_exists"


@pytest.mark.parametrize("bad", ["has space", "a/b", ""])
async def test_invalid_stream_name_is_invalid_argument(api: api_pb2_grpc.APIStub, bad: str) -> None:
    err = await rpc_error(api.CreateStream(api_pb2.CreateStreamRequest(subject="x", name=bad)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "stream name" in (err.details() or "")


async def test_invalid_subject_is_invalid_argument(api: api_pb2_grpc.APIStub, name: str) -> None:
    err = await rpc_error(create(api, name, subject="a..b"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "subject" in (err.details() or "")


async def test_replication_factor_above_cluster_size(api: api_pb2_grpc.APIStub, name: str) -> None:
    err = await rpc_error(create(api, name, replicationFactor=3))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "replication factor 3" in (err.details() or "")
    await create(api, name, replicationFactor=-1)  # -1: every server, which is this one
    meta = await api.FetchMetadata(api_pb2.FetchMetadataRequest(streams=[name]))
    assert list(meta.streamMetadata[0].partitions[0].replicas) == ["s1"]


async def test_delete_unknown_stream_is_not_found(api: api_pb2_grpc.APIStub, name: str) -> None:
    err = await rpc_error(api.DeleteStream(api_pb2.DeleteStreamRequest(name=name)))
    assert err.code() == grpc.StatusCode.NOT_FOUND and reason(err) == "no_such_stream"


async def test_delete_ends_followers_and_forgets_data(api: api_pb2_grpc.APIStub, name: str) -> None:
    await create(api, name)
    await api.Publish(api_pb2.PublishRequest(stream=name, value=b"old"))
    call = api.Subscribe(api_pb2.SubscribeRequest(stream=name, startPosition=api_pb2.EARLIEST))
    assert (await call.read()) == api_pb2.Message()
    assert (await call.read()).value == b"old"
    await api.DeleteStream(api_pb2.DeleteStreamRequest(name=name))
    err = await rpc_error(call.read())
    assert err.code() == grpc.StatusCode.NOT_FOUND and reason(err) == "stream_deleted"
    await create(api, name)
    assert await newest(api, name) == -1


# -- publish ------------------------------------------------------------------


async def test_publish_ack_policies(api: api_pb2_grpc.APIStub, name: str) -> None:
    await create(api, name)
    leader = await api.Publish(api_pb2.PublishRequest(stream=name, value=b"a", key=b"k", headers={"h": b"v"}))
    assert (leader.ack.stream, leader.ack.offset, leader.ack.ackPolicy) == (name, 0, api_pb2.LEADER)
    assert leader.ack.partitionSubject == name and leader.ack.receptionTimestamp > 0
    everyone = await api.Publish(api_pb2.PublishRequest(stream=name, value=b"b", ackPolicy=api_pb2.ALL))
    assert everyone.ack.offset == 1 and everyone.ack.commitTimestamp >= everyone.ack.receptionTimestamp > 0
    none = await api.Publish(api_pb2.PublishRequest(stream=name, value=b"c", ackPolicy=api_pb2.NONE))
    assert not none.HasField("ack")
    for _ in range(50):  # AckPolicy NONE returns once the message is on NATS, before it is stored
        msgs = await read_all(api, name)
        if len(msgs) == 3:
            break
        await asyncio.sleep(0.05)
    assert [m.value for m in msgs] == [b"a", b"b", b"c"]
    assert (msgs[0].key, dict(msgs[0].headers), msgs[0].subject) == (b"k", {"h": b"v"}, name)


async def test_publish_to_partition_uses_its_subject(api: api_pb2_grpc.APIStub, name: str) -> None:
    await create(api, name, partitions=3)
    resp = await api.Publish(api_pb2.PublishRequest(stream=name, partition=2, value=b"p2"))
    assert resp.ack.partitionSubject == f"{name}.2"
    assert [m.value for m in await read_all(api, name, partition=2)] == [b"p2"]
    assert await newest(api, name, 0) == -1


async def test_publish_errors(api: api_pb2_grpc.APIStub, name: str) -> None:
    err = await rpc_error(api.Publish(api_pb2.PublishRequest(stream=name, value=b"x")))
    assert err.code() == grpc.StatusCode.NOT_FOUND and name in (err.details() or "")
    await create(api, name)
    err = await rpc_error(api.Publish(api_pb2.PublishRequest(stream=name, partition=5, value=b"x")))
    assert err.code() == grpc.StatusCode.NOT_FOUND and reason(err) == "no_such_partition"
    err = await rpc_error(api.Publish(api_pb2.PublishRequest(stream=name, value=b"x" * (1024 * 1024 + 1))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and reason(err) == "too_large"
    assert await newest(api, name) == -1


async def test_expected_offset_with_concurrency_control(api: api_pb2_grpc.APIStub, name: str) -> None:
    await create(api, name, optimisticConcurrencyControl=api_pb2.NullableBool(value=True))
    ok = await api.Publish(api_pb2.PublishRequest(stream=name, value=b"first", expectedOffset=0))
    assert ok.ack.offset == 0
    err = await rpc_error(api.Publish(api_pb2.PublishRequest(stream=name, value=b"stale", expectedOffset=0)))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and reason(err) == "incorrect_offset"
    ok = await api.Publish(api_pb2.PublishRequest(stream=name, value=b"second", expectedOffset=1))
    assert ok.ack.offset == 1
    # Liftbridge refuses AckPolicy NONE here: a refused expected offset would go unnoticed
    none = api_pb2.PublishRequest(stream=name, value=b"blind", expectedOffset=2, ackPolicy=api_pb2.NONE)
    err = await rpc_error(api.Publish(none))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details() == "stream with concurrency control must have AckPolicy set"
    none.correlationId = "n1"
    (answer,) = [r async for r in api.PublishAsync(iter([none]))]
    assert answer.correlationId == "n1" and answer.asyncError.code == api_pb2.PublishAsyncError.BAD_REQUEST
    assert [m.value for m in await read_all(api, name)] == [b"first", b"second"]


async def test_publish_async_answers_in_order(api: api_pb2_grpc.APIStub, name: str) -> None:
    await create(api, name)

    async def requests() -> AsyncIterator[api_pb2.PublishRequest]:
        for i in range(200):
            yield api_pb2.PublishRequest(stream=name, value=b"%d" % i, correlationId=f"c{i}")
        yield api_pb2.PublishRequest(stream="no-such-stream", value=b"x", correlationId="bad")
        yield api_pb2.PublishRequest(stream=name, value=b"none", correlationId="n", ackPolicy=api_pb2.NONE)
        yield api_pb2.PublishRequest(stream=name, value=b"last", correlationId="last")

    responses = [r async for r in api.PublishAsync(requests())]
    assert [r.correlationId for r in responses] == [f"c{i}" for i in range(200)] + ["bad", "last"]
    assert [r.ack.offset for r in responses[:200]] == list(range(200))
    bad = responses[200]
    assert bad.asyncError.code == api_pb2.PublishAsyncError.NOT_FOUND and "no-such-stream" in bad.asyncError.message
    assert responses[201].ack.offset == 201  # the NONE message took offset 200 without an answer


async def test_publish_to_subject_is_acked_by_the_stream(api: api_pb2_grpc.APIStub, name: str) -> None:
    await create(api, name, subject=f"{name}.*")
    resp = await api.PublishToSubject(api_pb2.PublishToSubjectRequest(subject=f"{name}.x", value=b"v"))
    assert (resp.ack.stream, resp.ack.msgSubject, resp.ack.offset) == (name, f"{name}.x", 0)
    msgs = await read_all(api, name)
    assert msgs[0].subject == f"{name}.x"
    err = await rpc_error(api.PublishToSubject(api_pb2.PublishToSubjectRequest(subject=f"{name}.*", value=b"v")))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_publish_to_subject_without_a_stream_times_out(api: api_pb2_grpc.APIStub, name: str) -> None:
    err = await rpc_error(
        api.PublishToSubject(api_pb2.PublishToSubjectRequest(subject=f"nobody.{name}", value=b"v"), timeout=0.5)
    )
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED


# -- plain NATS -------------------------------------------------------------


async def test_plain_nats_publishes(api: api_pb2_grpc.APIStub, nats_server: NatsProcess, name: str) -> None:
    await create(api, name, subject=f"{name}.>")
    nc = await nats.connect(nats_server.url)
    try:
        acks: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_ack(msg: Msg) -> None:
            acks.put_nowait(msg.data)

        await nc.subscribe(f"acks.{name}", cb=on_ack)
        await nc.publish(f"{name}.raw", b"plain bytes", reply="reply.to")
        env = encode_publish_message(
            api_pb2.Message(
                key=b"k", value=b"enveloped", headers={"h": b"1"}, ackInbox=f"acks.{name}", correlationId="42"
            ),
            crc=True,
        )
        await nc.publish(f"{name}.env", env)
        not_publish = encode_envelope(MsgType.ACK, b"")
        await nc.publish(f"{name}.other", not_publish)
        await nc.publish(f"{name}.bad", env[:-3])  # truncated payload: decode fails
        await nc.flush()
        ack = decode_ack(await asyncio.wait_for(acks.get(), 5))
        assert (ack.correlationId, ack.offset, ack.msgSubject) == ("42", 1, f"{name}.env")
        for _ in range(100):
            if await newest(api, name) == 3:
                break
            await asyncio.sleep(0.05)
        msgs = await read_all(api, name)
    finally:
        await nc.close()
    assert (msgs[0].value, msgs[0].subject, msgs[0].replySubject) == (b"plain bytes", f"{name}.raw", "reply.to")
    assert (msgs[1].key, msgs[1].value, dict(msgs[1].headers)) == (b"k", b"enveloped", {"h": b"1"})
    assert (msgs[1].ackInbox, msgs[1].correlationId) == (f"acks.{name}", "42")
    assert msgs[2].value == not_publish and msgs[3].value == env[:-3]


async def test_streams_sharing_a_subject_and_groups(api: api_pb2_grpc.APIStub, name: str) -> None:
    subject = f"shared.{name}"
    await create(api, f"{name}-a", subject=subject)
    await create(api, f"{name}-b", subject=subject)
    await create(api, f"{name}-g1", subject=subject, group="g")
    await create(api, f"{name}-g2", subject=subject, group="g")
    for i in range(20):
        await api.PublishToSubject(api_pb2.PublishToSubjectRequest(subject=subject, value=b"%d" % i))
    await asyncio.sleep(0.3)  # acks come from the first stream; let the others finish writing
    a = await read_all(api, f"{name}-a")
    b = await read_all(api, f"{name}-b")
    g = await read_all(api, f"{name}-g1") + await read_all(api, f"{name}-g2")
    assert [m.value for m in a] == [m.value for m in b] == [b"%d" % i for i in range(20)]
    assert sorted(m.value for m in g) == sorted(b"%d" % i for i in range(20)), "a queue group splits the subject"


# -- subscribe --------------------------------------------------------------


async def test_subscribe_positions(api: api_pb2_grpc.APIStub, name: str) -> None:
    await create(api, name)
    stamps = []
    for i in range(10):
        ack = (await api.Publish(api_pb2.PublishRequest(stream=name, value=b"%d" % i))).ack
        stamps.append(ack.receptionTimestamp)

    async def values(**kw: Any) -> list[bytes]:
        return [m.value for m in await read_all(api, name, **kw)]

    assert await values() == [b"%d" % i for i in range(10)]
    assert await values(startPosition=api_pb2.OFFSET, startOffset=7) == [b"7", b"8", b"9"]
    assert await values(startPosition=api_pb2.LATEST) == [b"9"]
    assert await values(startPosition=api_pb2.TIMESTAMP, startTimestamp=stamps[5]) == [b"5", b"6", b"7", b"8", b"9"]
    assert await values(stopPosition=api_pb2.STOP_OFFSET, stopOffset=2) == [b"0", b"1", b"2"]
    assert await values(stopPosition=api_pb2.STOP_TIMESTAMP, stopTimestamp=stamps[1]) == [b"0", b"1"]


async def test_subscribe_new_only_follows(api: api_pb2_grpc.APIStub, name: str) -> None:
    await create(api, name)
    await api.Publish(api_pb2.PublishRequest(stream=name, value=b"before"))
    call = api.Subscribe(api_pb2.SubscribeRequest(stream=name))
    assert (await call.read()) == api_pb2.Message()
    for i in range(3):
        await api.Publish(api_pb2.PublishRequest(stream=name, value=b"after%d" % i))
    got = [await asyncio.wait_for(call.read(), 5) for _ in range(3)]
    assert [(m.offset, m.value) for m in got] == [(1, b"after0"), (2, b"after1"), (3, b"after2")]
    call.cancel()


async def test_subscribe_unknown_partition(api: api_pb2_grpc.APIStub, name: str) -> None:
    await create(api, name)
    err = await rpc_error(api.Subscribe(api_pb2.SubscribeRequest(stream=name, partition=1)).read())
    assert err.code() == grpc.StatusCode.NOT_FOUND and reason(err) == "no_such_partition"
    err = await rpc_error(api.Subscribe(api_pb2.SubscribeRequest(stream=f"{name}-missing")).read())
    assert err.code() == grpc.StatusCode.NOT_FOUND


async def test_slow_subscriber_does_not_hold_back_others(api: api_pb2_grpc.APIStub, name: str) -> None:
    await create(api, name)
    slow = api.Subscribe(api_pb2.SubscribeRequest(stream=name, startPosition=api_pb2.EARLIEST))
    assert (await slow.read()) == api_pb2.Message()  # then never reads again while we publish
    value = b"x" * 4096

    async def requests() -> AsyncIterator[api_pb2.PublishRequest]:
        for i in range(3000):
            yield api_pb2.PublishRequest(stream=name, value=value, correlationId=str(i))

    started = time.monotonic()
    acks = [r async for r in api.PublishAsync(requests())]
    assert len(acks) == 3000 and acks[-1].ack.offset == 2999
    fast = await read_all(api, name)
    assert len(fast) == 3000, "a second subscriber reads everything while the first one stalls"
    assert time.monotonic() - started < 60
    first = await asyncio.wait_for(slow.read(), 5)
    assert first.offset == 0
    slow.cancel()


# -- pause and readonly -------------------------------------------------------


async def test_pause_and_resume(api: api_pb2_grpc.APIStub, name: str) -> None:
    await create(api, name, partitions=2)
    await api.Publish(api_pb2.PublishRequest(stream=name, value=b"one"))
    await api.PauseStream(api_pb2.PauseStreamRequest(name=name, partitions=[0]))
    meta = (await api.FetchMetadata(api_pb2.FetchMetadataRequest(streams=[name]))).streamMetadata[0]
    assert meta.partitions[0].paused and not meta.partitions[1].paused
    assert meta.partitions[0].pauseTimestamps.firstTimestamp > 0
    assert meta.partitions[0].newestOffset == 0, "a paused partition still reports its offsets"
    err = await rpc_error(api.Subscribe(api_pb2.SubscribeRequest(stream=name)).read())
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and reason(err) == "paused"
    ack = await api.Publish(api_pb2.PublishRequest(stream=name, value=b"two"))  # publishing resumes it
    assert ack.ack.offset == 1
    await api.PauseStream(api_pb2.PauseStreamRequest(name=name))
    msgs = await read_all(api, name, resume=True)
    assert [m.value for m in msgs] == [b"one", b"two"]
    err = await rpc_error(api.PauseStream(api_pb2.PauseStreamRequest(name=name, partitions=[9])))
    assert err.code() == grpc.StatusCode.NOT_FOUND


async def test_readonly(api: api_pb2_grpc.APIStub, nats_server: NatsProcess, name: str) -> None:
    await create(api, name)
    await api.Publish(api_pb2.PublishRequest(stream=name, value=b"kept"))
    await api.SetStreamReadonly(api_pb2.SetStreamReadonlyRequest(name=name, readonly=True))
    err = await rpc_error(api.Publish(api_pb2.PublishRequest(stream=name, value=b"refused")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and reason(err) == "readonly"

    async def one() -> AsyncIterator[api_pb2.PublishRequest]:
        yield api_pb2.PublishRequest(stream=name, value=b"refused", correlationId="r")

    (resp,) = [r async for r in api.PublishAsync(one())]
    assert resp.asyncError.code == api_pb2.PublishAsyncError.READONLY
    nc = await nats.connect(nats_server.url)
    await nc.publish(name, b"plain refused")
    await nc.flush()
    await nc.close()
    await asyncio.sleep(0.2)
    assert [m.value for m in await read_all(api, name)] == [b"kept"]
    follower = api.Subscribe(api_pb2.SubscribeRequest(stream=name, startPosition=api_pb2.EARLIEST))
    assert (await follower.read()) == api_pb2.Message()
    assert (await follower.read()).value == b"kept"
    err = await rpc_error(follower.read())
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "end of readonly" in (err.details() or "")
    meta = await api.FetchPartitionMetadata(api_pb2.FetchPartitionMetadataRequest(stream=name))
    assert meta.metadata.readonly and meta.metadata.readonlyTimestamps.latestTimestamp > 0
    await api.SetStreamReadonly(api_pb2.SetStreamReadonlyRequest(name=name, readonly=False))
    assert (await api.Publish(api_pb2.PublishRequest(stream=name, value=b"again"))).ack.offset == 1


# -- metadata -----------------------------------------------------------------


async def test_fetch_metadata(api: api_pb2_grpc.APIStub, server: LiftlogProcess, name: str) -> None:
    await create(api, name, partitions=2)
    await api.Publish(api_pb2.PublishRequest(stream=name, partition=1, value=b"x"))
    resp = await api.FetchMetadata(api_pb2.FetchMetadataRequest(streams=[name, f"{name}-nope"]))
    (broker,) = resp.brokers
    assert (broker.id, broker.host, broker.port) == ("s1", "127.0.0.1", server.port)
    assert broker.partitionCount == broker.leaderCount >= 2
    known, unknown = resp.streamMetadata
    assert (known.name, known.subject, known.error, sorted(known.partitions)) == (name, name, 0, [0, 1])
    assert known.creationTimestamp > 0
    p1 = known.partitions[1]
    assert (p1.id, p1.leader, list(p1.isr), p1.highWatermark, p1.newestOffset) == (1, "s1", ["s1"], 0, 0)
    assert p1.messagesReceivedTimestamps.latestTimestamp >= p1.messagesReceivedTimestamps.firstTimestamp > 0
    assert unknown.error == api_pb2.StreamMetadata.UNKNOWN_STREAM
    every = await api.FetchMetadata(api_pb2.FetchMetadataRequest())
    assert name in {s.name for s in every.streamMetadata}


async def test_cursors_and_groups_answer_on_liftbridges_wire(api: api_pb2_grpc.APIStub, name: str) -> None:
    """Nothing UNIMPLEMENTED any more: cursors off is a FAILED_PRECONDITION naming the setting; groups work."""
    err = await rpc_error(api.SetCursor(api_pb2.SetCursorRequest(stream=name, cursorId="c", offset=1)))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "cursors.stream.partitions" in (err.details() or "")
    await create(api, name)
    joined = await api.JoinConsumerGroup(
        api_pb2.JoinConsumerGroupRequest(groupId=f"{name}-g", consumerId="c", streams=[name])
    )
    got = await api.FetchConsumerGroupAssignments(
        api_pb2.FetchConsumerGroupAssignmentsRequest(groupId=f"{name}-g", consumerId="c", epoch=joined.epoch)
    )
    assert [(a.stream, list(a.partitions)) for a in got.assignments] == [(name, [0])]
    await api.LeaveConsumerGroup(api_pb2.LeaveConsumerGroupRequest(groupId=f"{name}-g", consumerId="c"))


async def test_retention_per_stream(api: api_pb2_grpc.APIStub, name: str) -> None:
    await create(
        api,
        name,
        retentionMaxMessages=api_pb2.NullableInt64(value=100),
        segmentMaxBytes=api_pb2.NullableInt64(value=4096),
        cleanerInterval=api_pb2.NullableInt64(value=100),
    )

    async def requests() -> AsyncIterator[api_pb2.PublishRequest]:
        for i in range(2000):
            yield api_pb2.PublishRequest(stream=name, value=b"%04d" % i, correlationId=str(i))

    assert len([r async for r in api.PublishAsync(requests())]) == 2000
    for _ in range(60):
        msgs = await read_all(api, name)
        # The cleaner runs every 100 ms, also while this reads: a read it overtakes skips ahead to the new
        # log start (as it should), so wait for a read that no deletion interrupted.
        if len(msgs) < 1000 and msgs[0].offset == 2000 - len(msgs):
            break
        await asyncio.sleep(0.1)
    # Whole segments go, and one write batch (hundreds of messages when they arrive fast) may fill more
    # than a 4 KiB segment: what is left is at least 100 messages and at most a few batches.
    assert 100 <= len(msgs) < 1000, "old segments were deleted down to about 100 messages"
    assert msgs[-1].value == b"1999" and msgs[0].offset == 2000 - len(msgs)
