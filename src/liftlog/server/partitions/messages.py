"""How a NATS message becomes a stored record, and a stored record an API ``Message``.

A record keeps its message's NATS fields (subject, reply, and a client's
ack inbox, correlation id and ack policy: never a server's) in the reserved header ``\\x00fields``, already
protobuf-encoded as ``Message`` fields (``liftlog.api.stored``): a catch-up
read copies it into each message as it is, instead of parsing and
re-encoding four headers. Records written before kept one header per field;
both are read. User headers with reserved names (starting with NUL) are
dropped on the way in.

Sans-IO: plain functions over bytes and protobuf messages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from liftlog.api import api_pb2
from liftlog.api._gen.batches_pb2 import RecordBatchEnvelope
from liftlog.api.batch_envelope import BATCH_MAGIC, decode_record_batch
from liftlog.api.envelope import decode_publish_message
from liftlog.api.stored import (
    H_ACK_INBOX,
    H_ACK_POLICY,
    H_CORRELATION_ID,
    H_FIELDS,
    H_REPLY,
    H_SUBJECT,
    RESERVED,
)
from liftlog.api.stored import encode_fields as _fields
from liftlog.api.stored import varint as _varint
from liftlog.metadata.names import SERVER_INBOX_PREFIX
from liftlog.recordformat import BATCH_HEADER_SIZE, HEADER_VALUE, RECORD_HEADER, RECORD_OVERHEAD, BatchHeader
from liftlog.replication.duplicates import (
    BATCH_ID_HEADER_BYTES,
    HIDDEN_MSG_ID_HEADER,
    MSG_ID_HEADER,
    MSG_ID_HEADER_BYTES,
    PUBLISHER_RESERVED,
)
from liftlog.storage import EMPTY_HEADERS, InvalidBatch, NewRecord, Record
from liftlog.storage.records import RecordsInfo, check_records, decode_new_records, header_values

__all__ = [
    "Encoded",
    "Incoming",
    "encode_messages",
    "incoming_from_nats",
    "msg_id_in_nats_headers",
    "record_size",
    "record_to_message",
]

_POLICY_BYTES = {p: bytes([p]) for p in (api_pb2.LEADER, api_pb2.ALL, api_pb2.NONE)}


class Encoded(NamedTuple):
    """Records of a batched publish as they arrived (storage format, checked): stored without re-encoding."""

    data: bytes
    record_count: int
    info: RecordsInfo


class Incoming(NamedTuple):
    """A message received for a partition, before it has an offset.

    A batched publish (``liftlog.Batches/Publish``) is one Incoming whose
    ``more`` records follow ``record``: they are stored together or not at
    all, and acknowledged once, with the offset of the last.
    """

    record: NewRecord
    subject: str
    ack_inbox: str
    correlation_id: str
    ack_policy: int
    #: With optimistic concurrency control: the offset the publisher expects it (the first record) to get.
    expected_offset: int
    more: tuple[NewRecord, ...] = ()
    #: A batched publish's records, when they can be stored as they came (then ``record`` is a stand-in).
    encoded: Encoded | None = None
    #: Its records' message ids (``Nats-Msg-Id``), one per record (b"" for none); empty when none has one.
    msg_ids: tuple[bytes, ...] = ()
    #: A batched publish's id for the whole batch (hidden ``\\x00batch`` header on its first record), or b"".
    batch_id: bytes = b""


def record_size(record: NewRecord) -> int:
    """Bytes of payload a record carries: key, value, header names and values."""
    size = len(record.value) + (len(record.key) if record.key else 0)
    for name, value in record.headers.items():
        size += len(name) + len(value)
    return size


def msg_id_in_nats_headers(raw: bytes) -> bytes:
    """The ``Nats-Msg-Id`` in a NATS message's raw header block (``NATS/1.0\r\nName: value\r\n...``), or b""."""
    at = raw.find(_NATS_MSG_ID)
    if at < 0:
        return b""
    start = at + len(_NATS_MSG_ID)
    end = raw.find(b"\r\n", start)
    return raw[start : end if end >= 0 else len(raw)].strip()


_NATS_MSG_ID = b"\r\n" + MSG_ID_HEADER_BYTES + b":"


