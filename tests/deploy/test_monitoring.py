"""The Grafana dashboard and the alerting rules: generated, valid, and about metrics that exist."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "liftlog-dashboard.json"
ALERTS = DEPLOY / "alerts.yml"
NAME = re.compile(r"\b((?:liftlog|process)_[a-z_]+)\b")
#: Metrics Prometheus makes itself, not a liftlog server.
PROMETHEUS_OWN = {"up"}


def _builder() -> Any:
    spec = importlib.util.spec_from_file_location("build_dashboard", DEPLOY / "grafana" / "build_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


def alert_queries() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def referenced_metrics() -> set[str]:
    """Every metric sample name the dashboard and the alerts query."""
    names = set()
    for expr in dashboard_queries() + alert_queries():
        names.update(NAME.findall(expr))
    return names


def test_the_committed_dashboard_is_what_its_builder_writes() -> None:
    assert DASHBOARD.read_text() == _builder().render(), "run python deploy/grafana/build_dashboard.py"


def test_dashboard_panels_fit_the_grid_and_have_unique_ids() -> None:
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] != "row":
            assert p["targets"] and p["description"], p["title"]


def test_queries_are_balanced_and_use_only_known_variables() -> None:
    for expr in dashboard_queries() + alert_queries():
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
        assert set(re.findall(r"\$\w+", expr)) <= {"$stream", "$__rate_interval"}, expr
    assert referenced_metrics() - PROMETHEUS_OWN, "no metric found"


def test_every_alert_has_a_summary_and_a_severity() -> None:
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
            assert rule["annotations"]["summary"], rule["alert"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed (Debian: prometheus)")
def test_promtool_accepts_the_rules_and_the_prometheus_config() -> None:
    rules = subprocess.run(["promtool", "check", "rules", str(ALERTS)], capture_output=True, text=True)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    config = subprocess.run(
        ["promtool", "check", "config", "prometheus.yml"], capture_output=True, text=True, cwd=DEPLOY
    )
    assert config.returncode == 0, config.stdout + config.stderr
