"""The settings behind the controller's stream limits: defaults, overrides and what they refuse."""

from __future__ import annotations

import pytest

from liftlog.metadata.limits import StreamLimits
from liftlog.server.config import ConfigError, load_config


def test_defaults() -> None:
    cfg = load_config(env={})
    assert cfg.streams.max_partitions == 1024
    assert cfg.streams.segment_max_bytes_min == 64 << 10
    assert cfg.clustering.max_partitions_per_server == 4096
    assert cfg.stream_limits() == StreamLimits(1024, 4096, 64 << 10)


def test_overrides_from_env_and_flags_reach_the_limits() -> None:
    env = {"LIFTLOG_STREAMS_MAX_PARTITIONS": "64", "LIFTLOG_CLUSTERING_MAX_PARTITIONS_PER_SERVER": "500"}
    cfg = load_config(overrides={"streams.segment.max.bytes.min": "1KiB"}, env=env)
    assert cfg.stream_limits() == StreamLimits(max_partitions=64, max_partitions_per_server=500, min_segment_bytes=1024)


@pytest.mark.parametrize("key", ["streams.max.partitions", "clustering.max.partitions.per.server"])
def test_partition_limits_must_be_positive(key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides={key: 0}, env={})
    assert err.value.key == key
    assert "must be >= 1, got 0" in str(err.value)


def test_the_server_wide_segment_size_must_reach_the_minimum() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"streams.segment.max.bytes": 1}, env={})
    assert err.value.key == "streams.segment.max.bytes"
    assert "1 is smaller than streams.segment.max.bytes.min (65536)" in str(err.value)
    # Lowering the minimum lets it through.
    cfg = load_config(overrides={"streams.segment.max.bytes": 512, "streams.segment.max.bytes.min": 512}, env={})
    assert cfg.streams.log_config().segment_max_bytes == 512


def test_a_zero_minimum_is_refused() -> None:
    with pytest.raises(ConfigError, match="must be at least 1 byte") as err:
        load_config(overrides={"streams.segment.max.bytes.min": 0}, env={})
    assert err.value.key == "streams.segment.max.bytes.min"
