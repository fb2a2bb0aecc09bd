"""Consumer groups on Liftbridge's wire (grpcio stubs) against real servers: membership, epochs, assignments,
fenced subscriptions, expiry of silent members, and coordinator failover by the members' reports."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.client import AckPolicy, Client, Consumer, LiftlogError, StartPosition

from .harness import LiftlogProcess, NatsProcess, eventually
from .test_cluster import Cluster, create, formed, rpc


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, nats_server: NatsProcess) -> Iterator[LiftlogProcess]:
    proc = LiftlogProcess(
        tmp_path_factory.mktemp("groups") / "data",
        "--namespace",
        "groups-test",
        "--set",
        "groups.consumer.timeout=2s",
        "--set",
        "cursors.stream.partitions=1",
        nats_url=nats_server.url,
        server_id="g",
    ).start()
    create(proc.address, "orders", partitions=4)
    create(proc.address, "audit", partitions=2)
    yield proc
    proc.kill()


def join(address: str, group: str, consumer: str, *streams: str) -> api_pb2.JoinConsumerGroupResponse:
    req = api_pb2.JoinConsumerGroupRequest(groupId=group, consumerId=consumer, streams=list(streams))
    return rpc(address, "JoinConsumerGroup", req)


def leave(address: str, group: str, consumer: str) -> None:
    rpc(address, "LeaveConsumerGroup", api_pb2.LeaveConsumerGroupRequest(groupId=group, consumerId=consumer))


def assignments(address: str, group: str, consumer: str, epoch: int) -> dict[str, list[int]]:
    req = api_pb2.FetchConsumerGroupAssignmentsRequest(groupId=group, consumerId=consumer, epoch=epoch)
    resp = rpc(address, "FetchConsumerGroupAssignments", req)
    assert resp.epoch == epoch
    return {a.stream: list(a.partitions) for a in resp.assignments}


def group_meta(address: str, group: str) -> api_pb2.ConsumerGroupMetadata:
    resp = rpc(address, "FetchMetadata", api_pb2.FetchMetadataRequest(groups=[group]))
    (meta,) = resp.groupMetadata
    return meta


def refused(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    return info.value


def subscribe(
    address: str, stream: str, partition: int, consumer: api_pb2.Consumer, **kw: object
) -> grpc.RpcError | None:
    """Open a group subscription; the error it fails with at once, None if it was accepted."""
    req = api_pb2.SubscribeRequest(stream=stream, partition=partition, consumer=consumer, **kw)  # type: ignore[arg-type]
    with grpc.insecure_channel(address) as channel:
        call = api_pb2_grpc.APIStub(channel).Subscribe(req, timeout=5)
        try:
            next(call)  # the set-up message: accepted
        except grpc.RpcError as exc:
            return exc
        call.cancel()
    return None


def test_membership_epochs_and_balanced_assignments(server: LiftlogProcess) -> None:
    a = server.address
    first = join(a, "g1", "c1", "orders")
    assert (first.coordinator, first.consumerTimeout, first.coordinatorTimeout) == ("g", 2 * 10**9, 15 * 10**9)
    assert assignments(a, "g1", "c1", first.epoch) == {"orders": [0, 1, 2, 3]}
    second = join(a, "g1", "c2", "orders", "audit")
    assert second.epoch > first.epoch and second.coordinator == "g"
    meta = group_meta(a, "g1")
    assert (meta.coordinator, meta.epoch, meta.error) == ("g", second.epoch, api_pb2.ConsumerGroupMetadata.OK)
    err = refused(lambda: assignments(a, "g1", "c1", first.epoch))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "epoch differs" in (err.details() or "")
    c1, c2 = assignments(a, "g1", "c1", second.epoch), assignments(a, "g1", "c2", second.epoch)
    held = sorted((s, p) for mine in (c1, c2) for s, ps in mine.items() for p in ps)
    assert held == [("audit", 0), ("audit", 1)] + [("orders", p) for p in range(4)]  # each once
    assert abs(sum(map(len, c1.values())) - sum(map(len, c2.values()))) <= 1
    assert "audit" not in c1  # only members that consume a stream get its partitions
    leave(a, "g1", "c2")
    assert group_meta(a, "g1").epoch > second.epoch
    leave(a, "g1", "c1")  # the last one out: the group is gone
    assert group_meta(a, "g1").error == api_pb2.ConsumerGroupMetadata.UNKNOWN_GROUP


def test_bad_group_requests_are_named(server: LiftlogProcess) -> None:
    a = server.address
    join(a, "g2", "c1", "orders")
    cases = [
        (lambda: join(a, "", "c", "orders"), grpc.StatusCode.INVALID_ARGUMENT, "No groupId provided"),
        (lambda: join(a, "g2", "", "orders"), grpc.StatusCode.INVALID_ARGUMENT, "No consumerId provided"),
        (lambda: join(a, "g2", "c9"), grpc.StatusCode.INVALID_ARGUMENT, "No streams provided"),
        (lambda: join(a, "g2", "c1", "orders"), grpc.StatusCode.FAILED_PRECONDITION, "already a member"),
        (lambda: join(a, "g2", "c2", "ghost"), grpc.StatusCode.FAILED_PRECONDITION, "stream does not exist"),
        (lambda: leave(a, "nope", "c1"), grpc.StatusCode.NOT_FOUND, "consumer group does not exist"),
        (lambda: leave(a, "g2", "c7"), grpc.StatusCode.FAILED_PRECONDITION, "not a member"),
        (lambda: assignments(a, "nope", "c1", 1), grpc.StatusCode.NOT_FOUND, "does not exist"),
        (
            lambda: rpc(
                a,
                "ReportConsumerGroupCoordinator",
                api_pb2.ReportConsumerGroupCoordinatorRequest(groupId="g2", consumerId="c1"),
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "No coordinator provided",
        ),
    ]
    for call, code, text in cases:
        err = refused(call)
        assert err.code() == code and text in (err.details() or ""), (text, err.code(), err.details())
    leave(a, "g2", "c1")


def test_subscriptions_are_fenced_by_assignment_and_epoch(server: LiftlogProcess) -> None:
    a = server.address
    e1 = join(a, "g3", "c1", "audit").epoch
    c1 = api_pb2.Consumer(groupId="g3", groupEpoch=e1, consumerId="c1")
    assert subscribe(a, "audit", 0, c1) is None
    err = subscribe(a, "orders", 0, c1)  # not its stream
    assert err is not None and err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not currently assigned this partition" in (err.details() or "")
    err = subscribe(a, "audit", 0, api_pb2.Consumer(groupId="g3", groupEpoch=e1))
    assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = subscribe(a, "audit", 0, c1, readISRReplica=True)
    assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT

    # A live subscription ends when the group moves to a new epoch without it holding the partition.
    ended: list[grpc.RpcError] = []

    def follow() -> None:
        req = api_pb2.SubscribeRequest(stream="audit", partition=1, consumer=c1)
        with grpc.insecure_channel(a) as channel:
            try:
                for _ in api_pb2_grpc.APIStub(channel).Subscribe(req, timeout=20):
                    pass
            except grpc.RpcError as exc:
                ended.append(exc)

    reader = threading.Thread(target=follow)
    reader.start()
    time.sleep(0.5)
    e2 = join(a, "g3", "c2", "audit").epoch
    reader.join(10)
    assert ended and ended[0].code() == grpc.StatusCode.FAILED_PRECONDITION, ended
    old = subscribe(a, "audit", 0, c1)
    assert old is not None and old.code() == grpc.StatusCode.FAILED_PRECONDITION  # epoch e1 is over
    mine = assignments(a, "g3", "c1", e2)["audit"]
    assert subscribe(a, "audit", mine[0], api_pb2.Consumer(groupId="g3", groupEpoch=e2, consumerId="c1")) is None
    leave(a, "g3", "c1")
    leave(a, "g3", "c2")


def test_a_silent_member_expires_and_the_rest_rebalance(server: LiftlogProcess) -> None:
    a = server.address
    join(a, "g4", "quiet", "orders")
    epoch = join(a, "g4", "busy", "orders").epoch
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # busy keeps fetching (its heartbeat); quiet never does
        meta = group_meta(a, "g4")
        try:
            got = assignments(a, "g4", "busy", meta.epoch)
        except grpc.RpcError:
            time.sleep(0.2)
            continue
        if got == {"orders": [0, 1, 2, 3]}:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("quiet was not expired")
    assert group_meta(a, "g4").epoch > epoch
    leave(a, "g4", "busy")


@pytest.mark.slow
@pytest.mark.cluster
def test_members_reports_move_a_silent_coordinator(tmp_path: Path, nats_server: NatsProcess) -> None:
    c = Cluster(tmp_path, nats_server.url)
    ids = ["a", "b", "c"]
    for sid in ids:
        c.add(sid, ",".join(ids))
    try:
        c.start_all()
        formed(c, set(ids))
        create(c.servers["a"].address, "s", partitions=2, rf=3)
        joined = join(c.servers["a"].address, "gc", "m1", "s")
        second = join(c.servers["a"].address, "gc", "m2", "s")
        old = second.coordinator
        survivor = next(sid for sid in ids if sid != old)
        c.servers[old].kill()
        report = api_pb2.ReportConsumerGroupCoordinatorRequest(
            groupId="gc", consumerId="m1", coordinator=old, epoch=second.epoch
        )
        rpc(c.servers[survivor].address, "ReportConsumerGroupCoordinator", report)
        assert group_meta(c.servers[survivor].address, "gc").coordinator == old  # one of two is no majority
        stale = api_pb2.ReportConsumerGroupCoordinatorRequest(
            groupId="gc", consumerId="m2", coordinator=old, epoch=joined.epoch
        )
        err = refused(lambda: rpc(c.servers[survivor].address, "ReportConsumerGroupCoordinator", stale))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION and "generation mismatch" in (err.details() or "")
        report.consumerId = "m2"
        rpc(c.servers[survivor].address, "ReportConsumerGroupCoordinator", report)
        meta = eventually(
            lambda: ((m := group_meta(c.servers[survivor].address, "gc")).coordinator != old and m) or None,
            10,
            "a new coordinator",
        )
        assert meta.epoch > second.epoch
        new = c.servers[meta.coordinator].address
        assert assignments(new, "gc", "m1", meta.epoch) or assignments(new, "gc", "m2", meta.epoch)
    finally:
        c.stop_all()


# -- our client's Consumer, on a cluster where members and servers come and go ----------------------------


class Ledger:
    """Every message each member processed, in the order they were processed (one event loop: a total order)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, int, int]] = []  # (member, stream, partition, offset)

    def runs(self, stream: str, partition: int) -> list[str]:
        """The members that processed the partition, one entry per uninterrupted run."""
        out: list[str] = []
        for member, s, p, _ in self.events:
            if (s, p) == (stream, partition) and (not out or out[-1] != member):
                out.append(member)
        return out

    def offsets(self, stream: str, partition: int) -> set[int]:
        return {o for _, s, p, o in self.events if (s, p) == (stream, partition)}


