from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from liftlog.spark.offsets import EARLIEST, LATEST, OffsetRange, PartitionOffsets, admit, split_ranges

PO = PartitionOffsets

# -- PartitionOffsets ------------------------------------------------------------


def test_json_exact_format_and_round_trip() -> None:
    offsets = PO({"orders": {1: 4, 0: 6}, "audit": {10: 0, 2: EARLIEST, 3: LATEST}})
    text = offsets.to_json()
    assert text == '{"audit":{"2":-2,"3":-1,"10":0},"orders":{"0":6,"1":4}}'
    assert PO.from_json(text) == offsets
    assert PO.from_json('{"orders":{"0":6,"1":4}}').to_json() == '{"orders":{"0":6,"1":4}}'
    assert PO.from_json(' { "orders" : { "1" : 4 , "0" : 6 } } ').to_json() == '{"orders":{"0":6,"1":4}}'
    assert PO().to_json() == "{}"
    assert PO.from_json("{}") == PO()


def test_access_iteration_equality() -> None:
    offsets = PO({"b": {1: 7}, "a": {2: 3, 0: 5}})
    assert offsets.get("a", 2) == 3
    assert offsets.get("a", 1) is None
    assert offsets.get("zzz", 0) is None
    assert list(offsets) == [("a", 0, 5), ("a", 2, 3), ("b", 1, 7)]
    assert len(offsets) == 3
    assert offsets.streams() == ["a", "b"]
    assert offsets.partitions("a") == {0: 5, 2: 3}
    assert offsets == PO({"a": {0: 5, 2: 3}, "b": {1: 7}})
    assert hash(offsets) == hash(PO({"a": {0: 5, 2: 3}, "b": {1: 7}}))
    assert offsets != PO({"a": {0: 5, 2: 3}, "b": {1: 8}})
    assert offsets != {"a": {0: 5, 2: 3}, "b": {1: 7}}
    assert offsets.is_resolved
    assert not PO({"a": {0: LATEST}}).is_resolved


def test_immutable() -> None:
    source = {"a": {0: 1}}
    offsets = PO(source)
    source["a"][0] = 99
    offsets.partitions("a")[0] = 99
    offsets.to_dict()["a"][0] = 99
    assert offsets.get("a", 0) == 1
    with pytest.raises(AttributeError):
        offsets.x = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "must be an object of streams, not list"),
        ("5", "must be an object of streams, not int"),
        ('{"orders": [6]}', "stream 'orders' must be an object of partitions, not list"),
        ('{"orders": {"x": 6}}', "partition key 'x' of stream 'orders' is not an integer"),
        ('{"orders": {"-1": 6}}', "partition key '-1'"),
        ('{"orders": {"01": 6}}', "partition key '01'"),
        ('{"orders": {"1.5": 6}}', "partition key '1.5'"),
        ('{"orders": {"0": -3}}', "stream 'orders' partition 0 is negative: -3"),
        ('{"orders": {"0": 6.5}}', "stream 'orders' partition 0 is not an integer: 6.5"),
        ('{"orders": {"0": "6"}}', "is not an integer: '6'"),
        ('{"orders": {"0": true}}', "is not an integer: True"),
        ('{"orders": {"0": null}}', "is not an integer: None"),
        ('{"": {"0": 1}}', "stream name must be a non-empty string"),
        ('{"orders": {"0": 1, "0": 2}}', "key '0' twice"),
    ],
)
def test_from_json_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        PO.from_json(text)


def test_constructor_validates() -> None:
    with pytest.raises(ValueError, match="integer >= 0"):
        PO({"a": {-1: 0}})
    with pytest.raises(ValueError, match="negative"):
        PO({"a": {0: -5}})


# -- split_ranges ----------------------------------------------------------------


def test_split_ranges_example() -> None:
    start = PO({"a": {0: 10, 1: 5, 2: 7}})
    end = PO({"a": {0: 20, 1: 5, 2: 9, 3: 2}, "b": {0: 4}})
    assert split_ranges(start, end, min_partitions=1) == [
        OffsetRange("a", 0, 10, 20),
        OffsetRange("a", 2, 7, 9),
        OffsetRange("a", 3, 0, 2),
        OffsetRange("b", 0, 0, 4),
    ]
    # The 10-message range is split first, into consecutive, near-equal pieces.
    ranges = split_ranges(start, end, min_partitions=6)
    assert len(ranges) == 6
    assert [r for r in ranges if r.stream == "a" and r.partition == 0] == [
        OffsetRange("a", 0, 10, 14),
        OffsetRange("a", 0, 14, 17),
        OffsetRange("a", 0, 17, 20),
    ]
    # Never more ranges than messages (18 here).
    assert len(split_ranges(start, end, min_partitions=100)) == 18


def test_split_ranges_rejects() -> None:
    with pytest.raises(ValueError, match="before its start"):
        split_ranges(PO({"a": {0: 5}}), PO({"a": {0: 4}}), min_partitions=1)
    with pytest.raises(ValueError, match=r"end offsets must be resolved.*latest"):
        split_ranges(PO(), PO({"a": {0: LATEST}}), min_partitions=1)
    with pytest.raises(ValueError, match="min_partitions"):
        split_ranges(PO(), PO(), min_partitions=0)


