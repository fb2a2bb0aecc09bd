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
    """What a schedule can do. Process faults need the server's Popen, network faults its TcpProxy."""

    KILL = "kill"  # kill9, restart after ``duration``
    PAUSE = "pause"  # SIGSTOP, SIGCONT after ``duration``
    CUT = "cut"  # proxy.cut(), heal() after ``duration``
    BLACKHOLE = "blackhole"  # proxy.blackhole(), heal() after ``duration``
    DELAY = "delay"  # proxy.delay(latency), heal() after ``duration``
    DISK = "disk"  # the server's FaultyFileIO fails ``rate`` of ``profile``'s calls, cleared after ``duration``
    POWER = "power"  # kill9, cut its files back to what was fsynced, restart after ``duration``
    CLOCK = "clock"  # the server's wall clock jumps ``shift_s`` seconds, back after ``duration``
    NATS = "nats"  # kill the nats-server, start it again on the same port after ``duration`` (target "nats")
    ONEWAY = "oneway"  # proxy.oneway(direction): one direction of the server's NATS link loses every byte
    TWO = "two"  # ``kind`` (a process or network fault) on ``target`` and ``second`` at once


#: The kinds a ``two`` fault picks from: the process and network faults.
PAIRABLE = (Fault.KILL, Fault.PAUSE, Fault.CUT, Fault.BLACKHOLE, Fault.DELAY, Fault.ONEWAY)
#: Faults no other fault overlaps: the cluster has no healthy majority (two) or no NATS at all (nats).
EXCLUSIVE = (Fault.NATS, Fault.TWO)
#: Disk fault profiles: which FaultyFileIO operations fail.
DISK_PROFILES: dict[str, tuple[str, ...]] = {
    "write": ("write",),
    "fsync": ("fsync",),
    "open": ("open",),
    "mixed": ("open", "write", "fsync", "ftruncate", "replace", "pread"),
}
DISK_ERRORS = ("EIO", "ENOSPC", "EMFILE")


