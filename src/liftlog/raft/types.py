"""Wire and storage types shared by the raft core and its drivers.

Rules:
- Every type here is a frozen dataclass or an enum: values, never state.
- ``Message`` is one struct for every message type (like etcd's ``raftpb.Message``);
  the fields a type uses are listed in ``MessageType``'s docstring. Unused fields keep
  their defaults.
- ``Ready`` carries the ordering rule the driver must follow (see its docstring).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "ConfChange",
    "ConfChangeOp",
    "Entry",
    "EntryKind",
    "HardState",
    "Message",
    "MessageType",
    "PersistedState",
    "ReadState",
    "Ready",
    "Role",
    "Snapshot",
]


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class EntryKind(enum.Enum):
    NORMAL = 0
    CONF_CHANGE = 1
    NOOP = 2


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry. ``data`` is a ``ConfChange.encode()`` for CONF_CHANGE entries."""

    term: int
    index: int
    kind: EntryKind = EntryKind.NORMAL
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class HardState:
    """What must be durable before any message of the same Ready is sent."""

    term: int = 0
    vote: str | None = None
    commit: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Application state up to and including ``index``; ``voters`` is the membership at ``index``."""

    index: int
    term: int
    voters: tuple[str, ...]
    data: bytes = b""


class ConfChangeOp(enum.Enum):
    ADD = "add"
    REMOVE = "remove"


@dataclass(frozen=True, slots=True)
class ConfChange:
    """A single-server membership change: ``ADD node`` or ``REMOVE node``."""

    op: ConfChangeOp
    node: str

    def encode(self) -> bytes:
        return f"{self.op.value}:{self.node}".encode()

    @classmethod
    def decode(cls, data: bytes) -> ConfChange:
        """The change ``encode`` wrote; ValueError naming the problem for anything else."""
        try:
            op, sep, node = data.decode().partition(":")
        except UnicodeDecodeError as exc:
            raise ValueError(f"malformed conf change {data!r}: not UTF-8 ({exc.reason})") from None
        if not sep or not node:
            raise ValueError(f"malformed conf change {data!r}")
        try:
            kind = ConfChangeOp(op)
        except ValueError:
            raise ValueError(f"malformed conf change {data!r}: unknown operation {op!r}") from None
        return cls(kind, node)


class MessageType(enum.Enum):
    """Message types and the ``Message`` fields each one uses.

    APPEND          index/log_term (entry preceding ``entries``), entries, commit
    APPEND_RESP     index (last matching index), reject, reject_hint + log_term (follower's guess)
    PRE_VOTE, VOTE  index/log_term (candidate's last entry), context=b"transfer" when forced
    *_VOTE_RESP     reject
    HEARTBEAT       commit (capped at the follower's match), context (read-index round)
    HEARTBEAT_RESP  context (echoed)
    SNAPSHOT        snapshot
    TIMEOUT_NOW     (none): campaign now, skipping PreVote and leases
    READ_INDEX      context (follower forwards a read to the leader)
    READ_INDEX_RESP index (read index), context
    """

    APPEND = "append"
    APPEND_RESP = "append-resp"
    PRE_VOTE = "pre-vote"
    PRE_VOTE_RESP = "pre-vote-resp"
    VOTE = "vote"
    VOTE_RESP = "vote-resp"
    HEARTBEAT = "heartbeat"
    HEARTBEAT_RESP = "heartbeat-resp"
    SNAPSHOT = "snapshot"
    TIMEOUT_NOW = "timeout-now"
    READ_INDEX = "read-index"
    READ_INDEX_RESP = "read-index-resp"


@dataclass(frozen=True, slots=True)
class Message:
    type: MessageType
    src: str
    dst: str
    term: int
    log_term: int = 0
    index: int = 0
    entries: tuple[Entry, ...] = ()
    commit: int = 0
    reject: bool = False
    reject_hint: int = 0
    snapshot: Snapshot | None = None
    context: bytes = b""


@dataclass(frozen=True, slots=True)
class ReadState:
    """A linearizable read may be served once the local applied index reaches ``index``."""

    index: int
    context: bytes


@dataclass(frozen=True, slots=True)
class PersistedState:
    """Exactly what a driver reloads after a crash: hard state, snapshot, entries after it."""

    hard_state: HardState = HardState()
    snapshot: Snapshot | None = None
    entries: tuple[Entry, ...] = ()


@dataclass(frozen=True, slots=True)
class Ready:
    """A batch of work from ``RaftNode.ready()``; hand it back to ``advance()`` when done.

    Ordering rule (Raft thesis §3.8 / etcd ``Ready``): the driver must, in this order,
      1. persist ``snapshot`` (it replaces the whole log: drop every stored entry),
      2. persist ``entries`` (the first one may overwrite: drop stored entries with
         index >= entries[0].index, then append),
      3. persist ``hard_state`` (when not None),
    and only then
      4. send ``messages`` (a vote or an append acknowledgement promises durability),
      5. apply ``snapshot`` then ``committed`` to the state machine in order,
      6. serve ``read_states`` once applied index >= their index,
      7. call ``advance(ready)``.
    A crash anywhere before step 4 loses nothing anyone was told about.
    """

    hard_state: HardState | None = None
    entries: list[Entry] = field(default_factory=list)
    snapshot: Snapshot | None = None
    messages: list[Message] = field(default_factory=list)
    committed: list[Entry] = field(default_factory=list)
    read_states: list[ReadState] = field(default_factory=list)