def incoming_from_nats(
    subject: str, reply: str, data: bytes, partition_subject: str, nats_msg_id: bytes = b""
) -> Incoming:
    """Unwrap a Publish or record batch envelope if there is one; anything else is a plain value.

    ``nats_msg_id``: the message's ``Nats-Msg-Id`` NATS header. It is stored as a record header of that
    name, where an envelope carries its id too; an envelope's own header wins.
    """
    message = None
    own_subject = subject if subject != partition_subject else ""
    if data[:1] == b"\xb9":
        if data[:4] == BATCH_MAGIC:
            batch = decode_record_batch(data)
            incoming = _incoming_batch(batch, subject, own_subject, reply) if batch is not None else None
            if incoming is not None:
                return incoming
        else:
            message = decode_publish_message(data)
    if message is None:
        ids = (nats_msg_id,) if nats_msg_id else ()
        if not own_subject and not reply:
            headers = {MSG_ID_HEADER: nats_msg_id} if nats_msg_id else EMPTY_HEADERS
            return Incoming(NewRecord(data, None, headers), subject, "", "", api_pb2.NONE, -1, msg_ids=ids)
        fields = _fields(own_subject, reply, "", "", 0)
        headers = {MSG_ID_HEADER: nats_msg_id, H_FIELDS: fields} if nats_msg_id else {H_FIELDS: fields}
        return Incoming(NewRecord(data, None, headers), subject, "", "", api_pb2.NONE, -1, msg_ids=ids)

    headers = {k: v for k, v in message.headers.items() if not k.startswith(RESERVED)} if message.headers else {}
    inbox = message.ackInbox
    cid = message.correlationId
    policy = message.ackPolicy
    # A server's private inbox and route id are its own business: not stored, not served to readers.
    if inbox and not inbox.startswith(SERVER_INBOX_PREFIX):
        fields = _fields(own_subject, reply, inbox, cid, policy)
    else:
        fields = _fields(own_subject, reply, "", "", 0)
    if fields:
        headers[H_FIELDS] = fields
    msg_id = headers.get(MSG_ID_HEADER) or nats_msg_id
    if msg_id:
        headers[MSG_ID_HEADER] = msg_id
    elif message.headers and HIDDEN_MSG_ID_HEADER in message.headers:  # one the client made up: kept hidden
        msg_id = headers[HIDDEN_MSG_ID_HEADER] = message.headers[HIDDEN_MSG_ID_HEADER]
    record = NewRecord(message.value, message.key or None, headers or EMPTY_HEADERS)
    return Incoming(record, subject, inbox, cid, policy, message.offset, msg_ids=(msg_id,) if msg_id else ())


def _incoming_batch(batch: RecordBatchEnvelope, subject: str, own_subject: str, reply: str) -> Incoming | None:
    """The records of a batch envelope, or None when they are not well formed (then it is a plain value).

    A batch's ack fields are stored with its records only when the records carry them already (one
    ``\x00fields`` header, the same in every record) and the inbox is not a server's private one; a
    ``liftlog.Batches/Publish`` batch's are the publisher's business, not stored. Coalesced PublishAsync
    batches (``liftlog.server.api.publish_async``) carry none: their inbox is the server's.
    """
    inbox = batch.ackInbox
    stored = inbox and not inbox.startswith(SERVER_INBOX_PREFIX)  # a server's inbox is not stored (above)
    own_fields = _fields("", "", inbox, batch.correlationId, batch.ackPolicy) if stored else b""
    try:
        info = check_records(batch.records, batch.count, (_H_FIELDS, own_fields) if own_fields else None)
    except InvalidBatch:
        return None
    expected = batch.expectedOffset if batch.HasField("expectedOffset") else -1
    ids: tuple[bytes, ...] = ()
    batch_id = b""
    if info.has_headers:
        # The first record's headers only, unless others have some: reading every record's costs per record.
        positions = info.positions if info.later_headers else info.positions[:1]
        found = header_values(batch.records, positions, MSG_ID_HEADER_BYTES)
        if any(found):
            ids = tuple(v or b"" for v in found) + (b"",) * (batch.count - len(found))
        batch_id = header_values(batch.records, info.positions[:1], BATCH_ID_HEADER_BYTES)[0] or b""
    fields = _fields(own_subject, reply, "", "", 0)
    if not fields and not info.reserved_headers:  # the usual batch: stored as it came
        encoded = Encoded(batch.records, batch.count, info)
        return Incoming(
            _STAND_IN, subject, inbox, batch.correlationId, batch.ackPolicy, expected, (), encoded, ids, batch_id
        )
    with_ack = _fields(own_subject, reply, inbox, batch.correlationId, batch.ackPolicy) if own_fields else b""
    records = [
        _with_fields(r, with_ack if own_fields and r.headers.get(H_FIELDS) == own_fields else fields)
        for r in decode_new_records(batch.records, batch.count)
    ]
    return Incoming(
        records[0],
        subject,
        inbox,
        batch.correlationId,
        batch.ackPolicy,
        expected,
        tuple(records[1:]),
        None,
        ids,
        batch_id,
    )


