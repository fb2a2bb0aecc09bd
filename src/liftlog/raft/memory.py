"""What a driver persists, kept in memory: the model every Raft storage follows.

Tests and the simulation use it as a node's "disk" (a crash keeps exactly what
was saved here); the server's durable storage applies a Ready the same way,
with fsyncs. Saving a Ready is, in order: install its snapshot (dropping the
entries it covers), append its entries (overwriting any from the first new
index on), then record its hard state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .types import Entry, HardState, PersistedState, Ready, Snapshot

__all__ = ["MemoryStorage"]


@dataclass
class MemoryStorage:
    hard_state: HardState = field(default_factory=HardState)
    snapshot: Snapshot | None = None
    #: Entries after the snapshot, in index order.
    entries: list[Entry] = field(default_factory=list)

    @property
    def base(self) -> int:
        """Index of the last entry the snapshot covers (0 without one)."""
        return self.snapshot.index if self.snapshot else 0

    def term(self, index: int) -> int | None:
        """Term of the entry at ``index``; None when it is neither stored nor the snapshot's last."""
        base = self.base
        if index == base:
            return self.snapshot.term if self.snapshot else 0
        if index < base or index > base + len(self.entries):
            return None
        return self.entries[index - base - 1].term

    def state(self) -> PersistedState:
        """What a restarting node is given."""
        return PersistedState(self.hard_state, self.snapshot, tuple(self.entries))

    def save(self, ready: Ready) -> None:
        """Persist what ``ready`` asks for (before its messages are sent)."""
        if ready.snapshot is not None:
            self.install_snapshot(ready.snapshot)
        if ready.entries:
            self.append(ready.entries)
        if ready.hard_state is not None:
            self.hard_state = ready.hard_state

    def install_snapshot(self, snapshot: Snapshot) -> None:
        """A snapshot received from the leader replaces the whole log."""
        self.snapshot = snapshot
        self.entries = []

    def append(self, entries: Sequence[Entry]) -> None:
        del self.entries[entries[0].index - self.base - 1 :]
        self.entries.extend(entries)

    def compact(self, snapshot: Snapshot) -> None:
        """Keep a snapshot the node took (``RaftNode.compact``) and drop the entries it covers."""
        self.entries = self.entries[snapshot.index - self.base :]
        self.snapshot = snapshot
