"""Reading a partition for one Subscribe call: start and stop positions, then following.

A subscriber reads committed records straight from the log at its own pace
and, once caught up, awaits the partition's shared commit future, so an idle
subscription costs nothing and a slow one holds back nobody else.

Uncommitted reads (seed 002) go up to the log end instead of the high
watermark. They are opt-in and unsafe: a message read that way may be
truncated after a leader change and never be committed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from liftlog.api import api_pb2
from liftlog.storage import LogClosed, OffsetOutOfRange

from .messages import record_to_message
from .partition import Partition

__all__ = ["EndOfReadonly", "PartitionGone", "read_subscription", "start_offset"]

#: Records decoded per log read; bounded so one read never stalls the event loop for long.
READ_RECORDS = 512
READ_BYTES = 1 << 20


class PartitionGone(Exception):
    """The partition closed under the subscriber (paused, deleted, server stopping)."""


class EndOfReadonly(Exception):
    """The subscriber reached the end of a readonly partition: nothing more will come."""


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
        return min(max(req.startOffset, first), hw + 1)
    if pos == api_pb2.TIMESTAMP:
        found = log.offset_for_timestamp(req.startTimestamp)
        return hw + 1 if found is None else min(max(found, first), hw + 1)
    return hw + 1  # NEW_ONLY


async def read_subscription(
    part: Partition, req: api_pb2.SubscribeRequest, *, uncommitted: bool = False
) -> AsyncIterator[api_pb2.Message]:
    """Messages from the start position until the stop position (or forever).

    With ``uncommitted`` it reads past the high watermark up to the newest
    message. Raises PartitionGone when the partition closes and EndOfReadonly
    at the end of a readonly partition that is being followed.
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
    stream, pid, subject = part.stream, part.id, part.subject

    while stop_after is None or offset <= stop_after:
        log = part.log
        if log is None or part.closed_reason is not None:
            raise PartitionGone(part.closed_reason or "closed")
        hw = log.newest_offset if uncommitted else log.high_watermark
        if offset > hw:
            if part.meta.readonly and not part.accepting:
                raise EndOfReadonly(f"end of readonly partition {stream}/{pid}")
            await (part.wait_for_append() if uncommitted else part.wait_for_data())
            continue
        limit = hw + 1 if stop_after is None else min(hw, stop_after) + 1
        try:
            records = log.read(offset, READ_RECORDS, READ_BYTES, limit)
        except OffsetOutOfRange:
            # Retention removed what we were about to read: continue from the new start.
            offset = max(offset, log.log_start_offset)
            if offset > log.log_end_offset:
                offset = log.log_end_offset
            continue
        except LogClosed as exc:
            raise PartitionGone(str(exc)) from exc
        if not records:  # only compacted-away offsets before the limit
            offset = limit
            continue
        for record in records:
            if stop_ts is not None and record.timestamp > stop_ts:
                return
            yield record_to_message(record, stream, pid, subject)
        offset = records[-1].offset + 1
