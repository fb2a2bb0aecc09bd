"""Clusters of real ``liftlog server`` processes on one real nats-server: forming, changing, failing, restarting."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from liftlog.api import api_pb2, api_pb2_grpc, cluster_pb2, cluster_pb2_grpc
from liftlog.client import Client, StartPosition, StopPosition

from .harness import LiftlogProcess, NatsProcess, eventually

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

_namespaces = itertools.count()

#: Fast elections and frequent snapshots, so failover and snapshot catch-up happen within the test.
FAST = (
    "--set",
    "clustering.raft.snapshot.threshold=16",
    "--set",
    "clustering.server.liveness.timeout=3s",
)


class Cluster:
    def __init__(self, root: Path, nats_url: str) -> None:
        self.root = root
        self.nats_url = nats_url
        self.namespace = f"cluster-test-{next(_namespaces)}-{int(time.time() * 1000) % 100000}"
        self.servers: dict[str, LiftlogProcess] = {}

    def add(self, server_id: str, bootstrap: str | None, *extra: str) -> LiftlogProcess:
        proc = LiftlogProcess(
            self.root / server_id,
            "--namespace",
            self.namespace,
            *FAST,
            *extra,
            nats_url=self.nats_url,
            server_id=server_id,
            bootstrap=bootstrap,
        )
        self.servers[server_id] = proc
        return proc

    def start_all(self) -> None:
        for proc in self.servers.values():
            proc.start()

    def stop_all(self) -> None:
        for proc in self.servers.values():
            proc.kill()

    def running(self) -> list[LiftlogProcess]:
        return [p for p in self.servers.values() if p.proc is not None and p.proc.poll() is None]


@pytest.fixture
def cluster(tmp_path: Path, nats_server: NatsProcess) -> Iterator[Cluster]:
    c = Cluster(tmp_path, nats_server.url)
    yield c
    c.stop_all()


def rpc(address: str, method: str, request: Any, timeout: float = 10.0) -> Any:
    with grpc.insecure_channel(address) as channel:
        return getattr(api_pb2_grpc.APIStub(channel), method)(request, timeout=timeout)


def status(address: str) -> cluster_pb2.ClusterStatusResponse:
    with grpc.insecure_channel(address) as channel:
        return cluster_pb2_grpc.ClusterStub(channel).Status(cluster_pb2.ClusterStatusRequest(), timeout=5)


def formed(c: Cluster, ids: set[str]) -> str:
    """Wait until every running server sees ``ids`` registered, alive and one common controller; return it."""

    def check() -> str | None:
        seen = set()
        for proc in c.running():
            st = status(proc.address)
            if {s.id for s in st.servers if s.alive} != ids or not st.controller:
                return None
            if {s.id for s in st.servers if s.voter} != ids:
                return None
            seen.add(st.controller)
        return seen.pop() if len(seen) == 1 else None

    return eventually(check, 30, f"a cluster of {sorted(ids)}")


def layout(address: str, *streams: str) -> dict[str, Any]:
    """Stream -> partition -> (leader, replicas, isr), as one server's FetchMetadata tells it."""
    meta = rpc(address, "FetchMetadata", api_pb2.FetchMetadataRequest(streams=list(streams)))
    out: dict[str, Any] = {}
    for sm in meta.streamMetadata:
        if sm.error == api_pb2.StreamMetadata.UNKNOWN_STREAM:
            out[sm.name] = None
            continue
        out[sm.name] = {pid: (p.leader, tuple(p.replicas), tuple(p.isr)) for pid, p in sm.partitions.items()}
    return out


def agreed(c: Cluster, *streams: str) -> dict[str, Any]:
    """Wait until every running server reports the same layout for ``streams``; return it."""

    def check() -> dict[str, Any] | None:
        views = [layout(p.address, *streams) for p in c.running()]
        return views[0] if all(v == views[0] for v in views) else None

    return eventually(check, 20, f"agreement on {streams}")


