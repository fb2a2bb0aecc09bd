from __future__ import annotations

from pathlib import Path

import pytest

from liftlog.storage import CorruptCheckpoint, EpochEntry, LeaderEpochCache
from liftlog.storage.checkpoint import OffsetCheckpoint, read_checkpoint, write_checkpoint


def test_checkpoint_roundtrip_and_crc(tmp_path: Path) -> None:
    path = tmp_path / "x.checkpoint"
    write_checkpoint(path, "thing", [(1, 2), (3, 4)])
    assert read_checkpoint(path, "thing", 2) == [(1, 2), (3, 4)]
    raw = bytearray(path.read_bytes())
    raw[len("liftlog-checkpoint thing v1\n2\n")] = ord("9")
    path.write_bytes(raw)
    with pytest.raises(CorruptCheckpoint, match="CRC mismatch"):
        read_checkpoint(path, "thing", 2)
    assert not list(tmp_path.glob("*.tmp"))


def test_checkpoint_of_the_wrong_kind_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "x.checkpoint"
    write_checkpoint(path, "thing", [(1,)])
    with pytest.raises(CorruptCheckpoint, match="expected a 'other' checkpoint"):
        read_checkpoint(path, "other", 1)


def test_offset_checkpoint_missing_is_none(tmp_path: Path) -> None:
    ckpt = OffsetCheckpoint(tmp_path / "hw", "high-watermark")
    assert ckpt.read() is None
    ckpt.write(42)
    assert OffsetCheckpoint(tmp_path / "hw", "high-watermark").read() == 42


@pytest.fixture
def cache(tmp_path: Path) -> LeaderEpochCache:
    return LeaderEpochCache(tmp_path / "leader-epoch.checkpoint")


def test_assign_ignores_same_epoch_later_offset_and_persists(cache: LeaderEpochCache) -> None:
    assert cache.assign(0, 0)
    assert not cache.assign(0, 5)
    assert cache.assign(2, 10)
    assert LeaderEpochCache.load(cache.path).entries == [EpochEntry(0, 0), EpochEntry(2, 10)]


def test_assign_removes_non_monotonic_entries(cache: LeaderEpochCache) -> None:
    cache.assign(1, 0)
    cache.assign(2, 10)
    cache.assign(3, 20)
    cache.assign(4, 15)  # log was truncated below epoch 3's start behind our back
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(2, 10), EpochEntry(4, 15)]
    cache.assign(2, 12)  # an older epoch arriving removes every later one
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(2, 12)]


def test_end_offset_for_follows_kafka(cache: LeaderEpochCache) -> None:
    cache.assign(1, 0)
    cache.assign(3, 10)
    cache.assign(5, 20)
    leo = 30
    assert cache.end_offset_for(5, leo) == (5, 30)  # latest epoch: the LEO
    assert cache.end_offset_for(3, leo) == (3, 20)
    assert cache.end_offset_for(4, leo) == (3, 20)  # unknown epoch: largest smaller one
    assert cache.end_offset_for(0, leo) == (0, 0)  # older than all: first start offset
    assert cache.end_offset_for(6, leo) == (-1, -1)  # newer than all
    assert cache.end_offset_for(-1, leo) == (-1, -1)
    assert LeaderEpochCache(cache.path).end_offset_for(1, 0) == (-1, -1)


def test_truncate_from_end_and_start(cache: LeaderEpochCache) -> None:
    cache.assign(1, 0)
    cache.assign(2, 10)
    cache.assign(3, 20)
    cache.truncate_from_end(20)
    assert cache.entries == [EpochEntry(1, 0), EpochEntry(2, 10)]
    cache.truncate_from_start(15)
    assert cache.entries == [EpochEntry(2, 15)]
    cache.truncate_from_start(5)  # nothing below: unchanged
    assert LeaderEpochCache.load(cache.path).entries == [EpochEntry(2, 15)]


def test_corrupt_epoch_file_raises(cache: LeaderEpochCache) -> None:
    cache.assign(1, 0)
    cache.path.write_bytes(cache.path.read_bytes()[:-3])
    with pytest.raises(CorruptCheckpoint, match=str(cache.path)):
        LeaderEpochCache.load(cache.path)
