"""Process faults (SIGSTOP, SIGCONT, SIGKILL) and seeded random fault schedules for chaos runs.

``random_schedule`` is a pure function of its arguments: the same seed (and the same servers, duration, kinds
and bounds) always gives the same schedule, on any machine and Python version, because it draws only from
``random.Random(seed).random()``, the one generator output Python promises to keep stable. A failing chaos run
is therefore replayed by re-running with the seed it printed.
"""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "Fault",
    "FaultEvent",
    "kill9",
    "pause",
    "paused",
    "process_state",
    "random_schedule",
    "resume",
]


def pause(proc: subprocess.Popen[Any]) -> None:
    """SIGSTOP: the process freezes with its sockets open, so peers see silence rather than a closed connection."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGSTOP)


def resume(proc: subprocess.Popen[Any]) -> None:
    """SIGCONT: the process carries on where it stopped, its timers suddenly far behind."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)


def kill9(proc: subprocess.Popen[Any], timeout: float = 10.0) -> int | None:
    """SIGKILL and reap: a crash with no chance to flush or say goodbye (works on a paused process too)."""
    if proc.poll() is None:
        proc.kill()
    return proc.wait(timeout)


@contextlib.contextmanager
def paused(proc: subprocess.Popen[Any]) -> Iterator[None]:
    """Pause for the ``with`` block and always resume, so a failing test never leaves a frozen process behind."""
    pause(proc)
    try:
        yield
    finally:
        resume(proc)


def process_state(pid: int) -> str:
    """The state letter from ``/proc/<pid>/stat`` (Linux): 'T' stopped, 'S' sleeping, 'R' running, 'Z' zombie."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name in parentheses may itself contain spaces or ')': the state follows the last ')'.
    return stat[stat.rindex(")") + 2]


class Fault(StrEnum):
    """What a schedule can do to a server. Process faults need its Popen, network faults its TcpProxy."""

    KILL = "kill"  # kill9, restart after ``duration``
    PAUSE = "pause"  # SIGSTOP, SIGCONT after ``duration``
    CUT = "cut"  # proxy.cut(), heal() after ``duration``
    BLACKHOLE = "blackhole"  # proxy.blackhole(), heal() after ``duration``
    DELAY = "delay"  # proxy.delay(latency), heal() after ``duration``


class FaultEvent(NamedTuple):
    """Apply ``action`` to server ``target`` at ``at`` seconds into the run and undo it ``duration`` later."""

    at: float
    action: Fault
    target: str
    duration: float
    #: Seconds of added latency for DELAY, 0 for everything else.
    latency: float = 0.0

    @property
    def ends(self) -> float:
        return self.at + self.duration


def random_schedule(
    seed: int,
    servers: Sequence[str],
    duration_s: float,
    kinds: Iterable[Fault | str] = tuple(Fault),
    *,
    mean_gap_s: float = 2.0,
    min_fault_s: float = 0.5,
    max_fault_s: float = 5.0,
    max_concurrent: int | None = None,
    latency_s: tuple[float, float] = (0.05, 0.5),
) -> list[FaultEvent]:
    """A deterministic fault schedule for ``duration_s`` seconds, sorted by start time. Same seed, same schedule.

    Faults start ``uniform(0, 2 * mean_gap_s)`` apart and last ``uniform(min_fault_s, max_fault_s)`` seconds,
    clipped so every fault is undone by ``duration_s`` (the run ends on a healed cluster, ready for final
    checks). A server has at most one fault at a time, and at most ``max_concurrent`` servers are faulted at
    once: by default a minority, ``(len(servers) - 1) // 2`` but at least 1, so a cluster that tolerates
    minority failures is expected to keep working throughout. Times are rounded to milliseconds so schedules
    print and compare cleanly.
    """
    targets = sorted(set(servers))
    faults = sorted({Fault(k) for k in kinds}, key=list(Fault).index)
    if not targets:
        raise ValueError("no servers to fault")
    if not faults:
        raise ValueError("no fault kinds")
    if mean_gap_s < 0 or not 0 < min_fault_s <= max_fault_s:
        raise ValueError("need mean_gap_s >= 0 and 0 < min_fault_s <= max_fault_s")
    limit = max(1, (len(targets) - 1) // 2) if max_concurrent is None else max_concurrent
    if limit < 1:
        raise ValueError("max_concurrent must be >= 1")

    rng = random.Random(seed)

    def uniform(lo: float, hi: float) -> float:
        return lo + (hi - lo) * rng.random()

    def pick(options: Sequence[Any]) -> Any:
        return options[min(int(rng.random() * len(options)), len(options) - 1)]

    events: list[FaultEvent] = []
    busy_until: dict[str, float] = {}
    t = 0.0
    while True:
        t = round(t + uniform(0.0, 2 * mean_gap_s), 3)
        ongoing = [target for target, end in busy_until.items() if end > t]
        if len(ongoing) >= limit:
            t = min(busy_until[target] for target in ongoing)  # wait for a fault to end
            continue
        if t + min_fault_s > duration_s:
            break
        target = pick([s for s in targets if s not in ongoing])
        action = pick(faults)
        length = round(min(uniform(min_fault_s, max_fault_s), duration_s - t), 3)
        latency = round(uniform(*latency_s), 3) if action is Fault.DELAY else 0.0
        events.append(FaultEvent(t, action, target, length, latency))
        busy_until[target] = t + length
    return events