def follower_of(c: Cluster, controller: str) -> LiftlogProcess:
    return next(p for sid, p in sorted(c.servers.items()) if sid != controller and p in c.running())


def create(address: str, name: str, partitions: int = 1, rf: int = 1) -> None:
    rpc(
        address,
        "CreateStream",
        api_pb2.CreateStreamRequest(name=name, subject=name, partitions=partitions, replicationFactor=rf),
    )


def test_seed_founds_a_cluster_others_join_and_changes_work_through_followers(cluster: Cluster) -> None:
    cluster.add("a", "seed").start()
    cluster.add("b", None).start()
    cluster.add("c", None).start()
    controller = formed(cluster, {"a", "b", "c"})
    assert controller == "a"  # the seed leads until something happens to it

    via = follower_of(cluster, controller)
    create(via.address, "orders", partitions=3, rf=3)
    create(via.address, "events", partitions=3, rf=1)
    view = agreed(cluster, "orders", "events")
    orders, events = view["orders"], view["events"]
    assert sorted(leader for leader, _, _ in orders.values()) == ["a", "b", "c"]  # leaders spread
    for leader, replicas, isr in orders.values():
        assert set(replicas) == {"a", "b", "c"} and replicas[0] == leader and set(isr) == set(replicas)
    # Leaders balanced across streams: every server leads 2 of the 6 partitions.
    everyone = [leader for leader, _, _ in [*orders.values(), *events.values()]]
    assert sorted(everyone) == ["a", "a", "b", "b", "c", "c"]

    # The change is visible on the server that took the call as soon as it returns.
    with pytest.raises(grpc.RpcError) as exists:
        create(via.address, "orders")
    assert exists.value.code() is grpc.StatusCode.ALREADY_EXISTS

    # Brokers agree too, with their partition counts.
    meta = rpc(cluster.servers["c"].address, "FetchMetadata", api_pb2.FetchMetadataRequest())
    assert {b.id: (b.partitionCount, b.leaderCount) for b in meta.brokers} == {
        "a": (4, 2),
        "b": (4, 2),
        "c": (4, 2),
    }

    # A fourth server joins the running cluster and takes new partitions.
    cluster.add("d", None).start()
    formed(cluster, {"a", "b", "c", "d"})
    create(cluster.servers["d"].address, "more", partitions=4, rf=2)
    more = agreed(cluster, "more")["more"]
    assert sorted(leader for leader, _, _ in more.values()) == ["a", "b", "c", "d"]

    # The CLI shows the same cluster.
    shown = subprocess.run(
        [sys.executable, "-m", "liftlog.cli.main", "cluster", "status", "--json", "-a", cluster.servers["b"].address],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)
    assert report["controller"] == "a" and report["stream_count"] == 3
    brokers = rpc(cluster.servers["d"].address, "FetchMetadata", api_pb2.FetchMetadataRequest()).brokers
    assert [(s["id"], s["alive"], s["partition_count"], s["leader_count"]) for s in report["servers"]] == [
        (b.id, True, b.partitionCount, b.leaderCount) for b in sorted(brokers, key=lambda b: b.id)
    ]
    assert sum(s["partition_count"] for s in report["servers"]) == 3 * 3 + 3 + 4 * 2

    rpc(cluster.servers["b"].address, "DeleteStream", api_pb2.DeleteStreamRequest(name="orders"))
    assert agreed(cluster, "orders", "events")["orders"] is None
    # Every replica's data is gone, not only the metadata.
    for sid in "abc":
        assert not (cluster.root / sid / "streams" / "orders").exists()
        assert (cluster.root / sid / "streams" / "events").exists() or sid not in {
            leader for leader, _, _ in events.values()
        }
    with pytest.raises(grpc.RpcError) as gone:
        rpc(cluster.servers["c"].address, "DeleteStream", api_pb2.DeleteStreamRequest(name="orders"))
    assert gone.value.code() is grpc.StatusCode.NOT_FOUND


