"""Taking a publish for a client: the front door's checks, the NATS publish, and waiting for the ack.

Publishes go through NATS, as in Liftbridge: the request becomes a Publish envelope (or, for
PublishAsync and the Batches service, a record batch) on the partition's subject, so every stream on
that subject (and every plain NATS subscriber) sees it; the ack comes back from the partition's leader
through the ``AckRouter``. Every method raises ``RpcFailure`` naming what went wrong; the handlers turn
it into the call's status (or, in PublishAsync, the request's asyncError).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from nats.errors import MaxPayloadError

from liftlog.api import api_pb2
from liftlog.api.envelope import encode_publish_message
from liftlog.api.errors import Reason
from liftlog.api.stored import varint as _varint
from liftlog.metadata import (
    InvalidStreamError,
    MetadataError,
    PartitionMeta,
    is_internal_stream,
    validate_stream_subject,
)
from liftlog.natswire import MaxPayloadError as LeanMaxPayloadError
from liftlog.replication.admission import AckPolicy, AdmissionRules, Refusal, admit
from liftlog.rpc import StatusCode as Code
from liftlog.server.api.failures import RpcFailure, async_error, failure_from
from liftlog.server.api.reads import PartitionReads
from liftlog.server.control.cluster import MetadataService
from liftlog.server.partitions.acks import AckRouter
from liftlog.server.partitions.partition import Partition
from liftlog.server.partitions.streams import StreamManager

__all__ = ["Publisher"]

Publish = Callable[[str, bytes], Awaitable[None]]


class Publisher:
    def __init__(
        self,
        *,
        server_id: str,
        streams: StreamManager,
        cluster: MetadataService,
        reads: PartitionReads,
        acks: AckRouter,
        publish: Publish,
        ack_timeout: float,
        max_message_bytes: int,
        keep_hot: Callable[[], None] | None = None,
        send_publishes: Callable[[], None] | None = None,
        nats_max_payload: Callable[[], int] = lambda: 1 << 20,
    ) -> None:
        self.server_id = server_id
        self._streams = streams
        self._cluster = cluster
        self._reads = reads
        self._acks = acks
        self._publish = publish
        self._ack_timeout = ack_timeout
        self._max_message_bytes = max_message_bytes
        self._size_rules = AdmissionRules(max_payload=max_message_bytes)
        #: After publishing for a partition led here: keep the loop polling for the message's return (spin.py).
        self._keep_hot = keep_hot
        #: Writes the NATS publishes queued so far now, not at the end of the loop turn (None: no such thing).
        self._send_publishes = send_publishes
        #: The largest NATS message the connected nats-server takes now (its INFO's max_payload).
        self.nats_max_payload = nats_max_payload

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
                raise self._reads.unavailable(local)
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

    def check_subject(self, subject: str) -> None:
        """A subject clients may publish to: not the cluster's own (Raft, replication, __activity, inboxes),
        not a wildcard."""
        try:
            validate_stream_subject(subject, self._cluster.namespace)
        except InvalidStreamError as exc:
            raise RpcFailure(Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, str(exc)) from exc
        if "*" in subject.split(".") or subject.endswith(">"):
            raise RpcFailure(
                Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, f"cannot publish to wildcard subject {subject!r}"
            )

    async def send_to_subject(self, req: api_pb2.PublishToSubjectRequest) -> asyncio.Future[api_pb2.Ack] | None:
        """Publish on a subject that any number of streams (or none) record; the first stream to ack answers.

        The caller checks the publisher's rights on the streams there.
        """
        self.check_subject(req.subject)
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
