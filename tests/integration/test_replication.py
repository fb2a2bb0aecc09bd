"""Partition replication between real servers: followers fetch, ISR shrinks and grows, ack ALL waits for it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.client import Client, StartPosition, StopPosition

from .harness import LiftlogProcess, NatsProcess, eventually
from .test_cluster import Cluster, agreed, create, formed, rpc, status

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

#: Short lag and idle times so ISR changes happen within a test.
REPLICATION = (
    "--set",
    "clustering.replica.max.lag.time=2s",
    "--set",
    "clustering.replica.max.idle.wait=500ms",
    "--set",
    "clustering.leader.rebalance.delay=1s",
    # Tiny segments, so retention has whole segments to delete within a test.
    "--set",
    "streams.segment.max.bytes.min=512",
)


@pytest.fixture
def cluster(tmp_path: Path, nats_server: NatsProcess) -> Iterator[Cluster]:
    c = Cluster(tmp_path, nats_server.url)
    ids = ["a", "b", "c"]
    for sid in ids:
        c.add(sid, ",".join(ids), *REPLICATION)
    c.start_all()
    formed(c, set(ids))
    yield c
    c.stop_all()


def publish(address: str, stream: str, values: list[bytes], policy: api_pb2.AckPolicy = api_pb2.ALL) -> list[int]:
    with grpc.insecure_channel(address) as channel:
        api = api_pb2_grpc.APIStub(channel)
        return [
            api.Publish(api_pb2.PublishRequest(stream=stream, value=v, ackPolicy=policy), timeout=10).ack.offset
            for v in values
        ]


def read(address: str, stream: str, replica: bool = True) -> list[bytes]:
    """Every committed message of partition 0, as this server's replica serves it."""
    with grpc.insecure_channel(address) as channel:
        api = api_pb2_grpc.APIStub(channel)
        req = api_pb2.SubscribeRequest(
            stream=stream, startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST, readISRReplica=replica
        )
        return [m.value for m in api.Subscribe(req, timeout=10)][1:]


def isr(c: Cluster, stream: str) -> tuple[str, ...]:
    return tuple(agreed(c, stream)[stream][0][2])


def test_every_replica_holds_what_was_acknowledged_with_ack_all(cluster: Cluster) -> None:
    create(cluster.servers["a"].address, "orders", rf=3)
    leader = agreed(cluster, "orders")["orders"][0][0]
    values = [b"m%d" % i for i in range(50)]
    assert publish(cluster.servers[leader].address, "orders", values) == list(range(50))
    for proc in cluster.servers.values():

        def replicated(p: LiftlogProcess = proc) -> bool:
            return read(p.address, "orders") == values

        assert eventually(replicated, 10, f"{proc.server_id}'s replica")


def test_a_dead_follower_leaves_the_isr_and_rejoins_after_catching_up(cluster: Cluster) -> None:
    create(cluster.servers["a"].address, "events", rf=3)
    leader = agreed(cluster, "events")["events"][0][0]
    follower = next(s for s in "abc" if s != leader)
    address = cluster.servers[leader].address
    publish(address, "events", [b"before"])
    cluster.servers[follower].kill()
    # Acks ALL wait for the ISR: once the dead follower is dropped, they flow again.
    eventually(lambda: follower not in isr(cluster, "events"), 15, f"{follower} dropped from the ISR")
    publish(address, "events", [b"during-%d" % i for i in range(20)])
    attention = status(address).attention
    assert [(p.stream, len(p.isr), len(p.replicas)) for p in attention] == [("events", 2, 3)]

    cluster.servers[follower].start()
    eventually(lambda: follower in isr(cluster, "events"), 20, f"{follower} back in the ISR")
    expected = [b"before"] + [b"during-%d" % i for i in range(20)]
    assert eventually(lambda: read(cluster.servers[follower].address, "events") == expected, 10, "caught up")
    assert status(address).attention == []


def test_ack_all_is_refused_below_min_isr(cluster: Cluster) -> None:
    rpc(
        cluster.servers["a"].address,
        "CreateStream",
        api_pb2.CreateStreamRequest(
            name="strict", subject="strict", replicationFactor=3, minIsr=api_pb2.NullableInt32(value=3)
        ),
    )
    leader = agreed(cluster, "strict")["strict"][0][0]
    address = cluster.servers[leader].address
    publish(address, "strict", [b"ok"])
    victim = next(s for s in "abc" if s != leader)
    cluster.servers[victim].kill()
    eventually(lambda: victim not in isr(cluster, "strict"), 15, f"{victim} dropped from the ISR")
    with pytest.raises(grpc.RpcError) as refused:
        publish(address, "strict", [b"too few copies"])
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "min.insync.replicas" in (refused.value.details() or "")
    assert publish(address, "strict", [b"leader only"], policy=api_pb2.LEADER) == [1]


