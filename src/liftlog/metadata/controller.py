"""What the controller (the metadata Raft leader) decides, as plain functions and classes.

- :func:`plan_create_stream` turns a CreateStream request into the operation to
  replicate: validated, with every partition's replicas placed over the live
  servers and leaders balanced over the whole cluster.
- :class:`LivenessTracker` turns heartbeat arrivals into ``SetServerLiveness``
  operations when a server goes silent or comes back.

No clocks, no I/O: times arrive as arguments (ns), results are operations for
the driver to propose through Raft.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .limits import StreamLimits, check_partition_count, check_replicas_per_server, check_settings
from .model import (
    AddPolicy,
    CreateStream,
    InvalidStreamError,
    Metadata,
    PartitionMeta,
    Policy,
    RevokePolicy,
    SetServerLiveness,
    StreamExistsError,
    StreamMeta,
    StreamSettings,
    partition_subject,
)
from .names import internal_stream_subject, is_internal_stream, validate_new_stream
from .placement import PlacementError, ServerInfo, place_partitions

__all__ = ["CreateStreamRequest", "LivenessTracker", "plan_create_stream", "plan_policy_change"]


@dataclass(frozen=True, slots=True)
class CreateStreamRequest:
    name: str
    subject: str
    group: str = ""
    #: 0 means one partition (an unset proto field).
    partitions: int = 1
    #: 0 means one replica, -1 every live server.
    replication_factor: int = 1
    settings: StreamSettings = field(default_factory=StreamSettings)


#: The longest subject, resource or action a policy may name.
MAX_POLICY_NAME = 1024


def plan_policy_change(subject: str, resource: str, action: str, *, add: bool) -> AddPolicy | RevokePolicy:
    """The operation that adds (or revokes) a policy; InvalidStreamError for a name a policy cannot hold."""
    for what, value in (("subject", subject), ("resource", resource), ("action", action)):
        if not value or value != value.strip() or "," in value:
            raise InvalidStreamError(
                f"a policy's {what} must be a non-empty name without commas or surrounding spaces, got {value!r}"
            )
        if len(value) > MAX_POLICY_NAME:  # every server keeps every policy, in memory and in snapshots
            raise InvalidStreamError(
                f"a policy's {what} has {len(value)} characters; at most {MAX_POLICY_NAME} are allowed"
            )
    policy = Policy(subject, resource, action)
    return AddPolicy(policy) if add else RevokePolicy(policy)


def plan_create_stream(
    metadata: Metadata,
    req: CreateStreamRequest,
    now: int,
    *,
    namespace: str,
    limits: StreamLimits = StreamLimits(),  # noqa: B008 (frozen)
    internal: bool = False,
) -> CreateStream:
    """Validate ``req`` against ``metadata`` and place its partitions; raises a MetadataError.

    ``namespace`` is the cluster's clustering.namespace: stream subjects must stay clear of it, except
    the servers' own (``internal``) streams', which live exactly at theirs.
    ``limits`` bound the partitions and settings one stream may ask for (see ``limits``).
    """
    if req.partitions < 0:
        raise InvalidStreamError(f"partitions must be positive, got {req.partitions}")
    partitions = req.partitions or 1
    if internal:
        if not is_internal_stream(req.name) or req.subject != internal_stream_subject(req.name, namespace):
            raise InvalidStreamError(f"{req.name!r} on {req.subject!r} is not one of the servers' own streams")
    else:
        validate_new_stream(req.name, req.subject, partitions, namespace)
    if req.name in metadata.streams:
        raise StreamExistsError(req.name)
    check_partition_count(partitions, limits)
    check_settings(req.settings, limits)
    live = [ServerInfo(s.id, s.rack) for s in metadata.servers.values() if s.alive and not s.leaving]
    rf = req.replication_factor or 1
    leaders: Counter[str] = Counter()
    replicas: Counter[str] = Counter()
    for stream in metadata.streams.values():
        for p in stream.partitions.values():
            leaders[p.replicas[0]] += 1  # preferred leaderships, as placement balances them
            replicas.update(p.replicas)
    try:
        placement = place_partitions(live, partitions, rf, leader_counts=leaders, replica_counts=replicas)
    except PlacementError as exc:
        raise InvalidStreamError(str(exc)) from exc
    check_replicas_per_server(req.name, placement, replicas, limits)
    min_isr = req.settings.min_isr
    if min_isr is not None and min_isr > len(placement[0]):
        raise InvalidStreamError(
            f"minIsr {min_isr} is larger than the replication factor ({len(placement[0])}"
            f"{' live servers' if rf == -1 else ''})"
        )
    stream = StreamMeta(
        name=req.name, subject=req.subject, group=req.group, creation_timestamp=now, settings=req.settings
    )
    for i, chosen in enumerate(placement):
        stream.partitions[i] = PartitionMeta(
            stream=req.name,
            id=i,
            subject=partition_subject(req.subject, i),
            leader=chosen[0],
            replicas=list(chosen),
            isr=list(chosen),
        )
    return CreateStream(stream)


class LivenessTracker:
    """When each server was last heard from, as seen by the current controller.

    A new controller knows nothing yet, so it gives every server a full
    timeout from its own start (``reset``) before declaring anyone dead.
    Times are a monotonic clock's: a wall clock stepped forward would declare
    live servers dead while their leader leases still hold.
    """

    def __init__(self, timeout_ns: int) -> None:
        self.timeout_ns = timeout_ns
        self._since = 0
        self._heard: dict[str, int] = {}

    def reset(self, now: int) -> None:
        self._since = now
        self._heard.clear()

    def heard(self, server_id: str, now: int) -> None:
        self._heard[server_id] = now

    def last_heard(self, server_id: str) -> int | None:
        return self._heard.get(server_id)

    def changes(self, metadata: Metadata, now: int, stamp: int | None = None) -> list[SetServerLiveness]:
        """Operations that bring ``metadata``'s liveness flags in line with what was heard; ``stamp`` is the
        (wall clock) time they record, ``now`` by default."""
        ops = []
        for server in sorted(metadata.servers.values(), key=lambda s: s.id):
            heard = self._heard.get(server.id)
            if heard is None and not server.alive:
                continue  # the grace period only delays deaths; coming back takes a heartbeat
            alive = now - (heard if heard is not None else self._since) < self.timeout_ns
            if alive != server.alive:
                ops.append(SetServerLiveness(server.id, alive, now if stamp is None else stamp))
        return ops
