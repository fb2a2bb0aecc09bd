"""What a Raft driver needs of its storage: the one contract MemoryStorage and DiskStorage both keep.

A restarting node is built from :meth:`RaftStorage.state`; each ``Ready`` is
persisted with :meth:`RaftStorage.save` before its messages are sent; a
snapshot the node took is kept with :meth:`RaftStorage.compact`. ``base`` and
``term`` answer what the log holds (the simulation's checker asks them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from .types import Entry, PersistedState, Ready, Snapshot

__all__ = ["RaftStorage"]


class RaftStorage(Protocol):
    @property
    def base(self) -> int:
        """Index of the last entry the snapshot covers (0 without one)."""
        ...

    def term(self, index: int) -> int | None:
        """Term of the entry at ``index``; None when it is neither stored nor the snapshot's last."""
        ...

    def state(self) -> PersistedState:
        """What a restarting node is given."""
        ...

    def save(self, ready: Ready) -> None:
        """Persist what ``ready`` asks for (snapshot, entries, hard state), before its messages are sent."""
        ...

    def install_snapshot(self, snapshot: Snapshot) -> None:
        """A snapshot received from the leader replaces the whole log."""
        ...

    def append(self, entries: Sequence[Entry]) -> None:
        """Store ``entries``, dropping stored ones from the first one's index on."""
        ...

    def compact(self, snapshot: Snapshot) -> None:
        """Keep a snapshot the node took and drop the entries it covers."""
        ...
