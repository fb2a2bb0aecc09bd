"""Binary encoding of the raft types (``types``): pure functions, no I/O.

One format serves the wire (raft messages over NATS) and the disk (``disk`` stores
entries, the hard state and snapshots with it). All integers are big-endian and
unsigned; terms and indexes are u64. Every top-level encoding starts with a
format-version byte (``VERSION`` = 1) so that a reader can refuse what it does
not understand instead of misreading it::

    str     u16 length, UTF-8 bytes
    bytes   u32 length, raw bytes

    entry body (21 bytes + data)
      0  u64    term
      8  u64    index
     16  u8     kind                  ENTRY_KIND_CODES
     17  bytes  data

    hard state body (17 bytes, 19+ with a vote)
      0  u64    term
      8  u64    commit
     16  u8     has_vote              0: vote is None, 1: a str follows ("" is a vote for "")
     17  str    vote

    snapshot body
      0  u64    index
      8  u64    term
     16  u16    voter count, then that many str
         bytes  data

    message (43 bytes + variable part)
      0  u8     version = 1
      1  u8     type                  MESSAGE_TYPE_CODES
      2  u8     flags                 bit 0: reject, bit 1: a snapshot body ends the message
      3  u64    term
     11  u64    log_term
     19  u64    index
     27  u64    commit
     35  u64    reject_hint
     43  str    src, str dst, bytes context,
         u32    entry count, then that many entry bodies,
         [snapshot body]

    encode_entry / encode_hard_state / encode_snapshot: u8 version = 1, then the body.

Enums travel as the explicit small integers of ``MESSAGE_TYPE_CODES`` and
``ENTRY_KIND_CODES`` (never their Python values or declaration order): a code, once
given, never changes meaning. Decoders accept exactly one encoding: truncation,
trailing bytes, unknown codes or flags and invalid UTF-8 all raise ``CodecError``
naming the field and its offset.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TypeVar

from .types import Entry, EntryKind, HardState, Message, MessageType, Snapshot

__all__ = [
    "ENTRY_KIND_CODES",
    "MESSAGE_TYPE_CODES",
    "VERSION",
    "CodecError",
    "decode_entry",
    "decode_hard_state",
    "decode_message",
    "decode_snapshot",
    "encode_entry",
    "encode_hard_state",
    "encode_message",
    "encode_snapshot",
]

VERSION = 1

MESSAGE_TYPE_CODES: dict[MessageType, int] = {
    MessageType.APPEND: 1,
    MessageType.APPEND_RESP: 2,
    MessageType.PRE_VOTE: 3,
    MessageType.PRE_VOTE_RESP: 4,
    MessageType.VOTE: 5,
    MessageType.VOTE_RESP: 6,
    MessageType.HEARTBEAT: 7,
    MessageType.HEARTBEAT_RESP: 8,
    MessageType.SNAPSHOT: 9,
    MessageType.TIMEOUT_NOW: 10,
    MessageType.READ_INDEX: 11,
    MessageType.READ_INDEX_RESP: 12,
}
ENTRY_KIND_CODES: dict[EntryKind, int] = {
    EntryKind.NORMAL: 0,
    EntryKind.CONF_CHANGE: 1,
    EntryKind.NOOP: 2,
}
_MESSAGE_TYPES = {code: t for t, code in MESSAGE_TYPE_CODES.items()}
_ENTRY_KINDS = {code: k for k, code in ENTRY_KIND_CODES.items()}

_FLAG_REJECT = 0x01
_FLAG_SNAPSHOT = 0x02
_KNOWN_FLAGS = _FLAG_REJECT | _FLAG_SNAPSHOT

_MSG_HEAD = struct.Struct(">BBBQQQQQ")
_ENTRY_HEAD = struct.Struct(">QQBI")  # term, index, kind, data length
_HARD_HEAD = struct.Struct(">QQB")
_SNAP_HEAD = struct.Struct(">QQH")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_VERSION_BYTE = _U8.pack(VERSION)

_T = TypeVar("_T")


class CodecError(ValueError):
    """Bytes that are not a valid encoding, or a value that cannot be encoded."""


# --- encoding ---------------------------------------------------------------------------


def _str(s: str, what: str) -> bytes:
    raw = s.encode()
    if len(raw) > 0xFFFF:
        raise CodecError(f"cannot encode {what}: {len(raw)} bytes of UTF-8, the limit is 65535")
    return _U16.pack(len(raw)) + raw


def _put_entry(parts: list[bytes], e: Entry) -> None:
    parts.append(_ENTRY_HEAD.pack(e.term, e.index, ENTRY_KIND_CODES[e.kind], len(e.data)))
    parts.append(e.data)


def _put_snapshot(parts: list[bytes], s: Snapshot) -> None:
    parts.append(_SNAP_HEAD.pack(s.index, s.term, len(s.voters)))
    parts.extend(_str(v, "snapshot voter") for v in s.voters)
    parts.append(_U32.pack(len(s.data)))
    parts.append(s.data)


def _put_hard_state(parts: list[bytes], hs: HardState) -> None:
    parts.append(_HARD_HEAD.pack(hs.term, hs.commit, hs.vote is not None))
    if hs.vote is not None:
        parts.append(_str(hs.vote, "vote"))


def _encode(what: str, fill: Callable[[list[bytes]], None], *, versioned: bool = True) -> bytes:
    """Run ``fill`` and join its parts, turning range and Unicode errors into CodecError."""
    parts: list[bytes] = [_VERSION_BYTE] if versioned else []
    try:
        fill(parts)
    except (struct.error, UnicodeError, OverflowError) as exc:
        raise CodecError(f"cannot encode {what}: {exc}") from exc
    return b"".join(parts)


def encode_message(m: Message) -> bytes:
    def fill(parts: list[bytes]) -> None:
        flags = (_FLAG_REJECT if m.reject else 0) | (_FLAG_SNAPSHOT if m.snapshot is not None else 0)
        code = MESSAGE_TYPE_CODES[m.type]
        parts.append(_MSG_HEAD.pack(VERSION, code, flags, m.term, m.log_term, m.index, m.commit, m.reject_hint))
        parts.append(_str(m.src, "src"))
        parts.append(_str(m.dst, "dst"))
        parts.append(_U32.pack(len(m.context)))
        parts.append(m.context)
        parts.append(_U32.pack(len(m.entries)))
        for e in m.entries:
            _put_entry(parts, e)
        if m.snapshot is not None:
            _put_snapshot(parts, m.snapshot)

    return _encode(f"{m.type.value} message", fill, versioned=False)


def encode_entry(e: Entry) -> bytes:
    return _encode("entry", lambda parts: _put_entry(parts, e))


def encode_hard_state(hs: HardState) -> bytes:
    return _encode("hard state", lambda parts: _put_hard_state(parts, hs))


def encode_snapshot(s: Snapshot) -> bytes:
    return _encode("snapshot", lambda parts: _put_snapshot(parts, s))


# --- decoding ---------------------------------------------------------------------------


class _Reader:
    """A cursor over one buffer; every read checks the length first and names the field."""

    __slots__ = ("buf", "end", "kind", "pos")

    def __init__(self, buf: bytes | bytearray | memoryview, kind: str) -> None:
        view = memoryview(buf)
        self.buf = view if view.format == "B" and view.ndim == 1 else view.cast("B")
        self.pos = 0
        self.end = len(self.buf)
        self.kind = kind

    def need(self, n: int, what: str) -> int:
        """Offset of the next ``n`` bytes, after checking they are there."""
        pos = self.pos
        if pos + n > self.end:
            raise CodecError(f"truncated {self.kind}: {what} at offset {pos} needs {n} bytes, {self.end - pos} left")
        self.pos = pos + n
        return pos

    def unpack(self, st: struct.Struct, what: str) -> tuple[int, ...]:
        return st.unpack_from(self.buf, self.need(st.size, what))

    def raw(self, n: int, what: str) -> bytes:
        pos = self.need(n, what)
        return self.buf[pos : pos + n].tobytes()

    def bytes_(self, what: str) -> bytes:
        (n,) = self.unpack(_U32, f"{what} length")
        return self.raw(n, what)

    def str_(self, what: str) -> str:
        (n,) = self.unpack(_U16, f"{what} length")
        pos = self.need(n, what)
        try:
            return str(self.buf[pos : pos + n], "utf-8")
        except UnicodeDecodeError as exc:
            raise CodecError(f"bad {self.kind}: {what} at offset {pos} is not UTF-8 ({exc.reason})") from None

    def version(self) -> None:
        pos = self.pos
        (v,) = self.unpack(_U8, "version")
        if v != VERSION:
            raise CodecError(f"bad {self.kind}: unknown format version {v} at offset {pos} (expected {VERSION})")

    def entry(self) -> Entry:
        pos = self.pos
        term, index, code, n = self.unpack(_ENTRY_HEAD, "entry header")
        kind = _ENTRY_KINDS.get(code)
        if kind is None:
            raise CodecError(f"bad {self.kind}: unknown entry kind {code} in the entry at offset {pos}")
        return Entry(term, index, kind, self.raw(n, f"data of the entry at offset {pos}"))

    def hard_state(self) -> HardState:
        pos = self.pos
        term, commit, has_vote = self.unpack(_HARD_HEAD, "hard state")
        if has_vote > 1:
            raise CodecError(f"bad {self.kind}: has_vote byte is {has_vote} at offset {pos + 16} (expected 0 or 1)")
        return HardState(term, self.str_("vote") if has_vote else None, commit)

    def snapshot(self) -> Snapshot:
        index, term, count = self.unpack(_SNAP_HEAD, "snapshot header")
        voters = tuple(self.str_("snapshot voter") for _ in range(count))
        return Snapshot(index, term, voters, self.bytes_("snapshot data"))

    def done(self, value: _T) -> _T:
        if self.pos != self.end:
            raise CodecError(f"bad {self.kind}: {self.end - self.pos} trailing bytes at offset {self.pos}")
        return value


def decode_message(buf: bytes | bytearray | memoryview) -> Message:
    r = _Reader(buf, "message")
    version, code, flags, term, log_term, index, commit, hint = r.unpack(_MSG_HEAD, "message header")
    if version != VERSION:
        raise CodecError(f"bad message: unknown format version {version} at offset 0 (expected {VERSION})")
    mtype = _MESSAGE_TYPES.get(code)
    if mtype is None:
        raise CodecError(f"bad message: unknown message type {code} at offset 1")
    if flags & ~_KNOWN_FLAGS:
        raise CodecError(f"bad message: unknown flags {flags:#04x} at offset 2")
    src = r.str_("src")
    dst = r.str_("dst")
    context = r.bytes_("context")
    (count,) = r.unpack(_U32, "entry count")
    if count > (r.end - r.pos) // _ENTRY_HEAD.size:
        # Refuse before looping: a garbage count must not cost time or memory.
        raise CodecError(f"truncated message: {count} entries cannot fit in the {r.end - r.pos} bytes left")
    entries = tuple(r.entry() for _ in range(count))
    snapshot = r.snapshot() if flags & _FLAG_SNAPSHOT else None
    return r.done(
        Message(
            mtype,
            src,
            dst,
            term,
            log_term=log_term,
            index=index,
            entries=entries,
            commit=commit,
            reject=bool(flags & _FLAG_REJECT),
            reject_hint=hint,
            snapshot=snapshot,
            context=context,
        )
    )


def decode_entry(buf: bytes | bytearray | memoryview) -> Entry:
    r = _Reader(buf, "entry")
    r.version()
    return r.done(r.entry())


def decode_hard_state(buf: bytes | bytearray | memoryview) -> HardState:
    r = _Reader(buf, "hard state")
    r.version()
    return r.done(r.hard_state())


def decode_snapshot(buf: bytes | bytearray | memoryview) -> Snapshot:
    r = _Reader(buf, "snapshot")
    r.version()
    return r.done(r.snapshot())
