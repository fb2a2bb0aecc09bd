"""Offsets of liftlog streams for the Spark data source: pure planning code, no PySpark.

A :class:`PartitionOffsets` maps stream -> partition -> the *next* offset to read, and
serialises to the compact JSON Spark checkpoints (``{"orders":{"0":6,"1":4}}``), like the
offsets of Spark's Kafka source. In offsets given by a user, :data:`EARLIEST` (-2) and
:data:`LATEST` (-1) stand for offsets to be looked up later; resolved offsets have none.

:func:`split_ranges` cuts the messages between two resolved offsets into read tasks, and
:func:`admit` caps how much one micro-batch reads (admission control).
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["EARLIEST", "LATEST", "OffsetRange", "PartitionOffsets", "admit", "split_ranges"]

EARLIEST = -2
"""Sentinel offset: the earliest offset still in the partition (as in Spark's Kafka source)."""
LATEST = -1
"""Sentinel offset: the partition's end, where the next message will be written."""


def _check_offset(stream: str, partition: int, offset: object) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise ValueError(f"offset of stream {stream!r} partition {partition} is not an integer: {offset!r}")
    if offset < EARLIEST:
        raise ValueError(
            f"offset of stream {stream!r} partition {partition} is negative: {offset} "
            f"(only {EARLIEST} for earliest and {LATEST} for latest are allowed)"
        )
    return offset


class PartitionOffsets:
    """Immutable stream -> {partition -> next offset to read}, comparable and hashable.

    Iterating yields ``(stream, partition, offset)`` sorted by stream then partition.
    """

    __slots__ = ("_offsets",)

    _offsets: dict[str, dict[int, int]]

    def __init__(self, offsets: Mapping[str, Mapping[int, int]] | None = None) -> None:
        copied: dict[str, dict[int, int]] = {}
        for stream, partitions in (offsets or {}).items():
            if not isinstance(stream, str) or not stream:
                raise ValueError(f"stream name must be a non-empty string, not {stream!r}")
            if not isinstance(partitions, Mapping):
                raise ValueError(f"partitions of stream {stream!r} must be a mapping, not {partitions!r}")
            inner: dict[int, int] = {}
            for partition, offset in sorted(partitions.items()):
                if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
                    raise ValueError(f"partition of stream {stream!r} must be an integer >= 0, not {partition!r}")
                inner[partition] = _check_offset(stream, partition, offset)
            copied[stream] = inner
        self._offsets = dict(sorted(copied.items()))

    # -- JSON -----------------------------------------------------------------

    def to_json(self) -> str:
        """Compact JSON, streams and partitions sorted: ``{"orders":{"0":6,"1":4}}``."""
        doc = {stream: {str(p): o for p, o in parts.items()} for stream, parts in self._offsets.items()}
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> PartitionOffsets:
        """Parse :meth:`to_json`'s format; raises ValueError naming the problem."""
        try:
            doc = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
        except json.JSONDecodeError as e:
            raise ValueError(f"offsets are not valid JSON: {e}: {text!r}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"offsets JSON must be an object of streams, not {type(doc).__name__}: {text!r}")
        offsets: dict[str, dict[int, int]] = {}
        for stream, partitions in doc.items():
            if not isinstance(partitions, dict):
                raise ValueError(
                    f"offsets of stream {stream!r} must be an object of partitions, "
                    f"not {type(partitions).__name__}: {text!r}"
                )
            inner: dict[int, int] = {}
            for key, offset in partitions.items():
                if not (key.isascii() and key.isdigit()) or (len(key) > 1 and key[0] == "0"):
                    raise ValueError(f"partition key {key!r} of stream {stream!r} is not an integer >= 0: {text!r}")
                inner[int(key)] = offset
            offsets[stream] = inner
        return cls(offsets)

    # -- access ---------------------------------------------------------------

    def get(self, stream: str, partition: int) -> int | None:
        """The offset of a stream partition, or None if it has none."""
        return self._offsets.get(stream, {}).get(partition)

    def streams(self) -> list[str]:
        """The streams, sorted."""
        return list(self._offsets)

    def partitions(self, stream: str) -> dict[int, int]:
        """A copy of one stream's {partition: offset} (empty if the stream is absent)."""
        return dict(self._offsets.get(stream, {}))

    def to_dict(self) -> dict[str, dict[int, int]]:
        """A copy as nested dicts."""
        return {stream: dict(parts) for stream, parts in self._offsets.items()}

    @property
    def is_resolved(self) -> bool:
        """True if no offset is the EARLIEST or LATEST sentinel."""
        return all(offset >= 0 for _, _, offset in self)

    def __iter__(self) -> Iterator[tuple[str, int, int]]:
        for stream, parts in self._offsets.items():
            for partition, offset in parts.items():
                yield stream, partition, offset

    def __len__(self) -> int:
        """The number of stream partitions."""
        return sum(len(parts) for parts in self._offsets.values())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PartitionOffsets):
            return NotImplemented
        return self._offsets == other._offsets

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"PartitionOffsets({self.to_json()})"


def _reject_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result: dict[str, object] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"offsets JSON has the key {key!r} twice")
        result[key] = value
    return result


