"""Idempotent publishing with message ids, on real servers: a message with an id is stored once within the
window, whichever way it came (gRPC, batched, a NATS envelope, NATS headers), across a restart and a leader
change; our client gives every publish an id and keeps it across retries."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import nats
import pytest

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.client import AckPolicy, Client, StartPosition, StopPosition
from liftlog.metadata.controller import CreateStreamRequest
from liftlog.server.server import Server
from liftlog.storage import NewRecord
from liftlog.storage.faults import FaultyFileIO

from .conftest import in_process_server, start_cluster, stop_all

pytestmark = pytest.mark.timeout(90)
ID = "Nats-Msg-Id"


@pytest.fixture(params=[True, False], ids=["lean", "nats-py"])
async def server(request: pytest.FixtureRequest, tmp_path: Path, nats_url: str) -> AsyncIterator[Server]:
    server = in_process_server(
        tmp_path / "data", nats_url, f"ids-{secrets.token_hex(4)}", **{"nats.lean.connection": request.param}
    )
    await server.start()
    try:
        assert server.cluster is not None
        await asyncio.wait_for(server.cluster.create_stream(CreateStreamRequest("orders", "orders")), 10)
        yield server
    finally:
        await server.stop()


async def values(client: Client, stream: str = "orders") -> list[bytes]:
    return [bytes(v) for cols in [c async for c in client.read_range(stream)] for v in cols.values]


async def test_a_retried_publish_is_stored_once_and_acked_with_the_original_offset(server: Server) -> None:
    async with Client(server.address) as client:
        first = await client.publish("orders", b"a", msg_id="order-1", ack_policy=AckPolicy.ALL)
        await client.publish("orders", b"b")
        again = await client.publish("orders", b"a (retry)", msg_id="order-1", ack_policy=AckPolicy.ALL)
        leader = await client.publish("orders", b"a (retry)", msg_id="order-1", ack_policy=AckPolicy.LEADER)
        assert first is not None and again is not None and leader is not None
        assert (first.offset, first.duplicate) == (0, False)
        assert (again.offset, again.duplicate, leader.offset, leader.duplicate) == (0, True, 0, True)
        # The client's own ids are random: the same value published twice is two messages.
        await client.publish("orders", b"b")
        assert await values(client) == [b"a", b"b", b"b"]


async def test_ids_in_nats_headers_and_in_envelopes_are_honoured(server: Server, nats_url: str) -> None:
    app = await nats.connect(nats_url)
    try:
        await asyncio.sleep(0.2)  # the intake listens
        for value in (b"plain", b"plain again"):
            await app.publish("orders", value, headers={ID: "plain-1"})
        await app.flush()
        async with Client(server.address, nats_servers=[nats_url]) as client:
            for value in (b"envelope", b"envelope again"):
                ack = await client.nats_publish("orders", value, msg_id="env-1", ack_policy=AckPolicy.LEADER)
            assert ack is not None and ack.duplicate
            for _ in range(50):
                if len(await values(client)) >= 2:
                    break
                await asyncio.sleep(0.05)
            assert await values(client) == [b"plain", b"envelope"]
    finally:
        await app.close()


async def test_batched_publishes_are_deduplicated_per_record(server: Server) -> None:
    def records(*ids: str) -> list[NewRecord]:
        return [NewRecord(b"v-" + i.encode(), None, {ID: i.encode()}) for i in ids]

    async with Client(server.address) as client:
        acks = await client.publish_many("orders", records("1", "2", "3"))
        assert [(a.offset, a.duplicate) for a in acks] == [(0, False), (1, False), (2, False)]
        again = await client.publish_many("orders", records("1", "2", "3"))  # the whole chunk sent again
        assert [(a.offset, a.duplicate) for a in again] == [(0, True), (1, True), (2, True)]
        partial = await client.publish_many("orders", records("4", "2", "5"))
        assert [(a.offset, a.duplicate) for a in partial] == [(3, False), (1, True), (4, False)]
        assert await values(client) == [b"v-1", b"v-2", b"v-3", b"v-4", b"v-5"]
        # Without ids of their own, publish_many's chunks get one each; sent once, every message is new.
        fresh = await client.publish_many("orders", [b"x", b"x", b"x"])
        assert [a.offset for a in fresh] == [5, 6, 7] and not any(a.duplicate for a in fresh)


async def test_a_chunk_sent_again_is_stored_once_by_its_batch_id(server: Server) -> None:
    """What publish_many's chunks carry (one hidden \\x00batch header on the first record), sent twice as a retry
    sends it: the second is answered with the first's offsets."""
    chunk = [NewRecord(b"first", None, {"\x00batch": b"chunk-1"}), NewRecord(b"second"), NewRecord(b"third")]
    async with Client(server.address) as client:
        await client.publish("orders", b"before")
        acks = await client.publish_many("orders", chunk, ack_policy=AckPolicy.ALL)
        again = await client.publish_many("orders", chunk, ack_policy=AckPolicy.ALL)
        assert [(a.offset, a.duplicate) for a in acks] == [(1, False), (2, False), (3, False)]
        assert [(a.offset, a.duplicate) for a in again] == [(1, True), (2, True), (3, True)]
        assert await values(client) == [b"before", b"first", b"second", b"third"]
        # The batch id is the server's business: no reader sees it, by any read path.
        for batched in (True, False):
            sub = client.subscribe(
                "orders", start_position=StartPosition.EARLIEST, stop_position=StopPosition.STOP_LATEST, batched=batched
            )
            read = [m async for m in sub]
            assert [dict(m.headers) for m in read[1:]] == [{}, {}, {}]
        columns = [c async for c in client.read_range("orders")]
        assert [dict(m.headers) for cols in columns for m in cols.messages()][1:] == [{}, {}, {}]


