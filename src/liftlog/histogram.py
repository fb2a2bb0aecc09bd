"""Latency histograms cheap enough for the hot path, exported to Prometheus at scrape time.

prometheus-client's ``Histogram.observe`` takes a lock and costs about 0.9 µs;
these cost about 0.17 µs and take a count, so one observation can stand for a
whole batch acknowledged together. They are plain counters read by the
metrics collector (``liftlog.server.ops.metrics``); nothing here imports
prometheus-client, so storage can time its fsyncs without depending on it.
"""

from __future__ import annotations

import threading
from bisect import bisect_left

__all__ = ["FSYNC_SECONDS", "LATENCY_BUCKETS", "Histogram", "ThreadSafeHistogram"]

#: Seconds, 50 µs to 10 s: an fsync on NVMe takes ~100 µs, an ack-ALL round trip a few ms, an election seconds.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class Histogram:
    """Counts per bucket (upper bounds, the last one +Inf), their sum and total. Event-loop only."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float, count: int = 1) -> None:
        """``count`` events that each took ``value``."""
        self.counts[bisect_left(self.bounds, value)] += count
        self.total += value * count

    def cumulative(self) -> tuple[list[tuple[str, int]], int, float]:
        """Prometheus' view: (le, cumulative count) per bucket ending with +Inf, the count and the sum."""
        out = []
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            out.append((_le(bound), running))
        running += self.counts[-1]
        out.append(("+Inf", running))
        return out, running, self.total


class ThreadSafeHistogram(Histogram):
    """For observations made from worker threads too (the group commit's fsyncs)."""

    __slots__ = ("_lock",)

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        super().__init__(bounds)
        self._lock = threading.Lock()

    def observe(self, value: float, count: int = 1) -> None:
        with self._lock:
            Histogram.observe(self, value, count)

    def cumulative(self) -> tuple[list[tuple[str, int]], int, float]:
        with self._lock:
            return Histogram.cumulative(self)


def _le(bound: float) -> str:
    return repr(float(bound))


#: Every fsync of a partition's log file in this process (``FileIO.fsync``), whichever thread makes it.
FSYNC_SECONDS = ThreadSafeHistogram()
