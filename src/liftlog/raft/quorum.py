"""Quorum arithmetic: pure functions over voter sets.

Rules:
- A quorum of ``n`` voters is ``n // 2 + 1``; an empty voter set never reaches quorum
  (commit index 0, vote pending forever).
- The committed index is the largest index that a quorum has matched: sort the match
  indexes descending and take the quorum-th one.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping

__all__ = ["VoteResult", "committed_index", "quorum_size", "vote_result"]


class VoteResult(enum.Enum):
    PENDING = "pending"
    WON = "won"
    LOST = "lost"


def quorum_size(voters: int) -> int:
    return voters // 2 + 1


def committed_index(voters: Collection[str], match: Mapping[str, int]) -> int:
    """Largest index matched by a quorum of ``voters`` (missing voters count as 0)."""
    if not voters:
        return 0
    indexes = sorted((match.get(v, 0) for v in voters), reverse=True)
    return indexes[quorum_size(len(voters)) - 1]


def vote_result(voters: Collection[str], votes: Mapping[str, bool]) -> VoteResult:
    """WON once a quorum granted, LOST once a quorum can no longer grant, else PENDING."""
    if not voters:
        return VoteResult.PENDING
    granted = sum(1 for v in voters if votes.get(v) is True)
    rejected = sum(1 for v in voters if votes.get(v) is False)
    q = quorum_size(len(voters))
    if granted >= q:
        return VoteResult.WON
    if len(voters) - rejected < q:
        return VoteResult.LOST
    return VoteResult.PENDING
