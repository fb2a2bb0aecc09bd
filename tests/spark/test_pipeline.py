"""The reference pipeline end to end: NATS -> liftlog -> Structured Streaming -> compacted liftlog and Parquet.

One run of 300 seeded events (some late, all within the watermark) on the
session's Spark, liftlog server and NATS; its results are checked against
counts made in plain Python from the same seed, read back with the plain
client (the stream) and Spark (the Parquet files).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from liftlog.pipeline.generator import FLUSH_KEY, WINDOW_MS, EventSpec, expected_counts, make_events
from tests.spark.conftest import read_all

pytestmark = pytest.mark.spark

SPEC = EventSpec(count=300, seed=11, start_ms=1_700_000_000_000, interval_ms=100, keys=12)
PARTITIONS = 3


@pytest.fixture(scope="module")
def finished(spark: Any, liftlog_server: Any, spark_nats: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from liftlog.pipeline.runner import Pipeline, PipelineConfig

    out = tmp_path_factory.mktemp("pipeline")
    cfg = PipelineConfig(
        servers=liftlog_server.address,
        nats=spark_nats.url,
        input_stream="pipeline-test-events",
        output_stream="pipeline-test-counts",
        subject_prefix="pipeline-test",
        partitions=PARTITIONS,
        parquet_dir=str(out / "parquet"),
        checkpoint_dir=str(out / "checkpoints"),
        events=SPEC.count,
        rate=400.0,  # under a second of publishing: a few micro-batches of 500 ms
        interval_ms=SPEC.interval_ms,
        seed=SPEC.seed,
        users=SPEC.keys,
        start_ms=SPEC.start_ms,
        trigger="500 milliseconds",
        run_id="test",
    )
    snapshots = []
    pipeline = Pipeline(spark, cfg)
    summary = pipeline.run(on_tick=lambda: snapshots.append(pipeline.snapshot()))
    return cfg, summary, snapshots


def _expected() -> dict[tuple[str, int], tuple[int, int]]:
    events = make_events(SPEC)
    newest = 0
    late = 0
    for e in events:
        late += e.ts < newest
        newest = max(newest, e.ts)
    assert late > 0, "the generator should send some events out of order"
    return expected_counts(events, WINDOW_MS)


def test_compacted_stream_holds_the_final_count_of_every_window(finished: Any, liftlog_server: Any) -> None:
    cfg, summary, _ = finished
    latest: dict[str, tuple[int, dict[str, Any]]] = {}
    for partition in range(PARTITIONS):
        for msg in read_all(liftlog_server.address, cfg.output_stream, partition):
            key = msg.key.decode()
            if key not in latest or latest[key][0] < msg.offset:
                latest[key] = (msg.offset, json.loads(msg.value))
    got = {}
    for key, (_, doc) in latest.items():
        assert key == f"{doc['key']}|{doc['window_start']}"
        assert doc["window_end"] - doc["window_start"] == WINDOW_MS
        got[(doc["key"], doc["window_start"])] = (doc["count"], doc["amount"])
    expected = _expected()
    assert got == expected
    assert sum(n for n, _ in got.values()) == SPEC.count
    assert all(FLUSH_KEY not in key for key in latest)
    assert summary.complete and summary.events == SPEC.count


def test_input_was_recorded_by_partition_from_nats_subjects(finished: Any, liftlog_server: Any) -> None:
    cfg, summary, _ = finished
    from liftlog.pipeline.generator import partition_for

    seen = 0
    for partition in range(PARTITIONS):
        for msg in read_all(liftlog_server.address, cfg.input_stream, partition):
            key = msg.key.decode()
            assert partition_for(key, PARTITIONS) == partition
            assert msg.subject.startswith("pipeline-test.")
            seen += 1
    assert seen == SPEC.count + 1  # and the flush event
    assert summary.recorded == seen


def test_parquet_holds_each_closed_window_once(finished: Any, spark: Any) -> None:
    cfg, summary, _ = finished
    rows = spark.read.parquet(str(Path(cfg.parquet_dir) / "run=test")).collect()
    got: dict[tuple[str, int], tuple[int, int]] = {}
    for r in rows:
        assert (r["key"], r["window_start"]) not in got, "a window was written twice"
        got[(r["key"], r["window_start"])] = (r["count"], r["amount"])
    assert got == _expected()
    assert summary.parquet == summary.stream == summary.expected


def test_progress_was_reported(finished: Any) -> None:
    _, summary, snapshots = finished
    phases = [s.phase for s in snapshots]
    assert phases[0] == "creating streams" and phases[-1] == "done"
    assert "publishing events" in phases
    last = snapshots[-1]
    assert last.published == last.acked == SPEC.count + 1
    counts, closed = summary.queries
    assert counts.rows_in == closed.rows_in == SPEC.count + 1
    assert closed.rows_out == len(_expected())


def test_results_command_reads_both_sinks_back(finished: Any, liftlog_server: Any) -> None:
    from liftlog.cli.main import main

    cfg, summary, _ = finished
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        main,
        [
            "pipeline",
            "results",
            "--servers",
            liftlog_server.address,
            "--output-stream",
            cfg.output_stream,
            "--parquet-dir",
            cfg.parquet_dir,
            "--top",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    windows = len(_expected())
    assert f"liftlog {cfg.output_stream}: {windows} windows, {SPEC.keys} users, {SPEC.count} events" in result.output
    assert f"{windows} closed windows, {SPEC.keys} users, {SPEC.count} events" in result.output
    assert "Busiest users" in result.output
    assert summary.stream.keys == SPEC.keys


def test_the_job_script_explains_itself() -> None:
    from liftlog.pipeline import job

    with pytest.raises(SystemExit) as exit_info:
        job.main(["--help"])
    assert exit_info.value.code == 0


def test_the_job_hands_its_tls_settings_to_the_source_and_sink_as_options() -> None:
    from liftlog.client import TlsConfig
    from liftlog.pipeline.job import _args, tls_options

    assert tls_options(None) == {}
    config = TlsConfig(ca="ca.pem", cert="me.pem", key="me.key", server_name="db.example")
    assert tls_options(config) == {
        "tls.ca": "ca.pem",
        "tls.cert": "me.pem",
        "tls.key": "me.key",
        "tls.serverName": "db.example",
    }
    args = _args(["--tls-ca", "ca.pem", "--tls-cert", "me.pem", "--tls-key", "me.key"])
    assert (args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name) == ("ca.pem", "me.pem", "me.key", None)
