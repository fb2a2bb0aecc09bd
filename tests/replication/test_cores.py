"""The replication cores alone: the leader's HW and ISR decisions, the follower's fetch cycle."""

from __future__ import annotations

import pytest

from liftlog.replication.follower import (
    Append,
    Fetch,
    FollowerReplica,
    FollowerState,
    ReportLeader,
    RequestEpochOffset,
    SetHighWatermark,
    Sleep,
    Truncate,
)
from liftlog.replication.leader import HighWatermark, LeaderReplica, NotifyFollowers, ProposeIsr

S = 1_000_000_000
T0 = 100 * S


def leader(isr: tuple[str, ...] = ("a", "b", "c"), leo: int = 0, hw: int = -1, **kw: int) -> LeaderReplica:
    return LeaderReplica("a", ("a", "b", "c"), isr, 3, leo, hw, T0, 10 * S, **kw)


def proposal(isr: tuple[str, ...], reason: str, decided_against: tuple[str, ...]) -> ProposeIsr:
    """What leader() proposes in its leader epoch 3 while its ISR is ``decided_against``."""
    return ProposeIsr(isr, reason, 3, (("a", "b", "c"), decided_against))


# -- leader --------------------------------------------------------------------


def test_hw_is_the_smallest_leo_in_the_isr_and_never_goes_back() -> None:
    ld = leader()
    assert ld.appended(5, T0) == []  # nobody else has anything yet
    assert ld.fetch("b", 5, 3, T0).actions == ()
    answer = ld.fetch("c", 3, 3, T0)
    assert answer.actions == (HighWatermark(2),) and answer.hw == 2 and not answer.empty
    assert ld.fetch("c", 5, 3, T0).actions == (HighWatermark(4),)
    ld.fetch("c", 4, 3, T0)  # an older fetch arriving late does not pull the HW back
    assert ld.hw == 4


def test_alone_in_the_isr_written_is_committed() -> None:
    ld = leader(isr=("a",))
    assert ld.appended(3, T0) == [HighWatermark(2)]


def test_a_follower_that_stops_catching_up_is_proposed_out_once_per_retry() -> None:
    ld = leader(leo=0)
    ld.appended(10, T0)
    ld.fetch("b", 10, 3, T0 + S)
    ld.fetch("c", 4, 3, T0 + S)  # c fetches but stays behind
    assert ld.tick(T0 + 10 * S) == []
    proposed = ld.tick(T0 + 11 * S)
    assert len(proposed) == 1 and isinstance(proposed[0], ProposeIsr)
    assert proposed[0].isr == ("a", "b") and "c not caught up" in proposed[0].reason
    ld.fetch("b", 10, 3, T0 + 11 * S)  # b keeps up
    assert ld.tick(T0 + 11 * S + 1) == []  # not again before the retry interval
    ld.fetch("b", 10, 3, T0 + 13 * S)
    assert ld.tick(T0 + 13 * S) == [proposal(("a", "b"), "c not caught up for 13000 ms", ("a", "b", "c"))]
    # The controller commits it: c no longer holds the HW back.
    assert ld.isr_committed(("a", "b"), T0 + 13 * S) == [HighWatermark(9)]
    assert ld.tick(T0 + 14 * S) == []
    assert ld.lag("c") == 6 and ld.lag("a") == 0


def test_lagging_by_messages_when_configured() -> None:
    ld = leader(max_lag_messages=100)
    ld.appended(500, T0)
    ld.fetch("b", 500, 3, T0)
    ld.fetch("c", 350, 3, T0)
    assert ld.tick(T0 + S) == [proposal(("a", "b"), "c is 150 messages behind", ("a", "b", "c"))]


def test_a_follower_back_at_the_leo_is_proposed_in_again_in_replica_order() -> None:
    ld = leader(isr=("a", "b"), leo=7, hw=6)
    assert ld.fetch("c", 5, 3, T0).actions == ()
    answer = ld.fetch("c", 7, 3, T0)
    assert answer.empty and answer.actions == (proposal(("a", "b", "c"), "c caught up at offset 7", ("a", "b")),)
    assert ld.fetch("c", 7, 2, T0).actions == ()  # a fetch from a stale epoch does not count


def test_a_follower_proposed_into_the_isr_holds_the_hw_until_the_change_is_committed() -> None:
    """KIP-497's maximal ISR. Found by the cluster simulation (seed 241): the leader alone in the ISR kept
    committing while b's admission was in flight; b then entered the ISR without those messages, was
    elected when the leader died, and the committed messages were gone."""
    ld = leader(isr=("a",), leo=4, hw=3)
    answer = ld.fetch("b", 4, 3, T0)  # b caught up: its admission is proposed
    assert proposal(("a", "b"), "b caught up at offset 4", ("a",)) in answer.actions
    assert ld.appended(8, T0) == [NotifyFollowers(("b",))], (
        "committing 4..7 would leave b, in sync by then, without them"
    )
    assert ld.fetch("b", 6, 3, T0).actions == (HighWatermark(5),)
    assert ld.isr_committed(("a", "b"), T0) == []
    assert ld.fetch("b", 8, 3, T0).actions == (HighWatermark(7),)


