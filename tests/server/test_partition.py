"""A partition's write path without NATS: batches, rejections, acks, storage failures."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from liftlog.api import api_pb2
from liftlog.metadata import PartitionMeta
from liftlog.server.messages import Incoming
from liftlog.server.partition import Partition, PartitionOptions
from liftlog.storage import LogConfig, NewRecord


def incoming(value: bytes, cid: str, policy: int = api_pb2.LEADER, expected: int = -1) -> Incoming:
    return Incoming(NewRecord(value), "orders", "inbox", cid, policy, expected)


@pytest.fixture
def acks() -> list[api_pb2.Ack]:
    return []


@pytest.fixture
def partition(tmp_path: Path, acks: list[api_pb2.Ack]) -> Partition:
    meta = PartitionMeta("orders", 0, "orders", "s1", ["s1"], ["s1"])
    options = PartitionOptions(LogConfig(max_record_bytes=100), occ=True)
    part = Partition(meta, directory=tmp_path / "p0", options=options, queue_group="", ack_sink=acks.append)
    part.open_log()
    return part


def test_a_batch_is_written_and_acked_in_order(partition: Partition, acks: list[api_pb2.Ack]) -> None:
    partition.append([incoming(b"a", "1"), incoming(b"b", "2", api_pb2.ALL), incoming(b"c", "3", api_pb2.NONE)])
    assert [(a.correlationId, a.offset) for a in acks] == [("1", 0), ("2", 1)]
    assert acks[1].commitTimestamp >= acks[1].receptionTimestamp > 0
    assert partition.high_watermark == 2 and partition.newest_offset == 2


def test_rejected_messages_are_not_written(partition: Partition, acks: list[api_pb2.Ack]) -> None:
    partition.append(
        [incoming(b"x" * 101, "big"), incoming(b"ok", "good", expected=0), incoming(b"stale", "old", expected=0)]
    )
    by_cid = {a.correlationId: a for a in acks}
    assert by_cid["big"].ackError == api_pb2.Ack.TOO_LARGE
    assert by_cid["old"].ackError == api_pb2.Ack.INCORRECT_OFFSET
    assert (by_cid["good"].ackError, by_cid["good"].offset) == (api_pb2.Ack.OK, 0)
    assert partition.newest_offset == 0


def test_a_full_disk_fails_the_batch_with_a_reason(
    partition: Partition, acks: list[api_pb2.Ack], monkeypatch: pytest.MonkeyPatch
) -> None:
    partition.append([incoming(b"before", "0")])

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    assert partition.log is not None
    monkeypatch.setattr(partition.log, "append", full)
    partition.append([incoming(b"lost?", "1"), incoming(b"lost?", "2")])
    assert [(a.correlationId, a.ackError) for a in acks[1:]] == [("1", api_pb2.Ack.UNKNOWN), ("2", api_pb2.Ack.UNKNOWN)]
    assert partition.write_error is not None and "No space left" in partition.write_error
    assert partition.high_watermark == 0, "nothing failed is committed"
    monkeypatch.undo()
    partition.append([incoming(b"after", "3")])
    assert acks[-1].offset == 1 and partition.write_error is None


def test_a_replicated_partition_keeps_its_checkpointed_hw_across_a_crash(tmp_path: Path) -> None:
    meta = PartitionMeta("orders", 0, "orders", "s1", ["s1", "s2"], ["s1", "s2"])
    part = Partition(
        meta, directory=tmp_path / "p0", options=PartitionOptions(LogConfig()), queue_group="", ack_sink=list().append
    )
    part.open_log()
    assert part.log is not None
    part.log.append([NewRecord(b"%d" % i) for i in range(5)])
    part.set_high_watermark(2)
    part.checkpoint_high_watermark()
    part.set_high_watermark(3)  # not checkpointed: a crash now forgets it
    # A crash (no close) and a restart: the HW comes from the checkpoint, not from the log end.
    again = Partition(
        meta, directory=tmp_path / "p0", options=PartitionOptions(LogConfig()), queue_group="", ack_sink=list().append
    )
    again.open_log()
    assert again.high_watermark == 2 and again.newest_offset == 4
