"""Consumer groups' RPCs, and the coordinator's duty of dropping members it no longer hears from.

Membership, coordinators and epochs live in the metadata (``metadata.groups``): Join, Leave and
coordinator reports are changes the controller applies through Raft, from any server. Assignments are
computed from the metadata (``metadata.groups.assign``) and served by the group's coordinator only; each
FetchConsumerGroupAssignments is also the member's heartbeat. A member silent for
``groups.consumer.timeout`` is removed by its coordinator (expired), which rebalances the group; members
that hear nothing from the coordinator for ``groups.coordinator.timeout`` report it, and when most do, the
controller hands the group to another server. Subscriptions that name a group consumer are served only
while that consumer holds the partition at the group's current epoch.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from liftlog.api import api_pb2
from liftlog.api.errors import Reason
from liftlog.metadata import MetadataError
from liftlog.metadata.groups import assign
from liftlog.rpc import StatusCode as Code
from liftlog.server.api.failures import RpcFailure, failure_from
from liftlog.server.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from liftlog.server.control.cluster import MetadataService
    from liftlog.server.partitions.streams import StreamManager

__all__ = ["GroupService"]

log = logging.getLogger(__name__)

#: The longest group or consumer id taken (every server keeps them in memory and in snapshots).
MAX_ID = 1024
#: How often a coordinator looks for silent members.
EXPIRY_CHECK_S = 0.5


class GroupService:
    def __init__(
        self,
        *,
        server_id: str,
        streams: StreamManager,
        cluster: MetadataService,
        consumer_timeout: float,
        coordinator_timeout: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._server_id = server_id
        self._streams = streams
        self._cluster = cluster
        self.consumer_timeout = consumer_timeout
        self.coordinator_timeout = coordinator_timeout
        self._clock = clock.monotonic
        #: (group, consumer) -> when this server (as coordinator) last heard from it
        self._seen: dict[tuple[str, str], float] = {}
        self._expiring: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- RPCs ---------------------------------------------------------------------------------------

    async def join(self, req: api_pb2.JoinConsumerGroupRequest) -> api_pb2.JoinConsumerGroupResponse:
        _check_ids(req.groupId, req.consumerId)
        if not req.streams:
            raise RpcFailure(Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, "No streams provided")
        try:
            await self._cluster.join_group(req.groupId, req.consumerId, tuple(req.streams))
            group = self._streams.metadata.group(req.groupId)
        except MetadataError as exc:
            raise failure_from(exc) from exc
        return api_pb2.JoinConsumerGroupResponse(
            coordinator=group.coordinator,
            epoch=group.epoch,
            consumerTimeout=int(self.consumer_timeout * 1e9),  # nanoseconds, as Liftbridge sends them
            coordinatorTimeout=int(self.coordinator_timeout * 1e9),
        )

    async def leave(self, req: api_pb2.LeaveConsumerGroupRequest) -> None:
        _check_ids(req.groupId, req.consumerId)
        try:
            await self._cluster.leave_group(req.groupId, req.consumerId)
        except MetadataError as exc:
            raise failure_from(exc) from exc

    def assignments(
        self, req: api_pb2.FetchConsumerGroupAssignmentsRequest
    ) -> api_pb2.FetchConsumerGroupAssignmentsResponse:
        _check_ids(req.groupId, req.consumerId)
        metadata = self._streams.metadata
        try:
            group = metadata.group(req.groupId)
        except MetadataError as exc:
            raise failure_from(exc) from exc
        if group.coordinator != self._server_id:
            raise RpcFailure(Code.FAILED_PRECONDITION, Reason.REFUSED, "broker is not the consumer group coordinator")
        if req.epoch != group.epoch:
            raise RpcFailure(
                Code.FAILED_PRECONDITION,
                Reason.REFUSED,
                f"client-provided group epoch differs from broker group epoch ({req.epoch}, not {group.epoch})",
            )
        if req.consumerId not in group.members:
            raise RpcFailure(Code.FAILED_PRECONDITION, Reason.REFUSED, "consumer is not a member of the consumer group")
        self._seen[(req.groupId, req.consumerId)] = self._clock()
        mine = assign(group, metadata).get(req.consumerId, {})
        return api_pb2.FetchConsumerGroupAssignmentsResponse(
            epoch=group.epoch,
            assignments=[api_pb2.PartitionAssignment(stream=s, partitions=p) for s, p in sorted(mine.items())],
        )

    async def report(self, req: api_pb2.ReportConsumerGroupCoordinatorRequest) -> None:
        _check_ids(req.groupId, req.consumerId)
        if not req.coordinator:
            raise RpcFailure(Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, "No coordinator provided")
        try:
            await self._cluster.report_group_coordinator(req.groupId, req.consumerId, req.coordinator, req.epoch)
        except MetadataError as exc:
            raise failure_from(exc) from exc

    # -- subscriptions ------------------------------------------------------------------------------

    def check_subscription(self, req: api_pb2.SubscribeRequest) -> RpcFailure | None:
        """Why a Subscribe naming a group consumer may not read the partition now; None if it may."""
        consumer = req.consumer
        if not consumer.groupId:
            return None
        if not consumer.consumerId:
            return RpcFailure(
                Code.INVALID_ARGUMENT,
                Reason.INVALID_ARGUMENT,
                "Consumer id cannot be empty when group id is provided",
            )
        if req.readISRReplica:
            return RpcFailure(
                Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, "Consumer groups not compatible with ReadISRReplica"
            )
        metadata = self._streams.metadata
        group = metadata.groups.get(consumer.groupId)
        held = (
            group is not None
            and group.epoch == consumer.groupEpoch
            and req.partition in assign(group, metadata).get(consumer.consumerId, {}).get(req.stream, [])
        )
        if held:
            return None
        return RpcFailure(
            Code.FAILED_PRECONDITION,
            Reason.REFUSED,
            f"Consumer is not currently assigned this partition (consumer {consumer.consumerId!r} of group "
            f"{consumer.groupId!r} at epoch {consumer.groupEpoch})",
        )

    # -- the coordinator's duty ---------------------------------------------------------------------

    async def run(self) -> None:
        """Expire the members of groups this server coordinates that stopped fetching their assignments."""
        while True:
            await asyncio.sleep(EXPIRY_CHECK_S)
            self.expire_silent()

    def expire_silent(self) -> None:
        now = self._clock()
        me = self._server_id
        current: set[tuple[str, str]] = set()
        for group in self._streams.metadata.groups.values():
            if group.coordinator != me:
                continue
            for consumer in group.members:
                key = (group.id, consumer)
                current.add(key)
                seen = self._seen.setdefault(key, now)  # newly coordinated or joined: its timeout starts now
                if now - seen > self.consumer_timeout and key not in self._expiring:
                    self._expiring.add(key)
                    task = asyncio.get_running_loop().create_task(self._expire(*key), name=f"expire {key}")
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        for key in list(self._seen):
            if key not in current:
                del self._seen[key]

    async def _expire(self, group: str, consumer: str) -> None:
        log.info("consumer %s of group %s is silent for %.3g s: removing it", consumer, group, self.consumer_timeout)
        try:
            await self._cluster.leave_group(group, consumer, expired=True)
        except MetadataError as exc:
            log.info("expiring consumer %s of group %s: %s", consumer, group, exc)
        finally:
            self._expiring.discard((group, consumer))
            self._seen[(group, consumer)] = self._clock()  # if it stays (a refusal), wait a timeout again


def _check_ids(group_id: str, consumer_id: str) -> None:
    if not group_id:
        raise RpcFailure(Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, "No groupId provided")
    if not consumer_id:
        raise RpcFailure(Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, "No consumerId provided")
    for what, value in (("groupId", group_id), ("consumerId", consumer_id)):
        if len(value) > MAX_ID:
            raise RpcFailure(
                Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, f"{what} of {len(value)} characters: at most {MAX_ID}"
            )
