"""Writing to liftlog from Spark: batch and streaming, routing, and exactly once across a killed task."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from liftlog.spark.writing import ROW_HEADER, TXN_HEADER

from .conftest import fill, make_stream, read_all

pytestmark = pytest.mark.spark


def test_batch_write_routes_by_partition_key_and_round_robin(spark: Any, liftlog_server: Any, stream_name: str) -> None:
    addr = liftlog_server.address
    make_stream(addr, stream_name, partitions=3)
    rows = [
        ("explicit", None, 2, [("h", b"1")]),
        ("keyed", "user-7", None, None),
        ("keyed-again", "user-7", None, None),
        *[(f"free-{i}", None, None, None) for i in range(6)],
    ]
    df = spark.createDataFrame(
        rows, "value string, key string, partition int, headers array<struct<key:string,value:binary>>"
    ).coalesce(1)
    df.write.format("liftlog").option("servers", addr).option("stream", stream_name).mode("append").save()

    by_partition = {p: read_all(addr, stream_name, p) for p in range(3)}
    values = {m.value.decode(): (p, m) for p, msgs in by_partition.items() for m in msgs}
    assert sorted(values) == sorted(r[0] for r in rows)  # each row once
    assert values["explicit"][0] == 2 and values["explicit"][1].headers == {"h": b"1"}
    assert values["keyed"][0] == values["keyed-again"][0]  # same key, same partition
    assert values["keyed"][1].key == b"user-7"
    # Keyless rows without a partition are spread round robin.
    assert sorted(p for v, (p, _) in values.items() if v.startswith("free-")) == [0, 0, 1, 1, 2, 2]


def test_batch_write_errors(spark: Any, liftlog_server: Any, stream_name: str) -> None:
    addr = liftlog_server.address
    df = spark.createDataFrame([("x",)], "value string")
    with pytest.raises(Exception, match=f"cannot write to stream '{stream_name}': no such stream"):
        df.write.format("liftlog").option("servers", addr).option("stream", stream_name).mode("append").save()
    make_stream(addr, stream_name)
    bad = spark.createDataFrame([("x", 5)], "value string, partition int")
    with pytest.raises(Exception, match=f"stream '{stream_name}' has no partition 5"):
        bad.write.format("liftlog").option("servers", addr).option("stream", stream_name).mode("append").save()
    no_value = spark.createDataFrame([("x",)], "payload string")
    with pytest.raises(Exception, match="needs a 'value' column"):
        no_value.write.format("liftlog").option("servers", addr).option("stream", stream_name).mode("append").save()
    assert read_all(addr, stream_name) == []


def test_stream_to_stream_copy(spark: Any, liftlog_server: Any, stream_name: str, checkpoint: str) -> None:
    """A readStream -> writeStream copy: the 'stream' column of the input is overridden by the option."""
    addr = liftlog_server.address
    source, target = f"{stream_name}-in", f"{stream_name}-out"
    make_stream(addr, source, partitions=2)
    make_stream(addr, target, partitions=2)
    fill(addr, source, {0: [b"a%d" % i for i in range(40)], 1: [b"b%d" % i for i in range(25)]})
    query = (
        spark.readStream.format("liftlog")
        .option("servers", addr)
        .option("stream", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "30")
        .load()
        .writeStream.format("liftlog")
        .option("servers", addr)
        .option("stream", target)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert query.exception() is None
    copied = [m for p in range(2) for m in read_all(addr, target, p)]
    assert sorted(m.value for m in copied) == sorted([b"a%d" % i for i in range(40)] + [b"b%d" % i for i in range(25)])
    # Each message carries its micro-batch identity, for exactly-once re-runs.
    assert all(TXN_HEADER in m.headers and ROW_HEADER in m.headers for m in copied)


def test_exactly_once_when_a_task_dies_mid_batch(
    spark: Any, liftlog_server: Any, stream_name: str, checkpoint: str, tmp_path: Path
) -> None:
    """A Python worker is killed after part of a micro-batch is written; the re-run writes only the rest."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    addr = liftlog_server.address
    source, target = f"{stream_name}-in", f"{stream_name}-out"
    make_stream(addr, source)
    make_stream(addr, target, partitions=2)
    count = 600
    # Rows of 1 kB: a Python worker buffers its output up to 64 kB, and the sink must see rows before the kill.
    sent = [b"row-%04d|" % i + b"." * 1000 for i in range(count)]
    fill(addr, source, {0: sent})
    marker = str(tmp_path / "killed-once")

    def die_once(value: bytes) -> bytes:
        # The first time row 450 is reached, kill this Python worker: the task fails mid-batch. The pause
        # lets the sink, a worker of its own fed 100 rows at a time, publish the rows before it.
        if value.startswith(b"row-0450|") and not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(3)
            os._exit(1)
        return value

    kill = F.udf(die_once, BinaryType(), useArrow=False)

    def start() -> Any:
        return (
            spark.readStream.format("liftlog")
            .option("servers", addr)
            .option("stream", source)
            .option("startingOffsets", "earliest")
            .option("minPartitions", "1")  # one task for the whole batch
            .load()
            .select(kill("value").alias("value"), "key")
            .writeStream.format("liftlog")
            .option("servers", addr)
            .option("stream", target)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )

    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")  # the sink publishes as rows arrive
    try:
        query = start()
        with pytest.raises(Exception):  # noqa: B017 - the killed worker fails the query; what matters is the data
            query.awaitTermination(120)
        assert os.path.exists(marker)
        written_before = sum(len(read_all(addr, target, p)) for p in range(2))
        assert 0 < written_before < count, "the task should have died part-way through the batch"

        # Restart from the checkpoint: Spark re-runs the same micro-batch (same query and batch id).
        query = start()
        assert query.awaitTermination(120)
        assert query.exception() is None
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    values = sorted(m.value for p in range(2) for m in read_all(addr, target, p))
    assert values == sent  # every row exactly once
