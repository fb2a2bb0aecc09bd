"""A follower replica's replication state: truncate by leader epoch, then fetch, apply and sleep.

Lifecycle (seed 000, seed 003, KIP-101/KIP-279):

1. ``start()``: a replica that becomes a follower (at start-up or after a
   leader change) first asks the leader where its own latest leader epoch
   ends (``RequestEpochOffset``). The leader answers with the largest epoch
   it knows that is <= the one asked about and where that epoch ends in its
   log; the follower truncates to the smaller of that and where the same
   epoch ends locally (``Truncate``), which removes exactly the suffix the
   leader does not have: uncommitted messages of an old leader, or a lineage
   that diverged after a double crash. Truncating to the HW instead can lose
   committed messages (seed 003; the replication tests show it with a
   follower that does).
2. ``Fetch(offset)`` at its LEO. A response is used only if it comes from
   the expected leader epoch and starts at the expected offset; anything else
   is dropped (a late answer, or a leader that moved on).
3. After appending, HW = min(LEO - 1, leader's HW). An empty answer means
   caught up: ``Sleep`` for the idle wait, unless a notification arrives.
4. No successful answer for ``leader_timeout_ns``: ``ReportLeader`` to the
   controller (once per timeout window).

Sans-IO: the shell performs the actions and reports their results back.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "Append",
    "Fetch",
    "FollowerAction",
    "FollowerReplica",
    "FollowerState",
    "ReportLeader",
    "RequestEpochOffset",
    "SetHighWatermark",
    "Sleep",
    "Truncate",
]


@dataclass(frozen=True, slots=True)
class RequestEpochOffset:
    epoch: int


@dataclass(frozen=True, slots=True)
class Truncate:
    """Remove every message at or after ``offset``."""

    offset: int


@dataclass(frozen=True, slots=True)
class Fetch:
    offset: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class Append:
    """Append the response's batches as they are (``append_raw``), then call ``appended``."""

    first_offset: int


@dataclass(frozen=True, slots=True)
class SetHighWatermark:
    hw: int


@dataclass(frozen=True, slots=True)
class Sleep:
    """Caught up: fetch again after ``seconds`` or at the next notification."""

    seconds: float


@dataclass(frozen=True, slots=True)
class ReportLeader:
    """Tell the controller the leader has not answered (with the epochs it is judged by)."""

    leader: str
    leader_epoch: int
    silent_ns: int


FollowerAction = RequestEpochOffset | Truncate | Fetch | Append | SetHighWatermark | Sleep | ReportLeader


class FollowerState(enum.Enum):
    TRUNCATING = "truncating"
    FETCHING = "fetching"
    IDLE = "idle"


@dataclass
class FollowerReplica:
    replica_id: str
    leader: str
    leader_epoch: int
    leo: int
    hw: int
    #: This replica's newest leader epoch in its log's epoch cache (None for an empty cache).
    latest_epoch: int | None
    now: int
    idle_wait_s: float = 10.0
    leader_timeout_ns: int = 15_000_000_000
    state: FollowerState = field(init=False, default=FollowerState.TRUNCATING)
    _last_heard: int = field(init=False, default=0)
    _reported_at: int | None = field(init=False, default=None)
    _leader_hw: int = field(init=False, default=-1)

    def __post_init__(self) -> None:
        self._last_heard = self.now

    # -- events ----------------------------------------------------------

    def start(self) -> list[FollowerAction]:
        if self.latest_epoch is None or self.leo == 0:
            return self._fetch()
        self.state = FollowerState.TRUNCATING
        return [RequestEpochOffset(self.latest_epoch)]

    def epoch_offset(self, epoch: int, end_offset: int, local_end_offset: int) -> list[FollowerAction]:
        """The leader's answer: ``epoch`` (largest it knows <= ours, -1 if none) ends at ``end_offset``.

        ``local_end_offset`` is where that same ``epoch`` ends in this replica's log (the shell
        asks its epoch cache), or 0 when the leader knows no such epoch.
        """
        if self.state is not FollowerState.TRUNCATING:
            return []  # a late answer to an earlier request
        self._last_heard = self.now
        if epoch < 0:
            return self._truncate(0)
        return self._truncate(min(end_offset, local_end_offset, self.leo))

    def fetched(self, leader_epoch: int, hw: int, first_offset: int, empty: bool, now: int) -> list[FollowerAction]:
        """A fetch response arrived (``first_offset`` is the offset of its first batch)."""
        self.now = now
        if self.state is not FollowerState.FETCHING:
            return []
        if leader_epoch != self.leader_epoch:
            return []  # a leader of another epoch: wait for the metadata to say who leads
        self._last_heard = now
        self._reported_at = None
        if empty:
            actions: list[FollowerAction] = self._set_hw(hw)
            self.state = FollowerState.IDLE
            actions.append(Sleep(self.idle_wait_s))
            return actions
        if first_offset != self.leo:
            return self._fetch()  # stale or overlapping: ask again from where we are
        self._leader_hw = hw
        return [Append(first_offset)]

    def appended(self, leo: int, now: int) -> list[FollowerAction]:
        """The shell appended the batches; ``leo`` is the new log end offset."""
        self.now = now
        self.leo = leo
        actions = self._set_hw(self._leader_hw)
        actions.extend(self._fetch())
        return actions

    def wake(self) -> list[FollowerAction]:
        """The idle wait ended, or the leader notified us of new data."""
        if self.state is not FollowerState.IDLE:
            return []
        return self._fetch()

    def throttled(self, now: int) -> list[FollowerAction]:
        """The leader answered but holds this (new, catching-up) replica back for a while: fetch again
        later. The leader is not silent, so this never leads to a report."""
        self.now = now
        if self.state is not FollowerState.FETCHING:
            return []
        self._last_heard = now
        self._reported_at = None
        return self._fetch()

    def failed(self, now: int) -> list[FollowerAction]:
        """A request timed out or the leader refused it: retry, and report a silent leader."""
        self.now = now
        silent = now - self._last_heard
        actions: list[FollowerAction] = []
        if silent >= self.leader_timeout_ns and (
            self._reported_at is None or now - self._reported_at >= self.leader_timeout_ns
        ):
            self._reported_at = now
            actions.append(ReportLeader(self.leader, self.leader_epoch, silent))
        if self.state is FollowerState.TRUNCATING:
            actions.extend(self.start())
        else:
            actions.extend(self._fetch())
        return actions

    # -- helpers ---------------------------------------------------------

    def _truncate(self, offset: int) -> list[FollowerAction]:
        actions: list[FollowerAction] = []
        if offset < self.leo:
            self.leo = offset
            actions.append(Truncate(offset))
            if self.hw >= offset:
                self.hw = offset - 1
        return actions + self._fetch()

    def _fetch(self) -> list[FollowerAction]:
        self.state = FollowerState.FETCHING
        return [Fetch(self.leo, self.leader_epoch)]

    def _set_hw(self, leader_hw: int) -> list[FollowerAction]:
        hw = min(self.leo - 1, leader_hw)
        if hw > self.hw:
            self.hw = hw
            return [SetHighWatermark(hw)]
        return []
