"""Disk faults under the commit log: every write completes or leaves the log as it was.

The faults come from ``FaultyFileIO``, the object the log is given for its
file operations: EIO, ENOSPC and EMFILE at chosen calls, writes that stop
halfway, and power loss (files cut back to what was last fsynced).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from liftlog.storage import CommitLog, FsyncPolicy, LogConfig, LogFenced, NewRecord, WriteFailed
from liftlog.storage.descriptors import DescriptorBudget
from liftlog.storage.faults import FaultyFileIO, power_loss_from_journal
from liftlog.storage.records import encode_batch

from .conftest import FakeClock


def values(log: CommitLog, start: int = 0) -> list[bytes]:
    return [r.value for r in log.iter_records(max(start, log.log_start_offset))]


@pytest.fixture
def io() -> FaultyFileIO:
    return FaultyFileIO()


def open_log(tmp_path: Path, io: FaultyFileIO, clock: FakeClock, **config: object) -> CommitLog:
    return CommitLog.open(tmp_path / "log", LogConfig(**config), clock=clock, io=io)  # type: ignore[arg-type]


def test_a_write_cut_short_is_undone_and_the_next_batch_is_read_back(
    tmp_path: Path, io: FaultyFileIO, clock: FakeClock
) -> None:
    """The reproduction: bytes of a failed batch stayed behind and the next, acknowledged, batch was lost."""
    log = open_log(tmp_path, io, clock)
    log.append([NewRecord(b"first")])
    io.fail("write", errno.ENOSPC, path="*.log", partial=True)
    with pytest.raises(WriteFailed, match=r"No space left on device \(ENOSPC\); nothing of this write was stored"):
        log.append([NewRecord(b"x" * 1000)])
    assert log.log_end_offset == 1
    assert log.append([NewRecord(b"after")]) == 2
    assert values(log) == [b"first", b"after"]
    log.close()
    reopened = open_log(tmp_path, FaultyFileIO(), clock)
    assert values(reopened) == [b"first", b"after"]
    reopened.close()


@pytest.mark.parametrize("error", [errno.EMFILE, errno.ENOSPC, errno.EIO])
def test_a_roll_that_cannot_create_its_segment_changes_nothing(
    tmp_path: Path, io: FaultyFileIO, clock: FakeClock, error: int
) -> None:
    log = open_log(tmp_path, io, clock, segment_max_bytes=200)
    log.append([NewRecord(b"a" * 120)])
    io.fail("open", error, path="*.log")
    with pytest.raises(WriteFailed, match=r"cannot create .*00000000000000000001\.log"):
        log.append([NewRecord(b"b" * 120)])  # would roll
    assert [s.base_offset for s in log.segments] == [0]
    assert log.append([NewRecord(b"c" * 120)]) == 2
    assert [s.base_offset for s in log.segments] == [0, 1]
    log.close()
    reopened = open_log(tmp_path, FaultyFileIO(), clock)
    assert values(reopened) == [b"a" * 120, b"c" * 120]
    reopened.close()


def test_a_torn_write_that_cannot_be_cut_fences_the_log_until_repaired(
    tmp_path: Path, io: FaultyFileIO, clock: FakeClock
) -> None:
    log = open_log(tmp_path, io, clock)
    log.append([NewRecord(b"kept")])
    log.set_high_watermark(0)
    io.fail("write", errno.ENOSPC, path="*.log", partial=True)
    io.fail("ftruncate", errno.EIO, times=-1)
    with pytest.raises(LogFenced) as caught:
        log.append([NewRecord(b"torn" * 100)])
    message = str(caught.value)
    assert "00000000000000000000.log" in message and "ENOSPC" in message
    assert "offsets below 1 stay readable" in message
    assert log.fenced is caught.value
    # Reads still serve what was whole; writes keep refusing while the cause lasts.
    assert values(log) == [b"kept"]
    with pytest.raises(LogFenced):
        log.append([NewRecord(b"refused")])
    assert not log.repair()
    io.clear()  # space freed: the next write repairs first
    assert log.append([NewRecord(b"resumed")]) == 2
    assert log.fenced is None
    assert values(log) == [b"kept", b"resumed"]
    log.close()
    reopened = open_log(tmp_path, FaultyFileIO(), clock)
    assert values(reopened) == [b"kept", b"resumed"]
    reopened.close()


def test_a_fenced_log_is_repaired_by_reopening(tmp_path: Path, io: FaultyFileIO, clock: FakeClock) -> None:
    """A restart is the operator action the fence's message names: recovery cuts the torn bytes."""
    log = open_log(tmp_path, io, clock)
    log.append([NewRecord(b"kept")])
    io.fail("write", errno.EIO, path="*.log", partial=True)
    io.fail("ftruncate", errno.EIO, times=-1)
    with pytest.raises(LogFenced):
        log.append([NewRecord(b"torn" * 100)])
    log.close()
    reopened = open_log(tmp_path, FaultyFileIO(), clock)
    assert values(reopened) == [b"kept"]
    assert reopened.append([NewRecord(b"next")]) == 2
    reopened.close()


