"""The message ids a partition's leader stored lately: what makes a publish with an id idempotent.

A message may carry an id (the ``Nats-Msg-Id`` header, as JetStream reads
it). Within the stream's duplicate window, a second message with an id the
partition already stored is not stored again: it is acknowledged with the
first one's offset and marked as a duplicate.

Rules:

1. The window is a time span (``streams.duplicate.window``): an id is known
   from the moment its record is written until ``window`` after the record's
   timestamp. Time is passed in (ns, the record timestamps' clock).
2. Ids are kept in offset order, so expiring the oldest and forgetting a
   truncated tail are both cheap.
3. Memory is capped: past ``max_ids`` the oldest ids are forgotten early
   (``evicted`` counts them), which shortens the window rather than growing
   without bound.
4. The state is never the only copy: the ids are stored with their records,
   and a new leader rebuilds the window from its log (:meth:`add` in offset
   order, from the log's records whose timestamps are still in the window).

Sans-IO and event-loop only: plain dict operations, no clock of its own.
"""

from __future__ import annotations

from typing import Final

from liftlog.api.stored import BATCH_ID_HEADER, HIDDEN_MSG_ID_HEADER, MSG_ID_HEADER, PUBLISHER_RESERVED

__all__ = [
    "BATCH_ID_HEADER",
    "BATCH_ID_HEADER_BYTES",
    "HIDDEN_MSG_ID_HEADER",
    "MSG_ID_HEADER",
    "MSG_ID_HEADER_BYTES",
    "PUBLISHER_RESERVED",
    "DuplicateWindow",
    "batch_key",
]

MSG_ID_HEADER_BYTES: Final = MSG_ID_HEADER.encode()
BATCH_ID_HEADER_BYTES: Final = BATCH_ID_HEADER.encode()


def batch_key(batch_id: bytes) -> bytes:
    """A batch id's key in the window, apart from message ids."""
    return b"\x00batch:" + batch_id


class DuplicateWindow:
    """Ids stored within the last ``window_ns``, each with the offset and timestamp of its record."""

    __slots__ = ("_ids", "evicted", "max_ids", "window_ns")

    def __init__(self, window_ns: int, max_ids: int) -> None:
        if window_ns < 0 or max_ids < 0:
            raise ValueError(f"window and cap must not be negative: {window_ns} ns, {max_ids} ids")
        self.window_ns = window_ns
        self.max_ids = max_ids
        #: id -> (offset, timestamp), in offset order (dicts keep insertion order).
        self._ids: dict[bytes, tuple[int, int]] = {}
        #: Ids forgotten before their time because of ``max_ids``.
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def enabled(self) -> bool:
        return self.window_ns > 0 and self.max_ids > 0

    def original(self, msg_id: bytes, now: int) -> int | None:
        """The offset of the record stored with ``msg_id``, if it is still within the window at ``now``."""
        found = self._ids.get(msg_id)
        if found is None or found[1] < now - self.window_ns:
            return None
        return found[0]

    def add(self, msg_id: bytes, offset: int, timestamp: int) -> None:
        """Remember ``msg_id`` as stored at ``offset`` (offsets must not go down; a repeat keeps the first)."""
        if not self.enabled:
            return
        ids = self._ids
        known = ids.get(msg_id)
        if known is not None:
            if known[1] >= timestamp - self.window_ns:
                return  # still the original
            del ids[msg_id]  # expired, not yet swept: the new record is the original from now on
        ids[msg_id] = (offset, timestamp)
        if len(ids) > self.max_ids:
            del ids[next(iter(ids))]
            self.evicted += 1

    def expire(self, now: int) -> None:
        """Forget ids whose records are older than the window at ``now``."""
        ids = self._ids
        oldest = now - self.window_ns
        while ids:
            first = next(iter(ids))
            if ids[first][1] >= oldest:
                return
            del ids[first]

    def truncate(self, end_offset: int) -> None:
        """Forget ids stored at ``end_offset`` or later (the log was cut back there)."""
        ids = self._ids
        while ids:
            last = next(reversed(ids))
            if ids[last][0] < end_offset:
                return
            del ids[last]

    def clear(self) -> None:
        self._ids.clear()
