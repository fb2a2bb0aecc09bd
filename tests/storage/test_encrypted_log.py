"""A commit log of an encrypted stream: ciphertext on disk and in replication, records everywhere else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from liftlog.storage import CommitLog, LogConfig, NewRecord
from liftlog.storage.encryption import (
    ATTR_ENCRYPTED,
    BatchCipher,
    MasterKey,
    MissingMasterKey,
    UndecryptableBatch,
    partition_context,
)
from liftlog.storage.records import encode_records, iter_batch_headers

from .conftest import FakeClock

KEY = MasterKey(b"k" * 32)
SECRET = b"secret-payload"


def open_encrypted(path: Path, clock: FakeClock, cipher: BatchCipher | None = None, **config: Any) -> CommitLog:
    return CommitLog.open(path, LogConfig(**config), clock=clock, cipher=cipher or BatchCipher(KEY), encrypt=True)


def disk_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(path.glob("*.log")))


def fill(log: CommitLog, n: int, per_batch: int = 10, key: bool = False) -> None:
    for start in range(0, n, per_batch):
        log.append(
            [
                NewRecord(SECRET + b"-%d" % i, key=b"key%d" % (i % 3) if key else None, headers={"h": b"header-value"})
                for i in range(start, min(n, start + per_batch))
            ]
        )


def values(log: CommitLog, start: int = 0) -> list[bytes]:
    return [r.value for r in log.iter_records(start)]


def test_records_are_encrypted_on_disk_and_read_back_in_clear(tmp_path: Path, clock: FakeClock) -> None:
    log = open_encrypted(tmp_path / "log", clock)
    fill(log, 30)
    batched = encode_records([NewRecord(SECRET + b"-batched-%d" % i) for i in range(5)])
    log.append_encoded(batched, 5)
    log.flush()
    on_disk = disk_bytes(tmp_path / "log")
    assert (
        SECRET not in on_disk and b"header-value" not in on_disk
    )  # long enough not to turn up in ciphertext by chance
    expected = [SECRET + b"-%d" % i for i in range(30)] + [SECRET + b"-batched-%d" % i for i in range(5)]
    assert values(log) == expected
    assert [r.offset for r in log.read(12, max_records=3)] == [12, 13, 14]

    raw = log.read_raw(0, 1 << 20)  # what followers get: the stored ciphertext
    assert SECRET not in raw and all(h.attributes & ATTR_ENCRYPTED for h in iter_batch_headers(raw))
    clear = log.read_clear(0, 1 << 20)  # what clients get
    assert SECRET in clear and not any(h.attributes for h in iter_batch_headers(clear))
    assert [h.base_offset for h in iter_batch_headers(clear)] == [h.base_offset for h in iter_batch_headers(raw)]
    log.close()

    reopened = open_encrypted(tmp_path / "log", clock)
    assert values(reopened) == expected
    reopened.close()


def test_segments_copied_into_another_partition_do_not_decrypt_there(tmp_path: Path, clock: FakeClock) -> None:
    """Someone with the disk swaps segment files between partitions: the records are refused, not served."""
    cipher = BatchCipher(KEY)
    orders_0 = cipher.bind(partition_context("orders", 0, 1))
    orders_1 = cipher.bind(partition_context("orders", 1, 1))
    log = CommitLog.open(tmp_path / "orders" / "0", clock=clock, cipher=orders_0, encrypt=True)
    fill(log, 20)
    log.close()
    other = tmp_path / "orders" / "1"
    other.mkdir()
    for f in (tmp_path / "orders" / "0").iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    moved = CommitLog.open(other, clock=clock, cipher=orders_1, encrypt=True)
    assert moved.newest_offset == 19, "recovery needs no key: the copy looks like a whole log"
    with pytest.raises(UndecryptableBatch, match="another partition or stream"):
        values(moved)
    moved.close()
    home = CommitLog.open(tmp_path / "orders" / "0", clock=clock, cipher=orders_0, encrypt=True)
    assert values(home) == [SECRET + b"-%d" % i for i in range(20)]
    home.close()


def test_a_timestamp_lookup_reads_through_the_encryption(tmp_path: Path, clock: FakeClock) -> None:
    log = open_encrypted(tmp_path / "log", clock)
    second = 1_000_000_000
    log.append([NewRecord(b"v%d" % i, timestamp=clock.now + i * second) for i in range(5)])  # one batch
    assert log.offset_for_timestamp(clock.now + 2 * second + 1) == 3  # found by the records' own timestamps
    log.close()


def test_a_follower_stores_the_leaders_ciphertext_as_it_came(tmp_path: Path, clock: FakeClock) -> None:
    leader = open_encrypted(tmp_path / "leader", clock)
    fill(leader, 20)
    follower = open_encrypted(tmp_path / "follower", clock)
    raw = leader.read_raw(0, 1 << 20)
    follower.append_raw(raw)
    assert follower.read_raw(0, 1 << 20) == raw
    assert values(follower) == values(leader)
    leader.close()
    follower.close()


def test_without_the_key_the_log_opens_and_replicates_but_neither_writes_nor_reads(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = open_encrypted(tmp_path / "log", clock)
    fill(log, 10)
    log.close()
    keyless = CommitLog.open(tmp_path / "log", LogConfig(), clock=clock, cipher=BatchCipher(None), encrypt=True)
    assert keyless.log_end_offset == 10  # recovery needs no key: CRCs cover the stored bytes
    with pytest.raises(MissingMasterKey, match="no encryption master key"):
        keyless.append([NewRecord(b"x")])
    assert keyless.log_end_offset == 10, "nothing of a refused write is stored"
    with pytest.raises(MissingMasterKey, match=f"needs master key {KEY.id.hex()}"):
        keyless.read(0)
    with pytest.raises(MissingMasterKey):
        keyless.read_clear(0)
    assert keyless.read_raw(0, 1 << 20)  # a follower can still copy it on
    keyless.close()

    other = CommitLog.open(tmp_path / "log", clock=clock, cipher=BatchCipher(MasterKey(b"o" * 16)), encrypt=True)
    with pytest.raises(MissingMasterKey, match="which this server does not have"):
        other.read(0)
    other.close()


def test_truncating_inside_an_encrypted_batch_keeps_the_rest_encrypted(tmp_path: Path, clock: FakeClock) -> None:
    log = open_encrypted(tmp_path / "log", clock)
    fill(log, 20)  # batches of 10: offsets 0-9, 10-19
    log.truncate_to(15)
    assert values(log) == [SECRET + b"-%d" % i for i in range(15)]
    assert log.log_end_offset == 15
    assert SECRET not in disk_bytes(tmp_path / "log")
    assert all(h.attributes & ATTR_ENCRYPTED for h in iter_batch_headers(log.read_raw(0, 1 << 20)))
    fill(log, 3)
    assert len(values(log)) == 18
    log.close()


def test_truncating_inside_an_encrypted_batch_without_the_key_changes_nothing(tmp_path: Path, clock: FakeClock) -> None:
    log = open_encrypted(tmp_path / "log", clock)
    fill(log, 20)
    log.close()
    keyless = CommitLog.open(tmp_path / "log", clock=clock, cipher=BatchCipher(None), encrypt=True)
    before = disk_bytes(tmp_path / "log")
    with pytest.raises(MissingMasterKey, match="nothing was truncated"):
        keyless.truncate_to(15)
    assert keyless.log_end_offset == 20 and disk_bytes(tmp_path / "log") == before
    keyless.truncate_to(10)  # a whole batch goes without decrypting anything
    assert keyless.log_end_offset == 10
    keyless.close()


def test_compaction_decrypts_keeps_the_newest_per_key_and_encrypts_again(tmp_path: Path, clock: FakeClock) -> None:
    log = open_encrypted(tmp_path / "log", clock, segment_max_bytes=1024)
    fill(log, 120, per_batch=4, key=True)
    log.set_high_watermark(log.newest_offset)
    before = {r.offset: r for r in log.iter_records(0)}
    result = log.compact()
    assert result.records_removed > 0
    after = {r.offset: r for r in log.iter_records(0)}
    assert set(after) < set(before)
    assert all(after[o] == before[o] for o in after)
    assert SECRET not in disk_bytes(tmp_path / "log")
    log.close()


def test_compaction_without_the_key_fails_and_leaves_the_segments(tmp_path: Path, clock: FakeClock) -> None:
    log = open_encrypted(tmp_path / "log", clock, segment_max_bytes=1024)
    fill(log, 120, per_batch=4, key=True)
    log.close()
    keyless = CommitLog.open(
        tmp_path / "log", LogConfig(segment_max_bytes=1024), clock=clock, cipher=BatchCipher(None), encrypt=True
    )
    keyless.set_high_watermark(keyless.newest_offset)
    before = disk_bytes(tmp_path / "log")
    with pytest.raises(MissingMasterKey):
        keyless.compact()
    assert disk_bytes(tmp_path / "log") == before
    assert not list((tmp_path / "log" / ".cleaning").glob("*.log"))
    keyless.close()


def test_a_log_of_an_unencrypted_stream_stores_clear_batches(tmp_path: Path, clock: FakeClock) -> None:
    log = CommitLog.open(tmp_path / "log", clock=clock, cipher=BatchCipher(KEY))
    fill(log, 10)
    assert SECRET in log.read_raw(0, 1 << 20)
    assert log.read_clear(0, 1 << 20) == log.read_raw(0, 1 << 20)
    log.close()


def test_a_clear_batch_slipped_into_an_encrypted_log_is_refused_not_served(tmp_path: Path, clock: FakeClock) -> None:
    """Someone with the disk could put forged clear records in place of ciphertext (the CRC has no key)."""
    clear = CommitLog.open(tmp_path / "clear", clock=clock)
    fill(clear, 5)
    forged = clear.read_raw(0, 1 << 20)
    clear.close()
    log = open_encrypted(tmp_path / "log", clock)
    log.append_raw(forged)  # a follower stores what its leader sends (checked by the CRC only)
    log.set_high_watermark(log.newest_offset)
    with pytest.raises(UndecryptableBatch, match="not encrypted"):
        log.read(0)
    with pytest.raises(UndecryptableBatch, match="not encrypted"):
        log.read_clear(0)
    log.close()


def test_a_refused_truncation_leaves_a_consistent_log(tmp_path: Path, clock: FakeClock) -> None:
    log = open_encrypted(tmp_path / "log", clock, segment_max_bytes=1024)
    fill(log, 60)
    log.set_high_watermark(log.newest_offset)
    log.close()
    keyless = CommitLog.open(
        tmp_path / "log", LogConfig(segment_max_bytes=1024), clock=clock, cipher=BatchCipher(None), encrypt=True
    )
    keyless.set_high_watermark(keyless.newest_offset)
    with pytest.raises(MissingMasterKey):
        keyless.truncate_to(15)
    assert keyless.high_watermark <= keyless.newest_offset
    assert keyless.epoch_cache.latest_epoch is not None
    end = keyless.log_end_offset
    assert 15 < end <= 60
    keyless.close()
    reopened = open_encrypted(tmp_path / "log", clock, segment_max_bytes=1024)
    assert reopened.log_end_offset == end and len(values(reopened)) == end
    reopened.close()
