"""A 3-server cluster under load with faults, scraped by a real Prometheus, drawn as the dashboard.

Makes docs/images/dashboard.png: a nats-server, three liftlog servers with
``metrics.listen``, and Prometheus (the ``prometheus`` binary on PATH, e.g.
Debian's package) scraping them every 2 s, all on loopback with temporary
data. Two streams take publishes (ack ALL and LEADER) and a subscriber
reads one of them. A third of the way in, a follower is killed and restarted
30 s later (follower lag, ISR shrink and regrowth); at two thirds the
controller is killed and restarted (an election, a failover). Then
``render.py`` draws the dashboard from Prometheus.

    python deploy/grafana/demo.py --minutes 4 --out docs/images/dashboard.png
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import render

from liftlog.client import AckPolicy, Client, StartPosition
from liftlog.security.cluster_auth import generate_key_file
from liftlog.server.nats.embedded_nats import find_nats_server_binary

IDS = ("a", "b", "c")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2):
            return
        time.sleep(0.2)
    raise TimeoutError(url)


class Demo:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.nats_port = free_port()
        self.api = {sid: free_port() for sid in IDS}
        self.metrics = {sid: free_port() for sid in IDS}
        self.prom_port = free_port()
        self.key = self.root / "cluster.key"  # the servers' shared secret
        generate_key_file(self.key)

    def spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / f"{name}.log", "ab")  # noqa: SIM115
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start_server(self, sid: str) -> None:
        self.spawn(
            sid,
            [
                sys.executable, "-m", "liftlog.cli.main", "server",
                "--id", sid, "--data-dir", str(self.root / sid), "--port", str(self.api[sid]),
                "--nats-servers", f"nats://127.0.0.1:{self.nats_port}", "--raft-bootstrap-peers", ",".join(IDS),
                "--namespace", "demo",
                "--set", f"clustering.auth.key.file={self.key}",
                "--set", f"metrics.listen=127.0.0.1:{self.metrics[sid]}",
                "--set", "clustering.replica.max.lag.time=5s",
                "--set", "streams.fsync.policy=always",
            ],
        )  # fmt: skip

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def start(self) -> None:
        self.spawn("nats", [str(find_nats_server_binary()), "-a", "127.0.0.1", "-p", str(self.nats_port)])
        for sid in IDS:
            self.start_server(sid)
        targets = ", ".join(f"'127.0.0.1:{self.metrics[sid]}'" for sid in IDS)
        config = self.root / "prometheus.yml"
        config.write_text(
            f"global: {{scrape_interval: 2s, evaluation_interval: 2s}}\n"
            f"scrape_configs:\n  - job_name: liftlog\n    static_configs:\n      - targets: [{targets}]\n"
        )
        prometheus = shutil.which("prometheus")
        if prometheus is None:
            raise SystemExit("needs the prometheus binary on PATH (Debian: apt install prometheus)")
        self.spawn(
            "prometheus",
            [
                prometheus, f"--config.file={config}", f"--storage.tsdb.path={self.root / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.prom_port}",
            ],
        )  # fmt: skip
        for sid in IDS:
            wait_http(f"http://127.0.0.1:{self.metrics[sid]}/healthz")
        wait_http(f"http://127.0.0.1:{self.prom_port}/-/ready")

    def stop(self) -> None:
        for name in list(self.procs):
            self.kill(name)

    def controller(self) -> str:
        for sid in IDS:
            with contextlib.suppress(OSError):
                url = f"http://127.0.0.1:{self.metrics[sid]}/metrics"
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if b"\nliftlog_controller 1.0" in resp.read():
                        return sid
        return ""


async def load(demo: Demo, seconds: float) -> None:
    addresses = [f"127.0.0.1:{demo.api[sid]}" for sid in IDS]
    client = Client(addresses, timeout=15)
    await client.connect()
    for _ in range(100):
        try:
            await client.create_stream("orders", "orders", partitions=3, replication_factor=3)
            await client.create_stream("clicks", "clicks", partitions=2, replication_factor=2)
            break
        except Exception:
            await asyncio.sleep(0.5)
    end = time.monotonic() + seconds
    payload = b"x" * 256

    async def publisher(stream: str, partitions: int, policy: AckPolicy, per_round: int) -> None:
        n = 0
        while time.monotonic() < end:
            with contextlib.suppress(Exception):
                await client.publish_many(
                    stream, [payload] * per_round, partition=n % partitions, ack_policy=policy, timeout=10
                )
            n += 1
            await asyncio.sleep(0.05)

    async def reader() -> None:
        while time.monotonic() < end:
            with contextlib.suppress(Exception):
                sub = client.subscribe("orders", partition=0, start_position=StartPosition.EARLIEST)
                async for _msg in sub:
                    if time.monotonic() > end:
                        break
            await asyncio.sleep(1)

    async def faults() -> None:
        await asyncio.sleep(seconds / 3)
        victim = next(sid for sid in IDS if sid != demo.controller())
        print(f"killing follower {victim}", flush=True)
        demo.kill(victim)
        await asyncio.sleep(30)
        demo.start_server(victim)
        await asyncio.sleep(max(0.0, seconds * 2 / 3 - seconds / 3 - 30))
        leader = demo.controller()
        if leader:
            print(f"killing controller {leader}", flush=True)
            demo.kill(leader)
            await asyncio.sleep(15)
            demo.start_server(leader)

    tasks = [
        asyncio.create_task(publisher("orders", 3, AckPolicy.ALL, 200)),
        asyncio.create_task(publisher("clicks", 2, AckPolicy.LEADER, 400)),
        asyncio.create_task(reader()),
        asyncio.create_task(faults()),
    ]
    await asyncio.sleep(seconds)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=4)
    parser.add_argument("--out", type=Path, default=Path("docs/images/dashboard.png"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="liftlog-demo-") as tmp:
        demo = Demo(Path(tmp))
        try:
            demo.start()
            asyncio.run(load(demo, args.minutes * 60))
            time.sleep(5)  # the last scrapes
            render.draw(
                f"http://127.0.0.1:{demo.prom_port}",
                args.minutes + 0.5,
                "20s",
                args.out,
                "3 servers under load; a follower killed at 1/3, the controller at 2/3 (rendered by render.py)",
            )
            print(f"wrote {args.out}")
        finally:
            demo.stop()


if __name__ == "__main__":
    main()
