"""Runs the whole-cluster simulation over many seeds (see ``cluster`` for what is checked).

``LIFTLOG_CLUSTER_SIM_SEEDS=N`` changes how many seeds run (default 1000); ``LIFTLOG_CLUSTER_SIM_SEED=S``
replays one seed, with the events leading to a failure.
"""

from __future__ import annotations

import re

import pytest

from .cluster import REPLAY, SimFailure, run_seed
from .mutations import MUTATIONS, first_catch
from .seeds import Results, run_seeds, seeds_from_env

DEFAULT_SEEDS = 1000


@pytest.fixture(scope="module")
def results() -> Results:
    return run_seeds(
        seeds_from_env("LIFTLOG_CLUSTER_SIM_SEED", "LIFTLOG_CLUSTER_SIM_SEEDS", DEFAULT_SEEDS),
        run_seed,
        SimFailure,
        REPLAY,
    )


def test_no_acknowledged_message_lost_and_no_divergence_over_seeds(results: Results) -> None:
    if results.failures:
        pytest.fail(f"{len(results.failures)} of {len(results.seeds)} seeds failed; first:\n{results.failures[0]}")


def test_simulation_exercises_every_feature(results: Results) -> None:
    if len(results.seeds) < 200:
        pytest.skip("too few seeds to expect every feature")
    s = results.stats
    per_seed = len(results.seeds)
    assert s["acked_all"] >= per_seed, s
    for feature in (
        "crashes",
        "restarts",
        "partitions",
        "one_way_cuts",
        "truncations",
        "reports",
        "elections_from_reports",
        "unclean_hand_overs",
        "isr_proposals",
        "isr_proposals_stale",  # decided against metadata the core had not caught up with
        "step_enter_election",
        "step_candidate",
        "step_hand_over",
        "step_offline",
        "step_rebalance",
        "reads",
        "reassignments_started",
        "reassignment_ChangeLeader",
        "reassignment_CompleteReassignment",
        "replicas_dropped",
        "deletes",
        "pauses",
        "resumes",
    ):
        # Unclean elections need every in-sync replica down at once: rarer than the rest.
        assert s[feature] >= per_seed // (400 if feature == "unclean_hand_overs" else 100), (feature, s)


def test_same_seed_same_run() -> None:
    assert run_seed(7) == run_seed(7)


def test_the_checker_catches_seed_003s_truncation_to_the_high_watermark(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulation would notice if followers truncated to their HW instead of by leader epoch (seed 003):
    some seed loses or replaces committed messages. (With this build the first such seed is 17.)"""
    from ..replication.test_epoch_scenarios import HwTruncatingFollower
    from . import cluster

    monkeypatch.setattr(cluster, "FollowerReplica", HwTruncatingFollower)
    for seed in range(1000):
        try:
            run_seed(seed)
        except SimFailure as exc:
            assert "committed" in str(exc) or "lost" in str(exc), exc
            return
    pytest.fail("no seed of 1,000 noticed followers truncating to their high watermark")


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_the_simulation_catches_each_decision_dropped(name: str) -> None:
    """Each decision of the cores, dropped (``mutations.MUTATIONS``), fails a seed within CI's seed count."""
    m = MUTATIONS[name]
    found = first_catch(name, range(DEFAULT_SEEDS))
    assert found is not None, f"no seed of {DEFAULT_SEEDS} noticed: {m.why}"
    seed, failure = found
    assert re.search(m.failure, failure), failure
    assert seed == m.seed, f"caught at seed {seed}, not at the pinned {m.seed}: update the pin in mutations.py"
