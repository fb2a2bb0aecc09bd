"""A private CA and certificates for TLS on the API, made in one step (``liftlog keygen --tls DIR``).

For trying TLS and mTLS and for small deployments: a CA (``ca.pem``, ``ca.key``), a server certificate
valid for the names given (``server.pem``, ``server.key``) and a client certificate whose common name is
the identity authorization sees (``client.pem``, ``client.key``). ECDSA P-256 keys, SHA-256
signatures; private keys are written readable by their owner only. Organisations with their own CA
should use it instead.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .cluster_auth import write_new_private_file

__all__ = ["TLS_FILES", "make_tls_files"]

TLS_FILES = ("ca.pem", "ca.key", "server.pem", "server.key", "client.pem", "client.key")


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _alt_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def make_tls_files(directory: Path, hosts: list[str], client_name: str = "client", days: int = 365) -> list[Path]:
    """Write the CA, server and client files into ``directory`` (made if missing); the paths written.

    ``hosts`` are the names and addresses clients reach the server by. Refuses (FileExistsError) to
    overwrite any of the files.
    """
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / name for name in TLS_FILES]
    existing = [p for p in paths if p.exists()]
    if existing:
        raise FileExistsError(f"{existing[0]} exists; remove the old files first, or choose another directory")
    now = datetime.datetime.now(datetime.UTC)

    def builder(subject: str, issuer: str, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(_name(subject))
            .issuer_name(_name(issuer))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        builder("liftlog CA", "liftlog CA", ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())

    def issue(subject: str, usage: x509.ObjectIdentifier, alt: list[str]) -> tuple[x509.Certificate, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = builder(subject, "liftlog CA", key).add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        cert = cert.add_extension(authority, critical=False)
        if alt:
            cert = cert.add_extension(x509.SubjectAlternativeName([_alt_name(h) for h in alt]), critical=False)
        return cert.sign(ca_key, hashes.SHA256()), _private(key)

    server, server_key = issue(hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, hosts)
    client, client_key = issue(client_name, ExtendedKeyUsageOID.CLIENT_AUTH, [])
    pem = serialization.Encoding.PEM
    for path, data, private in (
        (paths[0], ca.public_bytes(pem), False),
        (paths[1], _private(ca_key), True),
        (paths[2], server.public_bytes(pem), False),
        (paths[3], server_key, True),
        (paths[4], client.public_bytes(pem), False),
        (paths[5], client_key, True),
    ):
        if private:
            write_new_private_file(path, data.decode())
        else:
            path.write_bytes(data)
    return paths


def _private(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
