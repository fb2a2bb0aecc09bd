"""The gRPC ``liftlog.Batches`` service: record batches in and out, for clients that move many messages.

A Subscribe call costs the server a protobuf ``Message`` per record and the
client a message object per record; ``Fetch`` hands out the stored bytes as
they are (one ``pread``, no per-record work here), and the client checks and
decodes them in bulk (``liftlog.client.batches``). It serves what Subscribe
serves, committed records from the leader or, when asked, an in-sync
replica, with the same errors.

``Publish`` takes many records in the storage format and publishes them on
the partition's subject as one NATS message (``liftlog.api.batch_envelope``),
which every stream on the subject stores as one batch; the leader
acknowledges it once. The checks are Publish's, plus the records' structure
and sizes.
"""

from __future__ import annotations

import asyncio

from liftlog.api import api_pb2, batches_pb2
from liftlog.api.batch_envelope import encode_record_batch
from liftlog.api.errors import Reason
from liftlog.recordformat import batches_end
from liftlog.rpc import ServerContext, StatusCode
from liftlog.server.api.failures import RpcFailure, abort_with, encryption_failure
from liftlog.server.api.ports import PartitionReading, Publishing
from liftlog.storage import InvalidBatch, LogClosed, OffsetOutOfRange
from liftlog.storage.encryption import EncryptionError
from liftlog.storage.records import check_records

__all__ = ["DEFAULT_FETCH_BYTES", "MAX_FETCH_BYTES", "BatchesService"]

DEFAULT_FETCH_BYTES = 1 << 20
MAX_FETCH_BYTES = 16 << 20
#: Longest wait for new data a request may ask for.
MAX_WAIT_MS = 60_000