def test_publish_and_subscribe_reach_the_partition_leader(cluster: Cluster) -> None:
    cluster.add("a", "seed").start()
    cluster.add("b", None).start()
    controller = formed(cluster, {"a", "b"})
    create(cluster.servers[controller].address, "logs", partitions=2, rf=1)
    view = agreed(cluster, "logs")["logs"]
    for pid, (leader, _, _) in view.items():
        other = next(s for s in cluster.servers if s != leader)
        # Publishing through either server lands on the leader's log.
        ack = rpc(
            cluster.servers[other].address,
            "Publish",
            api_pb2.PublishRequest(stream="logs", partition=pid, value=b"x", ackPolicy=api_pb2.LEADER),
        ).ack
        assert ack.offset == 0
        # Reading needs the leader; others say so in Liftbridge's words.
        with pytest.raises(grpc.RpcError) as not_leader:
            rpc(
                cluster.servers[other].address,
                "FetchPartitionMetadata",
                api_pb2.FetchPartitionMetadataRequest(stream="logs", partition=pid),
            )
        assert not_leader.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert not_leader.value.details() == "Server not partition leader"
        meta = rpc(
            cluster.servers[leader].address,
            "FetchPartitionMetadata",
            api_pb2.FetchPartitionMetadataRequest(stream="logs", partition=pid),
        )
        assert meta.metadata.newestOffset == 0


def test_five_peers_survive_the_controller_being_killed_and_it_catches_up_by_snapshot(cluster: Cluster) -> None:
    ids = ["a", "b", "c", "d", "e"]
    for sid in ids:
        cluster.add(sid, ",".join(ids))
    cluster.start_all()
    old = formed(cluster, set(ids))
    via = follower_of(cluster, old)
    for i in range(3):
        create(via.address, f"before-{i}", partitions=2, rf=3)
    before = agreed(cluster, "before-0", "before-1", "before-2")

    cluster.servers[old].kill()  # kill -9: no goodbye
    killed_at = time.monotonic()

    def new_controller() -> str | None:
        seen = {status(p.address).controller for p in cluster.running()}
        return seen.pop() if len(seen) == 1 and "" not in seen and old not in seen else None

    new = eventually(new_controller, 15, "a new controller")
    took = time.monotonic() - killed_at
    assert new != old and took < 10, took
    # Nothing committed was lost, and the old controller is reported dead.
    assert agreed(cluster, "before-0", "before-1", "before-2") == before
    eventually(
        lambda: all(not s.alive for s in status(cluster.servers[new].address).servers if s.id == old),
        15,
        f"{old} reported dead",
    )

    # Enough changes while it is down that the leader compacts past its log: it must take a snapshot.
    for i in range(12):
        create(cluster.servers[new].address, f"during-{i}")
    rpc(cluster.servers[new].address, "DeleteStream", api_pb2.DeleteStreamRequest(name="before-1"))

    restarted = cluster.servers[old].start()
    formed(cluster, set(ids))
    names = ["before-0", "before-1", "during-0", "during-11"]
    view = agreed(cluster, *names)
    assert view["before-1"] is None and view["during-11"] is not None
    assert "installing the leader's metadata snapshot" in restarted.output()


def test_a_whole_cluster_restarts_with_its_metadata(cluster: Cluster) -> None:
    ids = ["a", "b", "c"]
    for sid in ids:
        cluster.add(sid, ",".join(ids))
    cluster.start_all()
    controller = formed(cluster, set(ids))
    create(cluster.servers[controller].address, "kept", partitions=3, rf=2)
    rpc(cluster.servers[controller].address, "PauseStream", api_pb2.PauseStreamRequest(name="kept", partitions=[1]))
    before = agreed(cluster, "kept")

    # The controller stops first and hands its leadership over instead of leaving an election to chance.
    assert cluster.servers[controller].stop() == 0
    assert "handed the metadata leadership to" in cluster.servers[controller].output()
    for proc in cluster.servers.values():
        assert proc.stop() == 0, proc.output()
    cluster.start_all()
    formed(cluster, set(ids))
    assert agreed(cluster, "kept") == before
    meta = rpc(cluster.servers["a"].address, "FetchMetadata", api_pb2.FetchMetadataRequest(streams=["kept"]))
    assert meta.streamMetadata[0].partitions[1].paused


