from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liftlog.storage import (
    CommitLog,
    EpochEntry,
    FsyncPolicy,
    InvalidBatch,
    LogClosed,
    LogConfig,
    NewRecord,
    NonMonotonicOffset,
    OffsetOutOfRange,
    RecordTooLarge,
    StaleLeaderEpoch,
)
from liftlog.storage.records import encode_batch, iter_batch_headers

from .conftest import FakeClock

OpenLog = Callable[..., CommitLog]


def values(log: CommitLog, start: int = 0) -> list[bytes]:
    return [r.value for r in log.iter_records(max(start, log.log_start_offset))]


def fill(
    log: CommitLog,
    n: int,
    per_batch: int = 10,
    key: Callable[[int], bytes | None] = lambda i: None,
    epoch: int = 0,
) -> None:
    for start in range(0, n, per_batch):
        batch = [NewRecord(b"v%d" % i, key=key(i)) for i in range(start, min(n, start + per_batch))]
        log.append(batch, leader_epoch=epoch)


def test_append_assigns_offsets_and_returns_leo(open_log: OpenLog) -> None:
    log = open_log()
    assert (log.log_start_offset, log.log_end_offset, log.newest_offset, log.high_watermark) == (0, 0, -1, -1)
    assert log.append([NewRecord(b"a"), NewRecord(b"b")]) == 2
    assert log.append([NewRecord(b"c")]) == 3
    assert [(r.offset, r.value) for r in log.read(0)] == [(0, b"a"), (1, b"b"), (2, b"c")]
    assert log.read(3) == []


