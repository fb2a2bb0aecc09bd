"""The operations endpoint of a real server: /metrics, /healthz, /readyz, and hostile HTTP against it."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from liftlog.api import api_pb2, api_pb2_grpc
from tests.deploy.test_monitoring import PROMETHEUS_OWN, referenced_metrics

from .harness import LiftlogProcess, NatsProcess, eventually, free_port

pytestmark = pytest.mark.slow


class Ops:
    """HTTP to a server's metrics.listen port."""

    def __init__(self, port: int) -> None:
        self.port = port

    def get(
        self, path: str, method: str = "GET", headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, path, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def json(self, path: str) -> tuple[int, dict[str, Any]]:
        status, _headers, body = self.get(path)
        return status, json.loads(body)

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        status, _headers, body = self.get("/metrics")
        assert status == 200
        out = {}
        for family in text_string_to_metric_families(body.decode()):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out

    def value(self, name: str, **labels: str) -> float:
        return self.samples()[(name, tuple(sorted(labels.items())))]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, nats_server: NatsProcess) -> Iterator[tuple[LiftlogProcess, Ops]]:
    data = tmp_path_factory.mktemp("metrics") / "data"
    port = free_port()
    proc = LiftlogProcess(
        data,
        "--set",
        f"metrics.listen=127.0.0.1:{port}",
        "--set",
        "metrics.partitions.max=2",
        nats_url=nats_server.url,
    ).start()
    yield proc, Ops(port)
    proc.kill()


def publish(address: str, stream: str, count: int, policy: api_pb2.AckPolicy, partition: int = 0) -> None:
    with grpc.insecure_channel(address) as channel:
        api = api_pb2_grpc.APIStub(channel)
        for i in range(count):
            api.Publish(
                api_pb2.PublishRequest(stream=stream, partition=partition, value=b"v%d" % i, ackPolicy=policy),
                timeout=10,
            )


def test_health_and_readiness_of_a_started_server(served: tuple[LiftlogProcess, Ops]) -> None:
    _proc, ops = served
    status, health = ops.json("/healthz")
    assert status == 200 and health["status"] == "ok" and health["server_id"] == "s1"
    assert isinstance(health["event_loop_lag_seconds"], float)
    status, ready = eventually(lambda: ((r := ops.json("/readyz"))[0] == 200 and r) or None, what="readiness")
    assert ready["problems"] == []
    assert ops.value("liftlog_ready") == 1
    assert ops.value("liftlog_build_info", server_id="s1", version="0.1.0") == 1


def test_counters_and_offsets_follow_publishes_and_reads(served: tuple[LiftlogProcess, Ops]) -> None:
    proc, ops = served
    with grpc.insecure_channel(proc.address) as channel:
        api = api_pb2_grpc.APIStub(channel)
        api.CreateStream(api_pb2.CreateStreamRequest(name="aa-metrics", subject="aa-metrics"), timeout=10)
    before_leader = ops.value("liftlog_publish_ack_latency_seconds_count", ack_policy="leader")
    before_all = ops.value("liftlog_publish_ack_latency_seconds_count", ack_policy="all")
    publish(proc.address, "aa-metrics", 10, api_pb2.LEADER)
    publish(proc.address, "aa-metrics", 5, api_pb2.ALL)
    labels = {"stream": "aa-metrics", "partition": "0"}
    assert ops.value("liftlog_partition_messages_in_total", **labels) == 15
    assert ops.value("liftlog_partition_high_watermark", **labels) == 14
    assert ops.value("liftlog_partition_log_end_offset", **labels) == 15
    assert ops.value("liftlog_partition_log_start_offset", **labels) == 0
    assert ops.value("liftlog_partition_segments", **labels) == 1
    assert ops.value("liftlog_partition_size_bytes", **labels) == ops.value(
        "liftlog_partition_bytes_in_total", **labels
    )
    assert ops.value("liftlog_partition_leader", **labels) == 1
    assert ops.value("liftlog_partition_isr_size", **labels) == 1
    assert ops.value("liftlog_publish_ack_latency_seconds_count", ack_policy="leader") - before_leader == 10
    assert ops.value("liftlog_publish_ack_latency_seconds_count", ack_policy="all") - before_all == 5
    with grpc.insecure_channel(proc.address) as channel:
        api = api_pb2_grpc.APIStub(channel)
        req = api_pb2.SubscribeRequest(
            stream="aa-metrics", startPosition=api_pb2.EARLIEST, stopPosition=api_pb2.STOP_LATEST
        )
        assert len(list(api.Subscribe(req, timeout=10))) == 16  # the set-up message, then 15
    assert ops.value("liftlog_partition_messages_out_total", **labels) == 15
    assert ops.value("liftlog_partition_bytes_out_total", **labels) > 15
    assert ops.value("liftlog_cluster_streams") >= 1
    assert ops.value("liftlog_controller") == 1
    assert ops.value("liftlog_nats_connected") == 1
    assert ops.value("process_open_fds") > 0 and ops.value("process_max_fds") >= ops.value("process_open_fds")


