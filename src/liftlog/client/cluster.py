"""What ``liftlog.Cluster/Status`` returns, as plain values, and the error for servers without it.

``liftlog.Cluster`` is liftlog's own admin service (``proto/cluster.proto``),
served next to the Liftbridge-compatible ``proto.API``. Liftbridge has no
such service, so a Liftbridge server answers UNIMPLEMENTED; :func:`not_offered`
turns that into an error that says so instead of gRPC's bare "Method not found".
"""

from __future__ import annotations

from dataclasses import dataclass

from liftlog.api import cluster_pb2
from liftlog.client.errors import UnimplementedError

__all__ = [
    "ClusterStatus",
    "PartitionStatus",
    "Reassignment",
    "Reassignments",
    "ReplicaProgress",
    "ServerStatus",
    "not_offered",
]


@dataclass(frozen=True, slots=True)
class ServerStatus:
    """One server as the answering server sees it in the committed metadata.

    ``alive`` is the controller's verdict (False once it missed heartbeats for
    the liveness timeout); ``liveness_changed_ns`` is when that verdict last
    changed, in Unix ns, 0 if never. ``voter`` means a member of the metadata
    Raft group and ``controller`` the metadata leader. ``partition_count`` and
    ``leader_count`` are the partitions it holds a replica of and leads.
    """

    id: str
    host: str
    port: int
    rack: str
    alive: bool
    liveness_changed_ns: int
    voter: bool
    controller: bool
    partition_count: int
    leader_count: int
    #: Being decommissioned: its replicas move away, then it leaves the cluster.
    leaving: bool = False

    @property
    def address(self) -> str:
        """``host:port``, its client (gRPC) address."""
        return f"{self.host}:{self.port}"

    @classmethod
    def from_proto(cls, s: cluster_pb2.ServerStatus) -> ServerStatus:
        """Convert a ``cluster_pb2.ServerStatus``."""
        return cls(
            s.id,
            s.host,
            s.port,
            s.rack,
            s.alive,
            s.livenessChanged,
            s.voter,
            s.controller,
            s.partitionCount,
            s.leaderCount,
            s.leaving,
        )


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """A partition that needs attention: ``state`` is not "online", or ``isr`` is smaller than ``replicas``.

    For a fenced replica ``state`` is "fenced", ``server`` the server holding it and ``reason`` why its log
    refuses writes.
    """

    stream: str
    partition: int
    state: str
    leader: str
    candidate: str
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    server: str = ""
    reason: str = ""

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)

    @classmethod
    def from_proto(cls, p: cluster_pb2.PartitionStatus) -> PartitionStatus:
        return cls(
            p.stream, p.partition, p.state, p.leader, p.candidate, tuple(p.replicas), tuple(p.isr), p.server, p.reason
        )


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """The cluster as one server (``server_id``) sees it.

    ``controller`` is the metadata leader's id, None when the answering server
    knows of none (no quorum, or an election in progress). ``term``,
    ``commit_index`` and ``applied_index`` are the answering server's Raft
    state: an applied index lagging the commit index means its view is behind.
    ``servers`` keeps the order the server sent; ``attention`` lists the
    partitions that are not online or are under-replicated; ``fenced`` the
    fenced replicas of every server that answered (``unreachable`` names the
    live servers that did not); ``open_files_limit`` is the answering
    server's.
    """

    server_id: str
    controller: str | None
    term: int
    commit_index: int
    applied_index: int
    servers: tuple[ServerStatus, ...]
    stream_count: int
    partition_count: int
    attention: tuple[PartitionStatus, ...] = ()
    fenced: tuple[PartitionStatus, ...] = ()
    unreachable: tuple[str, ...] = ()
    open_files_limit: int = 0
    segment_files_open: int = 0
    segment_files_budget: int = 0
    #: Servers that answered and sign nothing: no cluster secret (anyone on NATS can act as them).
    without_secret: tuple[str, ...] = ()
    #: (server, reason, count) of the server-to-server messages each answering server dropped.
    dropped: tuple[tuple[str, str, int], ...] = ()
    #: (server, ids of its encryption master keys, the current one first) of each answering server.
    encryption_keys: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @property
    def encryption_keys_differ(self) -> bool:
        """Whether the answering servers encrypt with different master keys (or some with none)."""
        return len({keys[:1] for _, keys in self.encryption_keys}) > 1

    def server(self, id: str) -> ServerStatus | None:
        """The server with this id, or None."""
        for s in self.servers:
            if s.id == id:
                return s
        return None

    @classmethod
    def from_proto(cls, resp: cluster_pb2.ClusterStatusResponse) -> ClusterStatus:
        """Convert a ``cluster_pb2.ClusterStatusResponse`` (an empty controller becomes None)."""
        return cls(
            resp.serverId,
            resp.controller or None,
            resp.term,
            resp.commitIndex,
            resp.appliedIndex,
            tuple(ServerStatus.from_proto(s) for s in resp.servers),
            resp.streamCount,
            resp.partitionCount,
            tuple(PartitionStatus.from_proto(p) for p in resp.attention),
            tuple(PartitionStatus.from_proto(p) for p in resp.fenced),
            (),
            resp.openFilesLimit,
            resp.segmentFilesOpen,
            resp.segmentFilesBudget,
            () if resp.clusterAuth else (resp.serverId,),
            tuple((resp.serverId, reason, count) for reason, count in sorted(resp.droppedInternal.items())),
            ((resp.serverId, tuple(resp.encryptionKeys)),),
        )


