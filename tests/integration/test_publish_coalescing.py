"""PublishAsync requests that arrive together, against a real server: one record batch on NATS per
partition, each request still answered with its own offset, in request order.

The requests are written by hand in one socket write (HTTP/2 frames over ``asyncio.open_connection``), so
the server reads them together every time; a grpcio client's writes may or may not coalesce.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import grpc
import hpack
import nats
import pytest
from nats.aio.msg import Msg

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.api.batch_envelope import BATCH_MAGIC
from liftlog.api.envelope import MAGIC as ENVELOPE_MAGIC
from liftlog.rpc import wire
from liftlog.rpc.wire import END_HEADERS, END_STREAM, FrameType, Setting

from ..rpc.frames import FrameReader, grpc_message, request_headers
from .harness import LiftlogProcess, NatsProcess, create_when_ready, nats_settled, running

pytestmark = pytest.mark.slow

OK = api_pb2.PublishAsyncError


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, nats_server: NatsProcess) -> Iterator[LiftlogProcess]:
    with running(tmp_path_factory.mktemp("coalescing"), nats_server, "streams.max.message.bytes=4KiB") as proc:
        yield proc


@contextlib.asynccontextmanager
async def api_of(server: LiftlogProcess) -> AsyncIterator[api_pb2_grpc.APIStub]:
    async with grpc.aio.insecure_channel(server.address) as channel:
        yield api_pb2_grpc.APIStub(channel)


async def publish_in_one_write(
    server: LiftlogProcess, requests: Sequence[api_pb2.PublishRequest]
) -> list[api_pb2.PublishResponse]:
    """Send every request of one PublishAsync call in one write; its answers once the server ends the call."""
    host, port = server.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        body = b"".join(grpc_message(r.SerializeToString()) for r in requests)
        assert len(body) < 60_000, "stay inside the initial flow-control window"
        chunks = [body[i : i + 16_384] for i in range(0, len(body), 16_384)]
        headers = hpack.Encoder().encode(request_headers("/proto.API/PublishAsync"))
        window = [wire.settings_frame([(Setting.INITIAL_WINDOW_SIZE, 1 << 24)]), wire.window_update(0, 1 << 24)]
        out = [wire.PREFACE, *window, wire.frame(FrameType.HEADERS, END_HEADERS, 1, headers)]
        out += [
            wire.frame(FrameType.DATA, END_STREAM if i == len(chunks) - 1 else 0, 1, c) for i, c in enumerate(chunks)
        ]
        writer.write(b"".join(out))
        parser = FrameReader()
        data = bytearray()
        async with asyncio.timeout(20):
            while True:
                chunk = await reader.read(1 << 16)
                assert chunk, "the server closed the connection before ending the call"
                frames = parser.feed(chunk)
                for f in frames:
                    if f.stream_id == 1 and f.type == FrameType.DATA:
                        data += f.payload
                    elif f.stream_id == 1 and f.type == FrameType.RST_STREAM:
                        raise AssertionError("the call was reset")
                if any(f.stream_id == 1 and f.type == FrameType.HEADERS and f.flags & END_STREAM for f in frames):
                    break
    finally:
        writer.close()
    answers = []
    pos = 0
    while pos < len(data):
        size = int.from_bytes(data[pos + 1 : pos + 5], "big")
        answers.append(api_pb2.PublishResponse.FromString(bytes(data[pos + 5 : pos + 5 + size])))
        pos += 5 + size
    return answers


@contextlib.asynccontextmanager
async def on_nats(nats_server: NatsProcess, subject: str) -> AsyncIterator[list[bytes]]:
    """What plain NATS subscribers of ``subject`` receive."""
    nc = await nats.connect(nats_server.url)
    seen: list[bytes] = []

    async def take(msg: Msg) -> None:
        seen.append(msg.data)

    await nc.subscribe(subject, cb=take)
    await nats_settled(nc)
    try:
        yield seen
    finally:
        await nc.flush()
        await asyncio.sleep(0.2)
        await nc.close()


async def read_all(api: api_pb2_grpc.APIStub, stream: str, partition: int = 0) -> list[api_pb2.Message]:
    req = api_pb2.SubscribeRequest(
        stream=stream, partition=partition, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST
    )
    return [m async for m in api.Subscribe(req)][1:]


async def test_requests_read_together_go_to_nats_as_one_batch(
    server: LiftlogProcess, nats_server: NatsProcess, name: str
) -> None:
    async with api_of(server) as api:
        await api.CreateStream(api_pb2.CreateStreamRequest(name=name, subject=name))
        requests = [
            api_pb2.PublishRequest(
                stream=name,
                value=b"v%d" % i,
                key=b"k%d" % i if i % 2 else b"",
                headers={"h": b"%d" % i, "\x00fields": b"forged"} if i % 3 == 0 else {},
                correlationId=f"c{i}",
            )
            for i in range(300)
        ]
        async with on_nats(nats_server, name) as seen:
            answers = await publish_in_one_write(server, requests)
        assert [a.correlationId for a in answers] == [f"c{i}" for i in range(300)]
        assert [a.ack.offset for a in answers] == list(range(300))
        assert {a.ack.correlationId for a in answers} == {f"c{i}" for i in range(300)}
        assert all(a.ack.stream == name and a.ack.ackPolicy == api_pb2.LEADER for a in answers)
        # Far fewer NATS messages than requests, and they are record batches.
        assert 0 < len(seen) < 30 and seen[0].startswith(BATCH_MAGIC)

        stored = await read_all(api, name)
        assert [m.value for m in stored] == [b"v%d" % i for i in range(300)]
        assert [m.offset for m in stored] == list(range(300))
        assert [m.key for m in stored] == [b"k%d" % i if i % 2 else b"" for i in range(300)]
        # User headers kept, reserved ones dropped; as for a lone envelope, the server's ack inbox and route
        # id are not stored.
        assert [dict(m.headers) for m in stored] == [{"h": b"%d" % i} if i % 3 == 0 else {} for i in range(300)]
        assert all(not m.ackInbox and not m.correlationId for m in stored)
        assert all(m.subject == name and not m.replySubject for m in stored)


async def test_each_partition_stores_in_request_order(
    server: LiftlogProcess, nats_server: NatsProcess, name: str
) -> None:
    """Interleaved partitions, ack policies, a message too large, one with its own ack inbox."""
    async with api_of(server) as api:
        await api.CreateStream(api_pb2.CreateStreamRequest(name=name, subject=name, partitions=2))
        policies = [api_pb2.LEADER, api_pb2.LEADER, api_pb2.NONE, api_pb2.ALL]
        requests = []
        for i in range(200):
            req = api_pb2.PublishRequest(
                stream=name, partition=i % 2, value=b"%d" % i, ackPolicy=policies[i % 4], correlationId=f"c{i}"
            )
            if i == 48:
                req.value = b"x" * 5000  # over streams.max.message.bytes
            if i == 101:
                req.ackInbox = f"{name}.inbox"  # answered by the ack sent to that inbox
            requests.append(req)
        async with on_nats(nats_server, f"{name}.inbox") as inbox:
            answers = await publish_in_one_write(server, requests)
        answered = [r for r in requests if r.ackPolicy != api_pb2.NONE]
        assert [a.correlationId for a in answers] == [r.correlationId for r in answered]
        by_cid = {a.correlationId: a for a in answers}
        too_large = by_cid.pop("c48")
        assert too_large.asyncError.code == OK.BAD_REQUEST and "larger" in too_large.asyncError.message
        assert all(not a.HasField("asyncError") for a in by_cid.values())
        assert len(inbox) == 1  # the ack of c101, also sent where it asked

        for partition in (0, 1):
            stored = await read_all(api, name, partition)
            sent = [r for r in requests if r.partition == partition and r.correlationId != "c48"]
            assert [m.value for m in stored] == [r.value for r in sent]
            offsets = {m.value: m.offset for m in stored}
            for r in sent:
                if r.ackPolicy != api_pb2.NONE:
                    assert by_cid[r.correlationId].ack.offset == offsets[r.value], r.correlationId


async def test_a_wildcard_stream_on_the_subject_gets_every_message(
    server: LiftlogProcess, nats_server: NatsProcess, name: str
) -> None:
    async with api_of(server) as api:
        await api.CreateStream(api_pb2.CreateStreamRequest(name=name, subject=f"{name}.orders"))
        await api.CreateStream(api_pb2.CreateStreamRequest(name=f"{name}-all", subject=f"{name}.*"))
        requests = [api_pb2.PublishRequest(stream=name, value=b"%d" % i, correlationId=f"c{i}") for i in range(100)]
        answers = await publish_in_one_write(server, requests)
        assert len(answers) == 100 and all(not a.HasField("asyncError") for a in answers)
        for _ in range(50):  # the wildcard stream acks too, maybe later than the first ack answered
            wild = await read_all(api, f"{name}-all")
            if len(wild) == 100:
                break
            await asyncio.sleep(0.1)
        assert [m.value for m in wild] == [b"%d" % i for i in range(100)]
        # Its records keep the subject the messages came on (and not the server's ack fields).
        assert all(m.subject == f"{name}.orders" and not m.ackInbox and not m.correlationId for m in wild)


async def test_coalescing_off_keeps_one_envelope_per_message(
    tmp_path: Path, nats_server: NatsProcess, name: str
) -> None:
    with running(tmp_path, nats_server, "publish.async.coalesce=false") as server:
        async with api_of(server) as api:
            await create_when_ready(api, name)
            requests = [api_pb2.PublishRequest(stream=name, value=b"%d" % i) for i in range(100)]
            async with on_nats(nats_server, name) as seen:
                answers = await publish_in_one_write(server, requests)
            assert [a.ack.offset for a in answers] == list(range(100))
            assert len(seen) == 100 and all(data.startswith(ENVELOPE_MAGIC) for data in seen)


async def test_batches_stay_under_a_small_nats_max_payload(tmp_path: Path, name: str) -> None:
    """A nats-server that takes at most 8 KB per message: messages that fit alone are not failed together."""
    small = NatsProcess(tmp_path / "nats.log", config="max_payload: 8KB\n")
    try:
        with running(tmp_path, small) as server:
            async with api_of(server) as api:
                await create_when_ready(api, name)
                requests = [api_pb2.PublishRequest(stream=name, value=bytes([i]) * 1000) for i in range(40)]
                async with on_nats(small, name) as seen:
                    answers = await publish_in_one_write(server, requests)
                assert [a.ack.offset for a in answers] == list(range(40)), [a.asyncError for a in answers[:3]]
                assert 1 < len(seen) < 40 and max(len(data) for data in seen) <= 8192
                assert [m.value for m in await read_all(api, name)] == [r.value for r in requests]
    finally:
        small.stop()
