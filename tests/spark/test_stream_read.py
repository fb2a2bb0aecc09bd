"""Structured Streaming reads: AvailableNow, rate limits, checkpoint restarts, new streams, data loss."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from liftlog.spark.offsets import PartitionOffsets
from liftlog.spark.options import parse_read_options

from .conftest import fill, make_stream, run_available_now

pytestmark = pytest.mark.spark


def stream_reader(address: str, **options: str) -> Any:
    from liftlog.spark.source import _StreamReader

    return _StreamReader(parse_read_options({"servers": address, **options}, streaming=True))


def test_available_now_with_max_offsets_per_trigger(
    spark: Any, liftlog_server: Any, stream_name: str, checkpoint: str
) -> None:
    addr = liftlog_server.address
    make_stream(addr, stream_name, partitions=2)
    fill(addr, stream_name, {0: [b"a"] * 70, 1: [b"b"] * 30})
    batches = run_available_now(
        spark, addr, checkpoint, stream=stream_name, startingOffsets="earliest", maxOffsetsPerTrigger="25"
    )
    assert [len(b) for b in batches] == [25, 25, 25, 25]  # the limit, honoured exactly
    # Shared in proportion to the backlogs: 70:30 -> the first batch takes 17 or 18 from partition 0.
    assert sum(1 for p, _ in batches[0] if p == 0) in (17, 18)
    everything = sorted(pair for b in batches for pair in b)
    assert everything == [(0, o) for o in range(70)] + [(1, o) for o in range(30)]

    # A restart from the checkpoint with more data reads just the new messages.
    fill(addr, stream_name, {0: [b"c"] * 5, 1: [b"d"] * 3})
    again = run_available_now(
        spark, addr, checkpoint, stream=stream_name, startingOffsets="earliest", maxOffsetsPerTrigger="25"
    )
    assert sorted(pair for b in again for pair in b) == [(0, o) for o in range(70, 75)] + [
        (1, o) for o in range(30, 33)
    ]


def test_starting_latest_and_new_streams_of_a_pattern(
    spark: Any, liftlog_server: Any, stream_name: str, checkpoint: str
) -> None:
    addr = liftlog_server.address
    first = f"{stream_name}-a"
    make_stream(addr, first)
    fill(addr, first, {0: [b"before"] * 4})
    # 'latest' starts after what is there; the first run only records that position.
    assert run_available_now(spark, addr, checkpoint, streamPattern=f"{stream_name}-.*") == []
    fill(addr, first, {0: [b"after"] * 2})
    second = f"{stream_name}-b"
    make_stream(addr, second, partitions=2)
    fill(addr, second, {0: [b"x"] * 3, 1: [b"y"]})
    rows: list[Any] = []

    def collect(df: Any, batch_id: int) -> None:
        rows.extend(df.select("stream", "partition", "offset").collect())

    query = (
        spark.readStream.format("liftlog")
        .option("servers", addr)
        .option("streamPattern", f"{stream_name}-.*")
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    got = sorted((r.stream, r.partition, r.offset) for r in rows)
    # The new stream is read from its beginning; the old one from where the last run stopped.
    assert got == [(first, 0, 4), (first, 0, 5), (second, 0, 0), (second, 0, 1), (second, 0, 2), (second, 1, 0)]


def test_latest_offset_admission_control(liftlog_server: Any, stream_name: str) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

    addr = liftlog_server.address
    make_stream(addr, stream_name, partitions=3)
    fill(addr, stream_name, {0: [b"a"] * 60, 1: [b"b"] * 30, 2: [b"c"] * 10})
    reader = stream_reader(addr, stream=stream_name, startingOffsets="earliest", minOffsetsPerTrigger="500")
    try:
        start = reader.initialOffset()
        assert start == {stream_name: {"0": 0, "1": 0, "2": 0}}
        assert isinstance(reader.getDefaultReadLimit(), ReadMinRows)
        # Too little data (100 < 500) and maxTriggerDelay (15 min) not reached: no batch.
        assert reader.latestOffset(start, ReadMinRows(500)) == start
        # ReadAllAvailable (what the engine passes to override options) takes everything.
        assert reader.latestOffset(start, ReadAllAvailable()) == {stream_name: {"0": 60, "1": 30, "2": 10}}
        # AvailableNow: the target is fixed when the query starts; later data waits for the next query.
        reader.prepareForTriggerAvailableNow()
        fill(addr, stream_name, {0: [b"late"] * 5, 1: [b"late"] * 5})
        assert reader.latestOffset(start, ReadMinRows(500)) == {stream_name: {"0": 60, "1": 30, "2": 10}}
        assert reader.reportLatestOffset() == {stream_name: {"0": 65, "1": 35, "2": 10}}
        parts = reader.partitions(start, {stream_name: {"0": 60, "1": 30, "2": 10}})
        assert sum(p.range.size for p in parts) == 100
    finally:
        reader.stop()

    capped = stream_reader(addr, stream=stream_name, startingOffsets="earliest", maxOffsetsPerTrigger="10")
    try:
        start = capped.initialOffset()
        assert capped.getDefaultReadLimit() == ReadMaxRows(10)
        # The cap is split in proportion to the backlogs (60:35:10 -> 6:3:1 once rounded).
        assert capped.latestOffset(start, ReadMaxRows(10)) == {stream_name: {"0": 6, "1": 3, "2": 1}}
    finally:
        capped.stop()

    delayed = stream_reader(
        addr, stream=stream_name, startingOffsets="earliest", minOffsetsPerTrigger="500", maxTriggerDelay="100ms"
    )
    try:
        start = delayed.initialOffset()
        time.sleep(0.2)  # maxTriggerDelay passed: a batch comes even below minOffsetsPerTrigger
        end = delayed.latestOffset(start, ReadMinRows(500))
        assert PartitionOffsets.from_json(json.dumps(end)).get(stream_name, 0) == 65
    finally:
        delayed.stop()


def test_fail_on_data_loss_both_ways(spark: Any, liftlog_server: Any, stream_name: str, checkpoint: str) -> None:
    addr = liftlog_server.address
    # Tiny segments and a message cap: retention drops the oldest segments soon after they close.
    make_stream(
        addr,
        stream_name,
        retention_max_messages=20,
        segment_max_bytes=1024,
        cleaner_interval_ms=100,
    )
    fill(addr, stream_name, {0: [b"m%03d" % i for i in range(200)]})
    reader = stream_reader(addr, stream=stream_name, startingOffsets="earliest")
    try:
        deadline = time.monotonic() + 20
        while reader.initialOffset()[stream_name]["0"] == 0:
            assert time.monotonic() < deadline, "retention did not remove old segments"
            time.sleep(0.1)
        earliest = reader.initialOffset()[stream_name]["0"]
    finally:
        reader.stop()
    assert 0 < earliest < 200
    from_zero = json.dumps({stream_name: {"0": 0}})

    with pytest.raises(
        Exception, match=rf"data loss in stream '{stream_name}' partition 0: offsets 0 to {earliest - 1} are no longer"
    ):
        (
            spark.read.format("liftlog")
            .option("servers", addr)
            .option("stream", stream_name)
            .option("startingOffsets", from_zero)
            .load()
            .collect()
        )
    rows = (
        spark.read.format("liftlog")
        .option("servers", addr)
        .option("stream", stream_name)
        .option("startingOffsets", from_zero)
        .option("failOnDataLoss", "false")
        .load()
        .collect()
    )
    assert sorted(r.offset for r in rows) == list(range(earliest, 200))

    # Streaming from offset 0: read tasks find the loss, and fail or skip it.
    with pytest.raises(Exception, match=rf"data loss in stream '{stream_name}' partition 0: offsets \d+ to \d+"):
        run_available_now(spark, addr, checkpoint + "-failing", stream=stream_name, startingOffsets=from_zero)
    batches = run_available_now(
        spark, addr, checkpoint, stream=stream_name, startingOffsets=from_zero, failOnDataLoss="false"
    )
    assert sorted(o for b in batches for _, o in b) == list(range(earliest, 200))