async def consume(consumer: Consumer, name: str, ledger: Ledger) -> None:
    async for msg in consumer:
        ledger.events.append((name, msg.stream, msg.partition, msg.offset))
        await asyncio.sleep(0.002)  # some work per message: handovers happen mid-stream


def abandon(consumer: Consumer, task: asyncio.Task[None]) -> None:
    """A member that dies: no leave, no last checkpoint; its coordinator must notice the silence."""
    task.cancel()
    for t in consumer._tasks:
        t.cancel()
    for reader in consumer._readers.values():
        reader.task.cancel()
    consumer._closed = True


@pytest.mark.slow
@pytest.mark.cluster
def test_a_group_shares_partitions_through_joins_deaths_and_a_coordinator_failover(
    tmp_path: Path, nats_server: NatsProcess
) -> None:
    c = Cluster(tmp_path, nats_server.url)
    ids = ["a", "b", "c"]
    settings = (
        "cursors.stream.partitions=2",
        "groups.consumer.timeout=3s",
        "groups.coordinator.timeout=3s",
        "clustering.replica.max.lag.time=2s",
    )
    for sid in ids:
        c.add(sid, ",".join(ids), *(arg for s in settings for arg in ("--set", s)))
    try:
        c.start_all()
        formed(c, set(ids))
        create(c.servers["a"].address, "s1", partitions=4, rf=3)
        create(c.servers["a"].address, "s2", partitions=2, rf=3)
        eventually(
            lambda: (
                "__cursors"
                in {
                    s.name
                    for s in rpc(c.servers["a"].address, "FetchMetadata", api_pb2.FetchMetadataRequest()).streamMetadata
                }
                or None
            ),
            30,
            "__cursors",
        )
        asyncio.run(_group_scenario(c, ids))
    finally:
        c.stop_all()


