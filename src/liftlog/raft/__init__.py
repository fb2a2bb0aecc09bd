"""Raft consensus as a sans-IO core (see ``node`` for the rules, ``types.Ready`` for the driver contract).

A driver owns the clock, the network and the disk::

    storage = DiskStorage.open(directory)                 # or MemoryStorage() in tests: both a RaftStorage
    node = RaftNode("n1", RaftConfig(peers=("n1", "n2", "n3")), state=storage.state(), rng=random.Random(seed))
    every tick:           node.tick()
    on a message:         node.step(msg)
    to propose:           index = node.propose(data)          # or propose_conf_change(ConfChange(...))
    after any of them:    while node.has_ready():
                              rd = node.ready()
                              storage.save(rd)                    # snapshot, entries, hard state: before sending!
                              network.send(rd.messages)
                              state_machine.apply(rd.snapshot, rd.committed)   # then serve rd.read_states
                              node.advance(rd)
    now and then:         storage.compact(node.compact(applied_index, state_machine.dump()))

Modules: ``types`` (messages, entries, Ready), ``log`` (the log view), ``quorum`` (pure
majority math), ``progress`` (leader's per-follower state), ``node`` (the state machine),
``errors``; ``memory`` (``MemoryStorage``, how a Ready is persisted, kept in memory).
``codec``: the binary encoding of messages, entries, hard state and snapshots (wire and disk).
``disk``: ``DiskStorage``, MemoryStorage made durable (WAL, snapshots, hard state; crash recovery).
``storage``: ``RaftStorage``, the contract both keep (mypy checks that they do).
"""

from typing import TYPE_CHECKING

from .codec import (
    CodecError,
    decode_entry,
    decode_hard_state,
    decode_message,
    decode_snapshot,
    encode_entry,
    encode_hard_state,
    encode_message,
    encode_snapshot,
)
from .disk import DiskStorage, RaftStorageError
from .errors import NotLeader, ProposalDropped, RaftError
from .memory import MemoryStorage
from .node import RaftConfig, RaftNode
from .storage import RaftStorage
from .types import (
    ConfChange,
    ConfChangeOp,
    Entry,
    EntryKind,
    HardState,
    Message,
    MessageType,
    PersistedState,
    ReadState,
    Ready,
    Role,
    Snapshot,
)

__all__ = [
    "CodecError",
    "ConfChange",
    "ConfChangeOp",
    "DiskStorage",
    "Entry",
    "EntryKind",
    "HardState",
    "MemoryStorage",
    "Message",
    "MessageType",
    "NotLeader",
    "PersistedState",
    "ProposalDropped",
    "RaftConfig",
    "RaftError",
    "RaftNode",
    "RaftStorage",
    "RaftStorageError",
    "ReadState",
    "Ready",
    "Role",
    "Snapshot",
    "decode_entry",
    "decode_hard_state",
    "decode_message",
    "decode_snapshot",
    "encode_entry",
    "encode_hard_state",
    "encode_message",
    "encode_snapshot",
]


if TYPE_CHECKING:

    def _both_keep_the_contract(memory: MemoryStorage, disk: DiskStorage) -> tuple[RaftStorage, RaftStorage]:
        return memory, disk