@dataclass(frozen=True, slots=True)
class ReplicaProgress:
    """One replica of a moving partition: its log end as the leader last saw it, and whether it is in sync."""

    id: str
    log_end: int
    in_sync: bool


@dataclass(frozen=True, slots=True)
class Reassignment:
    """A partition moving from its ``replicas`` (old and new together while it moves) to ``target``.

    ``progress`` (with the leader's ``leader_log_end`` and ``leader_log_start``) comes from the
    partition's leader; it is empty when the leader did not answer.
    """

    stream: str
    partition: int
    replicas: tuple[str, ...]
    target: tuple[str, ...]
    leader: str
    leader_log_end: int = 0
    leader_log_start: int = 0
    progress: tuple[ReplicaProgress, ...] = ()

    @property
    def messages_to_copy(self) -> int:
        """Messages the leader holds, which each new replica copies."""
        return max(self.leader_log_end - self.leader_log_start, 0)

    def in_sync(self, replica: str) -> bool:
        return any(p.id == replica and p.in_sync for p in self.progress)

    def copied(self, replica: str) -> int:
        """Messages ``replica`` holds so far (from the leader's log start)."""
        for p in self.progress:
            if p.id == replica:
                return max(min(p.log_end, self.leader_log_end) - self.leader_log_start, 0)
        return 0

    @classmethod
    def from_proto(cls, r: cluster_pb2.Reassignment) -> Reassignment:
        return cls(
            r.stream,
            r.partition,
            tuple(r.current),
            tuple(r.target),
            r.leader,
            r.leaderLogEnd,
            r.leaderLogStart,
            tuple(ReplicaProgress(p.id, p.logEnd, p.inSync) for p in r.replicas),
        )


@dataclass(frozen=True, slots=True)
class Reassignments:
    """The reassignments under way, with progress from each partition's leader, and the servers leaving."""

    moving: tuple[Reassignment, ...]
    leaving: tuple[str, ...]

    @property
    def done(self) -> bool:
        return not self.moving and not self.leaving


@dataclass(frozen=True, slots=True)
class Policies:
    """The authorization policies a server enforces: (subject, resource, action) rules; ``enforced`` False
    when the server does not check calls at all; ``from_files`` when they come from its policy file."""

    rules: tuple[tuple[str, str, str], ...]
    enforced: bool
    from_files: bool


@dataclass(frozen=True, slots=True)
class GroupMember:
    """A member of a consumer group: the streams it consumes and the partitions it holds now."""

    consumer_id: str
    streams: tuple[str, ...]
    assignments: dict[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A consumer group as a server's metadata has it."""

    id: str
    coordinator: str
    epoch: int
    members: tuple[GroupMember, ...]

    @classmethod
    def from_proto(cls, g: cluster_pb2.GroupStatus) -> GroupInfo:
        members = tuple(
            GroupMember(
                m.consumerId,
                tuple(m.streams),
                {s: tuple(p.partitions) for s, p in sorted(m.assignments.items())},
            )
            for m in g.members
        )
        return cls(g.id, g.coordinator, g.epoch, members)


def not_offered(err: UnimplementedError) -> UnimplementedError | None:
    """The error to raise for an UNIMPLEMENTED answer to a ``liftlog.Cluster`` call, or None to keep `err`.

    Without a ``liftlog-error`` reason the UNIMPLEMENTED comes from gRPC itself:
    the server has no ``liftlog.Cluster`` service, which is what a Liftbridge
    server (or a liftlog older than the service) looks like. With a reason it is
    a liftlog server refusing the call on purpose, and its own message says why.
    """
    if err.reason is not None:
        return None
    return UnimplementedError(
        "the server does not offer liftlog's cluster API (liftlog.Cluster); is it a Liftbridge server?",
        code=err.code,
    )
