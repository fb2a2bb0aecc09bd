"""The controller's planning: the metadata operations that carry out a requested change.

Any server takes a change (create a stream, an ISR change from a partition leader, a
reassignment, ...) and forwards it to the controller; the controller plans it here against
its committed metadata and proposes the operations, in order, to the metadata Raft group.
A change the metadata refuses raises the MetadataError it is refused with, before anything
is proposed. Leader elections (reports, confirmations) are the failover core's, not this.

Sans-IO: the metadata, the change and the time in; operations out. The server's metadata
service and the whole-cluster simulation both plan through :class:`ChangePlanner`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .controller import plan_create_stream, plan_policy_change
from .groups import CoordinatorWitnesses, choose_coordinator, plan_join
from .limits import StreamLimits
from .model import (
    ChangeGroupCoordinator,
    ChangeIsr,
    DeleteStream,
    InvalidStreamError,
    LeaveGroup,
    Metadata,
    MetadataError,
    Operation,
    RegisterServer,
    SetPaused,
    SetReadonly,
)
from .names import is_internal_stream
from .protocol import (
    ControlRequest,
    CreateStreamChange,
    DecommissionChange,
    DeleteStreamChange,
    GroupCoordinatorReport,
    GroupJoinChange,
    GroupLeaveChange,
    IsrChange,
    PauseChange,
    PolicyChange,
    PreferredLeadersChange,
    ReadonlyChange,
    ReassignChange,
    ServerRegistration,
)
from .reassignment import plan_decommission, plan_moves, preferred_leader_changes

__all__ = ["ChangePlanner"]

log = logging.getLogger(__name__)


class ChangePlanner:
    """Plans changes for one controller term (it keeps members' reports of silent group coordinators)."""

    def __init__(self, namespace: str, limits: StreamLimits | None = None, group_coordinator_timeout_ns: int = 0):
        #: clustering.namespace: internal subjects live under it, so stream subjects must not.
        self.namespace = namespace
        self.limits = limits or StreamLimits()
        self._group_witnesses = CoordinatorWitnesses(group_coordinator_timeout_ns)

    def plan(self, metadata: Metadata, change: ControlRequest, now: int, voters: Sequence[str]) -> list[Operation]:
        """The operations that carry out ``change``, in order; raises the MetadataError it is refused with.

        ``voters``: the metadata group's voters (a decommission must leave enough of them).
        """
        match change:
            case CreateStreamChange(req):
                return [plan_create_stream(metadata, req, now, namespace=self.namespace, limits=self.limits)]
            case DeleteStreamChange(name):
                metadata.stream(name)  # fail fast, without a log entry
                if is_internal_stream(name):
                    raise InvalidStreamError(f"stream {name!r} is the servers' own and cannot be deleted")
                return [DeleteStream(name)]
            case PauseChange(name, partitions, pause, resume_all):
                for p in partitions:
                    metadata.partition(name, p)
                if not partitions:
                    metadata.stream(name)
                return [SetPaused(name, partitions, pause, now, resume_all)]
            case ReadonlyChange(name, partitions, readonly):
                return [SetReadonly(name, partitions, readonly, now)]
            case IsrChange(name, partition, isr, epoch):
                return [ChangeIsr(name, partition, isr, epoch)]
            case ServerRegistration(server):
                return [RegisterServer(server, now)]
            case ReassignChange(moves, spread):
                return plan_moves(metadata, [(m.name, m.partition, m.replicas) for m in moves], spread)
            case DecommissionChange(server):
                return plan_decommission(metadata, server, tuple(voters))
            case PreferredLeadersChange():
                return list(preferred_leader_changes(metadata))
            case PolicyChange(subject, resource, action, add):
                return [plan_policy_change(subject, resource, action, add=add)]
            case GroupJoinChange(group, consumer, streams):
                return [plan_join(metadata, group, consumer, streams)]
            case GroupLeaveChange(group, consumer, expired):
                metadata.group(group)  # fail fast, without a log entry
                return [LeaveGroup(group, consumer, expired)]
            case GroupCoordinatorReport(group, consumer, coordinator, epoch):
                meta = metadata.group(group)
                if not self._group_witnesses.report(meta, consumer, coordinator, epoch, now):
                    return []
                chosen = choose_coordinator(metadata, exclude=coordinator)
                log.warning(
                    "consumer group %s: most members find coordinator %s silent, %s takes over",
                    group,
                    coordinator,
                    chosen,
                )
                return [ChangeGroupCoordinator(group, chosen, epoch)]
        raise MetadataError(f"{type(change).__name__} is not a metadata change of its own")
