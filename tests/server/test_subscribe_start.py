"""Where a Subscribe starts when the high watermark trails the log (a restart recovers an older one)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from liftlog.api import api_pb2
from liftlog.metadata import PartitionMeta
from liftlog.server.api.subscribe import read_subscription, start_offset
from liftlog.server.partitions.partition import Partition, PartitionOptions
from liftlog.storage import LogConfig, NewRecord


def replicated_partition(tmp_path: Path) -> Partition:
    # Two replicas: the high watermark is whatever replication says, not the log end.
    meta = PartitionMeta("orders", 0, "orders", "s1", ["s1", "s2"], ["s1", "s2"])
    part = Partition(
        meta, directory=tmp_path / "p", options=PartitionOptions(LogConfig()), queue_group="", ack_sink=print
    )
    part.open_log()
    assert part.log is not None
    part.log.append([NewRecord(b"%d" % i) for i in range(10)])
    part.log.set_high_watermark(4)  # committed up to 4; 5..9 written, their commit not known yet
    return part


async def test_a_resuming_reader_waits_for_the_commit_instead_of_rereading(tmp_path: Path) -> None:
    """Found by the chaos suite: after power loss of every server, readers that resumed at 1386 got 1354 again."""
    part = replicated_partition(tmp_path)
    req = api_pb2.SubscribeRequest(stream="orders", startPosition=api_pb2.OFFSET, startOffset=7)
    assert start_offset(part, req) == 7
    messages = read_subscription(part, req)
    first = asyncio.ensure_future(anext(messages))
    await asyncio.sleep(0.05)
    assert not first.done()  # 7 is not known committed: nothing yet, and certainly not 5 again
    part.set_high_watermark(9)
    batch = await asyncio.wait_for(first, 2)
    assert api_pb2.Message.FromString(batch[0]).offset == 7
    first.cancel()


def test_an_offset_past_the_log_end_starts_at_the_next_message(tmp_path: Path) -> None:
    part = replicated_partition(tmp_path)
    req = api_pb2.SubscribeRequest(stream="orders", startPosition=api_pb2.OFFSET, startOffset=500)
    assert start_offset(part, req) == 10
