"""The reference pipeline and the exactly-once sink on a Spark standalone cluster, not in local mode.

A master and two workers (1 core, 1 GiB each) run as JVMs of their own on
127.0.0.1 (:mod:`tests.spark.standalone`); applications go in with
``spark-submit``, and their executors' Python workers are this venv's
interpreter, so they import liftlog. One liftlog server with embedded NATS
serves both tests.

- The reference pipeline (``liftlog/pipeline/job.py --once``) counts seeded
  events: the Spark event log shows liftlog read tasks and liftlog write
  tasks on executors of both workers, and both sinks hold every window's
  count once, as plain Python counts them.
- A streaming copy through the exactly-once sink
  (``standalone_copy_job.py``): an executor JVM is killed with SIGKILL while
  both tasks of a micro-batch are half-way through their writes; Spark runs
  the lost task again elsewhere, and the output holds every input row once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import liftlog.pipeline
from liftlog.client import Client, StartPosition, StopPosition
from liftlog.pipeline.generator import FLUSH_KEY, WINDOW_MS, EventSpec, expected_counts, make_events, publish_events
from liftlog.spark.writing import ROW_HEADER, TXN_HEADER
from tests.integration.harness import LiftlogProcess, free_port
from tests.spark.conftest import fill, make_stream, read_all, run
from tests.spark.standalone import EventLog, StandaloneCluster, Submission

pytestmark = [pytest.mark.spark, pytest.mark.slow]

JOB = Path(liftlog.pipeline.__file__).parent / "job.py"
COPY_JOB = Path(__file__).parent / "standalone_copy_job.py"
#: Both applications: two executors of one core, one per worker; no task before both are up (so the first
#: micro-batch spreads too), and none held back waiting for the executor that cached its input.
CONF = {
    "spark.cores.max": "2",
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
    "spark.locality.wait": "0",
    "spark.sql.shuffle.partitions": "6",
}
#: Longest run of one application (they take 30 to 60 s on 2 cores).
SUBMIT_TIMEOUT = 150.0


@dataclass(frozen=True, slots=True)
class Server:
    proc: LiftlogProcess
    nats_url: str

    @property
    def address(self) -> str:
        return self.proc.address


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    nats_port = free_port()
    data = tmp_path_factory.mktemp("standalone-liftlog") / "data"
    proc = LiftlogProcess(data, "--embedded-nats", "--embedded-nats-port", str(nats_port)).start()
    try:
        yield Server(proc, f"nats://127.0.0.1:{nats_port}")
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    spark = StandaloneCluster(tmp_path_factory.mktemp("standalone-spark"), workers=2, cores=1, memory="1g")
    try:
        yield spark.start()
    finally:
        spark.stop()


@contextlib.contextmanager
def explained(cluster: StandaloneCluster) -> Iterator[None]:
    """On failure, print the logs of master, workers, drivers and executors (pytest shows them with the error)."""
    try:
        yield
    except BaseException:
        print(cluster.diagnostics())
        raise


def finish(submission: Submission) -> EventLog:
    status = submission.wait(SUBMIT_TIMEOUT)
    assert status == 0, f"spark-submit exited with {status}:\n{submission.output()}"
    return submission.event_log()


def spread(log: EventLog, cluster: StandaloneCluster, stages: set[int]) -> dict[str, int]:
    """Worker web UI -> successful tasks of ``stages`` that its executors ran; checks those are the cluster's."""
    workers = log.executor_workers()
    assert set(workers.values()) <= {w["webuiaddress"] for w in cluster.alive_workers()}
    return dict(Counter(workers[t.executor] for t in log.tasks() if t.stage in stages and t.reason == "Success"))


# -- the reference pipeline -------------------------------------------------------------------------------------

SPEC = EventSpec(count=400, seed=5, start_ms=1_700_000_000_000, interval_ms=100, keys=10)


