"""Bounded resources against a real server process: idle subscriptions, subscription limits, PublishAsync
backpressure, and rate-limited warnings for garbage on internal subjects.

Marked slow: each test starts its own server (its own settings, its own RSS to measure).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import nats
import pytest

from liftlog.api import api_pb2, api_pb2_grpc

from .harness import LiftlogProcess, NatsProcess, create_when_ready, running

pytestmark = pytest.mark.slow


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def channel(server: LiftlogProcess) -> grpc.aio.Channel:
    # A private subchannel pool: each channel is its own TCP connection, i.e. its own gRPC peer.
    return grpc.aio.insecure_channel(server.address, options=[("grpc.use_local_subchannel_pool", 1)])


@contextlib.asynccontextmanager
async def api_of(server: LiftlogProcess) -> AsyncIterator[api_pb2_grpc.APIStub]:
    async with channel(server) as ch:
        yield api_pb2_grpc.APIStub(ch)


async def newest(api: api_pb2_grpc.APIStub, name: str) -> int:
    resp = await api.FetchPartitionMetadata(api_pb2.FetchPartitionMetadataRequest(stream=name, partition=0))
    return resp.metadata.newestOffset


async def subscribe(api: api_pb2_grpc.APIStub, name: str) -> grpc.aio.UnaryStreamCall:
    call = api.Subscribe(api_pb2.SubscribeRequest(stream=name, startPosition=api_pb2.EARLIEST))
    assert await call.read() == api_pb2.Message()  # set up; the client never reads again
    return call


async def test_idle_subscriptions_cost_little_and_give_it_back(tmp_path: Path, nats_server: NatsProcess) -> None:
    with running(tmp_path, nats_server) as server:
        assert server.proc is not None
        pid = server.proc.pid
        async with api_of(server) as api:
            await create_when_ready(api, "mem")

            async def requests() -> AsyncIterator[api_pb2.PublishRequest]:
                for _ in range(3000):
                    yield api_pb2.PublishRequest(stream="mem", value=b"v" * 1024)

            assert len([r async for r in api.PublishAsync(requests())]) == 3000
            await asyncio.sleep(1)
            before = rss_kib(pid)
            # Each has 3 MB to send and a client that does not read: the server must not read ahead.
            calls = [await subscribe(api, "mem") for _ in range(100)]
            await asyncio.sleep(2)
            opened = rss_kib(pid)
            for call in calls:
                call.cancel()
            await asyncio.sleep(2)
            closed = rss_kib(pid)
    per_subscription = (opened - before) / 100
    # Measured: about 57 KiB each (32 KiB of buffered messages, the rest gRPC's); 930 KiB before the bound.
    assert per_subscription < 160, f"{per_subscription:.0f} KiB per idle subscription (RSS {before} -> {opened})"
    assert closed - before < 12 * 1024, f"RSS {before} KiB before, {opened} open, {closed} after closing them"


async def test_subscription_limits_per_server_and_per_connection(tmp_path: Path, nats_server: NatsProcess) -> None:
    settings = ("subscribe.max.concurrent=4", "subscribe.max.concurrent.per.connection=2")
    with running(tmp_path, nats_server, *settings) as server:
        async with api_of(server) as a, api_of(server) as b, api_of(server) as c:
            await create_when_ready(a, "lim")
            on_a = [await subscribe(a, "lim") for _ in range(2)]
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await subscribe(a, "lim")
            err = info.value
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "subscribe.max.concurrent.per.connection" in (err.details() or "")
            assert "2 are open, the limit is 2" in (err.details() or "")
            assert dict(err.trailing_metadata() or ()).get("liftlog-error") == "limit_exceeded"

            on_b = [await subscribe(b, "lim") for _ in range(2)]
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await subscribe(c, "lim")
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "4 are open, the limit is 4 (setting subscribe.max.concurrent)" in (info.value.details() or "")

            on_a.pop().cancel()  # a closed subscription frees its place, on the server and on its connection
            for _ in range(50):
                try:
                    on_c = await subscribe(c, "lim")
                    break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("a freed place was not given to the next subscriber")
            for call in [*on_a, *on_b, on_c]:
                call.cancel()


async def test_publish_async_stops_reading_a_client_that_takes_no_acks(
    tmp_path: Path, nats_server: NatsProcess
) -> None:
    total = 20_000
    cid = "c" * 1000  # big answers: gRPC's windows and the socket buffers hold only a few thousand
    with running(tmp_path, nats_server, "publish.async.max.inflight=32") as server:
        async with api_of(server) as api, api_of(server) as observer:
            await create_when_ready(api, "bp")
            call = api.PublishAsync()

            async def send() -> None:
                for i in range(total):
                    await call.write(api_pb2.PublishRequest(stream="bp", value=b"%d" % i, correlationId=f"{i}{cid}"))
                await call.done_writing()

            writer = asyncio.get_running_loop().create_task(send())
            # The client reads no acks: the server answers what fits gRPC's window, then stops reading.
            stored = -1
            for _ in range(100):
                await asyncio.sleep(0.5)
                now = await newest(observer, "bp")
                if now == stored:
                    break
                stored = now
            assert not writer.done()
            assert 0 < stored + 1 < total // 2, f"the server took {stored + 1} of {total} requests unanswered"

            responses: list[api_pb2.PublishResponse] = []
            while len(responses) < total:
                response = await asyncio.wait_for(call.read(), 30)
                assert response is not grpc.aio.EOF
                responses.append(response)
            await writer
            assert await call.read() is grpc.aio.EOF
    assert [r.correlationId for r in responses] == [f"{i}{cid}" for i in range(total)]
    assert [r.ack.offset for r in responses] == list(range(total)), "every message acked, in order, none lost"


async def test_garbage_on_internal_subjects_logs_a_few_lines_with_counts(
    tmp_path: Path, nats_server: NatsProcess
) -> None:
    # Without a secret: with one, garbage is dropped as unsigned before any decoder sees it (test_cluster_auth).
    with running(tmp_path, nats_server, "logging.warnings.interval=1s", "clustering.auth.insecure=true") as server:
        async with api_of(server) as api:
            await create_when_ready(api, "g")
        start = server.log_path.stat().st_size
        nc = await nats.connect(nats_server.url)
        try:
            prefix = f"liftbridge-default.raft.metadata.{server.server_id}"
            subjects = [prefix, f"{prefix}.propose", "liftbridge-default.raft.metadata.join"]
            subjects.append(f"liftbridge-default.notify.{server.server_id}")
            for i in range(2064):
                await nc.publish(subjects[i % len(subjects)], b"\xff" + os.urandom(i % 30))
            await nc.flush()
        finally:
            await nc.close()
        await asyncio.sleep(2.5)  # past the interval: the counts are logged without further garbage
        with open(server.log_path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if "malformed" in line]
    for kind in ("Raft message", "metadata change", "join request", "notification"):
        assert 1 <= len([line for line in lines if f"malformed {kind}" in line]) <= 4, "\n".join(lines)
    logged = len(lines)
    dropped = sum(int(line.split("(and ")[1].split()[0]) for line in lines if "more dropped" in line)
    assert logged + dropped == 2064, "\n".join(lines)
