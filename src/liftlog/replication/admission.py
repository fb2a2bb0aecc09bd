"""Whether a partition takes a publish: the rules every path into a partition goes through.

A message reaches a partition by a Publish or PublishAsync RPC on any server, a
PublishToSubject, a batch publish, or a plain NATS publish on the stream's subject. The rules
are checked twice with the same function:

- by the server that takes an RPC, against the committed metadata (``next_offset`` None: only
  the leader knows its log end), so the client hears a worded refusal at once;
- by the leader's intake, against its own replica (``Partition.append``): the check that
  counts, since metadata may lag and a plain NATS publish skips the RPC.

The rules, in order:

- a replica that stopped leading writes nothing (:func:`intake`): its log takes only its
  new leader's batches, and with no leader to count replicas an ack would claim a commit;
- with optimistic concurrency, an RPC publish must ask for an ack (Liftbridge's rule: a refused
  expected offset would go unnoticed), and an expected offset other than the log end is refused
  (by the leader: only it knows the log end);
- a record whose payload is larger than the limit is refused;
- ack ALL with fewer in-sync replicas than min.insync.replicas is refused: acknowledging it as
  committed with too few copies would promise what cannot be kept.

Sans-IO: facts in, a verdict out.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["AckPolicy", "AdmissionRules", "Intake", "Refusal", "admit", "intake"]


class AckPolicy(enum.IntEnum):
    """A publish's AckPolicy, with the values of the Liftbridge API's enum."""

    LEADER = 0
    ALL = 1
    NONE = 2


class Refusal(enum.Enum):
    UNACKED_OCC = "stream with concurrency control must have AckPolicy set"  # Liftbridge's words
    WRONG_OFFSET = "expected offset is not the log end"
    TOO_LARGE = "record larger than the limit"
    TOO_FEW_IN_SYNC = "fewer in-sync replicas than min.insync.replicas"


class Intake(enum.Enum):
    WRITE = "write"
    #: The leader's lease ran out: hold the messages until it is renewed (or the leader deposed).
    PARK = "park"
    #: This replica no longer leads: refuse every message.
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class AdmissionRules:
    """A partition's limits, from its stream's settings."""

    min_isr: int = 1
    max_payload: int = 2**31 - 1
    #: Optimistic concurrency control: publishes may name the offset they expect to get.
    occ: bool = False


def intake(leading: bool, deposed: bool, lease_valid: bool) -> Intake:
    """What the leader's intake does with a batch of messages.

    ``leading``: a leader core runs (False too for a replica with no role yet, as in unit tests:
    it writes, and written means committed); ``deposed``: it led and stopped;
    ``lease_valid``: its lease allows acknowledging now.
    """
    if leading and not lease_valid:
        return Intake.PARK
    if deposed:
        return Intake.REFUSE
    return Intake.WRITE


def admit(
    rules: AdmissionRules, ack_policy: int, in_sync: int, payload: int, expected_offset: int, next_offset: int | None
) -> Refusal | None:
    """Why one publish must be refused, or None to take it.

    ``ack_policy``: an :class:`AckPolicy` value; ``in_sync``: the in-sync replicas now;
    ``payload``: the largest record's payload bytes;
    ``expected_offset``: -1 for none; ``next_offset``: the offset it would get, None where unknown.
    """
    if rules.occ:
        if next_offset is None:
            if ack_policy == AckPolicy.NONE:  # plain NATS publishes carry no ack either: not refused
                return Refusal.UNACKED_OCC
        elif expected_offset != -1 and expected_offset != next_offset:
            return Refusal.WRONG_OFFSET
    if payload > rules.max_payload:
        return Refusal.TOO_LARGE
    if ack_policy == AckPolicy.ALL and in_sync < rules.min_isr:
        return Refusal.TOO_FEW_IN_SYNC
    return None
