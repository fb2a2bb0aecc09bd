"""Which fetches a follower server sends to one leader server, and when (seed 002).

Every partition a server follows on one leader shares that leader's fetch scheduler. Each
partition's ``FollowerReplica`` says what it wants next (ask where an epoch ends, fetch from an
offset, sleep); the scheduler turns those wants into requests:

- an epoch question goes out on its own, as soon as it is due;
- when any partition has a fetch due, one ``FetchRequest`` per session goes out carrying every
  partition of that session that is due, asleep (so the leader can answer the moment one of them
  has data) or already out (the earlier request is superseded, not waited for: the leader may be
  holding it, and a partition that just joined must not wait behind it);
- an answer counts only for the partitions whose newest request it answers;
- partitions are packed into sessions of at most ``max_request_bytes`` of request each.

Sans-IO: time comes in as seconds of whatever monotonic clock the shell keeps (the server's loop
time, the simulation's ticks), and the shell sends the requests and performs what the followers'
answers ask of the log. The simulation drives this same class.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .follower import Fetch, FollowerAction, FollowerReplica, RequestEpochOffset, Sleep
from .protocol import EpochOffsetRequest, FetchRequest, PartitionData, PartitionFetch, PartitionRefusal

__all__ = ["Applied", "EpochQuestion", "FetchOut", "FetchScheduler", "Member", "PartitionKey", "Round"]

PartitionKey = tuple[str, int]

#: Most bytes of partition entries in one fetch request: more partitions go in further sessions.
REQUEST_MAX_BYTES = 256 << 10


@dataclass(slots=True, eq=False)
class Member:
    """One followed partition's place in the schedule."""

    key: PartitionKey
    core: FollowerReplica
    #: The stream's creation timestamp, which every request for it carries.
    created: int
    #: Bytes its entry adds to a fetch request (``protocol.fetch_entry_size``).
    size: int
    session: int = 0
    #: The request to send next, None while asleep or in flight.
    pending: Fetch | RequestEpochOffset | None = None
    sleeping: bool = False
    #: A notification arrived while a request was out: do not sleep after its (empty) answer.
    notified: bool = False
    due: float = 0.0
    #: The fetch out for this partition and the number of the newest request carrying it.
    sent: Fetch | None = None
    request: int = 0


@dataclass(frozen=True, slots=True)
class EpochQuestion:
    member: Member
    question: EpochOffsetRequest


@dataclass(frozen=True, slots=True)
class FetchOut:
    """A fetch request to send; hand it back with its answer (``answered``) or failure (``failed``)."""

    number: int
    request: FetchRequest
    members: tuple[Member, ...]


@dataclass(frozen=True, slots=True)
class Round:
    questions: tuple[EpochQuestion, ...]
    fetches: tuple[FetchOut, ...]
    #: Nothing was fetched: look again after this many seconds, or sooner when woken.
    wait: float | None


@dataclass(frozen=True, slots=True)
class Applied:
    """An answer that counts for ``member``: give it to ``member.core.fetched`` (or handle the refusal)."""

    member: Member
    sent: Fetch
    answer: PartitionData | PartitionRefusal


