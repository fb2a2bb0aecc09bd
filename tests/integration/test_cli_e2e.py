"""The liftlog command against a real server: what a user types, as subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .harness import LiftlogProcess

pytestmark = pytest.mark.slow


def liftlog(server: LiftlogProcess, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "liftlog.cli.main", *args, "-a", server.address],
        input=stdin,
        env={**os.environ, "COLUMNS": "200"},  # rich wraps tables to the terminal width
        capture_output=True,
        text=True,
        timeout=120,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def test_stream_commands(server: LiftlogProcess, name: str) -> None:
    ok(liftlog(server, "stream", "create", name, "--subject", f"{name}.*", "--partitions", "2"))
    listing = ok(liftlog(server, "stream", "list"))
    assert name in listing and f"{name}.*" in listing
    ok(liftlog(server, "stream", "pause", name, "-p", "1"))
    described = ok(liftlog(server, "stream", "describe", name))
    assert "paused" in described.lower()
    ok(liftlog(server, "stream", "resume", name))
    ok(liftlog(server, "stream", "readonly", name))
    refused = liftlog(server, "publish", name, "x")
    assert refused.returncode == 1 and refused.stderr.startswith("error:") and "readonly" in refused.stderr
    assert "Traceback" not in refused.stderr
    ok(liftlog(server, "stream", "readonly", name, "--off"))
    ok(liftlog(server, "stream", "delete", name))
    missing = liftlog(server, "stream", "describe", name)
    assert missing.returncode == 1 and name in missing.stderr and len(missing.stderr.strip().splitlines()) == 1


def test_publish_and_subscribe(server: LiftlogProcess, name: str) -> None:
    ok(liftlog(server, "stream", "create", name, "--subject", name))
    out = ok(liftlog(server, "publish", name, "-k", "k1", "-H", "source=test", "hello", "world"))
    assert "0" in out and "1" in out
    ok(liftlog(server, "publish", name, stdin="".join(f"line {i}\n" for i in range(1000))))
    lines = ok(liftlog(server, "subscribe", name, "--output", "json")).splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 1002
    assert (records[0]["offset"], records[0]["key"], records[0]["value"]) == (0, "k1", "hello")
    assert records[0]["headers"] == {"source": "test"}
    assert records[-1]["value"] == "line 999"
    text = ok(liftlog(server, "subscribe", name, "--from", "offset:1000"))
    assert text.splitlines()[0].split()[-2:] == ["line", "998"]
    assert len(text.splitlines()) == 2


def test_publish_to_unknown_stream_is_one_line(server: LiftlogProcess, name: str) -> None:
    result = liftlog(server, "publish", f"{name}-missing", "x")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error:") and f"{name}-missing" in result.stderr


def test_bench_runs_against_a_server(server: LiftlogProcess) -> None:
    out = ok(liftlog(server, "bench", "--count", "200", "--scenarios", "sync,async,consume", "--json-only"))
    (line,) = out.strip().splitlines()
    result = json.loads(line)
    assert result["bench"] == "liftlog" and result["size"] == 256
    for scenario in ("sync", "async", "consume"):
        assert result["scenarios"][scenario]["msgs_per_s"] > 0, result["scenarios"][scenario]


def test_listings_never_cut_names_and_speak_json(server: LiftlogProcess) -> None:
    long_name = "liftbridge-orders-from-the-eu-warehouse-" + "x" * 40
    ok(liftlog(server, "stream", "create", long_name, "--subject", long_name + ".events"))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    piped = subprocess.run(  # stdout a pipe, no COLUMNS: as `liftlog stream list | grep` sees it
        [sys.executable, "-m", "liftlog.cli.main", "stream", "list", "-a", server.address],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert any(long_name in line and long_name + ".events" in line for line in piped.stdout.splitlines())
    narrow = subprocess.run(
        [sys.executable, "-m", "liftlog.cli.main", "stream", "list", "-a", server.address],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "60"},
        timeout=60,
    )
    cells = [line.split("│")[1].strip() for line in narrow.stdout.splitlines() if line.startswith("│")]
    assert long_name in "".join(cells), "a narrow terminal wraps names rather than cut them"
    listed = json.loads(ok(liftlog(server, "stream", "list", "--output", "json")))
    (mine,) = [s for s in listed if s["name"] == long_name]
    assert mine["subject"] == long_name + ".events" and mine["partitions"][0]["id"] == 0
    status = json.loads(ok(liftlog(server, "cluster", "status", "-o", "json")))
    assert status["servers"][0]["id"]
    assert json.loads(ok(liftlog(server, "group", "list", "-o", "json")) or "null") is None  # no groups: no lines
