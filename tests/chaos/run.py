"""``make chaos``: seeded random fault schedules against a 3-server cluster under load, then the checker.

    python -m tests.chaos.run --seeds 5 --duration 30        # seeds 1..5
    python -m tests.chaos.run --seed 7 --duration 30         # replay seed 7
    python -m tests.chaos.run --seed 7 --fsync never --power-all   # measure what losing power everywhere costs
    python -m tests.chaos.run --seeds 10 --retry             # publishers resend unknown outcomes, with ids

For each seed: a fresh cluster (servers a, b, c, each behind its own NATS proxy and running on a
``FaultyFileIO`` with a movable clock), three 2-partition rf=3 streams, the ``LoadWorkload`` (windowed
PublishAsync with ack ALL on every partition, ack LEADER and NONE on some, concurrent committed-read
consumers) and ``random_schedule(seed, ...)`` of faults over ``--duration`` seconds: kill, pause, cut,
blackhole, delay, oneway (one server at a time), disk (failing file operations), power (kill, then cut the
files back to what was fsynced), clock (jumps of seconds to minutes), nats (the nats-server dies and comes
back) and two (two servers at once). Then every fault is undone (with ``--power-all``, after all three
servers lose power at once), the cluster must converge and acknowledge again, and the checker reads every
replica.

With ``--retry`` the publishers resend every message whose outcome is unknown, with its message id, until
it is acked or refused (``LoadSpec.retry``), and every partition must store each id once. The servers'
duplicate window (measured on their own clocks) is set to outlast the run and the schedule's clock jumps
both ways (``duplicate_window_s``), so any second copy is a violation; with the default 2 minutes, a clock
jump of more than that legitimately forgets ids.

stdout gets one JSON line per seed (its checker summary) and a final JSON summary; progress goes to stderr.
Exits 1 if any seed broke an invariant, printing how to replay it. Data and logs of failed seeds are kept.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from liftlog.api import api_pb2
from tests.integration.harness import NatsProcess

from .checker import Deposals, check
from .cluster import IDS, ChaosCluster
from .faults import Fault, FaultEvent, random_schedule
from .load import LoadSpec, LoadWorkload, Monitor

#: Acks the healed cluster must give before the check (it recovered).
RECOVERY_ACKS = 100
#: Seconds after the faults that a run may still resend: healing, the recovery acks (at most 60 s), the
#: workload's stop (stall time and 15 s), with room to spare.
AFTER_FAULTS_S = 300


def duplicate_window_s(schedule: list[FaultEvent], duration: float) -> int:
    """A duplicate window no retry of the run can outlast, whatever the servers' clocks say.

    A server ages an id by its own clock against the record's timestamp, which the (possibly another)
    server that wrote it took from its clock: a record written while one clock ran ``shift`` behind and
    judged while another runs ``shift`` ahead looks ``2 * shift`` older than it is."""
    shift = max((abs(e.shift_s) for e in schedule), default=0.0)
    return int(duration + 2 * shift + AFTER_FAULTS_S)


@dataclass(frozen=True)
class Step:
    at: float
    undo: bool
    event: FaultEvent

    def describe(self) -> str:
        what = self.event.describe()
        return f"end {what}" if self.undo else what


def steps_of(schedule: list[FaultEvent]) -> list[Step]:
    """Every fault's start and end, in time order (an end before a start at the same moment)."""
    steps = [Step(e.at, False, e) for e in schedule] + [Step(e.ends, True, e) for e in schedule]
    return sorted(steps, key=lambda s: (s.at, not s.undo))


@dataclass(frozen=True)
class Options:
    duration: float
    kinds: tuple[Fault, ...] = tuple(Fault)
    required: tuple[Fault, ...] = ()
    fsync: str = "always"
    power_all: bool = False
    spec: LoadSpec = field(default_factory=LoadSpec)


