"""NATS message -> stored record -> API Message."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from liftlog.api import api_pb2
from liftlog.api.envelope import encode_publish_message
from liftlog.server.partitions.messages import encode_messages, incoming_from_nats, record_to_message
from liftlog.storage import NewRecord, Record
from liftlog.storage.records import decode_records, encode_batch, parse_batch_header


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


# -- the catch-up encoder ---------------------------------------------------------

_names = st.sampled_from(["h", "x-trace", "ünï", "\x00subject", "\x00reply", "\x00ackInbox", "\x00correlationId"])


@st.composite
def _records(draw: st.DrawFn) -> NewRecord:
    headers = draw(st.dictionaries(_names, st.binary(max_size=300).map(bytes), max_size=5))
    if draw(st.booleans()):
        headers["\x00ackPolicy"] = bytes([draw(st.sampled_from([0, 1, 2]))])
    for name in list(headers):
        if name.startswith("\x00") and name != "\x00ackPolicy":
            headers[name] = draw(st.text(max_size=200)).encode()  # subjects and ids are text
    if draw(st.booleans()):  # how records are written now: the fields in one header, already encoded
        headers = {name: value for name, value in headers.items() if not name.startswith("\x00")}
        text = st.text(max_size=100)
        headers["\x00fields"] = api_pb2.Message(
            subject=draw(text),
            replySubject=draw(text),
            ackInbox=draw(text),
            correlationId=draw(text),
            ackPolicy=draw(st.sampled_from([api_pb2.LEADER, api_pb2.ALL, api_pb2.NONE])),
        ).SerializeToString()
    key = draw(st.one_of(st.none(), st.binary(max_size=200)))
    return NewRecord(draw(st.binary(max_size=70_000)), key, headers)


@settings(max_examples=200, deadline=None)
@given(
    records=st.lists(_records(), min_size=1, max_size=8),
    base=st.sampled_from([0, 1, 127, 128, 16_383, 16_384, 2**21 - 3, 2**40]),
    ts=st.sampled_from([0, 1, -5, 1_763_884_800_123_456_789]),
    start_delta=st.integers(0, 9),
)
def test_encoded_messages_decode_to_what_record_to_message_builds(
    records: list[NewRecord], base: int, ts: int, start_delta: int
) -> None:
    if len(records) > 4:  # records sharing their headers, as a coalesced publish stores them
        records = [r._replace(headers=records[0].headers) if i % 2 else r for i, r in enumerate(records)]
    batch = encode_batch(base, 3, records, ts)
    header = parse_batch_header(batch)
    out: list[bytes] = []
    limit = base + len(records)
    start = base + start_delta
    next_offset, used = encode_messages(
        memoryview(batch), header, start, limit, "orders", 2, "orders.*", out, 10_000, 1 << 30
    )
    wanted = [
        record_to_message(record, "orders", 2, "orders.*") for record in decode_records(batch, header, start, limit)
    ]
    assert [api_pb2.Message.FromString(m) for m in out] == wanted
    assert next_offset == max(start, limit) and used >= sum(map(len, out))


def test_encoded_messages_stop_at_the_count_and_byte_bounds() -> None:
    batch = encode_batch(10, 0, [NewRecord(b"v" * 100) for _ in range(10)], 5)
    header = parse_batch_header(batch)
    out: list[bytes] = []
    assert encode_messages(memoryview(batch), header, 10, 20, "s", 0, "s", out, 3, 1 << 20)[0] == 13
    assert len(out) == 3
    out.clear()
    next_offset, used = encode_messages(memoryview(batch), header, 10, 20, "s", 0, "s", out, 100, 1)
    assert (next_offset, len(out)) == (11, 1) and used > 1, "one message at least, however small the budget"


def test_records_keep_their_nats_fields_in_one_encoded_header() -> None:
    env = encode_publish_message(
        api_pb2.Message(value=b"v", ackInbox="in", correlationId="c", ackPolicy=api_pb2.ALL), crc=True
    )
    inc = incoming_from_nats("foo.bar", "reply.to", env, "foo.*")
    assert set(inc.record.headers) == {"\x00fields"}
    fields = api_pb2.Message.FromString(inc.record.headers["\x00fields"])
    assert (fields.subject, fields.replySubject, fields.ackInbox, fields.correlationId, fields.ackPolicy) == (
        "foo.bar",
        "reply.to",
        "in",
        "c",
        api_pb2.ALL,
    )


def test_records_written_with_one_header_per_field_still_read() -> None:
    """What servers before the encoded ``\\x00fields`` header stored."""
    old = Record(
        3,
        9,
        None,
        b"v",
        {
            "\x00subject": b"a.b",
            "\x00ackInbox": b"in",
            "\x00ackPolicy": bytes([api_pb2.ALL]),
            "\x00correlationId": b"c",
        },
    )
    msg = record_to_message(old, "s", 0, "a.*")
    assert (msg.subject, msg.ackInbox, msg.ackPolicy, msg.correlationId) == ("a.b", "in", api_pb2.ALL, "c")


# -- batched publishes ----------------------------------------------------------------


def _batch_envelope(records: list[NewRecord], **fields: object) -> bytes:
    from liftlog.api import batches_pb2
    from liftlog.api.batch_envelope import encode_record_batch
    from liftlog.storage.records import encode_records

    env = batches_pb2.RecordBatchEnvelope(records=encode_records(records), count=len(records), **fields)  # type: ignore[arg-type]
    return encode_record_batch(env)


def test_a_record_batch_envelope_becomes_one_incoming_with_its_records() -> None:
    data = _batch_envelope(
        [NewRecord(b"a", b"k", {"h": b"1", "\x00fields": b"spoof"}), NewRecord(b"b")],
        ackInbox="in",
        correlationId="c",
        ackPolicy=api_pb2.ALL,
        expectedOffset=7,
    )
    inc = incoming_from_nats("foo", "", data, "foo")
    assert (inc.ack_inbox, inc.correlation_id, inc.ack_policy, inc.expected_offset) == ("in", "c", api_pb2.ALL, 7)
    records = [inc.record, *inc.more]
    assert [(r.value, r.key, dict(r.headers)) for r in records] == [(b"a", b"k", {"h": b"1"}), (b"b", None, {})]


def test_a_batch_on_a_wildcard_stream_keeps_its_subject_per_record() -> None:
    inc = incoming_from_nats("foo.bar", "", _batch_envelope([NewRecord(b"a"), NewRecord(b"b")]), "foo.*")
    assert inc.expected_offset == -1
    for record in (inc.record, *inc.more):
        msg = record_to_message(stored(record), "s", 0, "foo.*")
        assert msg.subject == "foo.bar" and msg.ackInbox == ""


def _coalesced(records: list[NewRecord], fields: bytes, **envelope: object) -> bytes:
    """A batch as a coalesced PublishAsync sends it: each record carries the batch's stored fields."""
    return _batch_envelope([r._replace(headers={**r.headers, "\x00fields": fields}) for r in records], **envelope)


