"""A Spark standalone cluster on loopback for tests: a master and workers as JVMs of their own, and spark-submit.

The classes come from the pyspark package (its ``jars`` folder is a Spark
distribution's). The master and workers are started with ``java`` directly,
not with Spark's ``sbin`` scripts, which need ``ps`` and daemonize. Each
process gets a session of its own; executors share their worker's process
group, but PySpark's Python daemon makes a group of its own, so
:meth:`StandaloneCluster.stop` also kills whatever still runs in the
cluster's folder (every process works there: the driver, and the executors
in their folders under their worker's).

Applications write Spark event logs (JSON lines) to ``<root>/events``:
:class:`EventLog` tells which executor, on which worker, ran which tasks.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urlparse

from tests.integration.harness import free_port

#: The pyspark package is a Spark distribution: jars/, bin/spark-submit (found without importing pyspark).
SPARK_HOME = Path(str(importlib.util.find_spec("pyspark").origin)).parent  # type: ignore[union-attr]
#: What Spark's launch scripts export; a worker builds its executors' command line with it (without it:
#: "Cannot find any build directories").
SCALA_VERSION = (
    next(SPARK_HOME.glob("jars/spark-core_*.jar"), Path("spark-core_2.13-")).name.split("_")[1].split("-")[0]
)
#: Ask 127.0.0.1 directly, whatever proxy the environment names.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


def get_json(url: str, timeout: float = 2.0) -> Any:
    with _OPENER.open(url, timeout=timeout) as response:
        return json.load(response)


def tail(path: Path, chars: int = 3000) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return f"({path} missing)"
    return text[-chars:]


@dataclass
class _Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


def _spawn(name: str, command: list[str], log: Path, env: dict[str, str]) -> _Daemon:
    with open(log, "ab") as out:
        # A session of its own: the whole group (a worker and its executors, spark-submit and its Python)
        # can be killed at once, and nothing of it gets the terminal's signals. Working in the cluster's folder:
        # what escapes the group (PySpark's daemons) is found there, and nothing is left in the caller's.
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=log.parent,
            start_new_session=True,
        )
    return _Daemon(name, proc, log)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def _processes_under(root: Path) -> Iterator[int]:
    """Processes (not this one) whose working directory or command line lies under ``root``."""
    root_text = str(root)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cwd == root_text or cwd.startswith(root_text + "/") or root_text + "/" in cmdline:
            yield int(entry.name)


@dataclass(frozen=True, slots=True)
class Executor:
    pid: int
    app_id: str
    executor_id: str
    #: Index of the worker that launched it (its work folder).
    worker: int


class Submission:
    """A running ``spark-submit`` (client mode: the driver runs in it)."""

    def __init__(self, daemon: _Daemon, events: Path, earlier_logs: set[Path]) -> None:
        self._daemon = daemon
        self.log = daemon.log
        self._events = events
        self._earlier = earlier_logs

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self._daemon.proc

    def wait(self, timeout: float) -> int:
        """Its exit status; kills it (and fails, with its log) if it runs longer than ``timeout``."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc)
            raise AssertionError(f"spark-submit ran over {timeout:.0f}s:\n{tail(self.log)}") from None

    def output(self) -> str:
        return tail(self.log, 6000)

    def event_log(self) -> EventLog:
        """The event log of its application (the one file that appeared in the folder since it was submitted)."""
        new = [p for p in self._events.iterdir() if p not in self._earlier]
        assert len(new) == 1, f"expected one new event log in {self._events}, found {new}"
        return EventLog(new[0])


