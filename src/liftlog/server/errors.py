"""Errors of the server process as a whole."""

from __future__ import annotations

__all__ = ["ServerStartError"]


class ServerStartError(Exception):
    """The server could not start; the message names the step and the cause in one line."""
