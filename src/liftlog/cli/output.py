"""Terminal output: rich consoles, the one-line error, human-readable numbers and message lines.

Command results go to stdout; errors, progress and (for ``bench``) tables go
to stderr so stdout stays parseable. Consoles are made per call because click's
test runner swaps ``sys.stdout``/``sys.stderr`` per invocation.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from liftlog.jsontypes import JSONObject

__all__ = [
    "MessageLike",
    "err_console",
    "format_bytes_text",
    "format_latency_us",
    "format_message_json",
    "format_message_text",
    "format_rate",
    "format_time_ns",
    "local_utc_offset",
    "out_console",
    "print_error",
    "print_note",
    "table_console",
]


def out_console() -> Console:
    return Console(highlight=False)


def table_console() -> Console:
    """Where tables go: the terminal's width on a terminal; into a pipe as wide as they need (an 80-column
    guess would wrap or cut names, and `| grep` would miss them). COLUMNS, when set, wins."""
    import os
    import sys

    piped = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    return Console(highlight=False, width=100_000 if piped else None)


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def print_error(message: str) -> None:
    """Print ``error: message`` as one red line on stderr (newlines in the message are folded)."""
    line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    # soft_wrap: never break the line at the terminal width, so it stays one line for grep and logs.
    err_console().print(Text(f"error: {line}", style="red"), soft_wrap=True)


def print_note(message: str) -> None:
    """A dim informational line on stderr."""
    err_console().print(Text(message, style="dim"), soft_wrap=True)


# -- numbers and times ---------------------------------------------------------


def format_time_ns(ns: int | None, *, offset: bool = True) -> str:
    """Local ISO 8601 time with milliseconds (and the UTC offset), or ``-`` for an unset (zero) timestamp."""
    if not ns:
        return "-"
    moment = datetime.fromtimestamp(ns // 1_000_000_000, tz=UTC).replace(microsecond=ns % 1_000_000_000 // 1000)
    local = moment.astimezone()
    return (local if offset else local.replace(tzinfo=None)).isoformat(timespec="milliseconds")


def local_utc_offset() -> str:
    """This machine's current UTC offset, ``UTC+02:00``."""
    return "UTC" + datetime.now().astimezone().isoformat()[-6:]


def format_rate(per_second: float) -> str:
    """``950``, ``10.9k``, ``1.25M``."""
    if per_second >= 1e6:
        return f"{per_second / 1e6:.2f}M"
    if per_second >= 1e3:
        return f"{per_second / 1e3:.1f}k"
    return f"{per_second:.0f}"


def format_latency_us(us: float | None) -> str:
    """``81 µs``, ``2.9 ms``, ``1.20 s``; ``-`` when not measured."""
    if us is None:
        return "-"
    if us < 1000:
        return f"{us:.0f} µs"
    if us < 1_000_000:
        return f"{us / 1000:.1f} ms"
    return f"{us / 1e6:.2f} s"


# -- messages ------------------------------------------------------------------


class MessageLike(Protocol):
    """The fields of a received message the formatters read (``liftlog.client.Message`` has them)."""

    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def stream(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def subject(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, bytes]: ...


def format_bytes_text(data: bytes | None) -> str:
    """UTF-8 text with undecodable bytes replaced; ``-`` for no key."""
    if data is None:
        return "-"
    return data.decode("utf-8", errors="replace")


def format_message_text(msg: MessageLike) -> str:
    """``offset  key  value`` (key ``-`` when absent)."""
    key = format_bytes_text(msg.key) if msg.key else "-"
    return f"{msg.offset}  {key}  {format_bytes_text(msg.value)}"


def _text_or_b64(data: bytes) -> tuple[bool, str]:
    try:
        return True, data.decode("utf-8")
    except UnicodeDecodeError:
        return False, base64.b64encode(data).decode("ascii")


def format_message_json(msg: MessageLike) -> str:
    """One compact JSON object.

    ``key`` and ``value`` are UTF-8 text when they decode; otherwise the field is
    replaced by ``key_b64`` / ``value_b64`` (base64), so exactly one of each pair
    is present. Header values follow the same rule: undecodable ones move from
    ``headers`` to ``headers_b64``. ``timestamp`` is nanoseconds since the epoch.
    """
    obj: JSONObject = {"offset": msg.offset}
    if msg.key:
        is_text, key = _text_or_b64(msg.key)
        obj["key" if is_text else "key_b64"] = key
    else:
        obj["key"] = None
    is_text, value = _text_or_b64(msg.value)
    obj["value" if is_text else "value_b64"] = value
    obj |= {"timestamp": msg.timestamp, "stream": msg.stream, "partition": msg.partition, "subject": msg.subject}
    headers: dict[str, str] = {}
    headers_b64: dict[str, str] = {}
    for name, raw in msg.headers.items():
        is_text, text = _text_or_b64(raw)
        (headers if is_text else headers_b64)[name] = text
    obj["headers"] = headers
    if headers_b64:
        obj["headers_b64"] = headers_b64
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
