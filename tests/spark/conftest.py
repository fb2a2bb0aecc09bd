"""Fixtures for the Spark tests: one local[2] SparkSession and one liftlog server (on its own NATS) per session.

pyspark is imported inside the fixtures, so the plain-Python tests of this
folder (options, offsets) run without it.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from liftlog.client import Client
from liftlog.client.types import PublishValue
from tests.integration.harness import LiftlogProcess, NatsProcess

T = TypeVar("T")
_names = itertools.count()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A small local Spark: 2 cores, no UI, 2 shuffle partitions, workers on this venv's Python, loopback only."""
    from liftlog.spark.source import local_session

    session = local_session("liftlog-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsProcess]:
    proc = NatsProcess(tmp_path_factory.mktemp("spark-nats") / "nats.log")
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def liftlog_server(tmp_path_factory: pytest.TempPathFactory, spark_nats: NatsProcess) -> Iterator[LiftlogProcess]:
    """One liftlog server for all Spark tests (each test uses streams of its own)."""
    data = tmp_path_factory.mktemp("spark-liftlog") / "data"
    # Tiny segments let compaction tests see several segments.
    proc = LiftlogProcess(data, "--set", "streams.segment.max.bytes.min=512", nats_url=spark_nats.url).start()
    yield proc
    proc.kill()


@pytest.fixture
def stream_name(request: pytest.FixtureRequest) -> str:
    """A stream name (and NATS subject) no other test uses."""
    base = request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[:50]
    return f"{base}-{next(_names)}"


def run(address: str, work: Callable[[Client], Awaitable[T]]) -> T:
    """Run ``work(client)`` on a fresh client and event loop (tests are synchronous: Spark is)."""

    async def main() -> T:
        async with Client(address) as client:
            return await work(client)

    return asyncio.run(main())


def make_stream(address: str, name: str, partitions: int = 1, **kwargs: Any) -> None:
    run(address, lambda c: c.create_stream(name, name, partitions=partitions, **kwargs))


def fill(address: str, name: str, per_partition: Mapping[int, Sequence[PublishValue]], **kwargs: Any) -> None:
    """Publish the given values to each partition (ack ALL, so they are committed).

    In chunks of 10 by default: each chunk is one stored batch, and the tests that need retention or
    compaction to act count on many small batches rolling their tiny segments.
    """
    from liftlog.client import AckPolicy

    kwargs.setdefault("window", 10)

    async def work(c: Client) -> None:
        for partition, values in per_partition.items():
            await c.publish_many(name, values, partition=partition, ack_policy=AckPolicy.ALL, **kwargs)

    run(address, work)


def read_all(address: str, name: str, partition: int = 0) -> list[Any]:
    """Every committed message of a partition, via the client."""
    from liftlog.client import StartPosition, StopPosition

    async def work(c: Client) -> list[Any]:
        info = await c.fetch_partition_metadata(name, partition)
        if info.high_watermark < 0:
            return []
        sub = c.subscribe(
            name,
            partition=partition,
            start_position=StartPosition.EARLIEST,
            stop_position=StopPosition.STOP_OFFSET,
            stop_offset=info.high_watermark,
        )
        async with sub:
            return [m async for m in sub]

    return run(address, work)


@pytest.fixture
def checkpoint(tmp_path: Path) -> str:
    return str(tmp_path / "checkpoint")


def run_available_now(spark: Any, address: str, checkpoint: str, **options: str) -> list[list[tuple[int, int]]]:
    """Run a query with Trigger.AvailableNow to its end; the (partition, offset) pairs of each micro-batch."""
    batches: list[list[tuple[int, int]]] = []

    def collect(df: Any, batch_id: int) -> None:
        batches.append([(r.partition, r.offset) for r in df.select("partition", "offset").collect()])

    reader = spark.readStream.format("liftlog").option("servers", address)
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (
        reader.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert query.exception() is None
    return [b for b in batches if b]