def test_killing_a_partition_leader_elects_an_in_sync_follower_and_loses_nothing_acknowledged(
    cluster: Cluster,
) -> None:
    create(cluster.servers["a"].address, "ha", rf=3)
    old = agreed(cluster, "ha")["ha"][0][0]
    acked = [b"v%d" % i for i in range(30)]
    publish(cluster.servers[old].address, "ha", acked)
    cluster.servers[old].kill()

    def new_leader() -> str | None:
        view = agreed(cluster, "ha")["ha"][0]
        return view[0] if view[0] != old else None

    new = eventually(new_leader, 20, "a new partition leader")
    assert new != old and old not in isr(cluster, "ha")
    survivor = cluster.servers[new].address
    assert publish(survivor, "ha", [b"after"]) == [30]
    assert read(survivor, "ha", replica=False) == [*acked, b"after"]

    # The old leader comes back as a follower, truncates by epoch, catches up and rejoins the ISR;
    # it never leads again by the stale metadata in its own log, not even briefly.
    cluster.servers[old].start()
    eventually(lambda: old in isr(cluster, "ha"), 20, f"{old} back in the ISR")
    assert cluster.servers[old].log_path.read_text().count("ha/0 subject='ha'>: leading in leader epoch 0") == 1
    assert eventually(lambda: read(cluster.servers[old].address, "ha") == [*acked, b"after"], 10, "caught up")
    # Once it has been in sync for the rebalance delay, leadership returns to it: it is the preferred replica.
    assert eventually(lambda: agreed(cluster, "ha")["ha"][0][0] == old, 15, f"leadership back to {old}")
    assert publish(cluster.servers[old].address, "ha", [b"home"]) == [31]
    assert read(cluster.servers[old].address, "ha", replica=False) == [*acked, b"after", b"home"]


def test_a_follower_behind_the_leaders_retention_restarts_from_the_leaders_log_start(cluster: Cluster) -> None:
    rpc(
        cluster.servers["a"].address,
        "CreateStream",
        api_pb2.CreateStreamRequest(
            name="short",
            subject="short",
            replicationFactor=3,
            segmentMaxBytes=api_pb2.NullableInt64(value=1024),
            retentionMaxMessages=api_pb2.NullableInt64(value=20),
            cleanerInterval=api_pb2.NullableInt64(value=100),
        ),
    )
    leader = agreed(cluster, "short")["short"][0][0]
    follower = next(s for s in "abc" if s != leader)
    address = cluster.servers[leader].address
    publish(address, "short", [b"early"])
    cluster.servers[follower].kill()
    eventually(lambda: follower not in isr(cluster, "short"), 15, f"{follower} dropped from the ISR")
    values = [b"x" * 100 + b"%d" % i for i in range(200)]
    publish(address, "short", values)
    start = eventually(
        lambda: (
            rpc(address, "FetchPartitionMetadata", api_pb2.FetchPartitionMetadataRequest(stream="short"))
            and read(address, "short", replica=False)[0] != b"early"
        ),
        15,
        "the leader's retention to drop the first segments",
    )
    assert start
    kept = read(address, "short", replica=False)
    cluster.servers[follower].start()
    eventually(lambda: follower in isr(cluster, "short"), 20, f"{follower} back in the ISR")

    def caught_up() -> bool:
        # Each replica applies retention to its own segments, so only the newest messages must agree.
        mine = read(cluster.servers[follower].address, "short")
        return len(mine) >= 20 and kept[-len(mine) :] == mine

    assert eventually(caught_up, 10, "the leader's newest messages on the follower")


