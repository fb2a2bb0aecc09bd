"""The parts behind /metrics that need no server: histograms, Raft history, loop lag."""

from __future__ import annotations

import asyncio
import threading

from liftlog.histogram import Histogram, ThreadSafeHistogram
from liftlog.raft import Role
from liftlog.server.control.metadata_raft import RaftStats
from liftlog.server.ops.metrics import LoopLagMonitor


def test_histogram_buckets_are_cumulative_with_inf_last() -> None:
    h = Histogram((0.001, 0.01, 0.1))
    h.observe(0.0005)
    h.observe(0.001)  # on a bound: counted in it (Prometheus' le is inclusive)
    h.observe(0.05, count=3)
    h.observe(7.0)
    buckets, count, total = h.cumulative()
    assert buckets == [("0.001", 2), ("0.01", 2), ("0.1", 5), ("+Inf", 6)]
    assert count == 6
    assert abs(total - (0.0005 + 0.001 + 0.15 + 7.0)) < 1e-12


def test_thread_safe_histogram_loses_no_observation() -> None:
    h = ThreadSafeHistogram()

    def work() -> None:
        for _ in range(20_000):
            h.observe(0.002)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert h.cumulative()[1] == 80_000


def test_raft_stats_count_elections_leader_changes_and_leaderless_gaps() -> None:
    stats = RaftStats()
    stats.changed(None, (Role.FOLLOWER, None, 1), 0.0)
    stats.changed((Role.FOLLOWER, None, 1), (Role.CANDIDATE, None, 2), 1.0)
    stats.changed((Role.CANDIDATE, None, 2), (Role.LEADER, "a", 2), 1.5)
    # The wait for the first leader at start is no failover.
    assert (stats.elections, stats.leader_changes, stats.leaderless.cumulative()[1]) == (1, 1, 0)
    stats.changed((Role.LEADER, "a", 2), (Role.FOLLOWER, None, 3), 10.0)
    stats.changed((Role.FOLLOWER, None, 3), (Role.CANDIDATE, None, 4), 10.5)
    stats.changed((Role.CANDIDATE, None, 4), (Role.CANDIDATE, None, 5), 11.0)  # a second election
    stats.changed((Role.CANDIDATE, None, 5), (Role.FOLLOWER, "b", 5), 12.25)
    assert stats.elections == 3
    assert stats.leader_changes == 2
    _buckets, count, total = stats.leaderless.cumulative()
    assert count == 1 and total == 2.25
    # A leader seen at a new term without a gap is a change, not a failover.
    stats.changed((Role.FOLLOWER, "b", 5), (Role.FOLLOWER, "c", 6), 20.0)
    assert stats.leader_changes == 3 and stats.leaderless.cumulative()[1] == 1


async def test_loop_lag_sees_a_blocked_loop() -> None:
    monitor = LoopLagMonitor(interval=0.01)
    monitor.start()
    try:
        await asyncio.sleep(0.05)
        assert monitor.lag < 0.05
        threading.Event().wait(0.2)  # blocks the loop, as a slow callback would
        await asyncio.sleep(0.03)
        assert monitor.histogram.cumulative()[2] >= 0.15
    finally:
        await monitor.stop()
