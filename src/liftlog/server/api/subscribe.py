"""Reading a partition for one Subscribe call: start and stop positions, then following.

A subscriber reads committed records straight from the log at its own pace
and, once caught up, awaits the partition's shared commit future, so an idle
subscription costs nothing and a slow one holds back nobody else.

Memory: a subscription holds only what it read last, at most
``subscribe.fetch.max.messages`` records and ``subscribe.buffer.max.bytes``
(always one record at least), and reads again only once gRPC has taken all of
it. gRPC's send completes only when its flow-control window has room, so a
client that stops reading stalls its own subscription, never the server.

A batched subscription (``liftlog.api.subscribe_batches``, liftlog's own
clients) reads the stored batches as they are, one ``pread`` per read and no
work per record, and sends each read as one message; its memory bound is the
same (a read holds one whole batch at least).

Uncommitted reads (seed 002) go up to the log end instead of the high
watermark. They are opt-in and unsafe: a message read that way may be
truncated after a leader change and never be committed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from liftlog.api import api_pb2
from liftlog.api.subscribe_batches import batches_message
from liftlog.recordformat import batches_end
from liftlog.server.partitions.messages import encode_messages, record_to_message
from liftlog.server.partitions.partition import Partition
from liftlog.storage import CommitLog, LogClosed, OffsetOutOfRange, Record

__all__ = ["EndOfReadonly", "PartitionGone", "read_subscription", "start_offset"]

#: Defaults of subscribe.fetch.max.messages and subscribe.buffer.max.bytes.
FETCH_MAX_MESSAGES = 128
BUFFER_MAX_BYTES = 32 << 10
#: Python objects around one record's bytes (tuple, ints, bytes headers), counted against the buffer.
RECORD_OVERHEAD = 224


class PartitionGone(Exception):
    """The partition closed under the subscriber (paused, deleted, server stopping)."""


class EndOfReadonly(Exception):
    """The subscriber reached the end of a readonly partition: nothing more will come."""


class Revoked(Exception):
    """A group consumer's subscription no longer holds its partition (the group moved on to a new epoch)."""

    def __init__(self, failure: Any) -> None:
        self.failure = failure
        super().__init__(str(failure))


#: How often a waiting group subscription checks that its consumer still holds the partition.
REVOKE_CHECK_S = 0.5


def start_offset(part: Partition, req: api_pb2.SubscribeRequest, *, uncommitted: bool = False) -> int:
    """The first offset to deliver for ``req.startPosition``."""
    log = part.log
    if log is None:
        raise PartitionGone(part.closed_reason or "closed")
    hw = log.newest_offset if uncommitted else part.high_watermark
    first = log.log_start_offset
    pos = req.startPosition
    if pos == api_pb2.EARLIEST:
        return first
    if pos == api_pb2.LATEST:
        return max(hw, first)
    if pos == api_pb2.OFFSET:
        # Up to the log end, not the high watermark: a resuming reader asks for the offset after its last
        # one, which may be written but not (yet again, after a restart) known committed here. It waits for
        # the commit; moving it back to the high watermark would deliver what it already had.
        return min(max(req.startOffset, first), log.log_end_offset)
    if pos == api_pb2.TIMESTAMP:
        found = log.offset_for_timestamp(req.startTimestamp)
        return hw + 1 if found is None else min(max(found, first), hw + 1)
    return hw + 1  # NEW_ONLY


def held_bytes(record: Record) -> int:
    """About what one decoded record costs in memory."""
    size = RECORD_OVERHEAD + len(record.value) + (len(record.key) if record.key else 0)
    for name, value in record.headers.items():
        size += len(name) + len(value) + RECORD_OVERHEAD // 2
    return size


