"""The raft log as the core sees it: a snapshot offset plus the entries after it.

Rules:
- ``entries[k]`` has index ``snapshot_index + 1 + k``; entries at or below the snapshot
  are gone (``term()`` answers None for them, except the snapshot's own index).
- Entries from ``unstable_from`` on have not been persisted yet; ``Ready.entries`` hands
  them to the driver and ``stable_to`` records that it wrote them.
- ``applied <= committed <= last_index()``; committed entries are never overwritten.
- ``pending_snapshot`` is a snapshot received from a leader that the driver still has to persist.
- Not shared between tasks; owned by one ``RaftNode``.
"""

from __future__ import annotations

from collections.abc import Sequence

from .types import Entry, Snapshot

__all__ = ["RaftLog"]


class RaftLog:
    def __init__(self, snapshot: Snapshot | None, entries: Sequence[Entry], commit: int) -> None:
        self.snapshot_index = snapshot.index if snapshot is not None else 0
        self.snapshot_term = snapshot.term if snapshot is not None else 0
        self._entries = list(entries)
        for k, e in enumerate(self._entries):
            if e.index != self.snapshot_index + 1 + k:
                raise ValueError(f"entry {e.index} out of place after snapshot {self.snapshot_index}")
        self.committed = max(min(commit, self.last_index()), self.snapshot_index)
        self.applied = self.snapshot_index
        self.unstable_from = self.last_index() + 1
        self.pending_snapshot: Snapshot | None = None

    # --- queries -----------------------------------------------------------------

    def first_index(self) -> int:
        return self.snapshot_index + 1

    def last_index(self) -> int:
        return self.snapshot_index + len(self._entries)

    def last_term(self) -> int:
        t = self.term(self.last_index())
        assert t is not None
        return t

    def term(self, index: int) -> int | None:
        """Term of the entry at ``index``; None when compacted away or beyond the end."""
        if index == self.snapshot_index:
            return self.snapshot_term
        if index < self.snapshot_index or index > self.last_index():
            return None
        return self._entries[index - self.snapshot_index - 1].term

    def entry(self, index: int) -> Entry:
        return self._entries[index - self.snapshot_index - 1]

    def slice(self, lo: int, hi: int) -> list[Entry]:
        """Entries with ``lo <= index < hi``; ``lo`` must be above the snapshot."""
        assert lo > self.snapshot_index, (lo, self.snapshot_index)
        off = self.snapshot_index + 1
        return self._entries[lo - off : hi - off]

    def matches(self, index: int, term: int) -> bool:
        return self.term(index) == term

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft §5.4.1: is a candidate's log at least as up to date as ours?"""
        mine = self.last_term()
        return last_term > mine or (last_term == mine and last_index >= self.last_index())

    def find_conflict_by_term(self, index: int, term: int) -> int:
        """Largest index <= ``index`` whose term is <= ``term`` (used for reject hints)."""
        index = min(index, self.last_index())
        while index > self.snapshot_index:
            t = self.term(index)
            if t is not None and t <= term:
                return index
            index -= 1
        return index

    def unstable_entries(self) -> list[Entry]:
        return self.slice(self.unstable_from, self.last_index() + 1) if self.unstable_from <= self.last_index() else []

    def next_committed(self) -> list[Entry]:
        """Committed entries not yet handed to the application."""
        if self.committed <= self.applied:
            return []
        return self.slice(self.applied + 1, self.committed + 1)

    # --- mutations ---------------------------------------------------------------

    def append(self, entries: Sequence[Entry]) -> None:
        """Append ``entries``, first truncating any suffix they replace."""
        if not entries:
            return
        first = entries[0].index
        if first <= self.committed:
            raise AssertionError(f"overwriting committed entry {first} (committed {self.committed})")
        if first > self.last_index() + 1:
            raise AssertionError(f"gap: appending {first} after {self.last_index()}")
        del self._entries[first - self.snapshot_index - 1 :]
        self._entries.extend(entries)
        self.unstable_from = min(self.unstable_from, first)

    def maybe_append(self, index: int, log_term: int, entries: Sequence[Entry]) -> int | None:
        """Follower side of APPEND: None on mismatch at ``index``, else the last new index."""
        if not self.matches(index, log_term):
            return None
        last_new = index + len(entries)
        for k, e in enumerate(entries):
            if self.term(e.index) != e.term:
                self.append(entries[k:])
                break
        return last_new

    def commit_to(self, index: int) -> bool:
        index = min(index, self.last_index())
        if index > self.committed:
            self.committed = index
            return True
        return False

    def stable_to(self, index: int, term: int) -> None:
        if self.term(index) == term and index >= self.unstable_from:
            self.unstable_from = index + 1

    def applied_to(self, index: int) -> None:
        if index > self.applied:
            assert index <= self.committed, (index, self.committed)
            self.applied = index

    def restore(self, snapshot: Snapshot) -> None:
        """Replace the whole log by ``snapshot`` (the driver must persist it)."""
        self.snapshot_index = snapshot.index
        self.snapshot_term = snapshot.term
        self._entries = []
        self.committed = self.applied = snapshot.index
        self.unstable_from = snapshot.index + 1
        self.pending_snapshot = snapshot

    def compact(self, index: int) -> None:
        """Drop entries up to and including ``index`` (covered by a snapshot the driver keeps)."""
        term = self.term(index)
        assert term is not None and index <= self.applied, (index, self.applied)
        del self._entries[: index - self.snapshot_index]
        self.snapshot_index = index
        self.snapshot_term = term
