"""Reading the reference pipeline's results back, without Spark.

The compacted output stream holds, per key ``<user>|<window start ms>``, the
window's counts as JSON; a key may still appear several times until the
stream is compacted, so :func:`read_latest` keeps the newest value of each.
The Parquet directory holds one row per closed window, under
``run=<run id>/batch=<micro-batch>``; :func:`read_parquet` reads it with
pyarrow (the ``spark`` extra).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from liftlog.client import Client, StartPosition, StopPosition

__all__ = ["Totals", "read_latest", "read_parquet", "totals"]


async def read_latest(client: Client, stream: str, start: dict[int, int] | None = None) -> dict[str, dict[str, Any]]:
    """Key -> newest JSON value of every committed message of ``stream`` (from ``start`` offsets if given)."""
    meta = await client.fetch_metadata(stream)
    info = meta.streams.get(stream)
    if info is None:
        from liftlog.client import NoSuchStreamError

        raise NoSuchStreamError(f"no such stream: {stream!r}")
    latest: dict[str, tuple[int, dict[str, Any]]] = {}
    for pid in info.partitions:
        hw = (await client.fetch_partition_metadata(stream, pid)).high_watermark
        first = (start or {}).get(pid, 0)
        if hw < first:
            continue
        sub = client.subscribe(
            stream,
            partition=pid,
            start_position=StartPosition.OFFSET if first else StartPosition.EARLIEST,
            start_offset=first,
            stop_position=StopPosition.STOP_OFFSET,
            stop_offset=hw,
        )
        async with sub:
            async for msg in sub:
                if msg.key is None:
                    continue
                try:
                    doc = json.loads(msg.value)
                except ValueError:
                    continue
                if isinstance(doc, dict):
                    latest[msg.key.decode(errors="replace")] = (msg.offset, doc)
    return {key: doc for key, (_, doc) in sorted(latest.items())}


def read_parquet(directory: str, run_id: str | None = None) -> list[dict[str, Any]]:
    """The rows of the Parquet output (all runs, or one), with their ``run`` and ``batch``; [] if there are none."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    if not os.path.isdir(directory):
        return []
    partitioning = ds.partitioning(pa.schema([("run", pa.string()), ("batch", pa.int64())]), flavor="hive")
    dataset = ds.dataset(directory, format="parquet", partitioning=partitioning)
    table = dataset.to_table(filter=ds.field("run") == run_id if run_id is not None else None)
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


@dataclass(frozen=True, slots=True)
class Totals:
    """Windows, distinct users and events counted in a set of results."""

    windows: int
    keys: int
    events: int
    amount: int


def totals(rows: list[dict[str, Any]]) -> Totals:
    return Totals(
        windows=len(rows),
        keys=len({r.get("key") for r in rows}),
        events=sum(int(r.get("count") or 0) for r in rows),
        amount=sum(int(r.get("amount") or 0) for r in rows),
    )
