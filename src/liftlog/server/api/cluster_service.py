"""``liftlog.Cluster``: our admin RPCs: cluster status, reassignment, decommissioning, preferred leaders,
authorization policies.

Status and progress come from this server's committed metadata (and, for the
partitions it leads, from its replication state); changes go to the controller
like every metadata change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping

from liftlog.api import cluster_pb2
from liftlog.api.errors import Reason
from liftlog.metadata import MetadataError, PartitionState
from liftlog.metadata.groups import assign
from liftlog.metadata.protocol import PartitionMove
from liftlog.metadata.reassignment import preferred_leader_changes
from liftlog.rpc import ServerContext, StatusCode
from liftlog.server.api.access import AccessControl
from liftlog.server.api.failures import RpcFailure, abort_with, failure_from
from liftlog.server.control.cluster import MetadataService
from liftlog.server.partitions.streams import StreamManager
from liftlog.server.rlimits import open_files_limit

__all__ = ["ClusterService"]


class ClusterService:
    def __init__(
        self,
        cluster: MetadataService,
        streams: StreamManager,
        access: AccessControl | None = None,
        auth_state: Callable[[], tuple[bool, Mapping[str, int]]] = lambda: (False, {}),
    ) -> None:
        self._cluster = cluster
        self._streams = streams
        self._access = access
        #: Whether this server signs its internal messages, and what it dropped by reason.
        self._auth_state = auth_state

    async def Status(
        self, request: cluster_pb2.ClusterStatusRequest, context: ServerContext
    ) -> cluster_pb2.ClusterStatusResponse:
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
        signing, dropped = self._auth_state()
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
            clusterAuth=signing,
            droppedInternal=dict(dropped),
            encryptionKeys=self._streams.cipher.key_ids,
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
                    leaving=server.leaving,
                )
            )
        return out

    async def Reassign(
        self, request: cluster_pb2.ReassignRequest, context: ServerContext
    ) -> cluster_pb2.ReassignResponse:
        req: cluster_pb2.ReassignRequest = request
        moves = tuple(PartitionMove(p.stream, p.partition, tuple(p.replicas)) for p in req.partitions)
        try:
            await self._cluster.reassign(moves, req.spread)
        except MetadataError as exc:
            await abort_with(context, failure_from(exc))
        return cluster_pb2.ReassignResponse(reassignments=self._reassignments())

    async def Decommission(
        self, request: cluster_pb2.DecommissionRequest, context: ServerContext
    ) -> cluster_pb2.DecommissionResponse:
        req: cluster_pb2.DecommissionRequest = request
        try:
            await self._cluster.decommission(req.server)
        except MetadataError as exc:
            await abort_with(context, failure_from(exc))
        return cluster_pb2.DecommissionResponse(reassignments=self._reassignments())

    async def ElectPreferredLeaders(
        self, request: cluster_pb2.ElectPreferredLeadersRequest, context: ServerContext
    ) -> cluster_pb2.ElectPreferredLeadersResponse:
        due = len(preferred_leader_changes(self._cluster.metadata))
        try:
            await self._cluster.elect_preferred_leaders()
        except MetadataError as exc:
            await abort_with(context, failure_from(exc))
        return cluster_pb2.ElectPreferredLeadersResponse(changed=due)

    async def Reassignments(
        self, request: cluster_pb2.ReassignmentsRequest, context: ServerContext
    ) -> cluster_pb2.ReassignmentsResponse:
        metadata = self._cluster.metadata
        return cluster_pb2.ReassignmentsResponse(
            serverId=self._cluster.server_id,
            reassignments=self._reassignments(),
            leaving=sorted(s.id for s in metadata.servers.values() if s.leaving),
        )

    async def AddPolicy(self, request: cluster_pb2.PolicyRequest, context: ServerContext) -> cluster_pb2.PolicyResponse:
        await self._change_policy(request, context, add=True)
        return cluster_pb2.PolicyResponse()

    async def RevokePolicy(
        self, request: cluster_pb2.PolicyRequest, context: ServerContext
    ) -> cluster_pb2.PolicyResponse:
        await self._change_policy(request, context, add=False)
        return cluster_pb2.PolicyResponse()

    async def _change_policy(self, request: cluster_pb2.PolicyRequest, context: ServerContext, *, add: bool) -> None:
        p = request.policy
        authorizer = self._access.authorizer if self._access is not None else None
        if authorizer is not None and authorizer.from_file:
            await abort_with(
                context,
                RpcFailure(
                    StatusCode.FAILED_PRECONDITION,
                    Reason.REFUSED,
                    "this server takes its policies from tls.client.authz.policy: edit that file and send the "
                    "server SIGHUP",
                ),
            )
        try:
            await self._cluster.change_policy(p.subject, p.resource, p.action, add=add)
        except MetadataError as exc:
            await abort_with(context, failure_from(exc))

    async def ListPolicies(
        self, request: cluster_pb2.ListPoliciesRequest, context: ServerContext
    ) -> cluster_pb2.ListPoliciesResponse:
        access = self._access
        authorizer = access.authorizer if access is not None else None
        from_files = authorizer is not None and authorizer.from_file
        if from_files:
            assert authorizer is not None
            rules = authorizer.policies()
        else:
            rules = [(p.subject, p.resource, p.action) for p in self._cluster.metadata.policies]
        return cluster_pb2.ListPoliciesResponse(
            policies=[cluster_pb2.Policy(subject=s, resource=r, action=a) for s, r, a in rules],
            enforced=authorizer is not None,
            fromFiles=from_files,
        )

    async def Groups(self, request: cluster_pb2.GroupsRequest, context: ServerContext) -> cluster_pb2.GroupsResponse:
        req: cluster_pb2.GroupsRequest = request
        metadata = self._cluster.metadata
        names = list(req.groups) or sorted(metadata.groups)
        out = cluster_pb2.GroupsResponse()
        for name in names:
            group = metadata.groups.get(name)
            if group is None:
                out.unknown.append(name)
                continue
            status = out.groups.add(id=group.id, coordinator=group.coordinator, epoch=group.epoch)
            assigned = assign(group, metadata)
            for consumer, streams in group.members.items():
                member = status.members.add(consumerId=consumer, streams=list(streams))
                for stream, partitions in assigned.get(consumer, {}).items():
                    member.assignments[stream].partitions.extend(partitions)
        return out

    def _reassignments(self) -> list[cluster_pb2.Reassignment]:
        """Every reassignment under way; with the replicas' progress where this server leads."""
        out = []
        for stream in sorted(self._cluster.metadata.streams.values(), key=lambda s: s.name):
            for p in stream.partitions.values():
                if not p.target:
                    continue
                item = cluster_pb2.Reassignment(
                    stream=p.stream, partition=p.id, current=p.replicas, target=p.target, leader=p.leader
                )
                part = self._streams.partitions.get((p.stream, p.id))
                core = part.leader if part is not None else None
                if core is not None and part is not None and part.log is not None:
                    item.leaderLogEnd = part.log.log_end_offset
                    item.leaderLogStart = part.log.log_start_offset
                    for r in p.replicas:
                        follower = core.followers.get(r)
                        leo = part.log.log_end_offset if r == core.replica_id else follower.leo if follower else 0
                        item.replicas.append(cluster_pb2.ReplicaProgress(id=r, logEnd=leo, inSync=r in p.isr))
                out.append(item)
        return out
