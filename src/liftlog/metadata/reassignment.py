"""Moving partition replicas between servers (seed 004), as plain functions over the metadata.

A reassignment follows Kafka's order, so that no acknowledged message is ever
on fewer in-sync replicas than before:

1. ``ReassignPartition`` adds the new replicas to the partition (``replicas`` =
   old + new, ``target`` = new). They start empty, follow the leader and catch
   up; the leader admits each to the ISR once it has caught up.
2. Once every target replica is in the ISR, the leader moves if it is not one
   of them (``ChangeLeader`` to the first in-sync target replica): the leader
   moves last.
3. ``CompleteReassignment`` makes ``replicas`` the target and drops the old
   replicas from the ISR; their servers close and delete their copies.

Decommissioning a server marks it leaving and plans a reassignment for every
partition it holds; once it holds none, the controller removes it from the Raft
group and then from the metadata (``RemoveServer``). The planners refuse what
would lose data or the cluster: a quorum of the metadata group, the last
in-sync replica of a partition, a replication factor the other servers cannot
hold. ``plan_spread`` evens replica counts over the live servers with the
fewest moves (for servers just added); ``preferred_leader_changes`` is the
on-demand preferred-leader election.

No clocks, no I/O: the controller's shell proposes the operations these return.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence

from .model import (
    ChangeLeader,
    CompleteReassignment,
    InvalidStreamError,
    Metadata,
    Operation,
    PartitionMeta,
    PartitionState,
    ReassignPartition,
    RefusedError,
    SetServerLeaving,
)

__all__ = [
    "departures",
    "plan_decommission",
    "plan_move",
    "plan_moves",
    "plan_spread",
    "preferred_can_lead",
    "preferred_leader_changes",
    "reassignment_steps",
]


def _partitions(metadata: Metadata) -> list[PartitionMeta]:
    return sorted((p for s in metadata.streams.values() for p in s.partitions.values()), key=lambda p: (p.stream, p.id))


def _usable(metadata: Metadata) -> list[str]:
    """Servers that may receive replicas: alive and not being decommissioned."""
    return sorted(s.id for s in metadata.servers.values() if s.alive and not s.leaving)


def plan_move(metadata: Metadata, stream: str, partition: int, target: Sequence[str]) -> ReassignPartition:
    """Move one partition to ``target`` (in preference order: the first leads once it is done)."""
    meta = metadata.partition(stream, partition)
    target = tuple(target)
    metadata.check_target(meta, target)
    usable = set(_usable(metadata))
    unusable = [r for r in target if r not in usable and r not in meta.replicas]
    if unusable:
        raise RefusedError(
            f"{stream}/{partition} cannot move to {', '.join(unusable)}: not alive, or being decommissioned"
        )
    if meta.target:
        raise RefusedError(f"{stream}/{partition} is already moving to {', '.join(meta.target)}")
    if list(target) == meta.replicas:
        raise RefusedError(f"{stream}/{partition} already has the replicas {', '.join(target)}: nothing to move")
    if not any(r in meta.isr for r in meta.replicas if metadata.servers.get(r) and metadata.servers[r].alive):
        raise RefusedError(f"{stream}/{partition} has no live in-sync replica to copy from")
    return ReassignPartition(stream, partition, target, meta.epoch)


def plan_moves(metadata: Metadata, moves: Sequence[tuple[str, int, Sequence[str]]], spread: bool) -> list[Operation]:
    """An administrator's request: the moves named (each partition once), then, with ``spread``, the
    controller's plan for the other partitions."""
    planned: dict[tuple[str, int], tuple[str, ...]] = {}
    ops: list[Operation] = []
    for stream, partition, target in moves:
        if (stream, partition) in planned:
            raise InvalidStreamError(f"{stream}/{partition} is named twice in one reassignment")
        op = plan_move(metadata, stream, partition, target)
        planned[(stream, partition)] = op.target
        ops.append(op)
    if spread:
        ops.extend(plan_spread(metadata, planned=planned))
    return ops


def plan_spread(
    metadata: Metadata, planned: Mapping[tuple[str, int], Sequence[str]] | None = None
) -> list[ReassignPartition]:
    """Even out replica counts over the usable servers with as few replica moves as possible.

    Moves one replica at a time from the server holding the most to the one holding the fewest
    (that does not hold the partition yet) until no two servers differ by more than one. Partitions
    already moving, or in ``planned`` (moves about to be proposed with these), are left alone and
    counted where they are going.
    """
    planned = planned or {}
    servers = _usable(metadata)
    if not servers:
        return []
    parts = [
        p
        for p in _partitions(metadata)
        if not p.target and p.state is PartitionState.ONLINE and (p.stream, p.id) not in planned
    ]
    count: Counter[str] = Counter({s: 0 for s in servers})
    for p in _partitions(metadata):
        for r in planned.get((p.stream, p.id)) or p.target or p.replicas:
            if r in count:
                count[r] += 1
    new: dict[tuple[str, int], list[str]] = {(p.stream, p.id): list(p.replicas) for p in parts}
    while True:
        most = max(servers, key=lambda s: (count[s], s))
        least = min(servers, key=lambda s: (count[s], s))
        if count[most] - count[least] <= 1:
            break
        movable = next(
            (key for key, replicas in new.items() if most in replicas and least not in replicas),
            None,
        )
        if movable is None:
            break  # every partition on the fullest server is already on the emptiest one too
        replicas = new[movable]
        replicas[replicas.index(most)] = least
        count[most] -= 1
        count[least] += 1
    by_key = {(p.stream, p.id): p for p in parts}
    return [
        ReassignPartition(key[0], key[1], tuple(replicas), by_key[key].epoch)
        for key, replicas in new.items()
        if replicas != by_key[key].replicas
    ]


