"""Running bench scenarios and the servers they run against: shared by ``liftlog bench`` and its
``--start-cluster`` mode (:mod:`liftlog.cli.bench_cluster`), and by the benchmarks under ``bench/``."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from liftlog.cli.bench_plot import Series
from liftlog.cli.bench_scenarios import RUNNERS, Settings
from liftlog.cli.common import CommandError

if TYPE_CHECKING:
    from liftlog.client import TlsConfig

__all__ = ["error_result", "free_port", "log_tail", "run_all", "scenario_errors", "spawned_server", "stop_processes"]

_READY_TIMEOUT_S = 30.0
_STOP_TIMEOUT_S = 15.0


def scenario_errors() -> tuple[type[BaseException], ...]:
    import nats.errors

    from liftlog.api.envelope import EnvelopeError
    from liftlog.client import LiftlogError

    return (LiftlogError, OSError, CommandError, EnvelopeError, nats.errors.Error)


def error_result(exc: BaseException, limit: float | None = None) -> dict[str, str]:
    """The result of a scenario that failed with `exc` (a bare timeout: after its `limit` seconds)."""
    if limit is not None and isinstance(exc, TimeoutError) and not str(exc):
        return {"error": f"timed out after {limit:.0f} s"}
    return {"error": str(exc) or type(exc).__name__}


async def run_all(
    addrs: list[str],
    s: Settings,
    scenarios: list[str],
    status: Callable[[str], None],
    tls: TlsConfig | None = None,
    series: dict[str, Series] | None = None,
) -> dict[str, Any]:
    """Each scenario's JSON result by name; with `series`, what --plot draws goes there, by name too."""
    from liftlog.client import Client

    errors = scenario_errors()
    run_id = uuid.uuid4().hex[:8]
    results: dict[str, Any] = {}
    async with Client(addrs, tls=tls) as client:
        for scenario in scenarios:
            count = s.counts[scenario]
            name, subject = f"bench-{run_id}-{scenario}", f"bench.{run_id}.{scenario}"
            status(f"{scenario}: {count:,} messages of {s.size} bytes")
            limit = 30 + count / 500  # generous: a stalled scenario fails instead of hanging the run
            try:
                async with asyncio.timeout(limit):
                    await client.create_stream(
                        subject, name, partitions=s.partitions, encryption=True if s.encryption else None
                    )
                    result = await RUNNERS[scenario](client, s, name, subject, count)
                    results[scenario] = result.to_json()
                    if series is not None and (drawn := Series.of(scenario, result)) is not None:
                        series[scenario] = drawn
            except errors as exc:  # (TimeoutError is an OSError; the client's ack timeouts are LiftlogErrors)
                results[scenario] = error_result(exc, limit)
            finally:
                with contextlib.suppress(*errors):
                    await asyncio.wait_for(client.delete_stream(name), 10)
    return results


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return " | ".join(line.strip() for line in tail if line.strip())


def stop_processes(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM all, wait for all (one shared deadline), SIGKILL the stragglers."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.asynccontextmanager
async def spawned_server(settings: tuple[str, ...] = (), master_key: bool = False) -> AsyncIterator[tuple[str, str]]:
    """A server with embedded NATS on free ports in a temporary directory: yields (address, NATS URL).

    ``settings`` are KEY=VALUE server settings (``--set``); ``master_key`` gives it an encryption master key.
    """
    from liftlog.client import Client, LiftlogError
    from liftlog.security.master_key import generate_master_key_file

    root = Path(tempfile.mkdtemp(prefix="liftlog-bench-"))
    if master_key:
        generate_master_key_file(root / "master.key")
        settings = (*settings, f"encryption.key.file={root / 'master.key'}")
    port, nats_port = free_port(), free_port()
    address = f"127.0.0.1:{port}"
    log_path = root / "server.log"
    command = [sys.executable, "-m", "liftlog.cli.main", "server", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--embedded-nats", "--embedded-nats-port", str(nats_port), "--data-dir", str(root / "data")]
    command += ["--log-level", "warn"]
    for setting in settings:
        command += ["--set", setting]
    with open(log_path, "wb") as log:
        # A session of its own: Ctrl-C reaches only us, and we stop the server in order below.
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise CommandError(f"the benchmark server exited with code {proc.returncode}: {log_tail(log_path)}")
            try:
                async with Client([address], timeout=1.0, retries=0) as probe:
                    await probe.fetch_metadata()
                break
            except LiftlogError:
                if time.monotonic() > deadline:
                    raise CommandError(
                        f"the benchmark server did not answer within {_READY_TIMEOUT_S:.0f} s: {log_tail(log_path)}"
                    ) from None
                await asyncio.sleep(0.2)
        yield address, f"nats://127.0.0.1:{nats_port}"
    finally:
        stop_processes([proc])
        shutil.rmtree(root, ignore_errors=True)
