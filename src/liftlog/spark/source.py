"""The ``liftlog`` Python Data Source: Spark's classes, wired to :mod:`.reading` and :mod:`.writing`.

This module imports pyspark (the ``spark`` extra); the rest of liftlog never
imports it. Register the source with :func:`register` (or
``spark.dataSource.register(LiftlogDataSource)``), then use
``spark.read.format("liftlog")`` and friends.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from .blocking import BlockingClient, LiftlogSparkError
from .offsets import EARLIEST, OffsetRange, PartitionOffsets, admit, split_ranges
from .options import OptionError, ReadOptions, WriteOptions, parse_read_options, parse_write_options
from .reading import Bounds, RangeReader, arrow_schema, discover_partitions, fetch_bounds, resolve_offsets
from .writing import Txn, write_batches

__all__ = ["LiftlogDataSource", "local_session", "register"]

log = logging.getLogger("liftlog.spark")


def register(spark: SparkSession) -> None:
    """Make ``format("liftlog")`` available in this Spark session."""
    spark.dataSource.register(LiftlogDataSource)


def local_session(app_name: str, *, cores: int = 2, conf: dict[str, str] | None = None) -> SparkSession:
    """A one-machine SparkSession with the source registered, for tests, benchmarks and trying things.

    Workers run this interpreter, the driver binds to loopback, the UI is
    off and shuffles use ``cores`` partitions; ``conf`` adds or overrides
    Spark settings.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": str(cores),
        "spark.default.parallelism": str(cores),
        "spark.driver.memory": "1g",
        "spark.python.worker.reuse": "true",
    }
    settings.update(conf or {})
    builder = SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


#: Offsets as Spark keeps them in its checkpoint: ``PartitionOffsets.to_json``'s ``{stream: {"partition": offset}}``.
_OffsetsDoc = dict[str, dict[str, int]]


class RangePartition(InputPartition):
    """One read task: an :class:`OffsetRange`."""

    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(rng)
        self.range = rng