class StandaloneCluster:
    """A master and ``workers`` workers of ``cores`` cores and ``memory`` each, all on 127.0.0.1, under ``root``."""

    def __init__(self, root: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.root = root
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.events = root / "events"
        self.master_url = ""
        self.webui = ""
        self._master: _Daemon | None = None
        self._workers: list[_Daemon] = []
        self._submissions: list[Submission] = []

    def env(self) -> dict[str, str]:
        # No SPARK_*/PYSPARK_* settings of the caller's: this cluster's own only.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env |= {"SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOCAL_HOSTNAME": "localhost"}
        env["SPARK_SCALA_VERSION"] = SCALA_VERSION
        env |= {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        return env

    def _java(self, main_class: str, *args: str) -> list[str]:
        return [
            java(),
            "-Xmx256m",
            # A taken port fails the start (we retry with others) instead of moving to the next one unseen.
            "-Dspark.port.maxRetries=0",
            # Its REST submission server would listen on a fixed port (6066).
            "-Dspark.master.rest.enabled=false",
            # Keep finished applications' folders: their executors' logs tell what went wrong.
            "-Dspark.worker.cleanup.enabled=false",
            "-cp",
            f"{SPARK_HOME}/jars/*",
            main_class,
            *args,
        ]

    def start(self, timeout: float = 60.0) -> Self:
        self.root.mkdir(parents=True, exist_ok=True)
        self.events.mkdir(exist_ok=True)
        for attempt in range(3):
            if self._start_master(attempt, timeout):
                break
        else:
            raise RuntimeError(f"the Spark master did not start in 3 tries:\n{self.diagnostics()}")
        for i in range(self.workers):
            work = self.root / f"worker-{i}"
            work.mkdir(exist_ok=True)
            args = ["--host", "127.0.0.1", "--port", "0", "--webui-port", "0", "--work-dir", str(work)]
            args += ["--cores", str(self.cores), "--memory", self.memory, self.master_url]
            log = self.root / f"worker-{i}.log"
            self._workers.append(
                _spawn(f"worker-{i}", self._java("org.apache.spark.deploy.worker.Worker", *args), log, self.env())
            )
        self.wait_for(lambda: len(self.alive_workers()) == self.workers, timeout, f"{self.workers} workers registered")
        return self

    def _start_master(self, attempt: int, timeout: float) -> bool:
        port, webui = free_port(), free_port()
        args = ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(webui)]
        log = self.root / f"master-{attempt}.log"
        daemon = _spawn("master", self._java("org.apache.spark.deploy.master.Master", *args), log, self.env())
        self._master = daemon
        self.master_url = f"spark://127.0.0.1:{port}"
        self.webui = f"http://127.0.0.1:{webui}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if daemon.proc.poll() is not None:
                return False  # most likely a port taken since free_port() found it
            try:
                if self.master_json().get("status") == "ALIVE":
                    return True
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"the Spark master did not answer within {timeout}s:\n{self.diagnostics()}")

    def master_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = get_json(f"{self.webui}/json/")
        return doc

    def alive_workers(self) -> list[dict[str, Any]]:
        try:
            return [w for w in self.master_json().get("workers", []) if w.get("state") == "ALIVE"]
        except OSError:
            return []

    def wait_for(self, check: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            for d in [self._master, *self._workers]:
                if d is not None and d.proc.poll() is not None:
                    raise RuntimeError(f"{d.name} exited with {d.proc.returncode}:\n{self.diagnostics()}")
            time.sleep(0.2)
        raise TimeoutError(f"{what}: not within {timeout}s\n{self.diagnostics()}")

    def submit(
        self, script: Path | str, *args: str, conf: dict[str, str] | None = None, name: str = "app"
    ) -> Submission:
        """``spark-submit --master <this cluster> script args`` in the background; drivers and executors use this
        interpreter (so liftlog imports there), loopback only, an event log in ``events``."""
        settings = {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.executor.cores": "1",
            "spark.executor.memory": "512m",
            "spark.driver.memory": "1g",
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": f"file://{self.events}",
            # One plain JSON file per application, readable as it grows.
            "spark.eventLog.rolling.enabled": "false",
            "spark.eventLog.compress": "false",
        }
        settings |= conf or {}
        command = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", self.master_url, "--name", name]
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        command += [str(script), *args]
        log = self.root / f"submit-{name}-{len(self._submissions)}.log"
        earlier = set(self.events.iterdir())
        submission = Submission(_spawn(f"spark-submit {name}", command, log, self.env()), self.events, earlier)
        self._submissions.append(submission)
        return submission

    def executors(self) -> list[Executor]:
        """The executor JVMs running now."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if _EXECUTOR_CLASS not in args or not cwd.startswith(str(self.root) + "/"):
                continue
            opts = dict(itertools.pairwise(args))
            worker = Path(cwd).relative_to(self.root).parts[0].removeprefix("worker-")
            found.append(Executor(int(entry.name), opts["--app-id"], opts["--executor-id"], int(worker)))
        return found

    def executor_logs(self) -> str:
        """Every executor's stderr (Spark's log and what its Python workers printed), of every application."""
        return "".join(log.read_text(errors="replace") for log in sorted(self.root.glob("worker-*/*/*/stderr")))

    def diagnostics(self) -> str:
        """The ends of every log: master, workers, spark-submits and executors' stderr."""
        parts = []
        logs = sorted(self.root.glob("*.log")) + sorted(self.root.glob("worker-*/*/*/stderr"))
        for log in logs:
            parts.append(f"--- {log.relative_to(self.root)} ---\n{tail(log, 2500)}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Kill everything the cluster started, in the order that lets nothing start anew."""
        for submission in self._submissions:
            _kill_group(submission.proc)
        for daemon in [self._master, *self._workers]:
            if daemon is not None:
                _kill_group(daemon.proc)
        for _ in range(3):
            left = list(_processes_under(self.root))
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)


