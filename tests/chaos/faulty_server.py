"""A real liftlog server on a failing disk and a movable clock, both steered from outside through a control file.

    python tests/chaos/faulty_server.py --control CONTROL --journal JOURNAL <liftlog server options>

The server is the production ``Server``, built here with a ``FaultyFileIO`` (its partition logs' file
operations) and a wall clock with an adjustable offset; nothing in ``src/`` knows it is being tested. A
background task reads ``CONTROL`` every ``POLL_S`` seconds when it changed (JSON, see ``Control``)::

    {"rates": {"write": 0.05, "fsync": 0.05}, "errors": ["EIO", "ENOSPC"], "clock_offset_ms": -90000}
    {"clear": true}                       # no disk faults, clock offset 0

and writes ``CONTROL.status`` (JSON: calls per operation, failures injected, the offset in force) after every
change and every second, so the harness can count the faults it caused. ``JOURNAL`` gets the fsynced length
of every file (``FaultyFileIO(journal=...)``): after a SIGKILL, ``power_loss_from_journal(JOURNAL)`` cuts
the data files back to what a machine that lost power would still have.

Run as a script (not ``-m``) so it works whatever the current directory; the options after ours are exactly
``liftlog server``'s, parsed by the same code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Control", "read_status", "write_control"]

#: Seconds between looks at the control file.
POLL_S = 0.1
#: Errors a control file may name.
ERRNOS = {"EIO": errno.EIO, "ENOSPC": errno.ENOSPC, "EMFILE": errno.EMFILE}

log = logging.getLogger("liftlog.faulty")


@dataclass
class Control:
    """What the harness wants: per-operation failure rates, the errors to pick from, the clock offset."""

    rates: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=lambda: ["EIO"])
    clock_offset_ms: int = 0

    def to_json(self) -> str:
        return json.dumps({"rates": self.rates, "errors": self.errors, "clock_offset_ms": self.clock_offset_ms})

    @classmethod
    def parse(cls, text: str) -> Control:
        raw = json.loads(text)
        if raw.get("clear"):
            return cls()
        errors = [str(e) for e in raw.get("errors", ["EIO"])]
        unknown = [e for e in errors if e not in ERRNOS]
        if unknown:
            raise ValueError(f"unknown errors {unknown}; one of {sorted(ERRNOS)}")
        rates = {str(k): float(v) for k, v in raw.get("rates", {}).items()}
        return cls(rates, errors, int(raw.get("clock_offset_ms", 0)))


def write_control(path: Path, control: Control) -> None:
    """Replace the control file atomically, so the server never reads half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(control.to_json())
    os.replace(tmp, path)


def read_status(path: Path) -> dict[str, Any]:
    """The wrapper's last status ({} before it wrote one)."""
    try:
        return dict(json.loads(Path(str(path) + ".status").read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


class OffsetClock:
    """``time.time_ns()`` plus an offset the control file sets (jumps both ways, as NTP steps do)."""

    def __init__(self) -> None:
        self.offset_ns = 0

    def __call__(self) -> int:
        return time.time_ns() + self.offset_ns


async def _follow(control_path: Path, file_io: Any, clock: OffsetClock) -> None:
    """Apply the control file whenever it changes; write the status now and then."""
    seen: tuple[int, int] | None = None
    last_status = 0.0
    injected_before = 0
    status_path = Path(str(control_path) + ".status")
    while True:
        try:
            st = control_path.stat()
            stamp = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        changed = stamp is not None and stamp != seen
        if changed:
            seen = stamp
            try:
                control = Control.parse(control_path.read_text())
            except (ValueError, OSError) as exc:
                log.error("bad control file %s: %s", control_path, exc)
            else:
                file_io.rates = dict(control.rates)
                file_io.errors = tuple(ERRNOS[e] for e in control.errors) or (errno.EIO,)
                if control.clock_offset_ms * 1_000_000 != clock.offset_ns:
                    log.warning("clock offset now %+d ms", control.clock_offset_ms)
                clock.offset_ns = control.clock_offset_ms * 1_000_000
                log.warning("fault control: rates %s errors %s", control.rates or "none", control.errors)
        now = time.monotonic()
        if changed or now - last_status >= 1.0 or len(file_io.injected) != injected_before:
            injected_before = len(file_io.injected)
            last_status = now
            status = {
                "calls": dict(file_io.calls),
                "injected": len(file_io.injected),
                "injected_last": file_io.injected[-5:],
                "rates": file_io.rates,
                "clock_offset_ms": clock.offset_ns // 1_000_000,
            }
            tmp = status_path.with_name(status_path.name + ".tmp")
            tmp.write_text(json.dumps(status))
            os.replace(tmp, status_path)
        await asyncio.sleep(POLL_S)


async def serve(config: Any, control_path: Path, journal: Path) -> int:
    """``liftlog.server.runner.serve`` on a server with our FileIO and clock, plus the control-file task."""
    from liftlog.server import runner
    from liftlog.server.clock import Clock
    from liftlog.server.server import Server
    from liftlog.storage.faults import FaultyFileIO

    log.warning("faulty server starting (control %s)", control_path)  # the checker's mark of a new life
    file_io = FaultyFileIO(seed=os.getpid(), journal=journal)
    clock = OffsetClock()
    follower = asyncio.ensure_future(_follow(control_path, file_io, clock))
    try:
        return await runner.serve(config, Server(config, clock=Clock(wall_ns=clock), file_io=file_io))
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--control", required=True, type=Path, help="the control file (JSON) to follow")
    parser.add_argument("--journal", required=True, type=Path, help="where the FaultyFileIO journals fsyncs")
    ours, rest = parser.parse_known_args(argv)

    import importlib

    import click

    from liftlog.server import runner
    from liftlog.server.errors import ServerStartError
    from liftlog.server.ops.logformat import setup_logging

    cli = importlib.import_module("liftlog.cli.main")

    # ``liftlog server`` parses the options and loads the config exactly as in production, then calls
    # ``runner.run_server(config)``; we only take the config it built and run our own serve() on it.
    captured: dict[str, Any] = {}

    def capture(config: Any) -> int:
        captured["config"] = config
        return 0

    original = runner.run_server
    runner.run_server = capture
    try:
        cli.server.main(args=rest, prog_name="faulty_server", standalone_mode=False)
    except click.exceptions.Exit:
        pass
    finally:
        runner.run_server = original
    config = captured.get("config")
    if config is None:
        return 2
    setup_logging(config.log_level, config.values["logging.format"])
    try:
        with asyncio.Runner(loop_factory=runner._new_event_loop) as loop_runner:
            return loop_runner.run(serve(config, ours.control, ours.journal))
    except ServerStartError as exc:  # the one line LiftlogProcess looks for (e.g. its port was taken)
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
