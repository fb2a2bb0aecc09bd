"""The gRPC layer under the client: ``proto.API`` stubs and grpc.aio call helpers.

:class:`Stub` binds the ``proto.API`` methods the client uses (and liftlog's
own ``liftlog.Cluster`` and ``liftlog.Batches`` ones) to one channel to one
server; :func:`open_stub` opens that channel. :data:`EOF` is what a
grpc.aio streaming call's ``read`` returns at the end of the stream, and
:func:`being_cancelled` tells a task's own cancellation apart from the
``CancelledError`` a read raises when its call is cancelled.

A :class:`Stub` (and its channel) belongs to the event loop it was opened on;
tasks of that loop may share it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import grpc  # type: ignore[import-untyped, unused-ignore]
import grpc.aio  # type: ignore[import-untyped, unused-ignore]

from liftlog.api import api_pb2, batches_pb2, cluster_pb2

__all__ = ["EOF", "Stub", "being_cancelled", "open_stub"]

_MAX_MESSAGE_BYTES: Final = 64 << 20
_CHANNEL_OPTIONS: Final = (
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
)
#: What ``read()`` of a grpc.aio streaming call returns once the server has completed it.
EOF: Final[Any] = grpc.aio.EOF


class Stub:
    """The ``proto.API`` (and ``liftlog.Cluster``) methods used by the client, bound to one channel.

    Built by hand rather than with ``api_pb2_grpc.APIStub`` (whose
    constructor is untyped) so each multicallable is created once per channel.
    """

    __slots__ = (
        "address",
        "channel",
        "cluster_status",
        "create_stream",
        "delete_stream",
        "fetch_batches",
        "fetch_metadata",
        "fetch_partition_metadata",
        "pause_stream",
        "publish",
        "publish_async",
        "publish_batch",
        "publish_to_subject",
        "set_stream_readonly",
        "subscribe",
    )

    def __init__(self, address: str, channel: Any) -> None:
        self.address = address
        self.channel = channel

        def unary(method: str, req: Any, resp: Any, service: str = "proto.API") -> Any:
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
        # liftlog's own service: a Liftbridge server answers it UNIMPLEMENTED.
        self.cluster_status = unary(
            "Status", cluster_pb2.ClusterStatusRequest, cluster_pb2.ClusterStatusResponse, "liftlog.Cluster"
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


def open_stub(address: str, *, backoff: float, max_backoff: float) -> Stub:
    """A stub on a new insecure channel to `address` that reconnects with the client's backoff."""
    options = (
        *_CHANNEL_OPTIONS,
        # Reconnect about as eagerly as the client retries (gRPC waits 1 s, then longer, by
        # default, failing every call on the channel meanwhile).
        ("grpc.initial_reconnect_backoff_ms", max(10, int(backoff * 1000))),
        ("grpc.max_reconnect_backoff_ms", max(100, int(max_backoff * 1000))),
    )
    return Stub(address, grpc.aio.insecure_channel(address, options=options))


def being_cancelled() -> bool:
    """Whether the current task was asked to cancel (rather than a call it awaited being cancelled)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
