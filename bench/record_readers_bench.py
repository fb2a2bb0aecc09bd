"""Micro-benchmark of the record format's readers: prints one JSON line, a table on stderr.

    python bench/record_readers_bench.py [--records N] [--value-bytes B] [--batch N] [--runs N]

The same fetched bytes (``--records`` records of ``--value-bytes`` in batches of ``--batch``) decoded by
each reader of the format, in µs a record, the best of ``--runs``: storage's ``decode_records`` (the
log's reads), the server's ``encode_messages`` (Subscribe's catch-up), the client's ``decode_batches``
(``Client.fetch``: columns only, and ``+hf`` with headers and fields as a liftlog subscription decodes
them) and the Spark source's ``arrow_batch``; each on plain records, on records with a
``\\x00fields`` header (what PublishAsync stores) and on records that also have two user headers (not
the Spark source's: it hands them to ``decode_batches``). Compare runs before and after a change to a reader.
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from collections.abc import Callable

from liftlog.api.stored import encode_fields
from liftlog.client.batches import decode_batches
from liftlog.server.partitions.messages import encode_messages
from liftlog.storage import NewRecord
from liftlog.storage.records import decode_records, encode_batch, iter_batch_headers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--value-bytes", type=int, default=256)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    results: dict[str, float] = {}
    for variant in ("plain", "fields", "headers"):
        data = _batches(args.records, args.value_bytes, args.batch, variant)
        for reader, run in _readers(data, args.records, variant != "headers").items():
            results[f"{reader}/{variant}"] = _best(run, args.runs) / args.records * 1e6
    for name, us in results.items():
        print(f"{name:34} {us:7.3f} µs a record", file=sys.stderr)
    print(json.dumps({"records": args.records, "value_bytes": args.value_bytes, "batch": args.batch, **results}))


def _batches(n: int, value_bytes: int, batch: int, variant: str) -> bytes:
    headers: dict[str, bytes] = {}
    if variant != "plain":
        headers["\x00fields"] = encode_fields("", "", "_INBOX.client.1", "cid-1", 1)
    if variant == "headers":
        headers |= {"trace-id": b"4bf92f3577b34da6", "type": b"order"}
    parts = []
    for base in range(0, n, batch):
        records = [
            NewRecord(bytes([i % 251]) * value_bytes, b"key-%06d" % i, headers)
            for i in range(base, min(n, base + batch))
        ]
        parts.append(encode_batch(base, 1, records, 1_763_884_800_123_456_789))
    return b"".join(parts)


def _readers(data: bytes, n: int, spark: bool) -> dict[str, Callable[[], object]]:
    headers = list(iter_batch_headers(data))
    view = memoryview(data)
    readers: dict[str, Callable[[], object]] = {
        "storage.decode_records": lambda: [decode_records(data, h) for h in headers],
        "server.encode_messages": lambda: [
            encode_messages(view, h, 0, n, "orders", 3, "orders.new", [], 1 << 30, 1 << 40) for h in headers
        ],
        "client.decode_batches": lambda: decode_batches(data, 0, n, "orders.new"),
        "client.decode_batches+hf": lambda: decode_batches(data, 0, n, "orders.new", headers=True, fields=True),
    }
    if not spark:  # records with user headers: the Spark source hands them to decode_batches
        return readers
    try:
        from liftlog.spark.arrow_batches import arrow_batch
        from liftlog.spark.reading import arrow_schema
    except ImportError:  # no Spark extra
        return readers
    schema = arrow_schema(False)
    readers["spark.arrow_batch"] = lambda: arrow_batch(data, 0, n, schema, "orders", 3, "orders.new")
    return readers


def _best(run: Callable[[], object], runs: int) -> float:
    run()
    return min(timeit.repeat(run, number=1, repeat=runs))


if __name__ == "__main__":
    main()
