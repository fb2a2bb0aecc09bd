"""The leader's queue of pending ReadIndex requests (etcd's ``readOnly``).

Rules:
- A request records the commit index when it arrived and who asked (the leader itself or
  a follower that forwarded it).
- It is answered once a quorum of voters acknowledged a heartbeat carrying its context or
  the context of any *later* request: leadership confirmed after the later request was
  queued was also held when the earlier one was.
- Requests are answered in arrival order; a leader that steps down drops them all.
- Not shared between tasks; owned by one ``RaftNode``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from . import quorum

__all__ = ["PendingReads", "ReadRequest"]


@dataclass(slots=True)
class ReadRequest:
    index: int
    context: bytes
    requester: str
    acks: set[str] = field(default_factory=set)


class PendingReads:
    def __init__(self) -> None:
        self._queue: list[ReadRequest] = []

    def __bool__(self) -> bool:
        return bool(self._queue)

    def add(self, index: int, context: bytes, requester: str, leader: str) -> None:
        self._queue.append(ReadRequest(index, context, requester, {leader}))

    def last_context(self) -> bytes:
        """Context to piggyback on a heartbeat (b"" when nothing is pending)."""
        return self._queue[-1].context if self._queue else b""

    def ack(self, context: bytes, voter: str, voters: Collection[str]) -> list[ReadRequest]:
        """Record ``voter``'s acknowledgement of ``context``; return the requests now confirmed."""
        for k, req in enumerate(self._queue):
            if req.context != context:
                continue
            req.acks.add(voter)
            granted = {v: v in req.acks for v in voters}
            if quorum.vote_result(voters, granted) is not quorum.VoteResult.WON:
                return []
            done, self._queue = self._queue[: k + 1], self._queue[k + 1 :]
            return done
        return []

    def clear(self) -> None:
        self._queue = []
