"""The leader's view of one follower (etcd's ``tracker.Progress``).

Rules:
- PROBE: send one append at a time (``paused`` after each) until the follower accepts,
  walking ``next`` back with the follower's reject hint.
- REPLICATE: stream appends optimistically, at most ``max_inflight`` unacknowledged.
- SNAPSHOT: a snapshot is on its way; send nothing until the follower answers (or, as the
  driver may lose it, until an election timeout passes: then PROBE again).
- ``match`` only grows; ``next`` is always > ``match``.
- Not shared between tasks; owned by one ``RaftNode``.
"""

from __future__ import annotations

import enum
from collections import deque

__all__ = ["Progress", "ProgressState"]


class ProgressState(enum.Enum):
    PROBE = "probe"
    REPLICATE = "replicate"
    SNAPSHOT = "snapshot"


class Progress:
    def __init__(self, next_index: int, match: int = 0) -> None:
        self.match = match
        self.next = max(next_index, match + 1)
        self.state = ProgressState.PROBE
        self.paused = False
        self.pending_snapshot = 0
        self.snapshot_ticks = 0  # ticks since the snapshot was sent
        self.recent_active = False
        self.inflight: deque[int] = deque()

    def __repr__(self) -> str:
        return f"Progress(match={self.match}, next={self.next}, {self.state.value}, paused={self.paused})"

    def become_probe(self) -> None:
        if self.state is ProgressState.SNAPSHOT:
            self.next = max(self.match + 1, self.pending_snapshot + 1)
        else:
            self.next = self.match + 1
        self.state = ProgressState.PROBE
        self.paused = False
        self.pending_snapshot = 0
        self.inflight.clear()

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.paused = False
        self.pending_snapshot = 0
        self.inflight.clear()

    def become_snapshot(self, index: int) -> None:
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot = index
        self.snapshot_ticks = 0
        self.paused = False
        self.inflight.clear()

    def maybe_update(self, index: int) -> bool:
        """The follower acknowledged ``index``; False if that is old news."""
        self.paused = False
        while self.inflight and self.inflight[0] <= index:
            self.inflight.popleft()
        if index <= self.match:
            return False
        self.match = index
        self.next = max(self.next, index + 1)
        return True

    def maybe_decrease(self, rejected: int, hint: int) -> bool:
        """The follower rejected an append after ``rejected``; False if the rejection is stale."""
        if self.state is ProgressState.REPLICATE:
            if rejected <= self.match:
                return False
            self.become_probe()
            self.next = max(self.match + 1, min(self.next, hint + 1))
            return True
        if self.next - 1 != rejected:
            return False
        self.next = max(self.match + 1, min(rejected, hint + 1))
        self.paused = False
        return True

    def is_paused(self, max_inflight: int) -> bool:
        if self.state is ProgressState.PROBE:
            return self.paused
        if self.state is ProgressState.REPLICATE:
            return len(self.inflight) >= max_inflight
        return True

    def sent_entries(self, last: int) -> None:
        if self.state is ProgressState.REPLICATE:
            self.next = last + 1
            self.inflight.append(last)
        elif self.state is ProgressState.PROBE:
            self.paused = True
