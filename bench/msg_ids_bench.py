"""What message ids cost: publish_many with and without ids, in one run, on one server. Prints one JSON line.

    python bench/msg_ids_bench.py [--messages N] [--size B] [--rounds R] [--ack leader|all]

Starts a server with embedded NATS in a temporary directory (fsync never, its default), then alternates
rounds: ``publish_many`` of --messages values of --size bytes into a new stream, once with a client that
gives every message an id (``Client(idempotent=True)``, the default: each record carries a Nats-Msg-Id
header, the leader screens and remembers each id) and once without (``idempotent=False``). The figure to
quote is the ratio of the medians (with ids / without), measured in the same run; absolute rates move with
the machine. Issue 34 asks for at most 5% cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

from liftlog.cli.bench_processes import spawned_server
from liftlog.client import AckPolicy, Client


async def one_round(address: str, stream: str, ids: bool, payload: list[bytes], policy: AckPolicy) -> float:
    async with Client(address, idempotent=ids) as client:
        await client.create_stream(stream, stream)
        await client.publish(stream, b"warm-up")
        started = time.perf_counter()
        await client.publish_many(stream, payload, ack_policy=policy, return_acks=False)
        elapsed = time.perf_counter() - started
        await client.delete_stream(stream)
    return len(payload) / elapsed


async def main(args: argparse.Namespace) -> dict[str, object]:
    # Distinct values: identical chunks would hit the servers' cache of checked batches (liftlog.storage.records
    # check_records), which real traffic does not, and flatter whichever side has identical chunks.
    pad = b"x" * max(0, args.size - 12)
    payload = [b"%012d" % i + pad for i in range(args.messages)]
    policy = AckPolicy.ALL if args.ack == "all" else AckPolicy.LEADER
    rates: dict[str, list[float]] = {"with_ids": [], "without_ids": []}
    async with spawned_server() as (address, _nats):
        for i in range(args.rounds):
            order = (True, False) if i % 2 == 0 else (False, True)  # alternate who goes first
            for ids in order:
                rate = await one_round(address, f"ids-{i}-{int(ids)}", ids, payload, policy)
                rates["with_ids" if ids else "without_ids"].append(rate)
                print(f"round {i + 1}: {'with' if ids else 'without'} ids {rate:,.0f} msgs/s", file=sys.stderr)
    with_ids = statistics.median(rates["with_ids"])
    without = statistics.median(rates["without_ids"])
    return {
        "bench": "msg_ids",
        "messages": args.messages,
        "size": args.size,
        "ack": args.ack,
        "rounds": args.rounds,
        "with_ids_msgs_per_s": round(with_ids),
        "without_ids_msgs_per_s": round(without),
        "ratio": round(with_ids / without, 3),
        "all": {k: [round(v) for v in vs] for k, vs in rates.items()},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ack", choices=("leader", "all"), default="all")
    print(json.dumps(asyncio.run(main(parser.parse_args()))))
