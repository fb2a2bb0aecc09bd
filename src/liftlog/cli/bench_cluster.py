"""``liftlog bench --start-cluster``: replication throughput and leader failover on a local cluster.

A throw-away cluster is a plain nats-server and ``--servers`` liftlog server
processes on free loopback ports, each with a temporary data directory, one
namespace and every server id as Raft bootstrap peer. The servers run with
default settings (LIFTLOG_* variables are not passed on; only ``--server-set``
overrides reach them), so the failover time is what a default deployment gets.

Scenarios, on one stream of one partition replicated to every server:

* ``single``: the ``async`` scenario (ack ALL) on a standalone server started
  first, before the cluster, for comparison;
* ``rf3-all`` and ``rf3-leader``: the ``async`` scenario with ack ALL and ack
  LEADER;
* ``failover``: a sequential ack-ALL publisher; halfway through, the partition
  leader's process is killed (SIGKILL) and the time until the first publish
  started after the kill is acknowledged is measured. It runs last: it leaves a
  server dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from liftlog.cli.bench_plot import Series
from liftlog.cli.bench_processes import (
    error_result,
    free_port,
    log_tail,
    run_all,
    scenario_errors,
    spawned_server,
    stop_processes,
)
from liftlog.cli.bench_scenarios import RUNNERS, Result, Settings
from liftlog.cli.common import CommandError

if TYPE_CHECKING:
    from liftlog.client import Client, Consumer

__all__ = [
    "CLUSTER_DEFAULT_COUNTS",
    "CLUSTER_SCENARIOS",
    "FAILOVER_GOAL_S",
    "THROUGHPUT_GOAL",
    "LocalCluster",
    "comparison",
    "order_scenarios",
    "run_cluster_bench",
    "server_ids",
    "spawned_cluster",
]

#: Messages per scenario by default (failover: acknowledged publishes, half before the kill, half after).
CLUSTER_DEFAULT_COUNTS = {
    "single": 20_000,
    "rf3-all": 20_000,
    "rf3-leader": 20_000,
    "failover": 2000,
    "group-failover": 1,
}
CLUSTER_SCENARIOS = tuple(CLUSTER_DEFAULT_COUNTS)
#: group-failover's servers, unless --server-set says else: cursors on (checkpoints), short group timeouts,
#: and a short replica lag time, so that the dead server leaves the ISRs (and commits resume) quickly and what
#: is timed is the group's recovery, not the partitions'.
GROUP_FAILOVER_SETTINGS = (
    "cursors.stream.partitions=1",
    "groups.consumer.timeout=6s",
    "groups.coordinator.timeout=3s",
    "clustering.replica.max.lag.time=2s",
)
#: Issue goals: ack ALL at >= half the single-node throughput; a new leader acks within 5 s.
THROUGHPUT_GOAL = 0.5
FAILOVER_GOAL_S = 5.0

#: The failover publisher: one Publish at a time, each attempt bounded by this deadline...
FAILOVER_ATTEMPT_TIMEOUT_S = 2.0
#: ... and, after a failed attempt, this pause before re-resolving the leader (FetchMetadata) and retrying.
FAILOVER_RETRY_PAUSE_S = 0.05
#: Failover fails when no publish is acknowledged this long after the kill.
FAILOVER_GIVE_UP_S = 60.0
FAILOVER_METHOD = (
    f"sequential Publish with ack ALL, {FAILOVER_ATTEMPT_TIMEOUT_S:g} s deadline per attempt; after a failed attempt "
    f"(not leader, unavailable, timeout) wait {FAILOVER_RETRY_PAUSE_S * 1000:.0f} ms, re-resolve the leader with "
    "FetchMetadata and retry the same message; failover_s runs from the SIGKILL of the leader to the ack of the "
    "first publish started after it"
)

_READY_TIMEOUT_S = 60.0


def server_ids(n: int) -> list[str]:
    """``s1`` .. ``sN``."""
    return [f"s{i}" for i in range(1, n + 1)]


def order_scenarios(chosen: list[str]) -> list[str]:
    """The run order: ``single`` first (its own server, before the cluster), ``failover`` last (it kills one)."""
    middle = [name for name in chosen if name not in ("single", "failover")]
    return [*(["single"] if "single" in chosen else []), *middle, *(["failover"] if "failover" in chosen else [])]


def comparison(results: dict[str, Any]) -> dict[str, Any]:
    """rf3-all against single, and the failover time, next to the issue's goals (what was measured)."""
    out: dict[str, Any] = {}
    single, rf3 = results.get("single", {}), results.get("rf3-all", {})
    if single.get("msgs_per_s") and rf3.get("msgs_per_s"):
        ratio = rf3["msgs_per_s"] / single["msgs_per_s"]
        out["rf3_all_vs_single"] = round(ratio, 3)
        out["rf3_all_vs_single_goal"] = THROUGHPUT_GOAL
        out["rf3_all_vs_single_met"] = ratio >= THROUGHPUT_GOAL
    failover_s = results.get("failover", {}).get("failover_s")
    if failover_s is not None:
        out["failover_s"] = failover_s
        out["failover_goal_s"] = FAILOVER_GOAL_S
        out["failover_met"] = failover_s < FAILOVER_GOAL_S
    return out