def test_fsync_failure_with_fsync_always_takes_the_batch_back(
    tmp_path: Path, io: FaultyFileIO, clock: FakeClock
) -> None:
    log = open_log(tmp_path, io, clock, fsync=FsyncPolicy.ALWAYS)
    log.append([NewRecord(b"durable")])
    io.fail("fsync", errno.EIO, path="*.log")
    with pytest.raises(WriteFailed, match="cannot fsync"):
        log.append([NewRecord(b"maybe not on disk")])
    assert values(log) == [b"durable"]
    assert log.append([NewRecord(b"next")]) == 2
    assert values(log) == [b"durable", b"next"]
    log.close()


def test_a_new_epoch_that_cannot_be_recorded_writes_nothing(tmp_path: Path, io: FaultyFileIO, clock: FakeClock) -> None:
    log = open_log(tmp_path, io, clock)
    log.append([NewRecord(b"e0")], leader_epoch=0)
    io.fail("write", errno.ENOSPC, path="leader-epoch.checkpoint.tmp")
    with pytest.raises(WriteFailed, match=r"leader-epoch\.checkpoint"):
        log.append([NewRecord(b"e1")], leader_epoch=1)
    assert log.log_end_offset == 1
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries] == [(0, 0)]
    assert log.append([NewRecord(b"e1")], leader_epoch=1) == 2
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries] == [(0, 0), (1, 1)]
    log.close()


def test_raw_appends_are_all_or_nothing(tmp_path: Path, io: FaultyFileIO, clock: FakeClock) -> None:
    log = open_log(tmp_path, io, clock)
    data = encode_batch(0, 3, [NewRecord(b"a"), NewRecord(b"b")], clock.now) + encode_batch(
        2, 4, [NewRecord(b"c")], clock.now
    )
    io.fail("write", errno.EIO, path="*.log", partial=True)
    with pytest.raises(WriteFailed):
        log.append_raw(data)
    assert log.log_end_offset == 0
    assert log.epoch_cache.entries == []
    assert log.append_raw(data) == 3
    assert values(log) == [b"a", b"b", b"c"]
    log.close()


def test_truncation_that_cannot_delete_a_segment_fences_and_finishes_on_repair(
    tmp_path: Path, io: FaultyFileIO, clock: FakeClock
) -> None:
    log = open_log(tmp_path, io, clock, segment_max_bytes=200)
    for i in range(6):
        log.append([NewRecord(b"%d" % i * 100)])
    assert len(log.segments) == 6
    io.fail("unlink", errno.EIO, path="00000000000000000003.log", times=-1)
    with pytest.raises(LogFenced, match="delete"):
        log.truncate_to(2)
    # Newer segments went first: the log ends cleanly at the one that would not go.
    assert log.log_end_offset == 4
    assert len(values(log)) == 4
    io.clear()
    assert log.repair()
    assert log.log_end_offset == 2
    log.close()
    reopened = open_log(tmp_path, FaultyFileIO(), clock)
    assert reopened.log_end_offset == 2
    reopened.close()


