"""A publish/consume workload against a ``ChaosCluster``, and the checker of what the cluster kept afterwards.

``Workload`` runs producer threads that publish unique values (``p<producer>-<seq>``) with ack ALL over raw
gRPC to whichever server currently leads the partition, re-resolving the leader after any error, and
recording every attempt: acked (with its offset, the acking server and when), refused (certainly not
published: FAILED_PRECONDITION, or the server could not even be connected to) or unknown (a deadline, a
connection lost mid-call, an ack error: the message may or may not be stored). A value is retried a few times
with the same bytes, so a retried value may legitimately be stored twice. A consumer thread follows
partition 0 on its leader with committed reads and records every (offset, value) it was served.

``check()`` waits until the cluster has healed (every partition's ISR full, every replica at the leader's
high watermark), reads every partition from every replica, and compares that with what the workload saw.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import grpc

from liftlog.api import api_pb2, api_pb2_grpc

from .cluster import ChaosCluster, channel_options

__all__ = ["Attempt", "Logs", "Outcome", "Publication", "Report", "Served", "Workload", "check"]


#: Partition -> server -> offset -> value: what each replica holds.
Logs = dict[int, dict[str, dict[int, bytes]]]


class Outcome(StrEnum):
    ACKED = "acked"
    REFUSED = "refused"  # certainly not published
    UNKNOWN = "unknown"  # may or may not be stored


@dataclass(frozen=True)
class Attempt:
    server: str
    outcome: Outcome
    started: float  # time.monotonic()
    ended: float
    offset: int = -1
    detail: str = ""


@dataclass
class Publication:
    value: bytes
    partition: int
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def ack(self) -> Attempt | None:
        return next((a for a in self.attempts if a.outcome is Outcome.ACKED), None)

    @property
    def uncertain(self) -> bool:
        """Some attempt may have stored the value without telling us: a duplicate is allowed."""
        return any(a.outcome is Outcome.UNKNOWN for a in self.attempts)

    @property
    def status(self) -> Outcome:
        if self.ack is not None:
            return Outcome.ACKED
        return Outcome.UNKNOWN if self.uncertain else Outcome.REFUSED


@dataclass(frozen=True)
class Served:
    offset: int
    value: bytes
    server: str
    at: float


def classify(exc: grpc.RpcError) -> Outcome:
    """What a failed Publish tells about the message: refused only when it certainly was not sent on."""
    code = exc.code()
    details = exc.details() or ""
    if code is grpc.StatusCode.FAILED_PRECONDITION:
        return Outcome.REFUSED  # checked before publishing (min ISR, readonly)
    if code is grpc.StatusCode.UNAVAILABLE and ("failed to connect" in details.lower() or "refused" in details):
        return Outcome.REFUSED  # the request never reached a server
    return Outcome.UNKNOWN


class LeaderCache:
    """The current leader of each partition, shared by the workload's threads, refreshed at most every 0.2 s."""

    def __init__(self, cluster: ChaosCluster, stream: str) -> None:
        self.cluster = cluster
        self.stream = stream
        self._leaders: dict[int, str] = {}
        self._refreshed = 0.0
        self._lock = threading.Lock()

    def get(self, partition: int) -> str | None:
        with self._lock:
            if partition not in self._leaders:
                self._refresh()
            return self._leaders.get(partition)

    def invalidate(self) -> None:
        with self._lock:
            if time.monotonic() - self._refreshed > 0.2:
                self._refresh()

    def _refresh(self) -> None:
        self._refreshed = time.monotonic()
        view = self.cluster.freshest(self.stream, timeout=0.5)
        if view is not None:
            self._leaders = {pid: p.leader for pid, p in view.items() if p.leader}


