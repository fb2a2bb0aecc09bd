"""Cluster metadata as a plain state machine: servers, streams, partitions, their flags.

Rules:
- Every change is an operation (``RegisterServer``, ``SetServerLiveness``,
  ``CreateStream``, ``DeleteStream``, ``SetPaused``, ``SetReadonly``) applied
  by :meth:`Metadata.apply`; the state changes only there, so the operations
  replicated through the metadata Raft log leave every server with the same state.
- ``apply`` either fully applies an operation or raises a
  :class:`MetadataError` subclass and changes nothing.
- Nothing here reads a clock or touches a file: timestamps arrive inside the
  operations, persistence is ``to_dict`` / ``from_dict``.

Not safe to share between threads; the server uses it from its event loop.
"""

from __future__ import annotations

import base64
import enum
import re
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .events import ActivityEvent

if TYPE_CHECKING:
    from liftlog.jsontypes import JSONObject

__all__ = [
    "ActivityLog",
    "ChangeGroupCoordinator",
    "CreateStream",
    "DeleteStream",
    "EventTimestamps",
    "GroupMeta",
    "InvalidStreamError",
    "JoinGroup",
    "LeaveGroup",
    "MarkActivityPublished",
    "Metadata",
    "MetadataError",
    "NoSuchGroupError",
    "NoSuchPartitionError",
    "NoSuchStreamError",
    "Operation",
    "PartitionMeta",
    "RegisterServer",
    "ServerMeta",
    "SetPaused",
    "SetReadonly",
    "SetServerLiveness",
    "StreamExistsError",
    "StreamMeta",
    "StreamSettings",
    "partition_subject",
]


class MetadataError(Exception):
    """An operation that cannot be applied; the message says why."""


class StreamExistsError(MetadataError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"stream {name!r} already exists")


class NoSuchStreamError(MetadataError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"no such stream: {name!r}")


class NoSuchPartitionError(MetadataError):
    def __init__(self, name: str, partition: int) -> None:
        self.name = name
        self.partition = partition
        super().__init__(f"no such partition: stream {name!r} has no partition {partition}")


class StaleEpochError(MetadataError):
    """A partition change was based on an older partition epoch than the committed one."""

    def __init__(self, name: str, partition: int, expected: int, actual: int) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"partition {name}/{partition} is at epoch {actual}, not {expected}: the change was based on stale metadata"
        )


class NoSuchGroupError(MetadataError):
    def __init__(self, group: str) -> None:
        self.group = group
        super().__init__(f"consumer group does not exist: {group!r}")


class RefusedError(MetadataError):
    """A valid request the cluster's state does not allow now (it would lose data or the quorum, or the
    partition is already moving); the message says why and what to do first."""


class InvalidStreamError(MetadataError):
    """A stream name, subject or setting that is not allowed."""


# Names become directory names, so they are restricted to a portable set. This is all ``apply`` checks:
# streams committed by older versions under looser rules must still apply (a replayed log or snapshot).
# New streams pass the stricter rules of ``names`` first; the server skips older ones that break them.
_STORABLE_NAME = re.compile(r"[A-Za-z0-9_\-.]{1,249}")


def _check_storable(stream: StreamMeta) -> None:
    if not _STORABLE_NAME.fullmatch(stream.name) or stream.name in {".", ".."}:
        raise InvalidStreamError(
            f"invalid stream name {stream.name!r}: use 1-249 letters, digits, '_', '-' or '.', and not '.' or '..'"
        )
    if not stream.subject:
        raise InvalidStreamError(f"stream {stream.name!r} has an empty subject")


def partition_subject(subject: str, partition: int) -> str:
    """Liftbridge's rule: partition 0 listens on the stream subject, partition N on ``<subject>.N``."""
    return subject if partition == 0 else f"{subject}.{partition}"


