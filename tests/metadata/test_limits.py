"""The controller refuses CreateStream requests beyond the configured limits, naming value, limit and setting."""

from __future__ import annotations

from typing import Any

import pytest

from liftlog.metadata.controller import CreateStreamRequest, plan_create_stream
from liftlog.metadata.limits import (
    DEFAULT_MAX_PARTITIONS,
    DEFAULT_MAX_PARTITIONS_PER_SERVER,
    DEFAULT_MIN_SEGMENT_BYTES,
    StreamLimits,
)
from liftlog.metadata.model import InvalidStreamError, Metadata, RegisterServer, ServerMeta, StreamSettings

NOW = 1_700_000_000_000_000_000
NS = "liftbridge-default"


def cluster(*ids: str) -> Metadata:
    meta = Metadata()
    for i, id_ in enumerate(ids):
        meta.apply(RegisterServer(ServerMeta(id_, f"host-{id_}", 9000 + i), 10))
    return meta


def plan(meta: Metadata, name: str, limits: StreamLimits | None = None, **kw: Any) -> None:
    req = CreateStreamRequest(name, name, **kw)
    extra: dict[str, Any] = {"limits": limits} if limits else {}
    op = plan_create_stream(meta, req, NOW, namespace=NS, **extra)
    meta.apply(op)


def test_the_defaults_are_what_the_settings_document() -> None:
    assert StreamLimits() == StreamLimits(1024, 4096, 64 << 10)
    assert (DEFAULT_MAX_PARTITIONS, DEFAULT_MAX_PARTITIONS_PER_SERVER, DEFAULT_MIN_SEGMENT_BYTES) == (
        1024,
        4096,
        65536,
    )


def test_partitions_above_the_default_limit_are_refused_naming_value_limit_and_setting() -> None:
    meta = cluster("a")
    with pytest.raises(InvalidStreamError) as err:
        plan(meta, "huge", partitions=100_000)
    message = str(err.value)
    assert "partitions 100000" in message
    assert "streams.max.partitions (1024)" in message
    assert "huge" not in meta.streams


def test_partitions_up_to_the_limit_are_accepted() -> None:
    meta = cluster("a", "b")
    plan(meta, "wide", StreamLimits(max_partitions=8), partitions=8)
    assert len(meta.streams["wide"].partitions) == 8
    with pytest.raises(InvalidStreamError, match=r"partitions 9 is more than streams\.max\.partitions \(8\)"):
        plan(meta, "wider", StreamLimits(max_partitions=8), partitions=9)


def test_replicas_per_server_count_existing_streams() -> None:
    meta = cluster("a", "b")
    limits = StreamLimits(max_partitions_per_server=10)
    plan(meta, "first", limits, partitions=8, replication_factor=2)  # 8 replicas on each server
    with pytest.raises(InvalidStreamError) as err:
        plan(meta, "second", limits, partitions=3, replication_factor=2)
    message = str(err.value)
    assert "would put 11 partition replicas on server" in message
    assert "(8 it already hosts + 3 of this stream)" in message
    assert "clustering.max.partitions.per.server (10)" in message
    # Spread over the two servers without replication, 1 more each still fits.
    plan(meta, "third", limits, partitions=4)
    assert len(meta.streams["third"].partitions) == 4


def test_replicas_per_server_use_the_placement_so_more_servers_take_more_partitions() -> None:
    limits = StreamLimits(max_partitions_per_server=4)
    with pytest.raises(InvalidStreamError, match=r"clustering\.max\.partitions\.per\.server \(4\)"):
        plan(cluster("a", "b"), "s", limits, partitions=10)
    meta = cluster("a", "b", "c")
    plan(meta, "s", limits, partitions=10)  # 4 + 3 + 3
    assert len(meta.streams["s"].partitions) == 10


def test_a_full_cluster_refuses_even_one_more_partition() -> None:
    meta = cluster("a", "b")
    limits = StreamLimits(max_partitions_per_server=3)
    plan(meta, "one", limits, partitions=3, replication_factor=2)
    with pytest.raises(InvalidStreamError, match=r"would put 4 partition replicas on server '[ab]' \(3 it already"):
        plan(meta, "two", limits, partitions=1)


@pytest.mark.parametrize("size", [1, 14, 1024, 64 * 1024 - 1])
def test_segments_below_the_minimum_are_refused(size: int) -> None:
    with pytest.raises(InvalidStreamError) as err:
        plan(cluster("a"), "tiny", settings=StreamSettings(segment_max_bytes=size))
    message = str(err.value)
    assert f"segmentMaxBytes {size}" in message
    assert "streams.segment.max.bytes.min (65536)" in message


def test_segments_at_the_minimum_or_a_lowered_one_are_accepted() -> None:
    meta = cluster("a")
    plan(meta, "ok", settings=StreamSettings(segment_max_bytes=64 * 1024))
    plan(meta, "small", StreamLimits(min_segment_bytes=512), settings=StreamSettings(segment_max_bytes=512))
    assert {"ok", "small"} <= set(meta.streams)


@pytest.mark.parametrize(
    "settings",
    [
        StreamSettings(retention_max_bytes=-1),
        StreamSettings(retention_max_messages=-5),
        StreamSettings(retention_max_age_ms=-1),
        StreamSettings(cleaner_interval_ms=-1),
        StreamSettings(segment_max_age_ms=-1),
        StreamSettings(auto_pause_time_ms=-1),
    ],
)
def test_negative_settings_are_refused_by_the_controller_too(settings: StreamSettings) -> None:
    (name, value), *_ = settings.to_dict().items()
    with pytest.raises(InvalidStreamError, match=f"{name} must not be negative, got {value}"):
        plan(cluster("a"), "neg", settings=settings)
