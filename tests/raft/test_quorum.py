"""Quorum helpers against naive definitions (hypothesis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from liftlog.raft.quorum import VoteResult, committed_index, vote_result

names = st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=7, unique=True)


@given(names, st.data())
def test_committed_index_is_largest_index_a_majority_has(voters: list[str], data: st.DataObject) -> None:
    match = {v: data.draw(st.integers(0, 20)) for v in voters}
    got = committed_index(voters, match)
    naive = max(i for i in range(21) if sum(1 for v in voters if match[v] >= i) > len(voters) / 2)
    assert got == naive


@given(names, st.data())
def test_vote_result_matches_counting(voters: list[str], data: st.DataObject) -> None:
    votes: dict[str, bool] = {}
    for v in voters:
        choice = data.draw(st.sampled_from([True, False, None]))
        if choice is not None:
            votes[v] = choice
    votes["outsider"] = True  # votes from non-voters never count
    granted = sum(1 for v in voters if votes.get(v) is True)
    undecided = sum(1 for v in voters if v not in votes)
    majority = len(voters) // 2 + 1
    expected = (
        VoteResult.WON
        if granted >= majority
        else VoteResult.PENDING
        if granted + undecided >= majority
        else VoteResult.LOST
    )
    assert vote_result(voters, votes) is expected


def test_empty_voter_set_never_decides() -> None:
    assert committed_index([], {"a": 5}) == 0
    assert vote_result([], {"a": True}) is VoteResult.PENDING
