"""``publish_many`` against liftlog servers: chunks of messages through ``liftlog.Batches/Publish``.

The messages are encoded in the storage format (``liftlog.storage.records``)
in chunks of at most ``window`` messages (and :data:`CHUNK_MESSAGES`,
:data:`CHUNK_BYTES`); each chunk is one request, stored atomically at
consecutive offsets and acknowledged once, and enough chunks are in flight to
keep ``window`` messages unacknowledged. A Python object per message is made
only for the :class:`Ack` the caller gets back.

Differences from the PublishAsync path (what Liftbridge servers get): the
stored messages carry no ack inbox or correlation id (a subscriber sees them
empty, and so are the acks'), and a chunk is refused or stored as a whole.
A chunk that fails with NotLeader or Unavailable is sent again (at least
once), possibly after chunks that followed it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from liftlog.api import batches_pb2
from liftlog.client.errors import AckTimeoutError, LiftlogError, UnimplementedError, as_publish_failure
from liftlog.client.msg_ids import BATCH_ID_HEADER, new_msg_id
from liftlog.client.nats_helpers import to_bytes, to_headers
from liftlog.client.types import Ack, AckPolicy, OutgoingMessage, PublishValue
from liftlog.client.types import batch_ack as make_ack
from liftlog.recordformat import RECORD_HEADER
from liftlog.storage.records import NewRecord, PreparedRecord, encode_records

if TYPE_CHECKING:
    from liftlog.client.routing import Routing
    from liftlog.client.stubs import Stub

__all__ = ["CHUNK_BYTES", "CHUNK_MESSAGES", "BatchesUnsupported", "publish_batched", "publish_prepared"]

CHUNK_MESSAGES = 1000
CHUNK_BYTES = 256 << 10  # well under NATS's default max payload of 1 MiB

Value = PublishValue


class BatchesUnsupported(Exception):
    """The server has no ``liftlog.Batches`` (a Liftbridge server); ``values`` is the input, none of it sent."""

    def __init__(self, values: Iterable[Value] | AsyncIterable[Value]) -> None:
        super().__init__("liftlog.Batches/Publish is not offered")
        self.values = values


async def publish_batched(
    client: Routing,
    stream: str,
    values: Iterable[Value] | AsyncIterable[Value],
    *,
    partition: int,
    key: bytes | str | None,
    headers: Mapping[str, bytes | str] | None,
    ack_policy: AckPolicy,
    window: int,
    timeout: float,
    resend_unacked: bool,
    return_acks: bool = True,
    msg_ids: bool = False,
) -> list[Ack]:
    """Publish ``values`` in chunks; the acks in input order (none with ``AckPolicy.NONE`` or ``return_acks`` False).

    ``msg_ids``: give every chunk an id (a hidden ``\\x00batch`` header on its first record, one random id for
    the whole chunk), so that a chunk sent again after a failure is stored once: a liftlog server answers it
    with the original's offsets. Records' own ``Nats-Msg-Id`` headers are honoured too, each on its own.

    Raises BatchesUnsupported, before anything is stored, when the server does not offer batches.
    """
    default_key = to_bytes(key) if key is not None else None
    default_headers = to_headers(headers) if headers else None
    chunks = _chunks(values, _chunk_size(window), default_key, default_headers, msg_ids)
    try:
        return await _publish_chunks(
            client, stream, partition, chunks, ack_policy, window, timeout, resend_unacked, return_acks
        )
    except _FirstChunkUnimplemented as first:
        raise BatchesUnsupported(_prepend(first.raw, chunks)) from None  # type: ignore[arg-type]


async def publish_prepared(
    client: Routing,
    stream: str,
    records: Sequence[PreparedRecord],
    *,
    partition: int,
    ack_policy: AckPolicy,
    window: int,
    timeout: float,
    resend_unacked: bool,
) -> None:
    """Publish prepared records in chunks (liftlog servers only: UnimplementedError from others)."""
    chunks = _prepared_chunks(records, _chunk_size(window))
    try:
        await _publish_chunks(client, stream, partition, chunks, ack_policy, window, timeout, resend_unacked, False)
    except _FirstChunkUnimplemented as first:
        raise first.error from None


def _chunk_size(window: int) -> int:
    """Messages per chunk: the window, up to CHUNK_MESSAGES (so a window of 2000 keeps two chunks in flight)."""
    return max(1, min(window, CHUNK_MESSAGES))


class _FirstChunkUnimplemented(Exception):
    """The first chunk found no ``liftlog.Batches``: nothing was stored."""

    def __init__(self, raw: object, error: UnimplementedError) -> None:
        super().__init__(error.message)
        self.raw = raw
        self.error = error


async def _publish_chunks(
    client: Routing,
    stream: str,
    partition: int,
    chunks: AsyncIterator[tuple[object, bytes, int]],
    ack_policy: AckPolicy,
    window: int,
    timeout: float,
    resend_unacked: bool,
    return_acks: bool,
) -> list[Ack]:
    """Send (input, records, count) chunks with ``window`` messages in flight; the acks in input order."""
    room = asyncio.Semaphore(max(1, window // _chunk_size(window)))
    want_acks = ack_policy != AckPolicy.NONE
    sending: list[asyncio.Task[list[Ack]]] = []
    first = True
    try:
        async for raw, data, count in chunks:
            await room.acquire()
            if any(t.done() and not t.cancelled() and t.exception() is not None for t in sending):
                room.release()
                break
            task = asyncio.ensure_future(
                _send(
                    client,
                    stream,
                    partition,
                    data,
                    count,
                    ack_policy,
                    timeout,
                    want_acks and resend_unacked,
                    return_acks,
                )
            )
            task.add_done_callback(lambda _: room.release())
            sending.append(task)
            if first:  # the first answer tells whether the server offers batches at all
                first = False
                try:
                    await asyncio.wait([task])
                    task.result()
                except UnimplementedError as exc:
                    raise _FirstChunkUnimplemented(raw, exc) from None
                except LiftlogError:
                    break
        if sending:
            await asyncio.wait(sending)
        acks: list[Ack] = []
        for task in sending:
            error = task.exception()
            if error is not None:
                if isinstance(error, LiftlogError):
                    raise as_publish_failure(error, acks) from error
                raise error
            acks.extend(task.result())
        return acks
    finally:
        for task in sending:
            task.cancel()


async def _send(
    client: Routing,
    stream: str,
    partition: int,
    records: bytes,
    count: int,
    ack_policy: AckPolicy,
    timeout: float,
    retry: bool,
    return_acks: bool,
) -> list[Ack]:
    req = batches_pb2.PublishRequest(
        stream=stream, partition=partition, records=records, count=count, ackPolicy=ack_policy
    )

    async def call(stub: Stub) -> batches_pb2.PublishResponse:
        resp: batches_pb2.PublishResponse = await stub.publish_batch(req, timeout=timeout)
        return resp

    resp = await client.call_leader(
        stream, partition, call, timeout_error=AckTimeoutError, retryable=None if retry else (lambda: False)
    )
    if ack_policy == AckPolicy.NONE or not return_acks:
        return []
    subject = resp.partitionSubject
    received, committed = resp.receptionTimestamp, resp.commitTimestamp
    if resp.recordOffsets or resp.duplicate:  # message ids: some were stored already (the originals' offsets)
        offsets = list(resp.recordOffsets) or list(range(resp.baseOffset, resp.baseOffset + resp.count))
        duplicates = set(range(resp.count)) if resp.duplicate else set(resp.duplicateRecords)
        return [
            make_ack(stream, subject, offset, ack_policy, received, committed, i in duplicates)
            for i, offset in enumerate(offsets)
        ]
    return [
        make_ack(stream, subject, offset, ack_policy, received, committed)
        for offset in range(resp.baseOffset, resp.baseOffset + resp.count)
    ]


async def _prepared_chunks(records: Sequence[PreparedRecord], size: int) -> AsyncIterator[tuple[object, bytes, int]]:
    """(nothing, encoded records, count) per chunk of at most ``size`` records and about CHUNK_BYTES.

    Encodes as it goes (what :func:`encode_prepared` writes, chunk by chunk): one pass over the records.
    """
    parts: list[bytes] = []
    append = parts.append
    pack = RECORD_HEADER.pack
    count = used = 0
    for key, value, headers, n_headers in records:
        value_len = len(value)
        length = 22 + value_len + len(headers) + (len(key) if key is not None else 0)
        if count and (used + length + 4 > CHUNK_BYTES or count >= size):
            yield None, b"".join(parts), count
            parts = []
            append = parts.append
            count = used = 0
        if key is None:
            append(pack(length, count, 0, -1, value_len, n_headers))
        else:
            append(pack(length, count, 0, len(key), value_len, n_headers))
            append(key)
        append(value)
        if n_headers:
            append(headers)
        count += 1
        used += length + 4
    if count:
        yield None, b"".join(parts), count


async def _chunks(
    values: Iterable[Value] | AsyncIterable[Value],
    size: int,
    key: bytes | None,
    headers: dict[str, bytes] | None,
    msg_ids: bool = False,
) -> AsyncIterator[tuple[object, bytes, int]]:
    """(the input values, their records encoded, their count) per chunk of at most ``size`` messages and about
    CHUNK_BYTES; with ``msg_ids``, every record without an id gets one."""
    raw: list[Value] = []
    records: list[NewRecord] = []
    used = 0
    empty: Mapping[str, bytes] = {}
    plain_headers = headers or empty
    items = values if isinstance(values, AsyncIterable) else _aiter(values)
    async for value in items:
        if isinstance(value, NewRecord):
            record = value
        elif isinstance(value, OutgoingMessage):
            record = NewRecord(
                to_bytes(value.value),
                to_bytes(value.key) if value.key is not None else key,
                _as_headers(value.headers) if value.headers else plain_headers,
            )
        else:
            record = NewRecord(value.encode() if isinstance(value, str) else value, key, plain_headers)
        cost = len(record.value) + 26 + (len(record.key) if record.key else 0)
        if records and used + cost > CHUNK_BYTES:  # a big message starts a chunk of its own
            yield raw, encode_records(records), len(records)
            raw, records, used = [], [], 0
        if msg_ids and not records and BATCH_ID_HEADER not in record.headers:
            # The chunk's id, on its first record (one header, not one per record).
            record = NewRecord(record.value, record.key, {**record.headers, BATCH_ID_HEADER: new_msg_id()})
        raw.append(value)
        records.append(record)
        used += cost
        if len(records) >= size:
            yield raw, encode_records(records), len(records)
            raw, records, used = [], [], 0
    if records:
        yield raw, encode_records(records), len(records)


def _as_headers(headers: Mapping[str, bytes | str]) -> Mapping[str, bytes]:
    """The headers with bytes values: as they are when they already are (the Spark sink's are)."""
    for value in headers.values():
        if type(value) is not bytes:
            return to_headers(headers)
    return headers  # type: ignore[return-value]


async def _aiter(values: Iterable[Value]) -> AsyncIterator[Value]:
    for value in values:
        yield value


async def _prepend(first: list[Value], rest: AsyncIterator[tuple[object, bytes, int]]) -> AsyncIterator[Value]:
    """The input again, for the PublishAsync path: the chunk already taken, then whatever is left."""
    for value in first:
        yield value
    async for raw, _, _ in rest:
        for value in raw:  # type: ignore[attr-defined]
            yield value
