"""TLS for the client's connections to servers: what to trust, which certificate to show.

``TlsConfig`` holds file paths, not an ``ssl.SSLContext``, so that it can be
pickled to Spark executors and given on a command line; each process builds
its own context from it when it creates a ``Client`` (bad files fail there,
with ConfigurationError naming them).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

from .errors import ConfigurationError

__all__ = ["TlsConfig", "TlsOption", "tls_context"]


@dataclass(frozen=True)
class TlsConfig:
    """``ca``: the CA file that signed the servers' certificates (default: the system's trusted CAs);
    ``cert`` and ``key``: this client's certificate and key, for servers that ask for one (mTLS;
    ``tls.client.auth.enabled``); ``server_name``: the name to check the servers' certificates against,
    when it is not the host they are reached at."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if self.key and not self.cert:
            raise ConfigurationError("a TLS client key needs its certificate (tls cert) too")

    def context(self) -> ssl.SSLContext:
        """A client context: TLS 1.2 or later, servers' certificates and names checked, ALPN h2."""
        try:
            context = ssl.create_default_context(cafile=self.ca or None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigurationError(f"cannot load the TLS CA file {self.ca}: {_reason(exc)}") from None
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["h2"])
        if self.cert:
            try:
                context.load_cert_chain(self.cert, self.key or None)
            except (OSError, ssl.SSLError) as exc:
                what = f"{self.cert} and {self.key}" if self.key else self.cert
                raise ConfigurationError(f"cannot load the TLS client certificate {what}: {_reason(exc)}") from None
        return context


#: What ``Client(tls=...)`` takes: a TlsConfig, a ready context, True (system CAs) or None/False (plain).
TlsOption = TlsConfig | ssl.SSLContext | bool | None


def tls_context(option: TlsOption) -> tuple[ssl.SSLContext | None, str | None]:
    """The context and server name a ``tls=`` option means."""
    if option is None or option is False:
        return None, None
    if option is True:
        return TlsConfig().context(), None
    if isinstance(option, ssl.SSLContext):
        return option, None
    if isinstance(option, TlsConfig):
        return option.context(), option.server_name
    raise ConfigurationError(f"tls must be a TlsConfig, an ssl.SSLContext, True or None, got {option!r}")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)
