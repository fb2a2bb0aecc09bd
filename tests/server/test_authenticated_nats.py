"""The signing NATS wrapper on a real nats-server: what it seals, what it passes through, what it drops."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.errors import TimeoutError as NatsTimeoutError

from liftlog.security.cluster_auth import TRAILER_SIZE, ClusterAuth, ReplayGuard
from liftlog.server.nats.authenticated_nats import AuthenticatedNats, internal_subjects
from liftlog.server.nats.nats_types import NatsMessage
from tests.integration.harness import nats_settled

KEY = b"0123456789abcdef0123456789abcdef"


def signer(nc: NatsClient, key: bytes = KEY) -> AuthenticatedNats:
    auth = ClusterAuth(key, boot=os.urandom(8), started=time.time_ns() - 10**9, max_age=30 * 10**9)
    return AuthenticatedNats(nc, auth, internal_subjects("ns"))


@pytest.fixture
async def second(nats_url: str) -> AsyncIterator[NatsClient]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()


async def received(nc: NatsClient, subject: str) -> asyncio.Queue[bytes]:
    queue: asyncio.Queue[bytes] = asyncio.Queue()

    async def put(msg: nats.aio.msg.Msg) -> None:
        await queue.put(msg.data)

    await nc.subscribe(subject, cb=put)
    await nats_settled(nc)
    return queue


async def test_internal_subjects_are_sealed_and_others_pass_unchanged(nc: NatsClient, second: NatsClient) -> None:
    wrapped = signer(nc)
    internal = await received(second, "ns.raft.metadata.a")
    inbox = await received(second, "_INBOX.liftlog.a.123")
    stream = await received(second, "orders")
    client_inbox = await received(second, "_INBOX.client.1")
    await wrapped.publish("ns.raft.metadata.a", b"raft")
    await wrapped.publish("_INBOX.liftlog.a.123", b"ack")
    await wrapped.publish("orders", b"data")
    await wrapped.publish("_INBOX.client.1", b"client ack")
    sealed = await asyncio.wait_for(internal.get(), 5)
    assert len(sealed) == 4 + TRAILER_SIZE
    assert signer(nc).auth.open("ns.raft.metadata.a", sealed, time.time_ns(), ReplayGuard()) == b"raft"
    assert len(await asyncio.wait_for(inbox.get(), 5)) == 3 + TRAILER_SIZE
    assert await asyncio.wait_for(stream.get(), 5) == b"data"
    assert await asyncio.wait_for(client_inbox.get(), 5) == b"client ack"


async def test_requests_and_replies_are_sealed_both_ways(nc: NatsClient, second: NatsClient) -> None:
    server, client = signer(nc), signer(second)
    seen: list[bytes] = []

    async def answer(msg: NatsMessage) -> None:
        seen.append(msg.data)
        await msg.respond(b"pong:" + msg.data)

    await server.subscribe("ns.x.propose", cb=answer)
    await nats_settled(nc)
    reply = await client.request("ns.x.propose", b"ping", timeout=5)
    assert reply.data == b"pong:ping"
    assert seen == [b"ping"]


async def test_concurrent_first_requests_share_one_reply_subscription(nc: NatsClient, second: NatsClient) -> None:
    server, client = signer(nc), signer(second)

    async def answer(msg: NatsMessage) -> None:
        await msg.respond(b"pong:" + msg.data)

    await server.subscribe("ns.x.propose", cb=answer)
    await nats_settled(nc)
    subscribed = 0
    inner_subscribe = second.subscribe

    async def counting_subscribe(*args: Any, **kwargs: Any) -> Any:
        nonlocal subscribed
        subscribed += 1
        await asyncio.sleep(0.01)  # a client that waits for the server's word (our lean client may)
        return await inner_subscribe(*args, **kwargs)

    second.subscribe = counting_subscribe  # type: ignore[method-assign]
    replies = await asyncio.gather(*(client.request("ns.x.propose", b"%d" % i, timeout=5) for i in range(5)))
    assert sorted(r.data for r in replies) == [b"pong:%d" % i for i in range(5)]
    assert subscribed == 1, "each reply would otherwise arrive once per subscription, and all but one be dropped"


async def test_an_unsigned_reply_counts_as_no_reply(nc: NatsClient, second: NatsClient) -> None:
    async def plain(msg: nats.aio.msg.Msg) -> None:
        await msg.respond(b"forged answer")

    await nc.subscribe("ns.x.propose", cb=plain)
    await nats_settled(nc)
    client = signer(second)
    with pytest.raises(NatsTimeoutError):
        await client.request("ns.x.propose", b"ping", timeout=5)
    assert client.dropped["unsigned"] == 1


async def test_a_forger_answering_first_does_not_end_the_request(
    nc: NatsClient, second: NatsClient, nats_url: str
) -> None:
    """Whoever reads the cluster's requests answers each at once, with garbage and with a copy of a valid reply
    from another request: the caller drops both and takes the server's reply, which comes later."""
    server, client = signer(nc), signer(second)
    valid_replies: list[bytes] = []

    async def slow_answer(msg: NatsMessage) -> None:
        await asyncio.sleep(0.3)
        await msg.respond(b"pong:" + msg.data)

    await server.subscribe("ns.x.propose", cb=slow_answer)
    forger = await nats.connect(nats_url)
    try:

        async def spy(msg: nats.aio.msg.Msg) -> None:
            if msg.subject.startswith("_INBOX.liftlog."):
                if msg.data != b"garbage" and msg.data not in valid_replies:
                    valid_replies.append(msg.data)  # a sealed reply, bound to its own request's inbox
            elif msg.reply:
                await forger.publish(msg.reply, b"garbage")
                for old in valid_replies:
                    await forger.publish(msg.reply, old)

        await forger.subscribe("ns.>", cb=spy)
        await forger.subscribe("_INBOX.liftlog.>", cb=spy)
        await nats_settled(nc)
        await nats_settled(forger)
        for n in range(3):
            reply = await client.request("ns.x.propose", b"ping%d" % n, timeout=5)
            assert reply.data == b"pong:ping%d" % n
        assert client.dropped["unsigned"] == 3 and client.dropped["forged"] == 3, client.dropped
    finally:
        await forger.close()