def run_seed(
    seed: int, opts: Options, nats: NatsProcess, root: Path, progress: Progress | None = None
) -> dict[str, Any]:
    """One seed, start to check; returns its figures (``ok`` False if an invariant broke)."""
    duration = opts.duration
    schedule = random_schedule(seed, IDS, duration, opts.kinds, required=opts.required)
    steps = steps_of(schedule)
    task = progress.add_task(f"seed {seed}", total=duration, status="starting") if progress else None

    def show(completed: float, status: str | None = None) -> None:
        if progress is not None and task is not None:
            fields: dict[str, Any] = {"status": status} if status else {}
            progress.update(task, completed=completed, **fields)

    result: dict[str, Any] = {"seed": seed, "fsync": opts.fsync, "faults": [str(e) for e in schedule]}
    extra = ["--set", f"streams.fsync.policy={opts.fsync}"]
    if opts.spec.retry:
        window = duplicate_window_s(schedule, duration)
        result["duplicate_window_s"] = window
        # No cap either: every id of the run stays known (a run stores far fewer than 10 M per partition).
        extra += ["--set", f"streams.duplicate.window={window}s", "--set", "streams.duplicate.max.ids=10000000"]
    cluster = ChaosCluster(root, nats, *extra)
    workload: LoadWorkload | None = None
    monitor: Monitor | None = None
    try:
        cluster.start()
        for stream in opts.spec.streams:
            cluster.create_stream(stream, partitions=opts.spec.partitions, rf=3)
        monitor = Monitor(cluster, list(opts.spec.streams)).start()
        workload = LoadWorkload(cluster, monitor, opts.spec, random.Random(seed)).start()
        started = time.monotonic()
        #: When each fault on a server began: it may end the server's leaderships (the ack-LEADER window).
        impaired: dict[str, list[float]] = {sid: [] for sid in IDS}
        for step in steps:
            while (now := time.monotonic() - started) < step.at:
                show(now)
                time.sleep(min(0.1, step.at - now))
            show(step.at, step.describe())
            (cluster.undo if step.undo else cluster.apply)(step.event)
            if not step.undo and step.event.action is not Fault.CLOCK:
                for sid in IDS if step.event.action is Fault.NATS else step.event.targets:
                    impaired.setdefault(sid, []).append(time.monotonic())
        while (now := time.monotonic() - started) < duration:
            show(now)
            time.sleep(0.1)
        loaded = time.monotonic() - started
        result["acks_per_s_under_faults"] = round(workload.acked_between(started) / max(loaded, 1e-9))
        if opts.power_all:
            show(duration, "power loss of every server")
            for sid in cluster.ids:
                cluster.power_off(sid)
        show(duration, "healing")
        cluster.heal_all()
        healed = time.monotonic()
        try:
            result["recovery_s"] = round(workload.wait_acked(RECOVERY_ACKS, after=healed, timeout=60), 2)
            result["recovered"] = True
        except AssertionError as exc:
            result["recovered"] = False
            result["error"] = str(exc)
            # Is it the cluster or the workload's own loop? A fresh call answers that.
            result["probe"] = probe(cluster, opts.spec.streams)
        show(duration, "checking")
        workload.stop()
        monitor.stop()
        tolerate = opts.power_all and opts.fsync != "always"
        report, _ = check(
            cluster,
            workload,
            deposals=Deposals(cluster.crashes, monitor.history, impaired),
            fenced_seen=monitor.fenced_seen,
            tolerate_loss=tolerate,
        )
        result.update(report.summary())
        result["invariants_ok"] = report.ok
        result["ok"] = report.ok and result["recovered"]
        result["injected"] = dict(cluster.injected)
        result["disk_failures_injected"] = cluster.disk_failures_injected()
        result["power_lost_bytes"] = cluster.power_lost_bytes
        result["power_lost_files"] = cluster.power_lost_files
        result["publish_calls"] = workload.calls
    except Exception:
        result["ok"] = False
        result["error"] = traceback.format_exc(limit=5)
    finally:
        if workload is not None:
            workload.stop()
        if monitor is not None:
            monitor.stop()
        cluster.close()
        if progress is not None and task is not None:
            progress.update(task, status="ok" if result.get("ok") else "FAILED", visible=not result.get("ok"))
    return result


def probe(cluster: ChaosCluster, streams: tuple[str, ...]) -> dict[str, str]:
    """Publish one ack-ALL message to each stream through a fresh call on any reachable server."""
    out: dict[str, str] = {}
    for stream in streams:
        out[stream] = "no server reachable"
        for sid in cluster.reachable():
            try:
                resp = cluster.api(sid).Publish(
                    api_pb2.PublishRequest(stream=stream, value=b"probe", ackPolicy=api_pb2.ALL), timeout=5
                )
            except grpc.RpcError as exc:
                out[stream] = f"{sid}: {exc.code().name}: {exc.details()}"
                continue
            out[stream] = f"{sid}: acked at {resp.ack.offset}"
            break
    return out