class Workload:
    """Producers on every partition of ``stream`` and a consumer of partition 0, in daemon threads."""

    def __init__(
        self,
        cluster: ChaosCluster,
        stream: str,
        partitions: int,
        *,
        producers: int = 4,
        consume: bool = True,
        publish_timeout: float = 3.0,
        max_attempts: int = 4,
        pace: float = 0.005,
    ) -> None:
        self.cluster = cluster
        self.stream = stream
        self.partitions = partitions
        self.publish_timeout = publish_timeout
        self.max_attempts = max_attempts
        self.pace = pace
        self.leaders = LeaderCache(cluster, stream)
        self.publications: list[Publication] = []
        self.served: list[Served] = []
        self.errors: list[str] = []  # unexpected exceptions in workload threads
        self._stop = threading.Event()
        self._call: Any = None
        self._threads = [
            threading.Thread(target=self._produce, args=(i,), name=f"producer-{i}", daemon=True)
            for i in range(producers)
        ]
        if consume:
            self._threads.append(threading.Thread(target=self._consume, name="consumer", daemon=True))

    def __enter__(self) -> Workload:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Workload:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()
        for thread in self._threads:
            thread.join(self.publish_timeout * 2 + 5)

    # -- figures --------------------------------------------------------------------------------------------

    def acked_between(self, start: float, end: float = float("inf")) -> int:
        """Publications acked in [start, end) (time.monotonic() seconds)."""
        return sum(1 for p in list(self.publications) if (a := p.ack) is not None and start <= a.ended < end)

    def wait_acked(self, count: int, after: float, timeout: float = 20.0) -> float:
        """Wait until ``count`` publications were acked after ``after``; return how long it took."""
        started = time.monotonic()
        while self.acked_between(after) < count:
            if time.monotonic() - started > timeout:
                raise AssertionError(
                    f"only {self.acked_between(after)} of {count} acks within {timeout}s; errors: {self.errors[-3:]}"
                )
            time.sleep(0.05)
        return time.monotonic() - started

    # -- threads --------------------------------------------------------------------------------------------

    def _stub(self, channels: dict[str, grpc.Channel], sid: str) -> api_pb2_grpc.APIStub:
        """A stub on this thread's own channel to ``sid`` (closed when the thread ends)."""
        if sid not in channels:
            channels[sid] = grpc.insecure_channel(self.cluster.address(sid), options=channel_options())
        return api_pb2_grpc.APIStub(channels[sid])

    def _produce(self, producer: int) -> None:
        channels: dict[str, grpc.Channel] = {}
        try:
            self._produce_until_stopped(producer, channels)
        finally:
            for channel in channels.values():
                channel.close()

    def _produce_until_stopped(self, producer: int, stubs: dict[str, grpc.Channel]) -> None:
        for seq in itertools.count():
            if self._stop.is_set():
                return
            partition = (producer + seq) % self.partitions
            pub = Publication(b"p%d-%d" % (producer, seq), partition)
            self.publications.append(pub)
            try:
                self._publish(stubs, pub)
            except Exception as exc:  # a bug in the workload must not look like a quiet cluster
                self.errors.append(f"producer {producer}: {exc!r}")
                time.sleep(0.1)
            time.sleep(self.pace)

    def _publish(self, stubs: dict[str, grpc.Channel], pub: Publication) -> None:
        req = api_pb2.PublishRequest(
            stream=self.stream, partition=pub.partition, value=pub.value, ackPolicy=api_pb2.ALL
        )
        while len(pub.attempts) < self.max_attempts and not self._stop.is_set():
            leader = self.leaders.get(pub.partition)
            if leader is None:
                self.leaders.invalidate()
                time.sleep(0.1)
                continue
            started = time.monotonic()
            try:
                resp = self._stub(stubs, leader).Publish(req, timeout=self.publish_timeout)
            except grpc.RpcError as exc:
                outcome = classify(exc)
                detail = f"{exc.code().name}: {exc.details()}"
                pub.attempts.append(Attempt(leader, outcome, started, time.monotonic(), detail=detail))
                self.leaders.invalidate()
                time.sleep(0.1)
                continue
            pub.attempts.append(Attempt(leader, Outcome.ACKED, started, time.monotonic(), resp.ack.offset))
            return

    def _consume(self) -> None:
        channels: dict[str, grpc.Channel] = {}
        try:
            self._follow_partition_0(channels)
        finally:
            for channel in channels.values():
                channel.close()

    def _follow_partition_0(self, stubs: dict[str, grpc.Channel]) -> None:
        next_offset = 0
        while not self._stop.is_set():
            leader = self.leaders.get(0)
            if leader is None:
                self.leaders.invalidate()
                time.sleep(0.1)
                continue
            req = api_pb2.SubscribeRequest(
                stream=self.stream, partition=0, startPosition=api_pb2.OFFSET, startOffset=next_offset
            )
            # A bounded call: a leader that is frozen or cut off serves nothing, so look again now and then.
            call = self._stub(stubs, leader).Subscribe(req, timeout=3.0)
            self._call = call
            try:
                for i, msg in enumerate(call):
                    if i == 0:
                        continue  # the empty message that opens every subscription
                    self.served.append(Served(msg.offset, msg.value, leader, time.monotonic()))
                    next_offset = msg.offset + 1
            except grpc.RpcError as exc:
                if exc.code() is not grpc.StatusCode.DEADLINE_EXCEEDED:
                    time.sleep(0.1)
                self.leaders.invalidate()
            except Exception as exc:
                self.errors.append(f"consumer: {exc!r}")
                time.sleep(0.1)


