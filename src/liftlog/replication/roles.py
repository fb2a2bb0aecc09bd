"""What a hosted replica does, decided from the committed metadata: lead, follow, stand by, confirm.

The metadata Raft group names each partition's leader; every server hosting a replica reads
that and acts. The rules are here, once, so that the server's stream manager and the
whole-cluster simulation (``tests/sim/cluster.py``) run the same decisions:

- Only the named leader of an ONLINE partition leads. Mid-election (ELECTION,
  CANDIDATE_FOUND) or OFFLINE, the named leader is the old one: it stands by, neither
  leading nor fetching, until a ChangeLeader names somebody.
- The candidate an election picked stops fetching and confirms, once per partition
  epoch; it stands by until it is named. (Fetching on would change the log end the
  controller chose it for.)
- A restarted server whose metadata may be stale (``may_lead`` False) takes up no
  leadership: a replica it should lead stops taking writes and keeps its old role
  until the metadata is known current.
- Everybody else follows the named leader in its leader epoch.
- A leader whose ISR or replicas changed in the metadata hears of it
  (``SyncMembership``); its ISR proposals go to the controller only while the metadata
  still names it in the epoch it leads (:func:`isr_change`).

Sans-IO: metadata and the replica's last role in, the new role and actions out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from liftlog.metadata.model import PartitionMeta, PartitionState
from liftlog.metadata.protocol import IsrChange

from .leader import ProposeIsr

__all__ = [
    "ConfirmCandidacy",
    "Follow",
    "Lead",
    "ReplicaRole",
    "RoleAction",
    "RoleDecision",
    "RoleKind",
    "StandBy",
    "SyncMembership",
    "decide_role",
    "isr_change",
]


class RoleKind(enum.Enum):
    LEAD = "lead"
    FOLLOW = "follow"
    STAND_BY = "stand by"


@dataclass(frozen=True, slots=True)
class ReplicaRole:
    """What a replica was last set up as: its role, for which leader and leader epoch."""

    kind: RoleKind
    leader: str
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class ConfirmCandidacy:
    """Stop fetching, and tell the controller this replica is ready to lead (partition ``epoch``)."""

    epoch: int


@dataclass(frozen=True, slots=True)
class Lead:
    """Stop following and lead in ``leader_epoch``."""

    leader_epoch: int


@dataclass(frozen=True, slots=True)
class Follow:
    """Stop leading (if it did) and fetch from ``leader`` in ``leader_epoch``."""

    leader: str
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class StandBy:
    """Neither lead nor fetch: the partition is mid-election or offline (``state``)."""

    state: PartitionState


@dataclass(frozen=True, slots=True)
class SyncMembership:
    """Still leading in the same epoch: hand the leader core the metadata's ISR and replicas."""


RoleAction = ConfirmCandidacy | Lead | Follow | StandBy | SyncMembership


@dataclass(frozen=True, slots=True)
class RoleDecision:
    #: The role to remember for the next decision (unchanged when held).
    role: ReplicaRole | None
    #: The partition epoch this replica last confirmed its candidacy at.
    confirmed_at: int
    actions: tuple[RoleAction, ...]
    #: Whether the replica should take writes now (lead, allowed to, and not readonly).
    listen: bool
    #: Named leader, but not allowed to lead yet: the shell stops writes and keeps the old role.
    held: bool = False


def decide_role(
    server_id: str,
    meta: PartitionMeta,
    role: ReplicaRole | None,
    confirmed_at: int,
    *,
    may_lead: bool,
    membership: tuple[tuple[str, ...], tuple[str, ...]] | None = None,
) -> RoleDecision:
    """The actions that bring a replica from ``role`` to what ``meta`` says.

    ``role``: what it was last set up as (None: not set up, e.g. just opened or resumed);
    ``confirmed_at``: the partition epoch of its last candidacy confirmation (-1: none);
    ``membership``: (replicas, ISR) its leader core holds while it leads, else None.
    """
    actions: list[RoleAction] = []
    candidate = meta.state is PartitionState.CANDIDATE_FOUND and meta.candidate == server_id
    if candidate and confirmed_at != meta.epoch:
        confirmed_at = meta.epoch
        actions.append(ConfirmCandidacy(meta.epoch))
    named = meta.leader == server_id
    leads = named and meta.state is PartitionState.ONLINE
    if leads and not may_lead:
        return RoleDecision(role, confirmed_at, tuple(actions), listen=False, held=True)
    if leads:
        wanted = ReplicaRole(RoleKind.LEAD, meta.leader, meta.leader_epoch)
    elif named or candidate:
        wanted = ReplicaRole(RoleKind.STAND_BY, meta.leader, meta.leader_epoch)
    else:
        wanted = ReplicaRole(RoleKind.FOLLOW, meta.leader, meta.leader_epoch)
    if wanted != role:
        if wanted.kind is RoleKind.LEAD:
            actions.append(Lead(meta.leader_epoch))
        elif wanted.kind is RoleKind.FOLLOW:
            actions.append(Follow(meta.leader, meta.leader_epoch))
        else:
            actions.append(StandBy(meta.state))
    elif leads and membership is not None and membership != (tuple(meta.replicas), tuple(meta.isr)):
        actions.append(SyncMembership())
    return RoleDecision(wanted, confirmed_at, tuple(actions), listen=leads and not meta.readonly)


def isr_change(server_id: str, meta: PartitionMeta, proposal: ProposeIsr) -> IsrChange | None:
    """The controller request for a leader core's ISR proposal, or None when it must not be sent.

    The controller checks only the partition epoch, and the metadata (changed in place) is applied
    before the replica's core hears of it. So the proposal goes only while the metadata names this
    replica leader in the proposal's leader epoch and still shows the membership it was decided
    against. Otherwise it would carry an epoch newer than its decision: a deposed leader's
    proposal, or an admission of a replica that a shrink since dropped and the HW then passed.
    The core proposes again once it is in step.
    """
    if meta.leader != server_id or meta.leader_epoch != proposal.leader_epoch:
        return None
    if proposal.membership != (tuple(meta.replicas), tuple(meta.isr)):
        return None
    return IsrChange(meta.stream, meta.id, proposal.isr, meta.epoch)