def test_a_proposed_follower_holds_the_hw_until_a_later_proposal_that_leaves_it_out_commits() -> None:
    """Found by the cluster simulation (seed 239): a leader cut off from the controller dropped a lagging
    follower whose admission had in fact committed; that follower was then elected without the messages
    the leader had acknowledged meanwhile. Lagging alone proves nothing: only a later commit does."""
    ld = leader(isr=("a", "b"), leo=4, hw=3)
    ld.fetch("b", 4, 3, T0)
    ld.fetch("c", 4, 3, T0)  # c's admission is proposed ...
    ld.appended(8, T0)
    ld.fetch("b", 8, 3, T0)
    assert ld.tick(T0 + 11 * S) == [proposal(("a",), "b not caught up for 11000 ms", ("a", "b"))]
    assert ld.hw == 3, "... and c, silent since, may be in the ISR already: it holds the HW"
    assert ld.isr_committed(("a", "b"), T0 + 11 * S) == [], "an ISR proposed before c's admission settles nothing"
    assert ld.isr_committed(("a",), T0 + 11 * S) == [HighWatermark(7)], "proposed after: c's admission is dead"


def test_a_stale_shrink_is_not_retried_as_the_readmission_of_a_lagging_follower() -> None:
    """Found by the cluster simulation (seed 2100): a shrink proposed against an ISR that then changed was
    retried as is and re-admitted a follower that had fallen behind the HW; it was later elected."""
    ld = leader(leo=4, hw=3)
    ld.fetch("b", 4, 3, T0)
    ld.fetch("c", 4, 3, T0)
    assert ld.tick(T0 + 11 * S) == [
        proposal(("a",), "b not caught up for 11000 ms; c not caught up for 11000 ms", ("a", "b", "c"))
    ]
    ld.fetch("b", 4, 3, T0 + 11 * S)  # b is back ...
    assert ld.tick(T0 + 12 * S) == [proposal(("a", "b"), "c not caught up for 12000 ms", ("a", "b", "c"))]
    ld.appended(8, T0 + 12 * S)  # ... and behind again
    assert ld.isr_committed(("a",), T0 + 12 * S) == [HighWatermark(7)]  # the first shrink is what committed
    later = ld.tick(T0 + 14 * S)
    assert not any(isinstance(a, ProposeIsr) and "b" in a.isr for a in later), later
    answer = ld.fetch("b", 8, 3, T0 + 14 * S)  # caught up for real: admitted the proper way
    assert proposal(("a", "b"), "b caught up at offset 8", ("a",)) in answer.actions


def test_a_joiner_that_dies_is_admitted_and_then_dropped_rather_than_holding_the_hw_for_ever() -> None:
    ld = leader(isr=("a", "b"), leo=4, hw=3)
    ld.fetch("b", 4, 3, T0)
    assert proposal(("a", "b", "c"), "c caught up at offset 4", ("a", "b")) in ld.fetch("c", 4, 3, T0).actions
    ld.appended(6, T0)  # c goes silent; its admission is lost on the way
    ld.fetch("b", 6, 3, T0 + S)
    retry = ld.tick(T0 + 2 * S)
    assert retry == [proposal(("a", "b", "c"), "retrying an ISR change the metadata does not show yet", ("a", "b"))]
    # An ISR change this leader did not propose (a reassignment completing, say) overtakes it: proposed again.
    again = ld.isr_committed(("a",), T0 + 2 * S)
    assert proposal(("a", "c"), "c waiting to be admitted", ("a",)) in again
    ld.isr_committed(("a", "c"), T0 + 3 * S)  # admitted: now the lag check can take it out
    assert ld.tick(T0 + 14 * S) == [proposal(("a",), "c not caught up for 11000 ms", ("a", "c"))]


def test_waiting_followers_are_notified_at_the_next_append() -> None:
    ld = leader(leo=4, hw=3)
    ld.fetch("b", 4, 3, T0)
    ld.fetch("c", 2, 3, T0)
    assert ld.appended(6, T0) == [NotifyFollowers(("b",))]
    assert ld.appended(7, T0) == []  # b has not fetched since: one notification is enough


def test_bad_fetches_are_refused() -> None:
    ld = leader(leo=4)
    with pytest.raises(ValueError, match="past the log end offset 4"):
        ld.fetch("b", 5, 3, T0)
    with pytest.raises(ValueError, match="x is not a follower"):
        ld.fetch("x", 0, 3, T0)
    with pytest.raises(ValueError, match="not a replica"):
        LeaderReplica("z", ("a", "b"), ("a",), 1, 0, -1, T0, S)


# -- follower ------------------------------------------------------------------


def follower(leo: int = 10, hw: int = 5, latest_epoch: int | None = 2, **kw: object) -> FollowerReplica:
    return FollowerReplica("b", "a", 3, leo, hw, latest_epoch, T0, idle_wait_s=2.0, leader_timeout_ns=5 * S, **kw)


