"""What the gRPC handlers need from the server, as Protocols: the API service and its helpers are typed
against these, never against each other, so none of them imports another.

- ``Publishing``: taking a publish (``publisher.Publisher``): the checks, the NATS publish, the acks.
- ``PartitionReading``: finding the replica that may serve a read (``reads.PartitionReads``).
- ``CursorKeeping`` and ``GroupKeeping``: the cursor and consumer-group RPCs (``cursors``, ``groups``).

The composition root (``server.Server``) makes the concrete ones and hands them to ``ApiService``,
``BatchesService`` and each other.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from liftlog.api import api_pb2

if TYPE_CHECKING:
    from liftlog.metadata import PartitionMeta
    from liftlog.server.api.failures import RpcFailure
    from liftlog.server.partitions.partition import Partition

__all__ = ["AckFuture", "CursorKeeping", "GroupKeeping", "PartitionReading", "Publishing"]

AckFuture = asyncio.Future[api_pb2.Ack]


class Publishing(Protocol):
    """Publishing for clients: each method raises ``RpcFailure`` naming what went wrong."""

    @property
    def max_message_bytes(self) -> int: ...

    def nats_max_payload(self) -> int:
        """The largest NATS message the connected nats-server takes now."""
        ...

    async def publishable(self, stream: str, partition: int, ack_policy: int) -> tuple[PartitionMeta, bool]:
        """The partition's metadata and whether its stream checks expected offsets, once it may take a publish."""
        ...

    async def send(self, req: api_pb2.PublishRequest) -> AckFuture | None: ...

    async def send_checked(self, req: api_pb2.PublishRequest, meta: PartitionMeta, occ: bool) -> AckFuture | None: ...

    def check_subject(self, subject: str) -> None: ...

    async def send_to_subject(self, req: api_pb2.PublishToSubjectRequest) -> AckFuture | None: ...

    def leads(self, meta: PartitionMeta) -> bool: ...

    def check_size(self, req: api_pb2.PublishRequest | api_pb2.PublishToSubjectRequest) -> None: ...

    def expect_ack(
        self, subject: str, policy: int, stream: str | None, *, local: bool = False
    ) -> tuple[str, str, AckFuture]: ...

    async def publish_payload(
        self, subject: str, payload: bytes, correlation_id: str = "", led_here: bool = False
    ) -> None: ...

    def send_publishes_now(self) -> None: ...

    def expect_next_publish(self) -> None: ...

    async def until_listening(self, part: Partition) -> None: ...

    async def await_ack(self, future: AckFuture, timeout: float | None) -> api_pb2.Ack: ...

    async def until_acked(self, future: AckFuture, timeout: float | None) -> None: ...

    def ack_result(self, future: AckFuture) -> api_pb2.Ack: ...

    def answer(self, future: AckFuture, cid: str) -> bytes:
        """The encoded PublishResponse for a done ack."""
        ...


class PartitionReading(Protocol):
    async def readable(self, stream: str, partition: int, *, resume: bool, allow_replica: bool) -> Partition: ...

    def hosted(self, stream: str, partition: int, allow_replica: bool = False) -> Partition: ...

    def gone(self, stream: str, partition: int, reason: str) -> RpcFailure: ...


class CursorKeeping(Protocol):
    async def set(self, req: api_pb2.SetCursorRequest) -> None: ...

    async def fetch(self, req: api_pb2.FetchCursorRequest) -> int: ...


class GroupKeeping(Protocol):
    async def join(self, req: api_pb2.JoinConsumerGroupRequest) -> api_pb2.JoinConsumerGroupResponse: ...

    async def leave(self, req: api_pb2.LeaveConsumerGroupRequest) -> None: ...

    def assignments(
        self, req: api_pb2.FetchConsumerGroupAssignmentsRequest
    ) -> api_pb2.FetchConsumerGroupAssignmentsResponse: ...

    async def report(self, req: api_pb2.ReportConsumerGroupCoordinatorRequest) -> None: ...

    def check_subscription(self, req: api_pb2.SubscribeRequest) -> RpcFailure | None:
        """Why a subscription naming a group consumer may not be served (None: it may)."""
        ...
