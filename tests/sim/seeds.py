"""Running a simulation over many seeds: the pytest fixture's loop and the soak command, for both simulations."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

RunSeed = Callable[..., Counter[str]]


@dataclass
class Results:
    seeds: list[int]
    stats: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


def seeds_from_env(one: str, many: str, default: int) -> list[int]:
    """The seed in ``$one`` (a replay), else ``$many`` seeds (``default`` when unset) from 0."""
    replay = os.environ.get(one)
    if replay is not None:
        return [int(replay)]
    return list(range(int(os.environ.get(many, default))))


def run_seeds(seeds: list[int], run_seed: RunSeed, failure: type[AssertionError], replay: str) -> Results:
    """Every seed in turn; a failure keeps its message (with the events before it when replaying one)."""
    res = Results(seeds)
    trace = len(seeds) == 1
    for seed in seeds:
        try:
            res.stats += run_seed(seed, trace=trace)
        except failure as exc:
            res.failures.append(str(exc))
        except Exception:
            res.failures.append(f"seed {seed} raised:\n{traceback.format_exc()}replay: {replay.format(seed=seed)}")
    return res


def soak(argv: list[str] | None, what: str, run_seed: RunSeed, failure: type[AssertionError], replay: str) -> int:
    """The command-line soak: many seeds, each failure on stderr, a summary line; exits 1 on any failure."""
    parser = argparse.ArgumentParser(description=f"soak the {what} over many seeds")
    parser.add_argument("--seeds", type=int, default=1000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--trace", action="store_true", help="end failure messages with the last events")
    args = parser.parse_args(argv)
    total: Counter[str] = Counter()
    t0 = time.perf_counter()
    failures = 0
    for seed in range(args.start, args.start + args.seeds):
        try:
            total += run_seed(seed, trace=args.trace)
        except failure as exc:
            failures += 1
            print(exc, file=sys.stderr)
        except Exception as exc:
            failures += 1
            print(f"seed {seed} crashed: {exc!r}; replay: {replay.format(seed=seed)}", file=sys.stderr)
    elapsed = time.perf_counter() - t0
    print(f"{args.seeds} seeds, {failures} failures, {elapsed:.1f}s; {dict(sorted(total.items()))}")
    return 1 if failures else 0
