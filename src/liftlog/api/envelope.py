"""Liftbridge envelopes: the framing of protobuf messages sent over plain NATS.

A publisher that talks NATS directly opts into key, headers and acks by
sending a ``Message`` in a *Publish* envelope; the server answers on the ack
inbox with an ``Ack`` in an *Ack* envelope. Liftbridge servers also use
envelopes for their internal RPCs (replication, Raft join, ...), whose type
numbers are listed in :class:`MsgType`. This module is sans-IO: bytes in,
bytes out.

Byte layout (multi-byte integers big-endian)::

    offset  size  field
    0       4     magic number  B9 0E 43 B4
    4       1     version       0
    5       1     header length 8, or 12 when flags bit 0 is set
    6       1     flags         bit 0: a CRC-32C of the payload follows
    7       1     message type  MsgType (0 Publish, 1 Ack, ...)
    [8      4     CRC-32C (Castagnoli) of the payload, when flags bit 0 is set]
    8 or 12 ...   payload       the protobuf-encoded message

Other flag bits are ignored when decoding, as Liftbridge does.

:func:`decode_envelope` raises a subclass of :class:`EnvelopeError` naming
the problem. :func:`decode_publish_message` never raises on bad input: like
Liftbridge, a NATS payload that is not a valid Publish envelope (no magic, a
bad header or CRC, another message type, an undecodable ``Message``) is
stored by the server as a plain value, so it returns ``None``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

import crc32c
from google.protobuf.message import DecodeError

from liftlog.api._gen import api_pb2

__all__ = [
    "FLAG_CRC",
    "HEADER_LEN",
    "HEADER_LEN_CRC",
    "MAGIC",
    "VERSION",
    "BadHeaderLength",
    "BadMagic",
    "BadPayload",
    "Buffer",
    "CrcMismatch",
    "EnvelopeError",
    "EnvelopeHeader",
    "MsgType",
    "TruncatedEnvelope",
    "UnexpectedMessageType",
    "UnknownMessageType",
    "UnknownVersion",
    "decode_ack",
    "decode_envelope",
    "decode_header",
    "decode_publish_message",
    "encode_ack",
    "encode_envelope",
    "encode_publish_message",
    "has_magic",
]

MAGIC: Final = b"\xb9\x0e\x43\xb4"
VERSION: Final = 0
HEADER_LEN: Final = 8
HEADER_LEN_CRC: Final = HEADER_LEN + 4
FLAG_CRC: Final = 0x01

# Bytes-like inputs the decoders accept (collections.abc.Buffer needs 3.12).
Buffer = bytes | bytearray | memoryview


class MsgType(enum.IntEnum):
    """What an envelope carries (Liftbridge's numbering)."""

    PUBLISH = 0  # api.Message published by a client
    ACK = 1  # api.Ack sent by the server to an ack inbox
    REPLICATION_REQUEST = 2  # the rest are server-to-server
    REPLICATION_RESPONSE = 3
    RAFT_JOIN_REQUEST = 4
    RAFT_JOIN_RESPONSE = 5
    LEADER_EPOCH_OFFSET_REQUEST = 6
    LEADER_EPOCH_OFFSET_RESPONSE = 7
    PROPAGATED_REQUEST = 8
    PROPAGATED_RESPONSE = 9
    SERVER_INFO_REQUEST = 10
    SERVER_INFO_RESPONSE = 11
    PARTITION_STATUS_REQUEST = 12
    PARTITION_STATUS_RESPONSE = 13
    PARTITION_NOTIFICATION = 14


_MSG_TYPES: Final = tuple(MsgType)  # indexed by value: 0..14, no gaps


class EnvelopeError(ValueError):
    """The bytes are not a valid envelope; subclasses say why."""


class TruncatedEnvelope(EnvelopeError):
    """Fewer bytes than the header needs."""


class BadMagic(EnvelopeError):
    """The data does not start with the envelope magic number."""


class UnknownVersion(EnvelopeError):
    """The version byte is not 0."""


class BadHeaderLength(EnvelopeError):
    """The header length does not match the flags (8 without CRC, 12 with)."""


class UnknownMessageType(EnvelopeError):
    """The message type byte is not a known :class:`MsgType`."""


class CrcMismatch(EnvelopeError):
    """The payload's CRC-32C differs from the one in the header."""


class UnexpectedMessageType(EnvelopeError):
    """A valid envelope of another type than the caller asked for."""


class BadPayload(EnvelopeError):
    """The payload is not a valid encoding of the expected protobuf message."""


@dataclass(frozen=True, slots=True)
class EnvelopeHeader:
    """A decoded, validated envelope header."""

    msg_type: MsgType
    header_len: int  # where the payload starts: 8, or 12 with a CRC
    flags: int
    crc: int | None  # the CRC-32C carried in the header, if any


def has_magic(data: Buffer) -> bool:
    """Whether `data` starts with the envelope magic number (cheap pre-check)."""
    return data[:4] == MAGIC


def encode_envelope(msg_type: MsgType, payload: bytes, crc: bool = False) -> bytes:
    """Frame `payload` (an encoded protobuf message) in an envelope of `msg_type`.

    With `crc`, the header carries the payload's CRC-32C and is 12 bytes long.
    """
    msg_type = MsgType(msg_type)  # ValueError for a number outside MsgType
    if crc:
        header = bytes((VERSION, HEADER_LEN_CRC, FLAG_CRC, msg_type))
        return MAGIC + header + crc32c.crc32c(payload).to_bytes(4, "big") + payload
    return MAGIC + bytes((VERSION, HEADER_LEN, 0, msg_type)) + payload


def decode_header(data: Buffer) -> EnvelopeHeader:
    """Validate the envelope header at the start of `data` and return it.

    The CRC, if present, is returned but not checked (that needs the
    payload; :func:`decode_envelope` does it). Raises an
    :class:`EnvelopeError` subclass naming the first problem found.
    """
    n = len(data)
    if data[: min(n, 4)] != MAGIC[: min(n, 4)]:
        got = bytes(data[:4]).hex(" ").upper()
        raise BadMagic(f"not an envelope: starts with {got}, expected the magic number B9 0E 43 B4")
    if n < HEADER_LEN:
        raise TruncatedEnvelope(f"truncated envelope: {n} bytes, the header needs {HEADER_LEN}")
    version = data[4]
    if version != VERSION:
        raise UnknownVersion(f"unknown envelope version {version}, only version {VERSION} is supported")
    header_len = data[5]
    flags = data[6]
    has_crc = bool(flags & FLAG_CRC)
    expected_len = HEADER_LEN_CRC if has_crc else HEADER_LEN
    if header_len != expected_len:
        crc_state = "set" if has_crc else "clear"
        raise BadHeaderLength(
            f"bad envelope header length {header_len}: must be {expected_len} with the CRC flag {crc_state}"
        )
    if n < header_len:
        raise TruncatedEnvelope(f"truncated envelope: {n} bytes, the header with its CRC-32C needs {header_len}")
    type_byte = data[7]
    if type_byte >= len(_MSG_TYPES):
        raise UnknownMessageType(f"unknown envelope message type {type_byte}, known types are 0..{len(_MSG_TYPES) - 1}")
    crc = int.from_bytes(data[HEADER_LEN:HEADER_LEN_CRC], "big") if has_crc else None
    return EnvelopeHeader(_MSG_TYPES[type_byte], header_len, flags, crc)


def decode_envelope(data: Buffer) -> tuple[MsgType, memoryview]:
    """Split an envelope into its message type and payload (a view, no copy).

    Checks the magic number, version, header length and, when present, the
    CRC-32C; raises an :class:`EnvelopeError` subclass naming the problem.
    """
    header = decode_header(data)
    payload = memoryview(data)[header.header_len :]
    if header.crc is not None:
        actual = crc32c.crc32c(payload)
        if actual != header.crc:
            raise CrcMismatch(
                f"envelope CRC-32C mismatch: header says {header.crc:#010x}, "
                f"the {len(payload)}-byte payload has {actual:#010x}"
            )
    return header.msg_type, payload


def encode_publish_message(message: api_pb2.Message, crc: bool = False) -> bytes:
    """Encode `message` as a Publish envelope, to publish on a stream's NATS subject.

    The server reads key, value, headers, ackInbox, correlationId and ackPolicy
    from it.
    """
    return encode_envelope(MsgType.PUBLISH, message.SerializeToString(), crc)


def decode_publish_message(data: Buffer) -> api_pb2.Message | None:
    """The ``Message`` in a Publish envelope, or None when `data` is not one.

    None covers every failure (no magic number, a bad header or CRC, another
    message type, a payload that is not a ``Message``): the server then
    stores the whole NATS payload as a plain value, as Liftbridge does.
    """
    if data[:4] != MAGIC:  # the common plain-payload case, without exceptions
        return None
    try:
        msg_type, payload = decode_envelope(data)
    except EnvelopeError:
        return None
    if msg_type is not MsgType.PUBLISH:
        return None
    message = api_pb2.Message()
    try:
        message.ParseFromString(payload)  # type: ignore[arg-type]  # any buffer works; the stubs say bytes
    except (DecodeError, UnicodeDecodeError):  # the pure-Python backend raises the latter for bad UTF-8
        return None
    return message


def encode_ack(ack: api_pb2.Ack, crc: bool = False) -> bytes:
    """Encode `ack` as an Ack envelope, to publish on the message's ack inbox."""
    return encode_envelope(MsgType.ACK, ack.SerializeToString(), crc)


def decode_ack(data: Buffer) -> api_pb2.Ack:
    """Decode an Ack envelope received on an ack inbox.

    Raises an :class:`EnvelopeError` subclass: a header or CRC problem,
    :class:`UnexpectedMessageType` for another type, :class:`BadPayload`
    when the payload is not an ``Ack``.
    """
    msg_type, payload = decode_envelope(data)
    if msg_type is not MsgType.ACK:
        raise UnexpectedMessageType(
            f"expected an Ack envelope (type {int(MsgType.ACK)}), got type {int(msg_type)} ({msg_type.name})"
        )
    ack = api_pb2.Ack()
    try:
        ack.ParseFromString(payload)  # type: ignore[arg-type]  # any buffer works; the stubs say bytes
    except (DecodeError, UnicodeDecodeError) as exc:
        raise BadPayload(f"Ack envelope payload ({len(payload)} bytes) is not a valid Ack: {exc}") from exc
    return ack
