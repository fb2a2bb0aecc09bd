"""The gRPC ``proto.API`` service: Liftbridge's RPCs on top of the metadata service and stream manager.

Stream changes (create, delete, pause, readonly) go to the metadata service,
which has the controller apply them through Raft; FetchMetadata answers from
this server's committed metadata; subscriptions and partition metadata need
the partition's leader (Liftbridge's "Server not partition leader" otherwise).

The handlers only check and translate: publishing is the ``Publishing`` collaborator's
(``publisher.Publisher``, with PublishAsync's call object in ``publish_async``), finding the
replica that may serve a read is ``PartitionReading``'s (``reads``), cursors and consumer
groups are ``CursorKeeping``'s and ``GroupKeeping``'s; all four are Protocols (``ports``),
so none of them imports this module back.

Errors keep Liftbridge's status codes and carry a ``liftlog-error`` reason
(see ``liftlog.api.errors``). Handlers run on the event loop; none blocks.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from liftlog.api import api_pb2, subscribe_batches
from liftlog.api.errors import Reason
from liftlog.metadata import (
    EventTimestamps,
    InvalidStreamError,
    MetadataError,
    PartitionMeta,
    StreamSettings,
    partition_subject,
    validate_new_stream,
)
from liftlog.metadata.controller import CreateStreamRequest
from liftlog.rpc import RequestStream, ServerContext, StatusCode
from liftlog.server.api.access import AccessControl
from liftlog.server.api.failures import RpcFailure, abort_with, encryption_failure, failure_from
from liftlog.server.api.ports import CursorKeeping, GroupKeeping, PartitionReading, Publishing
from liftlog.server.api.publish_async import PublishAsyncCall
from liftlog.server.api.subscribe import (
    BUFFER_MAX_BYTES,
    FETCH_MAX_MESSAGES,
    EndOfReadonly,
    PartitionGone,
    Revoked,
    read_subscription,
)
from liftlog.server.control.cluster import MetadataService
from liftlog.server.partitions.partition import Partition
from liftlog.server.partitions.streams import StreamManager
from liftlog.storage.encryption import EncryptionError

__all__ = ["ApiLimits", "ApiService", "RpcFailure", "abort_with", "failure_from"]

log = logging.getLogger(__name__)

Publish = Callable[[str, bytes], Awaitable[None]]
Code = StatusCode
PAE = api_pb2.PublishAsyncError


#: Request metadata with which our client asks to read past the high watermark (not a Liftbridge feature).
READ_UNCOMMITTED_KEY = "liftlog-read-uncommitted"


def _wants_uncommitted(context: ServerContext) -> bool:
    metadata = context.invocation_metadata() or ()
    return any(key == READ_UNCOMMITTED_KEY and value == "true" for key, value in metadata)


def _wants_batches(context: ServerContext, req: api_pb2.SubscribeRequest) -> bool:
    """A liftlog client asked for stored batches, and no stop timestamp needs a look at each record."""
    if req.stopPosition == api_pb2.STOP_TIMESTAMP:
        return False
    metadata = context.invocation_metadata() or ()
    return any(key == subscribe_batches.REQUEST_KEY and value == "1" for key, value in metadata)


def _nullable(msg: api_pb2.CreateStreamRequest, name: str) -> Any:
    return getattr(msg, name).value if msg.HasField(name) else None


@dataclass(frozen=True)
class ApiLimits:
    """What one call or client may hold on this server (the ``subscribe.*`` and ``publish.*`` settings)."""

    fetch_max_messages: int = FETCH_MAX_MESSAGES
    buffer_max_bytes: int = BUFFER_MAX_BYTES
    max_subscriptions: int = 4096  # 0: no limit
    max_subscriptions_per_connection: int = 1024  # 0: no limit
    max_publish_inflight: int = 1024
    #: PublishAsync requests one read brought for a partition go to NATS as one record batch.
    coalesce_publishes: bool = True


class ApiService:
    """``proto.API``: each handler checks its request and hands it to the collaborator that does the work."""

    def __init__(
        self,
        *,
        server_id: str,
        streams: StreamManager,
        cluster: MetadataService,
        publisher: Publishing,
        reads: PartitionReading,
        cursors: CursorKeeping,
        groups: GroupKeeping,
        limits: ApiLimits = ApiLimits(),
        access: AccessControl | None = None,
    ) -> None:
        #: Authorization: the guard checks whole calls; PublishAsync asks it for each request.
        self.access = access
        self.server_id = server_id
        self._streams = streams
        self._cluster = cluster
        self.publisher = publisher
        self.reads = reads
        self.cursors = cursors
        self.groups = groups
        self.limits = limits
        #: Open Subscribe calls, in all and per client connection (grpc's peer: "ipv4:host:port").
        self.subscriptions = 0
        self.subscriptions_by_peer: Counter[str] = Counter()

    # -- streams ---------------------------------------------------------

    async def CreateStream(
        self, request: api_pb2.CreateStreamRequest, context: ServerContext
    ) -> api_pb2.CreateStreamResponse:
        req: api_pb2.CreateStreamRequest = request
        try:
            # The controller checks again; checking here answers without a round trip to it.
            validate_new_stream(req.name, req.subject, max(req.partitions, 1), self._cluster.namespace)
            self._check_subject_rights(context, req)
            settings = self._streams.check_settings(self._settings(req))
            await self._cluster.create_stream(
                CreateStreamRequest(
                    req.name,
                    req.subject,
                    group=req.group,
                    partitions=req.partitions,
                    replication_factor=req.replicationFactor,
                    settings=settings,
                )
            )
        except MetadataError as exc:
            await abort_with(context, failure_from(exc))
        except RpcFailure as failure:
            await abort_with(context, failure)
        return api_pb2.CreateStreamResponse()

    def _check_subject_rights(self, context: ServerContext, req: api_pb2.CreateStreamRequest) -> None:
        """With authorization: CreateStream on the subject too, and Subscribe on every stream it overlaps."""
        access = self.access
        if access is None or not access.enabled:
            return
        failure = access.refusal(context, req.subject, "CreateStream")
        if failure is None:
            subjects = [partition_subject(req.subject, p) for p in range(max(req.partitions, 1))]
            failure = access.subject_refusal(
                context,
                subjects,
                self._streams.metadata.streams.values(),
                "Subscribe",
                "the new stream would record its messages, and what is published to the new one would land there",
            )
        if failure is not None:
            raise failure

    @staticmethod
    async def _change(context: ServerContext, change: Awaitable[object]) -> None:
        """Await a metadata change, turning its MetadataError into the RPC's status."""
        try:
            await change
        except MetadataError as exc:
            await abort_with(context, failure_from(exc))

    @staticmethod
    def _settings(req: api_pb2.CreateStreamRequest) -> StreamSettings:
        settings = StreamSettings(
            retention_max_bytes=_nullable(req, "retentionMaxBytes"),
            retention_max_messages=_nullable(req, "retentionMaxMessages"),
            retention_max_age_ms=_nullable(req, "retentionMaxAge"),
            cleaner_interval_ms=_nullable(req, "cleanerInterval"),
            segment_max_bytes=_nullable(req, "segmentMaxBytes"),
            segment_max_age_ms=_nullable(req, "segmentMaxAge"),
            compact_max_goroutines=_nullable(req, "compactMaxGoroutines"),
            compact_enabled=_nullable(req, "compactEnabled"),
            auto_pause_time_ms=_nullable(req, "autoPauseTime"),
            auto_pause_disable_if_subscribers=_nullable(req, "autoPauseDisableIfSubscribers"),
            min_isr=_nullable(req, "minIsr"),
            optimistic_concurrency_control=_nullable(req, "optimisticConcurrencyControl"),
            encryption=_nullable(req, "encryption"),
            unclean_leader_election=_nullable(req, "uncleanLeaderElection"),
            duplicate_window_ms=_nullable(req, "duplicateWindow"),
        )
        for name, value in settings.to_dict().items():
            if not isinstance(value, bool) and value < 0:
                raise InvalidStreamError(f"{name} must not be negative, got {value}")
        return settings

    async def DeleteStream(
        self, request: api_pb2.DeleteStreamRequest, context: ServerContext
    ) -> api_pb2.DeleteStreamResponse:
        await self._change(context, self._cluster.delete_stream(request.name))
        return api_pb2.DeleteStreamResponse()

    async def PauseStream(
        self, request: api_pb2.PauseStreamRequest, context: ServerContext
    ) -> api_pb2.PauseStreamResponse:
        await self._change(context, self._cluster.pause(request.name, tuple(request.partitions), request.resumeAll))
        return api_pb2.PauseStreamResponse()

    async def SetStreamReadonly(
        self, request: api_pb2.SetStreamReadonlyRequest, context: ServerContext
    ) -> api_pb2.SetStreamReadonlyResponse:
        await self._change(
            context, self._cluster.set_readonly(request.name, tuple(request.partitions), request.readonly)
        )
        return api_pb2.SetStreamReadonlyResponse()

    # -- subscribe ---------------------------------------------------------

    async def Subscribe(
        self, request: api_pb2.SubscribeRequest, context: ServerContext
    ) -> AsyncIterator[api_pb2.Message | list[bytes]]:
        req: api_pb2.SubscribeRequest = request
        try:
            part = await self.reads.readable(
                req.stream, req.partition, resume=req.resume, allow_replica=req.readISRReplica
            )
        except RpcFailure as failure:
            await abort_with(context, failure)
        refusal = self.groups.check_subscription(req)
        if refusal is not None:
            await abort_with(context, refusal)
        peer = context.peer() or "unknown"
        refusal = self._subscription_refusal(peer)
        if refusal is not None:
            await abort_with(context, refusal)
        self.subscriptions += 1
        self.subscriptions_by_peer[peer] += 1
        part.subscribers += 1
        batched = _wants_batches(context, req)
        try:
            # Liftbridge clients wait for this before they return the subscription; ours learn from it
            # whether batches come.
            yield subscribe_batches.SETUP_BATCHED if batched else api_pb2.Message()
            messages = read_subscription(
                part,
                req,
                uncommitted=_wants_uncommitted(context),
                fetch_max_messages=self.limits.fetch_max_messages,
                buffer_max_bytes=self.limits.buffer_max_bytes,
                batched=batched,
                revoked=(lambda: self.groups.check_subscription(req)) if req.consumer.groupId else None,
            )
            async for message in messages:
                yield message
        except PartitionGone as exc:
            await abort_with(context, self.reads.gone(req.stream, req.partition, str(exc)))
        except EndOfReadonly as exc:
            await abort_with(context, RpcFailure(Code.FAILED_PRECONDITION, Reason.READONLY, str(exc)))
        except Revoked as exc:
            await abort_with(context, exc.failure)
        except EncryptionError as exc:
            await abort_with(context, encryption_failure(req.stream, req.partition, exc))
        finally:
            part.subscribers -= 1
            self.subscriptions -= 1
            self.subscriptions_by_peer[peer] -= 1
            if self.subscriptions_by_peer[peer] <= 0:
                del self.subscriptions_by_peer[peer]

    def _subscription_refusal(self, peer: str) -> RpcFailure | None:
        """RESOURCE_EXHAUSTED naming the limit and its setting when one more subscription is too many."""
        limits = self.limits
        if limits.max_subscriptions and self.subscriptions >= limits.max_subscriptions:
            return RpcFailure(
                Code.RESOURCE_EXHAUSTED,
                Reason.LIMIT_EXCEEDED,
                f"too many subscriptions on server {self.server_id}: {self.subscriptions} are open, the limit is "
                f"{limits.max_subscriptions} (setting subscribe.max.concurrent)",
            )
        open_here = self.subscriptions_by_peer[peer]
        if limits.max_subscriptions_per_connection and open_here >= limits.max_subscriptions_per_connection:
            return RpcFailure(
                Code.RESOURCE_EXHAUSTED,
                Reason.LIMIT_EXCEEDED,
                f"too many subscriptions from connection {peer}: {open_here} are open, the limit is "
                f"{limits.max_subscriptions_per_connection} (setting subscribe.max.concurrent.per.connection)",
            )
        return None

    # -- metadata ----------------------------------------------------------

    async def FetchMetadata(
        self, request: api_pb2.FetchMetadataRequest, context: ServerContext
    ) -> api_pb2.FetchMetadataResponse:
        req: api_pb2.FetchMetadataRequest = request
        metadata = self._streams.metadata
        streams = metadata.streams
        names = list(req.streams) or list(streams)
        out = api_pb2.FetchMetadataResponse()
        replicas: Counter[str] = Counter()
        leaders: Counter[str] = Counter()
        for each in streams.values():
            for p in each.partitions.values():
                replicas.update(p.replicas)
                leaders[p.leader] += 1
        for server in sorted(metadata.servers.values(), key=lambda s: s.id):
            if server.alive:
                out.brokers.append(
                    api_pb2.Broker(
                        id=server.id,
                        host=server.host,
                        port=server.port,
                        partitionCount=replicas[server.id],
                        leaderCount=leaders[server.id],
                    )
                )
        for name in names:
            stream = streams.get(name)
            if stream is None:
                out.streamMetadata.append(
                    api_pb2.StreamMetadata(name=name, error=api_pb2.StreamMetadata.UNKNOWN_STREAM)
                )
                continue
            sm = out.streamMetadata.add(name=name, subject=stream.subject, creationTimestamp=stream.creation_timestamp)
            for pid, meta in stream.partitions.items():
                sm.partitions[pid].CopyFrom(self._partition_metadata(meta, self._streams.partitions.get((name, pid))))
        for group_id in req.groups:  # only those asked for, as Liftbridge answers
            group = metadata.groups.get(group_id)
            if group is None:
                out.groupMetadata.append(
                    api_pb2.ConsumerGroupMetadata(groupId=group_id, error=api_pb2.ConsumerGroupMetadata.UNKNOWN_GROUP)
                )
            else:
                out.groupMetadata.append(
                    api_pb2.ConsumerGroupMetadata(groupId=group_id, coordinator=group.coordinator, epoch=group.epoch)
                )
        return out

    @staticmethod
    def _partition_metadata(meta: PartitionMeta, part: Partition | None) -> api_pb2.PartitionMetadata:
        """Committed metadata, with offsets when this server holds a replica (-1 otherwise)."""
        received = part.messages_received if part is not None else EventTimestamps()
        log = part.log if part is not None else None
        return api_pb2.PartitionMetadata(
            id=meta.id,
            leader=meta.leader,
            replicas=meta.replicas,
            isr=meta.isr,
            highWatermark=part.high_watermark if part is not None else -1,
            newestOffset=part.newest_offset if part is not None else -1,
            paused=meta.paused,
            readonly=meta.readonly,
            messagesReceivedTimestamps=api_pb2.PartitionEventTimestamps(
                firstTimestamp=received.first, latestTimestamp=received.latest
            ),
            pauseTimestamps=api_pb2.PartitionEventTimestamps(
                firstTimestamp=meta.pause_timestamps.first, latestTimestamp=meta.pause_timestamps.latest
            ),
            readonlyTimestamps=api_pb2.PartitionEventTimestamps(
                firstTimestamp=meta.readonly_timestamps.first, latestTimestamp=meta.readonly_timestamps.latest
            ),
            logStartOffset=api_pb2.NullableInt64(value=log.log_start_offset) if log is not None else None,
            fenced=part.fenced or "" if part is not None else "",
        )

    async def FetchPartitionMetadata(
        self, request: api_pb2.FetchPartitionMetadataRequest, context: ServerContext
    ) -> api_pb2.FetchPartitionMetadataResponse:
        try:
            part = self.reads.hosted(request.stream, request.partition)
        except MetadataError as exc:
            await abort_with(context, failure_from(exc))
        except RpcFailure as failure:
            await abort_with(context, failure)
        return api_pb2.FetchPartitionMetadataResponse(metadata=self._partition_metadata(part.meta, part))

    # -- publish -----------------------------------------------------------

    async def Publish(self, request: api_pb2.PublishRequest, context: ServerContext) -> api_pb2.PublishResponse:
        try:
            future = await self.publisher.send(request)
            if future is None:
                return api_pb2.PublishResponse()
            ack = await self.publisher.await_ack(future, context.time_remaining())
        except RpcFailure as failure:
            await abort_with(context, failure)
        return api_pb2.PublishResponse(ack=ack)

    async def PublishToSubject(
        self, request: api_pb2.PublishToSubjectRequest, context: ServerContext
    ) -> api_pb2.PublishToSubjectResponse:
        req: api_pb2.PublishToSubjectRequest = request
        try:
            self.publisher.check_subject(req.subject)  # before the rights: a bad subject is named as such
            if self.access is not None:
                failure = self.access.subject_refusal(
                    context,
                    (req.subject,),
                    self._streams.metadata.streams.values(),
                    "Publish",
                    "the message would be stored there",
                )
                if failure is not None:
                    raise failure
            future = await self.publisher.send_to_subject(req)
            if future is None:
                return api_pb2.PublishToSubjectResponse()
            ack = await self.publisher.await_ack(future, context.time_remaining())
        except RpcFailure as failure:
            await abort_with(context, failure)
        return api_pb2.PublishToSubjectResponse(ack=ack)

    async def PublishAsync(
        self, request_iterator: RequestStream[api_pb2.PublishRequest], context: ServerContext
    ) -> None:
        call = PublishAsyncCall(
            self.publisher,
            request_iterator,
            context,
            max_inflight=self.limits.max_publish_inflight,
            coalesce=self.limits.coalesce_publishes,
            access=self.access,
        )
        await call.run()

    # -- later issues --------------------------------------------------------

    async def _unimplemented(self, context: ServerContext, what: str) -> NoReturn:
        await abort_with(
            context,
            RpcFailure(
                Code.UNIMPLEMENTED,
                Reason.UNIMPLEMENTED,
                f"{what} are not implemented in this liftlog version yet",
            ),
        )

    async def SetCursor(self, request: api_pb2.SetCursorRequest, context: ServerContext) -> api_pb2.SetCursorResponse:
        try:
            await self.cursors.set(request)
        except RpcFailure as failure:
            await abort_with(context, failure)
        return api_pb2.SetCursorResponse()

    async def FetchCursor(
        self, request: api_pb2.FetchCursorRequest, context: ServerContext
    ) -> api_pb2.FetchCursorResponse:
        try:
            offset = await self.cursors.fetch(request)
        except RpcFailure as failure:
            await abort_with(context, failure)
        return api_pb2.FetchCursorResponse(offset=offset)

    async def JoinConsumerGroup(
        self, request: api_pb2.JoinConsumerGroupRequest, context: ServerContext
    ) -> api_pb2.JoinConsumerGroupResponse:
        try:
            return await self.groups.join(request)
        except RpcFailure as failure:
            await abort_with(context, failure)

    async def LeaveConsumerGroup(
        self, request: api_pb2.LeaveConsumerGroupRequest, context: ServerContext
    ) -> api_pb2.LeaveConsumerGroupResponse:
        try:
            await self.groups.leave(request)
        except RpcFailure as failure:
            await abort_with(context, failure)
        return api_pb2.LeaveConsumerGroupResponse()

    async def FetchConsumerGroupAssignments(
        self, request: api_pb2.FetchConsumerGroupAssignmentsRequest, context: ServerContext
    ) -> api_pb2.FetchConsumerGroupAssignmentsResponse:
        try:
            return self.groups.assignments(request)
        except RpcFailure as failure:
            await abort_with(context, failure)

    async def ReportConsumerGroupCoordinator(
        self, request: api_pb2.ReportConsumerGroupCoordinatorRequest, context: ServerContext
    ) -> api_pb2.ReportConsumerGroupCoordinatorResponse:
        try:
            await self.groups.report(request)
        except RpcFailure as failure:
            await abort_with(context, failure)
        return api_pb2.ReportConsumerGroupCoordinatorResponse()
