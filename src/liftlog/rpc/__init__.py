"""liftlog's own gRPC over HTTP/2: a sans-IO connection core and a thin asyncio shell.

``connection`` is the protocol core (frames, streams, flow control, gRPC
message framing, policing); ``server`` runs handlers on asyncio; ``wire``
holds the frame layout and the HPACK literals we send; ``status`` the codes.
"""

from .connection import ConnectionLimits
from .server import Method, RequestStream, RpcServer, ServerContext, ServerOptions, service_methods
from .server_connection import ServerConnection
from .status import Metadata, RpcError, StatusCode, TlsFailure

__all__ = [
    "ConnectionLimits",
    "Metadata",
    "Method",
    "RequestStream",
    "RpcError",
    "RpcServer",
    "ServerConnection",
    "ServerContext",
    "ServerOptions",
    "StatusCode",
    "TlsFailure",
    "service_methods",
]
