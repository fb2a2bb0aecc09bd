"""``liftlog cluster status`` against a fake ``liftlog.Cluster`` gRPC server on a free port.

The fake is a plain (threaded) ``grpc.server``, so the command's own event
loop, run by click's test runner in the test's thread, can talk to it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from typing import Any, cast

import grpc
import pytest
from rich.console import Console
from rich.text import Text

from liftlog.api import cluster_pb2, cluster_pb2_grpc
from liftlog.cli.cluster import status_summary, status_table
from liftlog.client import ClusterStatus

from .test_cli import assert_one_error_line, closed_address, invoke

pytestmark = pytest.mark.timeout(60)

WIDE = {"COLUMNS": "200"}  # rich fits tables to the terminal width


def status_response(controller: str = "b") -> cluster_pb2.ClusterStatusResponse:
    """Three servers, sent out of id order; "c" is a dead non-voter without a rack."""
    resp = cluster_pb2.ClusterStatusResponse(
        serverId="a",
        controller=controller,
        term=7,
        commitIndex=120,
        appliedIndex=118,
        streamCount=3,
        partitionCount=9,
        clusterAuth=True,
    )
    resp.servers.add(id="c", host="127.0.1.3", port=9294, alive=False, livenessChanged=1_700_000_000_000_000_000)
    resp.servers.add(
        id="b", host="127.0.1.2", port=9293, rack="r2", alive=True, voter=True, controller=True, partitionCount=6
    )
    resp.servers.add(
        id="a", host="127.0.1.1", port=9292, rack="r1", alive=True, voter=True, partitionCount=9, leaderCount=5
    )
    return resp


class FakeCluster(cluster_pb2_grpc.ClusterServicer):
    def __init__(self) -> None:
        self.response = status_response()

    def Status(self, request: Any, context: Any) -> cluster_pb2.ClusterStatusResponse:
        return self.response


def start_server(servicer: FakeCluster | None) -> tuple[grpc.Server, str]:
    """A threaded gRPC server on a free port, with `servicer` (None: no services, like a stranger's server)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    if servicer is not None:
        cluster_pb2_grpc.add_ClusterServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def fake() -> Iterator[tuple[FakeCluster, str]]:
    servicer = FakeCluster()
    server, address = start_server(servicer)
    try:
        yield servicer, address
    finally:
        server.stop(None)


# -- help ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (("cluster",), ["status", "Liftbridge"]),
        (("cluster", "status"), ["--addr", "--json", "controller", "voter"]),
    ],
)
def test_help(command: tuple[str, ...], expected: list[str]) -> None:
    result = invoke(*command, "--help")
    assert result.exit_code == 0, result.output
    for word in expected:
        assert word in result.stdout, f"{word} missing from `liftlog {' '.join(command)} --help`"


def test_root_help_mentions_cluster_status() -> None:
    assert "liftlog cluster status" in invoke("--help").stdout


# -- the table -----------------------------------------------------------------


def test_table(fake: tuple[FakeCluster, str]) -> None:
    _, address = fake
    result = invoke("cluster", "status", "-a", address, env=WIDE)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "controller b  term 7  commit 120  applied 118  3 streams, 9 partitions  answered by a (127.0.1.1:9292)"
    )
    assert result.stderr == ""
    header = next(line for line in lines if "ADDRESS" in line)
    assert header.split() == ["ID", "ADDRESS", "RACK", "ROLE", "LIVE", "PARTITIONS", "LEADERS"]
    rows = [line.split() for line in lines[lines.index(header) + 2 :] if line.strip()]
    # The live server that does not answer (nothing listens at b's address) is named, not guessed about.
    assert " ".join(rows.pop()) == "fenced replicas unknown for b (did not answer)"
    assert rows == [
        ["a", "127.0.1.1:9292", "r1", "voter", "yes", "9", "5"],
        ["b", "127.0.1.2:9293", "r2", "controller", "yes", "6", "0"],
        ["c", "127.0.1.3:9294", "—", "—", "no", "0", "0"],
    ]


