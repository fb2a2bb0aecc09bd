"""Consumer groups' decisions (sans-IO): who gets which partitions, who coordinates, when to replace him.

Assignments are not stored: every server computes them from the group's
members and the streams' partition counts with :func:`assign`, the same
everywhere for the same metadata. Partitions of each stream (in name order)
go one by one to the member of that stream with the fewest partitions so far
(all streams counted; ties by consumer id), so loads differ by one at most.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .model import GroupMeta, JoinGroup, Metadata, RefusedError

__all__ = ["CoordinatorWitnesses", "assign", "choose_coordinator", "plan_join"]


def assign(group: GroupMeta, metadata: Metadata) -> dict[str, dict[str, list[int]]]:
    """consumer id -> stream -> the partitions it consumes (every member appears, maybe with nothing)."""
    out: dict[str, dict[str, list[int]]] = {c: {} for c in group.members}
    load: Counter[str] = Counter()
    streams = sorted({s for ss in group.members.values() for s in ss})
    for name in streams:
        stream = metadata.streams.get(name)
        if stream is None:
            continue
        subscribers = sorted(c for c, ss in group.members.items() if name in ss)
        for pid in sorted(stream.partitions):
            chosen = min(subscribers, key=lambda c: (load[c], c))
            load[chosen] += 1
            out[chosen].setdefault(name, []).append(pid)
    return out


def choose_coordinator(metadata: Metadata, exclude: str = "") -> str:
    """The live server coordinating the fewest groups (ties by id); RefusedError if there is none."""
    live = sorted(s.id for s in metadata.servers.values() if s.alive and not s.leaving and s.id != exclude)
    if not live:
        raise RefusedError("No group coordinator candidates: no other live server")
    load = Counter(g.coordinator for g in metadata.groups.values())
    return min(live, key=lambda s: (load[s], s))


def plan_join(metadata: Metadata, group: str, consumer: str, streams: tuple[str, ...]) -> JoinGroup:
    """The operation that adds ``consumer`` to ``group`` (creating it, with a coordinator, if it is new)."""
    existing = metadata.groups.get(group)
    coordinator = existing.coordinator if existing is not None else choose_coordinator(metadata)
    return JoinGroup(group, consumer, tuple(dict.fromkeys(streams)), coordinator)


@dataclass
class CoordinatorWitnesses:
    """Members' reports that a group's coordinator is silent, as the controller tallies them.

    A report counts for the group's coordinator and epoch it names, until ``window_ns`` after the
    reporter's last report. When more than half of the members report the current coordinator,
    :meth:`report` answers True: time to choose another.
    """

    window_ns: int
    _seen: dict[tuple[str, str, int], dict[str, int]] = field(default_factory=dict)

    def report(self, group: GroupMeta, consumer: str, coordinator: str, epoch: int, now: int) -> bool:
        if coordinator != group.coordinator or epoch != group.epoch:
            raise RefusedError(
                f"Coordinator generation mismatch, current coordinator: {group.coordinator} epoch: {group.epoch}, "
                f"got coordinator: {coordinator} epoch: {epoch}"
            )
        if consumer not in group.members:
            raise RefusedError(f"Consumer {consumer} is not a member of consumer group {group.id}")
        key = (group.id, coordinator, epoch)
        witnesses = {c: t for c, t in self._seen.get(key, {}).items() if now - t < self.window_ns}
        witnesses[consumer] = now
        self._seen = {k: v for k, v in self._seen.items() if k[0] != group.id}  # older generations are moot
        self._seen[key] = witnesses
        return len(witnesses) > len(group.members) // 2