offset_pairs = st.dictionaries(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 5)),
    st.tuples(st.one_of(st.none(), st.integers(0, 60)), st.integers(0, 60)),
    max_size=8,
)


def _nest(flat: dict[tuple[str, int], int]) -> PartitionOffsets:
    nested: dict[str, dict[int, int]] = {}
    for (stream, partition), offset in flat.items():
        nested.setdefault(stream, {})[partition] = offset
    return PO(nested)


@given(offset_pairs, st.integers(1, 200))
def test_split_ranges_cover_every_offset_once(pairs: dict[tuple[str, int], tuple[int | None, int]], n: int) -> None:
    starts = {k: s for k, (s, _) in pairs.items() if s is not None}
    ends = {k: max(e, starts.get(k, 0)) for k, (_, e) in pairs.items()}
    ranges = split_ranges(_nest(starts), _nest(ends), min_partitions=n)
    total = sum(e - starts.get(k, 0) for k, e in ends.items())
    assert all(r.end > r.start for r in ranges)
    assert len(ranges) >= min(n, total)
    assert ranges == sorted(ranges)
    covered = [(r.stream, r.partition, o) for r in ranges for o in range(r.start, r.end)]
    expected = [(s, p, o) for (s, p), e in sorted(ends.items()) for o in range(starts.get((s, p), 0), e)]
    assert covered == expected  # each offset exactly once, ranges consecutive
    # Pieces of one partition differ in size by at most 1.
    for key in ends:
        sizes = [r.end - r.start for r in ranges if (r.stream, r.partition) == key]
        assert not sizes or max(sizes) - min(sizes) <= 1


# -- admit -----------------------------------------------------------------------


def test_admit_proportional() -> None:
    start = PO({"a": {0: 0, 1: 100}})
    latest = PO({"a": {0: 100, 1: 400}})
    assert admit(start, latest, 40) == PO({"a": {0: 10, 1: 130}})
    # Largest remainder: 10 * (1/3, 1/3, 1/3) = 3.33 each -> 4, 3, 3 (ties by stream, partition).
    three = PO({"a": {0: 3, 1: 3, 2: 3}})
    assert admit(PO(), three, 7) == PO({"a": {0: 3, 1: 2, 2: 2}})


def test_admit_gives_each_backlog_at_least_one() -> None:
    latest = PO({"a": {0: 1000, 1: 1, 2: 2}})
    assert admit(PO(), latest, 10) == PO({"a": {0: 8, 1: 1, 2: 1}})
    # Budget too small for all: the largest backlogs get one each.
    assert admit(PO(), latest, 2) == PO({"a": {0: 1, 1: 0, 2: 1}})


def test_admit_none_reads_all_and_new_partitions() -> None:
    start = PO({"a": {0: 5}, "gone": {0: 3}})
    latest = PO({"a": {0: 9, 1: 2}, "new": {0: 4}})
    everything = PO({"a": {0: 9, 1: 2}, "new": {0: 4}, "gone": {0: 3}})
    assert admit(start, latest, None) == everything
    assert admit(start, latest, 10) == everything
    assert admit(start, latest, 1000) == everything
    limited = admit(start, latest, 5)
    assert limited.get("a", 1) == 1 and limited.get("new", 0) == 2 and limited.get("a", 0) == 7


def test_admit_zero_backlog_keeps_start() -> None:
    start = PO({"a": {0: 5, 1: 7}})
    assert admit(start, start, 3) == start
    assert admit(start, start, None) == start
    # A latest below start (e.g. truncated) is no backlog: never read backwards.
    assert admit(start, PO({"a": {0: 2, 1: 7}}), 3) == start


def test_admit_rejects() -> None:
    with pytest.raises(ValueError, match="max_rows"):
        admit(PO(), PO(), 0)
    with pytest.raises(ValueError, match=r"start offsets must be resolved.*earliest"):
        admit(PO({"a": {0: EARLIEST}}), PO(), 1)


@given(offset_pairs, st.one_of(st.none(), st.integers(1, 150)))
def test_admit_properties(pairs: dict[tuple[str, int], tuple[int | None, int]], max_rows: int | None) -> None:
    starts = {k: s for k, (s, _) in pairs.items() if s is not None}
    latests = {k: e for k, (_, e) in pairs.items()}
    start, latest = _nest(starts), _nest(latests)
    end = admit(start, latest, max_rows)
    backlog = {k: max(0, e - starts.get(k, 0)) for k, e in latests.items()}
    read = {}
    for stream, partition, offset in end:
        begin = starts.get((stream, partition), 0)
        assert offset >= begin
        if (stream, partition) in latests:
            assert offset <= max(begin, latests[stream, partition])
        else:
            assert offset == begin
        read[stream, partition] = offset - begin
    assert set(read) == set(starts) | set(latests)
    total = sum(read.values())
    if max_rows is None or sum(backlog.values()) <= max_rows:
        assert read == {k: backlog.get(k, 0) for k in read}
    else:
        assert total == max_rows
        with_backlog = [k for k, b in backlog.items() if b > 0]
        if max_rows >= len(with_backlog):
            assert all(read[k] >= 1 for k in with_backlog)
    # split_ranges accepts what admit returns and covers exactly what it admits.
    assert sum(r.end - r.start for r in split_ranges(start, end, min_partitions=3)) == total
