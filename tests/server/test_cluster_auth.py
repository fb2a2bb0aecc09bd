"""A cluster with a secret, attacked from a plain NATS connection: forged, replayed and altered
server-to-server messages change nothing, and a holder of the secret is still heard.

Every forgery here changed metadata, Raft state or replication on a cluster without a secret (issue 15);
each test also sends the same message signed, so it shows that the path it attacks is live.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.errors import TimeoutError as NatsTimeoutError

from liftlog.metadata.codec import encode_operation
from liftlog.metadata.controller import CreateStreamRequest
from liftlog.metadata.model import DeleteStream, ServerMeta
from liftlog.metadata.protocol import (
    DeleteStreamChange,
    JoinRequest,
    ReadonlyChange,
    ServerRegistration,
    encode_join,
    encode_request,
)
from liftlog.raft.codec import encode_message
from liftlog.raft.types import Entry, Message, MessageType
from liftlog.replication.protocol import FetchRequest, PartitionFetch, encode_fetch_request, fetch_subject
from liftlog.security.cluster_auth import ClusterAuth, generate_key_file, load_key
from liftlog.server.nats.authenticated_nats import AuthenticatedNats, internal_subjects
from liftlog.server.server import Server
from liftlog.storage.faults import FaultyFileIO
from tests.server.conftest import start_cluster, stop_all

pytestmark = pytest.mark.cluster


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, f"{what} not reached within {timeout} s"
        await asyncio.sleep(0.05)


class Cluster:
    def __init__(self, servers: dict[str, Server], key: Path) -> None:
        self.servers = servers
        self.key = key
        first = next(iter(servers.values())).cluster
        assert first is not None
        self.namespace = first.namespace
        self.prefix = f"{self.namespace}.raft.metadata."

    def controller(self) -> Server:
        leader = next(iter(self.servers.values())).cluster.leader_id  # type: ignore[union-attr]
        assert leader is not None
        return self.servers[leader]

    def dropped(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for server in self.servers.values():
            assert isinstance(server._internal_nats, AuthenticatedNats)
            signing, dropped = server._auth_state()  # the replication connection's drops included
            assert signing
            for reason, count in dropped.items():
                total[reason] = total.get(reason, 0) + count
        return total


@pytest.fixture
async def cluster(tmp_path: Path, nats_url: str) -> AsyncIterator[Cluster]:
    key = tmp_path / "cluster.key"
    assert generate_key_file(key)
    disks = {sid: FaultyFileIO() for sid in ("a", "b", "c")}
    settings: dict[str, Any] = {"clustering.auth.key.file": str(key)}
    servers = await start_cluster(tmp_path, nats_url, disks, **settings)
    try:
        first = servers["a"].cluster
        assert first is not None
        await asyncio.wait_for(first.create_stream(CreateStreamRequest("orders", "orders", replication_factor=3)), 15)
        yield Cluster(servers, key)
    finally:
        await stop_all(servers)


@pytest.fixture
async def attacker(nats_url: str) -> AsyncIterator[NatsClient]:
    conn = await nats.connect(nats_url)
    yield conn
    await conn.close()


async def insider(nats_url: str, cluster: Cluster) -> tuple[NatsClient, AuthenticatedNats]:
    """A NATS connection that holds the secret, as another server would."""
    import os
    import time

    conn = await nats.connect(nats_url)
    auth = ClusterAuth(load_key(cluster.key), boot=os.urandom(8), started=time.time_ns(), max_age=30 * 10**9)
    return conn, AuthenticatedNats(conn, auth, internal_subjects(cluster.namespace))


async def no_answer(nc: NatsClient, subject: str, payload: bytes) -> None:
    with pytest.raises(NatsTimeoutError):
        await nc.request(subject, payload, timeout=1.0)


async def test_a_forged_join_adds_no_voter(cluster: Cluster, attacker: NatsClient, nats_url: str) -> None:
    controller = cluster.controller().cluster
    assert controller is not None
    voters = controller.voters
    # On an open cluster, {"id": null} added a voter "None" and the quorum was lost for good.
    await no_answer(attacker, f"{cluster.prefix}join", b'{"id": null}')
    await no_answer(attacker, f"{cluster.prefix}join", encode_join(JoinRequest("mallory")))
    await asyncio.sleep(0.5)
    assert controller.voters == voters
    assert cluster.dropped()["unsigned"] >= 2


async def test_forged_proposals_change_no_metadata(cluster: Cluster, attacker: NatsClient, nats_url: str) -> None:
    controller = cluster.controller()
    assert controller.cluster is not None
    metadata = controller.cluster.metadata
    propose = f"{cluster.prefix}{controller.server_id}.propose"
    forgeries = [
        encode_request(DeleteStreamChange("orders")),
        encode_request(ReadonlyChange("orders", (), True)),
        encode_request(ServerRegistration(ServerMeta("b", "6.6.6.6", 1, ""))),
    ]
    for payload in forgeries:
        await no_answer(attacker, propose, payload)
    assert "orders" in metadata.streams
    assert not metadata.partition("orders", 0).readonly
    assert metadata.servers["b"].host != "6.6.6.6"

    # The same request signed is served: the attack above was refused for its missing signature alone.
    conn, signed = await insider(nats_url, cluster)
    try:
        reply = await signed.request(propose, encode_request(ReadonlyChange("orders", (), True)), timeout=5.0)
        assert reply.data
        await until(lambda: metadata.partition("orders", 0).readonly, "signed readonly change applied")
    finally:
        await conn.close()


async def test_forged_raft_messages_move_no_term_and_commit_nothing(cluster: Cluster, attacker: NatsClient) -> None:
    leader = cluster.controller().server_id
    follower = next(sid for sid in cluster.servers if sid != leader)
    node = cluster.servers[follower].cluster.raft.node  # type: ignore[union-attr]
    assert node is not None
    term, commit = node.term, node.commit_index
    huge = 10**9
    subject = f"{cluster.prefix}{follower}"
    await attacker.publish(subject, encode_message(Message(MessageType.HEARTBEAT, leader, follower, huge)))
    delete = Entry(huge, node.log.last_index() + 1, data=encode_operation(DeleteStream("orders")))
    append = Message(
        MessageType.APPEND,
        leader,
        follower,
        huge,
        log_term=node.log.last_term(),
        index=node.log.last_index(),
        entries=(delete,),
        commit=delete.index,
    )
    await attacker.publish(subject, encode_message(append))
    await attacker.flush()
    await asyncio.sleep(1.0)
    assert node.term == term
    assert node.commit_index >= commit
    metadata = cluster.servers[follower].cluster.metadata  # type: ignore[union-attr]
    assert "orders" in metadata.streams
    assert cluster.dropped()["unsigned"] >= 2


async def test_a_forged_fetch_with_a_real_followers_id_gets_no_answer(cluster: Cluster, attacker: NatsClient) -> None:
    controller = cluster.controller().cluster
    assert controller is not None
    part = controller.metadata.partition("orders", 0)
    follower = next(r for r in part.replicas if r != part.leader)
    fetch = FetchRequest(follower, 1, (PartitionFetch("orders", 0, 10**6, part.leader_epoch),))
    # An answer would mean the leader took offset 10**6 as the follower's acknowledgement: a raised HW.
    await no_answer(attacker, fetch_subject(cluster.namespace, part.leader), encode_fetch_request(fetch))
    assert cluster.dropped()["unsigned"] >= 1


async def test_replayed_and_altered_messages_are_dropped(cluster: Cluster, attacker: NatsClient) -> None:
    captured: list[tuple[str, bytes]] = []
    done = asyncio.Event()

    async def capture(msg: nats.aio.msg.Msg) -> None:
        if len(captured) < 20:
            captured.append((msg.subject, msg.data))
        else:
            done.set()

    sub = await attacker.subscribe(f"{cluster.prefix}>", cb=capture)
    await asyncio.wait_for(done.wait(), 10)
    await sub.unsubscribe()
    before = cluster.dropped()
    for subject, data in captured:
        await attacker.publish(subject, data)  # exactly as a server sent it
        altered = bytearray(data)
        altered[0] ^= 1
        await attacker.publish(subject, bytes(altered))
    await attacker.flush()

    def counted() -> bool:
        now = cluster.dropped()
        replayed = now.get("replayed", 0) - before.get("replayed", 0)
        forged = now.get("forged", 0) - before.get("forged", 0)
        return replayed >= len(captured) and forged >= len(captured)

    await until(counted, "every replay and alteration counted")
    controller = cluster.controller().cluster
    assert controller is not None
    assert "orders" in controller.metadata.streams


async def test_a_server_without_the_secret_cannot_join(cluster: Cluster, nats_url: str, tmp_path: Path) -> None:
    from tests.server.conftest import in_process_server

    settings: dict[str, Any] = {"clustering.auth.insecure": True}
    outsider = in_process_server(tmp_path / "d", nats_url, cluster.namespace, "d", seed=False, **settings)
    try:
        await asyncio.wait_for(outsider.start(), 30)  # a joining server serves while it asks to join
        await asyncio.sleep(3)
        controller = cluster.controller().cluster
        assert controller is not None and outsider.cluster is not None
        assert "d" not in controller.voters
        assert "d" not in controller.metadata.servers
        assert not outsider.cluster.registered.is_set()
        assert cluster.dropped()["unsigned"] >= 1
    finally:
        await outsider.stop()


async def test_a_server_with_the_secret_joins(cluster: Cluster, nats_url: str, tmp_path: Path) -> None:
    from tests.server.conftest import in_process_server

    settings: dict[str, Any] = {"clustering.auth.key.file": str(cluster.key)}
    joiner = in_process_server(tmp_path / "d", nats_url, cluster.namespace, "d", seed=False, **settings)
    try:
        await asyncio.wait_for(joiner.start(), 30)
        controller = cluster.controller().cluster
        assert controller is not None
        await until(lambda: "d" in controller.voters, "the joiner is a voter", 20)
        assert joiner.cluster is not None
        await asyncio.wait_for(joiner.cluster.registered.wait(), 20)
        assert controller.metadata.servers["d"].port == joiner.port
    finally:
        await joiner.stop()


async def test_a_secret_from_the_environment_signs_too(tmp_path: Path, nats_url: str) -> None:
    from tests.server.conftest import in_process_server

    settings: dict[str, Any] = {"clustering.auth.key": secrets.token_hex(16)}
    server = in_process_server(tmp_path / "e", nats_url, "env-secret", "e", **settings)
    try:
        await asyncio.wait_for(server.start(), 30)
        assert isinstance(server._internal_nats, AuthenticatedNats)
        assert server.cluster is not None and server.cluster.registered.is_set()
    finally:
        await server.stop()


async def test_cluster_status_shows_drops_and_servers_without_a_secret(cluster: Cluster, attacker: NatsClient) -> None:
    from liftlog.client import Client

    await attacker.publish(f"{cluster.prefix}heartbeat", b"{}")
    await attacker.flush()
    address = f"127.0.0.1:{cluster.servers['a'].port}"
    async with Client(address) as client:
        status = await client.cluster_status()
        for _ in range(50):
            if {s for s, reason, _ in status.dropped if reason == "unsigned"} == set(cluster.servers):
                break
            await asyncio.sleep(0.1)
            status = await client.cluster_status()
        assert status.without_secret == ()
        # Every server subscribes to the heartbeat subject: each dropped the forgery.
        assert {s for s, reason, n in status.dropped if reason == "unsigned" and n >= 1} == set(cluster.servers)
