"""Running a server as a process: logging, the event loop, signals, the banner."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from liftlog.server.config import ServerConfig
from liftlog.server.errors import ServerStartError
from liftlog.server.ops.logformat import setup_logging
from liftlog.server.rlimits import check_partition_budget, raise_open_files_limit
from liftlog.server.server import Server

__all__ = ["run_server"]

log = logging.getLogger("liftlog.server")


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover  (uvloop is a dependency on POSIX)
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


async def serve(config: ServerConfig, server: Server | None = None) -> int:
    """Start a server, print how to reach it, run until SIGINT/SIGTERM, stop it cleanly.

    ``server`` is one built from ``config`` with other parts (the fault suite's FileIO and clock);
    by default a plain ``Server(config)``. Returns the exit code: 0 after a signal, 1 when the server
    failed on its own.
    """
    before, after = raise_open_files_limit()
    shown = {0: "unlimited"}
    if after != before:
        log.info("open-file limit raised from %s to %s", shown.get(before, before), shown.get(after, after))
    else:
        log.info("open-file limit: %s", shown.get(after, after))
    warning = check_partition_budget(config.clustering.max_partitions_per_server, after)
    if warning:
        log.warning("%s", warning)
    server = Server(config) if server is None else server
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    loop.add_signal_handler(signal.SIGHUP, server.reload)
    metrics = f"http://{server.metrics_address}/metrics" if server.metrics_address else "off (metrics.listen)"
    if config.logging.format == "json":  # keep stderr one JSON object per line
        log.info(
            "liftlog server %s is ready: gRPC API %s, NATS %s, data %s, metrics %s",
            server.server_id,
            server.address,
            server.nats_url,
            config.data_dir.resolve(),
            metrics,
        )
    else:
        print(
            f"liftlog server {server.server_id} is ready\n"
            f"  gRPC API:  {server.address}   (liftlog stream list -a {server.address})\n"
            f"  NATS:      {server.nats_url}\n"
            f"  data:      {config.data_dir.resolve()}\n"
            f"  metrics:   {metrics}\n"
            "  stop with Ctrl-C",
            file=sys.stderr,
            flush=True,
        )
    signalled = asyncio.ensure_future(stop.wait())
    failed = asyncio.ensure_future(server.failed.wait())
    try:
        await asyncio.wait([signalled, failed], return_when=asyncio.FIRST_COMPLETED)
    finally:
        signalled.cancel()
        failed.cancel()
        log.info("shutting down")
        await server.stop()
        log.info("stopped")
    if server.failure:
        if config.logging.format == "json":
            log.error("stopped after a failure: %s", server.failure)
        else:
            print(f"error: {server.failure}", file=sys.stderr, flush=True)
        return 1
    return 0


def run_server(config: ServerConfig) -> int:
    """Run a server in this process until it is signalled; return the exit code.

    Raises ServerStartError (one readable line) when it cannot start.
    """
    setup_logging(config.log_level, config.logging.format, raft=config.logging.raft, nats=config.logging.nats)
    try:
        with asyncio.Runner(loop_factory=_new_event_loop) as runner:
            return runner.run(serve(config))
    except ServerStartError as exc:
        if config.logging.format != "json":
            raise
        log.error("cannot start: %s", exc)  # stderr stays JSON lines
        return 1
