"""Commit-log micro-benchmark: prints one JSON line.

    python bench/log_bench.py [--records N] [--value-bytes B] [--batch N] [--fsync never|interval|always]
                              [--encrypt]

Prints a table on stderr and the figures as one JSON line on stdout. Measures batched and single-record
appends, decoded sequential reads, raw
batch reads (what replication ships) and clear batch reads (what clients
get: decrypted) on a log in a temporary directory (page cache warm, so the
read figures are CPU cost, not disk speed). ``--encrypt`` makes it the log
of an encrypted stream (a random master key).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time

from liftlog.storage import CommitLog, FsyncPolicy, LogConfig, NewRecord
from liftlog.storage.encryption import BatchCipher, MasterKey
from liftlog.storage.records import iter_batch_headers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000, help="records for the batched append and reads")
    parser.add_argument("--single-records", type=int, default=200_000, help="records for the one-per-call append")
    parser.add_argument("--value-bytes", type=int, default=256)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--fsync", choices=[p.value for p in FsyncPolicy], default="never")
    parser.add_argument("--dir", default=None, help="where to put the log (default: a temp dir)")
    parser.add_argument("--encrypt", action="store_true", help="encrypt the batches (encryption at rest)")
    args = parser.parse_args()
    cipher = BatchCipher(MasterKey(os.urandom(32))) if args.encrypt else None

    def open_log(path: str) -> CommitLog:
        return CommitLog.open(path, config, cipher=cipher, encrypt=args.encrypt)

    root = tempfile.mkdtemp(prefix="liftlog-bench-", dir=args.dir)
    config = LogConfig(fsync=FsyncPolicy(args.fsync))
    value = os.urandom(args.value_bytes)
    batch = [NewRecord(value) for _ in range(args.batch)]
    try:
        log = open_log(os.path.join(root, "batched"))
        n_batches = args.records // args.batch
        t0 = time.perf_counter()
        for _ in range(n_batches):
            log.append(batch)
        batched_s = time.perf_counter() - t0
        total = n_batches * args.batch
        log_bytes = log.size_bytes

        t0 = time.perf_counter()
        read = 0
        offset = 0
        end = log.log_end_offset
        while offset < end:
            records = log.read(offset, max_records=100_000, max_bytes=4 << 20)
            read += len(records)
            offset = records[-1].offset + 1
        read_s = time.perf_counter() - t0
        assert read == total, (read, total)

        t0 = time.perf_counter()
        raw_bytes = 0
        offset = 0
        while offset < end:
            chunk = log.read_raw(offset, max_bytes=4 << 20)
            raw_bytes += len(chunk)
            *_, last = iter_batch_headers(chunk)
            offset = last.next_offset
        raw_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        clear_bytes = 0
        offset = 0
        while offset < end:
            chunk = log.read_clear(offset, max_bytes=4 << 20)
            clear_bytes += len(chunk)
            *_, last = iter_batch_headers(chunk)
            offset = last.next_offset
        clear_s = time.perf_counter() - t0
        log.close()

        single = open_log(os.path.join(root, "single"))
        one = [NewRecord(value)]
        t0 = time.perf_counter()
        for _ in range(args.single_records):
            single.append(one)
        single_s = time.perf_counter() - t0
        single.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    result = {
        "bench": "log",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "fsync": args.fsync,
        "encrypted": args.encrypt,
        "value_bytes": args.value_bytes,
        "batch_records": args.batch,
        "records": total,
        "log_bytes": log_bytes,
        "append_batched_records_per_s": round(total / batched_s),
        "append_batched_mb_per_s": round(log_bytes / batched_s / 1e6, 1),
        "append_single_records_per_s": round(args.single_records / single_s),
        "read_records_per_s": round(total / read_s),
        "read_raw_mb_per_s": round(raw_bytes / raw_s / 1e6, 1),
        "read_clear_mb_per_s": round(clear_bytes / clear_s / 1e6, 1),
    }
    show(result)
    print(json.dumps(result))


def show(result: dict[str, object]) -> None:
    """The figures as a table on stderr (stdout stays the one JSON line)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(
        "what",
        "rate",
        title=f"commit log, {result['value_bytes']}-byte values, fsync {result['fsync']}"
        + (", encrypted" if result["encrypted"] else ""),
    )
    table.add_row(
        f"append, batches of {result['batch_records']}", f"{result['append_batched_records_per_s']:,} records/s"
    )
    table.add_row("append, one record per call", f"{result['append_single_records_per_s']:,} records/s")
    table.add_row("read, decoded records", f"{result['read_records_per_s']:,} records/s")
    table.add_row("read raw batches (replication)", f"{result['read_raw_mb_per_s']:,} MB/s")
    table.add_row("read clear batches (clients)", f"{result['read_clear_mb_per_s']:,} MB/s")
    Console(stderr=True).print(table)


if __name__ == "__main__":
    main()
