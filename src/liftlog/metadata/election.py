"""The controller's partition leader elections, as plain classes (seed 000 and seed 002).

- :class:`LeaderReports` decides when followers' reports that a leader is
  silent are enough: a majority of the partition's in-sync followers within
  a window, each report naming the partition epoch and leader epoch it is
  about (reports about an older state are ignored).
- :func:`rank_candidates` orders the replicas that may take over: in-sync
  followers on live servers, smallest lag behind the old leader first (the
  largest log end offset), preferred replica order breaking ties; with
  unclean election allowed and no in-sync candidate, any live replica.
- :class:`Elections` walks seed 002's states for each partition: a
  candidate is proposed (CANDIDATE_FOUND) and given ``confirm_timeout_ns``
  to confirm its promotion; then the next one; OFFLINE when none is left.

No clocks or I/O: times are arguments, decisions are return values that the
controller turns into metadata operations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from .model import PartitionMeta

__all__ = ["Candidate", "Elections", "LeaderReports", "NoCandidate", "PartitionKey", "rank_candidates"]

PartitionKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Candidate:
    """Ask ``replica`` to take over (metadata state CANDIDATE_FOUND)."""

    replica: str
    unclean: bool = False


@dataclass(frozen=True, slots=True)
class NoCandidate:
    """Nobody can take over now: the partition is OFFLINE until a candidate comes back."""

    reason: str


Decision = Candidate | NoCandidate


def rank_candidates(
    meta: PartitionMeta,
    alive: Iterable[str],
    leos: Mapping[str, int],
    *,
    unclean: bool = False,
    leader_may_return: bool = False,
) -> list[Candidate]:
    """Who may lead ``meta`` next, best first. ``leos`` holds the log end offsets the controller learned.

    The old leader is a candidate only with ``leader_may_return`` (an offline partition whose last
    leader came back: it has everything that was committed).
    """
    live = set(alive)
    order = {r: i for i, r in enumerate(meta.replicas)}

    def best_first(pool: list[str]) -> list[str]:
        return sorted(pool, key=lambda r: (-leos.get(r, -1), order[r]))

    clean = best_first([r for r in meta.isr if (leader_may_return or r != meta.leader) and r in live])
    if clean or not unclean:
        return [Candidate(r) for r in clean]
    return [Candidate(r, unclean=True) for r in best_first([r for r in meta.replicas if r in live])]


@dataclass(slots=True)
class _Reports:
    epoch: int
    leader_epoch: int
    seen: dict[str, int] = field(default_factory=dict)


class LeaderReports:
    """Followers' reports that a partition leader is silent, kept for ``window_ns``."""

    def __init__(self, window_ns: int) -> None:
        self.window_ns = window_ns
        self._reports: dict[PartitionKey, _Reports] = {}

    def report(self, meta: PartitionMeta, reporter: str, epoch: int, leader_epoch: int, now: int) -> bool:
        """Record one report; True when enough in-sync followers agree to elect a new leader."""
        if epoch != meta.epoch or leader_epoch != meta.leader_epoch:
            return False  # about a partition state that has moved on
        if reporter == meta.leader or reporter not in meta.isr:
            return False  # only in-sync followers judge the leader
        key = (meta.stream, meta.id)
        entry = self._reports.get(key)
        if entry is None or (entry.epoch, entry.leader_epoch) != (epoch, leader_epoch):
            entry = self._reports[key] = _Reports(epoch, leader_epoch)
        entry.seen[reporter] = now
        recent = [r for r, at in entry.seen.items() if now - at <= self.window_ns]
        followers = [r for r in meta.isr if r != meta.leader]
        return len(recent) >= len(followers) // 2 + 1

    def forget(self, key: PartitionKey) -> None:
        self._reports.pop(key, None)


@dataclass(slots=True)
class _Election:
    candidates: list[Candidate]
    current: Candidate | None = None
    deadline: int = 0


class Elections:
    """Elections in progress, one per partition."""

    def __init__(self, confirm_timeout_ns: int) -> None:
        self.confirm_timeout_ns = confirm_timeout_ns
        self._running: dict[PartitionKey, _Election] = {}

    def __contains__(self, key: PartitionKey) -> bool:
        return key in self._running

    def begin(self, key: PartitionKey, candidates: list[Candidate], now: int) -> Decision:
        self._running[key] = _Election(list(candidates))
        return self._next(key, now)

    def confirmed(self, key: PartitionKey, replica: str) -> bool:
        """``replica`` says it has taken over; True if it is the current candidate (the election ends)."""
        election = self._running.get(key)
        if election is None or election.current is None or election.current.replica != replica:
            return False
        del self._running[key]
        return True

    def abandon(self, key: PartitionKey) -> None:
        """The partition was deleted, or its state changed under the election."""
        self._running.pop(key, None)

    def tick(self, now: int) -> list[tuple[PartitionKey, Decision]]:
        """Candidates that did not confirm in time give way to the next."""
        return [(key, self._next(key, now)) for key, e in list(self._running.items()) if now >= e.deadline]

    def _next(self, key: PartitionKey, now: int) -> Decision:
        election = self._running[key]
        if not election.candidates:
            del self._running[key]
            tried = f" ({election.current.replica} did not confirm)" if election.current else ""
            return NoCandidate(f"no eligible replica left{tried}")
        election.current = election.candidates.pop(0)
        election.deadline = now + self.confirm_timeout_ns
        return election.current
