"""The gRPC layer under the client: ``proto.API`` stubs on liftlog's own channel.

:class:`Stub` binds the ``proto.API`` methods the client uses (and liftlog's
own ``liftlog.Cluster`` and ``liftlog.Batches`` ones) to one
:class:`liftlog.rpc.Channel` to one server; :func:`open_stub` opens that
channel. The channel is our HTTP/2 gRPC transport (``liftlog.rpc``), not
grpcio: its calls read like grpc.aio's (``read`` returns :data:`EOF` at the
end of a stream) and fail with :class:`liftlog.rpc.RpcError`.
:func:`being_cancelled` tells a task's own cancellation apart from the
``CancelledError`` a read raises when its call is cancelled.

A :class:`Stub` (and its channel) belongs to the event loop it was first used
on; tasks of that loop may share it.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from google.protobuf.message import Message as _Msg

from liftlog.api import api_pb2, batches_pb2, cluster_pb2
from liftlog.rpc.channel import EOF as _EOF
from liftlog.rpc.channel import Channel

__all__ = ["EOF", "Stub", "being_cancelled", "open_stub"]

_MAX_MESSAGE_BYTES: Final = 64 << 20
#: What ``read()`` of a streaming call returns once the server has completed it.
EOF: Final[Any] = _EOF


class Stub:
    """The ``proto.API`` (and ``liftlog.Cluster``) methods used by the client, bound to one channel.

    Each method object is created once per channel.
    """

    __slots__ = (
        "add_policy",
        "address",
        "channel",
        "cluster_status",
        "create_stream",
        "decommission",
        "delete_stream",
        "elect_preferred_leaders",
        "fetch_batches",
        "fetch_consumer_group_assignments",
        "fetch_cursor",
        "fetch_metadata",
        "fetch_partition_metadata",
        "groups",
        "join_consumer_group",
        "leave_consumer_group",
        "list_policies",
        "pause_stream",
        "publish",
        "publish_async",
        "publish_batch",
        "publish_to_subject",
        "reassign",
        "reassignments",
        "report_consumer_group_coordinator",
        "revoke_policy",
        "set_cursor",
        "set_stream_readonly",
        "subscribe",
    )

    def __init__(self, address: str, channel: Channel) -> None:
        self.address = address
        self.channel = channel

        def unary(method: str, req: type[_Msg], resp: type[_Msg], service: str = "proto.API") -> Callable[..., Any]:
            return channel.unary_unary(
                f"/{service}/{method}", request_serializer=req.SerializeToString, response_deserializer=resp.FromString
            )

        self.create_stream = unary("CreateStream", api_pb2.CreateStreamRequest, api_pb2.CreateStreamResponse)
        self.delete_stream = unary("DeleteStream", api_pb2.DeleteStreamRequest, api_pb2.DeleteStreamResponse)
        self.pause_stream = unary("PauseStream", api_pb2.PauseStreamRequest, api_pb2.PauseStreamResponse)
        self.set_stream_readonly = unary(
            "SetStreamReadonly", api_pb2.SetStreamReadonlyRequest, api_pb2.SetStreamReadonlyResponse
        )
        self.fetch_metadata = unary("FetchMetadata", api_pb2.FetchMetadataRequest, api_pb2.FetchMetadataResponse)
        self.fetch_partition_metadata = unary(
            "FetchPartitionMetadata", api_pb2.FetchPartitionMetadataRequest, api_pb2.FetchPartitionMetadataResponse
        )
        self.publish = unary("Publish", api_pb2.PublishRequest, api_pb2.PublishResponse)
        self.publish_to_subject = unary(
            "PublishToSubject", api_pb2.PublishToSubjectRequest, api_pb2.PublishToSubjectResponse
        )
        self.set_cursor = unary("SetCursor", api_pb2.SetCursorRequest, api_pb2.SetCursorResponse)
        self.fetch_cursor = unary("FetchCursor", api_pb2.FetchCursorRequest, api_pb2.FetchCursorResponse)
        self.join_consumer_group = unary(
            "JoinConsumerGroup", api_pb2.JoinConsumerGroupRequest, api_pb2.JoinConsumerGroupResponse
        )
        self.leave_consumer_group = unary(
            "LeaveConsumerGroup", api_pb2.LeaveConsumerGroupRequest, api_pb2.LeaveConsumerGroupResponse
        )
        self.fetch_consumer_group_assignments = unary(
            "FetchConsumerGroupAssignments",
            api_pb2.FetchConsumerGroupAssignmentsRequest,
            api_pb2.FetchConsumerGroupAssignmentsResponse,
        )
        self.report_consumer_group_coordinator = unary(
            "ReportConsumerGroupCoordinator",
            api_pb2.ReportConsumerGroupCoordinatorRequest,
            api_pb2.ReportConsumerGroupCoordinatorResponse,
        )
        # liftlog's own service: a Liftbridge server answers it UNIMPLEMENTED.
        self.cluster_status = unary(
            "Status", cluster_pb2.ClusterStatusRequest, cluster_pb2.ClusterStatusResponse, "liftlog.Cluster"
        )
        self.reassign = unary("Reassign", cluster_pb2.ReassignRequest, cluster_pb2.ReassignResponse, "liftlog.Cluster")
        self.decommission = unary(
            "Decommission", cluster_pb2.DecommissionRequest, cluster_pb2.DecommissionResponse, "liftlog.Cluster"
        )
        self.elect_preferred_leaders = unary(
            "ElectPreferredLeaders",
            cluster_pb2.ElectPreferredLeadersRequest,
            cluster_pb2.ElectPreferredLeadersResponse,
            "liftlog.Cluster",
        )
        self.reassignments = unary(
            "Reassignments", cluster_pb2.ReassignmentsRequest, cluster_pb2.ReassignmentsResponse, "liftlog.Cluster"
        )
        self.add_policy = unary("AddPolicy", cluster_pb2.PolicyRequest, cluster_pb2.PolicyResponse, "liftlog.Cluster")
        self.revoke_policy = unary(
            "RevokePolicy", cluster_pb2.PolicyRequest, cluster_pb2.PolicyResponse, "liftlog.Cluster"
        )
        self.groups = unary("Groups", cluster_pb2.GroupsRequest, cluster_pb2.GroupsResponse, "liftlog.Cluster")
        self.list_policies = unary(
            "ListPolicies", cluster_pb2.ListPoliciesRequest, cluster_pb2.ListPoliciesResponse, "liftlog.Cluster"
        )
        self.fetch_batches = unary("Fetch", batches_pb2.FetchRequest, batches_pb2.FetchResponse, "liftlog.Batches")
        self.publish_batch = unary(
            "Publish", batches_pb2.PublishRequest, batches_pb2.PublishResponse, "liftlog.Batches"
        )
        self.subscribe = channel.unary_stream(
            "/proto.API/Subscribe",
            request_serializer=api_pb2.SubscribeRequest.SerializeToString,
            response_deserializer=api_pb2.Message.FromString,
        )
        self.publish_async = channel.stream_stream(
            "/proto.API/PublishAsync",
            request_serializer=api_pb2.PublishRequest.SerializeToString,
            response_deserializer=api_pb2.PublishResponse.FromString,
        )


def open_stub(address: str, ssl_context: ssl.SSLContext | None = None, server_name: str | None = None) -> Stub:
    """A stub on a new channel to `address`; it connects on the first call and again after losing the server.

    The client retries (and backs off) itself, so the channel connects whenever asked. With
    `ssl_context` the channel speaks TLS, checking the server's certificate against `server_name`
    (default: the host of `address`).
    """
    channel = Channel(
        address, max_message_bytes=_MAX_MESSAGE_BYTES, ssl_context=ssl_context, server_hostname=server_name
    )
    return Stub(address, channel)


def being_cancelled() -> bool:
    """Whether the current task was asked to cancel (rather than a call it awaited being cancelled)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
