"""How a NATS message becomes a stored record, and a stored record an API ``Message``.

Liftbridge returns the NATS subject, reply subject, ack inbox, correlation id
and ack policy of every message on subscribe, so they are stored with it, as
headers whose names start with NUL (``\\x00subject`` ...). User headers with
such names are dropped on the way in: they could not be told apart. To keep
records small, the subject is stored only when it differs from the
partition's subject (wildcard streams) and empty fields are not stored.

Sans-IO: plain functions over bytes and protobuf messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from liftlog.api import api_pb2
from liftlog.api.envelope import decode_publish_message
from liftlog.storage import EMPTY_HEADERS, NewRecord, Record

__all__ = ["Incoming", "incoming_from_nats", "record_size", "record_to_message"]

RESERVED = "\x00"
H_SUBJECT = "\x00subject"
H_REPLY = "\x00reply"
H_ACK_INBOX = "\x00ackInbox"
H_CORRELATION_ID = "\x00correlationId"
H_ACK_POLICY = "\x00ackPolicy"

_POLICY_BYTES = {p: bytes([p]) for p in (api_pb2.LEADER, api_pb2.ALL, api_pb2.NONE)}


class Incoming(NamedTuple):
    """A message received for a partition, before it has an offset."""

    record: NewRecord
    subject: str
    ack_inbox: str
    correlation_id: str
    ack_policy: int
    #: With optimistic concurrency control: the offset the publisher expects it to get.
    expected_offset: int


def record_size(record: NewRecord) -> int:
    """Bytes of payload a record carries: key, value, header names and values."""
    size = len(record.value) + (len(record.key) if record.key else 0)
    for name, value in record.headers.items():
        size += len(name) + len(value)
    return size


def incoming_from_nats(subject: str, reply: str, data: bytes, partition_subject: str) -> Incoming:
    """Unwrap a Publish envelope if there is one; anything else is a plain value."""
    message = decode_publish_message(data) if data[:1] == b"\xb9" else None
    if message is None:
        if subject == partition_subject and not reply:
            return Incoming(NewRecord(data), subject, "", "", api_pb2.NONE, -1)
        headers: dict[str, bytes] = {}
        if subject != partition_subject:
            headers[H_SUBJECT] = subject.encode()
        if reply:
            headers[H_REPLY] = reply.encode()
        return Incoming(NewRecord(data, None, headers), subject, "", "", api_pb2.NONE, -1)

    headers = {k: v for k, v in message.headers.items() if not k.startswith(RESERVED)} if message.headers else {}
    if subject != partition_subject:
        headers[H_SUBJECT] = subject.encode()
    if reply:
        headers[H_REPLY] = reply.encode()
    inbox = message.ackInbox
    cid = message.correlationId
    policy = message.ackPolicy
    if inbox:
        headers[H_ACK_INBOX] = inbox.encode()
        headers[H_ACK_POLICY] = _POLICY_BYTES.get(policy, bytes([policy & 0xFF]))
    if cid:
        headers[H_CORRELATION_ID] = cid.encode()
    record = NewRecord(message.value, message.key or None, headers or EMPTY_HEADERS)
    return Incoming(record, subject, inbox, cid, policy, message.offset)


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