@dataclass(frozen=True, slots=True)
class EventTimestamps:
    """First and latest time (ns) something happened; 0 when it never did."""

    first: int = 0
    latest: int = 0

    def record(self, now: int) -> EventTimestamps:
        return EventTimestamps(self.first or now, now)


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """Per-stream overrides from CreateStream; ``None`` means the server default."""

    retention_max_bytes: int | None = None
    retention_max_messages: int | None = None
    retention_max_age_ms: int | None = None
    cleaner_interval_ms: int | None = None
    segment_max_bytes: int | None = None
    segment_max_age_ms: int | None = None
    compact_max_goroutines: int | None = None
    compact_enabled: bool | None = None
    auto_pause_time_ms: int | None = None
    auto_pause_disable_if_subscribers: bool | None = None
    min_isr: int | None = None
    optimistic_concurrency_control: bool | None = None
    encryption: bool | None = None
    unclean_leader_election: bool | None = None
    duplicate_window_ms: int | None = None

    def to_dict(self) -> dict[str, int | bool]:
        return {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StreamSettings:
        return cls(**data)


@dataclass(slots=True)
class ServerMeta:
    """A server of the cluster as its last registration described it, and whether it answers."""

    id: str
    host: str
    port: int
    rack: str = ""
    alive: bool = True
    #: When ``alive`` last changed (ns), as the controller saw it.
    liveness_changed: int = 0
    #: Being decommissioned: its replicas move away, it gets no new ones, then it leaves the cluster.
    leaving: bool = False

    def to_dict(self) -> JSONObject:
        d: JSONObject = {
            "id": self.id,
            "host": self.host,
            "port": self.port,
            "rack": self.rack,
            "alive": self.alive,
            "liveness_changed": self.liveness_changed,
        }
        if self.leaving:
            d["leaving"] = True
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerMeta:
        return cls(
            id=str(data["id"]),
            host=str(data["host"]),
            port=int(data["port"]),
            rack=str(data.get("rack", "")),
            alive=bool(data.get("alive", True)),
            liveness_changed=int(data.get("liveness_changed", 0)),
            leaving=bool(data.get("leaving", False)),
        )


class PartitionState(enum.StrEnum):
    """Where a partition is in leader election (seed 002)."""

    ONLINE = "online"
    ELECTION = "election"
    CANDIDATE_FOUND = "candidate-found"
    OFFLINE = "offline"


@dataclass(slots=True)
class PartitionMeta:
    stream: str
    id: int
    subject: str
    leader: str
    replicas: list[str]
    isr: list[str]
    leader_epoch: int = 0
    #: Bumped by every committed change to this partition's metadata (Liftbridge's partition epoch).
    epoch: int = 0
    paused: bool = False
    readonly: bool = False
    pause_timestamps: EventTimestamps = EventTimestamps()
    readonly_timestamps: EventTimestamps = EventTimestamps()
    state: PartitionState = PartitionState.ONLINE
    #: The replica asked to take over while ``state`` is CANDIDATE_FOUND.
    candidate: str = ""
    #: The replicas a reassignment moves the partition to (``replicas`` holds old and new meanwhile);
    #: empty when no reassignment is under way.
    target: list[str] = field(default_factory=list)

    def to_dict(self) -> JSONObject:
        d = self._fields()
        if self.target:
            d["target"] = list(self.target)
        return d

    def _fields(self) -> JSONObject:
        return {
            "state": self.state.value,
            "candidate": self.candidate,
            "id": self.id,
            "subject": self.subject,
            "leader": self.leader,
            "replicas": list(self.replicas),
            "isr": list(self.isr),
            "leader_epoch": self.leader_epoch,
            "epoch": self.epoch,
            "paused": self.paused,
            "readonly": self.readonly,
            "pause_timestamps": [self.pause_timestamps.first, self.pause_timestamps.latest],
            "readonly_timestamps": [self.readonly_timestamps.first, self.readonly_timestamps.latest],
        }

    @classmethod
    def from_dict(cls, stream: str, data: dict[str, Any]) -> PartitionMeta:
        return cls(
            stream=stream,
            id=int(data["id"]),
            subject=str(data["subject"]),
            leader=str(data["leader"]),
            replicas=[str(r) for r in data["replicas"]],
            isr=[str(r) for r in data["isr"]],
            leader_epoch=int(data.get("leader_epoch", 0)),
            epoch=int(data.get("epoch", 0)),
            state=PartitionState(data.get("state", PartitionState.ONLINE.value)),
            candidate=str(data.get("candidate", "")),
            paused=bool(data.get("paused", False)),
            readonly=bool(data.get("readonly", False)),
            pause_timestamps=EventTimestamps(*data.get("pause_timestamps", (0, 0))),
            readonly_timestamps=EventTimestamps(*data.get("readonly_timestamps", (0, 0))),
            target=[str(r) for r in data.get("target", ())],
        )


@dataclass(slots=True)
class StreamMeta:
    name: str
    subject: str
    group: str
    creation_timestamp: int
    settings: StreamSettings
    partitions: dict[int, PartitionMeta] = field(default_factory=dict)
    #: Set by PauseStream(resumeAll): resuming one partition resumes them all.
    resume_all: bool = False

    def to_dict(self) -> JSONObject:
        return {
            "name": self.name,
            "subject": self.subject,
            "group": self.group,
            "creation_timestamp": self.creation_timestamp,
            "settings": self.settings.to_dict(),
            "resume_all": self.resume_all,
            "partitions": [p.to_dict() for p in self.partitions.values()],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StreamMeta:
        name = str(data["name"])
        parts = [PartitionMeta.from_dict(name, p) for p in data["partitions"]]
        return cls(
            name=name,
            subject=str(data["subject"]),
            group=str(data.get("group", "")),
            creation_timestamp=int(data["creation_timestamp"]),
            settings=StreamSettings.from_dict(dict(data.get("settings", {}))),
            partitions={p.id: p for p in parts},
            resume_all=bool(data.get("resume_all", False)),
        )


# -- operations ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateStream:
    stream: StreamMeta


@dataclass(frozen=True, slots=True)
class DeleteStream:
    name: str


@dataclass(frozen=True, slots=True)
class SetPaused:
    """Pause (or resume) ``partitions`` of a stream; an empty tuple means all of them."""

    name: str
    partitions: tuple[int, ...]
    paused: bool
    timestamp: int
    resume_all: bool = False


@dataclass(frozen=True, slots=True)
class SetReadonly:
    name: str
    partitions: tuple[int, ...]
    readonly: bool
    timestamp: int


@dataclass(frozen=True, slots=True)
class RegisterServer:
    """A server announces (or updates) where it serves the API; it counts as alive from ``timestamp``."""

    server: ServerMeta
    timestamp: int


@dataclass(frozen=True, slots=True)
class SetServerLiveness:
    id: str
    alive: bool
    timestamp: int


@dataclass(frozen=True, slots=True)
class ChangeIsr:
    """The partition leader's new ISR, valid only at partition ``epoch`` (else StaleEpochError)."""

    name: str
    partition: int
    isr: tuple[str, ...]
    epoch: int


@dataclass(frozen=True, slots=True)
class ChangeLeader:
    """A new leader (and ISR) for the partition, from the controller; starts a new leader epoch."""

    name: str
    partition: int
    leader: str
    isr: tuple[str, ...]
    epoch: int


@dataclass(frozen=True, slots=True)
class SetPartitionState:
    """An election step: ``candidate`` is asked to take over when ``state`` is CANDIDATE_FOUND."""

    name: str
    partition: int
    state: PartitionState
    candidate: str
    epoch: int


@dataclass(frozen=True, slots=True)
class ReassignPartition:
    """Start moving the partition to ``target`` (its new replicas in preference order): the new
    replicas join ``replicas`` and catch up; :class:`CompleteReassignment` drops the old ones."""

    name: str
    partition: int
    target: tuple[str, ...]
    epoch: int


@dataclass(frozen=True, slots=True)
class CompleteReassignment:
    """Every target replica is in sync and one of them leads: the partition's replicas become the target."""

    name: str
    partition: int
    epoch: int


@dataclass(frozen=True, slots=True)
class SetServerLeaving:
    """Mark a server as being decommissioned (or no longer): it gets no new replicas."""

    id: str
    leaving: bool


@dataclass(frozen=True, slots=True)
class RemoveServer:
    """A decommissioned server that holds no replica any more leaves the cluster's metadata."""

    id: str


@dataclass(frozen=True, slots=True, order=True)
class Policy:
    """An authorization rule: ``subject`` (a client certificate's identity, or ``*``) may do ``action``
    (an RPC's name, or ``*``) on ``resource`` (a stream name or pattern, or ``*``)."""

    subject: str
    resource: str
    action: str


@dataclass(frozen=True, slots=True)
class AddPolicy:
    policy: Policy


@dataclass(frozen=True, slots=True)
class RevokePolicy:
    policy: Policy


@dataclass
class GroupMeta:
    """A consumer group: its members (consumer id -> the streams it consumes, in join order), the server
    that coordinates it, and its epoch, which every membership or coordinator change moves on."""

    id: str
    coordinator: str
    epoch: int
    members: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def to_dict(self) -> JSONObject:
        return {
            "id": self.id,
            "coordinator": self.coordinator,
            "epoch": self.epoch,
            "members": [[c, list(s)] for c, s in self.members.items()],
        }

    @classmethod
    def from_dict(cls, data: object) -> GroupMeta:
        if not isinstance(data, dict) or not isinstance(data.get("members", []), list):
            raise TypeError("a consumer group must be an object with a list of members")
        members: dict[str, tuple[str, ...]] = {}
        for entry in data.get("members", []):
            if not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[1], list):
                raise TypeError("a group member must be [consumer id, [streams]]")
            members[str(entry[0])] = tuple(str(x) for x in entry[1])
        return cls(str(data["id"]), str(data["coordinator"]), int(data["epoch"]), members)


@dataclass(frozen=True, slots=True)
class JoinGroup:
    """``consumer`` joins ``group`` to consume ``streams``; a new group is coordinated by ``coordinator``."""

    group: str
    consumer: str
    streams: tuple[str, ...]
    coordinator: str


@dataclass(frozen=True, slots=True)
class LeaveGroup:
    """``consumer`` leaves ``group`` (``expired``: its coordinator heard nothing from it in time)."""

    group: str
    consumer: str
    expired: bool = False


@dataclass(frozen=True, slots=True)
class ChangeGroupCoordinator:
    """Most members found the coordinator of ``group`` (at ``epoch``) silent: ``coordinator`` takes over."""

    group: str
    coordinator: str
    epoch: int


@dataclass(frozen=True, slots=True)
class MarkActivityPublished:
    """The controller published (or, with the activity stream off, skipped) every event up to ``index``."""

    index: int


#: Events the metadata keeps for the activity stream while they wait to be published; beyond that the
#: oldest go (counted): a stream that stays unwritable must not grow every server's memory without bound.
MAX_PENDING_ACTIVITY = 100_000


#: A pending event: ours, or (from a snapshot an older version wrote) Liftbridge's encoding, published as is.
PendingEvent = ActivityEvent | bytes


@dataclass
class ActivityLog:
    """The activity stream's events not yet published, by Raft index.

    Part of the replicated metadata, so a new controller goes on from the last event the old one marked
    published: an event published but not yet marked is published again, with the same id (at least once).
    """

    published: int = 0
    pending: deque[tuple[int, PendingEvent]] = field(default_factory=deque)
    dropped: int = 0

    def record(self, index: int, event: PendingEvent) -> None:
        if index <= self.published or (self.pending and index <= self.pending[-1][0]):
            return  # applied again (a restart replays the log): already recorded or published
        self.pending.append((index, event))
        if len(self.pending) > MAX_PENDING_ACTIVITY:
            self.pending.popleft()
            self.dropped += 1

    def mark(self, index: int) -> None:
        self.published = max(self.published, index)
        while self.pending and self.pending[0][0] <= index:
            self.pending.popleft()

    def to_dict(self) -> JSONObject:
        return {
            "published": self.published,
            "dropped": self.dropped,
            "pending": [
                [i, e.to_dict() if isinstance(e, ActivityEvent) else base64.b64encode(e).decode()]
                for i, e in self.pending
            ],
        }

    @classmethod
    def from_dict(cls, data: object) -> ActivityLog:
        if not isinstance(data, dict):
            raise TypeError(f"activity must be an object, got {type(data).__name__}")
        entries = data.get("pending", [])
        if not isinstance(entries, list) or not all(isinstance(e, list) and len(e) == 2 for e in entries):
            raise TypeError("activity.pending must be a list of [index, event] pairs")
        pending: deque[tuple[int, PendingEvent]] = deque()
        for i, e in entries:
            # An object is ours; a string is the base64 protobuf an older version kept.
            event = ActivityEvent.from_dict(e) if isinstance(e, dict) else base64.b64decode(str(e), validate=True)
            pending.append((int(i), event))
        return cls(int(data.get("published", 0)), pending, int(data.get("dropped", 0)))


Operation = (
    RegisterServer
    | SetServerLiveness
    | CreateStream
    | DeleteStream
    | SetPaused
    | SetReadonly
    | ChangeIsr
    | ChangeLeader
    | SetPartitionState
    | ReassignPartition
    | CompleteReassignment
    | SetServerLeaving
    | RemoveServer
    | AddPolicy
    | RevokePolicy
    | MarkActivityPublished
    | JoinGroup
    | LeaveGroup
    | ChangeGroupCoordinator
)


class Metadata:
    """Every server, stream and partition of the cluster, changed only by :meth:`apply`."""

    def __init__(self) -> None:
        self.servers: dict[str, ServerMeta] = {}
        self.streams: dict[str, StreamMeta] = {}
        #: Authorization rules every server enforces (tls.client.authz.enabled), in the order they were added.
        self.policies: dict[Policy, None] = {}
        #: The activity stream's events waiting to be published (recorded by ``activity.apply_entry``).
        self.activity = ActivityLog()
        #: Consumer groups by id, and the last epoch given to any group (each change takes the next one).
        self.groups: dict[str, GroupMeta] = {}
        self.group_epoch = 0

    def stream(self, name: str) -> StreamMeta:
        try:
            return self.streams[name]
        except KeyError:
            raise NoSuchStreamError(name) from None

    def partition(self, name: str, partition: int) -> PartitionMeta:
        try:
            return self.stream(name).partitions[partition]
        except KeyError:
            raise NoSuchPartitionError(name, partition) from None

    def apply(self, op: Operation) -> list[PartitionMeta]:
        """Apply ``op``; return the partitions whose state changed."""
        match op:
            case RegisterServer(server=server):
                old = self.servers.get(server.id)
                changed_at = op.timestamp if old is None or not old.alive else old.liveness_changed
                self.servers[server.id] = ServerMeta(
                    server.id,
                    server.host,
                    server.port,
                    server.rack,
                    alive=True,
                    liveness_changed=changed_at,
                    leaving=old.leaving if old is not None else False,
                )
                return []
            case SetServerLiveness():
                known = self.servers.get(op.id)
                if known is None:
                    raise MetadataError(f"no such server: {op.id!r}")
                if known.alive != op.alive:
                    known.alive = op.alive
                    known.liveness_changed = op.timestamp
                return []
            case CreateStream(stream=s):
                _check_storable(s)
                if s.name in self.streams:
                    raise StreamExistsError(s.name)
                if not s.partitions:
                    raise InvalidStreamError(f"stream {s.name!r} needs at least one partition")
                self.streams[s.name] = s
                return list(s.partitions.values())
            case DeleteStream(name=name):
                gone = list(self.streams.pop(self.stream(name).name).partitions.values())
                for group in self.groups.values():  # members stop consuming it: their assignments change
                    if any(name in streams for streams in group.members.values()):
                        group.members = {c: tuple(s for s in ss if s != name) for c, ss in group.members.items()}
                        group.epoch = self._next_group_epoch()
                return gone
            case SetPaused():
                stream = self.stream(op.name)
                targets = self._targets(stream, op.partitions)
                if not op.paused and stream.resume_all:
                    targets = list(stream.partitions.values())
                changed = [p for p in targets if p.paused != op.paused]
                for p in changed:
                    p.epoch += 1
                    p.paused = op.paused
                    if op.paused:
                        p.pause_timestamps = p.pause_timestamps.record(op.timestamp)
                if op.paused:
                    stream.resume_all = op.resume_all
                return changed
            case SetReadonly():
                stream = self.stream(op.name)
                changed = [p for p in self._targets(stream, op.partitions) if p.readonly != op.readonly]
                for p in changed:
                    p.epoch += 1
                    p.readonly = op.readonly
                    p.readonly_timestamps = p.readonly_timestamps.record(op.timestamp)
                return changed
            case ChangeIsr():
                p = self._at_epoch(op.name, op.partition, op.epoch)
                self._check_members(p, op.isr)
                if p.leader not in op.isr:
                    raise InvalidStreamError(f"the ISR of {op.name}/{op.partition} must keep its leader {p.leader}")
                p.isr = [r for r in p.replicas if r in op.isr]
                p.epoch += 1
                return [p]
            case ChangeLeader():
                p = self._at_epoch(op.name, op.partition, op.epoch)
                self._check_members(p, (op.leader, *op.isr))
                p.leader = op.leader
                p.isr = [r for r in p.replicas if r in op.isr or r == op.leader]
                p.leader_epoch += 1
                p.epoch += 1
                p.state = PartitionState.ONLINE
                p.candidate = ""
                return [p]
            case SetPartitionState():
                p = self._at_epoch(op.name, op.partition, op.epoch)
                if op.candidate:
                    self._check_members(p, (op.candidate,))
                p.state = op.state
                p.candidate = op.candidate
                p.epoch += 1
                return [p]
            case ReassignPartition():
                p = self._at_epoch(op.name, op.partition, op.epoch)
                self.check_target(p, op.target)
                if p.target and p.target != list(op.target):
                    raise RefusedError(
                        f"{op.name}/{op.partition} is already moving to {', '.join(p.target)}; "
                        "wait for that reassignment to finish"
                    )
                p.target = list(op.target)
                p.replicas = [*p.replicas, *(r for r in op.target if r not in p.replicas)]
                p.epoch += 1
                return [p]
            case CompleteReassignment():
                p = self._at_epoch(op.name, op.partition, op.epoch)
                if not p.target:
                    raise RefusedError(f"{op.name}/{op.partition} has no reassignment under way")
                behind = [r for r in p.target if r not in p.isr]
                if behind:
                    raise RefusedError(f"{op.name}/{op.partition}: {', '.join(behind)} not in sync yet")
                if p.leader not in p.target:
                    raise RefusedError(f"{op.name}/{op.partition}: its leader {p.leader} is not among the new replicas")
                p.replicas = list(p.target)
                p.isr = [r for r in p.target if r in p.isr]
                p.target = []
                p.epoch += 1
                return [p]
            case SetServerLeaving():
                known = self.servers.get(op.id)
                if known is None:
                    raise MetadataError(f"no such server: {op.id!r}")
                known.leaving = op.leaving
                return []
            case RemoveServer():
                if op.id not in self.servers:
                    raise MetadataError(f"no such server: {op.id!r}")
                holding = [
                    f"{p.stream}/{p.id}"
                    for s in self.streams.values()
                    for p in s.partitions.values()
                    if op.id in p.replicas
                ]
                if holding:
                    raise RefusedError(f"server {op.id} still holds replicas of {', '.join(holding[:5])}")
                del self.servers[op.id]
                return []
            case AddPolicy(policy=policy):
                self.policies[policy] = None
                return []
            case RevokePolicy(policy=policy):
                self.policies.pop(policy, None)
                return []
            case MarkActivityPublished(index=index):
                self.activity.mark(index)
                return []
            case JoinGroup():
                missing = [s for s in op.streams if s not in self.streams]
                if missing:
                    raise RefusedError(f"stream does not exist: {missing[0]!r}")
                joined = self.groups.get(op.group)
                if joined is None:
                    self.groups[op.group] = GroupMeta(
                        op.group, op.coordinator, self._next_group_epoch(), {op.consumer: op.streams}
                    )
                    return []
                if op.consumer in joined.members:
                    raise RefusedError(f"consumer is already a member of the consumer group {op.group!r}")
                joined.members[op.consumer] = op.streams
                joined.epoch = self._next_group_epoch()
                return []
            case LeaveGroup():
                leaving = self.group(op.group)
                if op.consumer not in leaving.members:
                    raise RefusedError(f"consumer is not a member of the consumer group {op.group!r}")
                del leaving.members[op.consumer]
                if not leaving.members:
                    del self.groups[op.group]
                else:
                    leaving.epoch = self._next_group_epoch()
                return []
            case ChangeGroupCoordinator():
                coordinated = self.group(op.group)
                if coordinated.epoch != op.epoch:
                    raise RefusedError(
                        f"consumer group {op.group!r} is at epoch {coordinated.epoch}, not {op.epoch}: its "
                        "coordinator changed meanwhile"
                    )
                coordinated.coordinator = op.coordinator
                coordinated.epoch = self._next_group_epoch()
                return []
        raise TypeError(f"unknown metadata operation {op!r}")  # pragma: no cover

    def _next_group_epoch(self) -> int:
        self.group_epoch += 1
        return self.group_epoch

    def group(self, group_id: str) -> GroupMeta:
        try:
            return self.groups[group_id]
        except KeyError:
            raise NoSuchGroupError(group_id) from None

    def _at_epoch(self, name: str, partition: int, epoch: int) -> PartitionMeta:
        p = self.partition(name, partition)
        if p.epoch != epoch:
            raise StaleEpochError(name, partition, epoch, p.epoch)
        return p

    def check_target(self, p: PartitionMeta, target: tuple[str, ...]) -> None:
        """That ``target`` can be ``p``'s new replicas: some, each once, each a known server."""
        if not target:
            raise InvalidStreamError(f"{p.stream}/{p.id}: name at least one replica to move it to")
        if len(set(target)) != len(target):
            raise InvalidStreamError(f"{p.stream}/{p.id}: the new replicas name a server twice: {', '.join(target)}")
        unknown = [r for r in target if r not in self.servers]
        if unknown:
            raise InvalidStreamError(f"no such server: {', '.join(unknown)}")

    @staticmethod
    def _check_members(p: PartitionMeta, members: tuple[str, ...]) -> None:
        strangers = [m for m in members if m not in p.replicas]
        if strangers:
            raise InvalidStreamError(
                f"{', '.join(strangers)} not a replica of {p.stream}/{p.id} ({', '.join(p.replicas)})"
            )

    @staticmethod
    def _targets(stream: StreamMeta, partitions: tuple[int, ...]) -> list[PartitionMeta]:
        if not partitions:
            return list(stream.partitions.values())
        missing = [i for i in partitions if i not in stream.partitions]
        if missing:
            raise NoSuchPartitionError(stream.name, missing[0])
        return [stream.partitions[i] for i in dict.fromkeys(partitions)]

    def to_dict(self) -> JSONObject:
        return {
            "version": 1,
            "servers": [s.to_dict() for s in self.servers.values()],
            "streams": [s.to_dict() for s in self.streams.values()],
            "policies": [[p.subject, p.resource, p.action] for p in self.policies],
            "activity": self.activity.to_dict(),
            "groups": [g.to_dict() for g in self.groups.values()],
            "group_epoch": self.group_epoch,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Metadata:
        if data.get("version") != 1:
            raise ValueError(f"unsupported metadata version {data.get('version')!r}")
        meta = cls()
        for srv in data.get("servers", []):
            server = ServerMeta.from_dict(srv)
            meta.servers[server.id] = server
        for s in data.get("streams", []):
            stream = StreamMeta.from_dict(s)
            meta.streams[stream.name] = stream
        for subject, resource, action in data.get("policies", []):  # snapshots before policies have none
            meta.policies[Policy(str(subject), str(resource), str(action))] = None
        meta.activity = ActivityLog.from_dict(data.get("activity", {}))
        groups = data.get("groups", [])
        if not isinstance(groups, list):
            raise TypeError("groups must be a list")
        for g in groups:
            group = GroupMeta.from_dict(g)
            meta.groups[group.id] = group
        meta.group_epoch = int(data.get("group_epoch", 0))
        return meta
