"""How a record stores the NATS fields of its message (sans-IO).

Liftbridge returns the NATS subject, reply subject, ack inbox, correlation id
and ack policy of every message on subscribe, so liftlog stores them with the
record, in one reserved header, ``\\x00fields``, whose value is those fields
already in the protobuf encoding of ``Message`` (subject = 7, replySubject =
8, ackInbox = 10, correlationId = 11, ackPolicy = 12; empty ones left out).
Records written before kept each field in its own header (``\\x00subject``,
``\\x00reply``, ``\\x00ackInbox``, ``\\x00correlationId``, ``\\x00ackPolicy``).
Header names starting with NUL are reserved; the subject is stored only when
it differs from the partition's (wildcard streams).

The server writes these headers and serves them (``liftlog.server.partitions.messages``);
the client reads them back from fetched batches (``liftlog.client.batches``).
"""

from __future__ import annotations

from typing import Final, NamedTuple

from google.protobuf.message import DecodeError

from liftlog.api._gen.api_pb2 import Message

__all__ = [
    "BATCH_ID_HEADER",
    "HIDDEN_MSG_ID_HEADER",
    "H_ACK_INBOX",
    "H_ACK_POLICY",
    "H_CORRELATION_ID",
    "H_FIELDS",
    "H_REPLY",
    "H_SUBJECT",
    "MSG_ID_HEADER",
    "PUBLISHER_RESERVED",
    "RESERVED",
    "StoredFields",
    "decode_fields",
    "encode_fields",
    "varint",
]

RESERVED: Final = "\x00"
H_FIELDS: Final = "\x00fields"
H_SUBJECT: Final = "\x00subject"
H_REPLY: Final = "\x00reply"
H_ACK_INBOX: Final = "\x00ackInbox"
H_CORRELATION_ID: Final = "\x00correlationId"
H_ACK_POLICY: Final = "\x00ackPolicy"

# Message ids (``liftlog.replication.duplicates``): what publishers send and the server stores with a record.
#: A message's id, as JetStream reads it: a user header, served to readers like any other.
MSG_ID_HEADER: Final = "Nats-Msg-Id"
#: An id a client made up itself (ours, idempotent by default): counts as ``Nats-Msg-Id`` does, under a
#: reserved name, stored and never served, so readers see only the ids users chose.
HIDDEN_MSG_ID_HEADER: Final = "\x00msgid"
#: On a batched publish's first record: one id for the whole batch (a chunk of ``publish_many``), so a leader
#: reads one header per batch, not one per record. Reserved: never served.
BATCH_ID_HEADER: Final = "\x00batch"
#: The reserved headers a publisher may send (any other name starting with NUL is dropped on the way in).
PUBLISHER_RESERVED: Final = frozenset({BATCH_ID_HEADER, HIDDEN_MSG_ID_HEADER})

_BYTE = [bytes([i]) for i in range(256)]
_parse_message = Message.FromString


class StoredFields(NamedTuple):
    """A record's NATS fields; empty strings (and policy 0) when not stored."""

    subject: str = ""
    reply: str = ""
    ack_inbox: str = ""
    correlation_id: str = ""
    ack_policy: int = 0


def varint(n: int) -> bytes:
    """The protobuf varint encoding of ``n`` (an int64: negative numbers take ten bytes)."""
    if 0 <= n < 0x80:
        return _BYTE[n]
    if 0 <= n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    if 0 <= n < 0x10000000:  # offsets in the millions: no loop
        if n < 0x200000:
            return bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, n >> 14))
        return bytes(((n & 0x7F) | 0x80, ((n >> 7) & 0x7F) | 0x80, ((n >> 14) & 0x7F) | 0x80, n >> 21))
    if n < 0:
        n &= (1 << 64) - 1  # two's complement
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_fields(subject: str, reply: str, inbox: str, correlation_id: str, policy: int) -> bytes:
    """The value of ``\\x00fields`` (empty when every field is)."""
    out = b""
    for tag, text in ((b"\x3a", subject), (b"\x42", reply), (b"\x52", inbox), (b"\x5a", correlation_id)):
        if text:
            raw = text.encode()
            out += tag + varint(len(raw)) + raw
    if policy:
        out += b"\x60" + varint(policy)
    return out


def decode_fields(value: bytes | memoryview) -> StoredFields:
    """Parse a ``\\x00fields`` value; unknown fields are skipped. Raises ValueError if it is malformed."""
    try:
        m = _parse_message(bytes(value))
    except DecodeError as exc:
        raise ValueError(f"stored fields: {exc}") from exc
    # The protobuf runtime parses these in C; a Python loop over the bytes took about twice as long.
    return StoredFields(m.subject, m.replySubject, m.ackInbox, m.correlationId, m.ackPolicy)


def stored_subject(value: bytes | memoryview) -> str:
    """Only the subject of a ``\\x00fields`` value ("" when not stored): it is always written first."""
    if not value or value[0] != 0x3A:
        return ""
    size, pos = _read_varint(value, 1)
    return bytes(value[pos : pos + size]).decode()


def _read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    end = len(buf)
    while pos < end:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            break
    raise ValueError("stored fields: a truncated or overlong varint")
