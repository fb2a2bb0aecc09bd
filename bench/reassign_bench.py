"""Reassignment benchmark: how long moving a partition takes, and what it costs live traffic. One JSON line.

    python bench/reassign_bench.py [--size BYTES] [--value-size B] [--rate BYTES_PER_S] [--no-load]

Starts a nats-server and three liftlog servers (temporary directories, free
loopback ports), fills a single-replica partition with --size bytes of
--value-size values, then moves it to another server (`Client.reassign`,
what `liftlog cluster reassign` calls) and times the move until the
reassignment is complete: the new replica has copied the log, joined the
ISR, taken over the leadership and the old replica is gone.

Meanwhile (unless --no-load) a second stream, replicated to all three
servers, takes ack-ALL publishes in windows of 100; its rate before and
during the move is reported, so the cost of the copy to production traffic
shows. --rate sets clustering.reassignment.max.rate on every server (0: no
limit). Progress goes to stderr, the JSON line to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from rich.console import Console

from liftlog.cli.bench_cluster import spawned_cluster
from liftlog.client import AckPolicy, Client
from liftlog.units import parse_size

console = Console(stderr=True, highlight=False)


def note(text: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {text}")


async def live_load(client: Client, counts: list[int], stop: asyncio.Event) -> None:
    """Ack-ALL publishes of 256-byte values in windows of 100 until ``stop``; counts[0] grows as acks come."""
    value = b"v" * 256
    while not stop.is_set():
        await client.publish_many("live", [value] * 100, ack_policy=AckPolicy.ALL)
        counts[0] += 100


async def rate_over(counts: list[int], seconds: float) -> float:
    start, t0 = counts[0], time.perf_counter()
    await asyncio.sleep(seconds)
    return (counts[0] - start) / (time.perf_counter() - t0)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    overrides = (f"clustering.reassignment.max.rate={args.rate}",) if args.rate else ()
    async with spawned_cluster(3, note, overrides) as cluster, Client(cluster.addresses, timeout=60.0) as client:
        await client.create_stream("moving", "moving", replication_factor=1)
        await client.create_stream("live", "live", replication_factor=3)
        meta = await client.fetch_metadata()
        source = meta.streams["moving"].partitions[0].leader
        target = next(sid for sid in sorted(cluster.nodes) if sid != source)
        values = args.size // args.value_size
        note(f"filling moving/0 on {source}: {values:,} values of {args.value_size:,} bytes")
        t0 = time.perf_counter()
        chunk = 256
        value = b"x" * args.value_size
        for start in range(0, values, chunk):
            await client.publish_many("moving", [value] * min(chunk, values - start), ack_policy=AckPolicy.LEADER)
        fill_s = time.perf_counter() - t0
        stop = asyncio.Event()
        counts = [0]
        load = asyncio.ensure_future(live_load(client, counts, stop)) if args.load else None
        before = await rate_over(counts, 3.0) if load else 0.0
        note(f"moving moving/0 from {source} to {target}" + (f" (live load {before:,.0f} msgs/s)" if load else ""))
        t0 = time.perf_counter()
        await client.reassign({("moving", 0): [target]})
        during: list[float] = []
        while True:
            state = await client.reassignments()
            if not state.moving:
                break
            for r in state.moving:
                if r.progress:
                    copied = r.copied(target)
                    note(f"{copied:,} of {r.messages_to_copy:,} values copied")
            if load:
                during.append(await rate_over(counts, 1.0))
            else:
                await asyncio.sleep(1.0)
        move_s = time.perf_counter() - t0
        stop.set()
        if load is not None:
            await load
        moved = values * args.value_size
        return {
            "bench": "reassign",
            "bytes": moved,
            "values": values,
            "value_size": args.value_size,
            "fill_seconds": round(fill_s, 2),
            "move_seconds": round(move_s, 2),
            "move_mb_per_s": round(moved / move_s / 1e6, 1),
            "rate_limit_bytes_per_s": args.rate,
            "live_msgs_per_s_before": round(before),
            "live_msgs_per_s_during": round(sum(during) / len(during)) if during else None,
        }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=parse_size, default=1 << 30, help="bytes to move (default 1GiB)")
    ap.add_argument("--value-size", type=parse_size, default=64 << 10, help="bytes per value (default 64KiB)")
    ap.add_argument("--rate", type=parse_size, default=0, help="clustering.reassignment.max.rate (default 0: none)")
    ap.add_argument("--no-load", dest="load", action="store_false", help="no live publishes during the move")
    result = asyncio.run(run(ap.parse_args()))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
