"""Runs the raft simulation over many seeds (see ``simulator`` for what is checked).

``LIFTLOG_SIM_SEEDS=N`` changes how many seeds run (default 2000); ``LIFTLOG_SIM_SEED=S``
replays one seed.
"""

from __future__ import annotations

import pytest

from .seeds import Results, run_seeds, seeds_from_env
from .simulator import REPLAY, SimFailure, run_seed

DEFAULT_SEEDS = 2000


@pytest.fixture(scope="module")
def results() -> Results:
    return run_seeds(
        seeds_from_env("LIFTLOG_SIM_SEED", "LIFTLOG_SIM_SEEDS", DEFAULT_SEEDS), run_seed, SimFailure, REPLAY
    )


def test_safety_and_liveness_over_seeds(results: Results) -> None:
    if results.failures:
        pytest.fail(f"{len(results.failures)} of {len(results.seeds)} seeds failed; first:\n{results.failures[0]}")


def test_simulation_exercises_every_feature(results: Results) -> None:
    if len(results.seeds) < 200:
        pytest.skip("too few seeds to expect every feature")
    s = results.stats
    per_seed = len(results.seeds)
    assert s["elections"] >= per_seed, s
    for feature in (
        "crashes",
        "restarts",
        "partitions",
        "compactions",
        "snapshots_installed",
        "conf_adds_applied",
        "conf_removes_applied",
        "transfers_completed",
        "reads_served",
        "leader_stepped_down_removed",
    ):
        assert s[feature] >= per_seed // 100, (feature, s)


def test_same_seed_same_run() -> None:
    assert run_seed(7) == run_seed(7)
