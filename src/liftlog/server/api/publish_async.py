"""PublishAsync: one call's requests, taken a socket read at a time, published and answered in order.

Liftbridge's clients (go-liftbridge's ``Publish`` included) send every publish
over one PublishAsync stream, many in flight. Published one envelope each,
every message costs a NATS publish, a NATS delivery, an envelope decode, an
append and an ack of its own. Here the requests one read brought for the same
partition and ack policy are published together as one record batch on the
partition's subject (``liftlog.api.batch_envelope``): every stream on that
subject still receives them through NATS (the subject stays the source of
truth), the leader stores them as one batch and acks them once, and each
request gets its own offset back. Nothing waits to fill a batch: a lone
request goes alone, in a Liftbridge envelope. Only when two of the call's
batches are still unacknowledged do newly read requests wait, for the older
one's ack and at most 5 ms, so that what arrives meanwhile joins them: a
client with many publishers, each waiting for its own ack, sends a few
requests per read, and each batch costs the server about the same whatever
its size.

Differences a user could see, both documented in ``docs/performance.md``:
plain NATS subscribers of the subject receive a liftlog record batch instead
of one Liftbridge envelope per message, and the messages of one batch share
the (server-made) correlation id stored with them. ``publish.async.coalesce:
false`` keeps one envelope per message.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from typing import TYPE_CHECKING

from liftlog.api import api_pb2
from liftlog.api._gen.batches_pb2 import RecordBatchEnvelope
from liftlog.api.batch_envelope import encode_record_batch
from liftlog.api.stored import RESERVED, varint
from liftlog.replication.duplicates import PUBLISHER_RESERVED
from liftlog.server.api.failures import RpcFailure, async_error
from liftlog.storage.records import encode_headers, encode_prepared

if TYPE_CHECKING:
    from liftlog.metadata import PartitionMeta
    from liftlog.rpc import RequestStream, ServerContext
    from liftlog.server.api.access import AccessControl
    from liftlog.server.api.ports import Publishing

__all__ = ["CallState", "PublishAsyncCall"]

#: A batch stays well under NATS's default max payload (1 MiB), and under the server's if it is smaller.
MAX_BATCH_BYTES = 256 * 1024
#: Room for the envelope around a batch's records.
ENVELOPE_ROOM = 1024
#: A message this large goes in its own envelope.
MAX_COALESCED_MESSAGE = 64 * 1024
#: What a record holds beyond key, value and user headers, and more (its fixed part, the stored fields).
RECORD_ROOM = 512
NONE = api_pb2.NONE
LEADER = api_pb2.LEADER
#: Most answers written at once.
_MAX_ANSWERS = 512
#: With this many of a call's batches unacknowledged, newly read requests wait for the oldest, at most HOLD_S.
HELD_BATCHES = 2
HOLD_S = 0.005


class _Batch:
    """Requests for one partition and ack policy taken in one read: one NATS message."""

    __slots__ = (
        "ack_body",
        "duplicates",
        "failure",
        "first",
        "future",
        "last",
        "meta",
        "offsets",
        "policy",
        "records",
        "size",
        "subject",
    )

    def __init__(self, meta: PartitionMeta, policy: int, first: api_pb2.PublishRequest) -> None:
        self.meta = meta
        self.subject = meta.subject
        self.policy = policy
        self.first = first  # published alone if no other request joins it
        self.records: list[tuple[bytes, bytes | None, dict[str, bytes] | None]] = []  # value, key, user headers
        self.size = 0
        self.future: asyncio.Future[api_pb2.Ack] | None = None
        self.failure: RpcFailure | None = None
        self.last = -1  # the offset of its last message, once acked
        self.ack_body = b""  # its ack encoded, offset and correlation id left for each answer
        #: With message ids, when some requests duplicated stored messages: each request's offset, and which.
        self.offsets: list[int] = []
        self.duplicates: set[int] = set()


# A queue entry: (the caller's correlation id, what answers it, its index in a _Batch).
_Entry = tuple[str, "asyncio.Future[api_pb2.Ack] | RpcFailure | _Batch", int]


class CallState(enum.Enum):
    """Where a PublishAsync call is; only ``run`` and the reader move it on."""

    READING = "reading"  # requests come in and are published; answers go out as their acks arrive
    DRAINING = "draining"  # the requests ended (or failed): what is queued is answered, then the call ends
    DONE = "done"  # every answer written, or the caller went away and the acks waited for were given up


class PublishAsyncCall:
    """One PublishAsync call: answer every request, in request order, with its ack or an asyncError.

    A reader task takes the requests a socket read at a time and publishes them (``_read``); the call's
    own task writes the answers (``run``). At most ``max_inflight`` requests are read and not yet
    answered; past that the reader waits, gRPC's flow control stops the client, and an answer the client
    does not read holds up the next ones.
    """

    def __init__(
        self,
        publisher: Publishing,
        requests: RequestStream[api_pb2.PublishRequest],
        context: ServerContext,
        *,
        max_inflight: int,
        coalesce: bool,
        access: AccessControl | None = None,
    ) -> None:
        self.state = CallState.READING
        self._publisher = publisher
        self._requests = requests
        self._context = context
        self._limit = max_inflight
        self._coalesce = coalesce
        self._access = access if access is not None and access.enabled else None
        self._queue: deque[_Entry] = deque()
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        #: The latest requests were LEADER-acked for a partition led here: after answering, the client's next
        #: request is likely a loop turn or two away (one publisher at a time), so the loop polls for it.
        self._answers_hot = False
        #: The ack futures of this call's latest published messages and batches.
        self._in_flight: deque[asyncio.Future[api_pb2.Ack]] = deque(maxlen=HELD_BATCHES)

    async def run(self) -> None:
        queue, publisher = self._queue, self._publisher
        reader = asyncio.get_running_loop().create_task(self._read(), name="PublishAsync reader")
        try:
            while True:
                while not queue:
                    if self.state is CallState.DRAINING:
                        await reader  # surfaces a failed request stream
                        return
                    await self._wake.wait()
                    self._wake.clear()
                answers = await self._ready_answers()
                # Completes once gRPC's window has room: a client that does not read its acks stalls here.
                await self._context.write(answers)
                for _ in answers:
                    queue.popleft()
                self._room.set()
                if self._answers_hot:
                    publisher.expect_next_publish()
        finally:
            self.state = CallState.DONE
            reader.cancel()
            for _, item, _ in queue:  # the caller went away: stop waiting for these acks
                awaited = item.future if isinstance(item, _Batch) else item
                if isinstance(awaited, asyncio.Future):
                    awaited.cancel()

    # -- reading and publishing ------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            while requests := await self._take():
                entries = await self._publish_read(requests)
                self._publisher.send_publishes_now()  # this read's publishes leave in one write, now
                if entries:
                    self._queue.extend(entries)
                    self._wake.set()
        finally:
            if self.state is CallState.READING:
                self.state = CallState.DRAINING
            self._wake.set()

    async def _take(self) -> list[api_pb2.PublishRequest]:
        """The requests of the next read (none: the client is done), once there is room for them."""
        queue, limit, in_flight = self._queue, self._limit, self._in_flight
        while len(queue) >= limit:
            self._room.clear()
            await self._room.wait()
        requests = await self._requests.next_batch(limit - len(queue))
        if requests and self._coalesce and len(in_flight) >= HELD_BATCHES and not in_flight[0].done():
            # Enough of this call's batches are on their way: wait (briefly) for the oldest, and the next
            # batch grows meanwhile. Clients with many publishers, each with one message in flight, send
            # a few requests per read; answering them a few at a time costs the same per batch.
            await asyncio.wait([in_flight[0]], timeout=HOLD_S)
            room_left = limit - len(queue) - len(requests)
            if self._requests.items and room_left > 0:
                requests += await self._requests.next_batch(room_left)
        return requests

    async def _admit(self, stream: str, partition: int, policy: int) -> tuple[PartitionMeta, bool] | RpcFailure:
        access = self._access
        try:
            refusal = access.refusal(self._context, stream, "Publish") if access is not None else None
            state = refusal or await self._publisher.publishable(stream, partition, policy)
        except RpcFailure as failure:
            state = failure
        self._answers_hot = policy == LEADER and not isinstance(state, RpcFailure) and self._publisher.leads(state[0])
        return state

    async def _publish_read(self, requests: list[api_pb2.PublishRequest]) -> list[_Entry]:
        """Publish one read's requests: for each partition, those that may share a batch as one."""
        publisher, coalesce = self._publisher, self._coalesce
        max_bytes = publisher.max_message_bytes
        # The nats-server's limit can change with a reconnect: a batch it refused would fail every
        # request in it, though each alone fits.
        batch_max = min(MAX_BATCH_BYTES, publisher.nats_max_payload() - ENVELOPE_ROOM)
        coalesce_max = min(MAX_COALESCED_MESSAGE, max_bytes, batch_max)
        entries: list[_Entry] = []
        batches: dict[tuple[str, int], _Batch] = {}
        checked: dict[tuple[str, int, int], tuple[PartitionMeta, bool] | RpcFailure] = {}
        for req in requests:
            cid = req.correlationId
            key = (req.stream, req.partition, req.ackPolicy)
            state = checked.get(key)
            if state is None:
                state = checked[key] = await self._admit(*key)
            if isinstance(state, RpcFailure):
                entries.append((cid, state, 0))
                continue
            meta, occ = state
            value = req.value
            msg_key = req.key
            size = len(value) + len(msg_key)
            if size > max_bytes:
                try:
                    publisher.check_size(req)
                except RpcFailure as failure:
                    entries.append((cid, failure, 0))
                    continue
            headers = req.headers
            user = None
            if headers:
                user = {
                    k: v for k, v in headers.items() if not k.startswith(RESERVED) or k in PUBLISHER_RESERVED
                } or None
                size += sum(6 + len(k) + len(v) for k, v in user.items()) if user else 0
            # With room for the record's own fields: one record over the log's limit would fail its batch.
            size += RECORD_ROOM
            if coalesce and not occ and size <= coalesce_max and not req.ackInbox:
                # One batch per partition: its messages are stored in request order.
                where = (key[0], key[1])
                batch = batches.get(where)
                if batch is not None and (batch.policy != key[2] or batch.size + size > batch_max):
                    await self._publish(batches.pop(where))
                    batch = None
                if batch is None:
                    batch = batches[where] = _Batch(meta, key[2], req)
                records = batch.records
                records.append((value, msg_key or None, user))
                batch.size += size
                if key[2] != NONE:
                    entries.append((cid, batch, len(records) - 1))
                continue
            # Alone, after what came before it: a partition stores its messages in request order.
            for pending in batches.values():
                await self._publish(pending)
            batches.clear()
            try:
                future = await publisher.send_checked(req, meta, occ)
            except RpcFailure as failure:
                entries.append((cid, failure, 0))
            else:
                if future is not None:  # AckPolicy NONE: nothing to answer
                    entries.append((cid, future, 0))
        for pending in batches.values():
            await self._publish(pending)
        return entries

    async def _publish(self, batch: _Batch) -> None:
        try:
            if len(batch.records) == 1:
                batch.future = await self._publisher.send_checked(batch.first, batch.meta, False)  # batched: no OCC
            else:
                batch.future = await _publish_batch(self._publisher, batch)
        except RpcFailure as failure:
            batch.failure = failure
        if batch.future is not None:
            self._in_flight.append(batch.future)

    # -- answering -------------------------------------------------------------------------------

    async def _ready_answers(self) -> list[bytes]:
        """Every answer at the head of the queue that is ready (one write); a pending ack is waited for only
        when it is the first."""
        queue, publisher = self._queue, self._publisher
        answers: list[bytes] = []
        i = 0
        while i < len(queue) and i < _MAX_ANSWERS:  # the reader appends meanwhile
            cid, item, _ = queue[i]
            if isinstance(item, _Batch):
                future = item.future
                if item.failure is None and future is not None and not future.done():
                    if answers:
                        break
                    try:
                        await publisher.until_acked(future, None)
                    except RpcFailure as failure:  # no ack in time: the answer for all of the batch
                        item.failure = failure
                if item.failure is not None:  # not published, or no ack in time
                    answers.append(async_error(cid, item.failure))
                    i += 1
                elif len(item.records) == 1:
                    assert future is not None
                    answers.append(publisher.answer(future, cid))
                    i += 1
                else:  # this request and the batch's next ones, answered together
                    j = i + 1
                    last = min(len(queue), _MAX_ANSWERS)
                    while j < last and queue[j][1] is item:
                        j += 1
                    answers += _batch_answers(publisher, item, [queue[k] for k in range(i, j)])
                    i = j
            elif isinstance(item, RpcFailure):
                answers.append(async_error(cid, item))
                i += 1
            else:  # a request published alone
                if not item.done():
                    if answers:
                        break
                    try:
                        await publisher.until_acked(item, None)
                    except RpcFailure as failure:  # no ack in time
                        answers.append(async_error(cid, failure))
                        i += 1
                        continue
                answers.append(publisher.answer(item, cid))
                i += 1
        return answers


