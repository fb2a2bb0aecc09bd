"""nats-py's shape on the lean connection (what the replicator uses), against a real nats-server, plain
and wrapped by the cluster's signing AuthenticatedNats."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.errors import TimeoutError as NatsPyTimeout

from liftlog.api import api_pb2
from liftlog.api.envelope import encode_ack
from liftlog.natswire import LeanNats
from liftlog.natswire.client import LeanMessage, LeanNatsClient, NatsNoResponders, NatsRequestTimeout
from liftlog.security.cluster_auth import ClusterAuth
from liftlog.server.nats.authenticated_nats import AuthenticatedNats, internal_subjects
from liftlog.server.nats.nats_types import NatsMessage
from liftlog.server.partitions.acks import AckRouter
from tests.integration.harness import NatsProcess

KEY = b"0123456789abcdef0123456789abcdef"


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsProcess]:
    proc = NatsProcess(tmp_path / "nats.log")
    yield proc
    proc.stop()


@pytest.fixture
async def pair(nats_server: NatsProcess) -> AsyncIterator[tuple[LeanNatsClient, LeanNatsClient]]:
    conns = [LeanNats([nats_server.url]) for _ in range(2)]
    for conn in conns:
        await conn.connect()
    yield LeanNatsClient(conns[0]), LeanNatsClient(conns[1])
    for conn in conns:
        await conn.close()


async def test_requests_are_answered_and_callbacks_run_in_order(pair: tuple[LeanNatsClient, LeanNatsClient]) -> None:
    server, client = pair
    seen: list[bytes] = []

    async def answer(msg: LeanMessage) -> None:
        seen.append(msg.data)
        await asyncio.sleep(0)  # a callback that yields still sees its messages in order
        if msg.reply:
            await msg.respond(b"re:" + msg.data)

    await server.subscribe("fetch.a", cb=answer)
    await server.conn.flush()
    replies = await asyncio.gather(*(client.request("fetch.a", b"%d" % i, timeout=5) for i in range(50)))
    assert [r.data for r in replies] == [b"re:%d" % i for i in range(50)]  # each reply to its own request
    for i in range(200):
        await client.publish("fetch.a", b"n%d" % i)
    await client.conn.flush()
    for _ in range(500):
        if len(seen) == 250:
            break
        await asyncio.sleep(0.01)
    assert seen[50:] == [b"n%d" % i for i in range(200)]


async def test_no_responders_fails_at_once_and_silence_times_out(pair: tuple[LeanNatsClient, LeanNatsClient]) -> None:
    server, client = pair
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(NatsNoResponders):
        await client.request("nobody.here", b"x", timeout=5)
    assert loop.time() - started < 2

    async def silent(msg: LeanMessage) -> None:
        pass

    await server.subscribe("silent", cb=silent)
    await server.conn.flush()
    with pytest.raises(NatsRequestTimeout, match=r"no reply on silent within 0\.2s"):
        await client.request("silent", b"x", timeout=0.2)
    assert not client._waiting  # nothing left behind


async def test_a_failing_callback_does_not_stop_the_subscription_and_drain_hands_over_the_rest(
    pair: tuple[LeanNatsClient, LeanNatsClient],
) -> None:
    server, client = pair
    seen: list[bytes] = []
    gate = asyncio.Event()

    async def handler(msg: LeanMessage) -> None:
        await gate.wait()
        seen.append(msg.data)
        if msg.data == b"0":
            raise RuntimeError("boom")

    sub = await server.subscribe("work", cb=handler)
    await server.conn.flush()
    for i in range(5):
        await client.publish("work", b"%d" % i)
    await client.conn.flush()
    await server.conn.flush()
    assert sub.pending_msgs >= 4  # the first is in the handler, waiting at the gate
    gate.set()
    await asyncio.wait_for(sub.drain(), 5)
    assert seen == [b"0", b"1", b"2", b"3", b"4"]
    await client.publish("work", b"after")
    await client.conn.flush()
    await asyncio.sleep(0.05)
    assert seen[-1] == b"4"  # unsubscribed


def signer(client: LeanNatsClient) -> AuthenticatedNats:
    auth = ClusterAuth(KEY, boot=os.urandom(8), started=time.time_ns() - 10**9, max_age=30 * 10**9)
    return AuthenticatedNats(client, auth, internal_subjects("ns"))


async def test_signed_requests_and_replies_on_the_lean_connection(
    pair: tuple[LeanNatsClient, LeanNatsClient], nats_server: NatsProcess
) -> None:
    server, client = signer(pair[0]), signer(pair[1])

    async def answer(msg: NatsMessage) -> None:
        await msg.respond(b"pong:" + msg.data)

    await server.subscribe("ns.replication.fetch.a", cb=answer)
    await pair[0].conn.flush()
    reply = await client.request("ns.replication.fetch.a", b"ping", timeout=5)
    assert reply.data == b"pong:ping"

    # A plain nats-py peer answering unsigned on the same subject: its reply counts as none.
    forger = await nats.connect(nats_server.url)

    async def plain(msg: nats.aio.msg.Msg) -> None:
        await msg.respond(b"forged")

    await forger.subscribe("ns.replication.fetch.b", cb=plain)
    await forger.flush()
    await asyncio.sleep(0.05)
    with pytest.raises(NatsPyTimeout):
        await client.request("ns.replication.fetch.b", b"ping", timeout=1)
    assert client.dropped["unsigned"] == 1
    await forger.close()


async def test_drain_waits_for_the_callback_in_progress(pair: tuple[LeanNatsClient, LeanNatsClient]) -> None:
    server, client = pair
    done: list[bytes] = []

    async def slow(msg: LeanMessage) -> None:
        await asyncio.sleep(0.2)
        done.append(msg.data)

    sub = await server.subscribe("slow", cb=slow)
    await server.conn.flush()
    await client.publish("slow", b"last")
    await client.conn.flush()
    await server.conn.flush()
    await asyncio.sleep(0.05)  # taken off the queue, in the callback
    assert sub.pending_msgs == 0 and not done
    await asyncio.wait_for(sub.drain(), 5)
    assert done == [b"last"]  # finished, not cancelled halfway


async def test_the_ack_inbox_on_the_lean_connection_survives_hostile_acks(
    pair: tuple[LeanNatsClient, LeanNatsClient], nats_server: NatsProcess
) -> None:
    """Anyone who can publish on NATS can reach a server's ack inbox: garbage, a truncated ack, a huge
    payload and acks for nobody's correlation id are dropped, and the real ack still gets through."""
    server, _ = pair
    router = AckRouter("s1")
    await router.start(server)
    await server.conn.flush()
    inbox, cid, waiting = router.expect("orders", api_pb2.ALL, "orders")
    fields: dict[str, Any] = {
        "stream": "orders",
        "partitionSubject": "orders",
        "msgSubject": "orders",
        "ackPolicy": api_pb2.ALL,
    }
    good = encode_ack(api_pb2.Ack(ackInbox=inbox, correlationId=cid, offset=42, **fields))
    hostile = await nats.connect(nats_server.url)
    try:
        for payload in (
            b"",
            b"\x00" * 3,
            b"not an envelope at all",
            good[: len(good) // 2],  # truncated
            b"\xff" * (512 * 1024),  # huge garbage
            encode_ack(api_pb2.Ack(ackInbox=inbox, correlationId="nobody", offset=7, **fields)),  # forged, unknown
            encode_ack(api_pb2.Ack(ackInbox="elsewhere", correlationId=cid, offset=7, **fields)),  # the wrong inbox
            # The right id, but for another stream, another subject or another policy.
            encode_ack(api_pb2.Ack(ackInbox=inbox, correlationId=cid, offset=7, **{**fields, "stream": "other"})),
            encode_ack(api_pb2.Ack(ackInbox=inbox, correlationId=cid, offset=7, **{**fields, "msgSubject": "x"})),
            encode_ack(api_pb2.Ack(ackInbox=inbox, correlationId=cid, offset=7, **{**fields, "ackPolicy": 0})),
        ):
            await hostile.publish(router.inbox, payload)
        await hostile.publish(router.inbox, good)
        await hostile.flush()
        ack = await asyncio.wait_for(waiting, 5)
        assert ack.offset == 42
        assert router.waiting == 0
        assert router.dropped == {"no_waiter": 1, "mismatch": 3, "other_stream": 1}
        # A replay of the same ack finds no waiter and changes nothing.
        await hostile.publish(router.inbox, good)
        await hostile.flush()
        await asyncio.sleep(0.05)
        assert router.waiting == 0 and server.conn.is_connected
    finally:
        await hostile.close()
        await router.stop()
