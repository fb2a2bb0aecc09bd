"""The duplicate window against a simple model: every id's latest original within the window, nothing else."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from liftlog.replication.duplicates import DuplicateWindow

WINDOW = 100


def test_an_id_is_known_until_its_window_passes_then_stored_anew() -> None:
    w = DuplicateWindow(WINDOW, 10)
    w.add(b"a", 0, 1000)
    assert w.original(b"a", 1000) == 0
    assert w.original(b"a", 1100) == 0  # the last instant of the window
    assert w.original(b"a", 1101) is None
    w.add(b"a", 5, 1101)  # stored again: the new record is the original now
    assert w.original(b"a", 1150) == 5


def test_a_repeat_keeps_the_first_offset() -> None:
    w = DuplicateWindow(WINDOW, 10)
    w.add(b"a", 3, 10)
    w.add(b"a", 4, 11)
    assert w.original(b"a", 12) == 3 and len(w) == 1


def test_the_cap_forgets_the_oldest_and_counts_it() -> None:
    w = DuplicateWindow(WINDOW, 3)
    for i, msg_id in enumerate([b"a", b"b", b"c", b"d"]):
        w.add(msg_id, i, 0)
    assert w.original(b"a", 0) is None and [w.original(m, 0) for m in (b"b", b"c", b"d")] == [1, 2, 3]
    assert w.evicted == 1 and len(w) == 3


def test_truncation_forgets_ids_at_and_past_the_new_end() -> None:
    w = DuplicateWindow(WINDOW, 10)
    for i, msg_id in enumerate([b"a", b"b", b"c", b"d"]):
        w.add(msg_id, i, 0)
    w.truncate(2)
    assert [w.original(m, 0) for m in (b"a", b"b", b"c", b"d")] == [0, 1, None, None]


def test_a_zero_window_or_cap_keeps_nothing() -> None:
    for w in (DuplicateWindow(0, 10), DuplicateWindow(WINDOW, 0)):
        w.add(b"a", 0, 0)
        assert w.original(b"a", 0) is None and len(w) == 0 and not w.enabled


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"), st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h"]), st.integers(0, 40)
        ),
        st.tuples(st.just("expire"), st.just(b""), st.integers(0, 40)),
        st.tuples(st.just("truncate"), st.just(b""), st.integers(0, 30)),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(ops, st.integers(1, 6))
def test_the_window_matches_a_model(steps: list[tuple[str, bytes, int]], cap: int) -> None:
    """The model: a list of (id, offset, timestamp) records; an id's original is its first record within the
    window after the last time it lapsed, among the ``cap`` newest ids kept."""
    w = DuplicateWindow(WINDOW // 10, cap)
    log: list[tuple[bytes, int, int]] = []  # what the model stored: (id, offset, ts)
    now = 0
    for op, msg_id, arg in steps:
        if op == "add":
            now += arg
            if w.original(msg_id, now) is None:
                w.add(msg_id, len(log), now)
                log.append((msg_id, len(log), now))
        elif op == "expire":
            now += arg
            w.expire(now)
        else:
            end = min(arg, len(log))
            w.truncate(end)
            log = log[:end]
        # Model: the newest record of each id, if within the window and among the newest `cap` distinct ids.
        newest: dict[bytes, tuple[int, int]] = {}
        for rid, offset, ts in log:
            newest[rid] = (offset, ts)
        for rid in [b"a", b"b", b"c", b"d", b"e", b"f", b"g", b"h"]:
            got = w.original(rid, now)
            if got is not None:
                offset, ts = newest[rid]
                assert got == offset and ts >= now - w.window_ns, (rid, got, newest[rid])
            elif w.evicted == 0 and rid in newest:  # nothing forgotten early: every id in the window is known
                assert newest[rid][1] < now - w.window_ns, (rid, newest[rid], now)
    assert len(w) <= cap


def test_the_storage_layer_knows_the_publishers_reserved_headers() -> None:
    """storage.records may not import liftlog.api: its copy of the names must match the one place they live."""
    from liftlog.api.stored import PUBLISHER_RESERVED
    from liftlog.storage.records import _PUBLISHER_NAMES

    assert set(_PUBLISHER_NAMES) == {name.encode() for name in PUBLISHER_RESERVED}
