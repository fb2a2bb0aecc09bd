"""Batch reads through Spark: exact offset ranges, keys, headers, timestamps, and clear errors."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from liftlog.client import OutgoingMessage

from .conftest import fill, make_stream, read_all

pytestmark = pytest.mark.spark


def load(spark: Any, address: str, **options: str) -> Any:
    reader = spark.read.format("liftlog").option("servers", address)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_reads_every_offset_once_with_keys_and_headers(spark: Any, liftlog_server: Any, stream_name: str) -> None:
    addr = liftlog_server.address
    make_stream(addr, stream_name, partitions=3)
    sent: dict[tuple[int, int], tuple[bytes | None, bytes, dict[str, bytes]]] = {}
    per_partition: dict[int, list[Any]] = {}
    for p, n in ((0, 250), (1, 7), (2, 0)):
        msgs = []
        for i in range(n):
            key = None if i % 5 == 0 else f"k{i % 3}".encode()
            headers = {"h": f"{p}:{i}".encode()} if i % 2 else None
            msgs.append(OutgoingMessage(f"v-{p}-{i}".encode(), key, headers))
            sent[p, i] = (key, f"v-{p}-{i}".encode(), headers or {})
        per_partition[p] = msgs
    fill(addr, stream_name, per_partition)

    # minPartitions 6 cuts partition 0's 250 messages into several tasks.
    df = load(spark, addr, stream=stream_name, includeHeaders="true", minPartitions="6")
    assert df.rdd.getNumPartitions() >= 5
    rows = df.collect()
    got = {(r.partition, r.offset): r for r in rows}
    assert len(rows) == len(got) == len(sent)  # every offset exactly once
    assert set(got) == set(sent)
    for (p, o), (key, value, headers) in sent.items():
        r = got[p, o]
        assert r.key == key and r.value == value
        assert {h.key: h.value for h in r.headers} == headers
        assert r.stream == stream_name
        assert r.subject == (stream_name if p == 0 else f"{stream_name}.{p}")  # partition subjects
    assert all(r.timestamp.year >= 2024 for r in rows)
    assert "headers" not in load(spark, addr, stream=stream_name).columns


def test_starting_and_ending_offsets(spark: Any, liftlog_server: Any, stream_name: str) -> None:
    addr = liftlog_server.address
    make_stream(addr, stream_name, partitions=2)
    fill(addr, stream_name, {0: [b"a%d" % i for i in range(20)], 1: [b"b%d" % i for i in range(10)]})
    starting = json.dumps({stream_name: {"0": 5, "1": -2}})
    ending = json.dumps({stream_name: {"0": 12, "1": -1}})
    rows = load(spark, addr, stream=stream_name, startingOffsets=starting, endingOffsets=ending).collect()
    got = sorted((r.partition, r.offset) for r in rows)
    assert got == [(0, o) for o in range(5, 12)] + [(1, o) for o in range(10)]

    # assign reads only the partitions named.
    rows = load(spark, addr, assign=json.dumps({stream_name: [1]})).collect()
    assert sorted(r.offset for r in rows) == list(range(10)) and {r.partition for r in rows} == {1}


def test_starting_timestamp(spark: Any, liftlog_server: Any, stream_name: str) -> None:
    addr = liftlog_server.address
    make_stream(addr, stream_name)
    fill(addr, stream_name, {0: [b"old%d" % i for i in range(10)]})
    time.sleep(0.05)
    cut_ms = int(time.time() * 1000)
    time.sleep(0.05)
    fill(addr, stream_name, {0: [b"new%d" % i for i in range(4)]})
    rows = load(spark, addr, stream=stream_name, startingTimestamp=str(cut_ms)).collect()
    assert sorted(r.value for r in rows) == sorted(b"new%d" % i for i in range(4))
    assert sorted(r.offset for r in rows) == [10, 11, 12, 13]


def test_stream_pattern_reads_matching_streams(spark: Any, liftlog_server: Any, stream_name: str) -> None:
    addr = liftlog_server.address
    for suffix in ("a", "b"):
        make_stream(addr, f"{stream_name}-{suffix}")
        fill(addr, f"{stream_name}-{suffix}", {0: [suffix.encode()] * 3})
    rows = load(spark, addr, streamPattern=f"{stream_name}-[ab]").collect()
    assert sorted((r.stream, r.offset) for r in rows) == [
        (f"{stream_name}-{s}", o) for s in ("a", "b") for o in range(3)
    ]


def test_errors_name_the_problem(spark: Any, liftlog_server: Any, stream_name: str) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    addr = liftlog_server.address
    failures = (PySparkException, Py4JJavaError, Exception)

    with pytest.raises(failures, match=f"no such stream '{stream_name}'"):
        load(spark, addr, stream=stream_name).collect()

    make_stream(addr, stream_name)
    fill(addr, stream_name, {0: [b"x"] * 3})
    with pytest.raises(failures, match=r"offset 99 of stream .* partition 0 is out of range"):
        load(spark, addr, stream=stream_name, startingOffsets=json.dumps({stream_name: {"0": 99}})).collect()
    with pytest.raises(failures, match=r"has no partition 4"):
        load(spark, addr, assign=json.dumps({stream_name: [4]})).collect()
    with pytest.raises(failures, match=r"no liftlog server answered at 127\.0\.0\.1:1\b"):
        load(spark, "127.0.0.1:1", stream=stream_name).collect()
    with pytest.raises(
        failures, match=r"(?i)unknown liftlog source option 'startingOffset'.*did you mean 'startingOffsets'"
    ):
        load(spark, addr, stream=stream_name, startingOffset="earliest").collect()


def test_reads_across_compaction_gaps(spark: Any, liftlog_server: Any, stream_name: str) -> None:
    addr = liftlog_server.address
    make_stream(addr, stream_name, compact_enabled=True, segment_max_bytes=512, cleaner_interval_ms=100)
    values = [OutgoingMessage(b"v%03d" % i, b"k%d" % (i % 4)) for i in range(120)]
    fill(addr, stream_name, {0: values})
    deadline = time.monotonic() + 20
    kept = read_all(addr, stream_name)
    while True:  # until the cleaner has compacted and then left the log alone for a while
        time.sleep(0.5)
        now = read_all(addr, stream_name)
        if len(now) < 120 and [m.offset for m in now] == [m.offset for m in kept]:
            break
        assert time.monotonic() < deadline, "compaction did not run"
        kept = now
    assert kept[0].offset > 0  # a gap at the start, and the log start offset is still 0
    assert kept[-1].offset == 119  # the newest message of each key stays
    # Tasks cut in the middle of gaps still return each retained message once; no data loss is reported.
    rows = load(spark, addr, stream=stream_name, minPartitions="7").collect()
    assert sorted((r.offset, r.value) for r in rows) == [(m.offset, m.value) for m in kept]
    # An end offset inside a gap.
    rows = load(spark, addr, stream=stream_name, endingOffsets=json.dumps({stream_name: {"0": 60}})).collect()
    assert sorted(r.offset for r in rows) == [m.offset for m in kept if m.offset < 60]