# -- the checker ------------------------------------------------------------------------------------------------


@dataclass
class Report:
    """What the cluster kept, against what the workload was told and served. The first five must be 0."""

    acked_lost: int = 0  # acked values missing from the leader's log
    acked_misplaced: int = 0  # acked values not at the offset their ack named
    divergent: int = 0  # offsets holding different committed values on different replicas
    served_then_truncated: int = 0  # served to the consumer, later gone or replaced
    duplicates_of_acked: int = 0  # values stored twice although every publish attempt had a clear answer
    phantoms: int = 0  # values stored although every attempt was certainly refused
    duplicates_of_unknown: int = 0  # allowed: a publish timed out or was retried
    converged: bool = True  # the ISR filled up and every replica reached the leader's HW
    published: int = 0
    acked: int = 0
    refused: int = 0
    unknown: int = 0
    retried: int = 0
    served: int = 0
    stored: int = 0  # values in the leaders' logs
    replica_lengths: dict[str, dict[str, int]] = field(default_factory=dict)  # "partition" -> server -> length
    samples: dict[str, list[str]] = field(default_factory=dict)  # a few examples of each violation
    workload_errors: list[str] = field(default_factory=list)

    INVARIANTS = (
        "acked_lost",
        "acked_misplaced",
        "divergent",
        "served_then_truncated",
        "duplicates_of_acked",
        "phantoms",
    )

    def violations(self) -> list[str]:
        found = [f"{name}={getattr(self, name)}" for name in self.INVARIANTS if getattr(self, name)]
        if not self.converged:
            found.append("converged=False")
        return found

    @property
    def ok(self) -> bool:
        return not self.violations()

    def summary(self) -> dict[str, Any]:
        """Every figure, JSON-ready."""
        out: dict[str, Any] = {name: getattr(self, name) for name in self.INVARIANTS}
        out.update(
            ok=self.ok,
            converged=self.converged,
            duplicates_of_unknown=self.duplicates_of_unknown,
            published=self.published,
            acked=self.acked,
            refused=self.refused,
            unknown=self.unknown,
            retried=self.retried,
            served=self.served,
            stored=self.stored,
            replica_lengths=self.replica_lengths,
        )
        if self.samples:
            out["samples"] = self.samples
        if self.workload_errors:
            out["workload_errors"] = self.workload_errors[:5]
        return out

    def _note(self, name: str, example: str) -> None:
        examples = self.samples.setdefault(name, [])
        if len(examples) < 5:
            examples.append(example)


def converged(cluster: ChaosCluster, stream: str) -> bool:
    """Every server agrees on each partition's leader, the ISR is every replica, and all are at one HW."""
    views = {sid: cluster.partitions(sid, stream) for sid in cluster.ids}
    if any(v is None for v in views.values()):
        return False
    first = next(iter(views.values()))
    assert first is not None
    for pid, p in first.items():
        if p.leader not in views:
            return False
        parts = [v[pid] for v in views.values() if v is not None]
        if any((q.leader, q.isr) != (p.leader, p.isr) for q in parts) or set(p.isr) != set(p.replicas):
            return False
        leader = views[p.leader]
        assert leader is not None
        top = leader[pid].newest_offset
        if any(q.high_watermark != top or q.newest_offset != top for q in parts):
            return False
    return True


def read_replica(cluster: ChaosCluster, sid: str, stream: str, partition: int) -> dict[int, bytes]:
    """Every committed message of ``sid``'s replica, up to its high watermark."""
    req = api_pb2.SubscribeRequest(
        stream=stream,
        partition=partition,
        startPosition=api_pb2.EARLIEST,
        stopPosition=api_pb2.STOP_LATEST,
        readISRReplica=True,
    )
    messages = list(cluster.api(sid).Subscribe(req, timeout=30))[1:]
    return {m.offset: m.value for m in messages}