def test_table_at_80_columns_keeps_ids_and_addresses_whole(fake: tuple[FakeCluster, str]) -> None:
    servicer, address = fake
    long_id = "3f9c2a7be01d4c58"  # a generated server id (16 hex digits)
    servicer.response.servers[0].id = long_id
    result = invoke("cluster", "status", "-a", address, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("controller b  term 7") and lines[0].endswith("(127.0.1.1:9292)")  # not wrapped
    assert max(len(line) for line in lines[1:]) <= 80
    header = next(line for line in lines if "ADDRESS" in line)
    assert header.split() == ["ID", "ADDRESS", "RACK", "ROLE", "LIVE", "PARTITIONS", "LEADERS"]  # not cut
    rows = [line.split() for line in lines[lines.index(header) + 2 :] if line.strip()]
    assert rows.pop()[:3] == ["fenced", "replicas", "unknown"]  # b's address does not answer
    # One line per server: the 16-character id and the address whole.
    assert [(row[0], row[1]) for row in rows] == [
        (long_id, "127.0.1.3:9294"),
        ("a", "127.0.1.1:9292"),
        ("b", "127.0.1.2:9293"),
    ]


def test_no_controller(fake: tuple[FakeCluster, str]) -> None:
    servicer, address = fake
    servicer.response.controller = ""
    servicer.response.servers[1].controller = False
    result = invoke("cluster", "status", "-a", address, env=WIDE)
    assert result.exit_code == 0, result.output  # a leaderless cluster is a status to report, not a failure
    assert result.stdout.splitlines()[0].startswith("no known metadata leader  term 7")
    assert "controller" not in result.stdout


def test_styles() -> None:
    """The controller-less warning is red; LIVE is green "yes" or red "no" (invisible in captured output)."""
    status = ClusterStatus.from_proto(status_response(controller=""))
    summary = status_summary(status)
    assert [summary.plain[span.start : span.end] for span in summary.spans if "red" in str(span.style)] == [
        "no known metadata leader"
    ]
    table = status_table(status)
    live = next(column for column in table.columns if column.header == "LIVE")
    cells = cast(list[Text], list(live.cells))
    assert [(str(c), str(c.style)) for c in cells] == [("yes", "green"), ("yes", "green"), ("no", "red")]
    console = Console(width=120, record=True, force_terminal=True, color_system="standard")
    console.print(summary)
    assert "\x1b[" in console.export_text(styles=True)


# -- --json --------------------------------------------------------------------


def test_json(fake: tuple[FakeCluster, str]) -> None:
    _, address = fake
    result = invoke("cluster", "status", "--json", "-a", address)
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    obj = json.loads(line)
    assert {k: v for k, v in obj.items() if k != "servers"} == {
        "server_id": "a",
        "controller": "b",
        "term": 7,
        "commit_index": 120,
        "applied_index": 118,
        "stream_count": 3,
        "partition_count": 9,
        "attention": [],
        "fenced": [],
        "unreachable": ["b"],
        "open_files_limit": 0,
        "segment_files_open": 0,
        "segment_files_budget": 0,
        "without_secret": [],
        "dropped": [],
        "encryption_keys": [["a", []]],
    }
    assert [s["id"] for s in obj["servers"]] == ["a", "b", "c"]  # sorted by id, like the table
    assert obj["servers"][2] == {
        "id": "c",
        "host": "127.0.1.3",
        "port": 9294,
        "rack": "",
        "alive": False,
        "liveness_changed_ns": 1_700_000_000_000_000_000,
        "voter": False,
        "controller": False,
        "partition_count": 0,
        "leader_count": 0,
        "leaving": False,
    }


def test_json_no_controller_is_null(fake: tuple[FakeCluster, str]) -> None:
    servicer, address = fake
    servicer.response.controller = ""
    result = invoke("cluster", "status", "--json", "-a", address)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["controller"] is None


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (("-a", "{address}", "cluster", "status"), {}),  # --addr on the root group
        (("cluster", "-a", "{address}", "status"), {}),  # ... on the cluster group
        (("cluster", "status"), {"LIFTLOG_ADDR": "{address}"}),
    ],
)
def test_address_from_root_group_or_env(
    fake: tuple[FakeCluster, str], args: tuple[str, ...], env: dict[str, str]
) -> None:
    _, address = fake
    argv = [arg.format(address=address) for arg in args]
    result = invoke(*argv, "--json", env={name: value.format(address=address) for name, value in env.items()})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["server_id"] == "a"


