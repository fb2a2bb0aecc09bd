"""Seed 003's two failure scenarios, replayed on real commit logs through the replication cores.

Each runs once with truncation by leader epoch (KIP-101, what liftlog does) and once with the
old truncation to the high watermark; the HW variant is expected to lose or diverge, which is
why liftlog does not use it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from liftlog.replication.follower import (
    Append,
    Fetch,
    FollowerAction,
    FollowerReplica,
    RequestEpochOffset,
    SetHighWatermark,
    Truncate,
)
from liftlog.replication.leader import HighWatermark, LeaderReplica
from liftlog.storage import CommitLog, LogConfig, NewRecord

NOW = 1_000_000_000


def hw_variant(what: str) -> object:
    """The truncate-to-HW run of a scenario: it must fail its final assertion."""
    return pytest.param(
        "hw", marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"HW truncation {what}")
    )


LAG = 10_000_000_000


@dataclass
class Node:
    """One broker: a commit log, and the replication core of its current role."""

    name: str
    directory: Path
    log: CommitLog = field(init=False)
    hw: int = -1

    def __post_init__(self) -> None:
        self.log = CommitLog.open(self.directory, LogConfig())

    def values(self) -> list[bytes]:
        return [r.value for r in self.log.read(0, max_offset=self.log.log_end_offset)]

    def crash(self, keep_through: int | None = None) -> None:
        """Stop without warning; ``keep_through`` drops what was not flushed after that offset."""
        self.log.close()
        self.log = CommitLog.open(self.directory, LogConfig())
        if keep_through is not None:
            self.log.truncate_to(keep_through + 1)


def lead(node: Node, epoch: int, replicas: tuple[str, ...], isr: tuple[str, ...]) -> LeaderReplica:
    # A new leader records its epoch at its LEO at once (its first write will carry it).
    return LeaderReplica(node.name, replicas, isr, epoch, node.log.log_end_offset, node.hw, NOW, LAG)


def produce(node: Node, leader: LeaderReplica, *values: bytes) -> None:
    leo = node.log.append([NewRecord(v) for v in values], leader.leader_epoch)
    for action in leader.appended(leo, NOW):
        if isinstance(action, HighWatermark):
            node.hw = action.hw


class HwTruncatingFollower(FollowerReplica):
    """The pre-KIP-101 rule: truncate to the high watermark on becoming a follower (seed 003's failures)."""

    def start(self) -> list[FollowerAction]:
        return self._truncate(self.hw + 1)


def follow(node: Node, leader_name: str, epoch: int, truncate_by: str) -> FollowerReplica:
    kind = HwTruncatingFollower if truncate_by == "hw" else FollowerReplica
    return kind(node.name, leader_name, epoch, node.log.log_end_offset, node.hw, node.log.epoch_cache.latest_epoch, NOW)


def run(follower: FollowerReplica, me: Node, leader: LeaderReplica, leader_node: Node, actions: list[FollowerAction],
        *, rounds: int = 1) -> Fetch | None:  # fmt: skip
    """Carry out the follower's actions against the leader until ``rounds`` fetches were answered.

    Returns the fetch that would come next (not sent).
    """
    answered = 0
    queue = list(actions)
    while queue:
        action = queue.pop(0)
        if isinstance(action, RequestEpochOffset):
            epoch, end = leader_node.log.epoch_cache.end_offset_for(action.epoch, leader_node.log.log_end_offset)
            local = me.log.epoch_cache.end_offset_for(epoch, me.log.log_end_offset)[1] if epoch >= 0 else 0
            queue += follower.epoch_offset(epoch, end, local)
        elif isinstance(action, Truncate):
            me.log.truncate_to(action.offset)
        elif isinstance(action, Fetch):
            if answered == rounds:
                return action
            answered += 1
            answer = leader.fetch(me.name, action.offset, action.leader_epoch, NOW)
            for a in answer.actions:
                if isinstance(a, HighWatermark):
                    leader_node.hw = a.hw
            data = b"" if answer.empty else leader_node.log.read_raw(answer.offset)
            queue += follower.fetched(answer.leader_epoch, answer.hw, answer.offset, not data, NOW)
            if data:
                me.log.append_raw(data)
        elif isinstance(action, Append):
            queue += follower.appended(me.log.log_end_offset, NOW)
        elif isinstance(action, SetHighWatermark):
            me.hw = action.hw
    return None


@pytest.mark.parametrize(
    "truncate_by",
    [
        "epoch",
        pytest.param(
            "hw",
            marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason="HW truncation loses m2 (seed 003)"),
        ),
    ],
)
def test_hw_truncation_followed_by_immediate_election_loses_nothing(tmp_path: Path, truncate_by: str) -> None:
    a, b = Node("A", tmp_path / "a"), Node("B", tmp_path / "b")
    leader = lead(b, 0, ("B", "A"), ("B", "A"))
    produce(b, leader, b"m1", b"m2")
    follower = follow(a, "B", 0, truncate_by)
    # A fetches m1 and m2 and asks again; that second fetch commits both on B (the producer is acked)...
    again = run(follower, a, leader, b, follower.start(), rounds=1)
    assert again == Fetch(2, 0)
    for action in leader.fetch("A", again.offset, again.leader_epoch, NOW).actions:
        if isinstance(action, HighWatermark):
            b.hw = action.hw
    assert b.hw == 1, "m1 and m2 are committed and acknowledged"
    assert a.hw == -1, "...but A never saw the answer that carries the new HW"
    # A restarts, re-syncs with B, and B dies before A fetches again: A is elected.
    a.crash()
    follower = follow(a, "B", 0, truncate_by)
    run(follower, a, leader, b, follower.start(), rounds=0)
    b.log.close()
    lead(a, 1, ("B", "A"), ("A",))
    assert a.values() == [b"m1", b"m2"]


@pytest.mark.parametrize(
    "truncate_by",
    [
        "epoch",
        pytest.param(
            "hw",
            marks=pytest.mark.xfail(strict=True, raises=AssertionError, reason="HW truncation diverges (seed 003)"),
        ),
    ],
)
def test_replicas_do_not_diverge_after_both_crash(tmp_path: Path, truncate_by: str) -> None:
    a, b = Node("A", tmp_path / "a"), Node("B", tmp_path / "b")
    leader = lead(a, 0, ("A", "B"), ("A", "B"))
    produce(a, leader, b"m1")
    follower = follow(b, "A", 0, truncate_by)
    run(follower, b, leader, a, follower.start(), rounds=3)
    produce(a, leader, b"m2")
    run(follower, b, leader, a, follower.wake(), rounds=3)
    assert a.values() == b.values() == [b"m1", b"m2"]
    # A power cut: B had not flushed m2 and loses it; A keeps both.
    a.crash()
    b.crash(keep_through=0)
    assert b.values() == [b"m1"]
    # B comes back first and leads in epoch 1, taking m3 at offset 1.
    leader = lead(b, 1, ("A", "B"), ("B",))
    produce(b, leader, b"m3")
    # A returns as a follower of B.
    follower = follow(a, "B", 1, truncate_by)
    run(follower, a, leader, b, follower.start(), rounds=3)
    produce(b, leader, b"m4")
    run(follower, a, leader, b, follower.wake(), rounds=3)
    assert a.values() == b.values() == [b"m1", b"m3", b"m4"]