def test_one_batch_is_one_write(open_log: OpenLog, monkeypatch: pytest.MonkeyPatch) -> None:
    import os  # the module liftlog.storage.segment writes with

    log = open_log()
    calls: list[int] = []
    real_write = os.write

    def counting_write(fd: int, data: bytes) -> int:
        calls.append(len(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", counting_write)
    log.append([NewRecord(b"x" * 100) for _ in range(100)])
    # one write for the batch, two for the first index entries of the segment
    assert len([c for c in calls if c > 1000]) == 1


def test_reads_out_of_range_name_the_valid_range(open_log: OpenLog) -> None:
    log = open_log()
    fill(log, 5)
    with pytest.raises(OffsetOutOfRange, match=r"offset 6 is out of range: the log holds offsets \[0, 5\)"):
        log.read(6)
    with pytest.raises(OffsetOutOfRange):
        log.read(-1)
    with pytest.raises(OffsetOutOfRange):
        log.read_raw(6)


def test_read_limits(open_log: OpenLog) -> None:
    log = open_log()
    fill(log, 100)
    assert [r.offset for r in log.read(5, max_records=3)] == [5, 6, 7]
    assert [r.offset for r in log.read(5, max_offset=8)] == [5, 6, 7]
    one_batch = log.read(0, max_bytes=1)  # at least one whole batch
    assert [r.offset for r in one_batch] == list(range(10))


def test_records_too_large_are_refused_and_nothing_is_written(open_log: OpenLog) -> None:
    log = open_log(LogConfig(max_record_bytes=200))
    with pytest.raises(RecordTooLarge, match="exceeds the maximum of 200 bytes"):
        log.append([NewRecord(b"ok"), NewRecord(b"x" * 300)])
    assert log.log_end_offset == 0 and log.active_segment.size == 0


def test_segments_roll_on_size_and_reads_cross_them(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_max_bytes=1024))
    fill(log, 200)
    assert len(log.segments) > 3
    names = sorted(p.name for p in log.directory.glob("*.log"))
    assert names[0] == "00000000000000000000.log"
    assert all(len(n) == len("00000000000000000000.log") for n in names)
    assert values(log) == [b"v%d" % i for i in range(200)]
    assert [r.offset for r in log.read(57, max_records=5)] == [57, 58, 59, 60, 61]


def test_segments_roll_on_age(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(LogConfig(segment_max_age_ms=1000))
    fill(log, 10)
    clock.advance_ms(999)
    fill(log, 10)
    assert len(log.segments) == 1
    clock.advance_ms(2)
    fill(log, 10)
    assert len(log.segments) == 2 and log.active_segment.base_offset == 20


def test_reopen_serves_everything_and_continues(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_max_bytes=2048))
    fill(log, 300)
    log.set_high_watermark(250)
    log.close()
    with pytest.raises(LogClosed):
        log.append([NewRecord(b"x")])
    log = open_log(LogConfig(segment_max_bytes=2048))
    assert (log.log_end_offset, log.high_watermark) == (300, 250)
    assert values(log) == [b"v%d" % i for i in range(300)]
    assert log.append([NewRecord(b"more")]) == 301


def test_append_raw_keeps_bytes_and_checks_offsets(open_log: OpenLog, tmp_path: Path) -> None:
    leader = CommitLog.open(tmp_path / "leader")
    leader.append([NewRecord(b"a", key=b"k")], leader_epoch=1)
    leader.append([NewRecord(b"b"), NewRecord(b"c")], leader_epoch=2)
    raw = leader.read_raw(0)
    follower = open_log()
    assert follower.append_raw(raw) == 3
    assert follower.read_raw(0) == raw
    assert follower.epoch_cache.entries == [EpochEntry(1, 0), EpochEntry(2, 1)]
    with pytest.raises(NonMonotonicOffset, match="below the log end offset 3"):
        follower.append_raw(raw)
    damaged = bytearray(encode_batch(3, 2, [NewRecord(b"d")], 0))
    damaged[-1] ^= 0xFF
    with pytest.raises(InvalidBatch, match="fails its CRC"):
        follower.append_raw(bytes(damaged))
    with pytest.raises(InvalidBatch, match="trailing bytes"):
        follower.append_raw(encode_batch(3, 2, [NewRecord(b"d")], 0)[:-1])
    assert follower.log_end_offset == 3
    # a gap (the leader compacted) is legal and moves the LEO
    assert follower.append_raw(encode_batch(10, 2, [NewRecord(b"e")], 0)) == 11
    assert [r.offset for r in follower.read(0)] == [0, 1, 2, 10]
    leader.close()


def test_read_raw_returns_whole_batches_within_limits(open_log: OpenLog) -> None:
    log = open_log()
    fill(log, 100)  # 10 batches of 10
    raw = log.read_raw(15, max_bytes=1)
    headers = list(iter_batch_headers(raw))
    assert [(h.base_offset, h.record_count) for h in headers] == [(10, 10)]
    raw = log.read_raw(15, max_bytes=1 << 20, max_offset=40)
    assert [h.base_offset for h in iter_batch_headers(raw)] == [10, 20, 30]
    assert log.read_raw(100) == b""


def test_stale_leader_epoch_is_refused(open_log: OpenLog) -> None:
    log = open_log()
    log.append([NewRecord(b"a")], leader_epoch=3)
    with pytest.raises(StaleLeaderEpoch, match="leader epoch 2 is older than the log's latest epoch 3"):
        log.append([NewRecord(b"b")], leader_epoch=2)
    log.append([NewRecord(b"c")], leader_epoch=5)
    assert log.epoch_cache.entries == [EpochEntry(3, 0), EpochEntry(5, 1)]


def test_truncate_to_middle_of_batch_and_segment(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_max_bytes=1024))
    for epoch in range(4):
        fill(log, 50, epoch=epoch)
        log.append([NewRecord(b"e%d" % epoch)], leader_epoch=epoch)
    leo = log.log_end_offset
    log.set_high_watermark(leo - 1)
    log.truncate_to(75)  # inside a batch of 10 and inside some segment
    assert log.log_end_offset == 75 and log.high_watermark == 74
    assert [r.offset for r in log.iter_records(0)] == list(range(75))
    assert all(e.start_offset < 75 for e in log.epoch_cache.entries)
    assert log.append([NewRecord(b"after")], leader_epoch=9) == 76
    log.close()
    log = open_log(LogConfig(segment_max_bytes=1024))
    assert log.log_end_offset == 76 and values(log, 74) == [b"v23", b"after"]
    assert log.epoch_cache.entries == [EpochEntry(0, 0), EpochEntry(1, 51), EpochEntry(9, 75)]
    log.truncate_to(1000)  # beyond the LEO: nothing to do
    assert log.log_end_offset == 76
    with pytest.raises(OffsetOutOfRange):
        log.truncate_to(-1)


def test_truncate_to_segment_boundary_drops_later_segments(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_max_bytes=1024))
    fill(log, 200)
    boundary = log.segments[2].base_offset
    log.truncate_to(boundary)
    assert log.log_end_offset == boundary and len(log.segments) == 2
    assert not (log.directory / f"{log.segments[-1].base_offset + 10**6:020d}.log").exists()


