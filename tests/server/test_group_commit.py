"""Group commit (fsync "always"): batches written in one event-loop turn share one fsync per log, and no
ack goes out before the fsync that covers it; a failed fsync takes the batches back and refuses them."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

from liftlog.api import api_pb2
from liftlog.metadata import PartitionMeta
from liftlog.server.partitions.group_commit import GroupCommitter
from liftlog.server.partitions.messages import Incoming
from liftlog.server.partitions.partition import Partition, PartitionOptions
from liftlog.storage import FsyncPolicy, LogConfig, NewRecord
from liftlog.storage.faults import FaultyFileIO


def incoming(value: bytes, cid: str, policy: int = api_pb2.LEADER) -> Incoming:
    return Incoming(NewRecord(value), "orders", "inbox", cid, policy, -1)


def make(tmp_path: Path, name: str, io: FaultyFileIO, acks: list[api_pb2.Ack], committer: GroupCommitter) -> Partition:
    meta = PartitionMeta(name, 0, name, "s1", ["s1"], ["s1"])
    options = PartitionOptions(LogConfig(fsync=FsyncPolicy.ALWAYS), file_io=io)
    part = Partition(
        meta,
        directory=tmp_path / name,
        options=options,
        queue_group="",
        ack_sink=acks.append,
        group_commit=committer.add,
    )
    part.open_log()
    return part


async def test_batches_of_one_turn_share_one_fsync_per_log_and_acks_wait_for_it(tmp_path: Path) -> None:
    io = FaultyFileIO()
    acks: list[api_pb2.Ack] = []
    committer = GroupCommitter()
    one, two = make(tmp_path, "one", io, acks, committer), make(tmp_path, "two", io, acks, committer)
    for part in (one, two):  # the first write of an epoch also checkpoints the epoch cache (more fsyncs)
        part.append([incoming(b"first", "warm-up")])
    await asyncio.sleep(0)
    acks.clear()
    before, rounds = io.calls["fsync"], committer.rounds
    for i in range(5):  # five bursts in one turn
        one.append([incoming(b"a%d" % i, f"one-{i}"), incoming(b"b%d" % i, f"one-{i}b", api_pb2.ALL)])
    two.append([incoming(b"x", "two-0")])
    assert acks == []  # written, not yet durable: nothing acknowledged
    assert one.high_watermark == 0
    await asyncio.sleep(0)  # the end of the turn
    assert io.calls["fsync"] - before == 2  # one per log, not one per batch
    assert committer.rounds == rounds + 1
    assert sorted(a.correlationId for a in acks) == sorted(
        [f"one-{i}" for i in range(5)] + [f"one-{i}b" for i in range(5)] + ["two-0"]
    )
    assert all(a.ackError == api_pb2.Ack.OK for a in acks)
    assert one.high_watermark == 10
    committer.close()


async def test_a_failed_group_fsync_refuses_every_batch_it_covered(tmp_path: Path) -> None:
    io = FaultyFileIO()
    acks: list[api_pb2.Ack] = []
    committer = GroupCommitter()
    part = make(tmp_path, "one", io, acks, committer)
    part.append([incoming(b"durable", "0")])
    await asyncio.sleep(0)
    acks.clear()
    io.fail("fsync", errno.EIO, path="*.log")
    part.append([incoming(b"lost-1", "1")])
    part.append([incoming(b"lost-2", "2", api_pb2.ALL)])
    await asyncio.sleep(0)
    assert sorted((a.correlationId, a.ackError, a.offset) for a in acks) == [
        ("1", api_pb2.Ack.UNKNOWN, -1),
        ("2", api_pb2.Ack.UNKNOWN, -1),
    ]
    assert part.log is not None
    assert [r.value for r in part.log.read(0)] == [b"durable"]  # taken back off, never acknowledged
    assert part.high_watermark == 0
    acks.clear()
    part.append([incoming(b"next", "3")])
    await asyncio.sleep(0)
    assert [(a.correlationId, a.offset) for a in acks] == [("3", 1)]
    committer.close()


async def test_closing_a_partition_syncs_and_acks_what_waited(tmp_path: Path) -> None:
    io = FaultyFileIO()
    acks: list[api_pb2.Ack] = []
    committer = GroupCommitter()
    part = make(tmp_path, "one", io, acks, committer)
    part.append([incoming(b"a", "0")])
    await part.close("test")
    assert [(a.correlationId, a.ackError) for a in acks] == [("0", api_pb2.Ack.OK)]
    await asyncio.sleep(0)  # the committer's turn finds nothing left to do
    assert committer.rounds == 0
    committer.close()


async def test_power_loss_after_group_commit_keeps_every_acknowledged_message(tmp_path: Path) -> None:
    io = FaultyFileIO()
    acks: list[api_pb2.Ack] = []
    committer = GroupCommitter()
    part = make(tmp_path, "one", io, acks, committer)
    for turn in range(20):
        for i in range(3):
            part.append([incoming(b"%d-%d" % (turn, i), f"{turn}-{i}")])
        if turn % 2:
            await asyncio.sleep(0)
    # The machine loses power now: the last turn's batches were never fsynced, and never acknowledged.
    acked = {a.correlationId for a in acks}
    io.power_loss()
    reopened = make(tmp_path, "one", FaultyFileIO(), [], committer)
    assert reopened.log is not None
    kept = {r.value.decode() for r in reopened.log.read(0, max_records=1000)}
    assert acked <= kept
    assert len(acked) == 60 and len(kept) == 60  # the last turn (19) was synced by the sleep after it
    committer.close()


async def test_followers_are_served_only_what_is_durable(tmp_path: Path) -> None:
    """A batch waiting for its group fsync may still be taken back: a follower must not copy it."""
    io = FaultyFileIO()
    acks: list[api_pb2.Ack] = []
    committer = GroupCommitter()
    meta = PartitionMeta("rep", 0, "rep", "s1", ["s1", "s2"], ["s1", "s2"])
    options = PartitionOptions(LogConfig(fsync=FsyncPolicy.ALWAYS), file_io=io)
    part = Partition(
        meta,
        directory=tmp_path / "rep",
        options=options,
        queue_group="",
        ack_sink=acks.append,
        group_commit=committer.add,
    )
    part.open_log()
    part.become_leader("s1", 0, max_lag_ns=10**10)
    part.append([incoming(b"synced", "0")])
    await asyncio.sleep(0)
    part.append([incoming(b"waiting", "1")])  # not yet fsynced
    _, data = part.serve_fetch("s2", 0, meta.leader_epoch, 1 << 20)
    assert b"synced" in data and b"waiting" not in data
    await asyncio.sleep(0)
    _, data = part.serve_fetch("s2", 0, meta.leader_epoch, 1 << 20)
    assert b"waiting" in data
    committer.close()
