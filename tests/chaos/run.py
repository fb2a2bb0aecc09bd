"""``make chaos``: seeded random fault schedules against a 3-server cluster under load, then the checker.

    python -m tests.chaos.run --seeds 5 --duration 30        # seeds 1..5
    python -m tests.chaos.run --seed 7 --duration 30         # replay seed 7

For each seed: a fresh cluster (servers a, b, c, each behind its own NATS proxy), a 2-partition rf=3 stream,
the ``Workload`` (producers with ack ALL, a committed-read consumer), and ``random_schedule(seed, ...)`` of
kill/pause/cut/blackhole/delay faults over ``--duration`` seconds, never more than one server at a time. Then
every fault is undone, the cluster must acknowledge again, and the checker reads every replica.

stdout gets one JSON line per seed (its checker summary) and a final JSON summary; progress goes to stderr.
Exits 1 if any seed broke an invariant, printing how to replay it. Data and logs of failed seeds are kept.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from tests.integration.harness import NatsProcess

from .checker import Workload, check
from .cluster import IDS, ChaosCluster
from .faults import Fault, FaultEvent, random_schedule

STREAM = "chaos"
PARTITIONS = 2
#: Acks the healed cluster must give before the check (it recovered).
RECOVERY_ACKS = 20


@dataclass(frozen=True)
class Step:
    at: float
    undo: bool
    event: FaultEvent

    def describe(self) -> str:
        e = self.event
        what = f"{e.action.value} {e.target}" + (f" {e.latency:.3f}s" if e.action is Fault.DELAY else "")
        return f"end {what}" if self.undo else what


def steps_of(schedule: list[FaultEvent]) -> list[Step]:
    """Every fault's start and end, in time order (an end before a start at the same moment)."""
    steps = [Step(e.at, False, e) for e in schedule] + [Step(e.ends, True, e) for e in schedule]
    return sorted(steps, key=lambda s: (s.at, not s.undo))


def run_seed(
    seed: int, duration: float, nats: NatsProcess, root: Path, progress: Progress, kinds: list[Fault]
) -> dict[str, Any]:
    schedule = random_schedule(seed, IDS, duration, kinds)
    steps = steps_of(schedule)
    task = progress.add_task(f"seed {seed}", total=duration, status="starting")
    result: dict[str, Any] = {
        "seed": seed,
        "faults": [f"{e.at}s {e.action.value} {e.target} {e.duration}s" for e in schedule],
    }
    cluster = ChaosCluster(root, nats)
    workload: Workload | None = None
    try:
        cluster.start()
        cluster.create_stream(STREAM, partitions=PARTITIONS, rf=3)
        workload = Workload(cluster, STREAM, PARTITIONS).start()
        started = time.monotonic()
        for step in steps:
            while (now := time.monotonic() - started) < step.at:
                progress.update(task, completed=now)
                time.sleep(min(0.1, step.at - now))
            progress.update(task, completed=step.at, status=step.describe())
            (cluster.undo if step.undo else cluster.apply)(step.event)
        while (now := time.monotonic() - started) < duration:
            progress.update(task, completed=now)
            time.sleep(0.1)
        progress.update(task, completed=duration, status="healing")
        cluster.heal_all()
        healed = time.monotonic()
        try:
            result["recovery_s"] = round(workload.wait_acked(RECOVERY_ACKS, after=healed, timeout=60), 2)
            result["recovered"] = True
        except AssertionError as exc:
            result["recovered"] = False
            result["error"] = str(exc)
        progress.update(task, status="checking")
        workload.stop()
        report, _ = check(cluster, workload, PARTITIONS)
        result.update(report.summary())
        result["ok"] = report.ok and result["recovered"]
    except Exception:
        result["ok"] = False
        result["error"] = traceback.format_exc(limit=5)
    finally:
        if workload is not None:
            workload.stop()
        cluster.close()
        progress.update(task, status="ok" if result.get("ok") else "FAILED", visible=not result.get("ok"))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5, help="run seeds 1..N (default 5)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of faults per seed (default 30)")
    parser.add_argument("--seed", type=int, default=None, help="run only this seed (replay)")
    parser.add_argument(
        "--kinds", default=",".join(f.value for f in Fault), help="fault kinds, comma-separated (default: all)"
    )
    parser.add_argument("--keep", action="store_true", help="keep every seed's data and logs, not only failed ones")
    args = parser.parse_args(argv)
    seeds = [args.seed] if args.seed is not None else list(range(1, args.seeds + 1))
    kinds = [Fault(k.strip()) for k in args.kinds.split(",") if k.strip()]

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
                result = run_seed(seed, args.duration, nats, root, progress, kinds)
                results.append(result)
                print(json.dumps(result), flush=True)
                if result["ok"] and not args.keep:
                    shutil.rmtree(root, ignore_errors=True)
                elif not result["ok"]:
                    console.print(f"[red]seed {seed} failed[/red]: logs in {root}")
    finally:
        nats.stop()

    failed = [r["seed"] for r in results if not r["ok"]]
    total = {
        "seeds": len(results),
        "failed_seeds": failed,
        "duration_s": args.duration,
        "elapsed_s": round(time.monotonic() - began, 1),
    }
    for key in ("published", "acked", "unknown", "refused", "retried", "duplicates_of_unknown", "acked_lost"):
        total[key] = sum(int(r.get(key, 0)) for r in results)
    print(json.dumps({"summary": total}), flush=True)
    if failed:
        for seed in failed:
            replay = f"make chaos SEED={seed} DURATION={args.duration:g}"
            console.print(f"[red]invariant failed for seed {seed}[/red]; replay: {replay}")
        return 1
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    console.print(f"[green]{len(results)} seeds passed[/green]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
