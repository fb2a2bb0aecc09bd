"""The fetch scheduler: which requests a follower server sends to one leader, and which answers count."""

from __future__ import annotations

from liftlog.replication.fetching import EpochQuestion, FetchScheduler, Member
from liftlog.replication.follower import Fetch, FollowerReplica, RequestEpochOffset, SetHighWatermark, Sleep
from liftlog.replication.protocol import FetchError, FetchErrorCode, PartitionData, PartitionRefusal

IDLE = 10.0


def follower(leo: int = 0, epoch: int | None = None) -> FollowerReplica:
    return FollowerReplica("f", "l", 3, leo, -1, epoch, 0, idle_wait_s=IDLE)


def joined(schedule: FetchScheduler, stream: str, leo: int = 0, epoch: int | None = None, size: int = 40) -> Member:
    core = follower(leo, epoch)
    member = schedule.join((stream, 0), core, created=7, size=size)
    assert schedule.schedule(member, core.start(), now=0.0) == []
    return member


def data(stream: str, batches: bytes = b"", hw: int = 0) -> PartitionData:
    return PartitionData(stream, 0, 3, hw, memoryview(batches))


def test_a_new_member_fetches_at_once_and_every_due_partition_rides_one_request() -> None:
    s = FetchScheduler("f", "l", IDLE)
    joined(s, "a", leo=0)
    joined(s, "b", leo=0)
    due = s.poll(1.0)
    assert due.questions == () and due.wait is None
    (out,) = due.fetches
    assert out.request.replica_id == "f"
    assert [(p.stream, p.offset, p.leader_epoch, p.created) for p in out.request.partitions] == [
        ("a", 0, 3, 7),
        ("b", 0, 3, 7),
    ]
    again = s.poll(1.0)
    assert again.fetches == () and again.wait == IDLE, "nothing due while both are out"


def test_an_epoch_question_goes_out_on_its_own_with_the_current_epoch() -> None:
    s = FetchScheduler("f", "l", IDLE)
    m = joined(s, "a", leo=5, epoch=2)
    assert m.pending == RequestEpochOffset(2)
    due = s.poll(0.0)
    assert due.fetches == ()
    assert due.questions == (EpochQuestion(m, due.questions[0].question),)
    q = due.questions[0].question
    assert (q.stream, q.partition, q.leader_epoch, q.current_epoch, q.created) == ("a", 0, 2, 3, 7)
    assert s.poll(0.0).questions == (), "asked once"


def test_a_partition_that_joins_supersedes_the_request_out_and_only_the_newest_answer_counts() -> None:
    s = FetchScheduler("f", "l", IDLE)
    a = joined(s, "a")
    (first,) = s.poll(0.0).fetches
    joined(s, "b")
    (second,) = s.poll(0.1).fetches
    assert [p.stream for p in second.request.partitions] == ["a", "b"], "a rides again, not waited for"
    assert second.number > first.number
    assert s.answered(first, [data("a")]) == [], "superseded"
    applied = s.answered(second, [data("a"), data("b")])
    assert [x.member.key for x in applied] == [("a", 0), ("b", 0)]
    assert applied[0].member is a and applied[0].sent == Fetch(0, 3)
    assert s.answered(second, [data("a")]) == [], "a duplicate answer counts once"


def test_a_partition_left_out_of_the_answer_is_due_again_and_one_that_left_is_ignored() -> None:
    s = FetchScheduler("f", "l", IDLE)
    a = joined(s, "a")
    joined(s, "b")
    (out,) = s.poll(0.0).fetches
    s.leave(("b", 0))
    assert s.answered(out, [data("b")]) == [], "b left; a was left out of the (full) answer"
    assert a.pending == Fetch(0, 3) and a.due == 0.0
    (again,) = s.poll(0.0).fetches
    assert [p.stream for p in again.request.partitions] == ["a"]


def test_sleep_notifications_and_the_idle_wait() -> None:
    s = FetchScheduler("f", "l", IDLE)
    a = joined(s, "a", leo=1)
    (out,) = s.poll(0.0).fetches
    (applied,) = s.answered(out, [data("a", hw=0)])
    actions = a.core.fetched(3, 0, applied.sent.offset, True, 0)
    assert Sleep(IDLE) in actions
    assert s.schedule(a, actions, now=1.0) == [SetHighWatermark(0)], "the shell moves the HW"
    assert a.sleeping
    idle = s.poll(2.0)
    assert idle.fetches == () and idle.wait == IDLE - 1.0
    assert s.notify([("a", 0), ("unknown", 0)])
    (woken,) = s.poll(2.0).fetches
    assert [p.offset for p in woken.request.partitions] == [1]
    assert not s.notify([("a", 0)]), "already out: nothing to wake"
    (applied,) = s.answered(woken, [data("a", hw=0)])
    s.schedule(a, a.core.fetched(3, 0, applied.sent.offset, True, 0), now=3.0)
    assert a.sleeping and a.due == 0.0, "a notification during the fetch: due at once, not after the idle wait"
    assert s.poll(3.0).fetches, "fetches again at once"


def test_a_sleeping_partition_rides_along_when_another_fetches() -> None:
    s = FetchScheduler("f", "l", IDLE)
    a = joined(s, "a")
    (out,) = s.poll(0.0).fetches
    (applied,) = s.answered(out, [data("a")])
    s.schedule(a, a.core.fetched(3, 0, applied.sent.offset, True, 0), now=0.0)
    joined(s, "b")
    (both,) = s.poll(0.5).fetches
    assert [p.stream for p in both.request.partitions] == ["a", "b"]
    assert not a.sleeping


def test_a_failed_request_counts_for_its_current_members_and_retries_after_the_delay() -> None:
    s = FetchScheduler("f", "l", IDLE)
    a = joined(s, "a")
    (out,) = s.poll(0.0).fetches
    (m,) = s.failed(out)
    assert m is a and a.sent is None
    assert s.failed(out) == [], "once"
    s.schedule(a, a.core.failed(0), now=1.0, delay=0.25)
    assert s.poll(1.1).fetches == () and s.poll(1.1).wait is not None
    assert s.poll(1.25).fetches


def test_sessions_split_partitions_that_do_not_fit_one_request() -> None:
    s = FetchScheduler("f", "l", IDLE, max_request_bytes=100)
    a, b, c = joined(s, "a", size=60), joined(s, "b", size=60), joined(s, "c", size=30)
    assert (a.session, b.session, c.session) == (0, 1, 0)
    outs = s.poll(0.0).fetches
    assert [(o.request.session, [p.stream for p in o.request.partitions]) for o in outs] == [
        (0, ["a", "c"]),
        (1, ["b"]),
    ]
    s.leave(("a", 0))
    d = joined(s, "d", size=60)
    assert d.session == 0, "a's room is free again"


def test_a_refusal_is_handed_to_the_shell() -> None:
    s = FetchScheduler("f", "l", IDLE)
    joined(s, "a")
    (out,) = s.poll(0.0).fetches
    refusal = PartitionRefusal("a", 0, FetchError(FetchErrorCode.NOT_LEADER, "no", 4, 0))
    (applied,) = s.answered(out, [refusal])
    assert applied.answer is refusal