def test_partitions_past_the_cap_are_summed_under_other(served: tuple[LiftlogProcess, Ops]) -> None:
    proc, ops = served
    with grpc.insecure_channel(proc.address) as channel:
        api = api_pb2_grpc.APIStub(channel)
        api.CreateStream(api_pb2.CreateStreamRequest(name="zz-many", subject="zz-many", partitions=4), timeout=10)
    for p in range(4):
        publish(proc.address, "zz-many", p + 1, api_pb2.LEADER, partition=p)
    samples = ops.samples()
    streams = {
        dict(labels).get("stream") for (name, labels) in samples if name == "liftlog_partition_messages_in_total"
    }
    # metrics.partitions.max=2: the two first by name keep their labels (aa-metrics/0, zz-many/0 here).
    labelled = [
        labels
        for (name, labels) in samples
        if name == "liftlog_partition_messages_in_total" and dict(labels)["stream"] != "_other"
    ]
    assert len(labelled) == 2, labelled
    assert "_other" in streams
    other = samples[("liftlog_partition_messages_in_total", (("partition", "_other"), ("stream", "_other")))]
    in_labelled = sum(samples[("liftlog_partition_messages_in_total", lab)] for lab in labelled)
    assert other + in_labelled == 15 + sum(range(1, 5))  # nothing lost by summing
    # Offsets cannot be summed: none for the capped partitions.
    assert not any(
        name == "liftlog_partition_high_watermark" and dict(labels)["stream"] == "_other" for (name, labels) in samples
    )


