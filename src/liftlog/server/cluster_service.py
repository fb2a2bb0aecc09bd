"""``liftlog.Cluster``: our admin RPCs (cluster status), answered from this server's committed metadata."""

from __future__ import annotations

from collections import Counter
from typing import Any

from liftlog.api import cluster_pb2
from liftlog.metadata import PartitionState

from .cluster import MetadataService
from .rlimits import open_files_limit
from .streams import StreamManager

__all__ = ["ClusterStatusService"]


class ClusterStatusService:
    def __init__(self, cluster: MetadataService, streams: StreamManager) -> None:
        self._cluster = cluster
        self._streams = streams

    async def Status(self, request: Any, context: Any) -> cluster_pb2.ClusterStatusResponse:
        cluster = self._cluster
        metadata = cluster.metadata
        node = cluster.raft.node
        replicas: Counter[str] = Counter()
        leaders: Counter[str] = Counter()
        partitions = 0
        for stream in metadata.streams.values():
            for p in stream.partitions.values():
                partitions += 1
                replicas.update(p.replicas)
                leaders[p.leader] += 1
        controller = cluster.leader_id or ""
        voters = set(cluster.voters)
        out = cluster_pb2.ClusterStatusResponse(
            serverId=cluster.server_id,
            controller=controller,
            term=node.term if node else 0,
            commitIndex=node.commit_index if node else 0,
            appliedIndex=node.applied_index if node else 0,
            streamCount=len(metadata.streams),
            partitionCount=partitions,
            openFilesLimit=open_files_limit(),
            segmentFilesOpen=self._streams.descriptors.open_count,
            segmentFilesBudget=self._streams.descriptors.limit,
        )
        for stream in sorted(metadata.streams.values(), key=lambda s: s.name):
            for p in stream.partitions.values():
                if p.state is not PartitionState.ONLINE or len(p.isr) < len(p.replicas):
                    out.attention.append(
                        cluster_pb2.PartitionStatus(
                            stream=stream.name,
                            partition=p.id,
                            state=p.state.value,
                            leader=p.leader,
                            candidate=p.candidate,
                            replicas=p.replicas,
                            isr=p.isr,
                        )
                    )
        for (name, pid), part in sorted(self._streams.partitions.items()):
            if part.fenced is not None:
                meta = part.meta
                out.fenced.append(
                    cluster_pb2.PartitionStatus(
                        stream=name,
                        partition=pid,
                        state="fenced",
                        leader=meta.leader,
                        replicas=meta.replicas,
                        isr=meta.isr,
                        server=cluster.server_id,
                        reason=part.fenced,
                    )
                )
        for server in sorted(metadata.servers.values(), key=lambda s: s.id):
            out.servers.append(
                cluster_pb2.ServerStatus(
                    id=server.id,
                    host=server.host,
                    port=server.port,
                    rack=server.rack,
                    alive=server.alive,
                    livenessChanged=server.liveness_changed,
                    voter=server.id in voters,
                    controller=server.id == controller,
                    partitionCount=replicas[server.id],
                    leaderCount=leaders[server.id],
                )
            )
        return out