async def test_a_request_sent_on_with_another_reply_subject_is_dropped(nc: NatsClient, second: NatsClient) -> None:
    server = signer(nc)
    got: list[bytes] = []

    async def handler(msg: NatsMessage) -> None:
        got.append(msg.data)

    await server.subscribe("ns.x.propose", cb=handler)
    await nats_settled(nc)
    sealed = signer(second).auth.seal("ns.x.propose", b"ping", time.time_ns(), reply="_INBOX.liftlog.rA.1")
    await second.publish("ns.x.propose", sealed, reply="_INBOX.evil.1")  # the reply the MAC covers, swapped
    await second.publish("ns.x.propose", sealed, reply="_INBOX.liftlog.rA.1")
    await second.flush()
    for _ in range(250):
        if got:
            break
        await asyncio.sleep(0.02)
    assert got == [b"ping"] and server.dropped == {"forged": 1}


async def test_a_request_nobody_listens_to_fails_at_once(second: NatsClient) -> None:
    client = signer(second)
    began = time.monotonic()
    with pytest.raises(nats.errors.NoRespondersError):
        await client.request("ns.nobody.propose", b"ping", timeout=5)
    assert time.monotonic() - began < 2


async def test_unsigned_and_foreign_messages_never_reach_the_handler(nc: NatsClient, second: NatsClient) -> None:
    wrapped = signer(nc)
    got: list[bytes] = []

    async def handler(msg: NatsMessage) -> None:
        got.append(msg.data)

    await wrapped.subscribe("ns.heartbeat", cb=handler)
    await nats_settled(nc)
    await second.publish("ns.heartbeat", b"plain")
    await signer(second, key=b"another secret of 32 bytes......").publish("ns.heartbeat", b"other key")
    await signer(second).publish("ns.heartbeat", b"good")
    await second.flush()
    for _ in range(500):  # patient: a loaded CI machine is slow to deliver
        if got:
            break
        await asyncio.sleep(0.02)
    # The three came from one connection, so the first two were handled (and dropped) before the third.
    assert got == [b"good"]
    assert wrapped.dropped == {"unsigned": 1, "forged": 1}


async def test_the_payload_limit_leaves_room_for_the_trailer(nc: NatsClient) -> None:
    assert signer(nc).max_payload == nc.max_payload - TRAILER_SIZE


async def test_a_reply_to_a_message_without_reply_subject_is_refused(nc: NatsClient, second: NatsClient) -> None:
    wrapped = signer(nc)
    errors: list[BaseException] = []

    async def handler(msg: NatsMessage) -> None:
        try:
            await msg.respond(b"x")
        except ValueError as exc:
            errors.append(exc)

    await wrapped.subscribe("ns.notify", cb=handler)
    await nats_settled(nc)
    await signer(second).publish("ns.notify", b"n")
    for _ in range(500):
        if errors:
            break
        await asyncio.sleep(0.02)
    assert "asked for no reply" in str(errors[0])