async def read_subscription(
    part: Partition,
    req: api_pb2.SubscribeRequest,
    *,
    uncommitted: bool = False,
    fetch_max_messages: int = FETCH_MAX_MESSAGES,
    buffer_max_bytes: int = BUFFER_MAX_BYTES,
    batched: bool = False,
    revoked: Callable[[], Any | None] | None = None,
) -> AsyncIterator[list[bytes]]:
    """Encoded ``Message``s, a list per log read, from the start position until the stop position (or forever).

    With ``uncommitted`` it reads past the high watermark up to the newest
    message. Raises PartitionGone when the partition closes and EndOfReadonly
    at the end of a readonly partition that is being followed. Each log read
    takes at most ``fetch_max_messages`` records and keeps at most
    ``buffer_max_bytes`` of them (one at least); the next read waits until
    the caller has taken them all. ``batched`` sends each read as one message
    of whole batches (not with a stop timestamp: the caller checks that). ``revoked`` (group
    subscriptions) says why the subscription may not go on, checked before every read and while waiting;
    then it raises Revoked.
    """
    offset = start_offset(part, req, uncommitted=uncommitted)
    stop_after: int | None = None  # last offset to deliver
    stop_ts: int | None = None
    if req.stopPosition == api_pb2.STOP_OFFSET:
        stop_after = req.stopOffset
    elif req.stopPosition == api_pb2.STOP_LATEST:
        stop_after = part.newest_offset if uncommitted else part.high_watermark
    elif req.stopPosition == api_pb2.STOP_TIMESTAMP:
        stop_ts = req.stopTimestamp
    stream, pid = part.stream, part.id
    reads = _Reads(stream, pid, part.subject, fetch_max_messages, buffer_max_bytes)

    while stop_after is None or offset <= stop_after:
        log = part.log
        if log is None or part.closed_reason is not None:
            raise PartitionGone(part.closed_reason or "closed")
        if revoked is not None and (why := revoked()) is not None:
            raise Revoked(why)
        hw = log.newest_offset if uncommitted else log.high_watermark
        if offset > hw:
            if part.meta.readonly and not part.accepting:
                raise EndOfReadonly(f"end of readonly partition {stream}/{pid}")
            waiting = part.wait_for_append() if uncommitted else part.wait_for_data()
            if revoked is None:
                await waiting
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiting, REVOKE_CHECK_S)
            continue
        limit = hw + 1 if stop_after is None else min(hw, stop_after) + 1
        first = offset
        try:
            if batched:
                batch, offset = _read_batches(log, offset, limit, reads)
                done = False
            elif stop_ts is None:
                batch, offset = _read_encoded(log, offset, limit, reads)
                done = False
            else:
                batch, offset, done = _read_until(log, offset, limit, reads, stop_ts)
        except OffsetOutOfRange:
            # Retention removed what we were about to read: continue from the new start.
            offset = max(offset, log.log_start_offset)
            if offset > log.log_end_offset:
                offset = log.log_end_offset
            continue
        except LogClosed as exc:
            raise PartitionGone(str(exc)) from exc
        if batch:
            part.messages_out += offset - first
            part.bytes_out += sum(map(len, batch))
            yield batch
        if done:
            return


@dataclass(frozen=True, slots=True)
class _Reads:
    """What every read of one subscription needs: the partition's names and the read bounds."""

    stream: str
    pid: int
    subject: str
    max_count: int
    max_bytes: int


def _read_encoded(log: CommitLog, offset: int, limit: int, reads: _Reads) -> tuple[list[bytes], int]:
    """Encoded messages from ``offset`` (before ``limit``), within the read bounds; and the next offset."""
    out: list[bytes] = []
    max_count, max_bytes = reads.max_count, reads.max_bytes
    for data, header in log.read_batches(offset, limit, max(max_bytes, 64 << 10)):
        offset, used = encode_messages(
            data, header, offset, limit, reads.stream, reads.pid, reads.subject, out, max_count - len(out), max_bytes
        )
        max_bytes -= used
        if out and (len(out) >= max_count or max_bytes <= 0):
            break
    else:
        offset = max(offset, limit) if not out else offset  # only compacted-away offsets before the limit
    return out, offset


def _read_batches(log: CommitLog, offset: int, limit: int, reads: _Reads) -> tuple[list[bytes], int]:
    """Whole stored batches from ``offset`` (before ``limit``) as one batches message; and the next offset."""
    data = log.read_clear(offset, reads.max_bytes, limit)
    end = batches_end(data, offset, limit)
    if end <= offset:  # only compacted-away offsets before the limit
        return [], max(offset, limit)
    return [batches_message(reads.stream, reads.pid, reads.subject, data, offset, end)], end


def _read_until(log: CommitLog, offset: int, limit: int, reads: _Reads, stop_ts: int) -> tuple[list[bytes], int, bool]:
    """As ``_read_encoded``, stopping before the first message newer than ``stop_ts`` (then True)."""
    records = log.read(offset, reads.max_count, reads.max_bytes, limit)
    if not records:  # only compacted-away offsets before the limit
        return [], limit, False
    out: list[bytes] = []
    budget = reads.max_bytes
    for record in records:
        if record.timestamp > stop_ts:
            return out, record.offset, True
        budget -= held_bytes(record)
        if budget < 0 and out:
            break
        out.append(record_to_message(record, reads.stream, reads.pid, reads.subject).SerializeToString())
        offset = record.offset + 1
    return out, offset, False
