"""Acks that nobody can forge or misroute, tried as an attacker with an ordinary client's rights would, on
both NATS connections (lean and nats-py).

Each test failed on the server before issue 34: answers showed the server's private inbox and a counter
id; a client-named inbox under the cluster's namespace, a server's inbox or one with CR/LF got an ack (the
namespace and server inboxes sealed with the cluster secret); an envelope copied onto another stream
completed a waiting call with that stream's ack.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import nats
import pytest

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.api.envelope import decode_ack, decode_publish_message, encode_publish_message
from liftlog.metadata.controller import CreateStreamRequest
from liftlog.security.cluster_auth import generate_key_file
from liftlog.server.ops.metrics import LoopLagMonitor, ServerCollector
from liftlog.server.server import Server
from liftlog.storage.faults import FaultyFileIO

from .conftest import in_process_server, start_cluster, stop_all

pytestmark = pytest.mark.timeout(90)
ALL, LEADER = api_pb2.ALL, api_pb2.LEADER


@pytest.fixture(params=[True, False], ids=["lean", "nats-py"])
def lean(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
async def server(tmp_path: Path, nats_url: str, lean: bool) -> AsyncIterator[Server]:
    key = tmp_path / "cluster.key"
    generate_key_file(key)
    settings: dict[str, Any] = {"nats.lean.connection": lean, "clustering.auth.key.file": str(key)}
    server = in_process_server(tmp_path / "data", nats_url, f"acks-{secrets.token_hex(4)}", **settings)
    await server.start()
    try:
        assert server.cluster is not None
        for name in ("victim", "attacker"):
            await asyncio.wait_for(server.cluster.create_stream(CreateStreamRequest(name, name)), 10)
        yield server
    finally:
        await server.stop()


async def stored(address: str, stream: str) -> list[api_pb2.Message]:
    """The stream's messages as Liftbridge's API serves them (with their ack fields)."""
    async with grpc.aio.insecure_channel(address) as ch:
        request = api_pb2.SubscribeRequest(
            stream=stream, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST
        )
        return [m async for m in stub(ch).Subscribe(request)][1:]  # after the empty set-up message


def stub(channel: grpc.aio.Channel) -> api_pb2_grpc.APIStub:
    return api_pb2_grpc.APIStub(channel)


async def test_answers_show_no_server_inbox_or_id_only_the_callers_own(server: Server) -> None:
    async with grpc.aio.insecure_channel(server.address) as ch:
        api = stub(ch)
        bare = (await api.Publish(api_pb2.PublishRequest(stream="victim", value=b"a", ackPolicy=ALL))).ack
        mine = (
            await api.Publish(api_pb2.PublishRequest(stream="victim", value=b"b", ackPolicy=ALL, correlationId="mine"))
        ).ack
        to_subject = (
            await api.PublishToSubject(api_pb2.PublishToSubjectRequest(subject="victim", value=b"c", ackPolicy=LEADER))
        ).ack

        async def requests() -> AsyncIterator[api_pb2.PublishRequest]:
            for i in range(50):  # one read: coalesced into a batch; with and without ids
                cid = f"async-{i}" if i % 2 else ""
                yield api_pb2.PublishRequest(stream="victim", value=b"d%d" % i, ackPolicy=LEADER, correlationId=cid)

        async_answers = [r async for r in api.PublishAsync(requests())]
    assert (bare.ackInbox, bare.correlationId) == ("", "")
    assert (mine.ackInbox, mine.correlationId) == ("", "mine")
    assert (to_subject.ackInbox, to_subject.correlationId) == ("", "")
    assert len(async_answers) == 50
    for i, answer in enumerate(async_answers):
        expected = f"async-{i}" if i % 2 else ""
        assert (answer.ack.ackInbox, answer.ack.correlationId, answer.correlationId) == ("", expected, expected)
    # Nor does the log: a reader sees no server inbox or route id.
    messages = await stored(server.address, "victim")
    assert len(messages) == 53
    assert all(not m.ackInbox and not m.correlationId for m in messages)


@pytest.mark.parametrize(
    "inbox",
    [
        "{ns}.evil.ack",
        "_INBOX.liftlog.evil.x",
        "_INBOX.x\r\nPUB victim 6\r\nforged",
        "$JS.API.STREAM.DELETE.ORDERS",
        "acks.*",
        "attacker",  # a stream listens there: the ack would be stored in it
    ],
)
async def test_a_client_cannot_name_an_inbox_only_servers_may_use(server: Server, nats_url: str, inbox: str) -> None:
    inbox = inbox.format(ns=server.config.clustering.namespace)
    watcher = await nats.connect(nats_url)
    seen: list[str] = []

    async def saw(msg: nats.aio.msg.Msg) -> None:
        seen.append(msg.subject)

    try:
        # Everything that could carry an ack to the inbox, or to what a CR/LF would make of it.
        for subject in (f"{server.config.clustering.namespace}.>", "_INBOX.liftlog.>", "$JS.>", "acks.>", "attacker"):
            await watcher.subscribe(subject, cb=saw)
        await watcher.flush()
        async with grpc.aio.insecure_channel(server.address) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub(ch).Publish(
                    api_pb2.PublishRequest(stream="victim", value=b"rpc", ackPolicy=LEADER, ackInbox=inbox)
                )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "ack inbox" in (info.value.details() or "")
        # The same inbox in a plain NATS envelope: stored, but no ack goes anywhere.
        envelope = api_pb2.Message(value=b"nats", ackInbox=inbox, correlationId="c", ackPolicy=LEADER)
        await watcher.publish("victim", encode_publish_message(envelope))
        await watcher.flush()
        assert server._acks is not None
        for _ in range(100):
            if server._acks.dropped:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        assert [m.value for m in await stored(server.address, "victim")] == [b"nats"]
        assert [s for s in seen if s != "victim"] == []
        reason = "unsigned_route" if inbox.startswith("_INBOX.liftlog.") else "refused_inbox"
        assert dict(server._acks.dropped) == {reason: 1}
        metrics = ServerCollector(server, LoopLagMonitor(), 10)
        (family,) = [f for f in metrics.collect() if f.name == "liftlog_acks_dropped"]
        assert {s.labels["reason"]: s.value for s in family.samples if s.name.endswith("_total")}[reason] == 1
    finally:
        await watcher.close()


async def test_a_good_client_inbox_gets_its_ack_from_an_envelope_and_from_a_call(server: Server, nats_url: str) -> None:
    client_nc = await nats.connect(nats_url)
    try:
        inbox = client_nc.new_inbox()
        acks = await client_nc.subscribe(inbox)
        await client_nc.flush()
        envelope = api_pb2.Message(value=b"nats", ackInbox=inbox, correlationId="env", ackPolicy=LEADER)
        await client_nc.publish("victim", encode_publish_message(envelope))
        async with grpc.aio.insecure_channel(server.address) as ch:
            answer = await stub(ch).Publish(
                api_pb2.PublishRequest(
                    stream="victim", value=b"rpc", ackPolicy=ALL, ackInbox=inbox, correlationId="rpc"
                )
            )
        assert (answer.ack.ackInbox, answer.ack.correlationId) == (inbox, "rpc")
        got = {}
        for _ in range(2):
            msg = await acks.next_msg(timeout=5)
            ack = decode_ack(msg.data)
            got[ack.correlationId] = ack
        assert set(got) == {"env", "rpc"} and all(a.ackInbox == inbox for a in got.values())
        assert got["rpc"].offset == answer.ack.offset
    finally:
        await client_nc.close()


async def test_two_calls_with_the_same_inbox_and_id_each_get_their_own_ack(server: Server) -> None:
    async with grpc.aio.insecure_channel(server.address) as ch:
        api = stub(ch)
        request = api_pb2.PublishRequest(stream="victim", ackPolicy=ALL, ackInbox="_INBOX.same", correlationId="same")
        answers = await asyncio.gather(
            *(api.Publish(api_pb2.PublishRequest(value=b"m%d" % i, **_fields(request))) for i in range(20))
        )
    by_offset = {m.offset: m.value for m in await stored(server.address, "victim")}
    assert sorted(by_offset) == list(range(20))
    assert sorted(a.ack.offset for a in answers) == list(range(20))  # none completed with another's ack


def _fields(request: api_pb2.PublishRequest) -> dict[str, Any]:
    return {f.name: v for f, v in request.ListFields()}


@pytest.mark.parametrize("via", ["leader", "forwarder"])
async def test_a_copied_route_completes_no_call(tmp_path: Path, nats_url: str, lean: bool, via: str) -> None:
    """A victim's ack-ALL publish waits (its follower is gone); the attacker reads its envelope off NATS and
    publishes copies: on its own stream, and on the victim's subject with ack LEADER. None completes the
    victim's call, made on the leader or on a server that forwards it; the true ack does, later."""
    key = tmp_path / "cluster.key"
    generate_key_file(key)
    settings: dict[str, Any] = {
        "clustering.auth.key.file": str(key),
        "nats.lean.connection": lean,
        "clustering.replica.max.lag.time": "3s",
    }
    servers = await start_cluster(tmp_path, nats_url, {s: FaultyFileIO() for s in ("a", "b", "c")}, **settings)
    attacker = await nats.connect(nats_url)
    try:
        a = servers["a"]
        assert a.cluster is not None
        await asyncio.wait_for(
            a.cluster.create_stream(CreateStreamRequest("victim", "victim", replication_factor=2)), 15
        )
        await asyncio.wait_for(a.cluster.create_stream(CreateStreamRequest("attacker", "attacker")), 15)
        meta = a.cluster.metadata.streams["victim"].partitions[0]
        leader = servers[meta.leader]
        follower = next(s for s in meta.replicas if s != meta.leader)
        caller = meta.leader if via == "leader" else next(sid for sid in servers if sid not in meta.replicas)
        await asyncio.sleep(0.5)  # every intake listens
        copied: asyncio.Queue[api_pb2.Message | None] = asyncio.Queue()

        async def copy(msg: nats.aio.msg.Msg) -> None:
            copied.put_nowait(decode_publish_message(msg.data))

        await attacker.subscribe("victim", cb=copy)
        await attacker.flush()
        await servers[follower].stop()
        async with grpc.aio.insecure_channel(servers[caller].address) as ch:
            call = asyncio.ensure_future(
                stub(ch).Publish(api_pb2.PublishRequest(stream="victim", value=b"victim's", ackPolicy=ALL))
            )
            original = await asyncio.wait_for(copied.get(), 5)
            assert original is not None
            assert original.ackInbox.startswith("_INBOX.liftlog.")
            for subject, policy in (("attacker", LEADER), ("attacker", ALL), ("victim", LEADER)):
                forged = api_pb2.Message(
                    value=b"INJECTED", ackInbox=original.ackInbox, correlationId=original.correlationId
                )
                forged.ackPolicy = policy
                await attacker.publish(subject, encode_publish_message(forged))
            await attacker.flush()
            await asyncio.sleep(1.0)
            assert not call.done(), "a forged ack completed the victim's call"
            answer = await asyncio.wait_for(call, 30)  # once the ISR shrinks, the true ack
        assert answer.ack.stream == "victim"
        by_offset = {m.offset: m.value for m in await stored(leader.address, "victim")}
        assert by_offset[answer.ack.offset] == b"victim's"
        # Each copy was dropped by the server whose check it failed: the caller (its own inbox) or a leader.
        dropped = [dict(s._acks.dropped) for sid, s in servers.items() if s._acks is not None and sid != follower]
        assert sum(d.get("mismatch", 0) + d.get("unsigned_route", 0) for d in dropped) == 3, dropped
    finally:
        await attacker.close()
        await stop_all(servers)