#: Figures summed over seeds in the final summary.
TOTALS = (
    "published",
    "acked",
    "unknown",
    "refused",
    "duplicates_of_unknown",
    "leader_acked_lost_allowed",
    "acked_lost_tolerated",
    "none_published",
    "none_stored",
    "retries",
    "duplicate_acks",
    "disk_failures_injected",
    "power_lost_bytes",
    *(name for name in ("acked_lost", "divergent", "offsets_backwards", "leader_acked_lost", "fenced_unreported")),
    "acked_misplaced",
    "duplicates_stored",
    "duplicate_acks_unexplained",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5, help="run seeds 1..N (default 5)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of faults per seed (default 30)")
    parser.add_argument("--seed", type=int, default=None, help="run only this seed (replay)")
    parser.add_argument(
        "--kinds", default=",".join(f.value for f in Fault), help="fault kinds, comma-separated (default: all)"
    )
    parser.add_argument(
        "--require", default="", help="fault kinds every schedule must include, comma-separated (e.g. disk,power)"
    )
    parser.add_argument(
        "--fsync", choices=("always", "interval", "never"), default="always", help="streams.fsync.policy"
    )
    parser.add_argument(
        "--power-all",
        action="store_true",
        help="after the schedule, every server loses power at once (with fsync other than always, lost acked "
        "messages are measured, not failed)",
    )
    parser.add_argument("--window", type=int, default=LoadSpec.window, help="PublishAsync window per publisher")
    parser.add_argument(
        "--retry",
        action="store_true",
        help="resend every message whose outcome is unknown, with its message id (Nats-Msg-Id), until acked",
    )
    parser.add_argument("--keep", action="store_true", help="keep every seed's data and logs, not only failed ones")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else list(range(1, args.seeds + 1))
    opts = Options(
        duration=args.duration,
        kinds=tuple(Fault(k.strip()) for k in args.kinds.split(",") if k.strip()),
        required=tuple(Fault(k.strip()) for k in args.require.split(",") if k.strip()),
        fsync=args.fsync,
        power_all=args.power_all,
        spec=LoadSpec(window=args.window, retry=args.retry),
    )

    console = Console(stderr=True)
    base = Path(tempfile.mkdtemp(prefix="liftlog-chaos-"))
    nats = NatsProcess(base / "nats.log")
    results: list[dict[str, Any]] = []
    began = time.monotonic()
    try:
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            console=console,
        ) as progress:
            for seed in seeds:
                root = base / f"seed-{seed}"
                root.mkdir()
                result = run_seed(seed, opts, nats, root, progress)
                results.append(result)
                print(json.dumps(result), flush=True)
                if result["ok"] and not args.keep:
                    shutil.rmtree(root, ignore_errors=True)
                elif not result["ok"]:
                    console.print(f"[red]seed {seed} failed[/red]: logs in {root}")
    finally:
        nats.stop()

    failed = [r["seed"] for r in results if not r["ok"]]
    elapsed = time.monotonic() - began
    total: dict[str, Any] = {
        "seeds": len(results),
        "failed_seeds": failed,
        "duration_s": args.duration,
        "fsync": args.fsync,
        "power_all": args.power_all,
        "retry": args.retry,
        "elapsed_s": round(elapsed, 1),
    }
    for key in TOTALS:
        total[key] = sum(int(r.get(key, 0)) for r in results)
    injected: dict[str, int] = {}
    for r in results:
        for kind, n in r.get("injected", {}).items():
            injected[kind] = injected.get(kind, 0) + n
    total["faults_injected"] = injected
    if results:
        total["acked_per_seed"] = round(total["acked"] / len(results))
        total["acked_projected_50_seeds"] = total["acked_per_seed"] * 50
    print(json.dumps({"summary": total}), flush=True)
    if failed:
        for seed in failed:
            extra = f" FSYNC={args.fsync}" if args.fsync != "always" else ""
            extra += " RETRY=1" if args.retry else ""
            replay = f"make chaos SEED={seed} DURATION={args.duration:g}{extra}"
            console.print(f"[red]invariant failed for seed {seed}[/red]; replay: {replay}")
        return 1
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    console.print(f"[green]{len(results)} seeds passed[/green]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
