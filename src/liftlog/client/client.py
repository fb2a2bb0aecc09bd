"""The asyncio client: :class:`Client`, its stream administration, publishing and metadata API.

One :class:`Client` talks gRPC (``proto.API``) to a liftlog or Liftbridge
cluster. It keeps one channel per server address, learns the servers and the
partition leaders from ``FetchMetadata`` and sends partition requests
(publish, subscribe, partition metadata) to the leader. Everything else goes
to any server, failing over to the next address when one is unavailable,
including :meth:`Client.cluster_status`, the one call on liftlog's own
``liftlog.Cluster`` service (:mod:`liftlog.client.cluster`).
Where requests go and how they are retried is the business of its base class
(:mod:`liftlog.client.routing`); ``publish_many`` runs on
:mod:`liftlog.client.publish_async` and ``subscribe`` returns a
:class:`~liftlog.client.subscription.Subscription`.

Retries: requests that fail with :class:`UnavailableError` or
:class:`NotLeaderError` are retried up to ``retries`` times with exponential
backoff, refreshing the metadata in between; other errors are raised at once.
Publishing is therefore *at least once*: a publish retried after the server
became unavailable may have been written the first time.

A :class:`Client` belongs to the event loop it is first used on; the tasks
of that loop may share it and call it concurrently.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import weakref
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, MutableMapping, Sequence
from types import TracebackType
from typing import Any

import nats
import nats.errors
from nats.aio.client import Client as NatsClient

from liftlog.api import api_pb2, batches_pb2, cluster_pb2
from liftlog.api.cursors import CURSORS_STREAM, CursorValueError, cursor_key, cursor_partition, decode_cursor
from liftlog.client.batches import Columns, Fetched, FetchedBatches, decode_batches
from liftlog.client.cluster import (
    ClusterStatus,
    GroupInfo,
    PartitionStatus,
    Policies,
    Reassignment,
    Reassignments,
    not_offered,
)
from liftlog.client.consumer import Consumer, RebalanceCallback
from liftlog.client.errors import (
    AckTimeoutError,
    ConfigurationError,
    InvalidArgumentError,
    LiftlogError,
    NoSuchStreamError,
    NotFoundError,
    StreamExistsError,
    UnavailableError,
    UnimplementedError,
    error_from_ack,
)
from liftlog.client.merged import MergedSubscription
from liftlog.client.msg_ids import HIDDEN_MSG_ID_HEADER, MSG_ID_HEADER, new_msg_id
from liftlog.client.nats_helpers import connect_nats, encode_publish, publish_and_wait_ack, to_bytes, to_headers
from liftlog.client.publish_async import PublishBatch, publish_async_attempt
from liftlog.client.publish_batches import BatchesUnsupported, publish_batched, publish_prepared
from liftlog.client.routing import Routing
from liftlog.client.stubs import Stub
from liftlog.client.subscription import Subscription
from liftlog.client.tls import TlsOption
from liftlog.client.types import (
    Ack,
    AckPolicy,
    CursorInfo,
    Metadata,
    PartitionInfo,
    PublishValue,
    StartPosition,
    StopPosition,
)
from liftlog.storage.records import PreparedRecord

__all__ = ["Client", "Subscription"]


def _message_fields(
    value: bytes | str,
    key: bytes | str | None,
    headers: Mapping[str, bytes | str] | None,
    ack_policy: AckPolicy,
    ack_inbox: str,
    correlation_id: str,
) -> dict[str, Any]:
    """The fields ``PublishRequest`` and ``PublishToSubjectRequest`` share, as constructor arguments."""
    return {
        "value": to_bytes(value),
        "ackPolicy": int(ack_policy),
        "ackInbox": ack_inbox,
        "correlationId": correlation_id,
        "key": b"" if key is None else to_bytes(key),
        "headers": to_headers(headers),
    }


def _checked_ack(ack: api_pb2.Ack) -> Ack:
    """`ack` as an :class:`Ack`, or the error it reports, raised."""
    err = error_from_ack(ack)
    if err is not None:
        raise err
    return Ack.from_proto(ack)


def _ack_of(resp: api_pb2.PublishResponse | api_pb2.PublishToSubjectResponse, ack_policy: AckPolicy) -> Ack | None:
    """The ack of a publish response: None when none was asked for or sent, raised when it reports an error."""
    if ack_policy == AckPolicy.NONE or not resp.HasField("ack"):
        return None
    return _checked_ack(resp.ack)


class Client(Routing):
    """An asyncio client for a liftlog (or Liftbridge) cluster.

    `addresses` are ``host:port`` gRPC addresses of one or more servers (a
    comma-separated string is accepted); the rest of the cluster is learned
    from metadata. `timeout` is the default deadline of each RPC in seconds.
    Failed requests are retried `retries` times on :class:`UnavailableError`
    and :class:`NotLeaderError`, waiting `backoff` seconds, doubling up to
    `max_backoff` (with a little jitter). Partition leaders are cached for
    `metadata_max_age` seconds. `nats_servers` are NATS URLs for
    :meth:`nats_publish`. `tls`: a :class:`TlsConfig` (CA, client
    certificate for mTLS, server name), an ``ssl.SSLContext``, or True for
    TLS with the system's CAs; a server whose certificate fails the checks
    raises :class:`TlsError` at once, without retries. `idempotent` (the
    default): every message published gets an id (the ``Nats-Msg-Id`` header)
    unless it has one, kept across retries, so that a liftlog server stores a
    retried message once (README, "Message ids").

    Use it as ``async with Client("127.0.0.1:9292") as client: ...``; calling
    :meth:`connect` is optional (it checks a server answers), :meth:`close` is
    not.
    """

    def __init__(
        self,
        addresses: str | Sequence[str] = "127.0.0.1:9292",
        *,
        timeout: float = 10.0,
        retries: int = 5,
        backoff: float = 0.05,
        max_backoff: float = 2.0,
        metadata_max_age: float = 30.0,
        nats_servers: Sequence[str] = (),
        tls: TlsOption = None,
        idempotent: bool = True,
    ) -> None:
        super().__init__(
            addresses,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            max_backoff=max_backoff,
            metadata_max_age=metadata_max_age,
            tls=tls,
        )
        self.nats_servers: tuple[str, ...] = tuple(nats_servers)
        self._subscriptions: weakref.WeakSet[Subscription] = weakref.WeakSet()
        self._nc: NatsClient | None = None
        self._nats_lock = asyncio.Lock()
        #: Whether publish_many may use liftlog.Batches (False once a server did not offer it: Liftbridge).
        self._batches_offered = True
        #: Give every message published an id (``Nats-Msg-Id``) unless it has one: retries are then stored once.
        self.idempotent = idempotent

    def _with_msg_id(self, headers: MutableMapping[str, bytes], msg_id: bytes | str | None) -> None:
        """The message's id: ``msg_id`` (as ``Nats-Msg-Id``), the caller's own header, or (idempotent) a new
        random one, in a hidden header readers never see."""
        if msg_id is not None:
            headers[MSG_ID_HEADER] = to_bytes(msg_id)
        elif self.idempotent and MSG_ID_HEADER not in headers:
            headers[HIDDEN_MSG_ID_HEADER] = new_msg_id()

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        """Check that a server answers, and load the cluster metadata.

        Tries each address in turn (``FetchMetadata``), for `retries` more
        rounds with backoff; raises :class:`UnavailableError` naming the
        addresses when none answers. Channels themselves are opened lazily.
        """
        try:
            await self.fetch_metadata()
        except UnavailableError as err:
            raise self._none_answered(err) from err

    def _none_answered(self, err: UnavailableError) -> UnavailableError:
        """`err` naming the addresses tried: gRPC's own message does not say which server it failed to reach."""
        return UnavailableError(
            f"no liftlog server answered at {', '.join(self.addresses)}: {err.message}", code=err.code
        )

    async def close(self) -> None:
        """Close subscriptions, channels and the NATS connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for sub in list(self._subscriptions):
            await sub.close()
        await self._close_channels()
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(nats.errors.Error, OSError):
                await nc.close()

    # ------------------------------------------------------------------ stream administration

    async def create_stream(
        self,
        subject: str,
        name: str,
        *,
        group: str = "",
        replication_factor: int = 1,
        partitions: int = 1,
        retention_max_bytes: int | None = None,
        retention_max_messages: int | None = None,
        retention_max_age_ms: int | None = None,
        cleaner_interval_ms: int | None = None,
        segment_max_bytes: int | None = None,
        segment_max_age_ms: int | None = None,
        compact_enabled: bool | None = None,
        compact_max_goroutines: int | None = None,
        auto_pause_time_ms: int | None = None,
        auto_pause_disable_if_subscribers: bool | None = None,
        min_isr: int | None = None,
        optimistic_concurrency_control: bool | None = None,
        encryption: bool | None = None,
        unclean_leader_election: bool | None = None,
        duplicate_window_ms: int | None = None,
        exist_ok: bool = False,
    ) -> None:
        """Create stream `name` recording NATS `subject` (wildcards allowed).

        `group` spreads the subject over the streams of a queue group;
        `replication_factor` -1 means every server. The per-stream settings
        left None take the server's defaults. `unclean_leader_election`
        (liftlog servers only) lets a replica that is not in sync lead when no
        in-sync one is left, which loses what it lacks. `duplicate_window_ms`
        (liftlog servers only): a message with an id is stored at most once
        per partition within this window (0: off). Raises
        :class:`StreamExistsError` when the name is taken, unless `exist_ok`.
        """
        req = api_pb2.CreateStreamRequest(
            subject=subject, name=name, group=group, replicationFactor=replication_factor, partitions=partitions
        )
        int64s = (
            (req.retentionMaxBytes, retention_max_bytes),
            (req.retentionMaxMessages, retention_max_messages),
            (req.retentionMaxAge, retention_max_age_ms),
            (req.cleanerInterval, cleaner_interval_ms),
            (req.segmentMaxBytes, segment_max_bytes),
            (req.segmentMaxAge, segment_max_age_ms),
            (req.autoPauseTime, auto_pause_time_ms),
            (req.duplicateWindow, duplicate_window_ms),
        )
        for field64, value64 in int64s:
            if value64 is not None:
                field64.CopyFrom(api_pb2.NullableInt64(value=value64))
        for field32, value32 in ((req.compactMaxGoroutines, compact_max_goroutines), (req.minIsr, min_isr)):
            if value32 is not None:
                field32.CopyFrom(api_pb2.NullableInt32(value=value32))
        bools = (
            (req.compactEnabled, compact_enabled),
            (req.autoPauseDisableIfSubscribers, auto_pause_disable_if_subscribers),
            (req.optimisticConcurrencyControl, optimistic_concurrency_control),
            (req.encryption, encryption),
            (req.uncleanLeaderElection, unclean_leader_election),
        )
        for field_b, value_b in bools:
            if value_b is not None:
                field_b.CopyFrom(api_pb2.NullableBool(value=value_b))
        try:
            await self._call_any("create_stream", req)
        except StreamExistsError:
            if not exist_ok:
                raise
        finally:
            self._streams.pop(name, None)

    async def delete_stream(self, name: str) -> None:
        """Delete stream `name` and its data (:class:`NoSuchStreamError` if there is none)."""
        try:
            await self._call_any("delete_stream", api_pb2.DeleteStreamRequest(name=name))
        finally:
            self._streams.pop(name, None)

    async def pause_stream(self, name: str, partitions: Sequence[int] = (), resume_all: bool = False) -> None:
        """Pause `partitions` of stream `name` (all of them when empty).

        A paused partition resumes when published to or subscribed to with
        ``resume=True``; with `resume_all`, resuming one resumes all.
        """
        req = api_pb2.PauseStreamRequest(name=name, partitions=list(partitions), resumeAll=resume_all)
        await self._call_any("pause_stream", req)

    async def set_stream_readonly(self, name: str, partitions: Sequence[int] = (), readonly: bool = True) -> None:
        """Set (or with ``readonly=False`` clear) the readonly flag of `partitions` (all when empty)."""
        req = api_pb2.SetStreamReadonlyRequest(name=name, partitions=list(partitions), readonly=readonly)
        await self._call_any("set_stream_readonly", req)

    # ------------------------------------------------------------------ publishing

    async def publish(
        self,
        stream: str,
        value: bytes | str,
        *,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: Mapping[str, bytes | str] | None = None,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        expected_offset: int | None = None,
        ack_inbox: str = "",
        correlation_id: str = "",
        timeout: float | None = None,
        msg_id: bytes | str | None = None,
    ) -> Ack | None:
        """Publish one message to a stream partition (the ``Publish`` RPC, sent to the leader).

        With `partition` None the message goes to partition 0, or, when a
        `key` is given and the stream has several partitions, to partition
        ``zlib.crc32(key) % partitions`` (the Liftbridge clients' key
        partitioner). `expected_offset` only matters on streams with
        optimistic concurrency control: the message is written only if it
        gets that offset; None sends -1, "no expectation", as Liftbridge's
        clients do. `timeout`
        (default: the client's) bounds the wait for the ack; it raises
        :class:`AckTimeoutError`. Returns the :class:`Ack`, or None with
        ``AckPolicy.NONE``. A message the server refuses raises (for example
        :class:`IncorrectOffsetError`, :class:`ReadonlyError`). Retried on
        :class:`NotLeaderError` and :class:`UnavailableError`, with the same
        `msg_id` (by default a new random one, see the class): a liftlog server
        stores it once, and answers a retry of a stored message with its
        offset and ``Ack.duplicate``.
        """
        self.check_open()
        req = api_pb2.PublishRequest(
            stream=stream,
            expectedOffset=-1 if expected_offset is None else expected_offset,
            **_message_fields(value, key, headers, ack_policy, ack_inbox, correlation_id),
        )
        self._with_msg_id(req.headers, msg_id)
        if partition is None:
            partition = await self._partition_for_key(stream, req.key)
        req.partition = partition
        deadline = self.timeout if timeout is None else timeout

        async def call(stub: Stub) -> api_pb2.PublishResponse:
            resp: api_pb2.PublishResponse = await stub.publish(req, timeout=deadline)
            return resp

        resp = await self.call_leader(stream, partition, call, timeout_error=AckTimeoutError)
        return _ack_of(resp, ack_policy)

    async def publish_to_subject(
        self,
        subject: str,
        value: bytes | str,
        *,
        key: bytes | str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        ack_inbox: str = "",
        correlation_id: str = "",
        timeout: float | None = None,
        msg_id: bytes | str | None = None,
    ) -> Ack | None:
        """Publish one message to NATS `subject` through any server (``PublishToSubject``).

        Every stream listening on the subject records it; the first ack is
        returned (None with ``AckPolicy.NONE`` or when no stream acked). Raises
        :class:`AckTimeoutError` when no ack comes within `timeout`.
        """
        self.check_open()
        req = api_pb2.PublishToSubjectRequest(
            subject=subject, **_message_fields(value, key, headers, ack_policy, ack_inbox, correlation_id)
        )
        self._with_msg_id(req.headers, msg_id)
        deadline = self.timeout if timeout is None else timeout
        resp: api_pb2.PublishToSubjectResponse = await self._call_any(
            "publish_to_subject", req, timeout=deadline, timeout_error=AckTimeoutError
        )
        return _ack_of(resp, ack_policy)

    async def publish_many(
        self,
        stream: str,
        values: Iterable[PublishValue] | AsyncIterable[PublishValue],
        *,
        partition: int = 0,
        key: bytes | str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
        ack_policy: AckPolicy = AckPolicy.LEADER,
        window: int = 2000,
        timeout: float | None = None,
        resend_unacked: bool = True,
        return_acks: bool = True,
    ) -> list[Ack]:
        """Publish many messages to one partition, pipelined: batched requests, or one ``PublishAsync`` call.

        At most `window` messages are unacknowledged at a time (by default
        2000: two chunks of 1000 in flight against a liftlog server). Returns the
        acks in input order (an empty list with ``AckPolicy.NONE``, which gets
        no acks). `timeout` (default: the client's) is the longest wait for
        progress, not for the whole batch: :class:`AckTimeoutError` when no ack
        arrives for that long while some are owed. An :class:`OutgoingMessage`
        in `values` carries its own key and headers, and so does a
        :class:`~liftlog.storage.records.NewRecord` (bytes only; sent as it is). With `return_acks` False
        the call still waits for every ack but returns an empty list: a bulk
        load saves building one :class:`Ack` per message.

        A refused message raises the :class:`PublishAsyncFailed` of the first
        refusal (also the specific class, e.g. :class:`ReadonlyError`), with
        ``correlation_id`` and ``acks``, the acks received so far. When the
        call fails with :class:`NotLeaderError` or :class:`UnavailableError`,
        it is retried on the (new) leader, resending the unacknowledged
        messages: delivery is at least once. With ``AckPolicy.NONE``, or with
        `resend_unacked` False (for a caller that checks the log itself
        before sending again), it is retried only if nothing was sent yet.

        Against a liftlog server the messages go in chunks of up to `window`
        (at most 1000 and 256 KiB), one ``liftlog.Batches/Publish`` request
        each, stored atomically and acknowledged together (see
        :mod:`liftlog.client.publish_batches`): many times faster, but the
        stored messages and their acks carry no correlation id, and a chunk's
        refusal refuses all of it. Liftbridge servers get ``PublishAsync``.
        """
        self.check_open()
        if window < 1:
            raise InvalidArgumentError(f"window must be at least 1, got {window}")
        want_acks = ack_policy != AckPolicy.NONE
        deadline = self.timeout if timeout is None else timeout
        if self._batches_offered:
            try:
                return await publish_batched(
                    self,
                    stream,
                    values,
                    partition=partition,
                    key=key,
                    headers=headers,
                    ack_policy=ack_policy,
                    window=window,
                    timeout=deadline,
                    resend_unacked=resend_unacked,
                    return_acks=return_acks,
                    msg_ids=self.idempotent,
                )
            except BatchesUnsupported as unsupported:
                self._batches_offered = False  # a Liftbridge server: PublishAsync from now on
                values = unsupported.values
        batch = PublishBatch(
            values, stream=stream, partition=partition, key=key, headers=headers, ack_policy=ack_policy
        )

        def retryable() -> bool:
            return (want_acks and resend_unacked) or batch.count == 0

        async def attempt(stub: Stub) -> None:
            await publish_async_attempt(stub, batch, window, deadline)

        await self.call_leader(stream, partition, attempt, timeout_error=AckTimeoutError, retryable=retryable)
        if not want_acks:
            return []
        acks = [a for a in batch.acks if a is not None]
        if not return_acks:
            acks = []
        if len(acks) != len(batch.acks):  # cannot happen: the attempt raises while some are pending
            raise LiftlogError(f"{len(batch.acks) - len(acks)} messages were not acknowledged")
        return acks

    async def publish_prepared(
        self,
        stream: str,
        records: Sequence[PreparedRecord],
        *,
        partition: int = 0,
        ack_policy: AckPolicy = AckPolicy.ALL,
        window: int = 2000,
        timeout: float | None = None,
        resend_unacked: bool = True,
    ) -> None:
        """Publish records already in the storage's terms (:data:`~liftlog.storage.records.PreparedRecord`).

        :meth:`publish_many` for writers that make millions of records and
        encode their headers once (the Spark sink): the same chunks, window,
        timeout, retries and errors, and no acks returned. Liftbridge servers
        have no batched publish: this raises :class:`UnimplementedError`
        before anything is stored; use :meth:`publish_many` there.
        """
        self.check_open()
        if window < 1:
            raise InvalidArgumentError(f"window must be at least 1, got {window}")
        if not self._batches_offered:
            raise UnimplementedError(
                "the server offers no batched publish (liftlog.Batches/Publish): a Liftbridge server"
            )
        try:
            await publish_prepared(
                self,
                stream,
                records,
                partition=partition,
                ack_policy=ack_policy,
                window=window,
                timeout=self.timeout if timeout is None else timeout,
                resend_unacked=resend_unacked,
            )
        except UnimplementedError:
            self._batches_offered = False
            raise

    # ------------------------------------------------------------------ subscribing

    def subscribe(
        self,
        stream: str,
        *,
        partition: int = 0,
        start_position: StartPosition = StartPosition.NEW_ONLY,
        start_offset: int = 0,
        start_timestamp: int = 0,
        stop_position: StopPosition = StopPosition.STOP_ON_CANCEL,
        stop_offset: int = 0,
        stop_timestamp: int = 0,
        read_isr_replica: bool = False,
        resume: bool = False,
        read_uncommitted: bool = False,
        batched: bool = True,
        consumer: api_pb2.Consumer | None = None,
    ) -> Subscription:
        """Subscribe to one partition of a stream (``partition``, 0 by default); see :class:`Subscription`.

        A stream of several partitions needs :meth:`subscribe_all` (every partition, merged by time) or a
        subscription per partition: this one alone sees only its partition's messages.

        `start_position` picks where to begin (`start_offset`, or
        `start_timestamp` in Unix ns, for OFFSET and TIMESTAMP) and
        `stop_position` where to end. With `read_isr_replica` any in-sync
        replica may serve it; `resume` resumes a paused partition.

        `read_uncommitted` (liftlog servers only) also delivers messages the
        in-sync replicas do not all have yet. This is unsafe: such a message
        can vanish in a leader change, and its offset then holds another one.
        Use it only where lower latency matters more than that.

        With `batched` (the default) a liftlog server sends its stored record
        batches, which this client decodes into the same messages several
        times faster; `batched=False` asks for one gRPC message per record,
        which is what Liftbridge servers always send.

        `consumer` names a consumer group member (group, epoch, consumer id): the
        server then serves the partition only while that member holds it. Use
        :meth:`consumer` rather than setting it yourself.
        """
        self.check_open()
        req = api_pb2.SubscribeRequest(
            consumer=consumer,
            stream=stream,
            partition=partition,
            startPosition=int(start_position),  # type: ignore[arg-type]
            startOffset=start_offset,
            startTimestamp=start_timestamp,
            stopPosition=int(stop_position),  # type: ignore[arg-type]
            stopOffset=stop_offset,
            stopTimestamp=stop_timestamp,
            readISRReplica=read_isr_replica,
            resume=resume,
        )
        sub = Subscription(self, req, read_uncommitted=read_uncommitted, batched=batched)
        self._subscriptions.add(sub)
        return sub

    def subscribe_all(
        self,
        stream: str,
        *,
        partitions: Sequence[int] | None = None,
        start_position: StartPosition = StartPosition.NEW_ONLY,
        start_offset: int = 0,
        start_timestamp: int = 0,
        stop_position: StopPosition = StopPosition.STOP_ON_CANCEL,
        stop_offset: int = 0,
        stop_timestamp: int = 0,
        read_isr_replica: bool = False,
        resume: bool = False,
        batched: bool = True,
    ) -> MergedSubscription:
        """Subscribe to every partition of a stream (or to ``partitions``) as one iterator, merged by time.

        :meth:`subscribe` reads one partition (0 unless told): a stream of several partitions needs
        this, or one subscription per partition. The positions apply to each partition (an offset
        means the same offset in each). Messages come in the order of their timestamps across
        partitions (see :class:`~liftlog.client.merged.MergedSubscription`), each partition's in log
        order; ``msg.partition`` says where each came from::

            async with client.subscribe_all("orders", start_position=StartPosition.EARLIEST) as sub:
                async for msg in sub:
                    print(msg.partition, msg.offset, msg.value)

        Starting it raises :class:`NoSuchStreamError` or :class:`NoSuchPartitionError`.
        """
        self.check_open()

        def one(partition: int) -> Subscription:
            return self.subscribe(
                stream,
                partition=partition,
                start_position=start_position,
                start_offset=start_offset,
                start_timestamp=start_timestamp,
                stop_position=stop_position,
                stop_offset=stop_offset,
                stop_timestamp=stop_timestamp,
                read_isr_replica=read_isr_replica,
                resume=resume,
                batched=batched,
            )

        # The backlog a following merge keeps in time order: what a partition holds from its start on.
        backlog = start_position in (StartPosition.EARLIEST, StartPosition.OFFSET, StartPosition.TIMESTAMP)
        return MergedSubscription(self, stream, partitions, one, stop_position, backlog=backlog)

    async def fetch(
        self,
        stream: str,
        *,
        partition: int = 0,
        offset: int = 0,
        end_offset: int | None = None,
        max_bytes: int = 0,
        max_wait: float = 0.0,
        read_isr_replica: bool = False,
        resume: bool = False,
        headers: bool = True,
        fields: bool = True,
    ) -> Fetched:
        """One fetch of stored record batches (liftlog's ``liftlog.Batches/Fetch``), decoded into columns.

        Returns the committed records from `offset` on (before `end_offset`),
        about `max_bytes` of them (0: the server's 1 MiB), waiting up to
        `max_wait` seconds when there are none yet. `headers` and `fields`
        decode user headers and the reply, ack inbox, correlation id and ack
        policy (needed for :meth:`Columns.messages`); leave them off when only
        keys, values, subjects, offsets and timestamps matter. Raises
        :class:`OffsetOutOfRangeError` for an offset retention removed or past
        the log's end, :class:`CorruptDataError` for batches that fail their
        check, and :class:`UnimplementedError` against a Liftbridge server.
        """
        got = await self.fetch_batches(
            stream,
            partition=partition,
            offset=offset,
            end_offset=end_offset,
            max_bytes=max_bytes,
            max_wait=max_wait,
            read_isr_replica=read_isr_replica,
            resume=resume,
        )
        cols, _ = decode_batches(
            got.batches,
            got.start,
            got.limit,
            got.subject,
            out=Columns(stream, partition),
            headers=headers,
            fields=fields,
        )
        return Fetched(cols, got.high_watermark, got.log_start_offset, got.next_offset)

    async def fetch_batches(
        self,
        stream: str,
        *,
        partition: int = 0,
        offset: int = 0,
        end_offset: int | None = None,
        max_bytes: int = 0,
        max_wait: float = 0.0,
        read_isr_replica: bool = False,
        resume: bool = False,
    ) -> FetchedBatches:
        """:meth:`fetch` without the decoding: the stored batches as bytes, for readers that decode them their way.

        The bytes are whole batches as the leader stored them, unchecked: pass
        them to :func:`~liftlog.client.batches.decode_batches` (which checks each
        batch's CRC) with the answer's ``start`` and ``limit``, or check them as
        it does. The same arguments and errors as :meth:`fetch`.
        """
        self.check_open()
        if offset < 0 or (end_offset is not None and end_offset < 0) or max_bytes < 0 or max_wait < 0:
            raise InvalidArgumentError("offset, end_offset, max_bytes and max_wait must not be negative")
        if end_offset == 0:
            return FetchedBatches(b"", offset, 0, "", -1, 0, 0)
        req = batches_pb2.FetchRequest(
            stream=stream,
            partition=partition,
            offset=offset,
            endOffset=end_offset or 0,
            maxBytes=max_bytes,
            maxWaitMs=int(max_wait * 1000),
            readISRReplica=read_isr_replica,
            resume=resume,
        )
        deadline = self.timeout + max_wait

        async def call(stub: Stub) -> batches_pb2.FetchResponse:
            resp: batches_pb2.FetchResponse = await stub.fetch_batches(req, timeout=deadline)
            return resp

        resp = await self.call_leader(stream, partition, call, isr=read_isr_replica)
        limit = resp.nextOffset if end_offset is None else min(end_offset, resp.nextOffset)
        return FetchedBatches(
            resp.batches,
            offset,
            limit,
            resp.subject,
            resp.highWatermark,
            resp.logStartOffset,
            max(resp.nextOffset, offset),
        )

    async def read_range(
        self,
        stream: str,
        *,
        partition: int = 0,
        start_offset: int = 0,
        end_offset: int | None = None,
        max_bytes: int = 0,
        read_isr_replica: bool = False,
        headers: bool = True,
        fields: bool = True,
    ) -> AsyncIterator[Columns]:
        """The committed records of ``[start_offset, end_offset)`` as :class:`Columns`, one per fetch.

        Without `end_offset` it reads up to the high watermark the first fetch
        reports. Fetches follow the partition's leader (a failover costs a
        retry, not the read); offsets compaction removed are skipped. See
        :meth:`fetch` for `max_bytes`, `headers`, `fields` and the errors.
        """
        offset = start_offset
        end = end_offset
        while end is None or offset < end:
            got = await self.fetch(
                stream,
                partition=partition,
                offset=offset,
                end_offset=end,
                max_bytes=max_bytes,
                read_isr_replica=read_isr_replica,
                headers=headers,
                fields=fields,
            )
            if end is None:
                end = got.high_watermark + 1
                if offset >= end:
                    return
            if got.columns:
                yield got.columns
            if got.next_offset <= offset:
                # Nothing committed past here (a leader whose high watermark went back): wait, then ask again.
                await asyncio.sleep(0.05)
            offset = got.next_offset

    # ------------------------------------------------------------------ metadata

    # ------------------------------------------------------------------ consumer groups

    def consumer(
        self,
        group_id: str,
        streams: Sequence[str],
        *,
        consumer_id: str | None = None,
        auto_checkpoint: float | None = 5.0,
        start_position: StartPosition = StartPosition.NEW_ONLY,
        fetch_interval: float | None = None,
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
    ) -> Consumer:
        """A member of consumer group `group_id` reading `streams`: see :class:`~liftlog.client.Consumer`.

        The group shares the streams' partitions among its members, one member per
        partition; each resumes after the group's last checkpoint (the cursor
        ``__group:<group_id>``, stored every `auto_checkpoint` seconds and at close),
        else at `start_position`. `on_assign` / `on_revoke` get the (stream,
        partition) pairs gained or lost at each rebalance. Servers need cursors on
        (``cursors.stream.partitions``) for checkpoints.
        """
        self.check_open()
        return Consumer(
            self,
            group_id,
            streams,
            consumer_id=consumer_id,
            auto_checkpoint=auto_checkpoint,
            start_position=start_position,
            fetch_interval=fetch_interval,
            on_assign=on_assign,
            on_revoke=on_revoke,
        )

    # ------------------------------------------------------------------ cursors

    async def set_cursor(self, cursor_id: str, stream: str, offset: int, *, partition: int = 0) -> None:
        """Store `offset` as cursor `cursor_id` of `stream`'s `partition`; durable when this returns.

        Cursors live in the servers' compacted ``__cursors`` stream (servers need
        ``cursors.stream.partitions`` > 0): the call goes to the leader of the
        cursor's partition of it, as Liftbridge's clients send it. The newest
        write wins. Store the offset of the last message you processed and
        resume at the one after it.
        """
        req = api_pb2.SetCursorRequest(stream=stream, partition=partition, cursorId=cursor_id, offset=offset)
        await self._cursor_call("set_cursor", req, cursor_key(cursor_id, stream, partition))

    async def fetch_cursor(self, cursor_id: str, stream: str, *, partition: int = 0) -> int:
        """The offset stored as cursor `cursor_id` of `stream`'s `partition`, -1 if none is."""
        req = api_pb2.FetchCursorRequest(stream=stream, partition=partition, cursorId=cursor_id)
        resp: api_pb2.FetchCursorResponse = await self._cursor_call(
            "fetch_cursor", req, cursor_key(cursor_id, stream, partition)
        )
        return resp.offset

    async def cursors(self, stream: str | None = None) -> list[CursorInfo]:
        """Every cursor stored (of ``stream`` only, if given), sorted by stream, partition and id.

        Reads the servers' ``__cursors`` stream to its end, newest value per cursor; consumer groups'
        checkpoints are the cursors named ``__group:<group>``. Liftbridge servers keep cursors the same
        way. Raises :class:`NoSuchStreamError` when cursors are off (no ``__cursors``).
        """
        found: dict[bytes, CursorInfo] = {}
        sub = self.subscribe_all(
            CURSORS_STREAM, start_position=StartPosition.EARLIEST, stop_position=StopPosition.STOP_LATEST
        )
        async with sub:
            async for msg in sub:
                try:
                    cursor = decode_cursor(msg.value)
                except CursorValueError:
                    continue  # not a cursor (nothing a server writes): not shown
                if stream is None or cursor.stream == stream:
                    found[msg.key or b""] = CursorInfo(cursor.cursorId, cursor.stream, cursor.partition, cursor.offset)
        return sorted(found.values(), key=lambda c: (c.stream, c.partition, c.cursor_id))

    async def _cursor_call(self, method: str, req: object, key: bytes) -> Any:
        self.check_open()
        info = self._cached_stream(CURSORS_STREAM)
        if info is None:
            try:
                info = await self._refresh_stream(CURSORS_STREAM)
            except NoSuchStreamError:
                # No __cursors (yet): any server says why (cursors off, or about to be created).
                return await self._call_any(method, req)
        pid = cursor_partition(key, len(info.partitions))

        async def call(stub: Stub) -> Any:
            return await getattr(stub, method)(req, timeout=self.timeout)

        return await self.call_leader(CURSORS_STREAM, pid, call)

    async def fetch_metadata(self, *streams: str) -> Metadata:
        """Describe the brokers and the given streams (all streams when none are given).

        Refreshes the client's cache of partition leaders as a side effect.
        """
        self.check_open()
        return await self._fetch_metadata(*streams)

    async def fetch_group_metadata(self, group_id: str) -> tuple[str, int]:
        """(coordinator, epoch) of consumer group `group_id` (Liftbridge's FetchMetadata of a group).

        Raises :class:`NotFoundError` when the group does not exist.
        """
        self.check_open()
        req = api_pb2.FetchMetadataRequest(groups=[group_id])
        resp: api_pb2.FetchMetadataResponse = await self._call_any("fetch_metadata", req)
        for meta in resp.groupMetadata:
            if meta.groupId == group_id and meta.error == api_pb2.ConsumerGroupMetadata.OK:
                return meta.coordinator, meta.epoch
        raise NotFoundError(f"consumer group does not exist: {group_id!r}")

    async def fetch_partition_metadata(self, stream: str, partition: int = 0) -> PartitionInfo:
        """Up-to-date metadata of one partition (high watermark, newest offset), asked of its leader."""
        self.check_open()
        req = api_pb2.FetchPartitionMetadataRequest(stream=stream, partition=partition)
        deadline = self.timeout

        async def call(stub: Stub) -> api_pb2.FetchPartitionMetadataResponse:
            resp: api_pb2.FetchPartitionMetadataResponse = await stub.fetch_partition_metadata(req, timeout=deadline)
            return resp

        resp = await self.call_leader(stream, partition, call)
        return PartitionInfo.from_proto(resp.metadata)

    async def cluster_status(self) -> ClusterStatus:
        """The cluster as any one server sees it (liftlog's ``liftlog.Cluster/Status``).

        Sent to any server, failing over and retrying on
        :class:`UnavailableError` like the other cluster-wide calls. It needs no
        metadata first, so it also answers while the cluster has no controller.
        Raises :class:`UnavailableError` naming the addresses when no server
        answers (the server's own error when one answers that it cannot
        serve), and :class:`UnimplementedError` when the server has no
        ``liftlog.Cluster`` service, as a Liftbridge server does not.
        """
        self.check_open()
        try:
            resp: cluster_pb2.ClusterStatusResponse = await self._call_any(
                "cluster_status", cluster_pb2.ClusterStatusRequest()
            )
        except UnavailableError as err:
            if err.reason is not None:  # a liftlog server answered, and says why it cannot serve
                raise
            raise self._none_answered(err) from err
        except UnimplementedError as err:
            replacement = not_offered(err)
            if replacement is None:
                raise
            raise replacement from err
        status = ClusterStatus.from_proto(resp)
        # Fenced replicas are each server's own knowledge: ask the other live servers for theirs.
        others = [s for s in status.servers if s.alive and s.id != status.server_id]
        answers = await asyncio.gather(
            *(
                self._stub(f"{s.host}:{s.port}").cluster_status(cluster_pb2.ClusterStatusRequest(), timeout=2.0)
                for s in others
            ),
            return_exceptions=True,
        )
        fenced = list(status.fenced)
        unreachable = []
        without_secret = list(status.without_secret)
        dropped = list(status.dropped)
        keys = list(status.encryption_keys)
        for server, answer in zip(others, answers, strict=True):
            if isinstance(answer, BaseException):
                unreachable.append(server.id)
            else:
                fenced.extend(PartitionStatus.from_proto(p) for p in answer.fenced)
                if not answer.clusterAuth:
                    without_secret.append(server.id)
                dropped.extend((server.id, reason, n) for reason, n in sorted(answer.droppedInternal.items()))
                keys.append((server.id, tuple(answer.encryptionKeys)))
        return dataclasses.replace(
            status,
            fenced=tuple(fenced),
            unreachable=tuple(unreachable),
            without_secret=tuple(without_secret),
            dropped=tuple(dropped),
            encryption_keys=tuple(keys),
        )

    async def _cluster_call(self, method: str, request: object, timeout: float | None = None) -> Any:
        """A ``liftlog.Cluster`` call to any server, its UNIMPLEMENTED explained."""
        self.check_open()
        try:
            return await self._call_any(method, request, timeout=timeout)
        except UnimplementedError as err:
            replacement = not_offered(err)
            if replacement is None:
                raise
            raise replacement from err

    async def reassign(
        self, moves: Mapping[tuple[str, int], Sequence[str]] | None = None, *, spread: bool = False
    ) -> list[Reassignment]:
        """Start moving partitions: each ``(stream, partition)`` to the replicas named (the first becomes
        its preferred leader), and with ``spread`` as the controller plans to even out replica counts over
        the live servers (for servers just added). Returns the reassignments under way once committed;
        the data moves afterwards (follow it with :meth:`reassignments`).

        Raises :class:`FailedPreconditionError` when the cluster's state refuses a move (a partition
        already moving, a server not alive), :class:`InvalidArgumentError` for unknown servers or a
        server named twice, :class:`NoSuchPartitionError` for an unknown partition.
        """
        req = cluster_pb2.ReassignRequest(spread=spread)
        for (stream, partition), replicas in (moves or {}).items():
            req.partitions.append(cluster_pb2.PartitionReplicas(stream=stream, partition=partition, replicas=replicas))
        resp: cluster_pb2.ReassignResponse = await self._cluster_call("reassign", req)
        return [Reassignment.from_proto(r) for r in resp.reassignments]

    async def decommission(self, server: str) -> list[Reassignment]:
        """Move every replica off ``server``; once it holds none, the controller removes it from the cluster.

        Raises :class:`FailedPreconditionError` saying why when that would lose the metadata quorum, the
        last in-sync replica of a partition, or leave a partition with nowhere to go.
        """
        req = cluster_pb2.DecommissionRequest(server=server)
        resp: cluster_pb2.DecommissionResponse = await self._cluster_call("decommission", req)
        return [Reassignment.from_proto(r) for r in resp.reassignments]

    async def elect_preferred_leaders(self) -> int:
        """Hand leadership back to each partition's preferred replica where it can take it; returns how many."""
        resp: cluster_pb2.ElectPreferredLeadersResponse = await self._cluster_call(
            "elect_preferred_leaders", cluster_pb2.ElectPreferredLeadersRequest()
        )
        return resp.changed

    async def add_policy(self, subject: str, resource: str, action: str) -> None:
        """Let `subject` (a client certificate's identity, or ``*``) do `action` (an RPC's name, or ``*``) on
        `resource` (a stream, a glob pattern, or ``*``), on every server; returns once committed."""
        policy = cluster_pb2.Policy(subject=subject, resource=resource, action=action)
        await self._cluster_call("add_policy", cluster_pb2.PolicyRequest(policy=policy))

    async def revoke_policy(self, subject: str, resource: str, action: str) -> None:
        """Remove the policy that exactly matches (nothing happens if there is none)."""
        policy = cluster_pb2.Policy(subject=subject, resource=resource, action=action)
        await self._cluster_call("revoke_policy", cluster_pb2.PolicyRequest(policy=policy))

    async def list_policies(self) -> Policies:
        resp: cluster_pb2.ListPoliciesResponse = await self._cluster_call(
            "list_policies", cluster_pb2.ListPoliciesRequest()
        )
        rules = tuple((p.subject, p.resource, p.action) for p in resp.policies)
        return Policies(rules, resp.enforced, resp.fromFiles)

    async def groups(self, *names: str) -> list[GroupInfo]:
        """Consumer groups (all, or those named; unknown names are left out): members and assignments."""
        resp: cluster_pb2.GroupsResponse = await self._cluster_call(
            "groups", cluster_pb2.GroupsRequest(groups=list(names))
        )
        return [GroupInfo.from_proto(g) for g in resp.groups]

    async def reassignments(self) -> Reassignments:
        """The reassignments under way, with each new replica's progress as its partition's leader reports it."""
        resp: cluster_pb2.ReassignmentsResponse = await self._cluster_call(
            "reassignments", cluster_pb2.ReassignmentsRequest()
        )
        moving = {(r.stream, r.partition): Reassignment.from_proto(r) for r in resp.reassignments}
        leaders = {r.leader for r in moving.values() if not r.progress and r.leader != resp.serverId}
        if leaders:
            status = await self.cluster_status()
            addresses = {s.id: s.address for s in status.servers}
            answers = await asyncio.gather(
                *(
                    self._stub(addresses[leader]).reassignments(cluster_pb2.ReassignmentsRequest(), timeout=2.0)
                    for leader in sorted(leaders)
                    if leader in addresses
                ),
                return_exceptions=True,
            )
            for answer in answers:
                if isinstance(answer, BaseException):
                    continue
                for r in answer.reassignments:
                    key = (r.stream, r.partition)
                    if r.replicas and key in moving:
                        moving[key] = Reassignment.from_proto(r)
        return Reassignments(tuple(moving.values()), tuple(resp.leaving))

    # ------------------------------------------------------------------ plain NATS

    async def nats_publish(
        self,
        subject: str,
        value: bytes | str,
        *,
        key: bytes | str | None = None,
        headers: Mapping[str, bytes | str] | None = None,
        ack_policy: AckPolicy = AckPolicy.NONE,
        envelope: bool = True,
        timeout: float | None = None,
        msg_id: bytes | str | None = None,
    ) -> Ack | None:
        """Publish on NATS `subject` directly (connecting to `nats_servers` on first use).

        The payload is a Publish envelope carrying key, headers and value, or,
        with ``envelope=False``, the raw value (no key, headers or ack then).
        With an `ack_policy` other than NONE it waits up to `timeout` for the
        Ack on a fresh inbox and returns it (:class:`AckTimeoutError`
        otherwise). Raises :class:`ConfigurationError` when the client has no
        NATS servers.
        """
        self.check_open()
        nc = await self._nats()
        if not envelope and (key is not None or headers or ack_policy != AckPolicy.NONE):
            raise InvalidArgumentError("key, headers and acks need an envelope (envelope=True)")
        if envelope:  # the id rides in the envelope's headers (a raw value has none)
            with_id: dict[str, bytes] = to_headers(headers) if headers else {}
            self._with_msg_id(with_id, msg_id)
            headers = with_id or None
        if ack_policy == AckPolicy.NONE:  # fire and forget
            if envelope:
                payload = encode_publish(value, key=key, headers=headers, ack_policy=ack_policy)
            else:
                payload = to_bytes(value)
            try:
                await nc.publish(subject, payload)
            except nats.errors.Error as exc:
                raise UnavailableError(f"NATS publish to {subject} failed: {exc}") from exc
            return None
        inbox = nc.new_inbox()
        correlation_id = secrets.token_hex(8)
        payload = encode_publish(
            value, key=key, headers=headers, ack_inbox=inbox, correlation_id=correlation_id, ack_policy=ack_policy
        )
        deadline = self.timeout if timeout is None else timeout
        ack = await publish_and_wait_ack(nc, subject, payload, inbox, deadline)
        return _checked_ack(ack)

    async def _nats(self) -> NatsClient:
        if self._nc is not None and not self._nc.is_closed:
            return self._nc
        if not self.nats_servers:
            raise ConfigurationError("no NATS servers configured: pass nats_servers=[...] to Client")
        async with self._nats_lock:
            if self._nc is None or self._nc.is_closed:
                # A connection that gives up reconnecting is closed and replaced by a new one on the next publish.
                self._nc = await connect_nats(
                    self.nats_servers, timeout=self.timeout, retries=self.retries, backoff=self.backoff
                )
            return self._nc