def test_a_batch_whose_records_carry_its_own_ack_fields_is_stored_as_it_came() -> None:
    from liftlog.api.stored import decode_fields, encode_fields

    fields = encode_fields("", "", "in", "c", api_pb2.LEADER)
    data = _coalesced([NewRecord(b"a", b"k", {"h": b"1"}), NewRecord(b"b")], fields, ackInbox="in", correlationId="c")
    inc = incoming_from_nats("foo", "", data, "foo")
    assert inc.encoded is not None and inc.encoded.record_count == 2
    assert (inc.ack_inbox, inc.correlation_id) == ("in", "c")
    # On a wildcard stream the records are rebuilt: the subject first, then the same ack fields.
    inc = incoming_from_nats("foo.bar", "", data, "foo.*")
    assert inc.encoded is None
    for record in (inc.record, *inc.more):
        assert decode_fields(record.headers["\x00fields"]) == ("foo.bar", "", "in", "c", api_pb2.LEADER)


def test_ack_fields_that_are_not_the_batch_own_are_dropped() -> None:
    from liftlog.api.stored import encode_fields

    forged = encode_fields("", "", "elsewhere", "x", api_pb2.LEADER)
    data = _coalesced([NewRecord(b"a", None, {"h": b"1"})], forged, ackInbox="in", correlationId="c")
    inc = incoming_from_nats("foo", "", data, "foo")
    assert inc.encoded is None and dict(inc.record.headers) == {"h": b"1"}
    # Without an ack inbox a batch has no fields of its own to allow.
    data = _coalesced([NewRecord(b"a")], encode_fields("", "", "", "", 0) + b"\x5a\x01x")
    inc = incoming_from_nats("foo", "", data, "foo")
    assert inc.encoded is None and not inc.record.headers


def test_a_broken_batch_envelope_is_a_plain_value() -> None:
    good = _batch_envelope([NewRecord(b"a")])
    for bad in (good[:-1], good[:8] + b"\x00\x00\x00\x00" + good[12:], good[:4] + b"\x02" + good[5:]):
        inc = incoming_from_nats("foo", "", bad, "foo")
        assert inc.record.value == bad and not inc.more
    from liftlog.api import batches_pb2
    from liftlog.api.batch_envelope import encode_record_batch

    lying = encode_record_batch(batches_pb2.RecordBatchEnvelope(records=b"\x00" * 30, count=3))
    assert incoming_from_nats("foo", "", lying, "foo").record.value == lying