async def _group_scenario(c: Cluster, ids: list[str]) -> None:
    ledger = Ledger()
    published: dict[tuple[str, int], set[int]] = {}
    addresses = [p.address for p in c.servers.values()]
    stop = asyncio.Event()

    async def publish(client: Client) -> None:
        i = 0
        while not stop.is_set():
            stream, partition = ("s1", i % 4) if i % 3 else ("s2", i % 2)
            try:
                ack = await client.publish(stream, b"m%d" % i, partition=partition, ack_policy=AckPolicy.ALL)
            except LiftlogError:
                await asyncio.sleep(0.2)  # a leader is moving: the message may or may not be stored
                continue
            assert ack is not None
            published.setdefault((stream, partition), set()).add(ack.offset)
            i += 1
            await asyncio.sleep(0.005)

    async with Client(addresses, timeout=10) as client:
        publisher = asyncio.create_task(publish(client))
        members: dict[str, tuple[Consumer, asyncio.Task[None]]] = {}

        async def start(name: str, streams: list[str]) -> None:
            consumer = client.consumer(
                "workers", streams, consumer_id=name, auto_checkpoint=0.5, start_position=StartPosition.EARLIEST
            )
            await consumer.start()
            members[name] = (consumer, asyncio.create_task(consume(consumer, name, ledger)))

        await start("m1", ["s1"])
        await asyncio.sleep(2)
        await start("m2", ["s1"])
        await asyncio.sleep(2)
        await start("m3", ["s1", "s2"])  # a stream added to the group
        await asyncio.sleep(2)
        abandon(*members.pop("m2"))  # a member dies
        await asyncio.sleep(5)  # > groups.consumer.timeout: expired, its partitions move
        coordinator = members["m1"][0].coordinator
        c.servers[coordinator].kill()  # and then the coordinator
        await asyncio.sleep(9)  # > groups.coordinator.timeout: the members report it and move on
        stop.set()
        await publisher

        def caught_up() -> bool:
            return all(offsets <= ledger.offsets(*key) for key, offsets in published.items())

        deadline = asyncio.get_running_loop().time() + 40
        while not caught_up():
            assert asyncio.get_running_loop().time() < deadline, {
                key: sorted(offsets - ledger.offsets(*key))[:5] for key, offsets in published.items()
            }
            await asyncio.sleep(0.5)
        new_coordinator = members["m1"][0].coordinator
        for consumer, task in members.values():
            task.cancel()
            await consumer.close()

    assert new_coordinator != coordinator
    for (stream, partition), offsets in published.items():
        assert offsets <= ledger.offsets(stream, partition)  # at least once, nothing skipped
        runs = ledger.runs(stream, partition)
        # One member at a time: a partition changes hands only at rebalances (a handful), never back and
        # forth message by message as two concurrent readers would make it.
        assert len(runs) <= 6, (stream, partition, runs)
    assert {m for m, *_ in ledger.events} >= {"m1", "m2", "m3"}


