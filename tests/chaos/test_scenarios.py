"""Issue 5 §4: replication under faults, between real servers, each behind its own NATS proxy.

Every scenario runs producers (ack ALL) on a 2-partition, rf=3 stream and a committed-read consumer of
partition 0, injects one fault, heals, and then checks what every replica kept: nothing acknowledged lost or
moved, no divergent committed offsets, nothing served to the consumer and later truncated, no duplicates of
values whose publish had a clear answer. It also checks the cluster acknowledged messages before the fault
and again after it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from liftlog.api import api_pb2
from tests.integration.harness import NatsProcess

from .checker import (
    Attempt,
    Deposals,
    Key,
    LeaderWindow,
    Logs,
    Outcome,
    Publication,
    Report,
    Served,
    Workload,
    check,
    evaluate,
    fences_in_log,
    read_replica,
)
from .cluster import ChaosCluster
from .faults import Fault, FaultEvent
from .run import AFTER_FAULTS_S, duplicate_window_s

pytestmark = [pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(90)]

STREAM = "orders"
PARTITIONS = 2
#: Acks wanted before the fault and again once the cluster recovered.
ENOUGH = 30


@pytest.fixture
def cluster(tmp_path: Path, nats_server: NatsProcess) -> Iterator[ChaosCluster]:
    with ChaosCluster(tmp_path, nats_server) as c:
        c.start()
        c.create_stream(STREAM, partitions=PARTITIONS, rf=3)
        yield c


@pytest.fixture
def workload(cluster: ChaosCluster) -> Iterator[Workload]:
    w = Workload(cluster, STREAM, PARTITIONS).start()
    yield w
    w.stop()


def full_isr(cluster: ChaosCluster, timeout: float = 30.0) -> None:
    def check_all() -> bool:
        view = cluster.freshest(STREAM)
        return bool(view) and all(len(p.isr) == 3 for p in (view or {}).values())

    cluster.eventually(check_all, timeout, "every ISR full again")


def new_leader(cluster: ChaosCluster, old: str, timeout: float = 20.0) -> str:
    def check_leader() -> str | None:
        leader = cluster.leader(STREAM, 0)
        return leader if leader and leader != old else None

    return cluster.eventually(check_leader, timeout, f"a leader other than {old}")


def partition_metadata(cluster: ChaosCluster, sid: str) -> api_pb2.PartitionMetadata:
    req = api_pb2.FetchPartitionMetadataRequest(stream=STREAM, partition=0)
    return cluster.api(sid).FetchPartitionMetadata(req, timeout=5).metadata


def finish(cluster: ChaosCluster, workload: Workload, recovered_at: float) -> tuple[Report, Logs]:
    """Wait for acks after recovery, stop the workload, check, and assert the common invariants."""
    workload.wait_acked(ENOUGH, after=recovered_at, timeout=30)
    workload.stop()
    report, logs = check(cluster, workload, PARTITIONS)
    print(json.dumps(report.summary()))
    assert report.converged, report.summary()
    assert report.acked_lost == 0, report.summary()
    assert report.acked_misplaced == 0, report.summary()
    assert report.divergent == 0, report.summary()
    assert report.served_then_truncated == 0, report.summary()
    assert report.duplicates_of_acked == 0, report.summary()
    assert report.phantoms == 0, report.summary()
    assert workload.errors == []
    assert report.served > 0 and report.stored >= report.acked
    return report, logs


def test_kill_9_the_leader_under_load_and_restart_it(cluster: ChaosCluster, workload: Workload) -> None:
    workload.wait_acked(ENOUGH, after=0)
    old = cluster.leader(STREAM, 0)
    assert old is not None
    cluster.kill(old)
    killed_at = time.monotonic()
    assert new_leader(cluster, old) != old
    workload.wait_acked(ENOUGH, after=killed_at)  # the survivors carry on while it is down
    cluster.restart(old)
    full_isr(cluster)
    finish(cluster, workload, time.monotonic())


def test_a_killed_follower_comes_back_and_rejoins_the_isr(cluster: ChaosCluster, workload: Workload) -> None:
    workload.wait_acked(ENOUGH, after=0)
    leader = cluster.leader(STREAM, 0)
    follower = next(s for s in cluster.ids if s != leader)
    cluster.kill(follower)
    cluster.eventually(lambda: follower not in cluster.isr(STREAM, 0), 15, f"{follower} out of the ISR")
    workload.wait_acked(ENOUGH, after=time.monotonic())  # ack ALL flows again with two replicas
    cluster.restart(follower)
    cluster.eventually(lambda: follower in cluster.isr(STREAM, 0), 20, f"{follower} back in the ISR")
    full_isr(cluster)
    finish(cluster, workload, time.monotonic())


def test_a_leader_paused_longer_than_the_lag_time_resumes_without_harm(
    cluster: ChaosCluster, workload: Workload
) -> None:
    workload.wait_acked(ENOUGH, after=0)
    old = cluster.leader(STREAM, 0)
    assert old is not None
    cluster.pause(old)
    paused_at = time.monotonic()
    try:
        assert new_leader(cluster, old) != old  # 3 s of silence: the controller fails the partition over
        workload.wait_acked(ENOUGH, after=paused_at)
        time.sleep(max(0.0, paused_at + 5.0 - time.monotonic()))  # well past max.lag.time (2 s)
    finally:
        cluster.resume(old)
    full_isr(cluster)
    finish(cluster, workload, time.monotonic())


def test_a_leader_cut_off_from_nats_stops_acknowledging(cluster: ChaosCluster, workload: Workload) -> None:
    workload.wait_acked(ENOUGH, after=0)
    old = cluster.leader(STREAM, 0)
    assert old is not None
    cluster.cut(old)
    cut_at = time.monotonic()
    print(f"cut {old} at {cut_at:.2f}")
    assert new_leader(cluster, old) != old
    workload.wait_acked(ENOUGH, after=cut_at)
    time.sleep(max(0.0, cut_at + 5.0 - time.monotonic()))
    cluster.heal(old)
    healed_at = time.monotonic()
    print(f"healed {old} at {healed_at:.2f}")
    full_isr(cluster)
    report, logs = finish(cluster, workload, time.monotonic())
    # No ack the cut-off leader gave after the cut was for a message the cluster then lost. (It cannot commit
    # anything on its own: its followers fetch over NATS. Acks right after the cut were committed before it.)
    acked_by_old = [
        p for p in workload.publications if (a := p.ack) is not None and a.server == old and a.ended > cut_at
    ]
    view = cluster.freshest(STREAM)
    assert view is not None
    kept = {(key[1], v) for key in logs for v in logs[key][view[key[1]].leader].values()}
    assert [p.value for p in acked_by_old if (p.partition, p.value) not in kept] == []
    # While cut off, it acknowledged nothing sent to it after the cut (once healed, it may relay acks again).
    late = [p for p in acked_by_old if p.ack is not None and p.ack.started > cut_at + 1.0 and p.ack.ended < healed_at]
    assert late == [], f"the cut-off leader acked {len(late)} messages sent to it after the cut"
    assert report.acked > 2 * ENOUGH


def test_every_replica_restarts_at_once_under_load(cluster: ChaosCluster, workload: Workload) -> None:
    workload.wait_acked(ENOUGH, after=0)
    for sid in cluster.ids:
        cluster.kill(sid)
    for sid in cluster.ids:
        cluster.restart(sid)
    cluster.wait_formed()
    full_isr(cluster)
    finish(cluster, workload, time.monotonic())


def test_a_restarted_leader_does_not_serve_its_uncommitted_tail(cluster: ChaosCluster) -> None:
    leader = cluster.leader(STREAM, 0)
    assert leader is not None
    followers = [s for s in cluster.ids if s != leader]
    api = cluster.api(leader)

    def publish(value: bytes, timeout: float = 5.0) -> None:
        api.Publish(api_pb2.PublishRequest(stream=STREAM, value=value, ackPolicy=api_pb2.ALL), timeout=timeout)

    for i in range(3):
        publish(b"committed-%d" % i)
    # With both followers frozen nothing can commit (and no controller can shrink the ISR): an uncommitted tail.
    # Written with ack LEADER at once: the leader hears no controller either, so its lease (1 s here) soon
    # stops it writing anything at all.
    for sid in followers:
        cluster.pause(sid)
    for i in range(3):
        api.Publish(
            api_pb2.PublishRequest(stream=STREAM, value=b"uncommitted-%d" % i, ackPolicy=api_pb2.LEADER), timeout=1.0
        )
    before = partition_metadata(cluster, leader)
    assert (before.highWatermark, before.newestOffset) == (2, 5)

    cluster.kill(leader)
    cluster.restart(leader)
    served = read_replica(cluster, leader, STREAM, 0)  # what a committed read is served now
    cluster.kill(leader)
    for sid in followers:
        cluster.resume(sid)
    new = new_leader(cluster, leader)
    for i in range(3):
        cluster.api(new).Publish(
            api_pb2.PublishRequest(stream=STREAM, value=b"after-%d" % i, ackPolicy=api_pb2.ALL), timeout=10
        )
    cluster.restart(leader)
    full_isr(cluster)
    final = read_replica(cluster, new, STREAM, 0)
    # A follower may have copied some of the tail just before it froze: then the new leader keeps (and commits) it.
    assert final[2] == b"committed-2" and list(final.values())[-3:] == [b"after-0", b"after-1", b"after-2"], final
    truncated = {offset: value for offset, value in served.items() if final.get(offset) != value}
    assert truncated == {}, f"served by the restarted {leader}, then replaced: {truncated}"


def test_the_checker_counts_each_kind_of_violation() -> None:
    """``evaluate`` on hand-made records, so a checker that sees nothing cannot pass the scenarios above."""

    def pub(value: bytes, *outcomes: tuple[Outcome, int]) -> Publication:
        return Publication(value, 0, [Attempt("a", o, 0.0, 1.0, offset) for o, offset in outcomes])

    publications = [
        pub(b"kept", (Outcome.ACKED, 0)),
        pub(b"lost", (Outcome.ACKED, 1)),
        pub(b"moved", (Outcome.ACKED, 9)),
        pub(b"twice", (Outcome.ACKED, 2)),
        pub(b"retried", (Outcome.UNKNOWN, -1), (Outcome.ACKED, 4)),
        pub(b"refused", (Outcome.REFUSED, -1)),
    ]
    leader = {0: b"kept", 1: b"other", 2: b"twice", 3: b"retried", 4: b"retried", 5: b"twice", 6: b"moved"}
    follower = {**leader, 6: b"diverged"}
    logs: Logs = {("", 0): {"a": {**leader, 7: b"refused"}, "b": follower}}
    served = [Served(0, b"kept", "a", 0.0), Served(1, b"gone", "a", 0.0), Served(8, b"beyond", "a", 0.0)]
    served += [Served(2, b"twice", "a", 0.0, "other"), Served(2, b"twice", "a", 0.0, "other")]  # offset again
    report = Report()
    evaluate(report, publications, served, logs, {("", 0): "a"})
    assert (report.acked_lost, report.acked_misplaced, report.divergent) == (1, 1, 1)
    assert (report.duplicates_of_acked, report.duplicates_of_unknown, report.phantoms) == (1, 1, 1)
    assert report.served_then_truncated == 2 and report.offsets_backwards == 1
    assert (report.published, report.acked, report.refused, report.unknown, report.retried) == (6, 5, 1, 0, 1)
    assert not report.ok and len(report.violations()) == 7
    assert json.loads(json.dumps(report.summary()))["acked_lost"] == 1


def test_the_checker_holds_each_ack_policy_to_its_promise() -> None:
    """Ack ALL: never lost. Ack LEADER: lost only with its leader. Ack NONE: counted. Loss can be measured."""

    def pub(
        value: bytes, policy: api_pb2.AckPolicy, server: str = "a", started: float = 1.0, partition: int = 0
    ) -> Publication:
        attempt = Attempt(server, Outcome.ACKED, started, started + 0.1, 0)
        attempts = [attempt] if policy != api_pb2.NONE else []
        return Publication(value, partition, attempts, stream="s", policy=policy)

    publications = [
        pub(b"all-lost", api_pb2.ALL),
        pub(b"leader-lost-with-a", api_pb2.LEADER, "a", 1.0),  # a crashed at 5.0
        pub(b"leader-lost-b-kept-leading", api_pb2.LEADER, "b", 1.0, partition=1),
        pub(b"leader-lost-after-deposal", api_pb2.LEADER, "c", 1.0),  # c lost s/0 at 3.0
        pub(b"none-stored", api_pb2.NONE),
        pub(b"none-lost", api_pb2.NONE),
    ]
    logs: Logs = {("s", 0): {"a": {0: b"none-stored"}}, ("s", 1): {"b": {}}}
    deposals = Deposals({"a": [5.0], "b": [], "c": []}, [(0.5, ("s", 0), "c"), (3.0, ("s", 0), "a")])
    report = Report()
    evaluate(report, publications, [], logs, {("s", 0): "a", ("s", 1): "b"}, deposals)
    assert (report.acked_lost, report.leader_acked_lost, report.leader_acked_lost_allowed) == (1, 1, 2)
    assert (report.none_published, report.none_stored, report.acked) == (2, 1, 4)
    assert report.acked_by_policy == {"all": 1, "leader": 3}
    measured = Report()
    evaluate(measured, publications, [], logs, {("s", 0): "a", ("s", 1): "b"}, deposals, tolerate_loss=True)
    assert (measured.acked_lost, measured.acked_lost_tolerated) == (0, 1)


def test_the_checker_holds_resent_messages_with_ids_to_one_copy_and_duplicate_acks_to_the_original() -> None:
    """With retries (``LoadSpec.retry``): a message with an id is stored once however often it was sent, and
    a ``duplicate`` ack names the original's offset and follows an attempt that may have stored it."""

    def attempt(outcome: Outcome, offset: int = -1, duplicate: bool = False) -> Attempt:
        return Attempt("a", outcome, 0.0, 1.0, offset, duplicate=duplicate)

    def pub(value: bytes, *attempts: Attempt) -> Publication:
        return Publication(value, 0, list(attempts), stream="s", msg_id=value)

    unknown = attempt(Outcome.UNKNOWN)
    publications = [
        pub(b"once", unknown, attempt(Outcome.ACKED, 0, duplicate=True)),
        pub(b"twice", unknown, unknown, attempt(Outcome.ACKED, 1)),
        pub(b"dup-elsewhere", unknown, attempt(Outcome.ACKED, 9, duplicate=True)),
        pub(b"dup-of-nothing", attempt(Outcome.ACKED, 3, duplicate=True)),
        pub(b"given-up", unknown, unknown),
        Publication(b"no-id", 0, [unknown, attempt(Outcome.ACKED, 5)], stream="s"),
    ]
    log = {0: b"once", 1: b"twice", 2: b"dup-elsewhere", 3: b"dup-of-nothing", 4: b"twice", 5: b"no-id"}
    log |= {6: b"no-id", 7: b"given-up"}
    report = Report()
    evaluate(report, publications, [], {("s", 0): {"a": log}}, {("s", 0): "a"})
    assert (report.duplicates_stored, report.duplicates_of_unknown) == (1, 1), report.samples
    assert report.samples["duplicates_stored"][0].startswith("id b'twice' @('s', 0) at offsets [1, 4]")
    assert (report.acked_misplaced, report.duplicate_acks_unexplained) == (1, 1), report.samples
    assert (report.duplicate_acks, report.retries, report.retried, report.acked_lost) == (3, 6, 5, 0)
    assert sorted(v.split("=")[0] for v in report.violations()) == [
        "acked_misplaced",
        "duplicate_acks_unexplained",
        "duplicates_stored",
    ]