class FetchScheduler:
    def __init__(
        self, replica_id: str, leader: str, idle_wait: float, max_request_bytes: int = REQUEST_MAX_BYTES
    ) -> None:
        self.replica_id = replica_id
        self.leader = leader
        self.idle_wait = idle_wait
        self.max_request_bytes = max_request_bytes
        self.members: dict[PartitionKey, Member] = {}
        #: Numbers the fetch requests, so an answer is matched with the newest request of each partition.
        self.requests = 0
        #: Bytes each session's request takes (``max_request_bytes`` at most, unless one partition is larger).
        self.session_bytes: list[int] = []

    # -- membership ------------------------------------------------------

    def join(self, key: PartitionKey, core: FollowerReplica, created: int, size: int) -> Member:
        """Add a partition (replacing any earlier member for it); then ``schedule`` its ``core.start()``."""
        self.leave(key)
        session = next((i for i, used in enumerate(self.session_bytes) if used + size <= self.max_request_bytes), None)
        if session is None:
            session = len(self.session_bytes)
            self.session_bytes.append(0)
        self.session_bytes[session] += size
        member = self.members[key] = Member(key, core, created, size, session)
        return member

    def leave(self, key: PartitionKey) -> Member | None:
        member = self.members.pop(key, None)
        if member is not None:
            self.session_bytes[member.session] -= member.size
        return member

    def current(self, member: Member) -> bool:
        """Whether ``member`` still follows here (no later ``join`` or ``leave`` replaced it)."""
        return self.members.get(member.key) is member

    # -- what the followers want -----------------------------------------

    def schedule(
        self, member: Member, actions: Iterable[FollowerAction], now: float, delay: float = 0.0
    ) -> list[FollowerAction]:
        """Keep ``member``'s next request or sleep from ``actions``; the rest are the shell's to perform
        (``Truncate``, ``SetHighWatermark``, ``ReportLeader``), in order. ``delay``: send no sooner."""
        local: list[FollowerAction] = []
        for action in actions:
            if isinstance(action, Sleep):
                member.sleeping = True
                member.due = 0.0 if member.notified else now + action.seconds
                member.notified = False
            elif isinstance(action, Fetch | RequestEpochOffset):
                member.pending = action
                member.due = now + delay if delay else 0.0  # 0: due in the next round
            else:
                local.append(action)
        return local

    def notify(self, keys: Iterable[PartitionKey]) -> bool:
        """The leader announced new data for ``keys``; True when a sleeping partition is now due."""
        woke = False
        for key in keys:
            member = self.members.get(key)
            if member is None:
                continue
            if member.sleeping:
                member.due = 0.0
                woke = True
            else:
                # The leader notifies once per wait: an empty answer already on its way must not
                # put the partition to sleep past the data this notification announces.
                member.notified = True
        return woke

    # -- rounds ----------------------------------------------------------

    def poll(self, now: float) -> Round:
        """What to send now; ``wait`` says when to look again if nothing was fetched."""
        for m in self.members.values():
            if m.sleeping and m.due <= now:
                m.sleeping = False
                self.schedule(m, m.core.wake(), now)
        questions: list[EpochQuestion] = []
        fetch_due = False
        for m in self.members.values():
            if m.pending is None or m.due > now:
                continue
            if isinstance(m.pending, RequestEpochOffset):
                action, m.pending = m.pending, None
                question = EpochOffsetRequest(m.key[0], m.key[1], action.epoch, m.core.leader_epoch, m.created)
                questions.append(EpochQuestion(m, question))
            else:
                fetch_due = True
        if fetch_due:
            return Round(tuple(questions), self._next_fetches(now), None)
        waits = [m.due - now for m in self.members.values() if m.due > now]
        return Round(tuple(questions), (), min(waits, default=self.idle_wait))

    def _next_fetches(self, now: float) -> tuple[FetchOut, ...]:
        due = {m.session for m in self.members.values() if isinstance(m.pending, Fetch) and m.due <= now}
        sessions: dict[int, list[Member]] = {}
        for m in self.members.values():
            if m.session not in due:
                continue
            woke = m.sleeping
            if woke:
                m.sleeping = False
                self.schedule(m, m.core.wake(), now)
            if isinstance(m.pending, Fetch) and (woke or m.due <= now):
                m.sent, m.pending = m.pending, None
                m.notified = False  # this request sees whatever was announced before it
            if m.sent is not None:
                sessions.setdefault(m.session, []).append(m)
        out = []
        for session, members in sessions.items():
            self.requests += 1
            entries = []
            for m in members:
                assert m.sent is not None
                m.request = self.requests
                entries.append(PartitionFetch(m.key[0], m.key[1], m.sent.offset, m.sent.leader_epoch, m.created))
            request = FetchRequest(self.replica_id, session, tuple(entries))
            out.append(FetchOut(self.requests, request, tuple(members)))
        return tuple(out)

    # -- answers ---------------------------------------------------------

    def _counts(self, member: Member, number: int) -> bool:
        return self.current(member) and member.request == number and member.sent is not None

    def answered(self, out: FetchOut, answers: Iterable[PartitionData | PartitionRefusal]) -> list[Applied]:
        """The answers that count: for partitions still here whose newest request ``out`` is. A
        partition the leader left out (the response was full) is due again at once."""
        by_key = {(a.stream, a.partition): a for a in answers}
        applied = []
        for m in out.members:
            if not self._counts(m, out.number):
                continue  # left, or carried by a newer request whose answer counts instead
            sent, m.sent = m.sent, None
            assert sent is not None
            answer = by_key.get(m.key)
            if answer is None:
                m.pending, m.due = sent, 0.0
                continue
            applied.append(Applied(m, sent, answer))
        return applied

    def failed(self, out: FetchOut) -> list[Member]:
        """``out`` got no answer: the partitions it still counts for, to be told ``core.failed``."""
        failed = []
        for m in out.members:
            if self._counts(m, out.number):
                m.sent = None
                failed.append(m)
        return failed