def _require_resolved(name: str, offsets: PartitionOffsets) -> None:
    for stream, partition, offset in offsets:
        if offset < 0:
            raise ValueError(
                f"{name} offsets must be resolved, but stream {stream!r} partition {partition} "
                f"has the sentinel {offset} ({'earliest' if offset == EARLIEST else 'latest'})"
            )


# -- read planning ---------------------------------------------------------------


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Messages ``start`` (inclusive) to ``end`` (exclusive) of one stream partition."""

    stream: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def split_ranges(start: PartitionOffsets, end: PartitionOffsets, *, min_partitions: int) -> list[OffsetRange]:
    """Read tasks for the messages from ``start`` to ``end``, sorted by stream, partition, start.

    One range per stream partition of ``end`` with messages (a partition absent from
    ``start`` starts at 0; one absent from ``end`` is skipped). While there are fewer than
    ``min_partitions`` ranges (and fewer than messages), the range with the most messages per
    piece is cut into one more piece; each partition's pieces are consecutive, of sizes that
    differ by at most 1, and cover exactly its messages. Raises ValueError for unresolved
    offsets, an end before its start, or ``min_partitions`` < 1.
    """
    if min_partitions < 1:
        raise ValueError(f"min_partitions must be >= 1, not {min_partitions}")
    _require_resolved("start", start)
    _require_resolved("end", end)
    whole: list[OffsetRange] = []
    for stream, partition, stop in end:
        begin = start.get(stream, partition) or 0
        if stop < begin:
            raise ValueError(
                f"end offset {stop} of stream {stream!r} partition {partition} is before its start {begin}"
            )
        if stop > begin:
            whole.append(OffsetRange(stream, partition, begin, stop))
    total = sum(r.size for r in whole)
    pieces = [1] * len(whole)
    # Max-heap of (-piece size, index): give one more piece to the range whose pieces are largest.
    # Stops before any piece would be empty: a range only gets picked while its pieces exceed 1 message.
    heap: list[tuple[Fraction, int]] = [(Fraction(-r.size), i) for i, r in enumerate(whole)]
    heapq.heapify(heap)
    for _ in range(min(min_partitions, total) - len(whole)):
        _, i = heapq.heappop(heap)
        pieces[i] += 1
        heapq.heappush(heap, (Fraction(-whole[i].size, pieces[i]), i))
    ranges: list[OffsetRange] = []
    for r, n in zip(whole, pieces, strict=True):
        small, extra = divmod(r.size, n)
        offset = r.start
        for k in range(n):
            size = small + (1 if k < extra else 0)
            ranges.append(OffsetRange(r.stream, r.partition, offset, offset + size))
            offset += size
    return ranges


def admit(start: PartitionOffsets, latest: PartitionOffsets, max_rows: int | None) -> PartitionOffsets:
    """End offsets of the next micro-batch: read from ``start`` towards ``latest``, at most ``max_rows`` in all.

    Every partition of ``latest`` is in the result (new ones start at 0), and so is every
    partition only in ``start`` (unchanged). With ``max_rows`` None, or a backlog
    (``latest - start``) no larger than it, the result reads everything up to ``latest``.
    Otherwise exactly ``max_rows`` messages are shared in proportion to the backlogs by
    largest-remainder rounding, then each partition with backlog is raised to at least 1
    (taken from the largest shares) while the budget allows; if ``max_rows`` is smaller than
    the number of partitions with backlog, those with the largest backlogs get 1 each. No
    partition goes beyond its latest offset, nor backwards (a latest below start counts as no
    backlog). Raises ValueError for unresolved offsets or ``max_rows`` < 1.
    """
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be >= 1 or None, not {max_rows}")
    _require_resolved("start", start)
    _require_resolved("latest", latest)
    result = start.to_dict()
    backlog: dict[tuple[str, int], int] = {}
    for stream, partition, stop in latest:
        begin = start.get(stream, partition) or 0
        result.setdefault(stream, {})[partition] = begin
        if stop > begin:
            backlog[stream, partition] = stop - begin
    total = sum(backlog.values())
    share = backlog if max_rows is None or total <= max_rows else _apportion(backlog, total, max_rows)
    for (stream, partition), n in share.items():
        result[stream][partition] += n
    return PartitionOffsets(result)


def _apportion(backlog: dict[tuple[str, int], int], total: int, budget: int) -> dict[tuple[str, int], int]:
    """Split ``budget`` < ``total`` = sum(backlog) in proportion to the positive backlogs."""
    keys = sorted(backlog)
    by_backlog = sorted(keys, key=lambda k: (-backlog[k], k))
    if budget <= len(keys):
        return {k: (1 if i < budget else 0) for i, k in enumerate(by_backlog)}
    share = {k: budget * backlog[k] // total for k in keys}
    # Largest remainder: the partitions with the largest fractional parts get the leftover.
    leftover = budget - sum(share.values())
    for k in sorted(keys, key=lambda k: (-(budget * backlog[k] % total), -backlog[k], k))[:leftover]:
        share[k] += 1
    # budget < total, so share[k] <= backlog[k]. Raise empty shares to 1 from the largest shares.
    for k in by_backlog:
        if share[k] == 0:
            donor = max(keys, key=lambda d: (share[d], backlog[d]))
            share[donor] -= 1
            share[k] = 1
    return share