def test_the_duplicate_window_of_a_retrying_run_outlasts_it_and_its_clock_jumps() -> None:
    schedule = [FaultEvent(1.0, Fault.CLOCK, "a", 2.0, shift_s=-250.0), FaultEvent(4.0, Fault.KILL, "b", 1.0)]
    assert duplicate_window_s(schedule, 30.0) == 30 + 500 + AFTER_FAULTS_S
    assert duplicate_window_s([], 30.0) == 30 + AFTER_FAULTS_S


def test_the_checker_excuses_lost_ack_leader_messages_only_in_the_window_around_an_end_of_leadership() -> None:
    """From replica.max.lag.time before a leadership ended to the lease after (README, "What survives what")."""
    w = LeaderWindow(lease=1.0, lag=2.0, failover=4.0, slack=0.5)
    # s/0: a leads from 0 and is cut off at 45; with no controller until 70 (say), the monitor sees b lead at
    # 70. The window around a change starts lag + failover (+ slack) before it: the monitor cannot tell when
    # the leadership ended, but a fault can.
    history: list[tuple[float, Key, str]] = [(0.0, ("s", 0), "a"), (70.0, ("s", 0), "b")]
    deposals = Deposals({"a": [], "b": [], "c": [80.0]}, history, {"a": [45.0]}, w)

    def excused(started: float, partition: int = 0, server: str = "a") -> bool:
        attempt = Attempt(server, Outcome.ACKED, started, started + 0.1, 7)
        return deposals.excuses(Publication(b"v", partition, [attempt], stream="s", policy=api_pb2.LEADER))

    assert excused(44.0), "acked just before its leader was cut off, not copied yet"
    assert excused(45.9), "a cut-off leader acks until its lease runs out"
    assert not excused(47.0), "past the lease after the cut: a zombie ack"
    assert not excused(60.0), "long after the cut, long before the change"
    assert excused(64.0), "within lag + failover before the change"
    assert excused(71.0), "within the lease after the controller's change (a leader that had not heard)"
    assert not excused(72.0), "past the lease after the change"
    assert not excused(30.0), "long before any end of leadership"
    assert not excused(44.0, partition=1), "no end of leadership of that partition"
    # The call went to c, which crashed at 80 but never led s/0: its crash excuses nothing there. (The old
    # rule blamed the server the call went to, with no bound in time.)
    assert not excused(79.5, server="c")


def test_a_fence_the_log_shows_is_found_with_its_duration() -> None:
    log = "\n".join(
        [
            "2026-01-01 10:00:00,000 ERROR liftlog.server.partitions.partition: partition s/0 is fenced: EIO",
            "2026-01-01 10:00:03,500 WARNING liftlog.server.partitions.partition: "
            "partition s/0 takes writes again (...)",
            "2026-01-01 10:00:04,000 ERROR liftlog.server.partitions.streams: partition s/1 is unavailable: EMFILE",
            "2026-01-01 10:00:05,000 WARNING liftlog.faulty: faulty server starting (control x)",
            "2026-01-01 10:00:06,000 ERROR liftlog.server.partitions.partition: partition t/2 is fenced: ENOSPC",
        ]
    )
    fences = fences_in_log(log)
    assert [(key, round(end - start, 1) if end else None) for key, start, end in fences] == [
        (("s", 0), 3.5),
        (("s", 1), 1.0),
        (("t", 2), None),
    ]
