"""Fuzz a live server (``make fuzz``): hostile gRPC requests and NATS messages, then check nothing broke.

A real ``liftlog server`` (embedded nats-server, a cluster secret, an
encryption master key: both streams below are encrypted at rest) gets, for
``--duration`` seconds and from a seeded random source:

- gRPC: random bytes and mutated valid requests for every method of
  ``proto.API``, ``liftlog.Batches`` and ``liftlog.Cluster`` (unary, server
  streaming and PublishAsync), sent raw with our own channel;
- NATS: random and mutated payloads on every internal subject (Raft, propose,
  join, heartbeat, replication fetch and notify, the servers' ack inboxes),
  replays of captured signed messages, and garbage on a stream's subject.

Before, a control stream gets known messages with ack ALL. After, the
checks: the process is alive and answers; the control stream holds exactly
what it held (no data changed by a rejected message); the garbage stream
still takes and serves a message (no stuck partition); resident memory grew
by less than ``--max-growth-mib``. One JSON line on stdout; exit 1 if a check
failed. ``--seed`` replays a run.

    python -m tests.fuzz.live --duration 60 --seed 7
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import nats
from tests.integration.harness import free_port, wait_for_port

from liftlog.api import api_pb2, batches_pb2, cluster_pb2
from liftlog.client import AckPolicy, Client
from liftlog.rpc import RpcError
from liftlog.rpc.channel import EOF, Channel
from liftlog.security.cluster_auth import generate_key_file
from liftlog.security.master_key import generate_master_key_file

NAMESPACE = "fuzz"
CONTROL = "fuzz-control"
SINK = "fuzz-sink"

#: Valid requests to mutate, per method path; names avoid the control stream, so a mutated
#: request that stays valid can only touch streams of its own.
TEMPLATES: dict[str, Any] = {
    "/proto.API/CreateStream": api_pb2.CreateStreamRequest(name="fz-new", subject="fz.new", partitions=2),
    "/proto.API/DeleteStream": api_pb2.DeleteStreamRequest(name="fz-new"),
    "/proto.API/PauseStream": api_pb2.PauseStreamRequest(name="fz-new", partitions=[0]),
    "/proto.API/SetStreamReadonly": api_pb2.SetStreamReadonlyRequest(name="fz-new", readonly=True),
    "/proto.API/FetchMetadata": api_pb2.FetchMetadataRequest(streams=["fz-new"]),
    "/proto.API/FetchPartitionMetadata": api_pb2.FetchPartitionMetadataRequest(stream=SINK, partition=0),
    "/proto.API/Publish": api_pb2.PublishRequest(stream=SINK, value=b"v", key=b"k", headers={"h": b"x"}),
    "/proto.API/PublishToSubject": api_pb2.PublishToSubjectRequest(subject="fz.other", value=b"v"),
    "/proto.API/SetCursor": api_pb2.SetCursorRequest(stream=SINK, cursorId="c", offset=1),
    "/proto.API/FetchCursor": api_pb2.FetchCursorRequest(stream=SINK, cursorId="c"),
    "/liftlog.Batches/Fetch": batches_pb2.FetchRequest(stream=SINK, partition=0, offset=0, maxBytes=4096),
    "/liftlog.Batches/Publish": batches_pb2.PublishRequest(stream=SINK, partition=0, count=1, records=b"\x00" * 20),
    "/liftlog.Cluster/Status": cluster_pb2.ClusterStatusRequest(),
    "/liftlog.Cluster/Reassignments": cluster_pb2.ReassignmentsRequest(),
    "/liftlog.Cluster/ListPolicies": cluster_pb2.ListPoliciesRequest(),
}
STREAMING = {
    "/proto.API/Subscribe": api_pb2.SubscribeRequest(stream=SINK, partition=0, startPosition=api_pb2.EARLIEST),
}
PUBLISH_ASYNC = "/proto.API/PublishAsync"


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One of: random bytes, a flipped byte, a truncation, an insertion, a duplicated slice."""
    kind = rng.randrange(5)
    if kind == 0 or not data:
        return rng.randbytes(rng.randrange(0, 200))
    pos = rng.randrange(len(data))
    if kind == 1:
        out = bytearray(data)
        out[pos] ^= rng.randrange(1, 256)
        return bytes(out)
    if kind == 2:
        return data[:pos]
    if kind == 3:
        return data[:pos] + rng.randbytes(rng.randrange(1, 40)) + data[pos:]
    end = rng.randrange(pos, len(data) + 1)
    return data[:end] + data[pos:end] + data[end:]


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class LiveFuzz:
    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.port = free_port()
        self.nats_port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nats_url = f"nats://127.0.0.1:{self.nats_port}"
        self.codes: Counter[str] = Counter()
        self.nats_sent = 0
        self.failures: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = root / "server.log"

    # -- the server ------------------------------------------------------------------

    def start(self) -> None:
        key = self.root / "cluster.key"
        generate_key_file(key)
        command = [sys.executable, "-m", "liftlog.cli.main", "server", "--embedded-nats"]
        command += ["--embedded-nats-port", str(self.nats_port), "--port", str(self.port), "--id", "fz"]
        command += ["--data-dir", str(self.root / "data"), "--namespace", NAMESPACE]
        command += ["--set", f"clustering.auth.key.file={key}", "--set", "logging.warnings.interval=5s"]
        master = self.root / "master.key"  # both streams are encrypted at rest: fuzzing reaches that path too
        generate_master_key_file(master)
        command += ["--set", f"encryption.key.file={master}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIFTLOG_")}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        wait_for_port(self.port, timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    # -- the run ---------------------------------------------------------------------

    async def prepare(self) -> list[bytes]:
        control = [f"control-{i}".encode() for i in range(200)]
        async with Client(self.address, timeout=15) as client:
            await client.create_stream(CONTROL, CONTROL, exist_ok=True, encryption=True)
            await client.create_stream(SINK, SINK, exist_ok=True, encryption=True)
            await client.publish_many(CONTROL, control, ack_policy=AckPolicy.ALL)
        return control

    async def fuzz_grpc(self, channel: Channel) -> None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.7:
            path = rng.choice(sorted(TEMPLATES))
            request = mutate(rng, TEMPLATES[path].SerializeToString())
            unary = channel.unary_unary(path, bytes, bytes)
            try:
                await unary(request, timeout=2.0)
                self.codes["OK"] += 1
            except RpcError as exc:
                self.codes[exc.code.name] += 1
        elif roll < 0.85:
            path = rng.choice(sorted(STREAMING))
            stream = channel.unary_stream(path, bytes, bytes)(
                mutate(rng, STREAMING[path].SerializeToString()), timeout=0.5
            )
            try:
                for _ in range(3):
                    if await stream.read() is EOF:
                        break
                self.codes["OK"] += 1
            except RpcError as exc:
                self.codes[exc.code.name] += 1
            finally:
                stream.cancel()
        else:
            call = channel.stream_stream(PUBLISH_ASYNC, bytes, bytes)(timeout=2.0)
            template = api_pb2.PublishRequest(stream=SINK, value=b"async", correlationId="1").SerializeToString()
            try:
                for _ in range(rng.randrange(1, 5)):
                    await call.write(mutate(rng, template))
                await call.done_writing()
                while await call.read() is not EOF:
                    pass
                self.codes["OK"] += 1
            except RpcError as exc:
                self.codes[exc.code.name] += 1
            finally:
                call.cancel()

    async def fuzz_nats(self, nc: Any, captured: list[tuple[str, bytes]]) -> None:
        rng = self.rng
        subjects = [
            f"{NAMESPACE}.raft.metadata.fz",
            f"{NAMESPACE}.raft.metadata.fz.propose",
            f"{NAMESPACE}.raft.metadata.fz.applied",
            f"{NAMESPACE}.raft.metadata.fz.leo",
            f"{NAMESPACE}.raft.metadata.join",
            f"{NAMESPACE}.raft.metadata.heartbeat",
            f"{NAMESPACE}.fetch.fz",
            f"{NAMESPACE}.offset.fz",
            f"{NAMESPACE}.notify.fz",
            SINK,
        ]
        roll = rng.random()
        if captured and roll < 0.3:
            subject, data = rng.choice(captured)
            payload = data if rng.random() < 0.5 else mutate(rng, data)  # a replay, or an altered copy
        else:
            subject = rng.choice(subjects)
            payload = rng.randbytes(rng.randrange(0, 300))
        await nc.publish(subject, payload)
        self.nats_sent += 1

    async def check(self, control: list[bytes]) -> dict[str, Any]:
        assert self.proc is not None
        if self.proc.poll() is not None:
            self.failures.append(f"the server exited with {self.proc.returncode}")
            return {}
        async with Client(self.address, timeout=15) as client:
            values = [bytes(v) for cols in [c async for c in client.read_range(CONTROL)] for v in cols.values]
            if values != control:
                self.failures.append(f"the control stream changed: {len(values)} values, expected {len(control)}")
            ack = await client.publish(SINK, b"still serving", ack_policy=AckPolicy.LEADER)
            if ack is None:
                self.failures.append("no ack from the garbage stream")
            else:
                got = [
                    bytes(v)
                    for cols in [c async for c in client.read_range(SINK, start_offset=ack.offset)]
                    for v in cols.values
                ]
                if got[:1] != [b"still serving"]:
                    self.failures.append(f"the garbage stream did not serve its new message: {got[:1]}")
            return {"control_messages": len(values)}

    async def run(self, duration: float, max_growth_mib: float) -> dict[str, Any]:
        control = await self.prepare()
        assert self.proc is not None
        rss_start = rss_mib(self.proc.pid)
        captured: list[tuple[str, bytes]] = []

        async def capture(msg: Any) -> None:
            if len(captured) < 200:
                captured.append((msg.subject, msg.data))

        nc = await nats.connect(self.nats_url)
        await nc.subscribe(f"{NAMESPACE}.>", cb=capture)
        channel = Channel(self.address, connect_timeout=5)
        deadline = time.monotonic() + duration
        rounds = 0
        try:
            while time.monotonic() < deadline:
                await self.fuzz_grpc(channel)
                await self.fuzz_nats(nc, captured)
                rounds += 1
                if rounds % 500 == 0 and self.proc.poll() is not None:
                    break
            await nc.flush()
        finally:
            await channel.close()
            await nc.close()
        await asyncio.sleep(1.0)  # let what is queued be handled before the checks
        checked = await self.check(control)
        rss_end = rss_mib(self.proc.pid) if self.proc.poll() is None else 0.0
        if rss_end - rss_start > max_growth_mib:
            self.failures.append(f"resident memory grew by {rss_end - rss_start:.0f} MiB (limit {max_growth_mib:g})")
        return {
            "rounds": rounds,
            "grpc_codes": dict(sorted(self.codes.items())),
            "nats_messages": self.nats_sent,
            "captured_signed": len(captured),
            "rss_start_mib": round(rss_start, 1),
            "rss_end_mib": round(rss_end, 1),
            **checked,
        }


async def fuzz(duration: float, seed: int, max_growth_mib: float, root: Path) -> dict[str, Any]:
    run = LiveFuzz(root, seed)
    run.start()
    try:
        result = await run.run(duration, max_growth_mib)
    finally:
        run.stop()
    dropped = [line for line in run.log.read_text(errors="replace").splitlines() if "dropped a" in line]
    text = run.log.read_text(errors="replace")
    tracebacks = text.count("Traceback")
    if tracebacks:
        first = text[text.index("Traceback") :].splitlines()[:40]
        run.failures.append(f"{tracebacks} tracebacks in the server log; the first: " + "\n".join(first))
    if run.failures:  # the run's directory goes: keep what explains the failure
        kept = Path(tempfile.gettempdir()) / f"liftlog-fuzz-{seed}.log"
        shutil.copyfile(run.log, kept)
        run.failures.append(f"server log kept in {kept}")
    return {
        "seed": seed,
        "duration_s": duration,
        **result,
        "drop_log_lines": len(dropped),
        "failures": run.failures,
        "ok": not run.failures,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of fuzzing")
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: random, printed)")
    parser.add_argument("--max-growth-mib", type=float, default=200.0, help="allowed growth of resident memory")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    with tempfile.TemporaryDirectory(prefix="liftlog-fuzz-") as root:
        report = asyncio.run(fuzz(args.duration, seed, args.max_growth_mib, Path(root)))
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