def test_a_follower_truncates_by_epoch_before_fetching() -> None:
    f = follower()
    assert f.start() == [RequestEpochOffset(2)]
    assert f.state is FollowerState.TRUNCATING
    # The leader's epoch 2 ended at 8; locally it ends at 10: keep 0..7.
    assert f.epoch_offset(2, 8, 10) == [Truncate(8), Fetch(8, 3)]
    assert f.hw == 5 and f.leo == 8
    assert f.epoch_offset(2, 8, 10) == []  # a duplicate answer is ignored


def test_truncation_takes_the_smaller_end_and_an_unknown_epoch_truncates_everything() -> None:
    f = follower()
    f.start()
    assert f.epoch_offset(1, 12, 6) == [Truncate(6), Fetch(6, 3)]  # local end of epoch 1 is smaller
    g = follower()
    g.start()
    assert g.epoch_offset(-1, -1, 0) == [Truncate(0), Fetch(0, 3)]
    assert g.hw == -1
    empty = follower(leo=0, latest_epoch=None)
    assert empty.start() == [Fetch(0, 3)]


def test_fetch_cycle_appends_moves_the_hw_and_sleeps_when_caught_up() -> None:
    f = follower()
    f.start()
    f.epoch_offset(2, 10, 10)
    assert f.fetched(3, 12, 10, False, T0) == [Append(10)]
    assert f.appended(14, T0) == [SetHighWatermark(12), Fetch(14, 3)]
    assert f.fetched(3, 13, 14, True, T0) == [SetHighWatermark(13), Sleep(2.0)]
    assert f.state is FollowerState.IDLE
    assert f.wake() == [Fetch(14, 3)]
    assert f.wake() == []  # already fetching


def test_responses_from_another_epoch_or_offset_are_dropped() -> None:
    f = follower(latest_epoch=None, leo=0)
    f.start()
    assert f.fetched(4, 10, 0, False, T0) == []  # another leader epoch
    assert f.fetched(3, 10, 2, False, T0) == [Fetch(0, 3)]  # not where we are: ask again


def test_a_silent_leader_is_reported_once_per_timeout() -> None:
    f = follower(latest_epoch=None, leo=0)
    f.start()
    assert f.failed(T0 + S) == [Fetch(0, 3)]
    assert f.failed(T0 + 5 * S) == [ReportLeader("a", 3, 5 * S), Fetch(0, 3)]
    assert f.failed(T0 + 6 * S) == [Fetch(0, 3)]
    assert f.failed(T0 + 10 * S)[0] == ReportLeader("a", 3, 10 * S)
    f.fetched(3, -1, 0, True, T0 + 11 * S)  # it answers again
    assert f.failed(T0 + 12 * S) == [Fetch(0, 3)]


# -- leader lease ----------------------------------------------------------------

LEASE = 1 * S


def test_a_leader_acknowledges_only_until_its_lease_runs_out() -> None:
    ld = leader(lease_ns=LEASE, lease_until=5 * S)
    assert ld.may_ack(5 * S - 1)
    assert not ld.may_ack(5 * S), "the end of the lease is exclusive"
    assert ld.lease_left(4 * S) == S and ld.lease_left(6 * S) == 0


def test_a_renewal_counts_from_when_its_request_was_sent_not_when_its_answer_came() -> None:
    ld = leader(lease_ns=LEASE)
    assert not ld.may_ack(0), "a leader with no renewal yet acknowledges nothing"
    ld.renewed(asked_at=10 * S)  # the answer came at, say, 10.8 s: the lease still ends at 11 s
    assert ld.may_ack(11 * S - 1) and not ld.may_ack(11 * S)


def test_a_late_answer_to_an_older_request_never_shortens_the_lease() -> None:
    ld = leader(lease_ns=LEASE)
    ld.renewed(asked_at=10 * S)
    ld.renewed(asked_at=9 * S)  # asked earlier, answered later
    assert ld.lease_until == 11 * S


def test_a_lapsed_lease_holds_again_after_a_renewal() -> None:
    ld = leader(lease_ns=LEASE, lease_until=2 * S)
    assert not ld.may_ack(3 * S)
    ld.renewed(asked_at=3 * S)
    assert ld.may_ack(3 * S) and ld.may_ack(4 * S - 1)


def test_without_a_lease_a_leader_always_acknowledges() -> None:
    ld = leader()
    ld.renewed(asked_at=0)
    assert ld.may_ack(10**18) and ld.lease_left(0) is None


def test_follower_fetches_do_not_renew_the_lease() -> None:
    # A follower that reaches us may be the one a controller that cannot reach us is about to elect.
    ld = leader(lease_ns=LEASE, lease_until=T0 + S)
    ld.appended(5, T0)
    ld.fetch("b", 5, 3, T0 + S // 2)
    ld.fetch("c", 5, 3, T0 + S // 2)
    assert ld.lease_until == T0 + S and not ld.may_ack(T0 + S)