def test_reset_empties_the_log_at_an_offset(open_log: OpenLog) -> None:
    log = open_log()
    fill(log, 20)
    log.reset(500)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (500, 500, 499)
    assert log.append([NewRecord(b"x")]) == 501
    log.close()
    log = open_log()
    assert (log.log_start_offset, log.log_end_offset) == (500, 501)


def test_offset_for_timestamp(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(LogConfig(segment_max_bytes=1024, index_interval_bytes=128))
    stamps = []
    for i in range(100):
        log.append([NewRecord(b"v", timestamp=1000 + i * 10)])
        stamps.append(1000 + i * 10)
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(1000) == 0
    assert log.offset_for_timestamp(1001) == 1
    assert log.offset_for_timestamp(1500) == 50
    assert log.offset_for_timestamp(1990) == 99
    assert log.offset_for_timestamp(1991) is None


def test_retention_by_bytes_messages_and_age(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(LogConfig(segment_max_bytes=1024, retention_max_messages=100))
    fill(log, 300)
    assert log.enforce_retention() > 0
    assert log.log_end_offset - log.log_start_offset >= 100
    assert log.log_start_offset == log.segments[0].base_offset > 0
    with pytest.raises(OffsetOutOfRange):
        log.read(0)
    assert values(log) == [b"v%d" % i for i in range(log.log_start_offset, 300)]
    start = log.log_start_offset
    log.close()
    log = open_log(LogConfig(segment_max_bytes=1024, retention_max_messages=100))
    assert log.log_start_offset == start

    log.close()
    log = open_log(LogConfig(segment_max_bytes=1024, retention_max_bytes=3000))
    log.enforce_retention()
    assert log.size_bytes >= 3000 - 1024 and log.size_bytes - log.segments[0].size < 3000

    log.close()
    log = open_log(LogConfig(segment_max_bytes=1024, retention_max_age_ms=60_000))
    assert log.enforce_retention() == 0
    clock.advance_ms(61_000)
    fill(log, 1)
    deleted = log.enforce_retention()
    assert deleted > 0 and len(log.segments) >= 1
    assert log.log_end_offset == 301  # the active segment is never deleted


def test_compaction_keeps_newest_per_key_and_unkeyed(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_max_bytes=1024))
    fill(log, 300, key=lambda i: None if i % 7 == 0 else b"k%d" % (i % 5))
    log.set_high_watermark(log.newest_offset)
    before = {r.offset: r for r in log.iter_records(0)}
    result = log.compact()
    assert result.segments_rewritten > 0 and result.bytes_after < result.bytes_before
    after = {r.offset: r for r in log.iter_records(0)}
    active_base = log.active_segment.base_offset
    newest: dict[bytes, int] = {}
    for off, r in before.items():
        if r.key is not None:
            newest[r.key] = off
    for off, r in before.items():
        keep = off >= active_base or r.key is None or newest[r.key] == off
        assert (off in after) == keep, off
        if keep:
            assert after[off] == r
    assert log.log_end_offset == 300
    log.close()
    log = open_log(LogConfig(segment_max_bytes=1024))
    assert {r.offset: r for r in log.iter_records(0)} == after


def test_compaction_ignores_records_above_the_high_watermark(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_max_bytes=512))
    fill(log, 50, key=lambda i: b"same")
    log.set_high_watermark(19)  # only offsets <= 19 are committed
    cleanable_end = max(s.next_offset for s in log.segments if s.next_offset <= 20)
    assert 0 < cleanable_end <= 20
    log.compact()
    offsets = [r.offset for r in log.iter_records(0)]
    # uncommitted records neither get cleaned nor shadow the committed 19
    assert offsets == [o for o in range(50) if o >= cleanable_end or o == 19]


def test_compaction_emptied_segment_keeps_leo_through_truncate_and_reopen(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_max_bytes=512))
    fill(log, 60, key=lambda i: b"k")
    fill(log, 10, key=lambda i: b"k")
    log.set_high_watermark(log.newest_offset)
    log.compact()
    log.truncate_to(25)
    assert log.log_end_offset == 25
    log.close()
    log = open_log(LogConfig(segment_max_bytes=512))
    assert log.log_end_offset == 25


def test_compaction_in_a_thread_while_appending(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_max_bytes=2048))
    fill(log, 2000, key=lambda i: b"k%d" % (i % 10))
    log.set_high_watermark(log.newest_offset)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            log.compact()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    fill(log, 500, key=lambda i: None)
    reads = sum(len(log.read(0, max_records=50)) for _ in range(20))
    worker.join()
    assert not errors and reads > 0
    assert log.log_end_offset == 2500
    tail = [r.value for r in log.iter_records(2000)]
    assert tail == [b"v%d" % i for i in range(500)]


