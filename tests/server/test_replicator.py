"""The Replicator over a real nats-server: one fetch per server pair, answered partition by partition."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
import nats.aio.msg
import pytest
from nats.aio.client import Client as NATS

from liftlog.api import api_pb2
from liftlog.metadata import PartitionMeta
from liftlog.replication.protocol import (
    EpochOffsetRequest,
    EpochOffsetResponse,
    FetchError,
    FetchErrorCode,
    FetchRequest,
    FetchResponse,
    PartitionData,
    PartitionFetch,
    PartitionRefusal,
    decode_epoch_offset_reply,
    decode_fetch_request,
    decode_fetch_response,
    encode_epoch_offset_request,
    encode_fetch_request,
    fetch_subject,
    offset_subject,
)
from liftlog.security.cluster_auth import TRAILER_SIZE
from liftlog.server.partitions.messages import Incoming
from liftlog.server.partitions.partition import Partition, PartitionOptions
from liftlog.server.partitions.replicator import Replicator, ReplicatorSettings
from liftlog.storage import LogConfig, NewRecord
from liftlog.storage.faults import FaultyFileIO

from .conftest import start_cluster, stop_all

pytestmark = pytest.mark.slow

NS = "test-replicator"


async def noop(*args: object) -> None:
    return None


def leading(
    tmp_path: Path, epoch: int, stream: str = "orders", records: int = 2, size: int = 1, rep: Replicator | None = None
) -> Partition:
    meta = PartitionMeta(stream, 0, stream, "s1", ["s1", "s2"], ["s1", "s2"], leader_epoch=epoch)
    part = Partition(
        meta,
        directory=tmp_path / stream,
        options=PartitionOptions(LogConfig()),
        queue_group="",
        ack_sink=list[api_pb2.Ack]().append,
        leader_actions=rep.on_leader_actions if rep is not None else None,
    )
    part.open_log()
    assert part.log is not None
    for i in range(records):
        part.log.append([NewRecord(bytes([97 + i % 26]) * size)], epoch)
    part.become_leader("s1", 0, max_lag_ns=10**10)
    return part


def replicator(**settings: float) -> Replicator:
    return Replicator(
        server_id="s1",
        namespace=NS,
        settings=ReplicatorSettings(**settings),  # type: ignore[arg-type]
        propose_isr=noop,
        report_leader=noop,
    )


async def fetch(nc: NATS, *entries: PartitionFetch, session: int = 0, replica: str = "s2") -> FetchResponse:
    msg = await nc.request(fetch_subject(NS, "s1"), encode_fetch_request(FetchRequest(replica, session, entries)), 2)
    return decode_fetch_response(msg.data)


async def epoch_offset(
    nc: NATS, stream: str, epoch: int, current: int, created: int = 0
) -> EpochOffsetResponse | FetchError:
    msg = await nc.request(
        offset_subject(NS, "s1"),
        encode_epoch_offset_request(EpochOffsetRequest(stream, 0, epoch, current, created)),
        2,
    )
    return decode_epoch_offset_reply(msg.data)


def by_stream(resp: FetchResponse) -> dict[str, PartitionData | PartitionRefusal]:
    """The answers by stream (the leader answers in turn from a different partition each time)."""
    return {a.stream: a for a in resp.partitions}


def refusal(answer: PartitionData | PartitionRefusal) -> FetchErrorCode | None:
    return answer.error.code if isinstance(answer, PartitionRefusal) else None


async def test_each_partition_of_a_fetch_is_answered_or_refused_on_its_own(tmp_path: Path, nc: NATS) -> None:
    rep = replicator(fetch_wait_s=0)
    await rep.start(nc)
    try:
        orders, events = leading(tmp_path, 0), leading(tmp_path, 3, "events")
        rep.lead(orders)
        rep.lead(events)
        answers = by_stream(
            await fetch(
                nc,
                PartitionFetch("orders", 0, 0, 0),
                PartitionFetch("events", 0, 0, 2),  # an older epoch than the leader's
                PartitionFetch("unknown", 0, 0, 0),  # not led here
            )
        )
        data, stale = answers["orders"], answers["events"]
        assert isinstance(data, PartitionData) and data.leader_epoch == 0 and len(data.batches) > 0
        assert isinstance(stale, PartitionRefusal) and stale.error.code is FetchErrorCode.STALE_EPOCH
        assert stale.error.leader_epoch == 3
        assert refusal(answers["unknown"]) is FetchErrorCode.NOT_LEADER
        answers = by_stream(await fetch(nc, PartitionFetch("orders", 0, 9, 0), PartitionFetch("events", 0, 0, 3)))
        assert refusal(answers["orders"]) is FetchErrorCode.OFFSET_OUT_OF_RANGE
        assert isinstance(answers["events"], PartitionData) and answers["events"].batches
        # The same name, another incarnation (the stream was deleted and created again): refused, so
        # that a server which has not heard of the deletion never feeds the old records to the new stream.
        answers = by_stream(await fetch(nc, PartitionFetch("orders", 0, 0, 0, created=12345)))
        assert refusal(answers["orders"]) is FetchErrorCode.UNKNOWN_PARTITION
        # Stepped down: refused, while the partition it still leads is served as before.
        events.become_follower()
        rep.stop_leading(events)
        answers = by_stream(await fetch(nc, PartitionFetch("events", 0, 0, 3), PartitionFetch("orders", 0, 2, 0)))
        assert refusal(answers["events"]) is FetchErrorCode.NOT_LEADER
        assert isinstance(answers["orders"], PartitionData) and not answers["orders"].batches
    finally:
        await rep.stop()


async def test_an_epoch_offset_request_is_answered_only_for_the_epoch_the_server_leads_in(
    tmp_path: Path, nc: NATS
) -> None:
    rep = replicator()
    await rep.start(nc)
    try:
        part = leading(tmp_path, 1)
        rep.lead(part)
        assert await epoch_offset(nc, "orders", 1, 1) == EpochOffsetResponse(1, 2, 0)
        other = await epoch_offset(nc, "orders", 1, 1, created=12345)
        assert isinstance(other, FetchError) and other.code is FetchErrorCode.NOT_LEADER, "another incarnation"
        # A follower that believes another epoch is current learns nothing from this leader's log
        # (it may be a deposed leader's, diverged), only that it must ask again.
        for current in (0, 2):
            answer = await epoch_offset(nc, "orders", 1, current)
            assert isinstance(answer, FetchError) and answer.code is FetchErrorCode.STALE_EPOCH
        # Stepped down: refused rather than "no such epoch", which would make the follower truncate it all.
        part.become_follower()
        answer = await epoch_offset(nc, "orders", 1, 1)
        assert isinstance(answer, FetchError) and answer.code is FetchErrorCode.NOT_LEADER
        rep.stop_leading(part)
        answer = await epoch_offset(nc, "orders", 1, 1)
        assert isinstance(answer, FetchError) and answer.code is FetchErrorCode.NOT_LEADER
    finally:
        await rep.stop()


async def test_a_caught_up_fetch_is_held_until_one_of_its_partitions_has_data(tmp_path: Path, nc: NATS) -> None:
    rep = replicator(fetch_wait_s=0.6)
    await rep.start(nc)

    async def timed(*entries: PartitionFetch, session: int = 0) -> tuple[float, FetchResponse]:
        started = time.monotonic()
        resp = await fetch(nc, *entries, session=session)
        return time.monotonic() - started, resp

    def sizes(resp: FetchResponse) -> list[int]:
        answers = by_stream(resp)
        return [len(a.batches) if isinstance(a, PartitionData) else -1 for a in (answers["orders"], answers["events"])]

    try:
        orders, events = leading(tmp_path, 0, rep=rep), leading(tmp_path, 0, "events", rep=rep)
        rep.lead(orders)
        rep.lead(events)
        took, resp = await timed(PartitionFetch("orders", 0, 0, 0), PartitionFetch("events", 0, 2, 0))
        assert sizes(resp)[0] > 0 and took < 0.3, "one partition behind: answered at once"
        caught_up = (PartitionFetch("orders", 0, 2, 0), PartitionFetch("events", 0, 2, 0))
        took, resp = await timed(*caught_up)
        assert sizes(resp) == [0, 0] and 0.5 < took < 1.5, "all caught up: answered empty after the wait"
        # A message for one of them: the held fetch is answered with it right away.
        held = asyncio.ensure_future(timed(*caught_up))
        await asyncio.sleep(0.1)
        assert not held.done()
        events.append([Incoming(NewRecord(b"c"), "events", "", "", api_pb2.NONE, -1)])
        took, resp = await held
        assert sizes(resp)[0] == 0 and sizes(resp)[1] > 0 and took < 0.4
        # A newer fetch of the same session (a partition joined) answers the held one at once; another
        # session's fetch does not.
        held = asyncio.ensure_future(timed(caught_up[0]))
        other = asyncio.ensure_future(timed(caught_up[0], session=1))
        await asyncio.sleep(0.1)
        newer = asyncio.ensure_future(timed(*caught_up[:1], PartitionFetch("events", 0, 3, 0)))
        took, _ = await held
        assert took < 0.4
        assert not other.done()
        assert (await newer)[0] > 0.5 and (await other)[0] > 0.5
        # A leader that steps down answers what it held: the follower asks the new leader at once.
        held = asyncio.ensure_future(timed(caught_up[0]))
        await asyncio.sleep(0.1)
        rep.stop_leading(orders)
        took, resp = await held
        assert took < 0.4 and refusal(by_stream(resp)["orders"]) is FetchErrorCode.NOT_LEADER
    finally:
        await rep.stop()


async def test_the_byte_budget_is_shared_and_no_partition_takes_it_every_time(tmp_path: Path, nc: NATS) -> None:
    rep = replicator(fetch_wait_s=0, max_bytes=30_000)
    await rep.start(nc)
    try:
        names = ["p0", "p1", "p2"]
        for name in names:
            rep.lead(leading(tmp_path, 0, name, records=10, size=10_000))  # 100 KB each
        entries = [PartitionFetch(name, 0, 0, 0) for name in names]
        firsts = []
        for _ in range(3):
            resp = await fetch(nc, *entries)
            total = sum(len(a.batches) for a in resp.partitions if isinstance(a, PartitionData))
            assert 0 < total <= 30_000
            assert len(resp.partitions) < 3, "the rest are left out, to be asked for again"
            firsts.append(resp.partitions[0].stream)
        assert sorted(firsts) == names, "each answer starts where the last one left off"
    finally:
        await rep.stop()


async def test_a_fetch_answer_stays_under_the_nats_max_payload(tmp_path: Path, nc: NATS) -> None:
    rep = replicator(fetch_wait_s=0, max_bytes=64 << 20)
    await rep.start(nc)
    try:
        for name in ("p0", "p1"):
            rep.lead(leading(tmp_path, 0, name, records=12, size=100_000))  # 1.2 MB each
        resp = await fetch(nc, PartitionFetch("p0", 0, 0, 0), PartitionFetch("p1", 0, 0, 0))
        total = sum(len(a.batches) for a in resp.partitions if isinstance(a, PartitionData))
        assert 0 < total <= nc.max_payload
    finally:
        await rep.stop()


async def test_a_follower_server_fetches_all_its_partitions_from_a_leader_in_one_request(
    tmp_path: Path, nats_url: str, nc: NATS
) -> None:
    from liftlog.client import AckPolicy, Client
    from liftlog.metadata.controller import CreateStreamRequest

    servers = await start_cluster(tmp_path, nats_url, {"a": FaultyFileIO(), "b": FaultyFileIO()})
    seen: list[tuple[str, list[str]]] = []
    try:
        ns = servers["a"].config.clustering.namespace
        controller = servers["a"].cluster
        assert controller is not None
        names = [f"s{i}" for i in range(4)]
        for name in names:
            await controller.create_stream(CreateStreamRequest(name, name, replication_factor=2))
        leaders = {n: controller.metadata.partition(n, 0).leader for n in names}
        followers = {n: next(s for sid, s in servers.items() if sid != leaders[n]) for n in names}
        for _ in range(100):  # every follower replica has joined its fetch loop
            if all(followers[n].streams.partitions[(n, 0)].follower is not None for n in names):  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.05)

        async def spy(msg: nats.aio.msg.Msg) -> None:
            req = decode_fetch_request(msg.data[:-TRAILER_SIZE])  # signed with the cluster's secret
            seen.append((msg.subject.rsplit(".", 1)[1], sorted(p.stream for p in req.partitions)))

        await nc.subscribe(f"{ns}.fetch.*", cb=spy)
        await asyncio.sleep(0.6)  # past the retry of a first fetch that came before its leader led
        seen.clear()
        async with Client([s.address for s in servers.values()]) as client:
            for _ in range(3):
                for name in names:
                    await client.publish(name, b"x", ack_policy=AckPolicy.ALL)
        assert seen
        for leader, streams in seen:
            assert streams == sorted(n for n in names if leaders[n] == leader), (leader, streams)
        await asyncio.sleep(0.3)
        for name in names:
            part = followers[name].streams.partitions[(name, 0)]  # type: ignore[union-attr]
            assert part.log is not None and part.log.log_end_offset == 3
    finally:
        await stop_all(servers)


async def test_the_fetch_loops_wakeup_wakes_on_set_or_timeout_and_survives_cancelling() -> None:
    from liftlog.server.partitions.replicator import _Wakeup

    loop = asyncio.get_running_loop()
    wake = _Wakeup()
    started = loop.time()
    await wake.wait(0.05)  # nothing sets it: the timeout ends the wait
    assert loop.time() - started >= 0.04 and not wake.is_set
    loop.call_later(0.01, wake.set)
    started = loop.time()
    await wake.wait(5)  # set while waiting: wakes at once, not after 5 s
    assert loop.time() - started < 1 and wake.is_set
    await asyncio.wait_for(wake.wait(5), 0.1)  # still set: returns at once
    wake.clear()
    waiting = asyncio.ensure_future(wake.wait(5))
    await asyncio.sleep(0.01)
    waiting.cancel()  # a fetch loop stopped while it waits
    with pytest.raises(asyncio.CancelledError):
        await waiting
    wake.set()  # nobody waits any more: nothing to wake, nothing raised
    assert wake.is_set