def test_retention_that_cannot_unlink_leaves_files_the_next_open_removes(
    tmp_path: Path, io: FaultyFileIO, clock: FakeClock
) -> None:
    log = open_log(tmp_path, io, clock, segment_max_bytes=200, retention_max_messages=2)
    for i in range(5):
        log.append([NewRecord(b"%d" % i * 100)])
    io.fail("unlink", errno.EIO, path="*.log", times=-1)
    assert log.enforce_retention() > 0
    start = log.log_start_offset
    assert start > 0
    log.close()
    assert (tmp_path / "log" / "00000000000000000000.log").exists()
    reopened = open_log(tmp_path, FaultyFileIO(), clock)
    assert reopened.log_start_offset == start
    assert not (tmp_path / "log" / "00000000000000000000.log").exists()
    reopened.close()


def test_retention_that_cannot_checkpoint_the_log_start_deletes_nothing(
    tmp_path: Path, io: FaultyFileIO, clock: FakeClock
) -> None:
    log = open_log(tmp_path, io, clock, segment_max_bytes=200, retention_max_messages=2)
    for i in range(5):
        log.append([NewRecord(b"%d" % i * 100)])
    io.fail("write", errno.ENOSPC, path="log-start-offset.checkpoint.tmp")
    with pytest.raises(WriteFailed, match="log-start-offset"):
        log.enforce_retention()
    assert log.log_start_offset == 0
    assert len(values(log)) == 5
    log.close()


def test_a_log_that_cannot_open_leaves_no_descriptor_open(tmp_path: Path, clock: FakeClock) -> None:
    log = open_log(tmp_path, FaultyFileIO(), clock, segment_max_bytes=200)
    for i in range(4):
        log.append([NewRecord(b"%d" % i * 100)])
    log.close()
    io = FaultyFileIO()
    io.fail("open", errno.EMFILE, path="00000000000000000003.log")
    with pytest.raises(OSError, match="Too many open files"):
        open_log(tmp_path, io, clock)
    assert io._paths == {}  # every segment opened before the failure was closed again


# -- power loss --------------------------------------------------------------------


def test_power_loss_with_fsync_always_keeps_every_acknowledged_record(tmp_path: Path, clock: FakeClock) -> None:
    io = FaultyFileIO()
    log = open_log(tmp_path, io, clock, fsync=FsyncPolicy.ALWAYS, segment_max_bytes=1000)
    acked = []
    for i in range(40):
        log.append([NewRecord(b"%03d" % i * 10)])
        acked.append(b"%03d" % i * 10)  # append returned: acknowledged
    io.power_loss()  # no close: the process and the page cache are gone
    reopened = open_log(tmp_path, FaultyFileIO(), clock)
    assert values(reopened) == acked
    reopened.close()


def test_power_loss_with_fsync_never_loses_what_was_not_flushed(tmp_path: Path, clock: FakeClock) -> None:
    """What the docs say: with "never", acknowledged records since the last fsync are gone."""
    io = FaultyFileIO()
    log = open_log(tmp_path, io, clock, segment_max_bytes=1000)
    for i in range(40):
        log.append([NewRecord(b"%03d" % i * 10)])
    lost = io.power_loss()
    assert lost, "the active segment was never fsynced"
    reopened = open_log(tmp_path, FaultyFileIO(), clock)
    survivors = values(reopened)
    assert len(survivors) < 40
    # Sealed segments were fsynced at the roll: what survives is a prefix.
    assert survivors == [b"%03d" % i * 10 for i in range(len(survivors))]
    reopened.close()