def test_fsync_policies(open_log: OpenLog, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    import os  # the module liftlog.storage.segment syncs with

    synced: list[int] = []
    real = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    log = open_log(LogConfig(fsync=FsyncPolicy.ALWAYS))
    before = len(synced)
    fill(log, 30)
    assert len(synced) - before >= 3
    log.close()

    log = open_log(LogConfig(fsync=FsyncPolicy.INTERVAL, fsync_interval_ms=100))
    before = len(synced)
    fill(log, 30)
    assert len(synced) == before
    clock.advance_ms(150)
    assert log.flush_if_due()
    assert len(synced) > before
    assert not log.flush_if_due()


def test_truncate_at_a_segment_that_follows_a_gap_keeps_the_offset(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_max_bytes=200))
    log.append_raw(encode_batch(0, 0, [NewRecord(b"x" * 150)], 0))
    log.append_raw(encode_batch(20, 0, [NewRecord(b"y" * 150)], 0))  # rolls at 20: a gap of 1..19
    assert [s.base_offset for s in log.segments] == [0, 20]
    log.truncate_to(20)
    assert log.log_end_offset == 20 and [r.offset for r in log.read(0)] == [0]
    log.close()
    assert open_log(LogConfig(segment_max_bytes=200)).log_end_offset == 20


def test_compaction_emptying_a_segment_does_not_move_the_log_start(open_log: OpenLog, clock: FakeClock) -> None:
    """Age retention judges an emptied segment by when compaction rewrote it, not as infinitely old."""
    import time

    clock.now = time.time_ns()
    log = open_log(LogConfig(segment_max_bytes=512, retention_max_age_ms=60_000))
    fill(log, 60, key=lambda i: b"k")
    log.set_high_watermark(log.newest_offset)
    log.compact()
    assert log.segments[0].max_timestamp < 0  # emptied: only the newest "k" is left, in a later segment
    assert log.enforce_retention() == 0
    assert log.log_start_offset == 0
    clock.advance_ms(61_000)  # past the age limit of its rewrite: now retention may drop it
    assert log.enforce_retention() > 0
    assert log.log_start_offset > 0


def test_append_encoded_stores_records_encoded_elsewhere(tmp_path: Path) -> None:
    from liftlog.storage.records import encode_records

    log = CommitLog.open(tmp_path / "p", LogConfig(), clock=lambda: 1234)
    log.append([NewRecord(b"first")])
    assert log.append_encoded(encode_records([NewRecord(b"a"), NewRecord(b"b", b"k")]), 2) == 3
    assert [(r.offset, r.value, r.key, r.timestamp) for r in log.read(0, 10)] == [
        (0, b"first", None, 1234),
        (1, b"a", None, 1234),
        (2, b"b", b"k", 1234),
    ]
    with pytest.raises(InvalidBatch):
        log.append_encoded(b"junk", 1)
    assert log.log_end_offset == 3
    log.close()


@settings(max_examples=60, deadline=None)
@given(
    batches=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5)), min_size=1, max_size=60),
    cut=st.integers(0, 200),
)
def test_tail_positions_agree_with_a_walk_from_the_index(batches: list[tuple[int, int]], cut: int) -> None:
    """Segments remember where their newest batches start (reads at the tail skip the index walk):
    every offset finds the same batch as in the same log reopened, which knows only its index."""
    config = LogConfig(segment_max_bytes=2048, index_interval_bytes=256)
    with tempfile.TemporaryDirectory() as tmp:
        log = CommitLog.open(Path(tmp), config, clock=FakeClock())
        offset = 0
        for i, (gap, count) in enumerate(batches):
            offset += gap  # appended raw, as a follower does; a gap is what compaction leaves
            offset = log.append_raw(encode_batch(offset, 0, [NewRecord(b"v%d" % i * 9)] * count, 0))
            if i == len(batches) // 2 and cut < offset:
                log.truncate_to(max(cut, log.log_start_offset))
                offset = log.log_end_offset
        end = log.log_end_offset
        positions = [[seg.find_position(o) for o in range(seg.base_offset, end + 1)] for seg in log.segments]
        log.close()
        reopened = CommitLog.open(Path(tmp), config, clock=FakeClock())
        assert [
            [seg.find_position(o) for o in range(seg.base_offset, end + 1)] for seg in reopened.segments
        ] == positions
        reopened.close()
