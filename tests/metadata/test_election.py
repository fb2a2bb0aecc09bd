"""The controller's election decisions: who reports, who is ranked first, what happens on timeouts."""

from __future__ import annotations

from liftlog.metadata import PartitionMeta
from liftlog.metadata.election import Candidate, Elections, LeaderReports, NoCandidate, rank_candidates

S = 1_000_000_000


def partition(isr: list[str] | None = None, leader: str = "a") -> PartitionMeta:
    return PartitionMeta(
        "orders", 0, "orders", leader, ["a", "b", "c", "d"], isr or ["a", "b", "c", "d"], leader_epoch=4, epoch=9
    )


def test_candidates_are_live_in_sync_followers_with_the_smallest_lag_first() -> None:
    p = partition()
    leos = {"b": 10, "c": 12, "d": 12}
    assert rank_candidates(p, {"a", "b", "c", "d"}, leos) == [Candidate("c"), Candidate("d"), Candidate("b")]
    assert rank_candidates(p, {"b", "d"}, leos) == [Candidate("d"), Candidate("b")]  # c is dead, a is the old leader
    assert rank_candidates(p, {"b", "c"}, {}) == [Candidate("b"), Candidate("c")]  # unknown lag: replica order


def test_out_of_sync_replicas_only_with_unclean_election() -> None:
    p = partition(isr=["a", "b"])
    assert rank_candidates(p, {"c", "d"}, {"c": 3, "d": 5}) == []
    assert rank_candidates(p, {"c", "d"}, {"c": 3, "d": 5}, unclean=True) == [
        Candidate("d", unclean=True),
        Candidate("c", unclean=True),
    ]
    assert rank_candidates(p, {"b", "d"}, {}, unclean=True) == [Candidate("b")]  # clean first


def test_a_majority_of_in_sync_followers_within_the_window_is_needed() -> None:
    reports = LeaderReports(window_ns=5 * S)
    p = partition()  # three in-sync followers: two must agree
    assert not reports.report(p, "b", 9, 4, 100 * S)
    assert not reports.report(p, "b", 9, 4, 101 * S)  # the same follower twice is one report
    assert not reports.report(p, "c", 9, 4, 107 * S)  # b's report is too old by now
    assert reports.report(p, "d", 9, 4, 108 * S)


def test_reports_about_another_state_or_from_outsiders_do_not_count() -> None:
    reports = LeaderReports(window_ns=5 * S)
    p = partition(isr=["a", "b", "c"])
    assert not reports.report(p, "b", 8, 4, S)  # older partition epoch
    assert not reports.report(p, "b", 9, 3, S)  # older leader epoch
    assert not reports.report(p, "d", 9, 4, S)  # not in sync
    assert not reports.report(p, "a", 9, 4, S)  # the leader itself
    assert not reports.report(p, "b", 9, 4, S)
    assert reports.report(p, "c", 9, 4, S)
    lone = partition(isr=["a", "b"])
    assert LeaderReports(S).report(lone, "b", 9, 4, S)  # one follower is a majority of one


def test_an_election_tries_candidates_in_turn_then_goes_offline() -> None:
    elections = Elections(confirm_timeout_ns=2 * S)
    key = ("orders", 0)
    assert elections.begin(key, [Candidate("c"), Candidate("b")], 10 * S) == Candidate("c")
    assert key in elections
    assert elections.tick(11 * S) == []
    assert elections.tick(12 * S) == [(key, Candidate("b"))]
    assert not elections.confirmed(key, "c")  # too late: b is the candidate now
    assert elections.tick(14 * S) == [(key, NoCandidate("no eligible replica left (b did not confirm)"))]
    assert key not in elections
    assert elections.begin(key, [], 20 * S) == NoCandidate("no eligible replica left")


def test_a_confirmation_from_the_current_candidate_ends_the_election() -> None:
    elections = Elections(confirm_timeout_ns=2 * S)
    key = ("orders", 0)
    elections.begin(key, [Candidate("c"), Candidate("b")], 0)
    assert elections.confirmed(key, "c")
    assert key not in elections and elections.tick(10 * S) == []
    elections.begin(key, [Candidate("b")], 0)
    elections.abandon(key)
    assert elections.tick(10 * S) == []


def test_an_offline_partitions_last_leader_may_lead_again_when_it_returns() -> None:
    p = partition(isr=["a"])  # a was the last in-sync replica, and the leader
    assert rank_candidates(p, {"a", "b"}, {}) == []
    assert rank_candidates(p, {"a", "b"}, {}, leader_may_return=True) == [Candidate("a")]
