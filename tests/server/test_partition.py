"""A partition's write path without NATS: batches, rejections, acks, storage failures."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from liftlog.api import api_pb2
from liftlog.metadata import PartitionMeta
from liftlog.server.partitions.messages import Incoming
from liftlog.server.partitions.partition import Partition, PartitionOptions
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
        meta,
        directory=tmp_path / "p0",
        options=PartitionOptions(LogConfig()),
        queue_group="",
        ack_sink=list[api_pb2.Ack]().append,
    )
    part.open_log()
    assert part.log is not None
    part.log.append([NewRecord(b"%d" % i) for i in range(5)])
    part.set_high_watermark(2)
    part.checkpoint_high_watermark()
    part.set_high_watermark(3)  # not checkpointed: a crash now forgets it
    # A crash (no close) and a restart: the HW comes from the checkpoint, not from the log end.
    again = Partition(
        meta,
        directory=tmp_path / "p0",
        options=PartitionOptions(LogConfig()),
        queue_group="",
        ack_sink=list[api_pb2.Ack]().append,
    )
    again.open_log()
    assert again.high_watermark == 2 and again.newest_offset == 4


def test_a_replica_that_stopped_leading_writes_and_acks_nothing_more(tmp_path: Path) -> None:
    # Seen in the chaos suite: a deposed leader's subscription still delivered two messages; written to the
    # follower's log they were acked as committed at offsets the new leader held other messages at.
    acks: list[api_pb2.Ack] = []
    meta = PartitionMeta("orders", 0, "orders", "s1", ["s1", "s2", "s3"], ["s1", "s2", "s3"])
    part = Partition(
        meta, directory=tmp_path / "p0", options=PartitionOptions(LogConfig()), queue_group="", ack_sink=acks.append
    )
    part.open_log()
    part.become_leader("s1", 0, max_lag_ns=10**9)
    part.append([incoming(b"waits", "1", api_pb2.ALL)])
    assert acks == [] and part.newest_offset == 0 and part.high_watermark == -1
    part.become_follower()
    assert [(a.correlationId, a.ackError, a.offset) for a in acks] == [("1", api_pb2.Ack.UNKNOWN, -1)]
    part.append([incoming(b"late", "2", api_pb2.ALL), incoming(b"late", "3", api_pb2.LEADER)])
    assert [(a.correlationId, a.ackError) for a in acks[1:]] == [("2", api_pb2.Ack.UNKNOWN), ("3", api_pb2.Ack.UNKNOWN)]
    assert part.newest_offset == 0 and part.high_watermark == -1, "nothing written, nothing committed"
    part.become_leader("s1", 1, max_lag_ns=10**9)  # led again: intake is written once more
    part.append([incoming(b"again", "4", api_pb2.LEADER)])
    assert (acks[-1].correlationId, acks[-1].offset, acks[-1].ackError) == ("4", 1, api_pb2.Ack.OK)


def test_intake_is_written_in_the_epoch_this_replica_leads_not_the_metadatas(tmp_path: Path) -> None:
    # Metadata naming a new leader can arrive before intake stops; a batch tagged with the new leader's epoch
    # would pass the follower's epoch check and never be truncated (seen as divergent replicas in chaos runs).
    meta = PartitionMeta("orders", 0, "orders", "s1", ["s1", "s2"], ["s1", "s2"])
    part = Partition(
        meta,
        directory=tmp_path / "p0",
        options=PartitionOptions(LogConfig()),
        queue_group="",
        ack_sink=list[api_pb2.Ack]().append,
    )
    part.open_log()
    part.become_leader("s1", 0, max_lag_ns=10**9)
    part.meta = PartitionMeta("orders", 0, "orders", "s2", ["s1", "s2"], ["s2"], leader_epoch=1)
    part.append([incoming(b"late", "1")])
    assert part.log is not None and part.newest_offset == 0
    assert part.log.epoch_cache.latest_epoch == 0


def batch(values: list[bytes], cid: str, policy: int = api_pb2.LEADER, expected: int = -1) -> Incoming:
    records = [NewRecord(v) for v in values]
    return Incoming(records[0], "orders", "inbox", cid, policy, expected, tuple(records[1:]))


def test_a_published_batch_is_stored_at_consecutive_offsets_and_acked_once(
    partition: Partition, acks: list[api_pb2.Ack]
) -> None:
    partition.append([incoming(b"a", "1"), batch([b"b", b"c", b"d"], "2"), incoming(b"e", "3")])
    assert [(a.correlationId, a.offset) for a in acks] == [("1", 0), ("2", 3), ("3", 4)]
    assert [r.value for r in partition.log.read(0, 10)] == [b"a", b"b", b"c", b"d", b"e"]  # type: ignore[union-attr]


def test_a_batch_is_refused_as_a_whole(partition: Partition, acks: list[api_pb2.Ack]) -> None:
    partition.append([batch([b"ok", b"x" * 101, b"ok"], "big")])
    partition.append([batch([b"a", b"b"], "stale", expected=5)])
    partition.append([batch([b"a", b"b"], "right", expected=0), batch([b"c"], "next", expected=2)])
    by_cid = {a.correlationId: a for a in acks}
    assert by_cid["big"].ackError == api_pb2.Ack.TOO_LARGE
    assert by_cid["stale"].ackError == api_pb2.Ack.INCORRECT_OFFSET, "the expected offset is the first record's"
    assert (by_cid["right"].offset, by_cid["next"].offset) == (1, 2)
    assert [r.value for r in partition.log.read(0, 10)] == [b"a", b"b", b"c"]  # type: ignore[union-attr]


def encoded_batch(values: list[bytes], cid: str, expected: int = -1) -> Incoming:
    """A batched publish as the intake gets it from NATS: its records stored as they came."""
    from liftlog.api import batches_pb2
    from liftlog.api.batch_envelope import encode_record_batch
    from liftlog.server.partitions.messages import incoming_from_nats
    from liftlog.storage.records import encode_records

    envelope = batches_pb2.RecordBatchEnvelope(
        records=encode_records([NewRecord(v, b"k", {"h": b"1"}) for v in values]),
        count=len(values),
        ackInbox="inbox",
        correlationId=cid,
    )
    if expected != -1:
        envelope.expectedOffset = expected
    item = incoming_from_nats("orders", "", encode_record_batch(envelope), "orders")
    assert item.encoded is not None and not item.more, "a clean batch is stored as it came"
    return item


def test_an_encoded_batch_is_stored_as_it_came_between_other_messages(
    partition: Partition, acks: list[api_pb2.Ack]
) -> None:
    partition.append([incoming(b"a", "1"), encoded_batch([b"b", b"c"], "2"), incoming(b"d", "3"), incoming(b"e", "4")])
    partition.append([encoded_batch([b"f"], "5", expected=5), encoded_batch([b"g"], "stale", expected=0)])
    assert [(a.correlationId, a.offset, a.ackError) for a in acks] == [
        ("1", 0, api_pb2.Ack.OK),
        ("2", 2, api_pb2.Ack.OK),
        ("3", 3, api_pb2.Ack.OK),
        ("4", 4, api_pb2.Ack.OK),
        ("5", 5, api_pb2.Ack.OK),
        ("stale", -1, api_pb2.Ack.INCORRECT_OFFSET),
    ]
    records = partition.log.read(0, 10)  # type: ignore[union-attr]
    assert [r.value for r in records] == [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert records[1].key == b"k" and dict(records[1].headers) == {"h": b"1"}
    assert records[1].timestamp == records[0].timestamp > 0, "the leader stamps a batch's records with its time"
    batch = encoded_batch([b"x" * 101], "big")
    partition.append([batch])
    assert acks[-1].ackError == api_pb2.Ack.TOO_LARGE and partition.newest_offset == 5
