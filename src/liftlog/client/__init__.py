"""An asyncio client for liftlog (and Liftbridge) clusters.

::

    from liftlog.client import AckPolicy, Client, StartPosition

    async with Client("127.0.0.1:9292") as client:
        await client.create_stream("orders", "orders", partitions=3, exist_ok=True)
        ack = await client.publish("orders", b"created", key=b"order-1")
        async with client.subscribe("orders", start_position=StartPosition.EARLIEST) as sub:
            async for msg in sub:
                print(msg.offset, msg.key, msg.value)

:class:`Client` holds the API; every error it raises is a
:class:`LiftlogError` (see :mod:`liftlog.client.errors`).

The modules: ``client`` (:class:`Client`), ``subscription``
(:class:`Subscription`), ``cluster`` (what :meth:`Client.cluster_status`
returns), ``publish_async`` (the windowed PublishAsync behind
``publish_many``), ``batches`` (decoding the record batches behind
``fetch`` and ``read_range``), ``routing`` (the client's channels, metadata cache and
retries), ``stubs`` (the gRPC stubs), ``nats_helpers`` (publishing on NATS
directly), ``types`` (the values returned) and ``errors``.
"""

from liftlog.client.batches import Columns, Fetched, FetchedBatches
from liftlog.client.client import Client
from liftlog.client.cluster import (
    ClusterStatus,
    GroupInfo,
    GroupMember,
    PartitionStatus,
    Policies,
    Reassignment,
    Reassignments,
    ReplicaProgress,
    ServerStatus,
)
from liftlog.client.consumer import Consumer
from liftlog.client.errors import (
    AckTimeoutError,
    ClientClosedError,
    ConfigurationError,
    CorruptDataError,
    DeadlineExceededError,
    EncryptionFailedError,
    FailedPreconditionError,
    IncorrectOffsetError,
    InternalError,
    InvalidArgumentError,
    LiftlogError,
    LimitExceededError,
    MessageTooLargeError,
    NoSuchPartitionError,
    NoSuchStreamError,
    NotFoundError,
    NotLeaderError,
    OffsetOutOfRangeError,
    PartitionPausedError,
    PermissionDeniedError,
    PublishAsyncFailed,
    ReadonlyError,
    StreamDeletedError,
    StreamExistsError,
    TlsError,
    UnavailableError,
    UnimplementedError,
    error_from_rpc,
)
from liftlog.client.merged import MergedSubscription
from liftlog.client.subscription import Subscription
from liftlog.client.tls import TlsConfig
from liftlog.client.types import (
    Ack,
    AckError,
    AckPolicy,
    BrokerInfo,
    CursorInfo,
    EventTimestamps,
    Message,
    Metadata,
    OutgoingMessage,
    PartitionInfo,
    StartPosition,
    StopPosition,
    StreamInfo,
)

__all__ = [
    "Ack",
    "AckError",
    "AckPolicy",
    "AckTimeoutError",
    "BrokerInfo",
    "Client",
    "ClientClosedError",
    "ClusterStatus",
    "Columns",
    "ConfigurationError",
    "Consumer",
    "CorruptDataError",
    "CursorInfo",
    "DeadlineExceededError",
    "EncryptionFailedError",
    "EventTimestamps",
    "FailedPreconditionError",
    "Fetched",
    "FetchedBatches",
    "GroupInfo",
    "GroupMember",
    "IncorrectOffsetError",
    "InternalError",
    "InvalidArgumentError",
    "LiftlogError",
    "LimitExceededError",
    "MergedSubscription",
    "Message",
    "MessageTooLargeError",
    "Metadata",
    "NoSuchPartitionError",
    "NoSuchStreamError",
    "NotFoundError",
    "NotLeaderError",
    "OffsetOutOfRangeError",
    "OutgoingMessage",
    "PartitionInfo",
    "PartitionPausedError",
    "PartitionStatus",
    "PermissionDeniedError",
    "Policies",
    "PublishAsyncFailed",
    "ReadonlyError",
    "Reassignment",
    "Reassignments",
    "ReplicaProgress",
    "ServerStatus",
    "StartPosition",
    "StopPosition",
    "StreamDeletedError",
    "StreamExistsError",
    "StreamInfo",
    "Subscription",
    "TlsConfig",
    "TlsError",
    "UnavailableError",
    "UnimplementedError",
    "error_from_rpc",
]
