"""A fake ``proto.API`` servicer for the transport tests, and a server running it on 127.0.0.1.

The generated stubs of liftlog's API can then call it: every client library
sees the real method paths and message types. What ``Publish`` does is chosen
by the request's ``stream`` field; ``Subscribe`` sends ``startOffset``
messages of ``stopOffset`` bytes each (``stream="forever"``: until cancelled).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import hashlib
import ipaddress
import json
import shutil
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from liftlog.api import api_pb2
from liftlog.rpc import Method, RpcServer, ServerContext, ServerOptions, StatusCode, service_methods

SERVICE = api_pb2.DESCRIPTOR.services_by_name["API"]
ERROR_DETAILS = "it failed: ü 100%"


class FakeAPI:
    def __init__(self) -> None:
        self.cancelled: list[str] = []  # calls whose handler task was cancelled, by request.stream
        self.started: asyncio.Queue[str] = asyncio.Queue()  # calls that reached their handler
        self.finished: list[str] = []
        self.writes = 0  # messages Subscribe wrote
        self.write_blocked = False  # Subscribe("forever") waits in context.write
        self.time_remaining: float | None = None

    async def FetchMetadata(self, request: api_pb2.FetchMetadataRequest, context: ServerContext) -> Any:
        brokers = [api_pb2.Broker(id=name, host="127.0.0.1", port=i) for i, name in enumerate(request.streams)]
        return api_pb2.FetchMetadataResponse(brokers=brokers)

    async def Publish(self, request: api_pb2.PublishRequest, context: ServerContext) -> Any:
        action = request.stream
        await self.started.put(action)
        try:
            result = await self._publish(action, request, context)
        except asyncio.CancelledError:
            self.cancelled.append(action)
            raise
        self.finished.append(action)
        return result

    async def _publish(self, action: str, request: api_pb2.PublishRequest, context: ServerContext) -> Any:
        reply = api_pb2.PublishResponse
        if action == "echo":
            return reply(correlationId=request.correlationId)
        if action == "digest":
            return reply(correlationId=f"{len(request.value)}:{hashlib.sha256(request.value).hexdigest()}")
        if action == "mirror":
            return reply(correlationId=request.value.decode())
        if action == "sleep":
            await asyncio.sleep(float(request.correlationId))
            return reply(correlationId="slept")
        if action == "hang":
            await asyncio.sleep(3600)
        if action == "abort":
            code = StatusCode(int(request.correlationId))
            await context.abort(code, ERROR_DETAILS, trailing_metadata=(("liftlog-error", "x"),))
        if action == "raise":
            raise ValueError("boom")
        if action == "deadline":
            self.time_remaining = context.time_remaining()
            return reply(correlationId=repr(self.time_remaining))
        if action == "metadata":
            metadata = [
                [k, "b64:" + base64.b64encode(v).decode() if isinstance(v, bytes) else v]
                for k, v in context.invocation_metadata()
            ]
            return reply(correlationId=json.dumps({"metadata": metadata, "peer": context.peer()}))
        raise AssertionError(f"unknown action {action!r}")

    async def Subscribe(self, request: api_pb2.SubscribeRequest, context: ServerContext) -> Any:
        value = b"v" * request.stopOffset
        if request.stream == "forever":
            try:
                while True:
                    self.write_blocked = True
                    await context.write(api_pb2.Message(offset=self.writes, value=value))
                    self.write_blocked = False
                    self.writes += 1
            except asyncio.CancelledError:
                self.cancelled.append("forever")
                raise
        for i in range(request.startOffset):
            self.writes += 1
            yield api_pb2.Message(offset=i, value=value)
        if request.stream == "fail":
            await context.abort(StatusCode.DATA_LOSS, ERROR_DETAILS, trailing_metadata=(("liftlog-error", "x"),))

    async def PublishAsync(self, requests: AsyncIterator[api_pb2.PublishRequest], context: ServerContext) -> None:
        async for request in requests:
            await context.write(api_pb2.PublishResponse(correlationId=request.correlationId))


def implemented_methods(servicer: object) -> list[Method]:
    """Every method of ``proto.API``: the servicer's handlers, UNIMPLEMENTED for the ones it lacks."""
    return service_methods(SERVICE, servicer)


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def serving(
    servicer: object, options: ServerOptions | None = None, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[RpcServer]:
    """An RpcServer on 127.0.0.1 (port ``server.port``) on the running loop; stopped on exit."""
    server = RpcServer(implemented_methods(servicer), options or ServerOptions())
    server.bind("127.0.0.1", 0)
    await server.start(ssl_context)
    try:
        yield server
    finally:
        await server.stop(0)


# -- TLS ---------------------------------------------------------------------------


CERT_FILES = ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")


def make_certificates(directory: Path) -> dict[str, Path] | None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate in ``directory``; None if no tool can.

    Made with the ``cryptography`` package where it is installed, else with the openssl CLI.
    """
    made = _with_cryptography(directory)
    if made is None:
        made = _with_openssl(directory)
    return made


def _with_cryptography(directory: Path) -> dict[str, Path] | None:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        return None
    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def save(stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        (directory / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (directory / f"{stem}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )

    def builder(subject: str, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name("test-ca"))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        builder("test-ca", ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    save("ca", ca, ca_key)
    issuer = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    server_key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    server = (
        builder("server", server_key)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(issuer, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    save("server", server, server_key)
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = (
        builder("client", client_key)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(issuer, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    save("client", client, client_key)
    return {name: directory / name for name in CERT_FILES}


def _with_openssl(directory: Path) -> dict[str, Path] | None:
    openssl = shutil.which("openssl")
    if openssl is None:
        return None

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=directory)

    run(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
        "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.pem",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
    )  # fmt: skip
    for name, ext in [
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ]:
        (directory / f"{name}.ext").write_text(ext + "\n")
        run(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr",
        )  # fmt: skip
        run(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext",
        )  # fmt: skip
    return {name: directory / name for name in CERT_FILES}
