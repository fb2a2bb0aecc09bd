"""A spark-submit script for the standalone-cluster test: copy a liftlog stream to another with the exactly-once sink.

A Structured Streaming query, Trigger.AvailableNow, in micro-batches of
``--rows-per-batch`` messages, each read by ``--tasks`` tasks. Each task
passes its rows on in small Arrow batches, pausing ``--pause`` seconds
after each, so that its writes to liftlog go on long enough for the test to
kill an executor in the middle of them. The rows are not changed: a re-run
task produces the same rows, which the exactly-once sink relies on.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql import SparkSession

import liftlog.spark


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--servers", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--rows-per-batch", type=int, required=True)
    p.add_argument("--tasks", type=int, default=2)
    p.add_argument("--pause", type=float, default=0.0)
    args = p.parse_args()

    spark = SparkSession.builder.appName("liftlog-copy").getOrCreate()
    liftlog.spark.register(spark)
    pause = args.pause

    def slowly(batches: Iterator[Any]) -> Iterator[Any]:
        for batch in batches:
            time.sleep(pause)
            yield batch

    rows = (
        spark.readStream.format("liftlog")
        .option("servers", args.servers)
        .option("stream", args.input)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.rows_per_batch))
        .option("minPartitions", str(args.tasks))
        .load()
        .select("key", "value")
    )
    query = (
        rows.mapInArrow(slowly, rows.schema)
        .writeStream.format("liftlog")
        .option("servers", args.servers)
        .option("stream", args.output)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    print(f"liftlog-copy: query {query.id} done", flush=True)


if __name__ == "__main__":
    main()
