"""``liftlog bench --start-cluster`` for real: a nats-server and three ``liftlog server`` processes it starts itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.cluster]


@pytest.mark.timeout(120)
def test_bench_start_cluster_measures_replication_and_failover() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFTLOG_")}
    command = [sys.executable, "-m", "liftlog.cli.main", "bench", "--start-cluster", "--servers", "3"]
    command += ["--scenarios", "rf3-all,failover", "--count", "300", "--json-only"]
    # Default server settings: with them a follower that missed a new-data notification used to sleep
    # its whole 10 s idle wait, and ack ALL stalled past the 5 s ack timeout.
    done = subprocess.run(command, capture_output=True, text=True, timeout=110, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = done.stdout.strip().splitlines()
    report = json.loads(line)
    assert report["cluster"] == {"servers": 3, "replication_factor": 3, "server_settings": "defaults"}
    assert list(report["scenarios"]) == ["rf3-all", "failover"]
    rf3 = report["scenarios"]["rf3-all"]
    assert rf3["count"] == 300 and rf3["msgs_per_s"] > 0 and rf3["latency_us"]["p50"] > 0
    failover = report["scenarios"]["failover"]
    assert failover["count"] == 300 and failover["failover_s"] > 0
    assert failover["killed"] in {"s1", "s2", "s3"} and failover["new_leader"] not in {"", failover["killed"]}
    assert failover["acked_lost"] == 0
    assert report["comparison"]["failover_s"] == failover["failover_s"]


@pytest.mark.timeout(120)
def test_bench_times_the_failover_of_a_group_coordinator() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFTLOG_")}
    command = [sys.executable, "-m", "liftlog.cli.main", "bench", "--start-cluster", "--servers", "3"]
    command += ["--scenarios", "group-failover", "--json-only"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=110, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])["scenarios"]["group-failover"]
    # groups.coordinator.timeout=3s: members report once 3 s passed since their last answer (up to a fetch
    # interval, 1 s, before the kill), then the controller moves the group. Their reading may resume sooner:
    # subscriptions need the partitions' leaders, not the coordinator.
    assert 1.5 <= result["coordinator_failover_s"] < 30 and 0 < result["resumed_s"] < 30, result
    assert result["killed"] in {"s1", "s2", "s3"}


def test_bench_measures_set_cursor_and_rebalance_on_its_own_server() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFTLOG_")}
    command = [sys.executable, "-m", "liftlog.cli.main", "bench", "--start-server"]
    command += ["--scenarios", "cursor,rebalance", "--count", "3", "--json-only"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=110, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    scenarios = json.loads(done.stdout.strip().splitlines()[-1])["scenarios"]
    assert scenarios["cursor"]["count"] == 3 and scenarios["cursor"]["latency_us"]["p50"] > 0
    assert scenarios["rebalance"]["count"] == 3 and scenarios["rebalance"]["latency_us"]["p50"] > 0
