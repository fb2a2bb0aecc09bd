"""The gRPC ``proto.API`` service: Liftbridge's RPCs on top of the metadata service and stream manager.

Stream changes (create, delete, pause, readonly) go to the metadata service,
which has the controller apply them through Raft; FetchMetadata answers from
this server's committed metadata; subscriptions and partition metadata need
the partition's leader (Liftbridge's "Server not partition leader" otherwise).

Publishes go through NATS, as in Liftbridge: the server wraps the request in
a Publish envelope and publishes it on the partition's subject, so every
stream on that subject (and every plain NATS subscriber) sees it; the ack
comes back from the partition through the :class:`AckRouter`.

Errors keep Liftbridge's status codes and carry a ``liftlog-error`` reason
(see ``liftlog.api.errors``). Handlers run on the event loop; none blocks.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from nats.errors import MaxPayloadError

from liftlog.api import api_pb2, subscribe_batches
from liftlog.api.envelope import encode_publish_message
from liftlog.api.errors import NOT_LEADER_MESSAGE, Reason
from liftlog.api.stored import varint as _varint
from liftlog.metadata import (
    EventTimestamps,
    InvalidStreamError,
    MetadataError,
    PartitionMeta,
    StreamSettings,
    is_internal_stream,
    partition_subject,
    validate_new_stream,
    validate_stream_subject,
)
from liftlog.metadata.controller import CreateStreamRequest
from liftlog.natswire import MaxPayloadError as LeanMaxPayloadError
from liftlog.replication.admission import AckPolicy, AdmissionRules, Refusal, admit
from liftlog.rpc import RequestStream, ServerContext, StatusCode
from liftlog.storage.encryption import EncryptionError

from .access import AccessControl
from .acks import AckRouter
from .cluster import MetadataService
from .cursors import CursorService
from .failures import RpcFailure, abort_with, async_error, encryption_failure, failure_from
from .groups import GroupService
from .partition import Partition
from .publish_async import serve_publish_async
from .streams import StreamManager
from .subscribe import (
    BUFFER_MAX_BYTES,
    FETCH_MAX_MESSAGES,
    EndOfReadonly,
    PartitionGone,
    Revoked,
    read_subscription,
)

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
    def __init__(
        self,
        *,
        server_id: str,
        host: str,
        port: int,
        streams: StreamManager,
        cluster: MetadataService,
        acks: AckRouter,
        publish: Publish,
        ack_timeout: float,
        keep_hot: Callable[[], None] | None = None,
        send_publishes: Callable[[], None] | None = None,
        max_message_bytes: int,
        limits: ApiLimits = ApiLimits(),
        nats_max_payload: Callable[[], int] = lambda: 1 << 20,
        access: AccessControl | None = None,
        cursors_enabled: bool = False,
        group_timeouts: tuple[float, float] = (15.0, 15.0),
    ) -> None:
        #: Authorization: the guard checks whole calls; PublishAsync asks it for each request.
        self.access = access
        self.server_id = server_id
        self.host = host
        self.port = port
        self._streams = streams
        self._cluster = cluster
        self._acks = acks
        self.cursors = CursorService(self, enabled=cursors_enabled)
        #: (groups.consumer.timeout, groups.coordinator.timeout) in seconds
        self.groups = GroupService(self, consumer_timeout=group_timeouts[0], coordinator_timeout=group_timeouts[1])
        self._publish = publish
        #: After publishing for a partition led here: keep the loop polling for the message's return (spin.py).
        self._keep_hot = keep_hot
        #: Writes the NATS publishes queued so far now, not at the end of the loop turn (None: no such thing).
        self._send_publishes = send_publishes
        self._ack_timeout = ack_timeout
        self._max_message_bytes = max_message_bytes
        self._size_rules = AdmissionRules(max_payload=max_message_bytes)
        self.limits = limits
        #: The largest NATS message the connected nats-server takes now (its INFO's max_payload).
        self.nats_max_payload = nats_max_payload
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
            part = await self.readable(req.stream, req.partition, resume=req.resume, allow_replica=req.readISRReplica)
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
            await abort_with(context, self.gone(req.stream, req.partition, str(exc)))
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

    async def readable(self, stream: str, partition: int, *, resume: bool, allow_replica: bool) -> Partition:
        """The replica here that may serve reads of a partition (resuming it first if asked to).

        Raises RpcFailure: NOT_FOUND, PAUSED (paused and not ``resume``), NOT_LEADER, UNAVAILABLE.
        """
        try:
            meta = self._streams.metadata.partition(stream, partition)
            if meta.paused:
                if not resume:
                    raise RpcFailure(
                        Code.FAILED_PRECONDITION,
                        Reason.PAUSED,
                        f"partition {stream}/{partition} is paused; subscribe with resume to resume it",
                    )
                await self._cluster.resume(stream, partition)
            return self.hosted(stream, partition, allow_replica=allow_replica)
        except MetadataError as exc:
            raise failure_from(exc) from exc

    def gone(self, stream: str, partition: int, reason: str) -> RpcFailure:
        try:
            meta = self._streams.metadata.partition(stream, partition)
        except MetadataError:
            return RpcFailure(Code.NOT_FOUND, Reason.STREAM_DELETED, f"stream {stream!r} was deleted")
        if meta.paused:
            return RpcFailure(Code.FAILED_PRECONDITION, Reason.PAUSED, f"partition {stream}/{partition} was paused")
        return RpcFailure(Code.UNAVAILABLE, Reason.UNAVAILABLE, reason)

    @property
    def streams(self) -> StreamManager:
        return self._streams

    @property
    def cluster(self) -> MetadataService:
        return self._cluster

    def hosted(self, stream: str, partition: int, allow_replica: bool = False) -> Partition:
        """This server's replica of a partition it leads (or, with ``allow_replica``, is in the ISR of).

        Raises NoSuchStream/NoSuchPartition for unknown ones, RpcFailure NOT_LEADER otherwise.
        """
        meta = self._streams.metadata.partition(stream, partition)
        part = self._streams.partitions.get((stream, partition))
        if part is not None and part.log is None and part.fenced is not None:
            # Not NOT_LEADER: clients would re-route to this same server until their deadline.
            raise self._unavailable(part)
        # Named leader is not enough: right after a restart or mid-election this server has not taken up
        # the leadership, and its HW may be behind what the partition committed.
        leading = self._streams.is_leading(stream, partition)
        if part is None or not (leading or (allow_replica and self.server_id in meta.isr)):
            raise RpcFailure(Code.FAILED_PRECONDITION, Reason.NOT_LEADER, NOT_LEADER_MESSAGE)
        return part

    def _unavailable(self, part: Partition) -> RpcFailure:
        return RpcFailure(
            Code.UNAVAILABLE,
            Reason.UNAVAILABLE,
            f"partition {part.stream}/{part.id} is unavailable on server {self.server_id}: {part.fenced}",
        )

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
            part = self.hosted(request.stream, request.partition)
        except MetadataError as exc:
            await abort_with(context, failure_from(exc))
        except RpcFailure as failure:
            await abort_with(context, failure)
        return api_pb2.FetchPartitionMetadataResponse(metadata=self._partition_metadata(part.meta, part))

    # -- publish -----------------------------------------------------------

    async def publishable(self, stream: str, partition: int, ack_policy: int) -> tuple[PartitionMeta, bool]:
        """The partition's metadata and whether its stream checks expected offsets, once it may take a publish.

        Resumes a paused partition. Raises RpcFailure: NOT_FOUND, READONLY, UNAVAILABLE (a fenced leader
        here), FAILED_PRECONDITION (ack ALL with too few in-sync replicas).
        """
        try:
            meta = self._streams.metadata.partition(stream, partition)
            if is_internal_stream(stream):
                raise RpcFailure(
                    Code.INVALID_ARGUMENT,
                    Reason.INVALID_ARGUMENT,
                    f"stream {stream!r} is the servers' own: only they write it (SetCursor for cursors)",
                )
            if meta.readonly:
                raise RpcFailure(
                    Code.FAILED_PRECONDITION, Reason.READONLY, f"partition {stream}/{partition} is readonly"
                )
            if meta.paused:
                await self._cluster.resume(stream, partition)
            local = self._streams.partitions.get((stream, partition))
            if local is not None and local.fenced is not None and meta.leader == self.server_id:
                # Its leader is here and takes no writes: the publish would only wait out its ack timeout.
                raise self._unavailable(local)
            if local is not None and meta.leader == self.server_id and not local.accepting:
                await self.until_listening(local)
            # Any server may publish: the message goes to the partition's subject, the leader acks.
            occ = self._streams.occ_enabled(stream)
            min_isr = self._streams.min_isr(stream)
            refusal = admit(AdmissionRules(min_isr, occ=occ), ack_policy, len(meta.isr), 0, -1, None)
            if refusal is Refusal.UNACKED_OCC:
                # Liftbridge's words.
                raise RpcFailure(Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, refusal.value)
            if refusal is Refusal.TOO_FEW_IN_SYNC:
                raise RpcFailure(
                    Code.FAILED_PRECONDITION,
                    Reason.INTERNAL,
                    f"partition {stream}/{partition} has {len(meta.isr)} in-sync replicas "
                    f"({', '.join(meta.isr)}), fewer than min.insync.replicas {min_isr}: "
                    "ack ALL cannot be promised",
                )
        except MetadataError as exc:
            raise failure_from(exc) from exc
        return meta, occ

    async def send(self, req: api_pb2.PublishRequest) -> asyncio.Future[api_pb2.Ack] | None:
        """Validate and publish one request; the future resolves with its ack (None for AckPolicy NONE)."""
        meta, occ = await self.publishable(req.stream, req.partition, req.ackPolicy)
        return await self.send_checked(req, meta, occ)

    async def send_checked(
        self, req: api_pb2.PublishRequest, meta: PartitionMeta, occ: bool
    ) -> asyncio.Future[api_pb2.Ack] | None:
        """:meth:`send` for a request whose partition ``publishable`` just answered (``meta``, ``occ``)."""
        self.check_size(req)
        policy = req.ackPolicy
        message = api_pb2.Message(key=req.key, value=req.value, offset=req.expectedOffset if occ else -1)
        if req.headers:  # copying an empty map field still costs a MutableMapping.update
            message.headers.update(req.headers)
        future = None
        led_here = self.leads(meta)
        if policy != api_pb2.NONE:
            forward = self.client_route(req.ackInbox, req.correlationId)
            message.ackInbox, message.correlationId, future = self._acks.expect(
                meta.subject, policy, req.stream, forward, local=led_here
            )
            message.ackPolicy = policy
        await self._publish_envelope(meta.subject, message, future is not None and led_here)
        return future

    def leads(self, meta: PartitionMeta) -> bool:
        """Whether this server leads the partition (its messages come back to this process's intake)."""
        return meta.leader == self.server_id

    async def until_listening(self, part: Partition) -> None:
        """Wait (up to the ack timeout) until a partition named to lead here listens on its subject.

        Right after an election or a resume the metadata names this server before its intake subscribes;
        a message published then reaches no one on NATS, and its publisher would wait out the ack timeout.
        """
        await part.intake_changes.until(lambda: part.accepting or part.closed_reason is not None, self._ack_timeout)

    def client_route(self, inbox: str, correlation_id: str) -> tuple[str, str]:
        """The caller's own (ack inbox, correlation id), for its ack; with an inbox, the ack goes there too.

        The message itself always names this server's inbox and a route id of its own (``AckRouter``), so
        no ack can reach the call but its own; the answer carries the caller's inbox and id (or none).
        RpcFailure INVALID_ARGUMENT for an inbox the server may not publish to on the caller's behalf.
        """
        if not inbox:
            return inbox, correlation_id
        try:
            self._acks.check_inbox(inbox)
        except InvalidStreamError as exc:
            raise RpcFailure(Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, str(exc)) from exc
        return inbox, correlation_id

    def check_size(self, req: api_pb2.PublishRequest | api_pb2.PublishToSubjectRequest) -> None:
        size = len(req.value) + len(req.key)
        if admit(self._size_rules, AckPolicy.LEADER, 1, size, -1, None) is Refusal.TOO_LARGE:
            raise RpcFailure(
                Code.INVALID_ARGUMENT,
                Reason.TOO_LARGE,
                f"message of {size} bytes is larger than streams.max.message.bytes ({self._max_message_bytes})",
            )

    async def _publish_envelope(self, subject: str, message: api_pb2.Message, led_here: bool = False) -> None:
        payload = encode_publish_message(message)
        await self.publish_payload(subject, payload, message.correlationId, led_here)

    async def publish_payload(
        self, subject: str, payload: bytes, correlation_id: str = "", led_here: bool = False
    ) -> None:
        """Publish on NATS; on failure, forget the ack awaited with ``correlation_id``: RpcFailure.

        ``led_here``: the partition's leader is this server, so the message comes back to this process
        within a NATS round trip, and the loop polls for it instead of sleeping. For a partition led
        elsewhere the answer is the leader's ack, a round trip and a write later: not worth the CPU.
        """
        try:
            await self._publish(subject, payload)
            if led_here and self._keep_hot is not None:
                self._keep_hot()
        except (MaxPayloadError, LeanMaxPayloadError) as exc:
            self._acks.forget(correlation_id)
            raise RpcFailure(
                Code.INVALID_ARGUMENT, Reason.TOO_LARGE, f"message is larger than the NATS max payload: {exc}"
            ) from exc
        except Exception as exc:
            self._acks.forget(correlation_id)
            raise RpcFailure(Code.UNAVAILABLE, Reason.UNAVAILABLE, f"cannot publish to NATS: {exc}") from exc

    def send_publishes_now(self) -> None:
        """A handler published all it had: write it to NATS now rather than a loop turn later.

        One publisher at a time: the reader's pass is done, and waiting for the next loop turn's
        write cost about 4% of its rate (2,890 against 3,000 msgs/s, docs/performance.md).
        """
        if self._send_publishes is not None:
            self._send_publishes()

    def expect_next_publish(self) -> None:
        """A client was just answered for a partition led here: poll for its next request a moment.

        A client publishing one message at a time sends the next within about 100 us of reading its ack;
        waking from epoll for it costs about half that (docs/performance.md). Not after ack ALL answers:
        the followers then still have work to do, and the CPU is theirs.
        """
        if self._keep_hot is not None:
            self._keep_hot()

    def expect_ack(
        self, subject: str, policy: int, stream: str | None, *, local: bool = False
    ) -> tuple[str, str, asyncio.Future[api_pb2.Ack]]:
        """(ack inbox, correlation id, future of the ack) for a message about to be published on ``subject``
        for ``stream`` (None: any stream on the subject), ``local`` if led here; see ``AckRouter.expect``."""
        return self._acks.expect(subject, policy, stream, local=local)

    @property
    def max_message_bytes(self) -> int:
        return self._max_message_bytes

    async def await_ack(self, future: asyncio.Future[api_pb2.Ack], timeout: float | None) -> api_pb2.Ack:
        """The ack, or the RpcFailure its error (or its absence after ``timeout``, at most the ack timeout
        ten times; None: the ack timeout) means."""
        if not future.done():  # acks come in batches: most are here before anyone waits
            await self.until_acked(future, timeout)
        return self.ack_result(future)

    async def until_acked(self, future: asyncio.Future[api_pb2.Ack], timeout: float | None) -> None:
        """Wait for ``future``; RpcFailure DEADLINE_EXCEEDED if it is not done within ``timeout``."""
        timeout = self._ack_timeout if timeout is None else min(timeout, self._ack_timeout * 10)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # One timer that cancels the future: asyncio.timeout() costs a dozen calls per message.
        timer = loop.call_at(deadline, future.cancel)
        try:
            await future
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this call was cancelled, not the ack
            if loop.time() >= deadline:
                raise RpcFailure(
                    Code.DEADLINE_EXCEEDED,
                    Reason.ACK_TIMEOUT,
                    f"no ack within {timeout:.3g}s; the message may not be stored",
                ) from None
            # Otherwise the router cancelled it (the server stops): ack_result says so.
        finally:
            timer.cancel()

    def ack_result(self, future: asyncio.Future[api_pb2.Ack]) -> api_pb2.Ack:
        """A received ack, or the RpcFailure its error means."""
        if future.cancelled():
            raise RpcFailure(Code.UNAVAILABLE, Reason.UNAVAILABLE, "the server is shutting down")
        ack = future.result()
        error = ack.ackError
        if error == api_pb2.Ack.INCORRECT_OFFSET:
            raise RpcFailure(
                Code.FAILED_PRECONDITION, Reason.INCORRECT_OFFSET, f"incorrect expected offset for {ack.stream}"
            )
        if error == api_pb2.Ack.TOO_LARGE:
            raise RpcFailure(
                Code.INVALID_ARGUMENT, Reason.TOO_LARGE, "message is larger than streams.max.message.bytes"
            )
        if error == api_pb2.Ack.ENCRYPTION:
            raise RpcFailure(
                Code.INTERNAL,
                Reason.ENCRYPTION,
                self._write_error(ack)
                or f"stream {ack.stream!r}: the message could not be encrypted; nothing was written",
            )
        if error != api_pb2.Ack.OK:
            reason = self._write_error(ack) or (
                f"stream {ack.stream!r} could not commit the message on {ack.partitionSubject!r} (ack error {error}):"
                " its leader changed or too few replicas are in sync, so it may or may not be stored"
            )
            raise RpcFailure(Code.INTERNAL, Reason.INTERNAL, reason)
        return ack

    def _write_error(self, ack: api_pb2.Ack) -> str | None:
        """Why a local partition could not write (e.g. a full disk), for the error message."""
        stream = self._streams.metadata.streams.get(ack.stream)
        for meta in stream.partitions.values() if stream else ():
            if meta.subject == ack.partitionSubject:
                part = self._streams.partitions.get((ack.stream, meta.id))
                return part.write_error if part else None
        return None

    async def Publish(self, request: api_pb2.PublishRequest, context: ServerContext) -> api_pb2.PublishResponse:
        try:
            future = await self.send(request)
            if future is None:
                return api_pb2.PublishResponse()
            ack = await self.await_ack(future, context.time_remaining())
        except RpcFailure as failure:
            await abort_with(context, failure)
        return api_pb2.PublishResponse(ack=ack)

    async def PublishToSubject(
        self, request: api_pb2.PublishToSubjectRequest, context: ServerContext
    ) -> api_pb2.PublishToSubjectResponse:
        req: api_pb2.PublishToSubjectRequest = request
        try:
            try:
                # Not the cluster's own subjects (Raft, replication, __activity, inboxes): clients do not speak there.
                validate_stream_subject(req.subject, self._cluster.namespace)
            except InvalidStreamError as exc:
                raise RpcFailure(Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, str(exc)) from exc
            if "*" in req.subject.split(".") or req.subject.endswith(">"):
                raise RpcFailure(
                    Code.INVALID_ARGUMENT,
                    Reason.INVALID_ARGUMENT,
                    f"cannot publish to wildcard subject {req.subject!r}",
                )
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
            self.check_size(req)
            message = api_pb2.Message(key=req.key, value=req.value, headers=req.headers, offset=-1)
            future = None
            if req.ackPolicy != api_pb2.NONE:
                forward = self.client_route(req.ackInbox, req.correlationId)
                message.ackInbox, message.correlationId, future = self._acks.expect(
                    req.subject, req.ackPolicy, None, forward
                )
                message.ackPolicy = req.ackPolicy
            await self._publish_envelope(req.subject, message)
            if future is None:
                return api_pb2.PublishToSubjectResponse()
            ack = await self.await_ack(future, context.time_remaining())
        except RpcFailure as failure:
            await abort_with(context, failure)
        return api_pb2.PublishToSubjectResponse(ack=ack)

    async def PublishAsync(
        self, request_iterator: RequestStream[api_pb2.PublishRequest], context: ServerContext
    ) -> None:
        await serve_publish_async(self, request_iterator, context)

    def answer(self, future: asyncio.Future[api_pb2.Ack], cid: str) -> bytes:
        """The encoded PublishResponse for a done ack: the ack, or the asyncError its failure means."""
        try:
            ack = self.ack_result(future)
        except RpcFailure as failure:
            return async_error(cid, failure)
        # The ack carries the caller's own inbox and id already (AckRouter); cid is the request's.
        # PublishResponse{ack = 1, correlationId = 3}, written here: no response message and no copy of the ack.
        encoded = ack.SerializeToString()
        out = b"\x0a" + _varint(len(encoded)) + encoded
        if cid:
            raw = cid.encode()
            out += b"\x1a" + _varint(len(raw)) + raw
        return out

    async_error = staticmethod(async_error)

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