def plan_decommission(metadata: Metadata, server: str, voters: Collection[str]) -> list[Operation]:
    """Mark ``server`` leaving and move each of its replicas to the least loaded usable server.

    ``voters`` are the metadata Raft group's members. Raises MetadataError, saying why, when the
    removal would leave the group without a live quorum, lose the last in-sync replica of a
    partition, or leave a partition with nowhere to go.
    """
    known = metadata.servers.get(server)
    if known is None:
        raise InvalidStreamError(f"no such server: {server!r}")
    remaining = [v for v in voters if v != server]
    if not remaining:
        raise RefusedError(f"{server} is the last server of the cluster")
    alive = [v for v in remaining if (s := metadata.servers.get(v)) is not None and s.alive]
    quorum = len(remaining) // 2 + 1
    if server in voters and len(alive) < quorum:
        raise RefusedError(
            f"removing {server} would leave {len(alive)} live metadata voters of {len(remaining)}, "
            f"fewer than the {quorum} a quorum needs"
        )
    usable = [s for s in _usable(metadata) if s != server]
    load: Counter[str] = Counter({s: 0 for s in usable})
    for p in _partitions(metadata):
        for r in p.target or p.replicas:
            if r in load:
                load[r] += 1
    ops: list[Operation] = [SetServerLeaving(server, True)]
    for p in _partitions(metadata):
        if server not in p.replicas:
            continue
        if p.target:
            if server in p.target:
                raise RefusedError(
                    f"{p.stream}/{p.id} is moving onto {server}: wait for that reassignment to finish first"
                )
            continue  # already leaving it
        if p.isr == [server] and not known.alive:
            raise RefusedError(
                f"{server} holds the only in-sync replica of {p.stream}/{p.id} and is not alive: "
                "its messages would be lost"
            )
        choices = [s for s in usable if s not in p.replicas]
        if not choices:
            raise RefusedError(
                f"{p.stream}/{p.id} has {len(p.replicas)} replicas and no other live server can take the one on "
                f"{server}; add a server or lower the replication factor first"
            )
        replacement = min(choices, key=lambda s: (load[s], s))
        load[replacement] += 1
        target = tuple(replacement if r == server else r for r in p.replicas)
        ops.append(ReassignPartition(p.stream, p.id, target, p.epoch))
    return ops


def preferred_can_lead(p: PartitionMeta, alive: Collection[str]) -> bool:
    """Whether leadership can go back to ``p``'s preferred replica now: the partition online, not moving
    (a reassignment moves the leader itself, last) and not paused; the preferred replica alive, in sync
    and not leading already."""
    preferred = p.replicas[0]
    return (
        p.state is PartitionState.ONLINE
        and not p.target
        and not p.paused
        and p.leader != preferred
        and preferred in alive
        and preferred in p.isr
    )


def preferred_leader_changes(metadata: Metadata) -> list[ChangeLeader]:
    """Hand leadership to each partition's preferred replica where it can take it now."""
    alive = {s.id for s in metadata.servers.values() if s.alive}
    return [
        ChangeLeader(p.stream, p.id, p.replicas[0], tuple(p.isr), p.epoch)
        for p in _partitions(metadata)
        if preferred_can_lead(p, alive)
    ]


def reassignment_steps(metadata: Metadata) -> list[Operation]:
    """What the reassignments under way need next: move the leader onto the target, or complete."""
    steps: list[Operation] = []
    for p in _partitions(metadata):
        if not p.target or p.state is not PartitionState.ONLINE:
            continue
        if any(r not in p.isr for r in p.target):
            continue  # still catching up
        if p.leader in p.target:
            steps.append(CompleteReassignment(p.stream, p.id, p.epoch))
            continue
        live = [r for r in p.target if (s := metadata.servers.get(r)) is not None and s.alive]
        if live:
            steps.append(ChangeLeader(p.stream, p.id, live[0], tuple(p.isr), p.epoch))
    return steps


def departures(metadata: Metadata) -> list[str]:
    """Servers being decommissioned that hold no replica any more: they may leave the cluster now."""
    holding = {r for p in _partitions(metadata) for r in p.replicas}
    return sorted(s.id for s in metadata.servers.values() if s.leaving and s.id not in holding)