def test_power_loss_from_a_journal(tmp_path: Path, clock: FakeClock) -> None:
    """The form the cluster fault suite uses for a killed server process."""
    journal = tmp_path / "journal"
    io = FaultyFileIO(journal=journal)
    log = open_log(tmp_path, io, clock, segment_max_bytes=1000)
    for i in range(10):
        log.append([NewRecord(b"%03d" % i * 10)])
    log.flush()
    for i in range(10, 20):
        log.append([NewRecord(b"%03d" % i * 10)])
    lost = power_loss_from_journal(journal)
    assert lost
    reopened = open_log(tmp_path, FaultyFileIO(), clock)
    survivors = [v[:3] for v in values(reopened)]
    # Everything flushed survives (and whatever a roll fsynced since); the unsynced tail does not.
    assert 10 <= len(survivors) < 20
    assert survivors == [b"%03d" % i for i in range(len(survivors))]
    reopened.close()


# -- descriptors -------------------------------------------------------------------


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_sealed_segments_share_a_descriptor_budget(tmp_path: Path, clock: FakeClock) -> None:
    """Descriptors no longer grow with segments on disk: 3 logs of 40 segments each hold at most 4 + 3."""
    budget = DescriptorBudget(4)
    before = open_descriptors()
    logs = []
    for name in ("a", "b", "c"):
        log = CommitLog.open(tmp_path / name, LogConfig(segment_max_bytes=200), clock=clock, budget=budget)
        for i in range(40):
            log.append([NewRecord(b"%s%03d" % (name.encode(), i) * 20)])
        logs.append(log)
    assert len(logs[0].segments) == 40
    for log in logs:  # reading everything opens sealed segments on demand, least recently used closed first
        assert [r.value[:4] for r in log.iter_records(0)] == [
            b"%s%03d" % (log.directory.name.encode(), i) for i in range(40)
        ]
        assert budget.open_count <= 4
    assert open_descriptors() - before <= 4 + 3  # the budget, plus each log's active segment
    for log in logs:
        log.close()
    assert budget.open_count == 0
    # Reopened with the budget, the same holds after recovery.
    reopened = CommitLog.open(tmp_path / "a", LogConfig(segment_max_bytes=200), clock=clock, budget=budget)
    assert len(list(reopened.iter_records(0))) == 40
    assert budget.open_count <= 4
    reopened.close()


def test_a_descriptor_in_use_is_not_closed_under_its_reader(tmp_path: Path, clock: FakeClock) -> None:
    budget = DescriptorBudget(1)
    log = CommitLog.open(tmp_path / "log", LogConfig(segment_max_bytes=200), clock=clock, budget=budget)
    for i in range(10):
        log.append([NewRecord(b"%03d" % i * 30)])
    first, second = log.segments[0], log.segments[1]
    entry = budget._acquire(log.io, first._key, first.log_path)  # a reader (compaction's thread) holds it
    second.pread(0, 10)  # over budget: the held one must survive
    assert os.pread(entry.fd, 3, 60) != b""
    budget._release(log.io, entry)
    assert budget.open_count == 1
    log.close()


def test_emfile_while_opening_a_sealed_segment_gives_descriptors_back(tmp_path: Path, clock: FakeClock) -> None:
    io = FaultyFileIO()
    budget = DescriptorBudget(3)
    log = CommitLog.open(tmp_path / "log", LogConfig(segment_max_bytes=200), clock=clock, io=io, budget=budget)
    for i in range(10):
        log.append([NewRecord(b"%03d" % i * 30)])
    assert len(list(log.iter_records(0))) == 10  # segment 0 was read first, so it is closed again by now
    assert budget.open_count == 3
    io.fail("open", errno.EMFILE, path="00000000000000000000.log")
    assert log.segments[0].pread(0, 8) == (0).to_bytes(8, "big")  # evicted the others, opened on a retry
    assert io.injected == [f"open {log.segments[0].log_path}: EMFILE"]
    assert budget.open_count == 1
    log.close()


def test_close_on_a_failing_disk_still_closes_every_file(tmp_path: Path, clock: FakeClock) -> None:
    io = FaultyFileIO()
    log = open_log(tmp_path, io, clock, segment_max_bytes=200)
    for i in range(5):
        log.append([NewRecord(b"%03d" % i * 30)])
    io.fail("fsync", errno.EIO, times=-1)
    log.close()  # no exception: the next open recovers
    assert io._paths == {}
    reopened = open_log(tmp_path, FaultyFileIO(), clock)
    assert len(values(reopened)) == 5
    reopened.close()