_H_FIELDS = H_FIELDS.encode()
_STAND_IN = NewRecord(b"")


def _with_fields(record: NewRecord, fields: bytes) -> NewRecord:
    headers = {k: v for k, v in record.headers.items() if not k.startswith(RESERVED) or k in PUBLISHER_RESERVED}
    if fields:
        headers[H_FIELDS] = fields
    return NewRecord(record.value, record.key, headers or EMPTY_HEADERS)


def record_to_message(record: Record, stream: str, partition: int, partition_subject: str) -> api_pb2.Message:
    """The API ``Message`` for a stored record."""
    message = api_pb2.Message(
        offset=record.offset,
        key=record.key,
        value=record.value,
        timestamp=record.timestamp,
        stream=stream,
        partition=partition,
        subject=partition_subject,
    )
    if record.headers:  # most records from plain NATS publishers have none
        _set_header_fields(message, record.headers)
    return message


def _set_header_fields(message: api_pb2.Message, headers: Mapping[str, bytes]) -> None:
    for name, value in headers.items():
        if not name.startswith(RESERVED):
            message.headers[name] = value
        elif name == H_FIELDS:
            message.MergeFromString(value)
        elif name == H_SUBJECT:
            message.subject = value.decode()
        elif name == H_REPLY:
            message.replySubject = value.decode()
        elif name == H_ACK_INBOX:
            message.ackInbox = value.decode()
        elif name == H_CORRELATION_ID:
            message.correlationId = value.decode()
        elif name == H_ACK_POLICY and value:
            message.ackPolicy = value[0]  # type: ignore[assignment]


#: Reserved headers of older records that are ``Message`` string fields: the field's tag byte
#: (field number << 3 | 2). The value of ``\x00fields`` is copied as it is (tag b"").
_FIELD_TAGS = {
    H_FIELDS.encode(): b"",
    H_SUBJECT.encode(): b"\x3a",  # subject = 7
    H_REPLY.encode(): b"\x42",  # replySubject = 8
    H_ACK_INBOX.encode(): b"\x52",  # ackInbox = 10
    H_CORRELATION_ID.encode(): b"\x5a",  # correlationId = 11
}
_H_ACK_POLICY = H_ACK_POLICY.encode()
_BYTE = [bytes([i]) for i in range(256)]
_I32 = HEADER_VALUE
#: What an encoded message costs in memory beyond its bytes (the bytes object, the list slot).
ENCODED_OVERHEAD = 64


