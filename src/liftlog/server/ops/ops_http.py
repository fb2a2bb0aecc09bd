"""The operations endpoint on ``metrics.listen``: ``/metrics``, ``/healthz`` and ``/readyz`` over HTTP/1.1.

Served from the server's own event loop, so an answer from ``/healthz`` is
itself proof that the loop runs; a stuck loop answers nothing and the
orchestrator's probe times out. Only GET and HEAD of those three paths;
one request per connection (Prometheus and kubelets cope); a request head
past 8 KiB, one slower than 10 s, or more than 64 connections at once are
refused, so a hostile client cannot grow memory or hold the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

__all__ = ["Check", "OpsEndpoint"]

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 8 << 10
HEAD_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64


@dataclass(frozen=True)
class Check:
    """The answer of a health or readiness check: ok, and why not (each failing condition named)."""

    ok: bool
    details: dict[str, object]


class OpsEndpoint:
    def __init__(
        self,
        listen: str,
        registry: CollectorRegistry,
        health: Callable[[], Check],
        readiness: Callable[[], Check],
    ) -> None:
        host, _, port = listen.rpartition(":")
        self._host = host.strip("[]") or "0.0.0.0"
        self._port = int(port)
        self._registry = registry
        self._health = health
        self._readiness = readiness
        self._server: asyncio.Server | None = None
        self._open = 0
        self.port = self._port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._port, limit=MAX_HEAD_BYTES)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    @property
    def address(self) -> str:
        return f"{self._host}:{self.port}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open += 1
        try:
            if self._open > MAX_CONNECTIONS:
                await self._send(writer, 503, "text/plain", b"too many connections\n")
                return
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
            except (asyncio.LimitOverrunError, ValueError):
                await self._send(writer, 431, "text/plain", b"request head too large\n")
                return
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                return
            await self._answer(head, writer)
        except Exception:  # a bug answering must not take the server down
            log.exception("metrics endpoint: answering a request failed")
        finally:
            self._open -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, head: bytes, writer: asyncio.StreamWriter) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._send(writer, 400, "text/plain", b"bad request line\n")
            return
        method, target, _version = parts
        if method not in ("GET", "HEAD"):
            await self._send(writer, 405, "text/plain", b"only GET and HEAD\n", extra="Allow: GET, HEAD\r\n")
            return
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        path = target.split("?", 1)[0]
        head_only = method == "HEAD"
        if path == "/metrics":
            encoder, content_type = choose_encoder(headers.get("accept", ""))
            await self._send(writer, 200, content_type, encoder(self._registry), head_only=head_only)
        elif path in ("/healthz", "/readyz"):
            check = self._health() if path == "/healthz" else self._readiness()
            body = json.dumps({"status": "ok" if check.ok else "failing", **check.details}, sort_keys=True).encode()
            await self._send(writer, 200 if check.ok else 503, "application/json", body + b"\n", head_only=head_only)
        else:
            await self._send(writer, 404, "text/plain", b"not found: try /metrics, /healthz or /readyz\n")

    @staticmethod
    async def _send(
        writer: asyncio.StreamWriter,
        status: int,
        content_type: str,
        body: bytes,
        *,
        head_only: bool = False,
        extra: str = "",
    ) -> None:
        reason = _REASONS.get(status, "")
        writer.write(
            (
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                f"Cache-Control: no-store\r\nConnection: close\r\n{extra}\r\n"
            ).encode("latin-1")
        )
        if not head_only:
            writer.write(body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()


_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}