# -- errors --------------------------------------------------------------------


def test_unreachable_server_is_one_error_line() -> None:
    address = closed_address()
    line = assert_one_error_line(invoke("cluster", "status", "-a", address), 1)
    assert f"no liftlog server answered at {address}" in line


def test_server_without_the_cluster_api_is_one_error_line() -> None:
    server, address = start_server(None)
    try:
        line = assert_one_error_line(invoke("cluster", "status", "-a", address), 1)
    finally:
        server.stop(None)
    assert "does not offer liftlog's cluster API" in line and "Liftbridge" in line


def test_partitions_needing_attention_get_their_own_table_and_json(fake: tuple[FakeCluster, str]) -> None:
    servicer, address = fake
    assert "needing attention" not in invoke("cluster", "status", "-a", address, env=WIDE).stdout  # all well
    servicer.response.attention.add(
        stream="orders", partition=2, state="candidate-found", leader="a", candidate="c", replicas=["a", "b", "c"],
        isr=["b", "c"],
    )  # fmt: skip
    servicer.response.attention.add(
        stream="logs", partition=0, state="online", leader="b", replicas=["b", "c"], isr=["b"]
    )
    out = invoke("cluster", "status", "-a", address, env=WIDE).stdout
    lines = out.splitlines()
    title = next(i for i, line in enumerate(lines) if "Partitions needing attention" in line)
    rows = [line.split() for line in lines[title + 3 :] if line.strip() and not line.strip().startswith("─")]
    assert rows.pop()[:3] == ["fenced", "replicas", "unknown"]  # b's address does not answer
    assert rows == [
        ["orders", "2", "candidate-found", "(c)", "a", "b,c", "a,b,c"],
        ["logs", "0", "online", "b", "b", "b,c"],
    ]
    report = json.loads(invoke("cluster", "status", "--json", "-a", address).stdout)
    assert report["attention"][0] == {
        "stream": "orders",
        "partition": 2,
        "state": "candidate-found",
        "leader": "a",
        "candidate": "c",
        "replicas": ["a", "b", "c"],
        "isr": ["b", "c"],
        "server": "",
        "reason": "",
    }
    status = ClusterStatus.from_proto(servicer.response)
    assert [p.under_replicated for p in status.attention] == [True, True]


def test_servers_without_a_secret_and_dropped_messages_are_shown(fake: tuple[FakeCluster, str]) -> None:
    servicer, address = fake
    servicer.response.clusterAuth = False
    servicer.response.droppedInternal["unsigned"] = 3
    servicer.response.droppedInternal["forged"] = 1
    result = invoke("cluster", "status", "-a", address, env=WIDE)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "no cluster secret on a: anyone who can publish on NATS can act as a server" in text
    assert "server-to-server messages dropped since start (a: 1 forged, 3 unsigned)" in text


def test_servers_with_different_encryption_keys_are_shown(fake: tuple[FakeCluster, str]) -> None:
    """a, then b (both served by one fake) answer with different current master keys: the warning names both."""
    servicer, _ = fake
    answers = iter([["1f2e3d4c", "0a0b0c0d"], ["99887766"]])

    class TwoKeys(FakeCluster):
        def Status(self, request: Any, context: Any) -> cluster_pb2.ClusterStatusResponse:
            resp = cluster_pb2.ClusterStatusResponse()
            resp.CopyFrom(servicer.response)
            resp.encryptionKeys.extend(next(answers))
            return resp

    status_server, status_address = start_server(TwoKeys())
    try:
        for server in servicer.response.servers:
            if server.id == "b":
                server.host, port = status_address.split(":")
                server.port = int(port)
        result = invoke("cluster", "status", "-a", status_address, env=WIDE)
    finally:
        status_server.stop(None)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "servers encrypt with different master keys (a: 1f2e3d4c; b: 99887766)" in text
    assert (
        ClusterStatus(
            "a", None, 0, 0, 0, (), 0, 0, encryption_keys=(("a", ("1f",)), ("b", ("1f", "2e")))
        ).encryption_keys_differ
        is False
    )