def encode_messages(
    data: memoryview,
    header: BatchHeader,
    start: int,
    limit: int,
    stream: str,
    partition: int,
    partition_subject: str,
    out: list[bytes],
    max_count: int,
    max_bytes: int,
) -> tuple[int, int]:
    """Append to ``out`` the encoded API ``Message`` of each record of one batch in ``[start, limit)``.

    The protobuf encoding is written here, straight from the record's bytes (catch-up reads spend their
    time in this loop): no Record, header dict or message object per record, and the log's checked batch
    walked inline (``liftlog.recordformat.walk_records`` as a generator would cost 5 to 10%; the test
    ``tests/recordformat/test_record_readers.py`` holds the two to the same records). Parsers accept fields
    in any order and keep the last value of a field, so a stored subject (wildcard streams) simply follows
    the partition's. Decoding gives exactly ``record_to_message(...)``. Stops after ``max_count`` messages
    or once ``max_bytes`` (counted with ENCODED_OVERHEAD) is used, always taking one. Returns (the offset
    to read next, bytes used).
    """
    unpack = RECORD_HEADER.unpack_from
    unpack_i32 = _I32.unpack_from
    tags, byte, varint, small, low14 = _FIELD_TAGS, _BYTE, _varint, _SMALL_VARINTS, _LOW14
    # stream = 5, partition = 6, subject = 7: the same for every message of the partition.
    shared = api_pb2.Message(stream=stream, partition=partition, subject=partition_subject).SerializeToString()
    base = header.base_offset
    pos = header.position + BATCH_HEADER_SIZE
    used = taken = 0
    next_offset = start
    last_ts = None
    ts_field = b""
    # The headers of the last record and what they encode to: a batch's records often share theirs
    # (a coalesced publish stores the same ack fields in each).
    last_headers = b""
    headers_tail: list[bytes | memoryview] = [b""]
    for _ in range(header.record_count):
        length, delta, ts, key_len, value_len, n_headers = unpack(data, pos)
        offset = base + delta
        if offset >= limit:
            break
        record_end = pos + 4 + length
        if offset >= start:
            p = pos + RECORD_OVERHEAD
            if offset < 16384:
                parts: list[bytes | memoryview] = [b"\x08", small[offset]] if offset else []
            elif offset < 2097152:
                parts = [b"\x08", low14[offset & 0x3FFF], byte[offset >> 14]]
            else:
                parts = [b"\x08", varint(offset)]
            if key_len > 0:
                parts += (b"\x12", small[key_len] if key_len < 16384 else varint(key_len), data[p : p + key_len])
                p += key_len
            if value_len:
                parts += (
                    b"\x1a",
                    small[value_len] if value_len < 16384 else varint(value_len),
                    data[p : p + value_len],
                )
            p += value_len
            if ts != last_ts:  # a batch's records usually share their timestamp
                last_ts = ts
                ts_field = b"\x20" + varint(ts) if ts else b""
            parts.append(ts_field)
            parts.append(shared)
            if n_headers:
                raw = bytes(data[p:record_end])
                if raw != last_headers:
                    headers_tail = _header_fields(data, p, n_headers, tags, byte, varint, unpack_i32)
                    last_headers = raw
                parts += headers_tail
            encoded = b"".join(parts)
            out.append(encoded)
            used += len(encoded) + ENCODED_OVERHEAD
            taken += 1
            next_offset = offset + 1
            if taken >= max_count or used >= max_bytes:
                break
        pos = record_end
    else:
        next_offset = max(next_offset, min(limit, header.next_offset))
    return next_offset, used


def _header_fields(
    data: memoryview,
    p: int,
    n_headers: int,
    tags: dict[bytes, bytes],
    byte: list[bytes],
    varint: Callable[[int], bytes],
    unpack_i32: Callable[[memoryview, int], tuple[int]],
) -> list[bytes | memoryview]:
    """The encoded ``Message`` fields of one record's headers (``p``: where they start)."""
    parts: list[bytes | memoryview] = []
    policy = b""
    user = None
    for _ in range(n_headers):
        name_len = (data[p] << 8) | data[p + 1]
        name = bytes(data[p + 2 : p + 2 + name_len])
        p += 2 + name_len
        (size,) = unpack_i32(data, p)
        value_start = p + 4
        p = value_start + size
        tag = tags.get(name)
        if tag == b"":
            parts.append(bytes(data[value_start:p]))
        elif tag is not None:
            parts += (tag, varint(size), bytes(data[value_start:p]))
        elif name[:1] != b"\x00":
            if user is None:
                user = []
            user.append((name, bytes(data[value_start:p])))
        elif name == _H_ACK_POLICY and size and data[value_start]:
            policy = b"\x60" + byte[data[value_start]]
    if user:  # map<string, bytes> headers = 9: one entry message each
        for name, value in user:
            entry = b"\x0a" + varint(len(name)) + name + b"\x12" + varint(len(value)) + value
            parts += (b"\x4a", varint(len(entry)), entry)
    parts.append(policy)
    return parts


#: Varints of 0..16383 (lengths and small offsets), looked up rather than computed per record.
_SMALL_VARINTS = [_varint(i) for i in range(16384)]
#: The first two bytes of the varint of a number >= 16384, by its low 14 bits (the third byte is n >> 14).
_LOW14 = [bytes(((i & 0x7F) | 0x80, (i >> 7) | 0x80)) for i in range(16384)]