async def _publish_batch(api: Publishing, batch: _Batch) -> asyncio.Future[api_pb2.Ack] | None:
    """Publish a batch's records as one record batch envelope; the future resolves with its one ack."""
    envelope = RecordBatchEnvelope(count=len(batch.records), ackPolicy=batch.policy)
    if batch.policy == api_pb2.NONE:
        envelope.records = encode_prepared(
            [(k, v, encode_headers(u), len(u)) if u else (k, v, b"", 0) for v, k, u in batch.records]
        )
        await api.publish_payload(batch.subject, encode_record_batch(envelope))  # no ack awaited: no spinning
        return None
    led_here = api.leads(batch.meta)
    inbox, cid, future = api.expect_ack(batch.subject, batch.policy, batch.first.stream, local=led_here)
    envelope.ackInbox = inbox
    envelope.correlationId = cid
    # The records carry no ack fields: the inbox and route id are this server's, and not stored.
    envelope.records = encode_prepared(
        [(k, v, encode_headers(u), len(u)) if u else (k, v, b"", 0) for v, k, u in batch.records]
    )
    await api.publish_payload(batch.subject, encode_record_batch(envelope), cid, led_here)
    return future


#: Ack.duplicate = true (field 1000, varint): appended to one request's answer of a coalesced batch.
_DUPLICATE = api_pb2.Ack(duplicate=True).SerializeToString()