class LiftlogDataSource(DataSource):
    """liftlog streams as rows ``key, value, stream, subject, partition, offset, timestamp[, headers]``."""

    @classmethod
    def name(cls) -> str:
        return "liftlog"

    def _read_options(self, streaming: bool) -> ReadOptions:
        try:
            return parse_read_options(dict(self.options), streaming=streaming)
        except OptionError as exc:
            raise LiftlogSparkError(str(exc)) from None

    def _write_options(self) -> WriteOptions:
        try:
            return parse_write_options(dict(self.options))
        except OptionError as exc:
            raise LiftlogSparkError(str(exc)) from None

    def schema(self) -> StructType:
        # The read tasks' Arrow schema is the one definition of the columns.
        headers = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        schema = from_arrow_schema(arrow_schema(headers))
        freeze_worker_heap()  # Spark asks for the schema in a worker of its own, reused and collected the same way
        return schema

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(self._read_options(streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(self._read_options(streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return _BatchWriter(self._write_options())

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return _StreamWriter(self._write_options())


def _min_tasks(opts: ReadOptions) -> int:
    return opts.min_partitions or os.cpu_count() or 1


def _plan(opts: ReadOptions, start: PartitionOffsets, end: PartitionOffsets) -> list[RangePartition]:
    try:
        ranges = split_ranges(start, end, min_partitions=_min_tasks(opts))
    except ValueError as exc:
        raise LiftlogSparkError(str(exc)) from None
    return [RangePartition(r) for r in ranges]


def _check_loss(start: PartitionOffsets, bounds: dict[tuple[str, int], Bounds], fail: bool) -> PartitionOffsets:
    """``start`` with offsets before the earliest retained one moved up to it, or an error naming them."""
    moved = start.to_dict()
    for stream, pid, offset in start:
        earliest = bounds[stream, pid].earliest
        if offset < earliest:
            text = (
                f"data loss in stream {stream!r} partition {pid}: offsets {offset} to {earliest - 1} "
                "are no longer in the log (removed by retention)"
            )
            if fail:
                raise LiftlogSparkError(text + "; set failOnDataLoss=false to skip them, or start from newer offsets")
            log.warning("%s; skipping them (failOnDataLoss=false)", text)
            moved[stream][pid] = earliest
    return PartitionOffsets(moved)


_worker_heap_frozen = False


def freeze_worker_heap() -> None:
    """Leave what a Spark Python worker holds now out of the collections PySpark runs between its tasks.

    A reused worker runs a full ``gc.collect()`` after every task. With pyspark,
    pandas, pyarrow and this package loaded, that walks some 107,000 long-lived
    objects to free about 8: 46-122 ms between one task and the next on a busy
    2-core machine, measured. Called at the end of a worker's first task here,
    once everything the tasks import is loaded, ``gc.freeze`` moves those
    objects where collections no longer look. A frozen object is still freed
    by reference counting, but never by the cycle collector: a one-time cost,
    as what a worker holds then is its modules and PySpark's state, which live
    as long as it does.
    """
    global _worker_heap_frozen
    if not _worker_heap_frozen:
        _worker_heap_frozen = True
        gc.freeze()


def _read(opts: ReadOptions, partition: InputPartition) -> Iterator[pa.RecordBatch]:
    if not isinstance(partition, RangePartition):
        raise LiftlogSparkError(f"not a liftlog read task: {partition!r}")
    reader = RangeReader(
        opts.servers,
        partition.range,
        include_headers=opts.include_headers,
        fail_on_data_loss=opts.fail_on_data_loss,
        tls=opts.tls,
    )
    return _freeze_when_done(reader.batches())


def _freeze_when_done(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield from batches
    freeze_worker_heap()


def _subscription_bounds(
    bc: BlockingClient, opts: ReadOptions, *, earliest: bool, timestamp_ms: int | None
) -> dict[tuple[str, int], Bounds]:
    """The bounds of every partition the options subscribe to."""
    parts = bc.run(lambda c: discover_partitions(c, opts.subscription))
    return bc.run(lambda c: fetch_bounds(c, parts, earliest=earliest, timestamp_ms=timestamp_ms))


class _BatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        assert opts.ending_offsets is not None
        with BlockingClient(opts.servers, tls=opts.tls) as bc:
            bounds = _subscription_bounds(bc, opts, earliest=True, timestamp_ms=opts.starting_timestamp)
        start = resolve_offsets(opts.starting_offsets, bounds, name=opts.starting_option)
        end = resolve_offsets(opts.ending_offsets, bounds, name="endingOffsets")
        if opts.starting_timestamp is None:
            start = _check_loss(start, bounds, opts.fail_on_data_loss)
        tasks = _plan(opts, start, end)
        freeze_worker_heap()  # planned in a worker of its own, reused and collected the same way
        return tasks

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are the next offset to read per stream partition: ``{"stream": {"0": 6}}``.

    Keeps nothing that matters between calls: a restart resumes from the
    offsets in the checkpoint, and commit()/stop() need not be called.
    """

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._bc: BlockingClient | None = None
        self._target: PartitionOffsets | None = None  # Trigger.AvailableNow: read up to here, no further
        self._latest: PartitionOffsets | None = None
        self._last_batch = time.monotonic()  # for maxTriggerDelay

    def _client(self) -> BlockingClient:
        if self._bc is None:
            self._bc = BlockingClient(self.opts.servers, tls=self.opts.tls)
        return self._bc

    def _bounds(self, earliest: bool, timestamp_ms: int | None = None) -> dict[tuple[str, int], Bounds]:
        return _subscription_bounds(self._client(), self.opts, earliest=earliest, timestamp_ms=timestamp_ms)

    def _earliest(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        if not keys:
            return {}
        parts: dict[str, list[int]] = {}
        for s, p in keys:
            parts.setdefault(s, []).append(p)
        bounds = self._client().run(lambda c: fetch_bounds(c, parts))
        return {k: b.earliest for k, b in bounds.items()}

    def initialOffset(self) -> _OffsetsDoc:
        opts = self.opts
        needs_earliest = opts.starting_offsets == "earliest" or (
            isinstance(opts.starting_offsets, dict)
            and any(o == EARLIEST for parts in opts.starting_offsets.values() for o in parts.values())
        )
        bounds = self._bounds(needs_earliest or opts.starting_timestamp is not None, opts.starting_timestamp)
        return _as_dict(resolve_offsets(opts.starting_offsets, bounds, name=opts.starting_option))

    def _with_new_partitions(self, start: PartitionOffsets, latest: PartitionOffsets) -> PartitionOffsets:
        """``start`` plus the partitions that appeared since, at their earliest offset; vanished ones checked."""
        merged = start.to_dict()
        for stream, pid, _ in start:
            if latest.get(stream, pid) is None:
                text = f"stream {stream!r} partition {pid} was being read but no longer exists"
                if self.opts.fail_on_data_loss:
                    raise LiftlogSparkError(text + " (set failOnDataLoss=false to go on without it)")
                log.warning("%s; no longer reading it", text)
                del merged[stream][pid]
        new = [(s, p) for s, p, _ in latest if start.get(s, p) is None]
        for (s, p), first in self._earliest(new).items():
            log.info("stream %r partition %d is new: reading it from offset %d", s, p, first)
            merged.setdefault(s, {})[p] = first
        return PartitionOffsets(merged)

    def latestOffset(self, start: _OffsetsDoc, limit: ReadLimit) -> _OffsetsDoc:
        begin = _from_dict(start)
        bounds = self._bounds(earliest=False)
        latest = _offsets({k: b.end for k, b in bounds.items()})
        self._latest = latest
        if self._target is not None:
            capped = {(s, p): min(o, self._target.get(s, p) or 0) for s, p, o in latest}
            latest = _offsets(capped)
        full = self._with_new_partitions(begin, latest)
        backlog = sum(max(0, o - (full.get(s, p) or 0)) for s, p, o in latest)
        opts = self.opts
        if isinstance(limit, ReadAllAvailable):
            end = admit(full, latest, None)
        else:
            wanted = opts.min_offsets_per_trigger if isinstance(limit, (ReadMinRows, ReadMaxRows)) else None
            waited_ms = (time.monotonic() - self._last_batch) * 1000
            if wanted and backlog < wanted and self._target is None and waited_ms < opts.max_trigger_delay_ms:
                return start  # too little new data and not waited long enough: no batch yet
            cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
            end = admit(full, latest, cap)
        if end != begin:
            self._last_batch = time.monotonic()
        return _as_dict(end)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> _OffsetsDoc | None:
        return None if self._latest is None else _as_dict(self._latest)

    def prepareForTriggerAvailableNow(self) -> None:
        bounds = self._bounds(earliest=False)
        self._target = _offsets({k: b.end for k, b in bounds.items()})

    def partitions(self, start: _OffsetsDoc, end: _OffsetsDoc) -> Sequence[InputPartition]:
        begin, stop = _from_dict(start), _from_dict(end)
        new = [(s, p) for s, p, _ in stop if begin.get(s, p) is None]
        if new:
            merged = begin.to_dict()
            for (s, p), first in self._earliest(new).items():
                merged.setdefault(s, {})[p] = min(first, stop.get(s, p) or 0)
            begin = PartitionOffsets(merged)
        return _plan(self.opts, begin, stop)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.opts, partition)

    def commit(self, end: _OffsetsDoc) -> None:
        pass  # nothing to release: liftlog keeps no consumer state for us

    def stop(self) -> None:
        if self._bc is not None:
            self._bc.close()
            self._bc = None


def _offsets(flat: dict[tuple[str, int], int]) -> PartitionOffsets:
    nested: dict[str, dict[int, int]] = {}
    for (s, p), o in flat.items():
        nested.setdefault(s, {})[p] = o
    return PartitionOffsets(nested)


def _as_dict(offsets: PartitionOffsets) -> _OffsetsDoc:
    result: _OffsetsDoc = json.loads(offsets.to_json())
    return result


def _from_dict(doc: _OffsetsDoc) -> PartitionOffsets:
    try:
        return PartitionOffsets.from_json(json.dumps(doc))
    except ValueError as exc:
        raise LiftlogSparkError(f"bad liftlog offsets in the checkpoint: {exc}") from None


# -- writing ----------------------------------------------------------------------


class LiftlogCommitMessage(WriterCommitMessage):
    def __init__(self, written: dict[str, int], skipped: int) -> None:
        self.written = written
        self.skipped = skipped


class _BatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LiftlogCommitMessage:
        ctx = TaskContext.get()
        task = ctx.partitionId() if ctx is not None else 0
        result = write_batches(
            self.opts.servers, iterator, default_stream=self.opts.stream, txn=None, task=task, tls=self.opts.tls
        )
        freeze_worker_heap()
        return LiftlogCommitMessage(result.written, result.skipped)


class _StreamWriter(DataSourceStreamArrowWriter):
    """Exactly once per micro-batch: see :mod:`liftlog.spark.writing`."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LiftlogCommitMessage:
        ctx = TaskContext.get()
        txn = None
        task = 0
        if ctx is not None:
            task = ctx.partitionId()
            query = ctx.getLocalProperty("sql.streaming.queryId")
            batch = ctx.getLocalProperty("streaming.sql.batchId")
            if query and batch is not None:
                txn = Txn(query, int(batch), task)
        result = write_batches(
            self.opts.servers, iterator, default_stream=self.opts.stream, txn=txn, task=task, tls=self.opts.tls
        )
        freeze_worker_heap()
        if result.skipped:
            log.warning(
                "%s: skipped %d rows written by an earlier attempt", txn.tag.decode() if txn else "", result.skipped
            )
        return LiftlogCommitMessage(result.written, result.skipped)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass
