"""Prometheus metrics of one server, gathered when scraped.

Nothing here runs on the hot path. Partitions, the replicator, the Raft shell
and the NATS client keep plain counters (an int add per batch or read) and
cheap histograms (``liftlog.histogram``); ``ServerCollector.collect`` reads
them, and the current state (offsets, ISR, follower lag, Raft indexes), when
Prometheus asks. So metrics cost the publish path almost nothing whether or
not anyone scrapes; docs/operations.md lists every metric.

Per-partition series carry ``stream`` and ``partition`` labels. Past
``metrics.partitions.max`` partitions (sorted by name), the rest are summed
under ``stream="_other"``: a server hosting 50,000 partitions must not return
a million series per scrape. Offsets and lag are not summable, so they are
left out for those.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from liftlog import __version__
from liftlog.api import api_pb2
from liftlog.histogram import FSYNC_SECONDS, Histogram
from liftlog.metadata import PartitionState
from liftlog.server.clock import SYSTEM_CLOCK, Clock
from liftlog.server.partitions.acks import DROP_REASONS
from liftlog.server.rlimits import open_files_limit

if TYPE_CHECKING:
    import nats.aio.client

    from liftlog.natswire import LeanNats
    from liftlog.rpc import RpcServer
    from liftlog.server.control.cluster import MetadataService
    from liftlog.server.ops.ops_http import Check
    from liftlog.server.partitions.acks import AckRouter
    from liftlog.server.partitions.partition import Partition
    from liftlog.server.partitions.replicator import Replicator
    from liftlog.server.partitions.streams import StreamManager

__all__ = ["LoopLagMonitor", "MetricsView", "ServerCollector", "new_registry"]

OTHER = "_other"
_ACK_POLICY_NAMES: dict[int, str] = {api_pb2.LEADER: "leader", api_pb2.ALL: "all"}


class LoopLagMonitor:
    """How late the event loop runs a timer: the time every other callback waits, at worst.

    A timer every ``interval`` seconds; its lateness is the lag. One wake-up per interval costs nothing
    measurable, and a stuck loop shows in ``/healthz`` as a growing ``since_last_tick``.
    """

    def __init__(self, interval: float = 0.25, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self.lag = 0.0
        self.histogram = Histogram()
        self.last_tick = clock()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def since_last_tick(self) -> float:
        return self._clock() - self.last_tick

    async def _run(self) -> None:
        while True:
            due = self._clock() + self.interval
            await asyncio.sleep(self.interval)
            now = self._clock()
            self.lag = max(0.0, now - due)
            self.histogram.observe(self.lag)
            self.last_tick = now


@dataclass
class _Families:
    """The families of one scrape, created once and filled per partition."""

    items: dict[str, Metric] = field(default_factory=dict)

    def counter(self, name: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
        family = self._get(CounterMetricFamily, name, doc, labels)
        assert isinstance(family, CounterMetricFamily)
        return family

    def gauge(self, name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
        family = self._get(GaugeMetricFamily, name, doc, labels)
        assert isinstance(family, GaugeMetricFamily)
        return family

    def _get(self, kind: type[Metric], name: str, doc: str, labels: Iterable[str]) -> Metric:
        family = self.items.get(name)
        if family is None:
            family = self.items[name] = kind(name, doc, labels=list(labels))  # type: ignore[call-arg]
        return family


_PARTITION = ("stream", "partition")
#: A partition's counters: (metric name without _total, help, Partition attribute). With the gauges below,
#: what a partition past metrics.partitions.max adds to the ``_other`` series.
_PARTITION_COUNTERS = (
    ("liftlog_partition_messages_in", "Messages written as leader", "messages_in"),
    ("liftlog_partition_bytes_in", "Bytes of batches written as leader, as stored", "bytes_in"),
    ("liftlog_partition_messages_out", "Offsets delivered to subscribers and batch fetches", "messages_out"),
    ("liftlog_partition_bytes_out", "Bytes sent to subscribers and batch fetches", "bytes_out"),
    ("liftlog_partition_messages_replicated", "Messages copied from the leader as a follower", "messages_replicated"),
    ("liftlog_partition_bytes_replicated", "Bytes copied from the leader as a follower", "bytes_replicated"),
    ("liftlog_partition_fetches_served", "Followers' replication fetches answered as leader", "fetches_served"),
    ("liftlog_partition_fetch_bytes_served", "Bytes of batches sent to followers as leader", "fetch_bytes_served"),
    (
        "liftlog_partition_duplicates",
        "Messages answered as duplicates of one stored within the duplicate window (message ids)",
        "duplicates_acked",
    ),
    (
        "liftlog_partition_duplicate_ids_evicted",
        "Message ids forgotten before their window passed (streams.duplicate.max.ids)",
        "duplicate_ids_evicted",
    ),
)
_PARTITION_GAUGES = (
    ("liftlog_partition_subscriptions", "Subscriptions open on this partition"),
    ("liftlog_partition_segments", "Segments of the log"),
    ("liftlog_partition_size_bytes", "Bytes of the log's segments"),
    ("liftlog_partition_duplicate_ids", "Message ids the leader remembers for its duplicate window"),
)


def _summable(part: Partition) -> list[float]:
    """The values of ``_PARTITION_COUNTERS`` then ``_PARTITION_GAUGES`` of one partition."""
    log = part.log
    values: list[float] = [getattr(part, attribute) for _name, _doc, attribute in _PARTITION_COUNTERS]
    values.append(part.subscribers)
    values.append(len(log.segments) if log is not None else 0)
    values.append(log.size_bytes if log is not None else 0)
    values.append(len(part.duplicates))
    return values


def _histogram(name: str, doc: str, histograms: Iterable[tuple[list[str], Histogram]], labels: list[str]) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for values, h in histograms:
        buckets, _count, total = h.cumulative()
        family.add_metric(values, buckets, total)
    return family


class MetricsView(Protocol):
    """What the collector reads of a server (``Server`` is one): its parts, each None until started."""

    @property
    def server_id(self) -> str: ...
    @property
    def streams(self) -> StreamManager | None: ...
    @property
    def cluster(self) -> MetadataService | None: ...
    @property
    def replicator(self) -> Replicator | None: ...
    @property
    def ack_router(self) -> AckRouter | None: ...
    @property
    def rpc_server(self) -> RpcServer | None: ...
    @property
    def nats_connection(self) -> nats.aio.client.Client | None: ...
    @property
    def lean_nats_connection(self) -> LeanNats | None: ...
    @property
    def nats_slow_consumer_drops(self) -> int: ...
    @property
    def signs_internal_messages(self) -> bool: ...
    def readiness(self) -> Check: ...


class ServerCollector(Collector):
    """Everything ``/metrics`` reports about one server (see the module docstring)."""

    def __init__(
        self,
        server: MetricsView,
        loop_lag: LoopLagMonitor,
        partitions_max: int,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._server = server
        self._clock = clock.wall_ns
        self._loop_lag = loop_lag
        self._partitions_max = partitions_max

    def collect(self) -> Iterator[Metric]:
        server = self._server
        yield from self._server_info(server)
        if server.streams is not None:
            yield from self._partitions(server)
        if server.cluster is not None:
            yield from self._metadata(server)
        yield from self._nats(server)
        yield from self._latencies(server)
        yield from self._resources(server)

    # -- families ----------------------------------------------------------

    def _server_info(self, server: MetricsView) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "liftlog_build_info", "Always 1: this server's id and version", labels=["server_id", "version"]
        )
        info.add_metric([server.server_id, __version__], 1)
        yield info
        ready = GaugeMetricFamily("liftlog_ready", "1 when /readyz answers 200 (metadata caught up, NATS, partitions)")
        ready.add_metric([], 1 if server.readiness().ok else 0)
        yield ready
        yield _gauge(
            "liftlog_cluster_auth_insecure",
            "1 when this server signs nothing (clustering.auth.insecure): anyone on its NATS can act as a server",
            0 if server.signs_internal_messages else 1,
        )

    def _partitions(self, server: MetricsView) -> Iterator[Metric]:
        streams = server.streams
        assert streams is not None
        fam = _Families()
        parts = sorted(streams.partitions.items())
        labelled, summed = parts[: self._partitions_max], parts[self._partitions_max :]
        led = under_replicated = under_min_isr = fenced = followers = 0
        for (name, pid), part in labelled:
            self._partition(fam, [name, str(pid)], part)
        if summed:
            totals = [sum(column) for column in zip(*(_summable(part) for _key, part in summed), strict=True)]
            self._add_summable(fam, [OTHER, OTHER], totals)
        for _key, part in parts:
            if part.leader is not None:
                led += 1
                isr = len(part.leader.isr)
                under_replicated += isr < len(part.meta.replicas)
                under_min_isr += isr < part.options.min_isr
            elif part.follower is not None:
                followers += 1
            fenced += part.fenced is not None
        yield from fam.items.values()
        roles = GaugeMetricFamily("liftlog_partitions", "Partitions this server hosts, by role", labels=["role"])
        roles.add_metric(["leader"], led)
        roles.add_metric(["follower"], followers)
        roles.add_metric(["other"], len(parts) - led - followers)
        yield roles
        yield _gauge(
            "liftlog_partitions_under_replicated",
            "Partitions led here whose ISR is short of replicas",
            under_replicated,
        )
        yield _gauge(
            "liftlog_partitions_under_min_isr",
            "Partitions led here with fewer in-sync replicas than min.insync.replicas (ack-ALL publishes refused)",
            under_min_isr,
        )
        yield _counter(
            "liftlog_leader_lease_lapses",
            "Times the leader lease (clustering.leader.lease.time) ran out while this server led partitions: no "
            "answer from the metadata leader in time, so they wrote and acknowledged nothing until renewed",
            streams.lease_lapses,
        )
        yield _counter(
            "liftlog_leader_lease_renewals",
            "Renewals of the leader lease (metadata read barriers)",
            streams.lease_renewals,
        )
        yield _counter(
            "liftlog_leader_lease_refused_messages",
            "Messages not written, and LEADER acks not sent, because the leader lease had run out (hosted partitions)",
            sum(part.lease_refused for _key, part in parts),
        )
        yield _gauge(
            "liftlog_leader_lease_held_messages",
            "Messages that arrived after the leader lease ran out, held to be written if it is renewed in time",
            sum(part.lease_held for _key, part in parts),
        )
        yield _gauge(
            "liftlog_leader_lease_remaining_seconds",
            "How long the leader lease still holds without a renewal (0: ran out)",
            streams.lease_left() / 1e9,
        )
        yield _gauge(
            "liftlog_partitions_fenced", "Partitions hosted here whose log refuses writes after a failed write", fenced
        )

    @staticmethod
    def _add_summable(fam: _Families, labels: list[str], values: list[float]) -> None:
        counters = len(_PARTITION_COUNTERS)
        for (name, doc, _attribute), value in zip(_PARTITION_COUNTERS, values[:counters], strict=True):
            fam.counter(name, doc, _PARTITION).add_metric(labels, value)
        for (name, doc), value in zip(_PARTITION_GAUGES, values[counters:], strict=True):
            fam.gauge(name, doc, _PARTITION).add_metric(labels, value)

    def _partition(self, fam: _Families, labels: list[str], part: Partition) -> None:
        """A labelled partition: its summable values, then offsets, role and replication state."""
        self._add_summable(fam, labels, _summable(part))
        log = part.log
        fam.gauge("liftlog_partition_high_watermark", "Newest committed offset (-1: none)", _PARTITION).add_metric(
            labels, part.high_watermark
        )
        fam.gauge(
            "liftlog_partition_log_end_offset", "Offset the next message gets (newest offset + 1)", _PARTITION
        ).add_metric(labels, log.log_end_offset if log is not None else part.newest_offset + 1)
        if log is not None:
            fam.gauge("liftlog_partition_log_start_offset", "Oldest offset retention kept", _PARTITION).add_metric(
                labels, log.log_start_offset
            )
        fam.gauge("liftlog_partition_leader", "1 where this server leads the partition", _PARTITION).add_metric(
            labels, 1 if part.leader is not None else 0
        )
        fam.gauge(
            "liftlog_partition_fenced", "1 while the log refuses writes after a failed write", _PARTITION
        ).add_metric(labels, 1 if part.fenced is not None else 0)
        core = part.leader
        if core is None:
            return
        fam.gauge(
            "liftlog_partition_replicas", "Replicas in the metadata (reported by the leader)", _PARTITION
        ).add_metric(labels, len(part.meta.replicas))
        fam.gauge(
            "liftlog_partition_isr_size", "In-sync replicas, the leader included (reported by the leader)", _PARTITION
        ).add_metric(labels, len(core.isr))
        lag_labels = [*_PARTITION, "follower"]
        now = self._clock()
        leo = log.log_end_offset if log is not None else core.leo
        for follower, progress in sorted(core.followers.items()):  # every replica but the leader
            fam.gauge(
                "liftlog_partition_follower_lag_messages",
                "Messages the follower's log is behind the leader's",
                lag_labels,
            ).add_metric([*labels, follower], max(0, leo - progress.leo))
            fam.gauge(
                "liftlog_partition_follower_lag_seconds",
                "Seconds since the follower was last caught up with the leader (ISR removal past replica.max.lag.time)",
                lag_labels,
            ).add_metric([*labels, follower], 0 if progress.leo >= leo else max(0, now - progress.caught_up_at) / 1e9)

    def _metadata(self, server: MetricsView) -> Iterator[Metric]:
        cluster = server.cluster
        assert cluster is not None
        raft = cluster.raft
        node = raft.node
        yield _gauge("liftlog_raft_term", "Current term of the metadata Raft group", node.term if node else 0)
        yield _gauge(
            "liftlog_raft_commit_index", "Newest committed index of the metadata log", node.commit_index if node else 0
        )
        yield _gauge(
            "liftlog_raft_applied_index",
            "Newest index applied to this server's metadata",
            node.applied_index if node else 0,
        )
        yield _gauge(
            "liftlog_controller",
            "1 while this server is the controller (the metadata group's leader)",
            1 if raft.is_leader else 0,
        )
        yield _gauge(
            "liftlog_raft_leader_known", "1 while this server knows a metadata leader", 1 if cluster.leader_id else 0
        )
        yield _counter("liftlog_raft_elections", "Elections this server started as a candidate", raft.stats.elections)
        yield _counter(
            "liftlog_raft_leader_changes",
            "Times this server learnt of a new metadata leader",
            raft.stats.leader_changes,
        )
        yield _histogram(
            "liftlog_controller_failover_seconds",
            "Time without a known controller, from losing the old one to knowing the new one, as this server saw it",
            [([], raft.stats.leaderless)],
            [],
        )
        metadata = cluster.metadata
        states = {s.value: 0 for s in PartitionState}
        total = 0
        for stream in metadata.streams.values():
            for p in stream.partitions.values():
                states[p.state.value] += 1
                total += 1
        by_state = GaugeMetricFamily(
            "liftlog_cluster_partitions",
            "Partitions of the cluster by leader-election state (this server's metadata)",
            labels=["state"],
        )
        for state, count in states.items():
            by_state.add_metric([state], count)
        yield by_state
        yield _gauge(
            "liftlog_cluster_streams", "Streams of the cluster (this server's metadata)", len(metadata.streams)
        )
        servers = GaugeMetricFamily(
            "liftlog_cluster_servers", "Servers of the cluster by liveness (this server's metadata)", labels=["alive"]
        )
        alive = sum(1 for s in metadata.servers.values() if s.alive)
        servers.add_metric(["true"], alive)
        servers.add_metric(["false"], len(metadata.servers) - alive)
        yield servers

    def _nats(self, server: MetricsView) -> Iterator[Metric]:
        nc = server.nats_connection
        lean = server.lean_nats_connection
        stats: dict[str, int] = dict(nc.stats) if nc is not None else {}
        connected = nc is not None and nc.is_connected
        if lean is not None:  # the hot path's own connection: intake and clients' publishes
            for key, value in lean.stats.items():
                stats[key] = stats.get(key, 0) + value
            connected = connected and lean.is_connected
        yield _gauge("liftlog_nats_connected", "1 while connected to NATS", 1 if connected else 0)
        yield _counter("liftlog_nats_reconnects", "Reconnections to NATS", stats.get("reconnects", 0))
        yield _counter(
            "liftlog_nats_messages_received",
            "Messages received from NATS (intake, replication, acks)",
            stats.get("in_msgs", 0),
        )
        yield _counter("liftlog_nats_messages_sent", "Messages published to NATS", stats.get("out_msgs", 0))
        yield _counter("liftlog_nats_received_bytes", "Payload bytes received from NATS", stats.get("in_bytes", 0))
        yield _counter("liftlog_nats_sent_bytes", "Payload bytes published to NATS", stats.get("out_bytes", 0))
        acks = server.ack_router
        dropped = CounterMetricFamily(
            "liftlog_acks_dropped",
            "Acks not delivered, by reason: no_waiter (late or unknown), other_stream (another stream on the "
            "subject acked it too), mismatch (a waiting call's id on an ack for another subject or policy), "
            "unsigned_route (to a server inbox without a valid route signature), refused_inbox (a client-named "
            "inbox the server may not publish to), foreign_leader (from another server, for a partition led here when "
            "the call published: a replaced leader that had not learned it yet)",
            labels=["reason"],
        )
        for reason in DROP_REASONS:
            dropped.add_metric([reason], acks.dropped[reason] if acks is not None else 0)
        yield dropped
        yield _counter(
            "liftlog_nats_slow_consumer_drops",
            "Messages the NATS client dropped because a subscription's queue was full (lost intake)",
            server.nats_slow_consumer_drops,
        )

    def _latencies(self, server: MetricsView) -> Iterator[Metric]:
        if server.streams is not None:
            yield _histogram(
                "liftlog_publish_ack_latency_seconds",
                "From a message's write on the leader to its ack: the group fsync (leader), the ISR's commit (all)",
                [([_ACK_POLICY_NAMES[policy]], h) for policy, h in server.streams.ack_latency.items()],
                ["ack_policy"],
            )
        yield _histogram(
            "liftlog_log_fsync_seconds", "fsync of a partition's log file (process-wide)", [([], FSYNC_SECONDS)], []
        )
        yield _gauge(
            "liftlog_event_loop_lag_last_seconds", "Lateness of the last event-loop timer tick", self._loop_lag.lag
        )
        yield _histogram(
            "liftlog_event_loop_lag_seconds",
            "Lateness of event-loop timer ticks",
            [([], self._loop_lag.histogram)],
            [],
        )
        replicator = server.replicator
        if replicator is not None:
            yield _counter(
                "liftlog_replication_fetches", "Replication fetches this server made as a follower", replicator.fetches
            )
            yield _counter(
                "liftlog_replication_fetched_bytes",
                "Bytes of the answers to this server's replication fetches",
                replicator.fetched_bytes,
            )

    def _resources(self, server: MetricsView) -> Iterator[Metric]:
        limit = open_files_limit()
        yield _gauge("liftlog_open_files_limit", "The process's open-file limit (RLIMIT_NOFILE; 0: unlimited)", limit)
        if server.streams is not None:
            budget = server.streams.descriptors
            yield _gauge("liftlog_segment_files_open", "Descriptors held by sealed segments", budget.open_count)
            yield _gauge("liftlog_segment_files_budget", "Most descriptors sealed segments may hold", budget.limit)
        rpc = server.rpc_server
        if rpc is not None:
            yield _gauge(
                "liftlog_rpc_connections", "gRPC connections open (rpc.max.connections caps them)", rpc.connections
            )
            yield _counter(
                "liftlog_rpc_connections_refused",
                "gRPC connections closed on arrival because rpc.max.connections were open",
                rpc.refused_connections,
            )
            yield _counter(
                "liftlog_rpc_connections_cooled",
                "gRPC connections closed on arrival because their address was closed for abuse moments before "
                "(rpc.abuse.cooldown)",
                rpc.cooled_connections,
            )
            yield _counter(
                "liftlog_rpc_streams_reset_sent",
                "gRPC streams this server reset for their clients' protocol errors (policed with the clients' own "
                "resets: a flood ends the connection with ENHANCE_YOUR_CALM)",
                rpc.resets_sent,
            )
            if rpc.budget is not None:
                yield _gauge(
                    "liftlog_rpc_buffer_budget_used_bytes",
                    "Bytes gRPC connections hold or let their clients send beyond 64 KiB each",
                    rpc.budget.used,
                )
                yield _gauge(
                    "liftlog_rpc_buffer_budget_bytes", "rpc.max.buffered.bytes: the most they may", rpc.budget.limit
                )
                yield _counter(
                    "liftlog_rpc_buffer_budget_withheld",
                    "Window updates held back because the buffer budget could not cover them (clients waited)",
                    rpc.budget.withheld,
                )
                yield _counter(
                    "liftlog_rpc_connections_stalled",
                    "gRPC connections closed for holding buffer budget without progress while others waited",
                    rpc.stalled_connections,
                )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def new_registry(collector: ServerCollector) -> CollectorRegistry:
    """A registry of this server's metrics and the process's (CPU, memory, open descriptors against the limit)."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    registry.register(collector)
    return registry