async def test_coalesced_publish_async_requests_are_answered_per_request(server: Server) -> None:
    async with grpc.aio.insecure_channel(server.address) as ch:
        api = api_pb2_grpc.APIStub(ch)

        async def requests(ids: list[str]) -> AsyncIterator[api_pb2.PublishRequest]:
            for i, msg_id in enumerate(ids):
                yield api_pb2.PublishRequest(
                    stream="orders", value=msg_id.encode(), headers={ID: msg_id.encode()}, correlationId=f"c{i}"
                )

        first = [r async for r in api.PublishAsync(requests(["a", "b", "c"]))]
        second = [r async for r in api.PublishAsync(requests(["d", "b", "a", "e"]))]
    assert [(r.ack.offset, r.ack.duplicate) for r in first] == [(0, False), (1, False), (2, False)]
    assert [(r.correlationId, r.ack.offset, r.ack.duplicate) for r in second] == [
        ("c0", 3, False),
        ("c1", 1, True),
        ("c2", 0, True),
        ("c3", 4, False),
    ]


async def test_the_window_survives_a_restart_and_then_passes(tmp_path: Path, nats_url: str) -> None:
    namespace = f"ids-{secrets.token_hex(4)}"
    server = in_process_server(tmp_path / "data", nats_url, namespace)
    await server.start()
    try:
        async with Client(server.address) as client:
            await client.create_stream("short", "short", duplicate_window_ms=1500)
            await client.publish("short", b"a", msg_id="x")
    finally:
        await server.stop()
    server = in_process_server(tmp_path / "data", nats_url, namespace)
    await server.start()
    try:
        async with Client(server.address) as client:
            ack = await client.publish("short", b"a", msg_id="x")
            assert ack is not None and (ack.offset, ack.duplicate) == (0, True), "rebuilt from the log"
            await asyncio.sleep(1.6)
            ack = await client.publish("short", b"a", msg_id="x")
            assert ack is not None and (ack.offset, ack.duplicate) == (1, False), "the window passed"
    finally:
        await server.stop()


async def test_a_new_leader_knows_the_ids_its_predecessor_stored(tmp_path: Path, nats_url: str) -> None:
    servers = await start_cluster(tmp_path, nats_url, {s: FaultyFileIO() for s in ("a", "b", "c")})
    try:
        a = servers["a"]
        assert a.cluster is not None
        await asyncio.wait_for(
            a.cluster.create_stream(CreateStreamRequest("orders", "orders", replication_factor=3)), 15
        )
        addresses = [s.address for s in servers.values()]
        async with Client(addresses) as client:
            ack = await client.publish("orders", b"once", msg_id="m-1", ack_policy=AckPolicy.ALL)
            assert ack is not None
            old = a.cluster.metadata.streams["orders"].partitions[0].leader
            await servers[old].stop()
            survivor = next(s for sid, s in servers.items() if sid != old)
            assert survivor.cluster is not None
            for _ in range(200):
                leader = survivor.cluster.metadata.streams["orders"].partitions[0].leader
                if leader != old:
                    break
                await asyncio.sleep(0.05)
            assert leader != old
            for _ in range(100):
                try:
                    again = await client.publish("orders", b"once", msg_id="m-1", ack_policy=AckPolicy.ALL, timeout=2)
                    break
                except Exception:
                    await asyncio.sleep(0.1)
            assert again is not None and (again.offset, again.duplicate) == (ack.offset, True)
    finally:
        await stop_all(servers)