@dataclass(frozen=True, slots=True)
class Task:
    """One task attempt as its TaskEnd event tells it."""

    stage: int
    #: The partition it computed (TaskContext.partitionId() in it).
    index: int
    attempt: int
    executor: str
    #: "Success", "ExecutorLostFailure", "ExceptionFailure", ...
    reason: str


class EventLog:
    """One application's Spark event log (a JSON object per line)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("Event", "").rsplit(".", 1)[-1] == f"SparkListener{kind}"]

    def executor_workers(self) -> dict[str, str]:
        """Executor id -> the web UI address of the worker that launched it (from its log links)."""
        out = {}
        for event in self.of("ExecutorAdded"):
            link = urlparse(event["Executor Info"]["Log Urls"]["stderr"])
            assert parse_qs(link.query)["executorId"] == [event["Executor ID"]], link
            out[event["Executor ID"]] = f"{link.scheme}://{link.netloc}"
        return out

    def tasks(self) -> list[Task]:
        return [
            Task(
                e["Stage ID"],
                e["Task Info"]["Index"],
                e["Task Info"]["Attempt"],
                e["Task Info"]["Executor ID"],
                e["Task End Reason"]["Reason"],
            )
            for e in self.of("TaskEnd")
        ]

    def job_properties(self) -> dict[int, dict[str, str]]:
        """Stage id -> the local properties of its job (SQL execution id, streaming query and batch id)."""
        out = {}
        for event in self.of("JobStart"):
            for stage in event["Stage IDs"]:
                out[stage] = event.get("Properties", {})
        return out

    def scan_stages(self) -> set[int]:
        """Stages that read a data source in a streaming query (the liftlog source's read tasks)."""
        return {
            e["Stage Info"]["Stage ID"]
            for e in self.of("StageSubmitted")
            if any(
                rdd["Name"] == "DataSourceRDD" and '"MicroBatchScan"' in rdd.get("Scope", "")
                for rdd in e["Stage Info"]["RDD Info"]
            )
        }

    def write_stages(self) -> set[int]:
        """Stages of the SQL executions that write to a data source (batch AppendData or a streaming write)."""
        writes = {
            str(e["executionId"])
            for e in self.of("SQLExecutionStart")
            if e["physicalPlanDescription"].split("\n")[1].startswith(("AppendData", "WriteToDataSourceV2"))
        }
        return {
            stage for stage, props in self.job_properties().items() if props.get("spark.sql.execution.id") in writes
        }
