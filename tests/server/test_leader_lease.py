"""The leader lease in a partition's write path (the shell of ``LeaderReplica.may_ack``), on a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from liftlog.api import api_pb2
from liftlog.metadata import PartitionMeta
from liftlog.server.clock import Clock as ServerClock
from liftlog.server.partitions import partition
from liftlog.server.partitions.partition import PARK_LEASES, Partition, PartitionOptions
from liftlog.storage import FsyncPolicy, LogConfig

from .test_partition import incoming

S = 1_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 100 * S

    def __call__(self) -> int:
        return self.now


def leading(tmp_path: Path, acks: list[api_pb2.Ack], clock: Clock, synced: list[Partition] | None = None) -> Partition:
    meta = PartitionMeta("orders", 0, "orders", "s1", ["s1", "s2"], ["s1"])
    fsync = FsyncPolicy.ALWAYS if synced is not None else FsyncPolicy.NEVER
    part = Partition(
        meta,
        directory=tmp_path / "p0",
        options=PartitionOptions(LogConfig(fsync=fsync)),
        queue_group="",
        ack_sink=acks.append,
        group_commit=synced.append if synced is not None else None,
        clock=ServerClock(monotonic_ns=clock),
    )
    part.open_log()
    part.become_leader("s1", 0, max_lag_ns=10 * S, lease_ns=S, lease_until=clock.now + S)
    return part


def test_a_leader_whose_lease_ran_out_writes_and_acknowledges_nothing_until_renewed(tmp_path: Path) -> None:
    acks: list[api_pb2.Ack] = []
    clock = Clock()
    part = leading(tmp_path, acks, clock)
    part.append([incoming(b"in-lease", "1")])
    assert [(a.correlationId, a.offset) for a in acks] == [("1", 0)]
    clock.now += S
    part.append([incoming(b"leader", "2"), incoming(b"all", "3", api_pb2.ALL), incoming(b"none", "4", api_pb2.NONE)])
    # Not even an error ack: a successor may have taken the same messages, and its ack must win.
    assert len(acks) == 1 and part.newest_offset == 0
    assert part.lease_refused == 0, "held, not refused: the lease may yet be renewed"
    part.lease_renewed(clock.now - S // 10)  # the renewing request was sent 100 ms ago
    # Renewed while still leading: what was held is written first, in arrival order, and acknowledged.
    assert part.newest_offset == 3
    part.append([incoming(b"renewed", "5")])
    # The ISR is this replica alone, so "all" is committed when written; "none" is never acknowledged.
    assert [(a.correlationId, a.offset) for a in acks[1:]] == [("2", 1), ("3", 2), ("5", 4)]
    assert part.log is not None
    assert [m.value for m in part.log.read(0, 10)] == [b"in-lease", b"leader", b"all", b"none", b"renewed"]


def test_messages_held_through_a_lapse_are_dropped_if_the_leader_is_deposed(tmp_path: Path) -> None:
    acks: list[api_pb2.Ack] = []
    clock = Clock()
    part = leading(tmp_path, acks, clock)
    clock.now += S
    part.append([incoming(b"held", "1")])
    part.become_follower()  # the controller named a successor, which takes the same messages from NATS
    assert acks == [] and part.newest_offset == -1 and part.lease_refused == 1


def test_messages_held_longer_than_a_few_leases_are_dropped(tmp_path: Path) -> None:
    acks: list[api_pb2.Ack] = []
    clock = Clock()
    part = leading(tmp_path, acks, clock)
    clock.now += S
    part.append([incoming(b"old", "1")])
    clock.now += PARK_LEASES * S + 1
    part.append([incoming(b"new", "2")])
    assert part.lease_refused == 1, "the publisher of the first has given up by now"
    part.lease_renewed(clock.now)
    assert [(a.correlationId, a.offset) for a in acks] == [("2", 0)]


def test_a_lapsed_leader_holds_a_bounded_number_of_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition, "PARK_MAX_ITEMS", 2)
    acks: list[api_pb2.Ack] = []
    clock = Clock()
    part = leading(tmp_path, acks, clock)
    clock.now += S
    part.append([incoming(b"a", "1"), incoming(b"b", "2"), incoming(b"c", "3")])
    assert part.lease_refused == 1
    part.lease_renewed(clock.now)
    assert [a.correlationId for a in acks] == ["1", "2"]


def test_leader_acks_held_for_the_group_fsync_are_not_sent_once_the_lease_ran_out(tmp_path: Path) -> None:
    acks: list[api_pb2.Ack] = []
    clock = Clock()
    waiting: list[Partition] = []
    part = leading(tmp_path, acks, clock, synced=waiting)
    part.append([incoming(b"written", "1")])
    assert waiting == [part] and acks == []
    clock.now += S  # the lease runs out before the fsync completes
    part.synced(None)
    assert acks == [] and part.lease_refused == 1
    assert part.log is not None and part.log.newest_offset == 0 and not part.log.unsynced, "written and fsynced"


def test_a_new_leader_starts_from_the_servers_last_renewal(tmp_path: Path) -> None:
    acks: list[api_pb2.Ack] = []
    clock = Clock()
    meta = PartitionMeta("orders", 0, "orders", "s1", ["s1", "s2"], ["s1"])
    part = Partition(
        meta,
        directory=tmp_path / "p0",
        options=PartitionOptions(LogConfig()),
        queue_group="",
        ack_sink=acks.append,
        clock=ServerClock(monotonic_ns=clock),
    )
    part.open_log()
    part.become_leader("s1", 0, max_lag_ns=10 * S, lease_ns=S, lease_until=clock.now - 1)  # the server's lapsed
    part.append([incoming(b"x", "1")])
    assert acks == [] and part.newest_offset == -1
