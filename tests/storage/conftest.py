from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from liftlog.storage import CommitLog, LogConfig


class FakeClock:
    """Wall clock in nanoseconds that only moves when a test says so."""

    def __init__(self, start_ns: int = 1_700_000_000_000_000_000) -> None:
        self.now = start_ns

    def __call__(self) -> int:
        return self.now

    def advance_ms(self, ms: int) -> None:
        self.now += ms * 1_000_000


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def open_log(tmp_path: Path, clock: FakeClock) -> Iterator[Callable[..., CommitLog]]:
    """Open (or reopen) the log under tmp_path/log with a config and the fake clock."""
    opened: list[CommitLog] = []

    def _open(config: LogConfig | None = None) -> CommitLog:
        log = CommitLog.open(tmp_path / "log", config or LogConfig(), clock=clock)
        opened.append(log)
        return log

    yield _open
    for log in opened:
        log.close()