# -- the cluster ---------------------------------------------------------------


@dataclass
class _Node:
    id: str
    address: str
    log_path: Path
    proc: subprocess.Popen[bytes]


class LocalCluster:
    """The processes of a started cluster: ``addresses`` to connect to, :meth:`kill` to fail one."""

    def __init__(self, nats_url: str) -> None:
        self.nats_url = nats_url
        self.nodes: dict[str, _Node] = {}

    @property
    def addresses(self) -> list[str]:
        return [node.address for node in self.nodes.values()]

    def kill(self, server_id: str) -> None:
        """SIGKILL a server and reap it: no goodbye to its peers."""
        proc = self.nodes[server_id].proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()

    def check_running(self, *, but: str = "") -> None:
        for node in self.nodes.values():
            if node.id != but and node.proc.poll() is not None:
                raise CommandError(
                    f"benchmark server {node.id} exited with code {node.proc.returncode}: {log_tail(node.log_path)}"
                )


async def _wait_for_port(port: int, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 10
    while True:
        if proc.poll() is not None:
            raise CommandError(f"nats-server exited with code {proc.returncode}: {log_tail(log_path)}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise CommandError(f"nats-server did not listen on 127.0.0.1:{port} within 10 s: {log_tail(log_path)}")
        await asyncio.sleep(0.05)


async def _wait_formed(cluster: LocalCluster, status: Callable[[str], None]) -> None:
    """Until FetchMetadata on every server lists every server as a broker."""
    from liftlog.client import Client, LiftlogError

    want = set(cluster.nodes)
    deadline = time.monotonic() + _READY_TIMEOUT_S
    pending = dict(cluster.nodes)
    shown = ""
    while pending:
        cluster.check_running()
        for sid, node in list(pending.items()):
            with contextlib.suppress(LiftlogError):
                async with Client([node.address], timeout=1.0, retries=0) as probe:
                    md = await probe.fetch_metadata()
                if {b.id for b in md.brokers} == want:
                    del pending[sid]
        if not pending:
            return
        text = f"waiting for the cluster to form: {len(want) - len(pending)} of {len(want)} servers see all brokers"
        if text != shown:  # once per change: plain lines in a log
            status(text)
            shown = text
        if time.monotonic() > deadline:
            tails = "; ".join(f"{sid}: {log_tail(node.log_path, 2)}" for sid, node in pending.items())
            raise CommandError(f"the benchmark cluster did not form within {_READY_TIMEOUT_S:.0f} s ({tails})")
        await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def spawned_cluster(
    servers: int, status: Callable[[str], None], overrides: tuple[str, ...] = ()
) -> AsyncIterator[LocalCluster]:
    """A nats-server and ``servers`` liftlog servers on free loopback ports in a temporary directory.

    Everything is stopped and the directory removed on the way out, on errors and Ctrl-C too (the
    children run in sessions of their own, so a Ctrl-C reaches only this process, which stops them).
    """
    from liftlog.security.cluster_auth import generate_key_file
    from liftlog.server.nats.embedded_nats import find_nats_server_binary

    root = Path(tempfile.mkdtemp(prefix="liftlog-bench-cluster-"))
    procs: list[subprocess.Popen[bytes]] = []
    nats_proc: subprocess.Popen[bytes] | None = None
    try:
        nats_port = free_port()
        nats_log = root / "nats-server.log"
        with open(nats_log, "wb") as log:
            nats_proc = subprocess.Popen(
                [str(find_nats_server_binary()), "-a", "127.0.0.1", "-p", str(nats_port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        await _wait_for_port(nats_port, nats_proc, nats_log)
        cluster = LocalCluster(f"nats://127.0.0.1:{nats_port}")
        ids = server_ids(servers)
        namespace = f"liftlog-bench-{uuid.uuid4().hex[:8]}"
        # Signed server-to-server traffic, as a secure deployment runs: the figures include its cost.
        key_file = root / "cluster.key"
        generate_key_file(key_file)
        # Default settings: none of the developer's LIFTLOG_* variables reach the servers.
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIFTLOG_")}
        for sid in ids:
            port = free_port()
            command = [sys.executable, "-m", "liftlog.cli.main", "server", "--id", sid, "--host", "127.0.0.1"]
            command += ["--port", str(port), "--data-dir", str(root / sid), "--nats-servers", cluster.nats_url]
            command += ["--namespace", namespace, "--raft-bootstrap-peers", ",".join(ids), "--log-level", "warn"]
            # Before the overrides: --server-set clustering.auth.key.file= --server-set clustering.auth.insecure=true
            # measures without it.
            command += ["--set", f"clustering.auth.key.file={key_file}"]
            for setting in overrides:
                command += ["--set", setting]
            log_path = root / f"{sid}.log"
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            procs.append(proc)
            cluster.nodes[sid] = _Node(sid, f"127.0.0.1:{port}", log_path, proc)
        status(f"starting a cluster of {servers} servers")
        await _wait_formed(cluster, status)
        yield cluster
    finally:
        stop_processes(procs)
        if nats_proc is not None:
            stop_processes([nats_proc])
        shutil.rmtree(root, ignore_errors=True)


# -- scenarios -----------------------------------------------------------------


async def _replicated(client: Client, s: Settings, stream: str, subject: str, count: int, policy: str) -> Result:
    """The ``async`` scenario (publish_many, --window in flight) with ack `policy` on the replicated stream."""
    result = await RUNNERS["async"](client, replace(s, ack_policy=policy, partitions=1), stream, subject, count)
    result.notes.insert(0, f"ack {policy.upper()}")
    return result


async def _wait_full_isr(client: Client, stream: str, replicas: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        md = await client.fetch_metadata(stream)
        if len(md.streams[stream].partitions[0].isr) >= replicas:
            return
        if time.monotonic() > deadline:
            raise CommandError(f"the ISR of {stream} did not reach {replicas} replicas within 30 s")
        await asyncio.sleep(0.1)


def _failure_kind(exc: BaseException) -> str:
    from liftlog.client import DeadlineExceededError, NotLeaderError, UnavailableError

    if isinstance(exc, NotLeaderError):
        return "not_leader"
    if isinstance(exc, UnavailableError):
        return "unavailable"
    if isinstance(exc, DeadlineExceededError):
        return "timeout"
    return type(exc).__name__


async def _failover(
    cluster: LocalCluster,
    s: Settings,
    stream: str,
    count: int,
    replicas: int,
    status: Callable[[str], None],
    overrides: tuple[str, ...] = (),
) -> Result:
    from liftlog.client import AckPolicy, Client, LiftlogError, StartPosition, StopPosition

    # retries=0: every failed attempt comes back here, to be counted, instead of being retried inside the client.
    client = Client(cluster.addresses, timeout=FAILOVER_ATTEMPT_TIMEOUT_S, retries=0)
    async with client:
        await _wait_full_isr(client, stream, replicas)
        padding = os.urandom(max(0, s.size - 8))
        before = max(1, count // 2)
        latencies: list[int] = []
        done: list[int] = []
        marks: list[tuple[int, str]] = []
        failures: Counter[str] = Counter()
        before_kill: Counter[str] = Counter()
        killed = new_leader = ""
        killed_was_controller: bool | None = None
        kill_at = recovered_at = 0.0
        started, started_ns = time.perf_counter(), time.perf_counter_ns()
        seq = 0  # the next sequence number, carried in the values' first 8 bytes; 0 .. seq - 1 are acked
        while seq < count:
            if seq == before and not killed:
                md = await client.fetch_metadata(stream)
                killed = md.streams[stream].partitions[0].leader
                with contextlib.suppress(LiftlogError):
                    killed_was_controller = (await client.cluster_status()).controller == killed
                cluster.kill(killed)
                kill_at = time.perf_counter()
                marks.append((time.perf_counter_ns(), f"leader {killed} killed"))
                status(f"failover: killed leader {killed}, publishing until a new leader acks")
            value = struct.pack(">q", seq) + padding
            attempt_at = time.perf_counter()
            t0 = time.perf_counter_ns()
            try:
                await client.publish(stream, value, partition=0, ack_policy=AckPolicy.ALL)
            except LiftlogError as exc:
                if not killed:  # should not happen; counted apart from the failover's
                    before_kill[_failure_kind(exc)] += 1
                    if sum(before_kill.values()) > 100:
                        raise
                    continue
                failures[_failure_kind(exc)] += 1
                if time.perf_counter() - kill_at > FAILOVER_GIVE_UP_S:
                    raise CommandError(
                        f"no publish was acknowledged within {FAILOVER_GIVE_UP_S:.0f} s of killing leader {killed} "
                        f"(last error: {exc})"
                    ) from None
                cluster.check_running(but=killed)
                await asyncio.sleep(FAILOVER_RETRY_PAUSE_S)
                with contextlib.suppress(LiftlogError):
                    await client.fetch_metadata(stream)  # re-resolve the leader
                continue
            t1 = time.perf_counter_ns()
            latencies.append(t1 - t0)
            done.append(t1)
            seq += 1
            if killed and not recovered_at and attempt_at >= kill_at:
                recovered_at = time.perf_counter()
                marks.append((t1, "new leader acks"))
                with contextlib.suppress(LiftlogError):
                    md = await client.fetch_metadata(stream)
                    new_leader = md.streams[stream].partitions[0].leader
                status(f"failover: new leader {new_leader or '?'} after {recovered_at - kill_at:.2f} s")
        elapsed = time.perf_counter() - started

        # Every acknowledged message must still be there, read from the new leader.
        seen: set[int] = set()
        lost: int | None = None
        with contextlib.suppress(LiftlogError, TimeoutError):
            async with asyncio.timeout(30):
                sub = client.subscribe(
                    stream, partition=0, start_position=StartPosition.EARLIEST, stop_position=StopPosition.STOP_LATEST
                )
                async with sub:
                    async for msg in sub:
                        if len(msg.value) >= 8:
                            seen.add(struct.unpack_from(">q", msg.value)[0])
                lost = len(set(range(seq)) - seen)

    failover_s = round(recovered_at - kill_at, 3)
    failed = sum(failures.values())
    notes = [f"failover {failover_s:.2f} s", f"{failed} failed attempts", f"killed leader {killed}"]
    if killed_was_controller:
        notes.append("it was also the controller")
    if before_kill:
        notes.append(f"{sum(before_kill.values())} failed attempts before the kill")
    notes.append("server settings: " + (", ".join(overrides) if overrides else "defaults"))
    if lost is None:
        notes.append("could not read back")
    elif lost:
        notes.append(f"{lost} acked messages lost")
    extra: dict[str, Any] = {
        "failover_s": failover_s,
        "failed_publishes": failed,
        "failures": dict(failures),
        "killed": killed,
        "killed_was_controller": killed_was_controller,
        "new_leader": new_leader,
        "acked_lost": lost,
        "failures_before_kill": dict(before_kill),
        "server_settings": list(overrides) or "defaults",
        "method": FAILOVER_METHOD,
    }
    return Result(seq, elapsed, latencies, notes, extra, done, started_ns, marks)


# -- the run -------------------------------------------------------------------


async def _single(
    s: Settings, count: int, status: Callable[[str], None], series: dict[str, Series] | None = None
) -> dict[str, Any]:
    """The async scenario, ack ALL, on a standalone server of its own (its series, if asked, as "single")."""
    status("single: starting a standalone server")
    single = replace(s, ack_policy="all", partitions=1, counts={"async": count})
    drawn: dict[str, Series] = {}
    async with spawned_server() as (address, _url):
        result: dict[str, Any] = (await run_all([address], single, ["async"], status, series=drawn))["async"]
    if series is not None and "async" in drawn:
        drawn["async"].scenario = "single"
        series["single"] = drawn["async"]
    if "notes" in result:
        result["notes"] = f"standalone server, ack ALL; {result['notes']}"
    return result


async def _group_failover(
    servers: int, s: Settings, status: Callable[[str], None], overrides: tuple[str, ...]
) -> dict[str, Any]:
    """Kill the coordinator of a 2-member group under load, on a cluster of its own; time the recovery."""
    from liftlog.client import AckPolicy, Client, LiftlogError, StartPosition

    given = {o.partition("=")[0] for o in overrides}
    settings = (*overrides, *(g for g in GROUP_FAILOVER_SETTINGS if g.partition("=")[0] not in given))
    async with spawned_cluster(servers, status, settings) as cluster, Client(cluster.addresses, timeout=5) as client:
        stream = "bench-groups"
        await client.create_stream(stream, stream, partitions=2, replication_factor=servers)
        stop = asyncio.Event()
        padding = os.urandom(max(0, s.size - 8))

        async def publish() -> None:
            i = 0
            while not stop.is_set():
                value = struct.pack(">q", time.perf_counter_ns()) + padding
                with contextlib.suppress(LiftlogError):
                    await client.publish(stream, value, partition=i % 2, ack_policy=AckPolicy.ALL)
                i += 1
                await asyncio.sleep(0.002)

        newest: dict[str, int] = {}  # member -> publish time (ns) of the newest message it processed

        async def consume(member: Consumer) -> None:
            async for msg in member:
                newest[member.consumer_id] = max(
                    newest.get(member.consumer_id, 0), struct.unpack_from(">q", msg.value)[0]
                )

        publisher = asyncio.create_task(publish())
        members = [
            client.consumer(
                "bench", [stream], consumer_id=m, auto_checkpoint=1.0, start_position=StartPosition.EARLIEST
            )
            for m in ("m1", "m2")
        ]
        for member in members:
            await member.start()
        readers = [asyncio.create_task(consume(m)) for m in members]
        try:
            deadline = time.perf_counter() + 30
            while len(newest) < 2:
                if time.perf_counter() > deadline:
                    raise CommandError("group-failover: the two members did not both get messages within 30 s")
                await asyncio.sleep(0.1)
            killed = (await client.fetch_group_metadata("bench"))[0]
            status(f"group-failover: killing coordinator {killed}")
            cluster.kill(killed)
            kill_ns = time.perf_counter_ns()
            coordinator_s = resumed_s = None
            deadline = time.perf_counter() + 60
            while coordinator_s is None or resumed_s is None:
                if time.perf_counter() > deadline:
                    raise CommandError(f"group-failover: no recovery within 60 s of killing {killed}")
                now_s = (time.perf_counter_ns() - kill_ns) / 1e9
                if coordinator_s is None:
                    with contextlib.suppress(LiftlogError):
                        coordinator, _epoch = await client.fetch_group_metadata("bench")
                        if coordinator and coordinator != killed:
                            coordinator_s = now_s
                if resumed_s is None and all(newest.get(m.consumer_id, 0) > kill_ns for m in members):
                    resumed_s = now_s
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            for task in (publisher, *readers):
                task.cancel()
            await asyncio.gather(publisher, *readers, return_exceptions=True)
            for member in members:
                with contextlib.suppress(LiftlogError):
                    await member.close()
    notes = [f"new coordinator after {coordinator_s:.2f} s", f"both members processing again after {resumed_s:.2f} s"]
    notes.append("server settings: " + ", ".join(settings))
    extra = {"coordinator_failover_s": round(coordinator_s, 3), "resumed_s": round(resumed_s, 3), "killed": killed}
    return Result(1, resumed_s, None, notes, extra).to_json()


async def run_cluster_bench(
    servers: int,
    s: Settings,
    scenarios: list[str],
    status: Callable[[str], None],
    overrides: tuple[str, ...] = (),
    series: dict[str, Series] | None = None,
) -> dict[str, Any]:
    """Run `scenarios` (see :func:`order_scenarios` for the order); a failed scenario is an ``error`` entry.

    With `series`, what ``--plot`` draws of each scenario goes there by name (group-failover has none).
    """
    from liftlog.client import Client

    errors = scenario_errors()
    results: dict[str, Any] = {}
    ordered = order_scenarios(scenarios)
    if "single" in ordered:
        try:
            results["single"] = await _single(s, s.counts["single"], status, series)
        except errors as exc:
            results["single"] = error_result(exc)
        ordered.remove("single")
    if "group-failover" in ordered:
        try:
            results["group-failover"] = await _group_failover(servers, s, status, overrides)
        except errors as exc:
            results["group-failover"] = error_result(exc)
        ordered.remove("group-failover")
    if not ordered:
        return results
    run_id = uuid.uuid4().hex[:8]
    async with spawned_cluster(servers, status, overrides) as cluster, Client(cluster.addresses) as client:
        for scenario in ordered:
            count = s.counts[scenario]
            name, subject = f"bench-{run_id}-{scenario}", f"bench.{run_id}.{scenario}"
            status(f"{scenario}: {count:,} messages of {s.size} bytes, replication factor {servers}")
            limit = (60 + FAILOVER_GIVE_UP_S + count / 50) if scenario == "failover" else 30 + count / 500
            try:
                async with asyncio.timeout(limit):
                    await client.create_stream(subject, name, partitions=1, replication_factor=servers)
                    if scenario == "failover":
                        result = await _failover(cluster, s, name, count, servers, status, overrides)
                    else:
                        policy = "all" if scenario.endswith("-all") else "leader"
                        result = await _replicated(client, s, name, subject, count, policy)
                    results[scenario] = result.to_json()
                    if series is not None and (drawn := Series.of(scenario, result)) is not None:
                        series[scenario] = drawn
            except errors as exc:  # (TimeoutError is an OSError; the client's timeouts are LiftlogErrors)
                results[scenario] = error_result(exc, limit)
            finally:
                if scenario != "failover":  # the cluster is torn down next anyway
                    with contextlib.suppress(*errors):
                        await asyncio.wait_for(client.delete_stream(name), 10)
    return results
