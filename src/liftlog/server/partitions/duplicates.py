"""A partition leader's incoming messages screened against its duplicate window (message ids).

What a publish whose records carry ids (``Nats-Msg-Id``) becomes:

- none of its ids is known: written as it came (the common case costs a dict lookup per id);
- every record is a duplicate: nothing is written; the ack gives the originals' offsets and says so;
- some are: only the new records are written, in their order, and the ack lists every record's offset.

A batch whose first record carries a hidden ``\\x00batch`` header (our client's ``publish_many`` chunks) is a
duplicate as a whole, or not at all: one lookup for the batch instead of one per record.

An id repeated within one append (a retry that arrived right behind its original, or twice in one
batch) is a duplicate of its first occurrence, whose offset is known once that is written.

Sans-IO: plain functions over :class:`Incoming` values and a :class:`DuplicateWindow`.
"""

from __future__ import annotations

from typing import NamedTuple

from liftlog.replication.duplicates import DuplicateWindow, batch_key
from liftlog.server.partitions.messages import Incoming
from liftlog.storage import NewRecord
from liftlog.storage.records import decode_new_records

__all__ = ["Screened", "record_offsets", "screen"]

#: Where one record of a received publish ended up: ("new", k): record k of what was written for it;
#: ("dup", offset): a duplicate of the record stored at offset; ("same", i, k): a duplicate of record k
#: of what was written for the i-th screened item of the same append.
Place = tuple[str, int] | tuple[str, int, int]


class Screened(NamedTuple):
    """One received item: what to write for it (None: nothing) and, unless all of it is new, where each of its
    records ended up."""

    received: Incoming
    write: Incoming | None
    places: tuple[Place, ...] | None


def screen(items: list[Incoming], window: DuplicateWindow, now: int) -> list[Screened]:
    """Screen ``items`` in order against ``window`` (at ``now``) and against each other."""
    out: list[Screened] = []
    pending: dict[bytes, tuple[int, int]] = {}  # id -> (screened index, record index in its write)
    for item in items:
        ids = item.msg_ids
        if item.batch_id:  # one id for the whole batch: all of it is a duplicate, or none
            key = batch_key(item.batch_id)
            count = _count(item)
            original = window.original(key, now)
            if original is not None:
                out.append(Screened(item, None, tuple(("dup", original + k) for k in range(count))))
                continue
            if key in pending:
                j, _ = pending[key]
                out.append(Screened(item, None, tuple(("same", j, k) for k in range(count))))
                continue
            pending[key] = (len(out), 0)
        if not ids:
            out.append(Screened(item, item, None))
            continue
        places: list[Place] = []
        keep: list[int] = []
        for k, msg_id in enumerate(ids):
            original = window.original(msg_id, now) if msg_id else None
            if original is not None:
                places.append(("dup", original))
            elif msg_id and msg_id in pending:
                places.append(("same", *pending[msg_id]))
            else:
                places.append(("new", len(keep)))
                if msg_id:
                    pending[msg_id] = (len(out), len(keep))
                keep.append(k)
        if len(keep) == len(ids):
            out.append(Screened(item, item, None))
        elif not keep:
            out.append(Screened(item, None, tuple(places)))
        else:
            out.append(Screened(item, _only(item, keep), tuple(places)))
    return out


def _only(item: Incoming, keep: list[int]) -> Incoming:
    """``item`` with only its records at indexes ``keep`` (and their ids)."""
    if item.encoded is not None:
        records = decode_new_records(item.encoded.data, item.encoded.record_count)
    else:
        records = [item.record, *item.more]
    chosen: list[NewRecord] = [records[k] for k in keep]
    ids = tuple(item.msg_ids[k] for k in keep)
    return item._replace(record=chosen[0], more=tuple(chosen[1:]), encoded=None, msg_ids=ids)


def record_offsets(screened: list[Screened], last_offsets: dict[int, int]) -> list[list[int] | None]:
    """For each screened item with places, every record's offset (-1 where it depends on a write that failed);
    ``last_offsets``: for the index of each screened item whose write was stored, its last record's offset."""
    firsts: dict[int, int] = {}
    for i, s in enumerate(screened):
        if i in last_offsets and s.write is not None:
            firsts[i] = last_offsets[i] - _count(s.write) + 1
    out: list[list[int] | None] = []
    for i, s in enumerate(screened):
        if s.places is None:
            out.append(None)
            continue
        offsets: list[int] = []
        for place in s.places:
            if place[0] == "dup":
                offsets.append(place[1])
            elif place[0] == "new":
                offsets.append(firsts[i] + place[1] if i in firsts else -1)
            else:
                _, j, k = place  # type: ignore[misc]
                offsets.append(firsts[j] + k if j in firsts else -1)
        out.append(offsets)
    return out


def _count(item: Incoming) -> int:
    return item.encoded.record_count if item.encoded is not None else 1 + len(item.more)
