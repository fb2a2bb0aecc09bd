"""RaftLog: term lookup across the snapshot offset, conflict handling, compaction."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from liftlog.raft import Entry, Snapshot
from liftlog.raft.log import RaftLog


def ents(*terms: int, start: int = 1) -> list[Entry]:
    return [Entry(t, start + k) for k, t in enumerate(terms)]


def test_terms_and_bounds_after_snapshot() -> None:
    log = RaftLog(Snapshot(5, 2, ("a",)), ents(2, 3, start=6), commit=6)
    assert (log.first_index(), log.last_index(), log.last_term()) == (6, 7, 3)
    assert log.term(5) == 2 and log.term(4) is None and log.term(8) is None
    assert log.committed == 6 and log.applied == 5
    assert log.unstable_entries() == []


def test_maybe_append_truncates_only_conflicting_suffix() -> None:
    log = RaftLog(None, ents(1, 1, 2, 2), commit=1)
    assert log.maybe_append(1, 1, ents(1, 3, start=2)) == 3
    assert [e.term for e in log.slice(1, log.last_index() + 1)] == [1, 1, 3]
    assert log.unstable_from == 3
    assert log.maybe_append(3, 2, ents(4, start=4)) is None  # mismatch at 3


def test_maybe_append_ignores_an_old_duplicate() -> None:
    log = RaftLog(None, ents(1, 1, 2), commit=0)
    assert log.maybe_append(0, 0, ents(1, start=1)) == 1
    assert log.last_index() == 3  # the matching prefix does not truncate the rest


def test_overwriting_committed_entries_is_a_bug() -> None:
    log = RaftLog(None, ents(1, 1), commit=2)
    with pytest.raises(AssertionError):
        log.append(ents(2, start=2))


def test_find_conflict_by_term() -> None:
    log = RaftLog(None, ents(1, 1, 2, 2, 4, 4), commit=0)
    assert log.find_conflict_by_term(6, 3) == 4
    assert log.find_conflict_by_term(6, 0) == 0
    assert log.find_conflict_by_term(10, 4) == 6


def test_up_to_date_compares_last_term_then_length() -> None:
    log = RaftLog(None, ents(1, 2, 2), commit=0)
    assert log.is_up_to_date(1, 3)
    assert log.is_up_to_date(3, 2)
    assert not log.is_up_to_date(2, 2)
    assert not log.is_up_to_date(9, 1)


def test_compact_and_restore() -> None:
    log = RaftLog(None, ents(1, 1, 2, 3), commit=3)
    log.applied_to(3)
    log.compact(2)
    assert (log.snapshot_index, log.snapshot_term, log.first_index()) == (2, 1, 3)
    assert log.term(2) == 1 and log.term(1) is None and log.entry(3).term == 2
    snap = Snapshot(10, 5, ("a", "b"))
    log.restore(snap)
    assert (log.last_index(), log.last_term(), log.committed, log.applied) == (10, 5, 10, 10)
    assert log.pending_snapshot is snap


@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 4), st.lists(st.integers(1, 4), max_size=4)), max_size=30))
def test_maybe_append_matches_a_naive_model(ops: list[tuple[int, int, list[int]]]) -> None:
    log = RaftLog(None, [], commit=0)
    model: list[int] = []  # model[i - 1] is the term at index i
    for index, log_term, terms in ops:
        terms = sorted(max(t, log_term) for t in terms)
        entries = [Entry(t, index + 1 + k) for k, t in enumerate(terms)]
        prev_ok = (index == 0 and log_term == 0) or (0 < index <= len(model) and model[index - 1] == log_term)
        got = log.maybe_append(index, log_term, entries)
        if not prev_ok:
            assert got is None
            continue
        assert got == index + len(entries)
        for e in entries:
            if e.index <= len(model) and model[e.index - 1] != e.term:
                del model[e.index - 1 :]
            if e.index > len(model):
                model.append(e.term)
        assert [log.term(i) for i in range(1, log.last_index() + 1)] == model
