"""NATS message -> stored record -> API Message."""

from __future__ import annotations

from liftlog.api import api_pb2
from liftlog.api.envelope import encode_publish_message
from liftlog.server.messages import incoming_from_nats, record_to_message
from liftlog.storage import Record


def stored(incoming_record: object, offset: int = 7) -> Record:
    r = incoming_record
    return Record(offset, 123, r.key, r.value, dict(r.headers))  # type: ignore[attr-defined]


def test_plain_value_on_the_partition_subject_is_stored_bare() -> None:
    inc = incoming_from_nats("foo", "", b"hello", "foo")
    assert inc.record.value == b"hello" and not inc.record.headers
    msg = record_to_message(stored(inc.record), "s", 0, "foo")
    assert (msg.offset, msg.value, msg.subject, msg.replySubject, msg.timestamp) == (7, b"hello", "foo", "", 123)


def test_wildcard_subject_and_reply_are_kept() -> None:
    inc = incoming_from_nats("foo.bar", "_INBOX.x", b"v", "foo.*")
    msg = record_to_message(stored(inc.record), "s", 0, "foo.*")
    assert (msg.subject, msg.replySubject, dict(msg.headers)) == ("foo.bar", "_INBOX.x", {})


def test_envelope_is_unwrapped_with_ack_fields() -> None:
    env = encode_publish_message(
        api_pb2.Message(
            key=b"k",
            value=b"v",
            headers={"h": b"1", "\x00subject": b"spoof"},
            ackInbox="inbox",
            correlationId="c1",
            ackPolicy=api_pb2.ALL,
            offset=4,
        ),
        crc=True,
    )
    inc = incoming_from_nats("foo", "", env, "foo")
    assert (inc.ack_inbox, inc.correlation_id, inc.ack_policy, inc.expected_offset) == ("inbox", "c1", api_pb2.ALL, 4)
    msg = record_to_message(stored(inc.record), "s", 1, "foo")
    assert (msg.key, msg.value, dict(msg.headers)) == (b"k", b"v", {"h": b"1"})
    assert (msg.ackInbox, msg.correlationId, msg.ackPolicy, msg.subject) == ("inbox", "c1", api_pb2.ALL, "foo")


def test_malformed_envelope_is_stored_as_a_plain_value() -> None:
    env = encode_publish_message(api_pb2.Message(value=b"v"), crc=True)
    broken = env[:8] + bytes([env[8] ^ 0xFF]) + env[9:]  # CRC mismatch
    inc = incoming_from_nats("foo", "", broken, "foo")
    assert inc.record.value == broken and inc.ack_inbox == ""
