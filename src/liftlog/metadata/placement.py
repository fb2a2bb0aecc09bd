"""Replica placement for new partitions (seed 004, Kafka's assignment, made deterministic).

Algorithm:
- Servers are sorted by id; with racks they are interleaved rack by rack (``a1 b1 c1 a2 b2 ...``) so that
  neighbours in this *ring* sit on different racks.
- Leaders: servers are ranked by (existing preferred leaderships, existing replicas, ring position) and
  partition ``p`` is led by rank ``p mod n``: each server leads ``floor`` or ``ceil(partitions / n)`` of the
  stream, and the extra ones go to the servers that lead least across all streams.
- Followers: the other servers are walked round the ring from the leader. The second replica is the
  ``k``-th (mod their number) of the servers the rack rule allows, where ``k`` counts the leader's
  preferred leaderships across streams (from ``leader_counts``); each further replica is the next allowed
  server after the previous one. This is seed 004's *shift*: successive partitions led by a server put
  their second replica on successive servers, so when it fails the leaderships that move to the second
  replicas spread over all survivors (all other-rack survivors with racks), not onto one neighbour.
- Racks: a server is allowed while its rack holds no more of the partition's replicas than any rack
  that still has a server outside the partition, so no two replicas share a rack while racks remain, and
  otherwise racks are used as evenly as possible. Servers without a rack share the unnamed rack ``""``.

Pure: no I/O, no clock, no randomness; the same inputs give the same placement.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["PlacementError", "ServerInfo", "place_partitions"]

_NO_COUNTS: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """What placement needs to know about a live server."""

    id: str
    rack: str = ""


class PlacementError(ValueError):
    """The requested placement is impossible or its arguments are invalid (INVALID_ARGUMENT)."""


def _ring(servers: Sequence[ServerInfo]) -> list[ServerInfo]:
    """Servers sorted by id, interleaved across racks (racks sorted by name)."""
    by_rack: dict[str, list[ServerInfo]] = {}
    for server in sorted(servers, key=lambda s: s.id):
        by_rack.setdefault(server.rack, []).append(server)
    racks = [by_rack[rack] for rack in sorted(by_rack)]
    longest = max(len(members) for members in racks)
    return [members[i] for i in range(longest) for members in racks if i < len(members)]


def _allowed(server: ServerInfo, replicas: list[str], used_in_rack: Counter[str], rack_size: Counter[str]) -> bool:
    """Whether ``server`` may take the partition's next replica (the rack rule)."""
    if server.id in replicas:
        return False
    # The least-used count among the racks that still have a server outside this partition.
    least = min(used_in_rack[rack] for rack, size in rack_size.items() if used_in_rack[rack] < size)
    return used_in_rack[server.rack] == least


def place_partitions(
    servers: Sequence[ServerInfo],
    partitions: int,
    replication_factor: int,
    *,
    leader_counts: Mapping[str, int] = _NO_COUNTS,
    replica_counts: Mapping[str, int] = _NO_COUNTS,
) -> list[list[str]]:
    """Place the replicas of a new stream's partitions.

    ``servers`` are the live servers, in any order. ``replication_factor`` -1 means every server.
    ``leader_counts`` / ``replica_counts`` are per-server preferred-leader and replica counts over the
    existing streams. Returns, per partition, its replicas' server ids with the preferred leader first.
    Raises :class:`PlacementError` for invalid arguments or a replication factor above the live servers.
    """
    if partitions < 1:
        raise PlacementError(f"invalid number of partitions {partitions}: must be at least 1")
    if replication_factor == 0 or replication_factor < -1:
        raise PlacementError(f"invalid replication factor {replication_factor}: must be at least 1, or -1")
    if not servers:
        raise PlacementError("no live servers to place partitions on")
    duplicates = sorted(id_ for id_, seen in Counter(s.id for s in servers).items() if seen > 1)
    if duplicates:
        raise PlacementError(f"duplicate server ids: {', '.join(duplicates)}")
    n = len(servers)
    rf = n if replication_factor == -1 else replication_factor
    if rf > n:
        raise PlacementError(f"replication factor {rf} is larger than the number of live servers ({n})")

    ring = _ring(servers)
    position = {server.id: i for i, server in enumerate(ring)}
    rack_size = Counter(server.rack for server in ring)
    leaders = sorted(ring, key=lambda s: (leader_counts.get(s.id, 0), replica_counts.get(s.id, 0), position[s.id]))
    ordinal = {server.id: leader_counts.get(server.id, 0) for server in ring}

    placement: list[list[str]] = []
    for p in range(partitions):
        leader = leaders[p % n]
        first = position[leader.id]
        others = ring[first + 1 :] + ring[:first]  # the ring walked from the leader
        replicas = [leader.id]
        used_in_rack = Counter([leader.rack])

        # The shift: the second replica rotates with the leader's leadership ordinal.
        index = -1
        for _ in range(rf - 1):
            if index < 0:
                eligible = [i for i, server in enumerate(others) if _allowed(server, replicas, used_in_rack, rack_size)]
                index = eligible[ordinal[leader.id] % len(eligible)]
            else:
                index = next(
                    i % (n - 1)
                    for i in range(index + 1, index + n)
                    if _allowed(others[i % (n - 1)], replicas, used_in_rack, rack_size)
                )
            replicas.append(others[index].id)
            used_in_rack[others[index].rack] += 1
        ordinal[leader.id] += 1
        placement.append(replicas)
    return placement