def test_offsets_are_assigned_after_a_repair_moves_the_log_end(tmp_path: Path, clock: FakeClock) -> None:
    """A batch whose fsync failed and could not be cut off fences the log; the repair cuts it, and the
    next append must take the offset the cut freed, not the one past the cut batch (a hole)."""
    io = FaultyFileIO()
    log = open_log(tmp_path, io, clock, fsync=FsyncPolicy.ALWAYS)
    log.append([NewRecord(b"a")])
    io.fail("fsync", errno.EIO, path="*.log")
    io.fail("ftruncate", errno.EIO, times=-1)
    with pytest.raises(LogFenced):
        log.append([NewRecord(b"not durable")])
    io.clear()
    assert log.append([NewRecord(b"c")]) == 2
    assert [(r.offset, r.value) for r in log.read(0)] == [(0, b"a"), (1, b"c")]
    log.close()


def test_truncation_that_cannot_read_the_segment_it_cuts_changes_nothing(tmp_path: Path, clock: FakeClock) -> None:
    """Found by the fault model: an open() failing while truncation looks for where to cut (a sealed
    segment whose descriptor went back to the budget) escaped as a bare OSError."""
    io = FaultyFileIO()
    log = CommitLog.open(
        tmp_path / "log", LogConfig(segment_max_bytes=200), clock=clock, io=io, budget=DescriptorBudget(1)
    )
    for i in range(4):
        log.append([NewRecord(b"%d" % i * 100)])
    io.fail("open", errno.EIO, times=-1)
    with pytest.raises(WriteFailed, match="truncate"):
        log.truncate_to(0)
    io.clear()
    assert log.log_end_offset >= 1  # the newer segments may be gone; the one it could not read is whole
    assert values(log) == [b"%d" % i * 100 for i in range(log.log_end_offset)]
    log.truncate_to(0)
    assert log.log_end_offset == 0
    log.close()


def state(log: CommitLog) -> tuple[object, ...]:
    """What a reopen must find again: start, end, high watermark, epoch cache, segments, records."""
    epochs = [(e.epoch, e.start_offset) for e in log.epoch_cache.entries]
    records = [(r.offset, r.value) for r in log.iter_records(log.log_start_offset)]
    segments = [s.base_offset for s in log.segments]
    return log.log_start_offset, log.log_end_offset, log.high_watermark, epochs, segments, records


def log_with_a_segment_after_a_gap(tmp_path: Path, io: FaultyFileIO, clock: FakeClock) -> CommitLog:
    """Offset 0 in segment 0, then a leader's batch of offsets 2..6 after a gap at 1, in segment 2."""
    log = open_log(tmp_path, io, clock)
    log.append([NewRecord(b"a")])
    log.roll()
    log.append_raw(encode_batch(2, 1, [NewRecord(b"b%d" % i) for i in range(5)], clock.now))
    assert [(s.base_offset, s.next_offset) for s in log.segments] == [(0, 1), (2, 7)]
    return log


@pytest.mark.parametrize("torn", [False, True])
def test_a_truncation_that_empties_a_segment_after_a_gap_ends_where_a_reopen_does(
    tmp_path: Path, io: FaultyFileIO, clock: FakeClock, torn: bool
) -> None:
    """Found by the fault model: truncating into the first batch of a segment that starts after a gap
    cuts the batch off and writes its kept part back; when that write failed, the emptied segment stayed
    active and set the LEO at its base (2) with no batch covering offset 1, and a clean close and reopen
    (recovery drops such a segment) found the LEO at 1. The log must end at 1 at once."""
    log = log_with_a_segment_after_a_gap(tmp_path, io, clock)
    io.fail("write", errno.EIO, path="*.log", partial=torn)
    if torn:  # the half-written kept part cannot be cut off either: it goes with the file
        io.fail("ftruncate", errno.EIO, path="*.log", after=1, times=-1)
    with pytest.raises(WriteFailed):
        log.truncate_to(3)
    io.clear()
    assert log.fenced is None
    assert state(log) == (0, 1, -1, [(0, 0)], [0], [(0, b"a")])
    assert log.read_raw(1) == b""  # at the LEO
    assert not (tmp_path / "log" / "00000000000000000002.log").exists()
    expected = state(log)
    log.close()
    reopened = open_log(tmp_path, FaultyFileIO(), clock)
    assert state(reopened) == expected
    assert reopened.append([NewRecord(b"c")]) == 2
    reopened.close()


