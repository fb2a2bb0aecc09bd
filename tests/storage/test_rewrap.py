"""Rewrapping a stopped server's encrypted partitions under a new master key, and re-encrypting them."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from crc32c import crc32c

from liftlog.recordformat import BATCH_HEADER_SIZE
from liftlog.storage import CommitLog, LogConfig, NewRecord
from liftlog.storage.encryption import BatchCipher, MasterKey, envelope_of, partition_context
from liftlog.storage.records import encode_batch, iter_batch_headers, parse_batch_header
from liftlog.storage.rewrap import RewrapError, find_partitions, lock_data_dir, rewrap_partition

from .conftest import FakeClock
from .test_encryption import version_1_batch as old_format_batch

OLD = MasterKey(b"o" * 32)
NEW = MasterKey(b"n" * 16)
CREATED = 1_700_000_000_000_000_000


def stream_dir(data: Path, name: str) -> Path:
    d = data / "streams" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / ".created").write_text(f"{CREATED}\n")
    return d


def write_partition(data: Path, stream: str, pid: int, n: int, cipher: BatchCipher) -> Path:
    path = stream_dir(data, stream) / str(pid)
    bound = cipher.bind(partition_context(stream, pid, CREATED))
    log = CommitLog.open(path, LogConfig(segment_max_bytes=2048), clock=FakeClock(), cipher=bound, encrypt=True)
    for start in range(0, n, 5):
        log.append([NewRecord(b"%s-%d-%d" % (stream.encode(), pid, i)) for i in range(start, min(n, start + 5))])
    log.close()
    return path


def read_all(path: Path, stream: str, pid: int, cipher: BatchCipher) -> list[bytes]:
    bound = cipher.bind(partition_context(stream, pid, CREATED))
    log = CommitLog.open(path, clock=FakeClock(), cipher=bound, encrypt=True)
    try:
        return [r.value for r in log.iter_records(0)]
    finally:
        log.close()


def key_ids(path: Path) -> set[tuple[bytes, int]]:
    found = set()
    for seg in path.glob("*.log"):
        data = seg.read_bytes()
        for h in iter_batch_headers(data):
            version, key_id = envelope_of(data, h)
            found.add((key_id, version))
    return found


def snapshot(path: Path) -> dict[str, tuple[bytes, int]]:
    return {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in sorted(path.iterdir()) if f.is_file()}


def test_rewrapping_moves_every_batch_to_the_new_key_and_keeps_positions_indexes_and_mtimes(tmp_path: Path) -> None:
    data = tmp_path / "data"
    p0 = write_partition(data, "orders", 0, 40, BatchCipher(OLD))
    p1 = write_partition(data, "orders", 1, 12, BatchCipher(OLD))
    assert len(list(p0.glob("*.log"))) >= 2, "several segments"
    before = snapshot(p0)
    cipher = BatchCipher(NEW, [OLD])

    parts = find_partitions(data)
    assert [(p.stream, p.partition, p.created) for p in parts] == [("orders", 0, CREATED), ("orders", 1, CREATED)]
    seen: list[int] = []
    report = rewrap_partition(parts[0], cipher, progress=seen.append)
    assert report.rewrapped == 8 and report.unchanged == 0 and report.before == {(OLD.id.hex(), 2): 8}
    assert sum(seen) == report.bytes_read == sum(len(b) for name, (b, _) in before.items() if name.endswith(".log"))
    rewrap_partition(parts[1], cipher)

    after = snapshot(p0)
    assert after.keys() == before.keys()
    for name, (content, mtime) in before.items():
        assert len(after[name][0]) == len(content), name
        assert after[name][1] == mtime, f"{name} keeps its mtime (retention reads it)"
        if not name.endswith(".log"):
            assert after[name][0] == content, f"{name} is untouched"
    assert key_ids(p0) == key_ids(p1) == {(NEW.id, 2)}
    only_new = BatchCipher(NEW)
    assert read_all(p0, "orders", 0, only_new) == [b"orders-0-%d" % i for i in range(40)]
    assert read_all(p1, "orders", 1, only_new) == [b"orders-1-%d" % i for i in range(12)]

    again = rewrap_partition(parts[0], cipher)
    assert (again.rewrapped, again.unchanged, again.segments_written) == (0, 8, 0), "a second run has nothing to do"
    assert not list(p0.glob("*.rewrap"))


def test_a_dry_run_checks_everything_and_writes_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    p0 = write_partition(data, "orders", 0, 20, BatchCipher(OLD))
    before = snapshot(p0)
    report = rewrap_partition(find_partitions(data)[0], BatchCipher(NEW, [OLD]), dry_run=True)
    assert report.rewrapped == 4 and report.segments_written == 0
    assert snapshot(p0) == before


def test_without_the_old_key_the_run_stops_naming_it_and_the_segment_is_left_whole(tmp_path: Path) -> None:
    data = tmp_path / "data"
    p0 = write_partition(data, "orders", 0, 10, BatchCipher(OLD))
    before = snapshot(p0)
    with pytest.raises(RewrapError, match=f"orders/0, segment .*needs master key {OLD.id.hex()}"):
        rewrap_partition(find_partitions(data)[0], BatchCipher(NEW))
    assert snapshot(p0) == before


def test_a_damaged_batch_is_refused_not_carried_on_under_the_new_key(tmp_path: Path) -> None:
    data = tmp_path / "data"
    p0 = write_partition(data, "orders", 0, 10, BatchCipher(OLD))
    seg = sorted(p0.glob("*.log"))[0]
    raw = bytearray(seg.read_bytes())
    raw[BATCH_HEADER_SIZE + 80] ^= 1  # in the first batch's ciphertext
    struct.pack_into(">I", raw, 17, crc32c(bytes(raw[21 : parse_batch_header(raw).size])))
    seg.write_bytes(bytes(raw))
    with pytest.raises(RewrapError, match="base offset 0 fails authentication"):
        rewrap_partition(find_partitions(data)[0], BatchCipher(NEW, [OLD]))
    assert seg.read_bytes() == raw


def test_segments_copied_from_another_partition_are_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write_partition(data, "orders", 0, 10, BatchCipher(OLD))
    p1 = write_partition(data, "orders", 1, 10, BatchCipher(OLD))
    for f in (data / "streams" / "orders" / "0").glob("*.log"):
        (p1 / f.name).write_bytes(f.read_bytes())
    with pytest.raises(RewrapError, match=r"orders/1.*another partition or stream"):
        rewrap_partition(find_partitions(data)[1], BatchCipher(NEW, [OLD]))


def version_1_batch(key: MasterKey, base: int, values: list[bytes]) -> bytes:
    """A batch as servers before envelope version 2 wrote it (its AAD binds the header only)."""
    return old_format_batch(key, encode_batch(base, 0, [NewRecord(v) for v in values], default_timestamp=CREATED))


def test_rewrap_keeps_old_format_batches_and_reencrypt_upgrades_them(tmp_path: Path) -> None:
    data = tmp_path / "data"
    path = stream_dir(data, "legacy") / "0"
    log = CommitLog.open(path, clock=FakeClock(), cipher=BatchCipher(OLD), encrypt=True)
    log.append_raw(version_1_batch(OLD, 0, [b"v1-a", b"v1-b"]) + version_1_batch(OLD, 2, [b"v1-c"]))
    log.close()
    part = find_partitions(data)[0]

    rewrapped = rewrap_partition(part, BatchCipher(NEW, [OLD]))
    assert rewrapped.rewrapped == 2 and key_ids(path) == {(NEW.id, 1)}, "rewrapping keeps the format"
    assert read_all(path, "legacy", 0, BatchCipher(NEW)) == [b"v1-a", b"v1-b", b"v1-c"]

    upgraded = rewrap_partition(part, BatchCipher(NEW), reencrypt=True)
    assert upgraded.reencrypted == 2 and key_ids(path) == {(NEW.id, 2)}
    assert read_all(path, "legacy", 0, BatchCipher(NEW)) == [b"v1-a", b"v1-b", b"v1-c"]
    with pytest.raises(Exception, match="another partition or stream"):
        read_all(path, "legacy", 1, BatchCipher(NEW))  # now bound to its partition


def test_a_torn_tail_is_copied_as_it_is_for_recovery_to_cut(tmp_path: Path) -> None:
    data = tmp_path / "data"
    p0 = write_partition(data, "orders", 0, 10, BatchCipher(OLD))
    newest = sorted(p0.glob("*.log"))[-1]
    with newest.open("ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x0a\x00\x00\x01\x00torn")
    tail = newest.read_bytes()[-16:]
    rewrap_partition(find_partitions(data)[0], BatchCipher(NEW, [OLD]))
    assert newest.read_bytes()[-16:] == tail
    assert read_all(p0, "orders", 0, BatchCipher(NEW)) == [b"orders-0-%d" % i for i in range(10)]


def test_a_data_dir_in_use_by_a_server_is_refused(tmp_path: Path) -> None:
    import fcntl

    data = tmp_path / "data"
    data.mkdir()
    with open(data / "LOCK", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write("4242")
        held.flush()
        with pytest.raises(RewrapError, match=r"in use by a liftlog server \(pid 4242\): stop it first"):
            lock_data_dir(data)
    fd = lock_data_dir(data)  # free again once the holder is gone
    os.close(fd)


def test_a_directory_without_streams_is_named(tmp_path: Path) -> None:
    with pytest.raises(RewrapError, match="is it a liftlog data directory"):
        find_partitions(tmp_path)
