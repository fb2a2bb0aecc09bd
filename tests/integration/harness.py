"""Real processes for integration tests: a nats-server and liftlog servers on loopback ports."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
from nats.aio.client import Client as NatsClient

from liftlog.api import api_pb2, api_pb2_grpc
from liftlog.security.cluster_auth import generate_key_file
from liftlog.server.nats.embedded_nats import find_nats_server_binary

T = TypeVar("T")

_test_key: Path | None = None


def shared_cluster_key() -> Path:
    """One cluster secret for every test server that is given none: servers refuse to join a cluster without
    one, and test clusters are formed in many places. Tests of the default itself opt out."""
    global _test_key
    if _test_key is None:
        _test_key = Path(tempfile.mkdtemp(prefix="liftlog-test-key-")) / "cluster.key"
        generate_key_file(_test_key)
    return _test_key


def sets_cluster_auth(args: object, env: object = ()) -> bool:
    """Whether a server's flags (or environment) already say how it authenticates to its cluster."""
    return any("clustering.auth" in str(a) or "CLUSTERING_AUTH" in str(a) for a in [*args, *env])  # type: ignore[misc]


def eventually(check: Callable[[], T | None], timeout: float = 20.0, what: str = "condition") -> T:
    """Poll ``check`` every 0.1 s until it returns something true; gRPC errors meanwhile count as not yet."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except grpc.RpcError as exc:
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"{what} not reached within {timeout}s (last error: {last})")


async def nats_settled(nc: NatsClient, timeout: float = 10.0) -> None:
    """Return once nats-server has processed everything ``nc`` sent so far (its SUBs above all).

    ``nc.flush()`` is no such barrier in nats-py (2.15, 2.16): its PING goes straight to the socket
    while earlier commands wait for the flusher task, so the PONG can come back before a SUB it
    followed reached the server, and a publisher on another connection then finds no subscriber.
    A message sent to ourselves goes through the same queue, and the server handles a connection's
    commands in order.
    """
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, max_msgs=1)
    await nc.publish(inbox, b"")
    await sub.next_msg(timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _PortTaken(Exception):
    """The server exited because its port was taken."""


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


class NatsProcess:
    """A plain nats-server, as a deployment liftlog connects to would run it."""

    def __init__(self, log_path: Path, config: str = "", env: dict[str, str] | None = None, port: int = 0) -> None:
        """``config``: nats-server configuration text (e.g. ``max_payload: 8KB``), written beside the log;
        ``env``: variables added to its environment (a config's ``$VAR`` reads them); ``port``: 0 for any free one
        (a restart passes the port it had)."""
        self.port = port or free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self._log = open(log_path, "wb")  # noqa: SIM115
        args = []
        if config:
            conf = log_path.with_suffix(".conf")
            conf.write_text(config)
            args = ["-c", str(conf)]
        self.proc = subprocess.Popen(
            [str(find_nats_server_binary()), *args, "-a", "127.0.0.1", "-p", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        try:
            wait_for_port(self.port)
        except TimeoutError:
            self.proc.kill()
            raise RuntimeError(f"nats-server did not start: {log_path.read_text(errors='replace')}") from None

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self._log.close()


class LiftlogProcess:
    """``liftlog server`` in a child process; ``address`` is its gRPC host:port."""

    def __init__(
        self,
        data_dir: Path,
        *args: str,
        nats_url: str | None = None,
        server_id: str | None = "s1",
        bootstrap: str | None = "seed",
        env: dict[str, str] | None = None,
        test_key: bool = True,
    ) -> None:
        """``bootstrap``: "seed" founds a cluster of one when on external NATS; None joins; else peer ids.
        ``test_key``: the tests' shared cluster secret, unless the flags or ``env`` name one (or insecure)."""
        self.data_dir = data_dir
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.server_id = server_id
        self.args = list(args)
        if test_key and not sets_cluster_auth(args, env or {}):
            self.args += ["--set", f"clustering.auth.key.file={shared_cluster_key()}"]
        self.nats_url = nats_url
        self.bootstrap = bootstrap
        #: Added to the environment after every inherited LIFTLOG_* variable is removed.
        self.env = env or {}
        self.log_path = data_dir.parent / f"{data_dir.name}-{server_id or 'anon'}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        #: Answered once: its address is known to the cluster and to clients from now on.
        self.started = False

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "liftlog.cli.main", "server", "--data-dir", str(self.data_dir)]
        cmd += ["--port", str(self.port), *self.args]
        if self.server_id:
            cmd += ["--id", self.server_id]
        if self.nats_url:
            cmd += ["--nats-servers", self.nats_url]
            if self.bootstrap == "seed":
                cmd += ["--raft-bootstrap-seed"]
            elif self.bootstrap:
                cmd += ["--raft-bootstrap-peers", self.bootstrap]
        return cmd

    def start(self, timeout: float = 30.0) -> LiftlogProcess:
        for _ in range(3):
            try:
                return self._start(timeout)
            except _PortTaken:
                # free_port() only found a port that was free then; some other socket took it since.
                # A first start may move (nobody knows the address yet); a restart must keep its port.
                if self.started:
                    raise RuntimeError(f"liftlog server could not listen on its port again:\n{self.output()}") from None
                self.port = free_port()
                self.address = f"127.0.0.1:{self.port}"
        raise RuntimeError(f"liftlog server found no free port in 3 tries:\n{self.output()}")

    def _start(self, timeout: float) -> LiftlogProcess:
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")  # noqa: SIM115
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIFTLOG_")} | self.env
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                with open(self.log_path, "rb") as f:
                    f.seek(log_start)
                    if f"error: cannot listen on 127.0.0.1:{self.port}:".encode() in f.read():
                        raise _PortTaken
                raise RuntimeError(f"liftlog server exited with {self.proc.returncode}:\n{self.output()}")
            if self._answers():
                self.started = True
                return self
            time.sleep(0.05)
        self.kill()
        raise TimeoutError(f"liftlog server did not answer within {timeout}s:\n{self.output()}")

    def _answers(self) -> bool:
        with grpc.insecure_channel(self.address) as channel:
            try:
                api_pb2_grpc.APIStub(channel).FetchMetadata(api_pb2.FetchMetadataRequest(), timeout=0.5)
            except grpc.RpcError:
                return False
        return True

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: the graceful path."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@contextlib.contextmanager
def running(tmp_path: Path, nats_server: NatsProcess, *settings: str) -> Iterator[LiftlogProcess]:
    """A server of its own on ``nats_server`` with these ``key=value`` settings, killed on exit."""
    args = [arg for setting in settings for arg in ("--set", setting)]
    proc = LiftlogProcess(tmp_path / "data", *args, nats_url=nats_server.url).start()
    try:
        yield proc
    finally:
        proc.kill()


async def create_when_ready(api: api_pb2_grpc.APIStub, name: str) -> None:
    """Create stream ``name`` on subject ``name``, retrying while a just-started server knows no metadata leader."""
    for _ in range(100):
        try:
            await api.CreateStream(api_pb2.CreateStreamRequest(name=name, subject=name))
            return
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.ALREADY_EXISTS:
                return
            if err.code() != grpc.StatusCode.INTERNAL:
                raise
        await asyncio.sleep(0.1)
