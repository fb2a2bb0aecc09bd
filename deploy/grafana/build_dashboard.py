"""Writes liftlog-dashboard.json, the Grafana dashboard over liftlog's metrics (docs/operations.md).

The JSON is committed; edit this file and run it (``python deploy/grafana/build_dashboard.py``) rather
than editing the JSON, so panels stay consistent. tests/deploy checks the two agree and that every
query names metrics a server exports.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("liftlog-dashboard.json")
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
STREAM = 'stream=~"$stream"'


def target(expr: str, legend: str = "", instant: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"datasource": DS, "expr": expr, "legendFormat": legend or "__auto", "refId": ""}
    if instant:
        out["instant"] = True
        out["range"] = False
    return out


def panel(
    kind: str,
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    grid: tuple[int, int, int, int],
    unit: str = "short",
    **extra: Any,
) -> dict[str, Any]:
    for ref, t in zip("ABCDEFGH", targets, strict=False):
        t["refId"] = ref
    x, y, w, h = grid
    out: dict[str, Any] = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
    }
    if kind == "timeseries":
        out["options"] = {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}}
    out.update(extra)
    return out


def stat(title: str, description: str, expr: str, grid: tuple[int, int, int, int], bad_above: float) -> dict[str, Any]:
    """A single number, red once it passes ``bad_above``."""
    return panel(
        "stat",
        title,
        description,
        [target(expr, instant=True)],
        grid,
        fieldConfig={
            "defaults": {
                "unit": "short",
                "thresholds": {
                    "mode": "absolute",
                    "steps": [{"color": "green", "value": None}, {"color": "red", "value": bad_above + 0.5}],
                },
            },
            "overrides": [],
        },
        options={"colorMode": "background", "graphMode": "none", "reduceOptions": {"calcs": ["lastNotNull"]}},
    )


def row(title: str, y: int) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}}


def quantiles(metric: str, by: str, legend: str) -> list[dict[str, Any]]:
    return [
        target(
            f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket[{RATE}])))",
            f"p{int(q * 100)} {legend}",
        )
        for q in (0.5, 0.99)
    ]


def led(metric: str) -> str:
    """``metric`` per partition as its leader reports it (followers' copies may lag)."""
    leader = "liftlog_partition_leader == 1"
    return f"max by (stream, partition) ({metric}{{{STREAM}}} and on(stream, partition, instance) {leader})"


def panels() -> list[dict[str, Any]]:
    return [
        row("Cluster health", 0),
        stat(
            "Servers not ready",
            "Servers scraped whose /readyz fails (liftlog_ready 0): no metadata leader, NATS down, or a hosted "
            "partition not open.",
            "count(liftlog_build_info) - sum(liftlog_ready)",
            (0, 1, 4, 4),
            0,
        ),
        stat(
            "Controllers",
            "Servers that are the metadata group's leader: 1 when healthy, 0 during an election.",
            "sum(liftlog_controller)",
            (4, 1, 4, 4),
            1,
        ),
        stat(
            "Offline partitions",
            "Partitions with no leader (no in-sync replica alive), by the metadata of the servers scraped.",
            'max(liftlog_cluster_partitions{state="offline"})',
            (8, 1, 4, 4),
            0,
        ),
        stat(
            "Under-replicated",
            "Partitions whose ISR is short of their replicas, counted by their leaders.",
            "sum(liftlog_partitions_under_replicated)",
            (12, 1, 4, 4),
            0,
        ),
        stat(
            "Under min ISR",
            "Partitions with fewer in-sync replicas than min.insync.replicas: their ack-ALL publishes are refused.",
            "sum(liftlog_partitions_under_min_isr)",
            (16, 1, 4, 4),
            0,
        ),
        stat(
            "Fenced replicas",
            "Replicas whose log refuses writes after a failed write (a full or failing disk).",
            "sum(liftlog_partitions_fenced)",
            (20, 1, 4, 4),
            0,
        ),
        row("Throughput", 5),
        panel(
            "timeseries",
            "Messages in per second, by stream",
            "Messages written by partition leaders (publishes).",
            [target(f"sum by (stream) (rate(liftlog_partition_messages_in_total{{{STREAM}}}[{RATE}]))", "{{stream}}")],
            (0, 6, 8, 8),
            "mps",
        ),
        panel(
            "timeseries",
            "Messages out per second, by stream",
            "Offsets delivered to subscribers and batch fetches (the Spark source), on every server.",
            [target(f"sum by (stream) (rate(liftlog_partition_messages_out_total{{{STREAM}}}[{RATE}]))", "{{stream}}")],
            (8, 6, 8, 8),
            "mps",
        ),
        panel(
            "timeseries",
            "Bytes per second",
            "Stored bytes written by leaders, sent to readers, and copied by followers.",
            [
                target(f"sum(rate(liftlog_partition_bytes_in_total{{{STREAM}}}[{RATE}]))", "in"),
                target(f"sum(rate(liftlog_partition_bytes_out_total{{{STREAM}}}[{RATE}]))", "out"),
                target(f"sum(rate(liftlog_partition_bytes_replicated_total{{{STREAM}}}[{RATE}]))", "replicated"),
            ],
            (16, 6, 8, 8),
            "Bps",
        ),
        row("Latency", 14),
        panel(
            "timeseries",
            "Write to ack, by ack policy",
            "From a message's write on the leader to its ack: the group fsync (leader, with fsync always) or the "
            "commit by the ISR (all). Client round trips add the network and NATS to this.",
            quantiles("liftlog_publish_ack_latency_seconds", "ack_policy", "{{ack_policy}}"),
            (0, 15, 8, 8),
            "s",
        ),
        panel(
            "timeseries",
            "fsync of log files",
            "Each fsync of a partition's log file. Slow disks show here first.",
            quantiles("liftlog_log_fsync_seconds", "instance", "{{instance}}"),
            (8, 15, 8, 8),
            "s",
        ),
        panel(
            "timeseries",
            "Event-loop lag",
            "How late the event loop runs a 250 ms timer: what every request waits at worst.",
            quantiles("liftlog_event_loop_lag_seconds", "instance", "{{instance}}"),
            (16, 15, 8, 8),
            "s",
        ),
        row("Replication", 23),
        panel(
            "timeseries",
            "Follower lag (messages)",
            "Messages a follower's log is behind its leader's, per partition and follower.",
            [
                target(
                    f"max by (stream, partition, follower) (liftlog_partition_follower_lag_messages{{{STREAM}}})",
                    "{{stream}}/{{partition}} → {{follower}}",
                )
            ],
            (0, 24, 8, 8),
            "short",
        ),
        panel(
            "timeseries",
            "Follower lag (seconds since caught up)",
            "Past clustering.replica.max.lag.time the follower leaves the ISR.",
            [
                target(
                    f"max by (stream, partition, follower) (liftlog_partition_follower_lag_seconds{{{STREAM}}})",
                    "{{stream}}/{{partition}} → {{follower}}",
                )
            ],
            (8, 24, 8, 8),
            "s",
        ),
        panel(
            "timeseries",
            "Replication fetches",
            "Fetches each follower makes of its leaders, and the bytes of their answers.",
            [
                target(
                    f"sum by (instance) (rate(liftlog_replication_fetches_total[{RATE}]))", "fetches/s {{instance}}"
                ),
                target(
                    f"sum by (instance) (rate(liftlog_replication_fetched_bytes_total[{RATE}]))",
                    "bytes/s {{instance}}",
                ),
            ],
            (16, 24, 8, 8),
            "short",
        ),
        row("Partitions", 32),
        panel(
            "table",
            "Partitions led",
            "Per partition, from its leader: high watermark, log end, ISR size against replicas, subscriptions.",
            [
                target(
                    led("liftlog_partition_high_watermark"),
                    "hw",
                    instant=True,
                ),
                target(
                    led("liftlog_partition_log_end_offset"),
                    "leo",
                    instant=True,
                ),
                target(f"max by (stream, partition) (liftlog_partition_isr_size{{{STREAM}}})", "isr", instant=True),
                target(
                    f"max by (stream, partition) (liftlog_partition_replicas{{{STREAM}}})", "replicas", instant=True
                ),
                target(
                    f"sum by (stream, partition) (liftlog_partition_subscriptions{{{STREAM}}})", "subs", instant=True
                ),
            ],
            (0, 33, 12, 9),
            transformations=[{"id": "merge", "options": {}}],
        ),
        panel(
            "timeseries",
            "Log size by stream (one replica)",
            "Bytes of the segments of each stream's partitions, from their largest replica.",
            [
                target(
                    f"sum by (stream) (max by (stream, partition) (liftlog_partition_size_bytes{{{STREAM}}}))",
                    "{{stream}}",
                )
            ],
            (12, 33, 6, 9),
            "bytes",
        ),
        panel(
            "timeseries",
            "Subscriptions open, by stream",
            "Subscribe calls open on partitions of each stream, over every server.",
            [target(f"sum by (stream) (liftlog_partition_subscriptions{{{STREAM}}})", "{{stream}}")],
            (18, 33, 6, 9),
            "short",
        ),
        row("Metadata (Raft) and NATS", 42),
        panel(
            "timeseries",
            "Raft commit and applied index",
            "A server whose applied index falls behind the commit index is not ready.",
            [
                target("max(liftlog_raft_commit_index)", "commit"),
                target("liftlog_raft_applied_index", "applied {{instance}}"),
            ],
            (0, 43, 8, 8),
            "short",
        ),
        panel(
            "timeseries",
            "Elections, leader changes and failovers",
            "Per hour: elections started, new leaders learnt, and the time without a controller per failover.",
            [
                target("sum(increase(liftlog_raft_elections_total[1h]))", "elections"),
                target("max(increase(liftlog_raft_leader_changes_total[1h]))", "leader changes"),
                target(
                    "max(increase(liftlog_controller_failover_seconds_sum[1h]) / "
                    "clamp_min(increase(liftlog_controller_failover_seconds_count[1h]), 1))",
                    "mean failover (s)",
                ),
            ],
            (8, 43, 8, 8),
            "short",
        ),
        panel(
            "timeseries",
            "NATS",
            "Connection state, reconnects and messages the NATS client dropped for a full queue (lost intake).",
            [
                target("min(liftlog_nats_connected)", "connected (min)"),
                target(f"sum(increase(liftlog_nats_reconnects_total[{RATE}]))", "reconnects"),
                target(f"sum(increase(liftlog_nats_slow_consumer_drops_total[{RATE}]))", "slow-consumer drops"),
            ],
            (16, 43, 8, 8),
            "short",
        ),
        row("Process", 51),
        panel(
            "timeseries",
            "CPU",
            "CPU seconds per second of each server process (1.0: one core).",
            [target(f'rate(process_cpu_seconds_total{{job=~"liftlog.*"}}[{RATE}])', "{{instance}}")],
            (0, 52, 8, 8),
            "percentunit",
        ),
        panel(
            "timeseries",
            "Memory",
            "Resident memory of each server process.",
            [target('process_resident_memory_bytes{job=~"liftlog.*"}', "{{instance}}")],
            (8, 52, 8, 8),
            "bytes",
        ),
        panel(
            "timeseries",
            "Open files against the limit",
            "Open descriptors of each server over its RLIMIT_NOFILE; sealed segments share a budget of their own.",
            [
                target('process_open_fds{job=~"liftlog.*"} / process_max_fds{job=~"liftlog.*"}', "{{instance}}"),
                target("liftlog_segment_files_open / liftlog_segment_files_budget", "segment budget {{instance}}"),
            ],
            (16, 52, 8, 8),
            "percentunit",
        ),
    ]


def dashboard() -> dict[str, Any]:
    return {
        "uid": "liftlog-overview",
        "title": "liftlog",
        "description": "A liftlog cluster: health, throughput, latency, replication, metadata, processes.",
        "tags": ["liftlog", "nats"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {
                    "name": "stream",
                    "type": "query",
                    "datasource": DS,
                    "query": {"query": "label_values(liftlog_partition_messages_in_total, stream)", "refId": "streams"},
                    "definition": "label_values(liftlog_partition_messages_in_total, stream)",
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "current": {"text": "All", "value": "$__all"},
                    "refresh": 2,
                },
            ]
        },
        "panels": [{"id": i, **p} for i, p in enumerate(panels(), 1)],
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    if "--check" in sys.argv:
        sys.exit(0 if OUT.read_text() == render() else 1)
    OUT.write_text(render())
    print(f"wrote {OUT}")