def test_reference_pipeline_reads_and_writes_liftlog_on_both_workers(
    server: Server, cluster: StandaloneCluster, tmp_path: Path
) -> None:
    events = make_events(SPEC)
    run(server.address, lambda c: c.create_stream("standalone-events.*", "standalone-events", partitions=3))
    stats = asyncio.run(publish_events(server.nats_url, events, prefix="standalone-events", partitions=3))
    assert stats.acked == len(events) + 1  # and the flush event
    parquet = tmp_path / "parquet"
    submission = cluster.submit(
        JOB,
        *("--servers", server.address, "--input-stream", "standalone-events"),
        *("--output-stream", "standalone-counts", "--output-partitions", "2"),
        *("--parquet-dir", str(parquet), "--checkpoint-dir", str(tmp_path / "checkpoints")),
        *("--run-id", "standalone", "--trigger", "1 second", "--once"),
        conf=CONF,
        name="pipeline",
    )
    with explained(cluster):
        log = finish(submission)
        expected = expected_counts(events, WINDOW_MS)

        # Both kinds of liftlog task ran on both workers.
        reads = spread(log, cluster, log.scan_stages())
        writes = spread(log, cluster, log.write_stages())
        assert len(reads) == 2, f"liftlog read tasks per worker: {reads}"
        assert len(writes) == 2, f"liftlog write tasks per worker: {writes}"

        # The compacted stream: every window's updates in order, each once; the last is the count.
        updates: dict[str, list[dict[str, Any]]] = {}
        for partition in range(2):
            for msg in read_all(server.address, "standalone-counts", partition):
                updates.setdefault(msg.key.decode(), []).append(json.loads(msg.value))
        got = {}
        for key, docs in updates.items():
            counts = [d["count"] for d in docs]
            assert counts == sorted(set(counts)), f"window {key}: updates {counts} repeat or go back"
            last = docs[-1]
            assert key == f"{last['key']}|{last['window_start']}"
            got[last["key"], last["window_start"]] = (last["count"], last["amount"])
        assert got == expected

        # Parquet: each window once, when it closed.
        from liftlog.pipeline.results import read_parquet

        rows = read_parquet(str(parquet), "standalone")
        closed = Counter((r["key"], r["window_start"]) for r in rows)
        assert max(closed.values()) == 1, [w for w, n in closed.items() if n > 1]
        assert {(r["key"], r["window_start"]): (r["count"], r["amount"]) for r in rows} == expected
        assert FLUSH_KEY not in {r["key"] for r in rows}


# -- the exactly-once sink and a killed executor ----------------------------------------------------------------

ROWS = 1200  # per input partition
ROWS_PER_BATCH = 600  # 4 micro-batches of 2 tasks, 300 rows each
PER_TASK = ROWS_PER_BATCH // 2
ARROW_ROWS = 30  # a task's rows reach the sink in 10 Arrow batches ...
PAUSE = 0.4  # ... 0.4 s apart: about 4 s of writing per task
#: The copy job's settings: small Arrow batches, sent to the sink's Python worker as they come (Spark buffers
#: spark.buffer.size bytes of a Python worker's input, 64 KiB, before sending: a task's whole input here).
COPY_CONF = CONF | {"spark.sql.execution.arrow.maxRecordsPerBatch": str(ARROW_ROWS), "spark.buffer.size": "1024"}


class OutputWatch:
    """Reads the output stream as it grows: rows per writing task (the sink's txn header)."""

    def __init__(self, address: str, stream: str, partitions: int) -> None:
        self.address = address
        self.stream = stream
        self.next = dict.fromkeys(range(partitions), 0)
        self.per_task: Counter[str] = Counter()

    def poll(self) -> Counter[str]:
        async def work(c: Client) -> None:
            for partition, start in self.next.items():
                hw = (await c.fetch_partition_metadata(self.stream, partition)).high_watermark
                if hw < start:
                    continue
                sub = c.subscribe(
                    self.stream,
                    partition=partition,
                    start_position=StartPosition.OFFSET,
                    start_offset=start,
                    stop_position=StopPosition.STOP_OFFSET,
                    stop_offset=hw,
                )
                async with sub:
                    async for msg in sub:
                        self.per_task[msg.headers[TXN_HEADER].decode()] += 1
                self.next[partition] = hw + 1

        run(self.address, work)
        return self.per_task