def _batch_answers(api: Publishing, batch: _Batch, entries: list[_Entry]) -> list[bytes]:
    """The encoded PublishResponses of some of a batch's requests: the batch's ack with each one's offset."""
    if not batch.ack_body:
        assert batch.future is not None
        try:
            ack = api.ack_result(batch.future)
        except RpcFailure as failure:  # the same answer for every request of the batch
            batch.failure = failure
            return [async_error(cid, failure) for cid, _, _ in entries]
        batch.last = ack.offset
        if ack.recordOffsets or ack.duplicate:  # message ids: some requests duplicated stored messages
            count = len(batch.records)
            batch.offsets = list(ack.recordOffsets) or [ack.offset - count + 1 + i for i in range(count)]
            batch.duplicates = set(range(count)) if ack.duplicate else set(ack.duplicateRecords)
            for name in ("recordOffsets", "duplicateRecords", "duplicate"):
                ack.ClearField(name)
        ack.ClearField("offset")
        batch.ack_body = ack.SerializeToString()
    # Ack{offset = 4, correlationId = 6} appended inside PublishResponse{ack = 1, correlationId = 3}: the
    # offset was left out of the body, and a parser keeps the last value, so the caller's id replaces the
    # server's batch id.
    head = batch.ack_body + b"\x20"
    first = batch.last - len(batch.records) + 1
    out: list[bytes] = []
    offsets, duplicates = batch.offsets, batch.duplicates
    for cid, _, index in entries:
        if offsets:
            body = head + varint(offsets[index]) + (_DUPLICATE if index in duplicates else b"")
        else:
            body = head + varint(first + index)
        if cid:
            raw = cid.encode()
            tail = varint(len(raw)) + raw
            body += b"\x32" + tail
            out.append(b"\x0a" + varint(len(body)) + body + b"\x1a" + tail)
        else:
            out.append(b"\x0a" + varint(len(body)) + body)
    return out
