"""``liftlog bench --start-cluster`` without servers: option checks, scenario choice, ordering and the JSON shape."""

from __future__ import annotations

import os
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from liftlog.cli.bench import (
    CLUSTER_DEFAULT_SCENARIOS,
    CLUSTER_SCENARIOS,
    choose_fsync,
    choose_scenarios,
    cluster_report,
    fsync_comparison,
)
from liftlog.cli.bench_cluster import CLUSTER_DEFAULT_COUNTS, comparison, order_scenarios, server_ids
from liftlog.cli.bench_scenarios import SCENARIOS
from liftlog.cli.main import main


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    clean: dict[str, str | None] = {name: None for name in os.environ if name.startswith("LIFTLOG_")}
    return CliRunner(env=clean | (env or {})).invoke(main, list(args))


def test_help_describes_the_cluster_mode() -> None:
    result = invoke("bench", "--help")
    assert result.exit_code == 0, result.output
    for word in ("--start-cluster", "--servers", "rf3-all", "rf3-leader", "failover", "single"):
        assert word in result.stdout


def test_cluster_scenarios_are_the_default_counts() -> None:
    assert tuple(CLUSTER_DEFAULT_COUNTS) == CLUSTER_SCENARIOS
    assert not set(CLUSTER_SCENARIOS) & set(SCENARIOS)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("bench", "--start-cluster", "-a", "127.0.0.1:1"), "leave out --addr"),
        (("-a", "127.0.0.1:1", "bench", "--start-cluster"), "leave out --addr"),
        (("bench", "--start-cluster", "--start-server"), "exclude each other"),
        (("bench", "--servers", "3"), "--servers needs --start-cluster"),
        (("bench", "--server-set", "a=b"), "--server-set needs --start-cluster"),
        (("bench", "--start-cluster", "--server-set", "novalue"), "expected KEY=VALUE"),
        (("bench", "--start-cluster", "--ack-policy", "all"), "--ack-policy does not apply"),
        (("bench", "--start-cluster", "--partitions", "2"), "--partitions does not apply"),
        (("bench", "--start-cluster", "--nats-url", "nats://x:4222"), "--nats-url does not apply"),
        (("bench", "--start-cluster", "--concurrency", "2"), "--concurrency does not apply"),
        (("bench", "--start-cluster", "--servers", "0"), "--servers"),
        (("bench", "--start-cluster", "--servers", "2", "--scenarios", "failover"), "--servers 3 or more"),
        (("bench", "--start-cluster", "--scenarios", "async"), "without --start-cluster"),
        (("bench", "--scenarios", "rf3-all"), "with --start-cluster"),
        (("bench", "--start-cluster", "--scenarios", "rf3-al"), "choose from single, rf3-all"),
        (("bench", "--start-cluster", "--scenarios", ","), "(none given)"),
    ],
)
def test_contradicting_options_are_usage_errors(args: tuple[str, ...], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert message in " ".join(result.stderr.split()), result.stderr


def test_addr_from_the_environment_does_not_conflict_with_start_cluster() -> None:
    # Only an explicit --addr contradicts --start-cluster; LIFTLOG_ADDR is a shell's standing choice.
    # (--servers 2 with failover stops the run at validation, before anything starts.)
    result = invoke(
        "bench", "--start-cluster", "--servers", "2", "--scenarios", "failover", env={"LIFTLOG_ADDR": "127.0.0.1:1"}
    )
    assert result.exit_code == 2
    assert "--servers 3 or more" in " ".join(result.stderr.split())


def test_choose_scenarios() -> None:
    assert choose_scenarios(None, True, 3) == list(CLUSTER_DEFAULT_SCENARIOS)
    assert choose_scenarios("group-failover", True, 3) == ["group-failover"]
    assert choose_scenarios("cursor,rebalance", False, 3) == ["cursor", "rebalance"]
    assert choose_scenarios(None, False, 3) == list(SCENARIOS)
    assert choose_scenarios(" Failover, rf3-all,rf3-all ", True, 5) == ["failover", "rf3-all"]
    assert choose_scenarios("rf3-all,rf3-leader", True, 1) == ["rf3-all", "rf3-leader"]
    with pytest.raises(click.BadParameter):
        choose_scenarios("failover", True, 2)


def test_failover_runs_last_and_single_first() -> None:
    assert order_scenarios(["failover", "rf3-leader", "single", "rf3-all"]) == [
        "single",
        "rf3-leader",
        "rf3-all",
        "failover",
    ]
    assert order_scenarios(["rf3-all"]) == ["rf3-all"]


def test_server_ids() -> None:
    assert server_ids(3) == ["s1", "s2", "s3"]
    assert server_ids(1) == ["s1"]


def test_comparison_against_the_goals() -> None:
    results = {
        "single": {"msgs_per_s": 4000.0},
        "rf3-all": {"msgs_per_s": 2500.0},
        "failover": {"failover_s": 3.2},
    }
    assert comparison(results) == {
        "rf3_all_vs_single": 0.625,
        "rf3_all_vs_single_goal": 0.5,
        "rf3_all_vs_single_met": True,
        "failover_s": 3.2,
        "failover_goal_s": 5.0,
        "failover_met": True,
    }
    slow = comparison({"single": {"msgs_per_s": 4000.0}, "rf3-all": {"msgs_per_s": 1000.0}, "failover": {}})
    assert slow == {"rf3_all_vs_single": 0.25, "rf3_all_vs_single_goal": 0.5, "rf3_all_vs_single_met": False}
    # A failed scenario has no figure to compare.
    assert comparison({"single": {"error": "boom"}, "rf3-all": {"msgs_per_s": 1.0}}) == {}


def test_cluster_report_shape() -> None:
    results = {"rf3-all": {"msgs_per_s": 2500.0}, "failover": {"failover_s": 6.0}}
    report = cluster_report(5, 256, 100, results)
    assert report["bench"] == "liftlog" and report["server"] == "started cluster"
    assert report["cluster"] == {"servers": 5, "replication_factor": 5, "server_settings": "defaults"}
    assert (report["size"], report["window"], report["partitions"]) == (256, 100, 1)
    assert report["scenarios"] is results
    assert report["comparison"] == {"failover_s": 6.0, "failover_goal_s": 5.0, "failover_met": False}


def test_fsync_policies_and_their_comparison() -> None:
    assert choose_fsync("never, always,never") == ["never", "always"]
    by_policy: dict[str, dict[str, Any]] = {
        "never": {"async": {"msgs_per_s": 4000.0}, "sync": {"msgs_per_s": 1000.0}, "bad": {"error": "x"}},
        "interval": {"async": {"msgs_per_s": 3900.0}, "sync": {"error": "timed out"}},
        "always": {"async": {"msgs_per_s": 1800.0}, "sync": {"msgs_per_s": 600.0}},
    }
    assert fsync_comparison(by_policy) == {
        "async": {"interval_vs_never": 0.975, "always_vs_never": 0.45, "goal": 0.5, "met": False},
        "sync": {"always_vs_never": 0.6, "goal": 0.5, "met": True},
    }
