"""DiskStorage: MemoryStorage's semantics, surviving reopen, crashes between steps, and damage."""

from __future__ import annotations

import logging
import os
import random
import shutil
from collections import Counter
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path

import pytest

import liftlog.raft.disk as disk_module
from liftlog.raft import (
    DiskStorage,
    Entry,
    EntryKind,
    HardState,
    MemoryStorage,
    PersistedState,
    RaftNode,
    RaftStorageError,
    Ready,
    Snapshot,
)

from .network import Cluster

WAL1 = "wal-00000000000000000001.log"


def entries(lo: int, hi: int, term: int = 1) -> list[Entry]:
    """Entries ``lo..hi`` (inclusive) of ``term``, each with distinct data."""
    return [Entry(term, i, EntryKind.NORMAL, f"t{term}i{i}".encode()) for i in range(lo, hi + 1)]


def snap(index: int, term: int = 1, data: bytes = b"app") -> Snapshot:
    return Snapshot(index, term, ("a", "b", "c"), data)


def reopen(disk: DiskStorage, **kw: int | bool) -> DiskStorage:
    disk.close()
    return DiskStorage.open(disk.directory, **kw)  # type: ignore[arg-type]


def files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def flip(path: Path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[DiskStorage]:
    d = DiskStorage.open(tmp_path / "raft")
    yield d
    d.close()


# --- equivalence with MemoryStorage ------------------------------------------------------------


class Mirrored(MemoryStorage):
    """A cluster node's MemoryStorage that also saves every Ready to a DiskStorage and checks both agree."""

    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.disk = DiskStorage.open(directory, fsync=False)
        self.seen: Counter[str] = Counter()

    def save(self, ready: Ready) -> None:
        super().save(ready)
        self.disk.save(ready)
        assert self.disk.state() == self.state()

    def install_snapshot(self, snapshot: Snapshot) -> None:
        self.seen["install"] += 1
        super().install_snapshot(snapshot)

    def append(self, new: Sequence[Entry]) -> None:
        if new[0].index <= self.base + len(self.entries):
            self.seen["overwrite"] += 1
        super().append(new)

    def compact(self, snapshot: Snapshot) -> None:
        self.seen["compact"] += 1
        super().compact(snapshot)
        self.disk.compact(snapshot)
        assert self.disk.state() == self.state()


def test_a_clusters_readys_give_the_same_state_after_reopen(tmp_path: Path) -> None:
    ids = ["a", "b", "c"]
    disks = {i: Mirrored(tmp_path / i) for i in ids}
    c = Cluster(ids, disks=dict(disks))
    c.elect("a")
    for k in range(5):
        c.propose("a", f"x{k}".encode())
    # a, cut off, takes proposals that never commit; b wins without it and overwrites them.
    c.isolated.add("a")
    for data in (b"lost0", b"lost1", b"lost2"):
        c.step("a", partial(RaftNode.propose, data=data))
    c.tick_all(30)
    (b,) = [n for n in c.leaders() if n.id != "a"]
    for k in range(4):
        c.propose(b.id, f"y{k}".encode())
    c.isolated.clear()
    c.tick_all(5)
    # c falls behind while down; the leader compacts past it, so c gets a snapshot.
    follower = "c" if b.id != "c" else "a"
    c.crash(follower)
    for k in range(6):
        c.propose(b.id, f"z{k}".encode())
    c.tick_all(2)
    c.compact(b.id, b.applied_index, b"state")
    c.start(follower)
    c.tick_all(5)
    assert c.nodes[follower].commit_index == b.commit_index
    assert disks["a"].seen["overwrite"] >= 1
    assert disks[follower].seen["install"] >= 1
    assert disks[b.id].seen["compact"] == 1
    for i in ids:
        mirrored = disks[i]
        mirrored.disk = reopen(mirrored.disk)
        assert mirrored.disk.state() == mirrored.state(), i
        mirrored.disk.close()


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_match_memory_storage(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    mem = MemoryStorage()
    retain = rng.randint(1, 3)
    disk = DiskStorage.open(tmp_path, fsync=False, retain_snapshots=retain)
    term = 1
    try:
        for step in range(150):
            last = mem.base + len(mem.entries)
            op = rng.random()
            if op < 0.55:
                term += rng.random() < 0.2
                first = rng.randint(mem.base + 1, last + 1)
                rd = Ready(entries=entries(first, first + rng.randint(0, 5), term))
            elif op < 0.7:
                rd = Ready(hard_state=HardState(term, rng.choice([None, "", "a", "b"]), rng.randint(0, last)))
            elif op < 0.8:
                rd = Ready(snapshot=snap(last + rng.randint(0, 4), term, f"s{step}".encode()))
            else:
                rd = Ready()
            mem.save(rd)
            disk.save(rd)
            if rng.random() < 0.1 and last > mem.base:
                s = snap(rng.randint(mem.base, last), rng.randint(1, term), f"c{step}".encode())
                mem.compact(s)
                disk.compact(s)
            if rng.random() < 0.15:
                disk = reopen(disk, fsync=False, retain_snapshots=retain)
            assert disk.state() == mem.state(), f"seed {seed} step {step}"
            probe = rng.randint(0, mem.base + len(mem.entries) + 1)
            assert disk.term(probe) == mem.term(probe)
        disk = reopen(disk)
        assert disk.state() == mem.state()
    finally:
        disk.close()


# --- what survives a reopen ---------------------------------------------------------------------


def test_a_new_directory_starts_empty(tmp_path: Path) -> None:
    with DiskStorage.open(tmp_path / "new" / "node") as d:
        assert d.state() == PersistedState()
        assert d.base == 0 and d.term(0) == 0 and d.term(1) is None
    assert files(tmp_path / "new" / "node") == [WAL1]


def test_entries_and_hard_state_survive_reopen(disk: DiskStorage) -> None:
    disk.save(Ready(hard_state=HardState(2, "b", 3), entries=entries(1, 4)))
    disk.save(Ready(hard_state=HardState(2, None, 4)))
    disk = reopen(disk)
    assert disk.state() == PersistedState(HardState(2, None, 4), None, tuple(entries(1, 4)))
    disk.close()


def test_overwriting_conflicting_entries_survives_reopen(disk: DiskStorage) -> None:
    disk.append(entries(1, 6, term=1))
    disk.append(entries(3, 4, term=2))
    assert disk.entries == entries(1, 2, 1) + entries(3, 4, 2)
    disk = reopen(disk)
    assert disk.entries == entries(1, 2, 1) + entries(3, 4, 2)
    disk.append(entries(4, 5, term=3))  # offsets rebuilt on open: truncates the right record
    disk = reopen(disk)
    assert disk.entries == entries(1, 2, 1) + entries(3, 3, 2) + entries(4, 5, 3)
    disk.close()


def test_compact_then_reopen(disk: DiskStorage) -> None:
    disk.append(entries(1, 10))
    disk.compact(snap(6))
    assert files(disk.directory) == ["snapshot-00000000000000000006.snap", "wal-00000000000000000007.log"]
    disk = reopen(disk)
    assert disk.snapshot == snap(6) and disk.entries == entries(7, 10)
    assert disk.term(6) == 1 and disk.term(5) is None
    disk.append(entries(11, 12))
    disk = reopen(disk)
    assert disk.entries == entries(7, 12)
    disk.close()


def test_install_snapshot_then_reopen(disk: DiskStorage) -> None:
    disk.append(entries(1, 5))
    disk.save(Ready(snapshot=snap(8, term=3), entries=entries(9, 9, term=3), hard_state=HardState(3, None, 8)))
    disk = reopen(disk)
    assert disk.state() == PersistedState(HardState(3, None, 8), snap(8, term=3), tuple(entries(9, 9, term=3)))
    disk.close()


@pytest.mark.parametrize("retain", [1, 2, 3])
def test_only_the_newest_snapshots_are_kept(tmp_path: Path, retain: int) -> None:
    with DiskStorage.open(tmp_path, retain_snapshots=retain) as d:
        d.append(entries(1, 10))
        for index in (2, 4, 6, 8):
            d.compact(snap(index))
    kept = [name for name in files(tmp_path) if name.startswith("snapshot-")]
    assert kept == [f"snapshot-{i:020d}.snap" for i in (2, 4, 6, 8)[-retain:]]


def test_misuse_raises_value_error(disk: DiskStorage, tmp_path: Path) -> None:
    disk.append(entries(1, 3))
    with pytest.raises(ValueError, match="cannot append from index 5"):
        disk.append(entries(5, 6))
    with pytest.raises(ValueError, match="not consecutive"):
        disk.append([Entry(1, 4), Entry(1, 6)])
    disk.compact(snap(2))
    with pytest.raises(ValueError, match="older than the stored one"):
        disk.install_snapshot(snap(1))
    with pytest.raises(ValueError, match="retain_snapshots"):
        DiskStorage.open(tmp_path / "x", retain_snapshots=0)
    disk.close()
    with pytest.raises(ValueError, match="closed"):
        disk.append(entries(4, 4))


# --- crashes ---------------------------------------------------------------------------------------


def record_offsets(path: Path) -> list[int]:
    """Start of every record in a WAL file (from the length prefixes)."""
    raw, pos, out = path.read_bytes(), 0, []
    while pos < len(raw):
        out.append(pos)
        pos += 8 + int.from_bytes(raw[pos : pos + 4], "big")
    return out


@pytest.mark.parametrize(
    "tail",
    [b"\x00\x00\x00", b"\x00" * 4096, b"\x00\x00\x00\x40\x12\x34\x56\x78partial", bytes(range(256)) * 3],
    ids=["partial-header", "zeros", "partial-record", "garbage"],
)
def test_a_torn_tail_is_truncated_with_a_warning(
    disk: DiskStorage, tail: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    disk.append(entries(1, 5))
    wal = disk.directory / WAL1
    size = wal.stat().st_size
    disk.close()
    with wal.open("ab") as f:
        f.write(tail)
    with caplog.at_level(logging.WARNING, logger="liftlog.raft.disk"):
        disk = DiskStorage.open(disk.directory)
    assert disk.entries == entries(1, 5)
    assert wal.stat().st_size == size
    assert f"truncating {len(tail)} bytes at byte {size}" in caplog.text
    disk.append(entries(6, 6))
    disk = reopen(disk)
    assert disk.entries == entries(1, 6)
    disk.close()


def test_a_last_record_with_a_bad_crc_is_a_torn_write(disk: DiskStorage) -> None:
    disk.append(entries(1, 5))
    wal = disk.directory / WAL1
    last = record_offsets(wal)[-1]
    disk.close()
    flip(wal, last + 12)
    disk = DiskStorage.open(disk.directory)
    assert disk.entries == entries(1, 4)
    assert wal.stat().st_size == last
    disk.close()


@pytest.mark.parametrize("where", ["payload", "length"])
def test_a_bad_record_before_valid_ones_raises_naming_file_and_byte(disk: DiskStorage, where: str) -> None:
    disk.append(entries(1, 5))
    wal = disk.directory / WAL1
    second = record_offsets(wal)[1]
    disk.close()
    flip(wal, second + (12 if where == "payload" else 1))
    with pytest.raises(RaftStorageError, match=rf"{WAL1} at byte {second}: .*a valid record follows") as info:
        DiskStorage.open(disk.directory)
    assert info.value.path == wal and info.value.offset == second


def test_a_corrupt_hard_state_raises(disk: DiskStorage) -> None:
    disk.save(Ready(hard_state=HardState(4, "a", 0)))
    disk.close()
    path = disk.directory / "hardstate"
    flip(path, len(path.read_bytes()) - 1)
    with pytest.raises(RaftStorageError, match=r"hardstate at byte 12: CRC mismatch"):
        DiskStorage.open(disk.directory)
    path.write_bytes(path.read_bytes()[:7])
    with pytest.raises(RaftStorageError, match=r"hardstate at byte 0: file is 7 bytes"):
        DiskStorage.open(disk.directory)


def twin_files(tmp_path: Path, log: list[Entry], action: str, snapshot: Snapshot) -> Path:
    """A directory where ``log`` was stored and then ``action`` (compact/install_snapshot) ran to completion."""
    twin = tmp_path / "twin"
    with DiskStorage.open(twin) as d:
        d.append(log)
        getattr(d, action)(snapshot)
    return twin


def test_crash_after_the_compaction_snapshot_is_written(disk: DiskStorage, tmp_path: Path) -> None:
    disk.save(Ready(entries=entries(1, 10), hard_state=HardState(1, None, 9)))
    disk.close()
    name = "snapshot-00000000000000000006.snap"
    shutil.copy(twin_files(tmp_path, entries(1, 10), "compact", snap(6)) / name, disk.directory / name)
    disk = DiskStorage.open(disk.directory)
    assert disk.state() == PersistedState(HardState(1, None, 9), snap(6), tuple(entries(7, 10)))
    assert files(disk.directory) == ["hardstate", name, "wal-00000000000000000007.log"]  # compaction finished
    disk = reopen(disk)
    assert disk.entries == entries(7, 10)
    disk.close()


def test_crash_after_an_installed_snapshot_is_written_drops_the_replaced_log(disk: DiskStorage, tmp_path: Path) -> None:
    disk.append(entries(1, 10, term=1))
    disk.close()
    installed = snap(6, term=2)  # the leader's entry 6 has term 2: our 6..10 conflict with it
    name = "snapshot-00000000000000000006.snap"
    shutil.copy(twin_files(tmp_path, [], "install_snapshot", installed) / name, disk.directory / name)
    disk = DiskStorage.open(disk.directory)
    assert disk.snapshot == installed and disk.entries == []
    disk.close()


def test_crash_before_the_old_wal_is_deleted(disk: DiskStorage, tmp_path: Path) -> None:
    disk.append(entries(1, 10))
    disk.close()
    twin = twin_files(tmp_path, entries(1, 10), "compact", snap(6))
    for name in files(twin):
        shutil.copy(twin / name, disk.directory / name)
    assert WAL1 in files(disk.directory)
    disk = DiskStorage.open(disk.directory)
    assert disk.snapshot == snap(6) and disk.entries == entries(7, 10)
    assert WAL1 not in files(disk.directory)
    disk.close()


def test_leftover_temporary_files_are_removed(disk: DiskStorage) -> None:
    disk.append(entries(1, 2))
    disk.close()
    (disk.directory / "hardstate.tmp").write_bytes(b"half")
    (disk.directory / "snapshot-00000000000000000002.snap.tmp").write_bytes(b"half")
    disk = DiskStorage.open(disk.directory)
    assert files(disk.directory) == [WAL1] and disk.entries == entries(1, 2)
    disk.close()


def test_a_wal_that_leaves_a_gap_after_the_snapshot_raises(disk: DiskStorage) -> None:
    disk.append(entries(1, 10))
    disk.compact(snap(3))
    disk.compact(snap(6))
    disk.close()
    (disk.directory / "snapshot-00000000000000000006.snap").unlink()
    with pytest.raises(RaftStorageError, match=r"wal-00000000000000000007\.log: WAL starts at index 7 .* end at 3"):
        DiskStorage.open(disk.directory)


def test_a_corrupt_only_snapshot_raises(disk: DiskStorage) -> None:
    disk.append(entries(1, 4))
    disk.compact(snap(2))
    disk.close()
    path = disk.directory / "snapshot-00000000000000000002.snap"
    flip(path, 20)
    with pytest.raises(RaftStorageError, match=r"snapshot-00000000000000000002\.snap at byte 12: CRC mismatch"):
        DiskStorage.open(disk.directory)


def test_a_corrupt_newest_snapshot_falls_back_only_when_the_wal_covers_it(disk: DiskStorage, tmp_path: Path) -> None:
    disk.append(entries(1, 12))
    disk.compact(snap(4))
    disk.close()
    # Crash after writing snapshot 8 (which then rots) but before the WAL was rewritten: WAL 5..12 covers it.
    newest = "snapshot-00000000000000000008.snap"
    shutil.copy(twin_files(tmp_path, entries(1, 12), "compact", snap(8)) / newest, disk.directory / newest)
    flip(disk.directory / newest, 30)
    disk = DiskStorage.open(disk.directory)
    assert disk.snapshot == snap(4) and disk.entries == entries(5, 12)
    assert newest + ".corrupt" in files(disk.directory)
    # After a completed compaction the WAL starts at 9: snapshot 4 cannot stand in for 8.
    disk.compact(snap(8))
    disk.close()
    flip(disk.directory / newest, 30)
    with pytest.raises(RaftStorageError, match=f"{newest} at byte 12: CRC mismatch.*cannot replace it"):
        DiskStorage.open(disk.directory)


# --- fsync ------------------------------------------------------------------------------------------


def count_syncs(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    calls: Counter[str] = Counter()
    real_fsync, real_datasync = os.fsync, disk_module._datasync

    def fsync(fd: int) -> None:
        calls["fsync"] += 1
        real_fsync(fd)

    def datasync(fd: int) -> None:
        calls["datasync"] += 1
        real_datasync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(disk_module, "_datasync", datasync)
    return calls


def test_save_syncs_what_it_writes(disk: DiskStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_syncs(monkeypatch)
    disk.save(Ready(entries=entries(1, 3)))
    assert calls == {"datasync": 1}
    disk.save(Ready(hard_state=HardState(1, "a", 1)))
    assert calls == {"datasync": 1, "fsync": 2}  # the temporary file, then the directory
    disk.compact(snap(2))
    assert calls["fsync"] > 2


def test_fsync_false_writes_the_same_without_syncing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_syncs(monkeypatch)
    d = DiskStorage.open(tmp_path / "nosync", fsync=False)
    d.save(Ready(hard_state=HardState(2, "a", 1), entries=entries(1, 5, term=2)))
    d.append(entries(4, 6, term=3))
    d.compact(snap(3, term=2))
    d.install_snapshot(snap(7, term=3))
    d.append(entries(8, 9, term=3))
    d = reopen(d, fsync=False)
    assert calls == {}
    assert d.state() == PersistedState(HardState(2, "a", 1), snap(7, term=3), tuple(entries(8, 9, term=3)))
    d.close()