class BatchesService:
    """``liftlog.Batches``: reads from the replica ``reads`` finds, publishes through ``publisher``."""

    def __init__(self, publisher: Publishing, reads: PartitionReading) -> None:
        self._publisher = publisher
        self._reads = reads

    async def Fetch(self, request: batches_pb2.FetchRequest, context: ServerContext) -> batches_pb2.FetchResponse:
        req: batches_pb2.FetchRequest = request
        try:
            if req.offset < 0 or req.endOffset < 0 or req.maxBytes < 0 or req.maxWaitMs < 0:
                raise RpcFailure(
                    StatusCode.INVALID_ARGUMENT,
                    Reason.INVALID_ARGUMENT,
                    "offset, endOffset, maxBytes and maxWaitMs must not be negative",
                )
            part = await self._reads.readable(
                req.stream, req.partition, resume=req.resume, allow_replica=req.readISRReplica
            )
            max_bytes = min(req.maxBytes or DEFAULT_FETCH_BYTES, MAX_FETCH_BYTES)
            wait = min(req.maxWaitMs, MAX_WAIT_MS) / 1000
            remaining = context.time_remaining()
            if remaining is not None:  # answer (empty) before the caller's deadline, not after it
                wait = min(wait, max(0.0, remaining - 0.05))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait
            offset = req.offset
            while True:
                log = part.log
                if log is None or part.closed_reason is not None:
                    raise self._reads.gone(req.stream, req.partition, part.closed_reason or "closed")
                hw = log.high_watermark
                start = log.log_start_offset
                if offset < start:
                    raise RpcFailure(
                        StatusCode.OUT_OF_RANGE,
                        Reason.OUT_OF_RANGE,
                        f"offset {offset} of stream {req.stream!r} partition {req.partition} is no longer in the "
                        f"log (removed by retention): it starts at {start}",
                    )
                if offset > log.log_end_offset:
                    raise RpcFailure(
                        StatusCode.OUT_OF_RANGE,
                        Reason.OUT_OF_RANGE,
                        f"offset {offset} of stream {req.stream!r} partition {req.partition} is past the end of "
                        f"the log (its next offset is {log.log_end_offset})",
                    )
                end = hw + 1 if not req.endOffset else min(hw + 1, req.endOffset)
                if offset < end:
                    try:
                        data = log.read_clear(offset, max_bytes, end)
                    except OffsetOutOfRange:
                        continue  # retention moved the start meanwhile: the checks above name it
                    except LogClosed as exc:
                        raise self._reads.gone(req.stream, req.partition, str(exc)) from exc
                    except EncryptionError as exc:
                        raise encryption_failure(req.stream, req.partition, exc) from exc
                    next_offset = batches_end(data, offset, end)
                    part.messages_out += next_offset - offset
                    part.bytes_out += len(data)
                    return self._response(data, hw, start, next_offset, part.subject)
                stop = req.endOffset and offset >= req.endOffset
                left = deadline - loop.time()
                if stop or left <= 0 or (part.meta.readonly and not part.accepting):
                    return self._response(b"", hw, start, offset, part.subject)
                try:
                    async with asyncio.timeout(left):
                        await part.wait_for_data()
                except TimeoutError:
                    pass
        except RpcFailure as failure:
            await abort_with(context, failure)

    @staticmethod
    def _response(data: bytes, hw: int, start: int, next_at: int, subject: str) -> batches_pb2.FetchResponse:
        return batches_pb2.FetchResponse(
            batches=data, highWatermark=hw, logStartOffset=start, nextOffset=next_at, subject=subject
        )

    async def Publish(self, request: batches_pb2.PublishRequest, context: ServerContext) -> batches_pb2.PublishResponse:
        req: batches_pb2.PublishRequest = request
        api = self._publisher
        try:
            if req.ackPolicy not in (api_pb2.LEADER, api_pb2.ALL, api_pb2.NONE):
                raise RpcFailure(
                    StatusCode.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT, f"unknown ack policy {req.ackPolicy}"
                )
            meta, occ = await api.publishable(req.stream, req.partition, req.ackPolicy)
            self._check_records(req, api.max_message_bytes)
            envelope = batches_pb2.RecordBatchEnvelope(records=req.records, count=req.count, ackPolicy=req.ackPolicy)
            if occ and req.HasField("expectedOffset"):
                envelope.expectedOffset = req.expectedOffset
            if req.ackPolicy == api_pb2.NONE:
                await api.publish_payload(meta.subject, encode_record_batch(envelope))
                return batches_pb2.PublishResponse(baseOffset=-1, count=req.count, partitionSubject=meta.subject)
            led_here = api.leads(meta)
            envelope.ackInbox, envelope.correlationId, future = api.expect_ack(
                meta.subject, req.ackPolicy, req.stream, local=led_here
            )
            await api.publish_payload(meta.subject, encode_record_batch(envelope), envelope.correlationId, led_here)
            ack = await api.await_ack(future, context.time_remaining())
        except RpcFailure as failure:
            await abort_with(context, failure)
        offsets = ack.recordOffsets
        return batches_pb2.PublishResponse(
            baseOffset=offsets[0] if offsets else ack.offset - req.count + 1,
            count=req.count,
            partitionSubject=ack.partitionSubject,
            receptionTimestamp=ack.receptionTimestamp,
            commitTimestamp=ack.commitTimestamp,
            duplicate=ack.duplicate,
            recordOffsets=offsets,
            duplicateRecords=ack.duplicateRecords,
        )

    @staticmethod
    def _check_records(req: batches_pb2.PublishRequest, max_message_bytes: int) -> None:
        """The records must be well formed and each within streams.max.message.bytes (as the leader checks)."""
        try:
            largest = check_records(req.records, req.count).largest_payload  # key + value, what Publish checks
        except InvalidBatch as exc:
            raise RpcFailure(
                StatusCode.INVALID_ARGUMENT,
                Reason.INVALID_ARGUMENT,
                f"the records of the batch are not in the storage format (docs/storage-format.md): {exc}",
            ) from exc
        if largest > max_message_bytes:
            raise RpcFailure(
                StatusCode.INVALID_ARGUMENT,
                Reason.TOO_LARGE,
                f"a message of the batch has {largest} bytes, more than streams.max.message.bytes "
                f"({max_message_bytes})",
            )
