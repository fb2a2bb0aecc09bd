"""Fetched record batches decoded into columns: the same messages Subscribe gives, and corrupt bytes refused."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liftlog.api import api_pb2
from liftlog.api.stored import StoredFields, decode_fields, encode_fields, stored_subject
from liftlog.client import CorruptDataError, Message
from liftlog.client.batches import Columns, decode_batches
from liftlog.recordformat import batches_end
from liftlog.server.partitions.messages import record_to_message
from liftlog.storage import NewRecord
from liftlog.storage.records import decode_records, encode_batch, encode_empty_batch, parse_batch_header

from ..server.test_messages import _records


def as_messages(cols: Columns) -> list[api_pb2.Message]:
    """The columns as the API messages Subscribe would send, to compare with record_to_message."""
    out = []
    for m in cols.messages():
        out.append(
            api_pb2.Message(
                offset=m.offset,
                key=m.key,
                value=m.value,
                timestamp=m.timestamp,
                stream=m.stream,
                partition=m.partition,
                subject=m.subject,
                replySubject=m.reply_subject,
                headers=m.headers,
                ackInbox=m.ack_inbox,
                correlationId=m.correlation_id,
                ackPolicy=int(m.ack_policy),  # type: ignore[arg-type]
            )
        )
    return out


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(st.lists(_records(), min_size=1, max_size=6), min_size=1, max_size=4),
    base=st.sampled_from([0, 1, 127, 2**40]),
    ts=st.sampled_from([0, 1, -5, 1_763_884_800_123_456_789]),
    start_delta=st.integers(0, 12),
    end_cut=st.integers(0, 5),
)
def test_columns_hold_what_subscribe_sends(
    batches: list[list[NewRecord]], base: int, ts: int, start_delta: int, end_cut: int
) -> None:
    data = b""
    offset = base
    for records in batches:
        data += encode_batch(offset, 1, records, ts)
        offset += len(records)
    start = base + start_delta
    limit = max(base, offset - end_cut)
    cols, nxt = decode_batches(data, start, limit, "orders.*", out=Columns("orders", 2), headers=True, fields=True)
    wanted = []
    pos = 0
    while pos < len(data):
        header = parse_batch_header(data, pos)
        chunk = data[pos : pos + header.size]
        wanted += [
            record_to_message(r, "orders", 2, "orders.*")
            for r in decode_records(chunk, parse_batch_header(chunk), start, limit)
        ]
        pos += header.size
    assert as_messages(cols) == wanted
    assert cols.subjects == [m.subject for m in wanted]
    assert nxt == max(start, limit), "past every offset the data covers, at most the limit"
    lean, _ = decode_batches(data, start, limit, "orders.*")
    assert (lean.offsets, lean.values, lean.keys, lean.subjects, lean.timestamps) == (
        cols.offsets,
        cols.values,
        cols.keys,
        cols.subjects,
        cols.timestamps,
    ), "without headers and fields the other columns are the same"
    assert lean.headers == [] and lean.fields == []


def test_batches_end_crosses_compacted_offsets() -> None:
    data = (
        encode_batch(0, 0, [NewRecord(b"a")], 1)
        + encode_empty_batch(1, 9, 0)
        + encode_batch(11, 0, [NewRecord(b"b")], 1)
    )
    cols, nxt = decode_batches(data, 0, 100, "s")
    assert (cols.offsets, cols.values, nxt) == ([0, 11], [b"a", b"b"], 12)
    assert batches_end(data, 0, 100) == 12 and batches_end(data, 0, 5) == 5 and batches_end(b"", 7, 100) == 7


def test_nothing_to_decode() -> None:
    cols, nxt = decode_batches(b"", 5, 10, "s")
    assert len(cols) == 0 and nxt == 5


def test_a_batch_that_fails_its_crc_is_refused() -> None:
    data = bytearray(encode_batch(0, 0, [NewRecord(b"value")], 1))
    data[-1] ^= 0x01
    with pytest.raises(CorruptDataError, match="offset 0 fails its CRC"):
        decode_batches(bytes(data), 0, 10, "s")


@pytest.mark.parametrize("cut", [1, 20, 47, 60])
def test_truncated_data_is_refused(cut: int) -> None:
    data = encode_batch(0, 0, [NewRecord(b"v" * 30)], 1) * 2
    with pytest.raises(CorruptDataError):
        decode_batches(data[:-cut], 0, 10, "s")


def test_garbage_is_refused() -> None:
    with pytest.raises(CorruptDataError, match="no valid batch"):
        decode_batches(b"\x00" * 100, 0, 10, "s")


def test_a_record_whose_lengths_lie_is_refused_even_with_a_good_crc() -> None:
    """A batch whose CRC matches but whose record claims more value bytes than it has."""
    good = bytearray(encode_batch(0, 0, [NewRecord(b"abc", None, {"h": b"1"})], 1))
    struct.pack_into(">i", good, 47 + 20, 500)  # the record's value length
    from crc32c import crc32c

    struct.pack_into(">I", good, 17, crc32c(bytes(good[21:])))
    with pytest.raises(CorruptDataError):
        decode_batches(bytes(good), 0, 10, "s")


def test_messages_needs_headers_and_fields() -> None:
    cols, _ = decode_batches(encode_batch(0, 0, [NewRecord(b"v")], 1), 0, 1, "s")
    with pytest.raises(ValueError, match="headers=True and fields=True"):
        cols.messages()
    full, _ = decode_batches(encode_batch(0, 0, [NewRecord(b"v")], 1), 0, 1, "s", headers=True, fields=True)
    (msg,) = full.messages()
    assert isinstance(msg, Message) and (msg.offset, msg.value, msg.subject, msg.key) == (0, b"v", "s", None)


def test_stored_fields_round_trip() -> None:
    raw = encode_fields("a.b", "r", "inbox", "c-1", api_pb2.ALL)
    assert decode_fields(raw) == StoredFields("a.b", "r", "inbox", "c-1", api_pb2.ALL)
    assert stored_subject(raw) == "a.b" and stored_subject(encode_fields("", "r", "", "", 0)) == ""
    assert (
        raw
        == api_pb2.Message(
            subject="a.b", replySubject="r", ackInbox="inbox", correlationId="c-1", ackPolicy=api_pb2.ALL
        ).SerializeToString()
    ), "the protobuf encoding of the same Message fields"
    with pytest.raises(ValueError):
        decode_fields(b"\x3a\x10ab")
