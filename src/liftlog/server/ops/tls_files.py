"""The API's TLS context, reloaded when its files change: renewed certificates without a restart.

A listening socket keeps the ``ssl.SSLContext`` it was started with, so that
one (the *base*) stays; its SNI callback, which OpenSSL calls on every
ClientHello (with or without a server name), hands each new connection the
newest context. Connections already open keep the certificate they started
with. A reload that fails (a file half written, a key that does not match)
keeps the previous context and is tried again at the next check.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass

__all__ = ["ReloadingTls", "TlsFiles"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TlsFiles:
    """``tls.cert``, ``tls.key``, ``tls.client.auth.ca`` and ``tls.client.auth.enabled``."""

    cert: str
    key: str
    client_ca: str = ""
    require_client_cert: bool = False

    def context(self) -> ssl.SSLContext:
        """A server context from the files as they are now (ssl.SSLError or OSError if unusable)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        if self.client_ca:
            context.load_verify_locations(self.client_ca)
        if self.require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
        context.set_alpn_protocols(["h2"])
        return context

    def stamp(self) -> tuple[tuple[int, int, int] | None, ...]:
        """What identifies the files' current contents: inode, size and mtime of each."""
        return tuple(_stat(path) for path in (self.cert, self.key, self.client_ca) if path)


def _stat(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class ReloadingTls:
    """The base context for the listening socket, and the newest one for each new connection."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._stamp = files.stamp()
        self.base = files.context()
        self.current = self.base
        self.base.sni_callback = self._choose
        #: Times the files changed and loaded (for logs and tests).
        self.reloads = 0

    def _choose(self, connection: ssl.SSLObject, _server_name: str | None, _context: ssl.SSLContext) -> None:
        current = self.current
        if current is not self.base:
            connection.context = current

    def reload_if_changed(self) -> bool:
        """Load the files again if they changed since the last load; True if new connections now get them."""
        stamp = self.files.stamp()
        if stamp == self._stamp:
            return False
        try:
            context = self.files.context()
        except (OSError, ssl.SSLError) as exc:
            # Perhaps caught between writing the certificate and the key: keep serving, try again later.
            log.warning("the API's TLS files changed but cannot be loaded (%s); still serving the previous ones", exc)
            return False
        self._stamp = stamp
        self.current = context
        self.reloads += 1
        log.info("reloaded the API's TLS certificate from %s", self.files.cert)
        return True