@pytest.mark.parametrize("survivor_was", ["controller", "follower"])
def test_without_a_quorum_changes_fail_with_no_known_metadata_leader(cluster: Cluster, survivor_was: str) -> None:
    ids = ["a", "b", "c"]
    for sid in ids:
        cluster.add(sid, ",".join(ids))
    cluster.start_all()
    controller = formed(cluster, set(ids))
    keep = controller if survivor_was == "controller" else follower_of(cluster, controller).server_id
    assert keep is not None
    for sid, proc in cluster.servers.items():
        if sid != keep:
            proc.kill()
    survivor = cluster.servers[keep].address
    # Within the RPC's 10 s deadline, even on a leader whose proposal can never commit.
    with pytest.raises(grpc.RpcError) as failed:
        create(survivor, "nowhere")
    assert failed.value.code() is grpc.StatusCode.INTERNAL
    assert (failed.value.details() or "").startswith("no known metadata leader: ")
    # Reads still work from the committed state.
    assert layout(survivor, "nowhere") == {"nowhere": None}


async def test_the_client_routes_to_each_partition_leader_from_any_server(cluster: Cluster) -> None:
    cluster.add("a", "seed").start()
    cluster.add("b", None).start()
    cluster.add("c", None).start()
    formed(cluster, {"a", "b", "c"})
    async with Client(cluster.servers["c"].address) as client:
        await client.create_stream("spread", "spread", partitions=3)
        meta = await client.fetch_metadata("spread")
        assert {b.id for b in meta.brokers} == {"a", "b", "c"}
        for pid in range(3):
            acks = [await client.publish("spread", b"p%d-%d" % (pid, i), partition=pid) for i in range(3)]
            assert [a.offset for a in acks if a is not None] == [0, 1, 2]
        for pid in range(3):
            sub = client.subscribe(
                "spread", partition=pid, start_position=StartPosition.EARLIEST, stop_position=StopPosition.STOP_LATEST
            )
            assert [m.value async for m in sub] == [b"p%d-%d" % (pid, i) for i in range(3)]


def test_a_publish_right_after_creation_through_another_server_is_not_lost(cluster: Cluster) -> None:
    # The leader's NATS subscription must be in place before CreateStream returns, even when the publish
    # then travels over another server's NATS connection. It is, because the leader's "reconciled" answer
    # leaves on its connection after its SUB, and nats-server handles one connection's commands in order.
    cluster.add("a", "seed").start()
    cluster.add("b", None).start()
    formed(cluster, {"a", "b"})
    a, b = cluster.servers["a"].address, cluster.servers["b"].address
    names = [f"fresh-{i}" for i in range(12)]
    for name in names:
        create(b, name)
        leader = agreed(cluster, name)[name][0][0]
        other = b if leader == "a" else a
        rpc(other, "Publish", api_pb2.PublishRequest(stream=name, value=b"first", ackPolicy=api_pb2.NONE))
    for name in names:
        address = cluster.servers[agreed(cluster, name)[name][0][0]].address
        request = api_pb2.FetchPartitionMetadataRequest(stream=name, partition=0)

        def first_stored(address: str = address, request: Any = request) -> bool:
            return bool(rpc(address, "FetchPartitionMetadata", request).metadata.newestOffset == 0)

        eventually(first_stored, 10, f"the first message of {name}")
