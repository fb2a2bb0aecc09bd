"""``liftlog.Batches/Fetch`` on the wire (grpcio stubs against a real server), and the client's reads on top.

Marked slow: the module starts real processes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from liftlog.api import api_pb2, api_pb2_grpc, batches_pb2, batches_pb2_grpc
from liftlog.client import Client, OffsetOutOfRangeError, PartitionPausedError
from liftlog.client.batches import decode_batches

from .harness import LiftlogProcess, NatsProcess
from .test_api_wire import create, read_all, rpc_error

pytestmark = pytest.mark.slow


@pytest.fixture
async def stubs(server: LiftlogProcess) -> AsyncIterator[tuple[api_pb2_grpc.APIStub, batches_pb2_grpc.BatchesStub]]:
    async with grpc.aio.insecure_channel(server.address) as channel:
        yield api_pb2_grpc.APIStub(channel), batches_pb2_grpc.BatchesStub(channel)


def reason(err: grpc.aio.AioRpcError) -> str | None:
    return dict(err.trailing_metadata() or ()).get("liftlog-error")


async def publish(api: api_pb2_grpc.APIStub, name: str, values: list[bytes]) -> None:
    async def requests() -> AsyncIterator[api_pb2.PublishRequest]:
        for i, v in enumerate(values):
            yield api_pb2.PublishRequest(stream=name, value=v, correlationId=str(i), ackPolicy=api_pb2.ALL)

    acks = [r async for r in api.PublishAsync(requests())]
    assert len(acks) == len(values) and not any(r.HasField("asyncError") for r in acks)


async def test_fetch_returns_committed_batches_from_an_offset(stubs: tuple, name: str) -> None:
    api, batches = stubs
    await create(api, name)
    await publish(api, name, [b"v%d" % i for i in range(50)])
    resp = await batches.Fetch(batches_pb2.FetchRequest(stream=name, offset=10))
    assert (resp.highWatermark, resp.logStartOffset, resp.nextOffset, resp.subject) == (49, 0, 50, name)
    cols, nxt = decode_batches(resp.batches, 10, resp.nextOffset, resp.subject)
    assert cols.offsets == list(range(10, 50)) and cols.values == [b"v%d" % i for i in range(10, 50)]
    assert nxt == 50

    bounded = await batches.Fetch(batches_pb2.FetchRequest(stream=name, offset=10, endOffset=20))
    assert bounded.nextOffset == 20, "endOffset bounds where the next fetch starts"
    cols, _ = decode_batches(bounded.batches, 10, bounded.nextOffset, name)
    assert cols.offsets == list(range(10, 20))

    small = await batches.Fetch(batches_pb2.FetchRequest(stream=name, offset=0, maxBytes=1))
    assert small.batches and small.nextOffset > 0, "one batch at least, however small maxBytes"

    at_end = await batches.Fetch(batches_pb2.FetchRequest(stream=name, offset=50))
    assert (at_end.batches, at_end.nextOffset, at_end.highWatermark) == (b"", 50, 49)


async def test_fetch_waits_for_new_data_up_to_max_wait(stubs: tuple, name: str) -> None:
    api, batches = stubs
    await create(api, name)
    started = time.monotonic()
    empty = await batches.Fetch(batches_pb2.FetchRequest(stream=name, offset=0, maxWaitMs=300))
    assert empty.batches == b"" and empty.highWatermark == -1 and time.monotonic() - started >= 0.25

    waiting = asyncio.ensure_future(batches.Fetch(batches_pb2.FetchRequest(stream=name, offset=0, maxWaitMs=10_000)))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await publish(api, name, [b"late"])
    resp = await asyncio.wait_for(waiting, 5)
    cols, _ = decode_batches(resp.batches, 0, resp.nextOffset, name)
    assert cols.values == [b"late"]


async def test_fetch_errors_name_the_problem(stubs: tuple, name: str) -> None:
    api, batches = stubs
    err = await rpc_error(batches.Fetch(batches_pb2.FetchRequest(stream=name)))
    assert err.code() == grpc.StatusCode.NOT_FOUND and reason(err) == "no_such_stream"
    await create(api, name)
    err = await rpc_error(batches.Fetch(batches_pb2.FetchRequest(stream=name, partition=3)))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    err = await rpc_error(batches.Fetch(batches_pb2.FetchRequest(stream=name, offset=-1)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "negative" in (err.details() or "")
    await publish(api, name, [b"a", b"b"])
    err = await rpc_error(batches.Fetch(batches_pb2.FetchRequest(stream=name, offset=9)))
    assert err.code() == grpc.StatusCode.OUT_OF_RANGE and reason(err) == "out_of_range"
    assert "past the end of the log (its next offset is 2)" in (err.details() or "")


async def test_fetch_below_the_log_start_is_out_of_range(stubs: tuple, server: LiftlogProcess, name: str) -> None:
    api, batches = stubs
    await create(
        api,
        name,
        retentionMaxMessages=api_pb2.NullableInt64(value=100),
        segmentMaxBytes=api_pb2.NullableInt64(value=4096),
        cleanerInterval=api_pb2.NullableInt64(value=100),
    )
    await publish(api, name, [b"%04d" % i for i in range(2000)])
    for _ in range(100):
        resp = await batches.Fetch(batches_pb2.FetchRequest(stream=name, offset=1999))
        if resp.logStartOffset > 0:
            break
        await asyncio.sleep(0.1)
    start = resp.logStartOffset
    assert start > 0, "retention removed old segments"
    err = await rpc_error(batches.Fetch(batches_pb2.FetchRequest(stream=name, offset=0)))
    assert err.code() == grpc.StatusCode.OUT_OF_RANGE
    assert f"offset 0 of stream {name!r} partition 0 is no longer in the log" in (err.details() or "")
    async with Client(server.address) as client:
        with pytest.raises(OffsetOutOfRangeError, match="removed by retention"):
            await client.fetch(name, offset=0)
        got = [c async for c in client.read_range(name, start_offset=start)]
        offsets = [o for c in got for o in c.offsets]
        assert offsets == list(range(start, 2000))


async def test_paused_partitions_need_resume(stubs: tuple, server: LiftlogProcess, name: str) -> None:
    api, batches = stubs
    await create(api, name)
    await publish(api, name, [b"x"])
    await api.PauseStream(api_pb2.PauseStreamRequest(name=name))
    err = await rpc_error(batches.Fetch(batches_pb2.FetchRequest(stream=name)))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and reason(err) == "paused"
    async with Client(server.address) as client:
        with pytest.raises(PartitionPausedError):
            await client.fetch(name)
        got = await client.fetch(name, resume=True)
        assert got.columns.values == [b"x"]


async def test_client_reads_match_subscribe(server: LiftlogProcess, name: str) -> None:
    """read_range over many fetches gives what a Subscribe gives, message for message."""
    async with Client(server.address) as client:
        await client.create_stream(name, name)
        await client.publish_many(name, [b"m%05d" % i for i in range(3000)], window=500)
        await client.publish(name, b"keyed", key=b"k", headers={"h": b"v"})
        cols = [c async for c in client.read_range(name, start_offset=5, max_bytes=4096)]
        assert len(cols) > 5, "many fetches"
        fetched = [m for c in cols for m in c.messages()]
        from liftlog.client import StartPosition, StopPosition

        sub = client.subscribe(
            name,
            start_position=StartPosition.OFFSET,
            start_offset=5,
            stop_position=StopPosition.STOP_OFFSET,
            stop_offset=3000,
            batched=False,  # one message per record: the server's other encoder
        )
        async with sub:
            subscribed = [m async for m in sub]
        assert fetched == subscribed
        assert fetched[-1].key == b"k" and fetched[-1].headers == {"h": b"v"} and fetched[-1].ack_policy == 0
        # A server's own ack inbox and route id are not stored (docs/security.md, "Acks").
        assert not fetched[-1].correlation_id and not fetched[-1].ack_inbox


# -- batched publish ---------------------------------------------------------------------


def batch_request(name: str, values: list[bytes], **kw: object) -> batches_pb2.PublishRequest:
    from liftlog.storage import NewRecord
    from liftlog.storage.records import encode_records

    records = encode_records([NewRecord(v) for v in values])
    return batches_pb2.PublishRequest(stream=name, records=records, count=len(values), **kw)  # type: ignore[arg-type]


async def test_a_batch_is_stored_at_consecutive_offsets_by_every_stream_on_its_subject(stubs: tuple, name: str) -> None:
    api, batches = stubs
    await create(api, name)
    await create(api, name + "-twin", subject=name)
    await publish(api, name, [b"first"])
    resp = await batches.Publish(batch_request(name, [b"a", b"b", b"c"], ackPolicy=api_pb2.ALL))
    assert (resp.baseOffset, resp.count, resp.partitionSubject) == (1, 3, name)
    assert resp.commitTimestamp >= resp.receptionTimestamp > 0
    got = await batches.Fetch(batches_pb2.FetchRequest(stream=name, offset=0))
    cols, _ = decode_batches(got.batches, 0, got.nextOffset, name)
    assert cols.values == [b"first", b"a", b"b", b"c"] and cols.offsets == [0, 1, 2, 3]
    for _ in range(50):  # the twin stream got the same NATS message
        twin = await batches.Fetch(batches_pb2.FetchRequest(stream=name + "-twin", offset=0))
        if twin.nextOffset >= 4:
            break
        await asyncio.sleep(0.05)
    cols, _ = decode_batches(twin.batches, 0, twin.nextOffset, name)
    assert cols.values == [b"first", b"a", b"b", b"c"]

    none = await batches.Publish(batch_request(name, [b"d"], ackPolicy=api_pb2.NONE))
    assert none.baseOffset == -1 and none.count == 1


async def test_batch_publish_errors_name_the_problem(stubs: tuple, name: str) -> None:
    api, batches = stubs
    err = await rpc_error(batches.Publish(batch_request(name, [b"a"])))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    await create(api, name, optimisticConcurrencyControl=api_pb2.NullableBool(value=True))
    bad = batch_request(name, [b"a", b"b"])
    err = await rpc_error(batches.Publish(batches_pb2.PublishRequest(stream=name, records=bad.records, count=3)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "not in the storage format" in (err.details() or "")
    err = await rpc_error(batches.Publish(batches_pb2.PublishRequest(stream=name, records=b"junk", count=1)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    over = (1 << 20) + 1024  # over streams.max.message.bytes, under the largest request the server reads
    err = await rpc_error(batches.Publish(batch_request(name, [b"a", b"x" * over])))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and reason(err) == "too_large"
    assert f"a message of the batch has {over} bytes" in (err.details() or "")
    err = await rpc_error(batches.Publish(batch_request(name, [b"a", b"x" * (2 << 20)])))  # not even read
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "streams.max.message.bytes" in (err.details() or "")
    err = await rpc_error(batches.Publish(batch_request(name, [b"a"], ackPolicy=7)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "ack policy 7" in (err.details() or "")
    err = await rpc_error(batches.Publish(batch_request(name, [b"y" * 1024] * 1040)))  # over one NATS message
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "NATS max payload" in (err.details() or "")
    ok = await batches.Publish(batch_request(name, [b"a", b"b"], expectedOffset=0))
    assert ok.baseOffset == 0
    err = await rpc_error(batches.Publish(batch_request(name, [b"c"], expectedOffset=0)))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and reason(err) == "incorrect_offset"
    await api.SetStreamReadonly(api_pb2.SetStreamReadonlyRequest(name=name, readonly=True))
    err = await rpc_error(batches.Publish(batch_request(name, [b"c"])))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and reason(err) == "readonly"


async def test_publish_many_sends_batches_and_raises_a_refusal_as_before(server: LiftlogProcess, name: str) -> None:
    from liftlog.client import AckPolicy, OutgoingMessage, PublishAsyncFailed, ReadonlyError

    async with Client(server.address) as client:
        await client.create_stream(name, name)
        # A str header value: publish_many takes it, though OutgoingMessage.headers says bytes (publish_async does not).
        outgoing = OutgoingMessage(b"last", key=b"k", headers={"h": "x"})
        values: list[bytes | OutgoingMessage] = [b"v%d" % i for i in range(2500)] + [outgoing]
        acks = await client.publish_many(name, values, window=1000, ack_policy=AckPolicy.ALL)
        assert [a.offset for a in acks] == list(range(2501))
        assert client._batches_offered, "the server offers batches"
        last = (await client.fetch(name, offset=2500)).columns.messages()[0]
        assert (last.value, last.key, last.headers) == (b"last", b"k", {"h": b"x"})
        await client.set_stream_readonly(name)
        with pytest.raises(PublishAsyncFailed) as failure:
            await client.publish_many(name, [b"refused"])
        assert isinstance(failure.value, ReadonlyError) and failure.value.acks == []


async def test_publish_many_without_acks_still_waits_for_them(server: LiftlogProcess, name: str) -> None:
    from liftlog.client import AckPolicy

    async with Client(server.address) as client:
        await client.create_stream(name, name)
        values = [b"v%d" % i for i in range(2500)]
        assert await client.publish_many(name, values, window=1000, ack_policy=AckPolicy.ALL, return_acks=False) == []
        info = await client.fetch_partition_metadata(name, 0)
        assert info.high_watermark == 2499, "every message was committed before the call returned"


async def test_publish_many_falls_back_to_publish_async_without_batches(
    server: LiftlogProcess, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As against a Liftbridge server: the first chunk is refused UNIMPLEMENTED, then all goes by PublishAsync."""
    from liftlog.client import UnimplementedError, publish_batches

    async def unimplemented(*args: object, **kwargs: object) -> list[object]:
        raise UnimplementedError("unknown service liftlog.Batches")

    monkeypatch.setattr(publish_batches, "_send", unimplemented)

    async def values() -> AsyncIterator[bytes]:
        for i in range(1500):
            yield b"%d" % i

    async with Client(server.address) as client:
        await client.create_stream(name, name)
        acks = await client.publish_many(name, values(), window=200)
        assert [a.offset for a in acks] == list(range(1500)) and all(a.correlation_id for a in acks)
        assert not client._batches_offered
        cols = [c async for c in client.read_range(name)]
        assert [v for c in cols for v in c.values] == [b"%d" % i for i in range(1500)], "nothing lost or repeated"
        # Records in the storage's terms (what the Spark sink sends) go by PublishAsync too, keys and headers kept.
        from liftlog.storage.records import NewRecord

        await client.publish_many(name, [NewRecord(b"r", b"k", {"h": b"x"})], window=200)
        last = (await client.fetch(name, offset=1500)).columns.messages()[0]
        assert (last.value, last.key, last.headers["h"]) == (b"r", b"k", b"x")


