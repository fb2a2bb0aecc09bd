"""Limits on what a CreateStream may ask for, checked by the controller before anything is committed.

Every partition replica costs its server open files (a ``.log``, an ``.index``
and a ``.timeindex`` for the active segment), a NATS subscription on the
leader and a share of the reconcile work at start-up. A stream of 100,000
partitions used to be committed and then exhaust the open-file limit of
every server, which could no longer serve other streams or restart. These
limits refuse such a request up front, as INVALID_ARGUMENT naming the value,
the limit and the setting that changes it.

Pure: the limits arrive as a :class:`StreamLimits` built from the server's
configuration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .model import InvalidStreamError, StreamSettings

__all__ = [
    "DEFAULT_MAX_PARTITIONS",
    "DEFAULT_MAX_PARTITIONS_PER_SERVER",
    "DEFAULT_MIN_SEGMENT_BYTES",
    "StreamLimits",
    "check_partition_count",
    "check_replicas_per_server",
    "check_settings",
]

#: streams.max.partitions: Liftbridge streams rarely need more than a few dozen partitions; 1024 leaves
#: room for wide fan-out while one request cannot open tens of thousands of logs.
DEFAULT_MAX_PARTITIONS = 1024
#: clustering.max.partitions.per.server: each replica keeps at least three files open (the active
#: segment's .log, .index and .timeindex), so 4096 replicas need about 12,300 descriptors plus older
#: segments, sockets and NATS. That fits the hard open-file limits of current systemd (524,288) and Docker
#: (1,048,576) defaults, which the server raises its soft limit to, with room to spare.
DEFAULT_MAX_PARTITIONS_PER_SERVER = 4096
#: streams.segment.max.bytes.min: Kafka accepts segments of 14 bytes, but a segment rolls on every message
#: once it is smaller than one, and each one keeps three files open: with segmentMaxBytes=1, 500 publishes
#: opened 1,500 files. 64 KiB bounds that to one segment per 64 KiB written while still letting small
#: deployments and tests exercise rolling and retention.
DEFAULT_MIN_SEGMENT_BYTES = 64 << 10


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """What one CreateStream may ask for (the server's configuration; see the setting names below)."""

    #: streams.max.partitions
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    #: clustering.max.partitions.per.server: partition replicas one server may host, all streams together.
    max_partitions_per_server: int = DEFAULT_MAX_PARTITIONS_PER_SERVER
    #: streams.segment.max.bytes.min: the smallest segment size a stream may set.
    min_segment_bytes: int = DEFAULT_MIN_SEGMENT_BYTES


def check_partition_count(partitions: int, limits: StreamLimits) -> None:
    if partitions > limits.max_partitions:
        raise InvalidStreamError(
            f"partitions {partitions} is more than streams.max.partitions ({limits.max_partitions}) allows: "
            "use fewer partitions, or raise streams.max.partitions on the servers"
        )


def check_settings(settings: StreamSettings, limits: StreamLimits) -> None:
    """Per-stream overrides that cannot be used: negative numbers, segments below the minimum."""
    for name, value in settings.to_dict().items():
        if not isinstance(value, bool) and value < 0:
            raise InvalidStreamError(f"{name} must not be negative, got {value}")
    segment = settings.segment_max_bytes
    if segment is not None and segment < limits.min_segment_bytes:
        raise InvalidStreamError(
            f"segmentMaxBytes {segment} is smaller than streams.segment.max.bytes.min ({limits.min_segment_bytes}): "
            "every segment keeps files open and tiny segments exhaust the open-file limit; use a larger size, "
            "or lower streams.segment.max.bytes.min on the servers"
        )


def check_replicas_per_server(
    name: str, placement: Sequence[Sequence[str]], existing: Mapping[str, int], limits: StreamLimits
) -> None:
    """Refuse a placement that would put more replicas on a server than it may host.

    ``existing`` counts the replicas each server already hosts for other streams.
    """
    adding: dict[str, int] = {}
    for replicas in placement:
        for server in replicas:
            adding[server] = adding.get(server, 0) + 1
    limit = limits.max_partitions_per_server
    over = sorted(
        (existing.get(server, 0) + count, server, count)
        for server, count in adding.items()
        if existing.get(server, 0) + count > limit
    )
    if over:
        total, server, count = over[-1]
        raise InvalidStreamError(
            f"stream {name!r} would put {total} partition replicas on server {server!r} "
            f"({total - count} it already hosts + {count} of this stream), more than "
            f"clustering.max.partitions.per.server ({limit}) allows: use fewer partitions or a lower "
            "replication factor, add servers, or raise clustering.max.partitions.per.server"
        )
