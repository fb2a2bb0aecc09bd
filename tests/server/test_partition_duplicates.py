"""A leader's write path with message ids, without NATS: a duplicate within the window is answered with its
original's offset and not stored; the window is rebuilt from the log, forgets what truncation removed, and
is capped."""

from __future__ import annotations

from pathlib import Path

import pytest

from liftlog.api import api_pb2
from liftlog.api._gen.batches_pb2 import RecordBatchEnvelope
from liftlog.api.batch_envelope import encode_record_batch
from liftlog.metadata import PartitionMeta
from liftlog.recordformat import ATTR_MSG_IDS
from liftlog.server.clock import Clock as ServerClock
from liftlog.server.partitions.messages import Incoming, incoming_from_nats
from liftlog.server.partitions.partition import Partition, PartitionOptions
from liftlog.storage import LogConfig, NewRecord
from liftlog.storage.records import encode_records

WINDOW = 10_000_000_000  # 10 s, in the partition clock's ns
LEADER, ALL = api_pb2.LEADER, api_pb2.ALL


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000_000_000

    def __call__(self) -> int:
        return self.now


def with_id(value: bytes, msg_id: bytes | None, cid: str, policy: int = LEADER) -> Incoming:
    headers = {"Nats-Msg-Id": msg_id} if msg_id else {}
    ids = (msg_id,) if msg_id else ()
    return Incoming(NewRecord(value, None, headers), "orders", "inbox", cid, policy, -1, msg_ids=ids)


def batch(ids: list[bytes | None], cid: str, policy: int = LEADER) -> Incoming:
    """A batched publish's envelope as the intake decodes it (records with Nats-Msg-Id headers)."""
    records = [NewRecord(b"r%d" % i, None, {"Nats-Msg-Id": m} if m else {}) for i, m in enumerate(ids)]
    envelope = RecordBatchEnvelope(
        records=encode_records(records), count=len(records), ackInbox="inbox", correlationId=cid, ackPolicy=policy
    )
    return incoming_from_nats("orders", "", encode_record_batch(envelope), "orders")


def partition(tmp_path: Path, acks: list[api_pb2.Ack], clock: Clock, max_ids: int = 100) -> Partition:
    meta = PartitionMeta("orders", 0, "orders", "s1", ["s1"], ["s1"])
    options = PartitionOptions(LogConfig(), duplicate_window_ns=WINDOW, duplicate_max_ids=max_ids)
    part = Partition(
        meta,
        directory=tmp_path / "p0",
        options=options,
        queue_group="",
        ack_sink=acks.append,
        clock=ServerClock(wall_ns=clock),
    )
    part.open_log()
    return part


@pytest.fixture
def acks() -> list[api_pb2.Ack]:
    return []


def stored(part: Partition) -> list[bytes]:
    assert part.log is not None
    return [bytes(r.value) for r in part.log.iter_records(part.log.log_start_offset)]


def test_a_duplicate_is_acked_with_its_originals_offset_and_not_stored(tmp_path: Path, acks: list) -> None:
    part = partition(tmp_path, acks, Clock())
    part.append([with_id(b"a", b"id-a", "1"), with_id(b"b", None, "2")])
    part.append([with_id(b"a again", b"id-a", "3", ALL), with_id(b"c", b"id-c", "4")])
    assert [(a.correlationId, a.offset, a.duplicate) for a in acks] == [
        ("1", 0, False),
        ("2", 1, False),
        ("3", 0, True),
        ("4", 2, False),
    ]
    assert stored(part) == [b"a", b"b", b"c"]
    assert part.duplicates_acked == 1


def test_a_repeat_within_one_append_is_a_duplicate_of_its_first(tmp_path: Path, acks: list) -> None:
    part = partition(tmp_path, acks, Clock())
    part.append([with_id(b"x", b"same", "1"), with_id(b"y", b"other", "2"), with_id(b"x", b"same", "3")])
    assert [(a.correlationId, a.offset, a.duplicate) for a in acks] == [
        ("1", 0, False),
        ("2", 1, False),
        ("3", 0, True),
    ]
    assert stored(part) == [b"x", b"y"]


def test_after_the_window_an_id_is_stored_again(tmp_path: Path, acks: list) -> None:
    clock = Clock()
    part = partition(tmp_path, acks, clock)
    part.append([with_id(b"a", b"id", "1")])
    clock.now += WINDOW + 1
    part.append([with_id(b"a", b"id", "2")])
    assert [(a.offset, a.duplicate) for a in acks] == [(0, False), (1, False)]
    part.append([with_id(b"a", b"id", "3")])
    assert (acks[-1].offset, acks[-1].duplicate) == (1, True)  # the new original


def test_batches_are_deduplicated_per_record(tmp_path: Path, acks: list) -> None:
    part = partition(tmp_path, acks, Clock())
    part.append([batch([b"1", b"2", None], "first")])
    assert (acks[-1].offset, acks[-1].duplicate, list(acks[-1].recordOffsets)) == (2, False, [])
    part.append([batch([b"1", b"2"], "all dup")])  # every record a duplicate: nothing stored
    ack = acks[-1]
    assert (ack.offset, ack.duplicate, list(ack.recordOffsets), list(ack.duplicateRecords)) == (1, True, [0, 1], [0, 1])
    part.append([batch([b"3", b"1", b"4", b"3"], "partial")])  # 1 stored before; the second 3 repeats the first
    ack = acks[-1]
    assert not ack.duplicate
    assert list(ack.recordOffsets) == [3, 0, 4, 3] and list(ack.duplicateRecords) == [1, 3]
    assert ack.offset == 3  # the last record's
    assert stored(part) == [b"r0", b"r1", b"r2", b"r0", b"r2"]


