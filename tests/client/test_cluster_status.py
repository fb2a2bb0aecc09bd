"""``Client.cluster_status`` against in-process gRPC servers running a fake ``liftlog.Cluster``.

As in ``test_client``, each fake is a real ``grpc.aio`` server on a free
localhost port, so the call path (``/liftlog.Cluster/Status``), failover,
retries and error mapping go over the wire. A server with only the fake
``proto.API`` of ``test_client`` stands in for a Liftbridge server.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest

from liftlog.api import cluster_pb2, cluster_pb2_grpc
from liftlog.api.errors import ERROR_KEY, Reason
from liftlog.client import (
    Client,
    ClientClosedError,
    ClusterStatus,
    InternalError,
    ServerStatus,
    UnavailableError,
    UnimplementedError,
)

from .test_client import Cluster, Failure, free_port, serve

pytestmark = pytest.mark.timeout(30)


def status_response(controller: str = "b") -> cluster_pb2.ClusterStatusResponse:
    """Three servers, sent out of id order; "c" is a non-voting, dead replica."""
    resp = cluster_pb2.ClusterStatusResponse(
        serverId="a", controller=controller, term=7, commitIndex=120, appliedIndex=118, streamCount=3, partitionCount=9
    )
    resp.servers.add(id="c", host="127.0.1.3", port=9292, alive=False, livenessChanged=1_700_000_000_000_000_000)
    resp.servers.add(
        id="b", host="127.0.1.2", port=9292, rack="r2", alive=True, voter=True, controller=True, partitionCount=6
    )
    resp.servers.add(
        id="a", host="127.0.1.1", port=9292, rack="r1", alive=True, voter=True, partitionCount=9, leaderCount=5
    )
    return resp


class FakeCluster(cluster_pb2_grpc.ClusterServicer):
    """Answers Status with `response`, or first with the queued `failures`."""

    def __init__(self, response: cluster_pb2.ClusterStatusResponse) -> None:
        self.response = response
        self.failures: list[Failure] = []
        self.calls = 0

    async def Status(self, request: Any, context: Any) -> cluster_pb2.ClusterStatusResponse:
        self.calls += 1
        if self.failures:
            code, details, reason = self.failures.pop(0)
            trailing = ((ERROR_KEY, reason.value),) if reason is not None else ()
            await context.abort(code, details, trailing_metadata=trailing)
        return self.response


@contextlib.asynccontextmanager
async def serve_cluster(response: cluster_pb2.ClusterStatusResponse) -> AsyncIterator[tuple[FakeCluster, str]]:
    fake = FakeCluster(response)
    server = grpc.aio.server()
    cluster_pb2_grpc.add_ClusterServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield fake, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeCluster, str]]:
    async with serve_cluster(status_response()) as served:
        yield served


def quick_client(*addresses: str) -> Client:
    return Client(list(addresses), timeout=5, retries=2, backoff=0.01)


def test_conversion() -> None:
    status = ClusterStatus.from_proto(status_response())
    assert (status.server_id, status.controller, status.term) == ("a", "b", 7)
    assert (status.commit_index, status.applied_index, status.stream_count, status.partition_count) == (120, 118, 3, 9)
    assert [s.id for s in status.servers] == ["c", "b", "a"]  # as sent
    assert status.server("a") == ServerStatus("a", "127.0.1.1", 9292, "r1", True, 0, True, False, 9, 5)
    c = status.server("c")
    assert c is not None and c.address == "127.0.1.3:9292"
    assert (c.alive, c.voter, c.controller, c.liveness_changed_ns) == (False, False, False, 1_700_000_000_000_000_000)
    assert status.server("zz") is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.term = 8  # type: ignore[misc]


def test_empty_controller_is_none() -> None:
    assert ClusterStatus.from_proto(status_response(controller="")).controller is None
    empty = ClusterStatus.from_proto(cluster_pb2.ClusterStatusResponse())
    assert (empty.server_id, empty.controller, empty.servers) == ("", None, ())


async def test_cluster_status_over_the_wire(fake: tuple[FakeCluster, str]) -> None:
    servicer, address = fake
    client = quick_client(address)
    try:
        status = await client.cluster_status()
    finally:
        await client.close()
    # The other live server ("b") is asked for its fenced replicas; nothing listens there.
    assert status == dataclasses.replace(ClusterStatus.from_proto(status_response()), unreachable=("b",))
    assert servicer.calls == 1


async def test_cluster_status_fails_over_and_retries_unavailable(fake: tuple[FakeCluster, str]) -> None:
    """A dead first address is skipped and an UNAVAILABLE answer retried, like the other any-server calls."""
    servicer, address = fake
    servicer.failures = [(grpc.StatusCode.UNAVAILABLE, "shutting down", Reason.UNAVAILABLE)]
    client = quick_client(f"127.0.0.1:{free_port()}", address)
    try:
        status = await client.cluster_status()
    finally:
        await client.close()
    assert status.controller == "b"
    assert servicer.calls == 2


async def test_cluster_status_no_server_answers_names_the_addresses() -> None:
    dead = f"127.0.0.1:{free_port()}"
    client = Client(dead, retries=1, backoff=0.01, timeout=2)
    try:
        with pytest.raises(UnavailableError, match=f"no liftlog server answered at {dead}"):
            await client.cluster_status()
    finally:
        await client.close()


async def test_cluster_status_unavailable_answer_is_the_servers_error(fake: tuple[FakeCluster, str]) -> None:
    """A server that answers UNAVAILABLE (with liftlog's reason) did answer: its message is kept."""
    servicer, address = fake
    servicer.failures = [(grpc.StatusCode.UNAVAILABLE, "shutting down", Reason.UNAVAILABLE)] * 3
    client = quick_client(address)
    try:
        with pytest.raises(UnavailableError) as info:
            await client.cluster_status()
    finally:
        await client.close()
    assert str(info.value) == "shutting down"
    assert servicer.calls == 3  # the first try and 2 retries


async def test_liftbridge_server_is_a_clear_error() -> None:
    """A server with proto.API but no liftlog.Cluster: connecting works, cluster_status says why it cannot."""
    async with serve("a", Cluster()) as liftbridge, quick_client(liftbridge.address) as client:
        with pytest.raises(UnimplementedError) as info:
            await client.cluster_status()
    err = info.value
    assert "does not offer liftlog's cluster API" in str(err) and "Liftbridge" in str(err)
    assert err.code == grpc.StatusCode.UNIMPLEMENTED and err.reason is None


async def test_unimplemented_with_a_reason_keeps_the_servers_message(fake: tuple[FakeCluster, str]) -> None:
    """A liftlog server that refuses on purpose (it sends a reason) is not mistaken for Liftbridge."""
    servicer, address = fake
    servicer.failures = [(grpc.StatusCode.UNIMPLEMENTED, "not in standalone mode", Reason.UNIMPLEMENTED)]
    client = quick_client(address)
    try:
        with pytest.raises(UnimplementedError) as info:
            await client.cluster_status()
    finally:
        await client.close()
    assert str(info.value) == "not in standalone mode" and info.value.reason is Reason.UNIMPLEMENTED


async def test_other_errors_are_raised_at_once(fake: tuple[FakeCluster, str]) -> None:
    servicer, address = fake
    servicer.failures = [(grpc.StatusCode.INTERNAL, "metadata store broken", None)]
    client = quick_client(address)
    try:
        with pytest.raises(InternalError, match="metadata store broken"):
            await client.cluster_status()
    finally:
        await client.close()
    assert servicer.calls == 1


async def test_closed_client_refuses(fake: tuple[FakeCluster, str]) -> None:
    client = quick_client(fake[1])
    await client.close()
    with pytest.raises(ClientClosedError):
        await client.cluster_status()