# -- batched subscribe -------------------------------------------------------------------


async def test_subscribe_sends_batches_only_when_asked(stubs: tuple, name: str) -> None:
    from liftlog.api import subscribe_batches

    api, _ = stubs
    await create(api, name)
    await publish(api, name, [b"v%d" % i for i in range(30)])
    req = api_pb2.SubscribeRequest(
        stream=name, startPosition=api_pb2.OFFSET, startOffset=4, stopPosition=api_pb2.STOP_OFFSET, stopOffset=20
    )
    plain = [m async for m in api.Subscribe(req)]
    assert plain[0] == api_pb2.Message(), "Liftbridge's empty set-up message, as before"
    assert [m.offset for m in plain[1:]] == list(range(4, 21))

    odd = [m async for m in api.Subscribe(req, metadata=((subscribe_batches.REQUEST_KEY, "yes"),))]
    assert odd == plain, "only the value 1 asks for batches"

    batched = [m async for m in api.Subscribe(req, metadata=((subscribe_batches.REQUEST_KEY, "1"),))]
    assert subscribe_batches.BATCHES_HEADER in batched[0].headers
    offsets: list[int] = []
    for m in batched[1:]:
        end = subscribe_batches.delivery_end(m)
        assert m.subject == name and m.offset == (offsets[-1] + 1 if offsets else 4)
        cols, nxt = decode_batches(m.value, m.offset, end, m.subject)
        assert nxt == end
        offsets += cols.offsets
    assert offsets == list(range(4, 21)), "the stop offset ends the call mid-batch"

    first_30 = await read_all(api, name)
    await asyncio.sleep(0.01)
    await publish(api, name, [b"later"])  # newer than all of them: where a stop timestamp ends
    by_time = api_pb2.SubscribeRequest(
        stream=name,
        startPosition=api_pb2.EARLIEST,
        stopPosition=api_pb2.STOP_TIMESTAMP,
        stopTimestamp=max(m.timestamp for m in first_30),
    )
    timed = [m async for m in api.Subscribe(by_time, metadata=((subscribe_batches.REQUEST_KEY, "1"),))]
    assert timed[0] == api_pb2.Message(), "a stop timestamp is served one message per record"
    assert [m.value for m in timed[1:]] == [b"v%d" % i for i in range(30)]


