"""Pure parsers for option values: addresses, headers, positions, sizes and durations.

Each parser raises ``ValueError`` with a message fit to show the user; the
click parameter types wrap them so a bad value is a usage error (exit 2).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import click

from liftlog.units import parse_duration_ms, parse_size

__all__ = [
    "DURATION",
    "HEADER",
    "SIZE",
    "START",
    "STOP",
    "StartSpec",
    "StopSpec",
    "parse_header",
    "parse_start",
    "parse_stop",
    "parse_time_ns",
    "split_addresses",
]


def split_addresses(values: Iterable[str]) -> tuple[str, ...]:
    """``host:port`` addresses from repeated and/or comma- or space-separated values."""
    return tuple(part for value in values for part in value.replace(",", " ").split())


def parse_header(text: str) -> tuple[str, bytes]:
    """A ``name=value`` header; the value is UTF-8 encoded and may be empty or contain ``=``."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"expected NAME=VALUE, got {text!r}")
    return name.strip(), value.encode()


_EPOCH_UNITS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


def parse_time_ns(text: str) -> int:
    """Nanoseconds since the epoch from an ISO 8601 time, a Unix time with its unit, or ``-DURATION`` (ago).

    A Unix time names its unit (``1700000000s``, ``1700000000000ms``, ``...us``, ``...ns``): a bare number
    is refused, since seconds, milliseconds (Spark's ``startingTimestamp``) and nanoseconds (Liftbridge's
    timestamps) would all be read as something. An ISO time without a UTC offset is local time.
    """
    text = text.strip()
    if text.isdigit():
        raise ValueError(
            f"time {text!r} needs a unit: {text}s (seconds), {text}ms, {text}us or {text}ns since the epoch; "
            "or an ISO 8601 time (2024-05-01T12:00:00Z), or -DURATION for that long ago (-15m)"
        )
    digits = len(text) - len(text.lstrip("0123456789"))
    if digits and text[digits:] in _EPOCH_UNITS:
        return int(text[:digits]) * _EPOCH_UNITS[text[digits:]]
    if text.startswith("-"):
        # Relative to now: "-5m" is five minutes ago.
        return time.time_ns() - parse_duration_ms(text[1:]) * 1_000_000
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"expected an ISO 8601 time (2024-05-01T12:00:00Z), a Unix time with its unit (1700000000s, "
            f"1700000000000ms, ...ns) or -DURATION (-15m), got {text!r}"
        ) from None
    # timestamp() treats a naive datetime as local time; whole seconds and microseconds separately keep precision.
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


@dataclass(frozen=True)
class StartSpec:
    """Where a subscription starts: ``position`` names a Liftbridge StartPosition."""

    position: Literal["EARLIEST", "LATEST", "NEW_ONLY", "OFFSET", "TIMESTAMP"]
    offset: int = 0
    timestamp_ns: int = 0


@dataclass(frozen=True)
class StopSpec:
    """Where a subscription stops: ``position`` names a Liftbridge StopPosition."""

    position: Literal["STOP_LATEST", "STOP_OFFSET", "STOP_TIMESTAMP", "STOP_ON_CANCEL"]
    offset: int = 0
    timestamp_ns: int = 0


def _offset(text: str) -> int:
    if not text.strip().isdigit():
        raise ValueError(f"expected a non-negative offset, got {text!r}")
    return int(text)


def parse_start(text: str) -> StartSpec:
    """``earliest``, ``latest``, ``new``, ``offset:N`` or ``time:T`` (see :func:`parse_time_ns`)."""
    kind, _, arg = text.strip().partition(":")
    kind = kind.lower()
    if kind == "earliest" and not arg:
        return StartSpec("EARLIEST")
    if kind == "latest" and not arg:
        return StartSpec("LATEST")
    if kind in ("new", "new-only") and not arg:
        return StartSpec("NEW_ONLY")
    if kind == "offset":
        return StartSpec("OFFSET", offset=_offset(arg))
    if kind == "time":
        return StartSpec("TIMESTAMP", timestamp_ns=parse_time_ns(arg))
    raise ValueError(f"expected earliest, latest, new, offset:N or time:T, got {text!r}")


def parse_stop(text: str) -> StopSpec:
    """``latest``, ``offset:N`` or ``time:T`` (see :func:`parse_time_ns`)."""
    kind, _, arg = text.strip().partition(":")
    kind = kind.lower()
    if kind == "latest" and not arg:
        return StopSpec("STOP_LATEST")
    if kind == "offset":
        return StopSpec("STOP_OFFSET", offset=_offset(arg))
    if kind == "time":
        return StopSpec("STOP_TIMESTAMP", timestamp_ns=parse_time_ns(arg))
    raise ValueError(f"expected latest, offset:N or time:T, got {text!r}")


if TYPE_CHECKING:
    _ParamType = click.ParamType[Any]
else:  # click < 8.4's ParamType is not generic (subscripting it fails at run time)
    _ParamType = click.ParamType


class _Parsed(_ParamType):
    """A click type around one of the parsers above."""

    def __init__(self, name: str, parse: Any) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):  # a default or an already converted value
            return value
        try:
            return self._parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


#: Bytes, with units as in the server config: ``1048576``, ``512MiB``, ``1GB``.
SIZE = _Parsed("size", parse_size)
#: Milliseconds, Go-style: ``250ms``, ``90s``, ``1h30m``, or a number of milliseconds.
DURATION = _Parsed("duration", parse_duration_ms)
HEADER = _Parsed("name=value", parse_header)
START = _Parsed("position", parse_start)
STOP = _Parsed("position", parse_stop)
