"""liftlog.Cluster/Status from a committed metadata state (no Raft running: the node is absent)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from liftlog.api import cluster_pb2
from liftlog.metadata import (
    ChangeIsr,
    CreateStream,
    Metadata,
    PartitionMeta,
    PartitionState,
    RegisterServer,
    ServerMeta,
    SetPartitionState,
    StreamMeta,
    StreamSettings,
)
from liftlog.server.api.cluster_service import ClusterService
from liftlog.storage.descriptors import DescriptorBudget
from liftlog.storage.encryption import BatchCipher, MasterKey


def metadata() -> Metadata:
    meta = Metadata()
    for i, sid in enumerate("abc"):
        meta.apply(RegisterServer(ServerMeta(sid, "127.0.0.1", 9000 + i), 1))
    s = StreamMeta("orders", "orders", "", 1, StreamSettings())
    for pid in range(3):
        replicas = ["abc"[(pid + k) % 3] for k in range(3)]
        s.partitions[pid] = PartitionMeta("orders", pid, f"orders.{pid}", replicas[0], replicas, list(replicas))
    meta.apply(CreateStream(s))
    meta.apply(ChangeIsr("orders", 1, ("b", "c"), 0))
    meta.apply(SetPartitionState("orders", 2, PartitionState.OFFLINE, "", 0))
    return meta


async def test_status_counts_replicas_and_lists_partitions_needing_attention() -> None:
    cluster: Any = SimpleNamespace(
        metadata=metadata(), raft=SimpleNamespace(node=None), leader_id="a", voters=("a", "b"), server_id="b"
    )
    meta = cluster.metadata
    healthy = SimpleNamespace(fenced=None, meta=meta.partition("orders", 0))
    fenced = SimpleNamespace(fenced="log ... is fenced: write ... failed (ENOSPC)", meta=meta.partition("orders", 1))
    streams: Any = SimpleNamespace(
        partitions={("orders", 0): healthy, ("orders", 1): fenced},
        descriptors=DescriptorBudget(300),
        cipher=BatchCipher(MasterKey(b"m" * 16)),
    )
    context: Any = None  # Status does not look at its call
    resp = await ClusterService(cluster, streams).Status(cluster_pb2.ClusterStatusRequest(), context)
    assert (resp.serverId, resp.controller, resp.streamCount, resp.partitionCount) == ("b", "a", 1, 3)
    assert (resp.segmentFilesOpen, resp.segmentFilesBudget) == (0, 300)
    assert list(resp.encryptionKeys) == [MasterKey(b"m" * 16).id.hex()]
    assert [(s.id, s.voter, s.controller, s.partitionCount, s.leaderCount) for s in resp.servers] == [
        ("a", True, True, 3, 1),
        ("b", True, False, 3, 1),
        ("c", False, False, 3, 1),
    ]
    assert [(p.partition, p.state, list(p.isr)) for p in resp.attention] == [
        (1, "online", ["b", "c"]),
        (2, "offline", ["c", "a", "b"]),
    ]
    # This server's fenced replicas, with the reason; the healthy one is not listed.
    assert [(p.stream, p.partition, p.state, p.server, p.reason) for p in resp.fenced] == [
        ("orders", 1, "fenced", "b", "log ... is fenced: write ... failed (ENOSPC)")
    ]
