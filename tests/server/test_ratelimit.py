"""The warning rate limiter: one line per key per interval, and the count of what it dropped."""

from __future__ import annotations

import asyncio
import logging

import pytest

from liftlog.server import ratelimit
from liftlog.server.ratelimit import LogLimiter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def logger(caplog: pytest.LogCaptureFixture) -> logging.Logger:
    caplog.set_level(logging.INFO, logger="test.ratelimit")
    return logging.getLogger("test.ratelimit")


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.ratelimit"]


def test_one_line_per_key_per_interval_then_the_count(logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limiter = LogLimiter(logger, interval=10.0, clock=clock)
    for i in range(2064):
        limiter.warning("malformed message on %s: %d", "ns.raft", i)
        clock.now += 0.001
    assert lines(caplog) == ["malformed message on ns.raft: 0"]
    clock.now = 111.0
    assert limiter.warning("malformed message on %s: %d", "ns.raft", 9999)
    assert lines(caplog)[1] == "malformed message on ns.raft: 9999 (and 2063 more dropped in the 11 s before)"
    assert not limiter.warning("malformed message on %s: %d", "ns.raft", 1)
    assert len(lines(caplog)) == 2


def test_keys_are_limited_separately(logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    limiter = LogLimiter(logger, interval=10.0, clock=Clock())
    for _ in range(5):
        limiter.warning("bad fetch on %s", "a")
        limiter.warning("bad notification on %s", "b")
        limiter.warning("bad ack on %s", "c", key="acks")
    assert lines(caplog) == ["bad fetch on a", "bad notification on b", "bad ack on c"]


def test_flush_logs_the_count_when_the_flood_stops(logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limiter = LogLimiter(logger, interval=10.0, clock=clock)
    for i in range(50):
        limiter.warning("garbage %d", i)
    limiter.flush()
    assert lines(caplog) == ["garbage 0"], "nothing more before the interval ends"
    clock.now += 10.0
    limiter.flush()
    assert lines(caplog) == ["garbage 0", "garbage 49 (and 48 more dropped in the 10 s before)"]
    limiter.flush()
    assert len(lines(caplog)) == 2, "a count is logged once"


async def test_a_timer_logs_the_count_without_further_warnings(
    logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = LogLimiter(logger, interval=0.05)
    for i in range(100):
        limiter.warning("garbage %d", i)
    await asyncio.sleep(0.2)
    logged = lines(caplog)
    assert len(logged) == 2 and logged[0] == "garbage 0"
    assert logged[1].startswith("garbage 99 (and 98 more dropped in the 0.0"), logged[1]


def test_zero_interval_logs_everything(logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    limiter = LogLimiter(logger, interval=0, clock=Clock())
    for i in range(3):
        limiter.warning("line %d", i)
    assert lines(caplog) == ["line 0", "line 1", "line 2"]


def test_configure_sets_the_default_interval(logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limiter = LogLimiter(logger, clock=clock)
    before = ratelimit.interval()
    try:
        ratelimit.configure(1.0)
        limiter.warning("x")
        clock.now += 0.5
        limiter.warning("x")
        clock.now += 0.6
        limiter.warning("x")
        assert lines(caplog) == ["x", "x (and 1 more dropped in the 1.1 s before)"]
        with pytest.raises(ValueError, match="cannot be negative"):
            ratelimit.configure(-1)
    finally:
        ratelimit.configure(before)


def test_a_disabled_level_costs_nothing(logger: logging.Logger, caplog: pytest.LogCaptureFixture) -> None:
    limiter = LogLimiter(logger, interval=10.0, clock=Clock())
    assert not limiter.log(logging.DEBUG, "debug %d", 1)
    assert limiter.log(logging.WARNING, "debug %d", 1), "a dropped DEBUG line does not hold back a WARNING one"


def test_keys_are_bounded_and_evicted_counts_are_logged(
    logger: logging.Logger, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    limiter = LogLimiter(logger, interval=10.0, clock=clock)
    limiter.warning("first")
    limiter.warning("first")
    for i in range(ratelimit.MAX_KEYS):
        limiter.warning("other %d", i, key=f"k{i}")
    assert len(limiter._keys) == ratelimit.MAX_KEYS
    assert lines(caplog).count("first") == 2, "the evicted key's pending line is logged, not lost"
