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
import re
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

import grpc

from liftlog.api import api_pb2, api_pb2_grpc

from .cluster import ChaosCluster, channel_options

__all__ = [
    "Attempt",
    "Deposals",
    "Key",
    "LeaderWindow",
    "Logs",
    "Outcome",
    "Publication",
    "Report",
    "Served",
    "Workload",
    "check",
    "evaluate",
    "fences_in_log",
]


#: A partition: (stream, partition id).
Key = tuple[str, int]
#: Partition -> server -> offset -> value: what each replica holds.
Logs = dict[Key, dict[str, dict[int, bytes]]]


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
    #: The ack said ``duplicate``: the message was stored before (by an earlier attempt), at ``offset``.
    duplicate: bool = False


@dataclass
class Publication:
    value: bytes
    partition: int
    attempts: list[Attempt] = field(default_factory=list)
    stream: str = ""
    #: api_pb2.ALL, LEADER or NONE: what an ack promises (NONE gets none: its attempts are UNKNOWN).
    policy: api_pb2.AckPolicy = api_pb2.ALL
    #: The ``Nats-Msg-Id`` every attempt carried (empty: none). With an id, a partition stores the message at
    #: most once within its duplicate window, however often it was resent: any second copy is a violation.
    msg_id: bytes = b""

    @property
    def key(self) -> Key:
        return (self.stream, self.partition)

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
    consumer: str = "consumer"
    stream: str = ""
    partition: int = 0

    @property
    def key(self) -> Key:
        return (self.stream, self.partition)


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

    @property
    def keys(self) -> list[Key]:
        return [(self.stream, p) for p in range(self.partitions)]

    @property
    def streams(self) -> list[str]:
        return [self.stream]

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
            pub = Publication(b"p%d-%d" % (producer, seq), partition, stream=self.stream)
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
                    self.served.append(Served(msg.offset, msg.value, leader, time.monotonic(), stream=self.stream))
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
    """What the cluster kept, against what the workload was told and served. The INVARIANTS must be 0."""

    acked_lost: int = 0  # ack-ALL values missing from the leader's log
    acked_misplaced: int = 0  # acked values not at the offset their ack named
    divergent: int = 0  # offsets holding different committed values on different replicas
    served_then_truncated: int = 0  # served to a consumer, later gone or replaced
    duplicates_of_acked: int = 0  # values stored twice although every publish attempt had a clear answer
    phantoms: int = 0  # values stored although every attempt was certainly refused
    offsets_backwards: int = 0  # a consumer was served an offset not above the one before
    leader_acked_lost: int = 0  # ack-LEADER values lost although their leader neither crashed nor was deposed
    fenced_unreported: int = 0  # a replica fenced (by its server's log) that the cluster status never showed
    duplicates_stored: int = 0  # a message with an id stored twice (its retries must have been recognised)
    duplicate_acks_unexplained: int = 0  # acked as a duplicate, yet no earlier attempt may have stored it
    duplicates_of_unknown: int = 0  # allowed: a publish timed out or was retried
    leader_acked_lost_allowed: int = 0  # allowed: ack-LEADER values lost with their leader
    leader_acked_moved_allowed: int = 0  # allowed: ack-LEADER values whose leader was deposed, now elsewhere
    acked_lost_tolerated: int = 0  # ack-ALL values lost in a run that measures loss (power loss, fsync never)
    served_lost_tolerated: int = 0  # there: committed reads of values since lost
    offsets_reset_tolerated: int = 0  # there: a consumer served an offset below one it had (the log restarted)
    converged: bool = True  # every partition has a leader, full ISR, every replica at the leader's HW
    convergence_s: float = -1.0  # how long that took after the faults stopped
    published: int = 0
    acked: int = 0
    refused: int = 0
    unknown: int = 0
    retried: int = 0  # messages sent more than once
    retries: int = 0  # attempts beyond each message's first
    duplicate_acks: int = 0  # acks that said ``duplicate`` (a retry of a message already stored)
    served: int = 0
    stored: int = 0  # values in the leaders' logs
    acked_by_policy: dict[str, int] = field(default_factory=dict)
    none_published: int = 0  # ack NONE: nothing to check but divergence; how many were stored
    none_stored: int = 0
    fenced: list[str] = field(default_factory=list)  # every fenced replica the cluster reported
    replica_lengths: dict[str, dict[str, int]] = field(default_factory=dict)  # "stream/partition" -> server -> length
    samples: dict[str, list[str]] = field(default_factory=dict)  # a few examples of each violation
    workload_errors: list[str] = field(default_factory=list)

    INVARIANTS = (
        "acked_lost",
        "acked_misplaced",
        "divergent",
        "served_then_truncated",
        "duplicates_of_acked",
        "phantoms",
        "offsets_backwards",
        "leader_acked_lost",
        "fenced_unreported",
        "duplicates_stored",
        "duplicate_acks_unexplained",
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
            convergence_s=self.convergence_s,
            duplicates_of_unknown=self.duplicates_of_unknown,
            leader_acked_lost_allowed=self.leader_acked_lost_allowed,
            leader_acked_moved_allowed=self.leader_acked_moved_allowed,
            acked_lost_tolerated=self.acked_lost_tolerated,
            served_lost_tolerated=self.served_lost_tolerated,
            offsets_reset_tolerated=self.offsets_reset_tolerated,
            published=self.published,
            acked=self.acked,
            acked_by_policy=self.acked_by_policy,
            refused=self.refused,
            unknown=self.unknown,
            retried=self.retried,
            retries=self.retries,
            duplicate_acks=self.duplicate_acks,
            served=self.served,
            stored=self.stored,
            none_published=self.none_published,
            none_stored=self.none_stored,
            fenced=self.fenced[:20],
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
    messages = list(cluster.api(sid).Subscribe(req, timeout=60))[1:]
    return {m.offset: m.value for m in messages}


@dataclass(frozen=True)
class LeaderWindow:
    """The README's ack-LEADER promise ("What survives what") in the chaos cluster's settings (``SETTINGS``).

    An acked ack-LEADER message may be lost, or stored at another offset than acked, only if it was acked
    from ``lag`` before its leader's leadership ended (what followers had not copied yet) to ``lease`` after
    the controller replaced it (a replaced leader that had not heard; the lease stops it). The checker sees
    those moments only through the monitor, which learns of a new leader up to ``failover`` after the old
    leader's fault began (liveness timeout, election, its own poll), and ``slack`` covers its clock reads.
    """

    #: clustering.leader.lease.time: not set in the chaos settings, so half the 2 s liveness timeout.
    lease: float = 1.0
    #: clustering.replica.max.lag.time.
    lag: float = 2.0
    #: From a leader's fault to the monitor seeing its successor: liveness 2 s, election, poll 0.25 s.
    failover: float = 4.0
    slack: float = 0.5


class Deposals:
    """When leaderships ended, for the ack-LEADER promise (``LeaderWindow``).

    ``history``: (time, key, leader) each time the monitor saw a key's leader change; ``crashes``: when each
    server was killed or lost power; ``impaired``: when each fault on a server began (cut, blackhole, pause,
    disk, a NATS restart...), which may end its leaderships before anyone can tell. A lost or moved message
    is excused only by such an end of leadership of its partition in the window around its ack: a change
    of leader seen at C excuses acks from C - lag - failover to C + lease; a crash or fault at E of a server
    that led the partition around the ack excuses acks from E - lag to E + lease.
    """

    def __init__(
        self,
        crashes: dict[str, list[float]],
        history: list[tuple[float, Key, str]],
        impaired: dict[str, list[float]] | None = None,
        window: LeaderWindow | None = None,
    ) -> None:
        self.crashes = crashes
        self.history = history
        self.impaired = impaired or {}
        self.window = window or LeaderWindow()

    def excuses(self, pub: Publication) -> bool:
        ack = pub.ack
        if ack is None:
            return True
        w = self.window
        changes = [t for t, key, _leader in self.history if key == pub.key]
        if any(ack.started <= c + w.lease + w.slack and ack.ended >= c - w.lag - w.failover - w.slack for c in changes):
            return True
        ends = [
            e
            for sid in self._leaders(pub.key, ack.started - w.slack, ack.ended)
            for e in (*self.crashes.get(sid, []), *self.impaired.get(sid, []))
        ]
        return any(ack.started <= e + w.lease + w.slack and ack.ended >= e - w.lag - w.slack for e in ends)

    def _leaders(self, key: Key, start: float, end: float) -> set[str]:
        """Who led ``key`` between ``start`` and ``end``, as the monitor saw it."""
        mine = sorted((t, leader) for t, k, leader in self.history if k == key)
        before = [leader for t, leader in mine if t <= start]
        return {leader for t, leader in mine if start < t <= end} | set(before[-1:])


#: ``partition chaos0/1 is fenced: ...`` and its kin in a server's log; the time is the line's first 23 chars.
_FENCE_START = re.compile(r"partition (\S+)/(\d+) is (?:fenced|unavailable):")
_FENCE_END = re.compile(r"partition (\S+)/(\d+) (?:takes writes again|opened after all)")
#: The wrapper's first line in each life of a server: a restart ends every fence of the life before.
_RESTART = "faulty server starting"
#: A fence shorter than this may fall between two looks at the cluster status.
FENCE_MIN_SEEN_S = 2.0


def fences_in_log(text: str) -> list[tuple[Key, float, float | None]]:
    """(key, start, end or None if it never ended in this log) of every fence a server logged."""
    found: list[tuple[Key, float, float | None]] = []
    open_: dict[Key, float] = {}
    for line in text.splitlines():
        start = _FENCE_START.search(line)
        end = _FENCE_END.search(line)
        match = start or end
        if match is None and _RESTART not in line:
            continue
        try:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        if match is None:
            found.extend((key, began, at) for key, began in open_.items())
            open_.clear()
            continue
        key = (match.group(1), int(match.group(2)))
        if start is not None:
            open_.setdefault(key, at)
        elif key in open_:
            found.append((key, open_.pop(key), at))
    found.extend((key, at, None) for key, at in open_.items())
    return found


def check_fences(
    report: Report, cluster: ChaosCluster, seen: dict[tuple[str, str, int], str], streams: list[str]
) -> None:
    """Every fence a server logged that lasted ``FENCE_MIN_SEEN_S`` must have shown in the cluster status
    (``seen``: (server, stream, partition) -> reason, gathered while the run went on), and whatever is still
    fenced now must be in the status now. A fence still on after healing means the cluster did not converge."""
    for server, stream, pid in sorted(seen):
        report.fenced.append(f"{server}:{stream}/{pid}: {seen[(server, stream, pid)]}")
    for sid in cluster.ids:
        try:
            now = {(p.stream, p.partition): p for p in cluster.fenced(sid)}
        except grpc.RpcError:
            now = {}
        for (stream, pid), p in now.items():
            if stream in streams:
                report.converged = False
                report._note("still_fenced", f"{sid}:{stream}/{pid}: {p.reason}")
        log_path = cluster.servers[sid].log_path
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        for (stream, pid), start, end in fences_in_log(text):
            if stream not in streams:
                continue
            if end is None and (stream, pid) not in now and cluster.running(sid):
                # Fenced and never lifted in the log, yet not fenced now: only a restart (which starts a
                # fresh log section) may end a fence silently.
                lasted_long = True
            else:
                lasted_long = end is not None and end - start >= FENCE_MIN_SEEN_S
            if lasted_long and (sid, stream, pid) not in seen:
                report.fenced_unreported += 1
                report._note("fenced_unreported", f"{sid}:{stream}/{pid} fenced at {start:.1f} until {end}")


def check(
    cluster: ChaosCluster,
    workload: Any,
    partitions: int | None = None,
    timeout: float = 60.0,
    *,
    deposals: Deposals | None = None,
    fenced_seen: dict[tuple[str, str, int], str] | None = None,
    tolerate_loss: bool = False,
) -> tuple[Report, Logs]:
    """Wait for the healed cluster to converge, read every replica, and compare. Returns the report and logs.

    ``workload`` has ``publications``, ``served``, ``errors``, ``keys`` (its partitions) and ``streams``.
    ``tolerate_loss``: count lost ack-ALL values as ``acked_lost_tolerated`` instead of failing (a run that
    measures what power loss without fsync costs).
    """
    keys: list[Key] = list(workload.keys)
    streams: list[str] = list(workload.streams)
    report = Report(workload_errors=list(workload.errors))
    began = time.monotonic()
    try:
        for stream in streams:
            cluster.eventually(lambda s=stream: converged(cluster, s), timeout, f"{stream} to converge")  # type: ignore[misc]
        report.convergence_s = round(time.monotonic() - began, 2)
    except AssertionError:
        report.converged = False
    if fenced_seen is not None:
        check_fences(report, cluster, fenced_seen, streams)
    leaders: dict[Key, str] = {}
    for stream in streams:
        view = cluster.freshest(stream) or {}
        leaders.update({(stream, pid): p.leader for pid, p in view.items()})
    logs: Logs = {}
    for key in keys:
        logs[key] = {}
        for sid in cluster.ids:
            try:
                logs[key][sid] = read_replica(cluster, sid, *key)
            except grpc.RpcError as exc:
                report._note("unreadable", f"{sid}/{key}: {exc.code().name}")
                report.converged = False
        report.replica_lengths[f"{key[0]}/{key[1]}"] = {sid: len(log) for sid, log in logs[key].items()}
    evaluate(report, workload.publications, workload.served, logs, leaders, deposals, tolerate_loss=tolerate_loss)
    return report, logs


_POLICY_NAMES = {api_pb2.ALL: "all", api_pb2.LEADER: "leader", api_pb2.NONE: "none"}


def evaluate(
    report: Report,
    publications: list[Publication],
    served: list[Served],
    logs: Logs,
    leaders: dict[Key, str],
    deposals: Deposals | None = None,
    *,
    tolerate_loss: bool = False,
) -> None:
    """Fill ``report`` from the workload's records and the replicas' logs (partition -> server -> offset -> value).

    Ack ALL: never lost, never moved. Ack LEADER: lost only if its leader crashed or was deposed after the
    publish began (``deposals``; without it any loss is allowed and counted). Ack NONE: only counted.
    An ack holds its message at its offset; for a ``duplicate`` ack that is the original's offset, and some
    earlier attempt must have been unanswered (else what did it duplicate?). A message with an id (``msg_id``)
    is stored once however often it was resent: the run's duplicate window must outlast it (see ``run.py``).
    """
    pubs = list(publications)
    report.published = len(pubs)
    checked = [p for p in pubs if p.policy != api_pb2.NONE]
    statuses = Counter(p.status for p in checked)
    report.acked, report.refused, report.unknown = (statuses[o] for o in Outcome)
    report.retried = sum(1 for p in pubs if len(p.attempts) > 1)
    report.retries = sum(len(p.attempts) - 1 for p in pubs if p.attempts)
    report.duplicate_acks = sum(1 for p in checked if (a := p.ack) is not None and a.duplicate)
    report.served = len(served)
    report.acked_by_policy = dict(Counter(_POLICY_NAMES.get(p.policy, "?") for p in checked if p.ack is not None))

    # Divergence: any offset two replicas both hold (both below their HW) with different values.
    for key, replicas in logs.items():
        names = sorted(replicas)
        for i, x in enumerate(names):
            for y in names[i + 1 :]:
                for offset in replicas[x].keys() & replicas[y].keys():
                    if replicas[x][offset] != replicas[y][offset]:
                        report.divergent += 1
                        report._note(
                            "divergent",
                            f"{key}@{offset}: {x}={replicas[x][offset]!r} {y}={replicas[y][offset]!r}",
                        )

    # The leader's copy is the partition's log from now on.
    truth = {key: logs[key].get(leaders.get(key, ""), {}) for key in logs}
    where: dict[tuple[Key, bytes], list[int]] = defaultdict(list)
    for key, log in truth.items():
        report.stored += len(log)
        for offset, value in log.items():
            where[(key, value)].append(offset)

    for pub in pubs:
        offsets = where.get((pub.key, pub.value), [])
        if pub.policy == api_pb2.NONE:
            report.none_published += 1
            report.none_stored += bool(offsets)
            continue
        ack = pub.ack
        if ack is not None:
            if not offsets:
                example = f"{pub.value!r}@{pub.key}/{ack.offset} acked by {ack.server}"
                if pub.policy == api_pb2.LEADER and (deposals is None or deposals.excuses(pub)):
                    report.leader_acked_lost_allowed += 1
                elif pub.policy == api_pb2.LEADER:
                    report.leader_acked_lost += 1
                    report._note("leader_acked_lost", example)
                elif tolerate_loss:
                    report.acked_lost_tolerated += 1
                    report._note("acked_lost_tolerated", example)
                else:
                    report.acked_lost += 1
                    report._note("acked_lost", example)
            elif (
                ack.offset not in offsets
                and pub.policy == api_pb2.LEADER
                and (deposals is None or deposals.excuses(pub))
            ):
                report.leader_acked_moved_allowed += 1  # its leader's copy was lost; the value came back
            elif ack.offset not in offsets:
                report.acked_misplaced += 1
                report._note(
                    "acked_misplaced", f"{pub.value!r} acked at {ack.offset}, stored at {offsets}; {_attempts(pub)}"
                )
        if (
            ack is not None
            and ack.duplicate
            and not any(a.outcome is Outcome.UNKNOWN for a in pub.attempts[: pub.attempts.index(ack)])
        ):
            report.duplicate_acks_unexplained += 1
            report._note("duplicate_acks_unexplained", f"id {pub.msg_id!r} @{pub.key}: {_attempts(pub)}")
        if len(offsets) > 1:
            if pub.msg_id:
                report.duplicates_stored += 1
                report._note(
                    "duplicates_stored", f"id {pub.msg_id!r} @{pub.key} at offsets {offsets}; {_attempts(pub)}"
                )
            elif pub.uncertain:
                report.duplicates_of_unknown += 1
            else:
                report.duplicates_of_acked += 1
                report._note("duplicates_of_acked", f"{pub.value!r} at {offsets}")
        if offsets and pub.status is Outcome.REFUSED:
            report.phantoms += 1
            report._note("phantoms", f"{pub.value!r} at {offsets}: {[a.detail for a in pub.attempts]}")

    last: dict[str, int] = {}
    for s in served:
        if truth.get(s.key, {}).get(s.offset) != s.value and tolerate_loss:
            report.served_lost_tolerated += 1
        elif truth.get(s.key, {}).get(s.offset) != s.value:
            report.served_then_truncated += 1
            report._note(
                "served_then_truncated",
                f"{s.value!r}@{s.key}/{s.offset} from {s.server}, now {truth.get(s.key, {}).get(s.offset)!r}",
            )
        before = last.get(s.consumer)
        if before is not None and s.offset <= before and tolerate_loss:
            report.offsets_reset_tolerated += 1  # the log it read lost its tail everywhere and grew again
        elif before is not None and s.offset <= before:
            report.offsets_backwards += 1
            report._note("offsets_backwards", f"{s.consumer}: {s.offset} after {before} (from {s.server})")
        last[s.consumer] = s.offset


def _attempts(pub: Publication) -> str:
    """Every attempt's server, outcome, offset and times, for a failure note."""
    return ", ".join(
        f"{a.server}:{a.outcome.value}{' duplicate' if a.duplicate else ''}@{a.offset} "
        f"[{a.started:.2f}-{a.ended:.2f}] {a.detail}".rstrip()
        for a in pub.attempts
    )