class FaultEvent(NamedTuple):
    """Apply ``action`` to server ``target`` at ``at`` seconds into the run and undo it ``duration`` later."""

    at: float
    action: Fault
    target: str
    duration: float
    #: Seconds of added latency for DELAY (and a delaying TWO), 0 for everything else.
    latency: float = 0.0
    #: TWO: the sub-fault; DISK: "<profile>:<errno>"; ONEWAY (or a one-way TWO): "up" or "down".
    kind: str = ""
    #: TWO: the other server.
    second: str = ""
    #: CLOCK: how far the clock jumps (negative: back).
    shift_s: float = 0.0
    #: DISK: the share of the profile's calls that fail.
    rate: float = 0.0

    @property
    def ends(self) -> float:
        return self.at + self.duration

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.target, self.second) if self.second else (self.target,)

    def describe(self) -> str:
        """One short line: what, where, with which parameters."""
        what = f"{self.action.value} {'+'.join(self.targets)}"
        if self.action is Fault.TWO:
            what += f" {self.kind}"
        if self.action is Fault.DISK:
            what += f" {self.kind}@{self.rate:.2f}"
        if self.action is Fault.ONEWAY or (self.action is Fault.TWO and self.kind == Fault.ONEWAY):
            what += f" {self.direction}"
        if self.latency:
            what += f" {self.latency:.3f}s"
        if self.shift_s:
            what += f" {self.shift_s:+.0f}s"
        return what

    @property
    def direction(self) -> str:
        return self.kind.rpartition(":")[2] if ":" in self.kind else self.kind

    def __str__(self) -> str:
        return f"{self.at}s {self.describe()} for {self.duration}s"


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
    clock_shift_s: tuple[float, float] = (5.0, 300.0),
    disk_rate: tuple[float, float] = (0.02, 0.3),
    required: Iterable[Fault | str] = (),
) -> list[FaultEvent]:
    """A deterministic fault schedule for ``duration_s`` seconds, sorted by start time. Same seed, same schedule.

    Faults start ``uniform(0, 2 * mean_gap_s)`` apart and last ``uniform(min_fault_s, max_fault_s)`` seconds,
    clipped so every fault is undone by ``duration_s`` (the run ends on a healed cluster, ready for final
    checks). A server has at most one fault at a time, and at most ``max_concurrent`` servers are faulted at
    once: by default a minority, ``(len(servers) - 1) // 2`` but at least 1, so a cluster that tolerates
    minority failures is expected to keep working, except during the EXCLUSIVE faults (``two``, ``nats``),
    which start only when nothing else is faulted and overlap nothing. ``required`` kinds not drawn by the
    seed replace the last faults drawn (one each), so a short run is sure to include them. Times are rounded
    to milliseconds so schedules print and compare cleanly.
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

    def draw(t: float, action: Fault, free: list[str]) -> FaultEvent:
        target = pick(free)
        length = round(min(uniform(min_fault_s, max_fault_s), duration_s - t), 3)
        kind, second, latency, shift, rate = "", "", 0.0, 0.0, 0.0
        if action is Fault.TWO:
            kind = pick(PAIRABLE).value
            second = pick([s for s in free if s != target])
        if action is Fault.DISK:
            kind = f"{pick(sorted(DISK_PROFILES))}:{pick(DISK_ERRORS)}"
            rate = round(uniform(*disk_rate), 3)
        if action is Fault.ONEWAY or kind == Fault.ONEWAY:
            kind = f"{kind}:{pick(('up', 'down'))}" if kind else pick(("up", "down"))
        if action is Fault.DELAY or kind == Fault.DELAY:
            latency = round(uniform(*latency_s), 3)
        if action is Fault.CLOCK:
            shift = round(uniform(*clock_shift_s), 1) * (1 if rng.random() < 0.5 else -1)
        if action is Fault.NATS:
            target = "nats"
        return FaultEvent(t, action, target, length, latency, kind, second, shift, rate)

    events: list[FaultEvent] = []
    busy_until: dict[str, float] = {}
    exclusive_until = 0.0
    t = 0.0
    while True:
        t = round(t + uniform(0.0, 2 * mean_gap_s), 3)
        t = round(max(t, exclusive_until), 3)
        ongoing = [target for target, end in busy_until.items() if end > t]
        if len(ongoing) >= limit:
            t = min(busy_until[target] for target in ongoing)  # wait for a fault to end
            continue
        if t + min_fault_s > duration_s:
            break
        action = pick(faults)
        if action in EXCLUSIVE and ongoing:
            t = max(busy_until[target] for target in ongoing)  # wait until nothing is faulted
            if t + min_fault_s > duration_s:
                break
            ongoing = []
        if action is Fault.TWO and len(targets) < 2:
            continue
        event = draw(t, action, [s for s in targets if s not in ongoing])
        events.append(event)
        for target in event.targets if event.action is not Fault.NATS else targets:
            busy_until[target] = event.ends
        if action in EXCLUSIVE:
            exclusive_until = event.ends
    return _require(events, [Fault(k) for k in required], draw, targets)


def _require(events: list[FaultEvent], required: list[Fault], draw: Any, targets: list[str]) -> list[FaultEvent]:
    """Replace the last events by the required kinds the schedule lacks (same times, any server)."""
    missing = [k for k in dict.fromkeys(required) if all(e.action is not k for e in events)]
    out = list(events)
    spare = [i for i in range(len(out) - 1, -1, -1) if out[i].action not in required]
    for index, kind in zip(spare, missing, strict=False):
        old = out[index]
        free = list(targets) if kind in EXCLUSIVE else [old.target if old.target in targets else targets[0]]
        if kind is Fault.TWO and len(free) < 2:
            continue
        if kind in EXCLUSIVE and any(e.ends > old.at and e.at < old.ends for e in out if e is not old):
            continue  # it would overlap another fault
        replacement = draw(old.at, kind, free)
        out[index] = replacement._replace(duration=old.duration)
    return out