@pytest.mark.parametrize("failing", ["*.log", "leader-epoch.checkpoint.tmp"])
@pytest.mark.parametrize("roll", ["by size", "empty active"])
def test_a_raw_append_after_a_gap_that_fails_leaves_the_log_end_alone(
    tmp_path: Path, io: FaultyFileIO, clock: FakeClock, roll: str, failing: str
) -> None:
    """A raw batch after a gap starts a segment at its base (a roll, or renaming an empty active segment)
    before its new epoch is recorded and it is written. When either write failed, that empty segment
    stayed: the LEO jumped from 1 to 5 although the append raised, read_raw(1..4) returned nothing below
    the LEO, and a reopen moved it back."""
    log = open_log(tmp_path, io, clock, segment_max_bytes=200)
    log.append([NewRecord(b"a" * 150)])
    if roll == "empty active":
        log.roll()
    before = state(log)
    assert before[1] == 1
    io.fail("write", errno.EIO, path=failing)
    with pytest.raises(WriteFailed):
        log.append_raw(encode_batch(5, 1, [NewRecord(b"b" * 150)], clock.now))
    io.clear()
    assert state(log)[:4] == before[:4] and state(log)[5] == before[5]
    assert [s.base_offset for s in log.segments] == [0]
    assert log.append_raw(encode_batch(5, 1, [NewRecord(b"b")], clock.now)) == 6
    expected = state(log)
    log.close()
    reopened = open_log(tmp_path, FaultyFileIO(), clock, segment_max_bytes=200)
    assert state(reopened) == expected
    reopened.close()


def test_an_emptied_segment_after_a_gap_that_cannot_be_unlinked_fences_until_it_is(
    tmp_path: Path, io: FaultyFileIO, clock: FakeClock
) -> None:
    """The segment leaves the log either way; its file must go before anything is written, or a later
    roll would leave an empty segment between two others."""
    log = log_with_a_segment_after_a_gap(tmp_path, io, clock)
    io.fail("write", errno.EIO, path="*.log")
    io.fail("unlink", errno.EIO, path="00000000000000000002.log", times=-1)
    with pytest.raises(LogFenced, match="delete"):
        log.truncate_to(3)
    assert state(log) == (0, 1, -1, [(0, 0)], [0], [(0, b"a")])
    with pytest.raises(LogFenced):
        log.append([NewRecord(b"refused")])
    assert (tmp_path / "log" / "00000000000000000002.log").exists()
    io.clear()
    assert log.append([NewRecord(b"c")]) == 2
    assert not (tmp_path / "log" / "00000000000000000002.log").exists()
    log.close()
    reopened = open_log(tmp_path, FaultyFileIO(), clock)
    assert state(reopened) == (0, 2, -1, [(0, 0)], [0], [(0, b"a"), (1, b"c")])
    reopened.close()


def test_a_fenced_emptied_segment_after_a_gap_is_removed_by_reopening(
    tmp_path: Path, io: FaultyFileIO, clock: FakeClock
) -> None:
    log = log_with_a_segment_after_a_gap(tmp_path, io, clock)
    io.fail("write", errno.EIO, path="*.log")
    io.fail("unlink", errno.EIO, path="00000000000000000002.log", times=-1)
    with pytest.raises(LogFenced):
        log.truncate_to(3)
    expected = state(log)
    log.close()
    reopened = open_log(tmp_path, FaultyFileIO(), clock)
    assert state(reopened) == expected
    reopened.close()