async def test_uncommitted_reads_are_opt_in_and_see_past_the_high_watermark(
    tmp_path: Path, nats_server: NatsProcess
) -> None:
    c = Cluster(tmp_path, nats_server.url)
    try:
        for sid in "ab":
            c.add(sid, "a,b")  # default lag time (15 s): the silent follower stays in the ISR meanwhile
        c.start_all()
        formed(c, {"a", "b"})
        create(c.servers["a"].address, "draft", rf=2)
        leader = agreed(c, "draft")["draft"][0][0]
        follower = next(s for s in "ab" if s != leader)
        address = c.servers[leader].address
        c.servers[follower].kill()
        assert publish(address, "draft", [b"unconfirmed"], policy=api_pb2.LEADER) == [0]
        async with Client(address) as client:
            committed = client.subscribe(
                "draft", start_position=StartPosition.EARLIEST, stop_position=StopPosition.STOP_LATEST
            )
            assert [m.value async for m in committed] == []
            uncommitted = client.subscribe(
                "draft",
                start_position=StartPosition.EARLIEST,
                stop_position=StopPosition.STOP_LATEST,
                read_uncommitted=True,
            )
            assert [m.value async for m in uncommitted] == [b"unconfirmed"]
        assert read(address, "draft", replica=False) == []  # Liftbridge's wire behaviour: committed only
    finally:
        c.stop_all()


def test_a_partition_whose_replicas_all_died_goes_offline_and_comes_back_with_them(
    tmp_path: Path, nats_server: NatsProcess
) -> None:
    c = Cluster(tmp_path, nats_server.url)
    ids = ["a", "b", "c", "d", "e"]  # five voters: the metadata group survives two deaths
    try:
        for sid in ids:
            c.add(sid, ",".join(ids), *REPLICATION)
        c.start_all()
        formed(c, set(ids))
        create(c.servers["a"].address, "pair", rf=2)
        leader, replicas, _ = agreed(c, "pair")["pair"][0]
        other = next(r for r in replicas if r != leader)
        watcher = c.servers[next(s for s in ids if s not in replicas)].address
        publish(c.servers[leader].address, "pair", [b"kept"])
        c.servers[other].kill()
        eventually(lambda: isr(c, "pair") == (leader,), 15, f"{other} dropped from the ISR")
        c.servers[leader].kill()

        def offline() -> bool:
            return [(p.stream, p.state) for p in status(watcher).attention] == [("pair", "offline")]

        eventually(offline, 20, "the partition reported offline")
        c.servers[leader].start()  # the last in-sync replica returns: it leads again
        eventually(lambda: all(p.state == "online" for p in status(watcher).attention), 20, "online again")
        eventually(lambda: agreed(c, "pair")["pair"][0][0] == leader, 20, f"{leader} leading again")
        # It answers "not leader" until it has taken the leadership up (after its read-index barrier).
        assert eventually(lambda: read(c.servers[leader].address, "pair", replica=False) == [b"kept"], 10, "kept")
    finally:
        c.stop_all()


def test_an_idle_partition_does_not_slow_acks_of_another_with_the_same_leader(
    tmp_path: Path, nats_server: NatsProcess
) -> None:
    """A leader holds a caught-up follower's fetch (here up to 1.5 s); the follower's fetches for its
    other partitions from that leader go on meanwhile, so ack ALL there waits for no held fetch."""
    c = Cluster(tmp_path, nats_server.url)
    ids = ["a", "b", "c"]
    for sid in ids:
        c.add(sid, ",".join(ids), *REPLICATION, "--set", "clustering.replica.fetch.wait=1500ms")
    c.start_all()
    try:
        formed(c, set(ids))
        create(c.servers["a"].address, "pair", partitions=4, rf=3)
        partitions = agreed(c, "pair")["pair"]
        by_leader: dict[str, list[int]] = {}
        for pid, (leader, _, isr_) in partitions.items():
            assert len(isr_) == 3
            by_leader.setdefault(leader, []).append(pid)
        leader, (busy, *_idle) = next((sid, pids) for sid, pids in by_leader.items() if len(pids) > 1)
        with grpc.insecure_channel(c.servers[leader].address) as channel:
            api = api_pb2_grpc.APIStub(channel)
            # Let the followers' fetches of every partition settle into being held.
            time.sleep(2)
            started = time.monotonic()
            for i in range(20):
                req = api_pb2.PublishRequest(stream="pair", partition=busy, value=b"%d" % i, ackPolicy=api_pb2.ALL)
                assert api.Publish(req, timeout=10).ack.offset == i
            took = time.monotonic() - started
        # About 0.05 s; when the follower waited for the idle partition's held fetch, over 2 s.
        assert took < 1, f"20 acks ALL took {took:.2f}s: they waited for a held fetch"
    finally:
        c.stop_all()
