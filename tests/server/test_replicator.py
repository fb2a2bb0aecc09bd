"""The Replicator's leader side over a real nats-server: which requests a leader answers."""

from __future__ import annotations

from pathlib import Path

import nats
import nats.errors
import pytest

from liftlog.metadata import PartitionMeta
from liftlog.replication.protocol import (
    EpochOffsetRequest,
    FetchRequest,
    decode_epoch_offset_response,
    decode_fetch_response,
    encode_epoch_offset_request,
    encode_fetch_request,
    offset_subject,
    replicate_subject,
)
from liftlog.server.partition import Partition, PartitionOptions
from liftlog.server.replicator import Replicator, ReplicatorSettings
from liftlog.storage import LogConfig, NewRecord

pytestmark = pytest.mark.slow

NS = "test-replicator"


async def noop(*args: object) -> None:
    return None


def leading(tmp_path: Path, epoch: int) -> Partition:
    meta = PartitionMeta("orders", 0, "orders", "s1", ["s1", "s2"], ["s1", "s2"], leader_epoch=epoch)
    part = Partition(
        meta, directory=tmp_path / "p0", options=PartitionOptions(LogConfig()), queue_group="", ack_sink=list().append
    )
    part.open_log()
    assert part.log is not None
    part.log.append([NewRecord(b"a"), NewRecord(b"b")], epoch)
    part.become_leader("s1", 0, max_lag_ns=10**10)
    return part


async def answers(nc: nats.NATS, epoch: int) -> bool:
    """Whether anyone answers a fetch and an epoch request addressed to the leader of ``epoch``."""
    try:
        fetch = await nc.request(
            replicate_subject(NS, "orders", 0, epoch),
            encode_fetch_request(FetchRequest("s2", "orders", 0, 0, epoch)),
            timeout=0.5,
        )
        offset = await nc.request(
            offset_subject(NS, "orders", 0, epoch),
            encode_epoch_offset_request(EpochOffsetRequest("orders", 0, epoch)),
            timeout=0.5,
        )
    except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
        return False
    assert decode_fetch_response(fetch.data).leader_epoch == epoch
    assert decode_epoch_offset_response(offset.data).leader_epoch == epoch
    return True


async def test_a_leader_answers_only_requests_for_the_epoch_it_leads_in(tmp_path: Path, nc: nats.NATS) -> None:
    replicator = Replicator(
        server_id="s1", namespace=NS, settings=ReplicatorSettings(), propose_isr=noop, report_leader=noop
    )
    await replicator.start(nc)
    try:
        part = leading(tmp_path, 0)
        await replicator.lead(part)
        assert await answers(nc, 0)
        assert not await answers(nc, 1)
        # Re-elected in a new epoch without stepping down in between: the old epoch's subjects go quiet,
        # so a follower still on epoch 0 learns nothing from this leader until it knows the new epoch.
        part.meta = PartitionMeta("orders", 0, "orders", "s1", ["s1", "s2"], ["s1", "s2"], leader_epoch=1)
        part.become_leader("s1", 0, max_lag_ns=10**10)
        await replicator.lead(part)
        assert await answers(nc, 1)
        assert not await answers(nc, 0)
        # Stepped down but still subscribed: an epoch request gets no answer rather than "no such epoch",
        # which would make the follower truncate its whole log.
        part.become_follower()
        with pytest.raises(nats.errors.TimeoutError):
            await nc.request(
                offset_subject(NS, "orders", 0, 1),
                encode_epoch_offset_request(EpochOffsetRequest("orders", 0, 1)),
                timeout=0.5,
            )
        await replicator.stop_leading(part)
        assert not await answers(nc, 1)
    finally:
        await replicator.stop()


async def test_a_caught_up_fetch_is_held_until_there_is_data(tmp_path: Path, nc: nats.NATS) -> None:
    import asyncio
    import time

    from liftlog.api import api_pb2
    from liftlog.server.messages import Incoming

    settings = ReplicatorSettings(fetch_wait_s=0.6)
    replicator = Replicator(server_id="s1", namespace=NS, settings=settings, propose_isr=noop, report_leader=noop)
    await replicator.start(nc)

    async def fetch(offset: int) -> tuple[float, bytes]:
        started = time.monotonic()
        msg = await nc.request(
            replicate_subject(NS, "orders", 0, 0), encode_fetch_request(FetchRequest("s2", "orders", 0, offset, 0)), 2
        )
        return time.monotonic() - started, bytes(decode_fetch_response(msg.data).batches)

    try:
        part = leading(tmp_path, 0)
        await replicator.lead(part)
        took, data = await fetch(0)
        assert data and took < 0.3, "behind: answered at once"
        # Caught up (the log ends at 2) and nothing comes: answered empty once the wait is over.
        took, data = await fetch(2)
        assert not data and 0.5 < took < 1.5
        # Caught up, then a message: answered with it right away, not after the wait.
        held = asyncio.ensure_future(fetch(2))
        await asyncio.sleep(0.1)
        assert not held.done()
        part.append([Incoming(NewRecord(b"c"), "orders", "", "", api_pb2.NONE, -1)])
        took, data = await held
        assert data and took < 0.4
        # A leader that steps down answers what it held: the follower asks the new leader at once.
        held = asyncio.ensure_future(fetch(3))
        await asyncio.sleep(0.1)
        await replicator.stop_leading(part)
        took, _ = await held
        assert took < 0.4
    finally:
        await replicator.stop()