def test_a_duplicate_with_ack_all_waits_for_its_originals_commit(tmp_path: Path, acks: list) -> None:
    meta = PartitionMeta("orders", 0, "orders", "s1", ["s1", "s2"], ["s1", "s2"])
    options = PartitionOptions(LogConfig(), duplicate_window_ns=WINDOW, duplicate_max_ids=100)
    clock = Clock()
    part = Partition(
        meta,
        directory=tmp_path / "p0",
        options=options,
        queue_group="",
        ack_sink=acks.append,
        clock=ServerClock(wall_ns=clock),
    )
    part.open_log()
    part.become_leader("s1", clock.now, max_lag_ns=10**12)
    part.append([with_id(b"a", b"id", "1", ALL)])
    part.append([with_id(b"a", b"id", "2", ALL)])
    assert acks == [], "neither is committed: s2 has not copied offset 0"
    part.set_high_watermark(0)
    assert [(a.correlationId, a.offset, a.duplicate) for a in acks] == [("1", 0, False), ("2", 0, True)]


def test_a_new_leader_rebuilds_the_window_from_its_log_without_what_truncation_removed(tmp_path: Path) -> None:
    acks: list[api_pb2.Ack] = []
    clock = Clock()
    part = partition(tmp_path, acks, clock)
    part.append([with_id(b"old", b"gone", "1")])
    clock.now += WINDOW // 2
    part.append([with_id(b"kept", b"kept", "2"), with_id(b"cut", b"cut", "3")])
    assert part.log is not None
    part.become_follower()
    part.log.truncate_to(2)  # as a follower: the new leader never had offset 2
    clock.now += WINDOW // 2 + 1  # "gone" is past the window now, "kept" is not
    part.become_leader("s1", clock.now, max_lag_ns=10**12)
    assert len(part.duplicates) == 1
    part.append([with_id(b"x", b"kept", "4"), with_id(b"cut", b"cut", "5"), with_id(b"old", b"gone", "6")])
    assert [(a.correlationId, a.offset, a.duplicate) for a in acks[3:]] == [
        ("4", 1, True),
        ("5", 2, False),
        ("6", 3, False),
    ]


def test_only_batches_with_ids_are_read_to_rebuild(tmp_path: Path, acks: list) -> None:
    part = partition(tmp_path, acks, Clock())
    part.append([with_id(b"plain", None, "1")])
    part.append([with_id(b"a", b"id", "2")])
    assert part.log is not None
    attributes = [h.attributes for _, h in part.log.read_batches(0)]
    assert attributes == [0, ATTR_MSG_IDS]


def test_the_cap_forgets_the_oldest_ids(tmp_path: Path, acks: list) -> None:
    part = partition(tmp_path, acks, Clock(), max_ids=2)
    part.append([with_id(b"%d" % i, b"id-%d" % i, str(i)) for i in range(3)])
    assert len(part.duplicates) == 2 and part.duplicates.evicted == 1
    part.append([with_id(b"0", b"id-0", "again")])  # forgotten early: stored again
    assert (acks[-1].offset, acks[-1].duplicate) == (3, False)


def test_plain_nats_messages_and_envelopes_carry_their_ids_into_the_record(tmp_path: Path, acks: list) -> None:
    part = partition(tmp_path, acks, Clock())
    plain = incoming_from_nats("orders", "", b"plain", "orders", b"nats-id")
    assert plain.msg_ids == (b"nats-id",) and plain.record.headers == {"Nats-Msg-Id": b"nats-id"}
    part.append([plain, incoming_from_nats("orders", "", b"plain again", "orders", b"nats-id")])
    assert stored(part) == [b"plain"]


def test_a_batch_id_makes_the_whole_batch_a_duplicate_or_not_and_survives_a_rebuild(tmp_path: Path) -> None:
    acks: list[api_pb2.Ack] = []
    clock = Clock()
    part = partition(tmp_path, acks, clock)

    def chunk(batch_id: bytes, cid: str) -> Incoming:
        records = [NewRecord(b"a", None, {"\x00batch": batch_id}), NewRecord(b"b"), NewRecord(b"c")]
        envelope = RecordBatchEnvelope(
            records=encode_records(records), count=3, ackInbox="inbox", correlationId=cid, ackPolicy=LEADER
        )
        item = incoming_from_nats("orders", "", encode_record_batch(envelope), "orders")
        assert item.batch_id == batch_id and item.msg_ids == ()
        return item

    part.append([with_id(b"x", None, "0"), chunk(b"B", "1"), chunk(b"B", "2")])  # a repeat in the same append
    part.append([chunk(b"B", "3"), chunk(b"C", "4")])
    summary = [(a.correlationId, a.offset, a.duplicate, list(a.recordOffsets)) for a in acks]
    assert summary == [
        ("0", 0, False, []),
        ("1", 3, False, []),
        ("2", 3, True, [1, 2, 3]),
        ("3", 3, True, [1, 2, 3]),
        ("4", 6, False, []),
    ]
    part.become_follower()
    part.become_leader("s1", clock.now, max_lag_ns=10**12)
    part.append([chunk(b"C", "5")])
    assert (acks[-1].offset, acks[-1].duplicate, list(acks[-1].recordOffsets)) == (6, True, [4, 5, 6])
    assert stored(part) == [b"x", b"a", b"b", b"c", b"a", b"b", b"c"]