def check(cluster: ChaosCluster, workload: Workload, partitions: int, timeout: float = 60.0) -> tuple[Report, Logs]:
    """Wait for the healed cluster to converge, read every replica, and compare. Returns the report and logs."""
    stream = workload.stream
    report = Report(workload_errors=list(workload.errors))
    try:
        cluster.eventually(lambda: converged(cluster, stream), timeout, f"{stream} to converge")
    except AssertionError:
        report.converged = False
    view = cluster.freshest(stream) or {}
    logs: Logs = {}
    for pid in range(partitions):
        logs[pid] = {}
        for sid in cluster.ids:
            try:
                logs[pid][sid] = read_replica(cluster, sid, stream, pid)
            except grpc.RpcError as exc:
                report._note("unreadable", f"{sid}/{pid}: {exc.code().name}")
                report.converged = False
        report.replica_lengths[str(pid)] = {sid: len(log) for sid, log in logs[pid].items()}
    leaders = {pid: view[pid].leader if pid in view else "" for pid in range(partitions)}
    evaluate(report, workload.publications, workload.served, logs, leaders)
    return report, logs


def evaluate(
    report: Report,
    publications: list[Publication],
    served: list[Served],
    logs: Logs,
    leaders: dict[int, str],
) -> None:
    """Fill ``report`` from the workload's records and the replicas' logs (partition -> server -> offset -> value)."""
    pubs = list(publications)
    report.published = len(pubs)
    statuses = Counter(p.status for p in pubs)
    report.acked, report.refused, report.unknown = (statuses[o] for o in Outcome)
    report.retried = sum(1 for p in pubs if len(p.attempts) > 1)
    report.served = len(served)

    # Divergence: any offset two replicas both hold (both below their HW) with different values.
    for pid, replicas in logs.items():
        names = sorted(replicas)
        for i, x in enumerate(names):
            for y in names[i + 1 :]:
                for offset in replicas[x].keys() & replicas[y].keys():
                    if replicas[x][offset] != replicas[y][offset]:
                        report.divergent += 1
                        report._note(
                            "divergent", f"{pid}@{offset}: {x}={replicas[x][offset]!r} {y}={replicas[y][offset]!r}"
                        )

    # The leader's copy is the partition's log from now on.
    truth = {pid: logs[pid].get(leaders.get(pid, ""), {}) for pid in logs}
    where: dict[tuple[int, bytes], list[int]] = defaultdict(list)
    for pid, log in truth.items():
        report.stored += len(log)
        for offset, value in log.items():
            where[(pid, value)].append(offset)

    for pub in pubs:
        offsets = where.get((pub.partition, pub.value), [])
        ack = pub.ack
        if ack is not None:
            if not offsets:
                report.acked_lost += 1
                report._note("acked_lost", f"{pub.value!r}@{pub.partition}/{ack.offset} acked by {ack.server}")
            elif ack.offset not in offsets:
                report.acked_misplaced += 1
                report._note(
                    "acked_misplaced", f"{pub.value!r} acked at {ack.offset}, stored at {offsets}; {_attempts(pub)}"
                )
        if len(offsets) > 1:
            if pub.uncertain:
                report.duplicates_of_unknown += 1
            else:
                report.duplicates_of_acked += 1
                report._note("duplicates_of_acked", f"{pub.value!r} at {offsets}")
        if offsets and pub.status is Outcome.REFUSED:
            report.phantoms += 1
            report._note("phantoms", f"{pub.value!r} at {offsets}: {[a.detail for a in pub.attempts]}")

    log0 = truth.get(0, {})
    for s in served:
        if log0.get(s.offset) != s.value:
            report.served_then_truncated += 1
            report._note("served_then_truncated", f"{s.value!r}@{s.offset} from {s.server}, now {log0.get(s.offset)!r}")


def _attempts(pub: Publication) -> str:
    """Every attempt's server, outcome, offset and times, for a failure note."""
    return ", ".join(
        f"{a.server}:{a.outcome.value}@{a.offset} [{a.started:.2f}-{a.ended:.2f}] {a.detail}".rstrip()
        for a in pub.attempts
    )