def test_the_group_commands(server: LiftlogProcess) -> None:
    from tests.cli.test_cli import assert_one_error_line, invoke

    a = server.address
    epoch = join(a, "g5", "c1", "orders").epoch
    listed = invoke("group", "list", "-a", a)
    assert listed.exit_code == 0 and "g5" in listed.stdout and "c1" in listed.stdout, listed.output
    described = " ".join(invoke("group", "describe", "g5", "-a", a).stdout.split())
    assert f"group g5 coordinator g epoch {epoch}" in described and "orders: 0,1,2,3" in described
    assert "ghost" in assert_one_error_line(invoke("group", "describe", "ghost", "-a", a), 1)
    leave(a, "g5", "c1")

    with grpc.insecure_channel(a) as channel:
        api = api_pb2_grpc.APIStub(channel)
        for i in range(4):
            api.Publish(api_pb2.PublishRequest(stream="orders", partition=i, value=b"v%d" % i), timeout=5)
    result = invoke("subscribe", "orders", "--group", "g6", "--from", "earliest", "--count", "4", "-a", a)
    assert result.exit_code == 0, result.output
    assert sorted(line.split()[-1] for line in result.stdout.splitlines()) == ["v0", "v1", "v2", "v3"]
    assert group_meta(a, "g6").error == api_pb2.ConsumerGroupMetadata.UNKNOWN_GROUP  # it left when done
