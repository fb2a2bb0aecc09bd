"""Replica placement: spread, leaders across streams, the failover shift, racks, errors."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from liftlog.metadata.placement import PlacementError, ServerInfo, place_partitions


def servers(n: int, racks: int = 0) -> list[ServerInfo]:
    """``s0 .. s{n-1}``; with ``racks``, server ``i`` is on rack ``r{i % racks}``."""
    return [ServerInfo(f"s{i}", rack=f"r{i % racks}" if racks else "") for i in range(n)]


def leader_spread(placement: list[list[str]], ids: list[str], base: dict[str, int] | None = None) -> int:
    counts = Counter({id_: (base or {}).get(id_, 0) for id_ in ids})
    counts.update(replicas[0] for replicas in placement)
    return max(counts.values()) - min(counts.values())


def failover(placement: list[list[str]], failed: str) -> Counter[str]:
    """Where the failed server's preferred leaderships go: each partition's next replica."""
    return Counter(replicas[1] for replicas in placement if replicas[0] == failed)


@st.composite
def clusters(draw: st.DrawFn, max_servers: int = 9) -> list[ServerInfo]:
    """Live servers with optional, possibly uneven racks, in any order."""
    n = draw(st.integers(1, max_servers))
    racked = draw(st.booleans())
    racks = [draw(st.sampled_from("abcd")) if racked else "" for _ in range(n)]
    cluster = [ServerInfo(f"s{i:02}", rack) for i, rack in enumerate(racks)]
    return draw(st.permutations(cluster))


@st.composite
def requests(draw: st.DrawFn) -> tuple[list[ServerInfo], int, int]:
    cluster = draw(clusters())
    return cluster, draw(st.integers(1, 40)), draw(st.integers(1, len(cluster)) | st.just(-1))


# --- layout --------------------------------------------------------------------------------------


def test_seed_004_layout_for_five_servers() -> None:
    # Partition i on server i mod 5; followers shifted by one more each round (seed 004's figure).
    assert place_partitions(servers(5), 10, 3) == [
        ["s0", "s1", "s2"],
        ["s1", "s2", "s3"],
        ["s2", "s3", "s4"],
        ["s3", "s4", "s0"],
        ["s4", "s0", "s1"],
        ["s0", "s2", "s3"],
        ["s1", "s3", "s4"],
        ["s2", "s4", "s0"],
        ["s3", "s0", "s1"],
        ["s4", "s1", "s2"],
    ]


@given(requests())
def test_every_partition_gets_rf_distinct_live_replicas(request: tuple[list[ServerInfo], int, int]) -> None:
    cluster, partitions, rf = request
    placement = place_partitions(cluster, partitions, rf)
    ids = {s.id for s in cluster}
    assert len(placement) == partitions
    for replicas in placement:
        assert len(replicas) == (len(cluster) if rf == -1 else rf)
        assert len(set(replicas)) == len(replicas)
        assert set(replicas) <= ids


@given(requests())
def test_placement_is_deterministic_and_ignores_server_order(request: tuple[list[ServerInfo], int, int]) -> None:
    cluster, partitions, rf = request
    shuffled = list(reversed(cluster))
    assert place_partitions(cluster, partitions, rf) == place_partitions(shuffled, partitions, rf)
    assert place_partitions(cluster, partitions, rf) == place_partitions(cluster, partitions, rf)


def test_minus_one_means_every_server() -> None:
    placement = place_partitions(servers(4), 6, -1)
    assert all(sorted(replicas) == ["s0", "s1", "s2", "s3"] for replicas in placement)
    assert [replicas[0] for replicas in placement] == ["s0", "s1", "s2", "s3", "s0", "s1"]


def test_single_server() -> None:
    assert place_partitions([ServerInfo("only")], 3, -1) == [["only"], ["only"], ["only"]]


# --- preferred leaders ---------------------------------------------------------------------------


@given(requests())
def test_leaders_spread_evenly_within_a_stream(request: tuple[list[ServerInfo], int, int]) -> None:
    cluster, partitions, rf = request
    placement = place_partitions(cluster, partitions, rf)
    assert leader_spread(placement, [s.id for s in cluster]) <= 1


@given(clusters(), st.lists(st.tuples(st.integers(1, 12), st.integers(1, 9)), min_size=1, max_size=8))
def test_leaders_stay_balanced_across_streams(cluster: list[ServerInfo], streams: list[tuple[int, int]]) -> None:
    ids = [s.id for s in cluster]
    leaders: Counter[str] = Counter()
    replicas: Counter[str] = Counter()
    for partitions, rf in streams:
        placement = place_partitions(
            cluster, partitions, min(rf, len(cluster)), leader_counts=leaders, replica_counts=replicas
        )
        assert leader_spread(placement, ids) <= 1
        assert leader_spread(placement, ids, leaders) <= 1
        leaders.update(r[0] for r in placement)
        replicas.update(id_ for r in placement for id_ in r)


def test_consecutive_single_partition_streams_lead_on_different_servers() -> None:
    leaders: Counter[str] = Counter()
    for _ in range(6):
        (replicas,) = place_partitions(servers(3), 1, 2, leader_counts=leaders)
        leaders[replicas[0]] += 1
    assert leaders == {"s0": 2, "s1": 2, "s2": 2}


def test_a_new_server_gets_the_extra_leaderships() -> None:
    existing = {"s0": 3, "s1": 3, "s2": 3}
    placement = place_partitions(servers(4), 2, 2, leader_counts=existing)
    assert [r[0] for r in placement] == ["s3", "s0"]
    # Equal leader counts: fewer replicas first.
    placement = place_partitions(servers(3), 1, 1, leader_counts=existing, replica_counts={"s0": 5, "s1": 4, "s2": 5})
    assert placement == [["s1"]]


@given(
    st.lists(st.integers(0, 20), min_size=2, max_size=8),
    st.integers(1, 30),
)
def test_extra_leaderships_go_to_the_least_loaded(existing: list[int], partitions: int) -> None:
    n = len(existing)
    counts = {f"s{i}": c for i, c in enumerate(existing)}
    placement = place_partitions(servers(n), partitions, 2, leader_counts=counts)
    led = Counter(r[0] for r in placement)
    extra = {id_ for id_ in counts if led[id_] > partitions // n}
    assert len(extra) == partitions % n
    if extra:
        assert max(counts[id_] for id_ in extra) <= min(counts[id_] for id_ in counts if id_ not in extra)


# --- failover: the shift -------------------------------------------------------------------------


def test_a_failed_servers_leaderships_spread_over_all_survivors() -> None:
    placement = place_partitions(servers(5), 20, 3)
    for failed in ["s0", "s1", "s2", "s3", "s4"]:
        moved = failover(placement, failed)
        assert sum(moved.values()) == 4
        assert moved == {s.id: 1 for s in servers(5) if s.id != failed}


@given(
    st.integers(2, 9),
    st.integers(1, 60),
    st.data(),
    st.dictionaries(st.sampled_from([f"s{i}" for i in range(9)]), st.integers(0, 50)),
)
def test_failover_spreads_leadership(
    n: int, partitions: int, data: st.DataObject, existing_leaders: dict[str, int]
) -> None:
    rf = data.draw(st.integers(2, n))
    placement = place_partitions(servers(n), partitions, rf, leader_counts=existing_leaders)
    for failed in (s.id for s in servers(n)):
        moved = failover(placement, failed)
        survivors = n - 1
        assert failed not in moved
        if moved:
            assert max(moved.values()) <= math.ceil(sum(moved.values()) / survivors)


@given(clusters(), st.integers(1, 60), st.data())
def test_failover_with_racks_spreads_over_other_racks(
    cluster: list[ServerInfo], partitions: int, data: st.DataObject
) -> None:
    rf = data.draw(st.integers(min(2, len(cluster)), len(cluster)))
    placement = place_partitions(cluster, partitions, rf)
    if rf < 2:
        return
    racks = {s.id: s.rack for s in cluster}
    several_racks = len(set(racks.values())) > 1
    for failed in racks:
        moved = failover(placement, failed)
        if not moved:
            continue
        takers = [id_ for id_ in racks if id_ != failed and not (several_racks and racks[id_] == racks[failed])]
        assert set(moved) <= set(takers)
        assert max(moved.values()) <= math.ceil(sum(moved.values()) / len(takers))


def test_the_shift_continues_across_streams() -> None:
    # The second stream continues s0's rotation where the first stopped, not from s1 again.
    first = place_partitions(servers(5), 5, 2)
    second = place_partitions(servers(5), 5, 2, leader_counts=Counter(r[0] for r in first))
    assert [r[1] for r in first + second if r[0] == "s0"] == ["s1", "s2"]


# --- racks ---------------------------------------------------------------------------------------


def test_no_two_replicas_share_a_rack() -> None:
    cluster = servers(6, racks=3)  # r0: s0 s3, r1: s1 s4, r2: s2 s5
    racks = {s.id: s.rack for s in cluster}
    placement = place_partitions(cluster, 12, 3)
    assert all(len({racks[id_] for id_ in replicas}) == 3 for replicas in placement)
    assert leader_spread(placement, list(racks)) == 0


def test_fewer_racks_than_replicas_spread_evenly() -> None:
    cluster = [ServerInfo("a1", "a"), ServerInfo("a2", "a"), ServerInfo("a3", "a"), ServerInfo("b1", "b")]
    racks = {s.id: s.rack for s in cluster}
    for replicas in place_partitions(cluster, 8, 3):
        assert sorted(Counter(racks[id_] for id_ in replicas).values()) == [1, 2]
    # RF 4 must use all of rack a: 3 + 1.
    for replicas in place_partitions(cluster, 4, -1):
        assert Counter(racks[id_] for id_ in replicas) == {"a": 3, "b": 1}


def test_servers_are_interleaved_by_rack() -> None:
    cluster = [ServerInfo("a1", "x"), ServerInfo("a2", "x"), ServerInfo("b1", "y"), ServerInfo("b2", "y")]
    placement = place_partitions(cluster, 4, 2)
    assert [r[0] for r in placement] == ["a1", "b1", "a2", "b2"]
    assert all(r[0][0] != r[1][0] for r in placement)


@given(requests())
def test_racks_used_as_evenly_as_possible(request: tuple[list[ServerInfo], int, int]) -> None:
    cluster, partitions, rf = request
    rack_of = {s.id: s.rack for s in cluster}
    rack_size = Counter(rack_of.values())
    for replicas in place_partitions(cluster, partitions, rf):
        used = Counter(rack_of[id_] for id_ in replicas)
        if len(rack_size) >= len(replicas):
            assert max(used.values()) == 1
        # No rack holds two more replicas than a rack that still had a free server.
        for rack, size in rack_size.items():
            if used[rack] < size:
                assert max(used.values()) <= used[rack] + 1


# --- errors --------------------------------------------------------------------------------------


def test_replication_factor_above_live_servers_names_the_numbers() -> None:
    with pytest.raises(PlacementError, match=r"^replication factor 4 is larger than the number of live servers \(3\)$"):
        place_partitions(servers(3), 1, 4)


@pytest.mark.parametrize("rf", [0, -2, -10])
def test_invalid_replication_factor(rf: int) -> None:
    with pytest.raises(PlacementError, match=rf"invalid replication factor {rf}\b"):
        place_partitions(servers(3), 1, rf)


@pytest.mark.parametrize("partitions", [0, -1])
def test_invalid_partition_count(partitions: int) -> None:
    with pytest.raises(PlacementError, match=rf"invalid number of partitions {partitions}\b"):
        place_partitions(servers(3), partitions, 1)


def test_no_live_servers() -> None:
    with pytest.raises(PlacementError, match="no live servers"):
        place_partitions([], 1, -1)


def test_duplicate_server_ids() -> None:
    with pytest.raises(PlacementError, match="duplicate server ids: s1"):
        place_partitions([*servers(3), ServerInfo("s1", "other")], 1, 1)


def test_placement_error_is_a_value_error() -> None:
    assert issubclass(PlacementError, ValueError)
