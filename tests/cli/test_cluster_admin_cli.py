"""``liftlog cluster reassign|decommission|rebalance|reassignments`` against a fake ``liftlog.Cluster`` server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from liftlog.api import cluster_pb2

from .test_cli import assert_one_error_line, invoke
from .test_cluster_cli import FakeCluster, start_server

pytestmark = pytest.mark.timeout(60)

WIDE = {"COLUMNS": "200"}


def moving(stream: str = "orders", leader_log_end: int = 100) -> cluster_pb2.Reassignment:
    r = cluster_pb2.Reassignment(
        stream=stream, partition=0, current=["a", "b", "c"], target=["c", "b"], leader="a", leaderLogEnd=leader_log_end
    )
    r.replicas.add(id="a", logEnd=100, inSync=True)
    r.replicas.add(id="b", logEnd=100, inSync=True)
    r.replicas.add(id="c", logEnd=40, inSync=False)
    return r


class FakeAdmin(FakeCluster):
    def __init__(self) -> None:
        super().__init__()
        self.requests: list[Any] = []
        self.progress = [[moving()], []]  # what Reassignments answers, one call after the other
        self.refuse: str = ""

    def Reassign(self, request: Any, context: Any) -> cluster_pb2.ReassignResponse:
        self.requests.append(request)
        return cluster_pb2.ReassignResponse(reassignments=[moving()])

    def Decommission(self, request: Any, context: Any) -> cluster_pb2.DecommissionResponse:
        self.requests.append(request)
        if self.refuse:
            context.set_trailing_metadata((("liftlog-error", "refused"),))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, self.refuse)
        return cluster_pb2.DecommissionResponse(reassignments=[moving()])

    def ElectPreferredLeaders(self, request: Any, context: Any) -> cluster_pb2.ElectPreferredLeadersResponse:
        return cluster_pb2.ElectPreferredLeadersResponse(changed=2)

    def Reassignments(self, request: Any, context: Any) -> cluster_pb2.ReassignmentsResponse:
        answer = self.progress.pop(0) if len(self.progress) > 1 else self.progress[0]
        return cluster_pb2.ReassignmentsResponse(serverId="a", reassignments=answer)


@pytest.fixture
def admin() -> Iterator[tuple[FakeAdmin, str]]:
    servicer = FakeAdmin()
    server, address = start_server(servicer)
    try:
        yield servicer, address
    finally:
        server.stop(None)


def test_reassign_sends_the_replicas_and_shows_the_move(admin: tuple[FakeAdmin, str]) -> None:
    fake, address = admin
    result = invoke("cluster", "reassign", "orders", "0", "--replicas", "c, b", "--no-wait", "-a", address, env=WIDE)
    assert result.exit_code == 0, result.output
    (req,) = fake.requests
    assert [(p.stream, p.partition, list(p.replicas)) for p in req.partitions] == [("orders", 0, ["c", "b"])]
    assert not req.spread
    assert "c,b" in result.stdout and "c 40/100" in result.stdout


def test_reassign_waits_for_the_copy_with_a_progress_bar(admin: tuple[FakeAdmin, str]) -> None:
    fake, address = admin
    result = invoke("cluster", "reassign", "--spread", "-a", address, env=WIDE)
    assert result.exit_code == 0, result.output
    assert fake.requests[0].spread
    assert "orders/0 → c" in result.stdout and result.stdout.rstrip().endswith("done")


@pytest.mark.parametrize(
    ("args", "wording"),
    [
        ((), "use --spread"),
        (("orders", "0"), "needs STREAM, PARTITION and --replicas"),
        (("orders", "0", "--replicas", " , "), "name at least one server"),
    ],
)
def test_reassign_usage_errors(args: tuple[str, ...], wording: str) -> None:
    result = invoke("cluster", "reassign", *args, "-a", "127.0.0.1:1")
    assert result.exit_code == 2 and wording in result.output, result.output


def test_decommission_and_its_refusal(admin: tuple[FakeAdmin, str]) -> None:
    fake, address = admin
    result = invoke("cluster", "decommission", "s3", "--no-wait", "-a", address, env=WIDE)
    assert result.exit_code == 0, result.output
    assert fake.requests[-1].server == "s3"
    fake.refuse = "removing s3 would leave 1 live metadata voters of 2, fewer than the 2 a quorum needs"
    line = assert_one_error_line(invoke("cluster", "decommission", "s3", "-a", address), 1)
    assert "quorum" in line


def test_rebalance_and_reassignments(admin: tuple[FakeAdmin, str]) -> None:
    _fake, address = admin
    result = invoke("cluster", "rebalance", "-a", address)
    assert result.exit_code == 0 and "2 leaderships handed back" in result.stdout, result.output
    result = invoke("cluster", "reassignments", "--json", "-a", address)
    assert result.exit_code == 0, result.output
    state = json.loads(result.stdout)
    assert state["moving"][0]["target"] == ["c", "b"] and state["leaving"] == []
    result = invoke("cluster", "reassignments", "-a", address, env=WIDE)
    assert "no reassignment under way" in result.stdout


def test_status_marks_a_leaving_server(admin: tuple[FakeAdmin, str]) -> None:
    fake, address = admin
    fake.response.servers[0].leaving = True  # "c"
    result = invoke("cluster", "status", "-a", address, env=WIDE)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if line.lstrip().startswith("c "))
    assert "leaving" in row


def test_decommission_sent_to_the_server_leaving_follows_the_others() -> None:
    """The leaving server stops hearing of the cluster once it has left: asked, it would say "still moving",
    "still here" for ever. The command follows the controller instead and ends as it would anywhere else."""
    leaving, staying = FakeAdmin(), FakeAdmin()
    leaving_server, leaving_address = start_server(leaving)
    staying_server, staying_address = start_server(staying)
    try:
        host_a, port_a = leaving_address.rsplit(":", 1)
        host_b, port_b = staying_address.rsplit(":", 1)
        for fake, self_id in ((leaving, "a"), (staying, "b")):
            fake.response = cluster_pb2.ClusterStatusResponse(serverId=self_id, controller="b")
            if fake is leaving:
                fake.response.servers.add(id="a", host=host_a, port=int(port_a), alive=True, voter=True, leaving=True)
            fake.response.servers.add(id="b", host=host_b, port=int(port_b), alive=True, voter=True, controller=True)
        leaving.progress = [[moving()]]  # stale: it never learns the move finished
        staying.progress = [[moving()], []]
        result = invoke("cluster", "decommission", "a", "-a", leaving_address, env=WIDE)
        assert result.exit_code == 0, result.output
        assert result.stdout.rstrip().endswith("server a has left the cluster; stop its process")
        assert leaving.requests[-1].server == "a"
    finally:
        leaving_server.stop(None)
        staying_server.stop(None)
