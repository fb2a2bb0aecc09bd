"""The NATS client protocol without I/O: a parser for what a nats-server sends, encoders for what a
client sends.

The server's hot connection (partition intake and clients' publishes) spends its time here, so
the parser works on a whole read buffer at once and hands back every message it holds as a tuple,
not an object, and the encoders build each command with one join. The protocol is NATS's published
text protocol: control lines end in CRLF; ``MSG`` and ``HMSG`` are followed by a payload of the
size they announce (``HMSG``: headers first, ``NATS/1.0`` and ``Name: value`` lines).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from liftlog.jsontypes import JSONObject

__all__ = [
    "ERR",
    "INFO",
    "MSG",
    "OK",
    "PING",
    "PONG",
    "Event",
    "NatsParser",
    "NatsProtocolError",
    "connect_command",
    "encode_headers",
    "pub_command",
    "sub_command",
    "unsub_command",
]

MSG: Final = 0
INFO: Final = 1
PING: Final = 2
PONG: Final = 3
OK: Final = 4
ERR: Final = 5

#: (MSG, sid, subject, reply, payload, raw headers or b"") | (INFO, info dict) | (PING,) | (PONG,) | (OK,) | (ERR, text)
Event = tuple[Any, ...]

#: A control line longer than this without its CRLF is not NATS (nats-server's own default limit is 4 KiB).
MAX_CONTROL_LINE: Final = 64 * 1024
#: A message announcing more than this is refused rather than buffered (nats-server's max_payload tops at 64 MiB).
MAX_PAYLOAD: Final = 64 << 20

PING_COMMAND: Final = b"PING\r\n"
PONG_COMMAND: Final = b"PONG\r\n"
_CRLF: Final = b"\r\n"


class NatsProtocolError(Exception):
    """The nats-server sent something that is not the NATS protocol."""


class NatsParser:
    """Turns bytes from a nats-server into events; keeps an incomplete tail for the next :meth:`feed`."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[Event]:
        buf = self._buf
        if buf:
            buf += data
            view: bytes | bytearray = buf
        else:
            view = data  # the common case, a read that ends on a message boundary: no copy
        events: list[Event] = []
        pos = 0
        size = len(view)
        while pos < size:
            end = view.find(_CRLF, pos)
            if end < 0:
                if size - pos > MAX_CONTROL_LINE:
                    raise NatsProtocolError(f"a control line longer than {MAX_CONTROL_LINE} bytes")
                break
            op = view[pos : pos + 4]
            if op == b"MSG ":
                args = view[pos + 4 : end].split()
                try:
                    length = int(args[-1])
                    sid = int(args[1])
                except (ValueError, IndexError):
                    raise NatsProtocolError(f"bad MSG line {bytes(view[pos:end])[:200]!r}") from None
                if len(args) not in (3, 4) or not 0 <= length <= MAX_PAYLOAD:
                    raise NatsProtocolError(f"bad MSG line {bytes(view[pos:end])[:200]!r}")
                start = end + 2
                stop = start + length
                if stop + 2 > size:
                    break
                reply = args[2].decode() if len(args) == 4 else ""
                events.append((MSG, sid, args[0].decode(), reply, bytes(view[start:stop]), b""))
                pos = stop + 2
            elif op == b"HMSG":
                args = view[pos + 5 : end].split()
                try:
                    hlen = int(args[-2])
                    length = int(args[-1])
                    sid = int(args[1])
                except (ValueError, IndexError):
                    raise NatsProtocolError(f"bad HMSG line {bytes(view[pos:end])[:200]!r}") from None
                if len(args) not in (4, 5) or not 0 <= hlen <= length <= MAX_PAYLOAD:
                    raise NatsProtocolError(f"bad HMSG line {bytes(view[pos:end])[:200]!r}")
                start = end + 2
                stop = start + length
                if stop + 2 > size:
                    break
                reply = args[2].decode() if len(args) == 5 else ""
                headers = bytes(view[start : start + hlen])
                events.append((MSG, sid, args[0].decode(), reply, bytes(view[start + hlen : stop]), headers))
                pos = stop + 2
            else:
                line = bytes(view[pos:end])
                pos = end + 2
                word = line.split(b" ", 1)[0].upper()
                if word == b"PING":
                    events.append((PING,))
                elif word == b"PONG":
                    events.append((PONG,))
                elif word == b"+OK":
                    events.append((OK,))
                elif word == b"-ERR":
                    events.append((ERR, line[4:].strip().strip(b"'").decode(errors="replace")))
                elif word == b"INFO":
                    try:
                        info = json.loads(line[5:])
                    except ValueError:
                        raise NatsProtocolError(f"bad INFO {line[:200]!r}") from None
                    if not isinstance(info, dict):
                        raise NatsProtocolError(f"bad INFO {line[:200]!r}")
                    events.append((INFO, info))
                else:
                    raise NatsProtocolError(f"unknown protocol line {line[:200]!r}")
        if view is buf:
            del buf[:pos]
        elif pos < size:
            buf += view[pos:]
        return events


def connect_command(options: JSONObject) -> bytes:
    return b"CONNECT " + json.dumps(options, separators=(",", ":")).encode() + _CRLF


def pub_command(subject: str, payload: bytes, reply: str = "", headers: bytes = b"") -> bytes:
    """``PUB``, or ``HPUB`` when ``headers`` (already encoded, see :func:`encode_headers`) are given."""
    if headers:
        total = len(headers) + len(payload)
        if reply:
            line = f"HPUB {subject} {reply} {len(headers)} {total}\r\n"
        else:
            line = f"HPUB {subject} {len(headers)} {total}\r\n"
        return b"".join((line.encode(), headers, payload, _CRLF))
    if reply:
        return b"".join((f"PUB {subject} {reply} {len(payload)}\r\n".encode(), payload, _CRLF))
    return b"".join((f"PUB {subject} {len(payload)}\r\n".encode(), payload, _CRLF))


def sub_command(subject: str, queue: str, sid: int) -> bytes:
    return (f"SUB {subject} {queue} {sid}\r\n" if queue else f"SUB {subject} {sid}\r\n").encode()


def unsub_command(sid: int) -> bytes:
    return f"UNSUB {sid}\r\n".encode()


def encode_headers(headers: dict[str, str]) -> bytes:
    lines = ["NATS/1.0"]
    for name, value in headers.items():
        if not name or any(c in name for c in ":\r\n ") or any(c in value for c in "\r\n"):
            raise ValueError(f"invalid NATS header {name!r}")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()