def kill_mid_batch(cluster: StandaloneCluster, submission: Submission, watch: OutputWatch) -> tuple[int, Counter[str]]:
    """SIGKILL an executor JVM once both tasks of a micro-batch after the first have written some of their rows
    and neither is past 60 %; the executor's id and the rows per task written by then."""
    deadline = time.monotonic() + SUBMIT_TIMEOUT
    while time.monotonic() < deadline:
        assert submission.proc.poll() is None, f"the job ended before an executor was killed:\n{submission.output()}"
        per_task = watch.poll()
        batches: dict[int, list[int]] = {}
        for tag, n in per_task.items():
            batches.setdefault(int(tag.rsplit("/", 2)[1]), []).append(n)
        newest = max(batches, default=0)
        under_way = batches.get(newest, [])
        if newest >= 1 and len(under_way) == 2 and all(0 < n <= PER_TASK * 0.6 for n in under_way):
            executors = cluster.executors()
            assert len(executors) == 2, f"expected 2 executors, found {executors}"
            victim = min(executors, key=lambda e: int(e.executor_id))
            os.kill(victim.pid, signal.SIGKILL)
            return int(victim.executor_id), Counter(per_task)
        time.sleep(0.1)
    raise AssertionError(f"no executor was killed within {SUBMIT_TIMEOUT}s:\n{submission.output()}")


def test_exactly_once_sink_keeps_every_row_once_when_an_executor_dies_mid_batch(
    server: Server, cluster: StandaloneCluster, tmp_path: Path
) -> None:
    values = {p: [f"p{p}-row{i:05d}".encode() for i in range(ROWS)] for p in range(2)}
    make_stream(server.address, "standalone-copy-in", partitions=2)
    make_stream(server.address, "standalone-copy-out", partitions=2)
    fill(server.address, "standalone-copy-in", values, window=200)
    submission = cluster.submit(
        COPY_JOB,
        *("--servers", server.address, "--input", "standalone-copy-in", "--output", "standalone-copy-out"),
        *("--checkpoint", str(tmp_path / "checkpoint"), "--rows-per-batch", str(ROWS_PER_BATCH)),
        *("--tasks", "2", "--pause", str(PAUSE)),
        conf=COPY_CONF,
        name="copy",
    )
    with explained(cluster):
        watch = OutputWatch(server.address, "standalone-copy-out", 2)
        victim, at_kill = kill_mid_batch(cluster, submission, watch)
        log = finish(submission)

        # Every row once: the values, and one message per (task, row id).
        out = [m for p in range(2) for m in read_all(server.address, "standalone-copy-out", p)]
        got = Counter(m.value for m in out)
        assert [v for v, n in got.items() if n > 1] == [], "rows written twice"
        assert sorted(got) == sorted(v for vs in values.values() for v in vs), "rows missing or foreign"
        ids = Counter((m.headers[TXN_HEADER], m.headers[ROW_HEADER]) for m in out)
        assert max(ids.values()) == 1

        # The killed executor lost a task that had written part of its rows; another attempt finished it.
        tasks = log.tasks()
        lost = [t for t in tasks if t.executor == str(victim) and t.reason != "Success"]
        assert lost, f"no task of executor {victim} failed: {tasks}"
        props = log.job_properties()
        final = watch.poll()
        for task in lost:
            assert task.reason == "ExecutorLostFailure", task
            redone = [t for t in tasks if (t.stage, t.index) == (task.stage, task.index) and t.reason == "Success"]
            assert redone and redone[0].executor != str(victim), f"{task} was not run again elsewhere: {tasks}"
            query, batch = props[task.stage]["sql.streaming.queryId"], props[task.stage]["streaming.sql.batchId"]
            tag = f"{query}/{batch}/{task.index}"
            assert 0 < at_kill[tag] < final[tag] == PER_TASK, (tag, at_kill, final)
            # The new attempt found the killed one's rows in the stream and sent only the others.
            skips = re.findall(rf"{re.escape(tag)}: skipped (\d+) rows", cluster.executor_logs())
            assert len(skips) == 1 and int(skips[0]) >= at_kill[tag], (tag, skips, at_kill)

        # Before the kill, both workers' executors read and wrote.
        copy_stages = log.scan_stages()
        assert copy_stages == log.write_stages()  # each task of the copy reads its rows and writes them
        assert len(spread(log, cluster, copy_stages)) == 2