async def test_batched_and_per_message_subscriptions_deliver_the_same(
    server: LiftlogProcess, nats_server: NatsProcess, name: str
) -> None:
    """Every field of every message, over a wildcard stream, headers, keys, replies and odd start/stop offsets."""
    from liftlog.client import AckPolicy, StartPosition, StopPosition

    async with Client(server.address, nats_servers=[nats_server.url]) as client:
        await client.create_stream(f"{name}.*", name)
        for i in range(40):
            await client.nats_publish(f"{name}.s{i % 3}", b"n%d" % i, key=b"k%d" % i, headers={"i": b"%d" % i})
        await client.publish_many(name, [b"m%05d" % i for i in range(2500)], window=500, ack_policy=AckPolicy.ALL)
        await client.nats_publish(f"{name}.raw", b"no envelope", envelope=False)
        await client.nats_publish(f"{name}.acked", b"acked", ack_policy=AckPolicy.ALL)

        async def read(batched: bool, **kw: object) -> list:
            sub = client.subscribe(name, batched=batched, **kw)  # type: ignore[arg-type]
            async with sub:
                got = [m async for m in sub]
            assert sub.batched is batched, "the server agreed (or was not asked)"
            return got

        for kw in (
            {"start_position": StartPosition.EARLIEST, "stop_position": StopPosition.STOP_LATEST},
            {
                "start_position": StartPosition.OFFSET,
                "start_offset": 17,
                "stop_position": StopPosition.STOP_OFFSET,
                "stop_offset": 1234,
            },
        ):
            batched, one_by_one = await read(True, **kw), await read(False, **kw)
            assert batched == one_by_one and batched
        everything = await read(True, start_position=StartPosition.EARLIEST, stop_position=StopPosition.STOP_LATEST)
        assert len(everything) == 40 + 2500 + 2
        assert {m.subject for m in everything[:40]} == {f"{name}.s0", f"{name}.s1", f"{name}.s2"}
        assert everything[5].key == b"k5" and everything[5].headers == {"i": b"5"}
        assert everything[-1].ack_inbox and everything[-1].ack_policy == AckPolicy.ALL
        assert everything[-2].value == b"no envelope" and everything[-2].subject == f"{name}.raw"


async def test_a_batched_subscription_follows_new_messages(server: LiftlogProcess, name: str) -> None:
    async with Client(server.address) as client:
        await client.create_stream(name, name)
        await client.publish(name, b"old")
        async with client.subscribe(name) as sub:  # NEW_ONLY
            assert sub.batched
            await client.publish(name, b"first")
            first = await asyncio.wait_for(sub.__anext__(), 5)
            await client.publish_many(name, [b"x%d" % i for i in range(3000)], window=1000)
            rest = [await asyncio.wait_for(sub.__anext__(), 5) for _ in range(3000)]
        assert (first.offset, first.value) == (1, b"first")
        assert [m.offset for m in rest] == list(range(2, 3002))