def test_openmetrics_head_and_unknown_paths(served: tuple[LiftlogProcess, Ops]) -> None:
    _proc, ops = served
    status, headers, body = ops.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200 and headers["content-type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")
    status, headers, body = ops.get("/metrics", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 1000
    assert ops.get("/nope")[0] == 404
    status, headers, _ = ops.get("/metrics", method="POST")
    assert status == 405 and headers["allow"] == "GET, HEAD"


def raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_hostile_requests_are_refused_and_the_server_keeps_serving(served: tuple[LiftlogProcess, Ops]) -> None:
    proc, ops = served
    assert raw(ops.port, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw(ops.port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n").startswith(b"HTTP/1.1 431 ")
    assert raw(ops.port, b"GET /healthz HTTP/1.1\r\n\x00\xff\r\n\r\n").startswith(b"HTTP/1.1 200 ")
    # A crowd of idle connections: bounded (refused past 64), and once they go, scrapes answer again.
    idle = [socket.create_connection(("127.0.0.1", ops.port), timeout=10) for _ in range(80)]
    try:
        time.sleep(0.5)
        assert raw(ops.port, b"GET /healthz HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 503 ")
    finally:
        for s in idle:
            s.close()
    eventually(lambda: ops.get("/healthz")[0] == 200, 10, "health after the idle connections left")
    assert ops.samples()  # the parser takes every line
    with grpc.insecure_channel(proc.address) as channel:
        api_pb2_grpc.APIStub(channel).FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=5)


def test_a_taken_metrics_port_fails_the_start_with_its_key(tmp_path: Path, nats_server: NatsProcess) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = LiftlogProcess(tmp_path / "data", "--set", f"metrics.listen=127.0.0.1:{port}", nats_url=nats_server.url)
        with pytest.raises(RuntimeError, match=f"metrics.listen: cannot listen on 127.0.0.1:{port}"):
            proc.start(timeout=20)


def metrics_cluster(
    tmp_path: Path, nats_server: NatsProcess, ids: list[str], *settings: str
) -> tuple[Any, dict[str, Ops]]:
    """A cluster of ``ids`` founded together, each with metrics on a port of its own (not started yet)."""
    from .test_cluster import Cluster

    c = Cluster(tmp_path, nats_server.url)
    ops: dict[str, Ops] = {}
    for sid in ids:
        port = free_port()
        ops[sid] = Ops(port)
        args = [arg for setting in (f"metrics.listen=127.0.0.1:{port}", *settings) for arg in ("--set", setting)]
        c.add(sid, ",".join(ids), *args)
    return c, ops


@pytest.mark.cluster
def test_replication_lag_isr_and_a_controller_failover_in_metrics(tmp_path: Path, nats_server: NatsProcess) -> None:
    from .test_cluster import agreed, create, formed

    ids = ["a", "b", "c"]
    c, ops = metrics_cluster(
        tmp_path, nats_server, ids, "clustering.replica.max.lag.time=2s", "clustering.replica.max.idle.wait=500ms"
    )
    try:
        c.start_all()
        controller = formed(c, set(ids))
        create(c.servers["a"].address, "lagged", rf=3)
        leader = agreed(c, "lagged")["lagged"][0][0]
        followers = [sid for sid in ids if sid != leader]
        publish(c.servers[leader].address, "lagged", 20, api_pb2.ALL)
        labels = {"stream": "lagged", "partition": "0"}
        for f in followers:

            def replicated(f: str = f) -> bool:
                return ops[f].value("liftlog_partition_messages_replicated_total", **labels) == 20

            assert eventually(replicated, 10, f)
            assert ops[f].value("liftlog_partition_leader", **labels) == 0
            assert ops[f].value("liftlog_replication_fetches_total") > 0
            lag = {"follower": f, **labels}

            def caught_up(lag: dict[str, str] = lag) -> bool:
                return ops[leader].value("liftlog_partition_follower_lag_messages", **lag) == 0

            assert eventually(caught_up, 10)
            assert ops[leader].value("liftlog_partition_follower_lag_seconds", **lag) == 0
        assert ops[leader].value("liftlog_partition_isr_size", **labels) == 3
        assert ops[leader].value("liftlog_partition_fetches_served_total", **labels) > 0
        assert ops[leader].value("liftlog_publish_ack_latency_seconds_count", ack_policy="all") >= 20
        assert ops[leader].value("liftlog_partitions_under_replicated") == 0
        # Every metric the dashboard and the alerting rules query is one a leader with followers exports.
        exported = {name for name, _labels in ops[leader].samples()}
        assert not referenced_metrics() - PROMETHEUS_OWN - exported

        # A follower dies: the leader sees it fall behind, then leave the ISR.
        victim = next(f for f in followers if f != controller) if controller != leader else followers[0]
        c.servers[victim].kill()
        publish(c.servers[leader].address, "lagged", 5, api_pb2.LEADER)
        lag = {"follower": victim, **labels}
        assert eventually(lambda: ops[leader].value("liftlog_partition_follower_lag_messages", **lag) == 5, 10)
        assert eventually(lambda: ops[leader].value("liftlog_partitions_under_replicated") == 1, 15, "ISR shrink")
        assert ops[leader].value("liftlog_partition_isr_size", **labels) == 2
        assert ops[leader].value("liftlog_partition_follower_lag_seconds", **lag) > 1.5
        assert ops[leader].value("liftlog_cluster_servers", alive="false") in (0, 1)  # liveness lags behind

        # The controller dies (if still running): the survivors count one failover and its duration.
        survivors = [sid for sid in ids if sid != victim and sid != controller]
        if controller != victim:
            c.servers[controller].kill()
            c.servers[victim].start()
            survivors.append(victim)
        else:
            survivors = [sid for sid in ids if sid != victim]
            c.servers[victim].start()
        watcher = survivors[0]
        assert eventually(
            lambda: ops[watcher].value("liftlog_controller_failover_seconds_count") >= 1, 30, "a failover counted"
        )
        assert ops[watcher].value("liftlog_controller_failover_seconds_sum") > 0
        assert ops[watcher].value("liftlog_raft_leader_changes_total") >= 2
        assert eventually(lambda: ops[watcher].json("/readyz")[0] == 200, 30, "ready under the new controller")
    finally:
        c.stop_all()


@pytest.mark.cluster
def test_a_server_without_a_metadata_quorum_is_alive_but_not_ready(tmp_path: Path, nats_server: NatsProcess) -> None:
    from .test_cluster import formed

    ids = ["a", "b", "c"]
    c, ops = metrics_cluster(tmp_path, nats_server, ids)
    try:
        c.start_all()
        formed(c, set(ids))
        c.servers["b"].kill()
        c.servers["c"].kill()
        _status, body = eventually(lambda: ((r := ops["a"].json("/readyz"))[0] == 503 and r) or None, 30, "not ready")
        assert body["status"] == "failing"
        assert "no metadata leader known" in body["problems"]
        assert ops["a"].json("/healthz")[0] == 200  # alive: no orchestrator should restart it for this
        assert ops["a"].value("liftlog_ready") == 0
        assert ops["a"].value("liftlog_raft_leader_known") == 0
    finally:
        c.stop_all()


def test_json_logs_are_one_object_per_line_and_name_partitions(tmp_path: Path, nats_server: NatsProcess) -> None:
    proc = LiftlogProcess(tmp_path / "data", "--set", "logging.format=json", nats_url=nats_server.url).start()
    try:
        with grpc.insecure_channel(proc.address) as channel:
            api = api_pb2_grpc.APIStub(channel)
            api.CreateStream(api_pb2.CreateStreamRequest(name="logged", subject="logged", partitions=2), timeout=10)
        publish(proc.address, "logged", 3, api_pb2.LEADER)
        assert proc.stop() == 0
        lines = proc.log_path.read_text().splitlines()
        objects = [json.loads(line) for line in lines]  # every line, the banner and the shutdown included
        assert any("is ready" in o["message"] for o in objects)
        about_partitions = {(o["stream"], o["partition"]) for o in objects if "stream" in o}
        assert {("logged", 0), ("logged", 1)} <= about_partitions, about_partitions
        assert all({"time", "level", "logger", "message"} <= o.keys() for o in objects)
    finally:
        proc.kill()
