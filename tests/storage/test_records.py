from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liftlog.recordformat import BATCH_HEADER_SIZE, batch_crc_ok
from liftlog.storage import InvalidBatch, NewRecord, RecordTooLarge
from liftlog.storage.records import (
    decode_records,
    encode_batch,
    encode_empty_batch,
    iter_batch_headers,
    parse_batch_header,
    record_keys,
    retain_records,
)


def sample() -> list[NewRecord]:
    return [
        NewRecord(b"v0"),
        NewRecord(b"v1", key=b"k1", timestamp=5),
        NewRecord(b"", key=b"", headers={"subject": b"a.b", "reply": b""}),
        NewRecord(b"v3", headers={"\u00e9": b"\x00\xff"}, timestamp=99),
    ]


def test_roundtrip_keeps_every_field() -> None:
    data = encode_batch(10, 3, sample(), default_timestamp=7)
    header = parse_batch_header(data)
    assert (header.base_offset, header.leader_epoch, header.record_count) == (10, 3, 4)
    assert (header.first_timestamp, header.max_timestamp, header.next_offset) == (7, 99, 14)
    assert header.size == len(data)
    records = decode_records(data, header)
    assert [r.offset for r in records] == [10, 11, 12, 13]
    assert [r.key for r in records] == [None, b"k1", b"", None]
    assert [r.value for r in records] == [b"v0", b"v1", b"", b"v3"]
    assert [r.timestamp for r in records] == [7, 5, 7, 99]
    assert dict(records[2].headers) == {"subject": b"a.b", "reply": b""}
    assert dict(records[3].headers) == {"\u00e9": b"\x00\xff"}
    assert dict(records[0].headers) == {}


def test_decode_respects_offset_bounds() -> None:
    data = encode_batch(10, 0, sample(), 0)
    header = parse_batch_header(data)
    assert [r.offset for r in decode_records(data, header, min_offset=11, max_offset=13)] == [11, 12]


def test_crc_detects_a_flipped_bit() -> None:
    data = bytearray(encode_batch(0, 0, sample(), 0))
    header = parse_batch_header(data)
    assert batch_crc_ok(data, header)
    data[-1] ^= 0x01
    assert not batch_crc_ok(data, header)


def test_iter_headers_stops_at_partial_batch_without_raising() -> None:
    one = encode_batch(0, 0, sample(), 0)
    two = encode_batch(4, 0, sample(), 0)
    buf = one + two
    for cut in range(len(buf) + 1):
        whole = list(iter_batch_headers(buf[:cut]))
        expected = 0 if cut < len(one) else (1 if cut < len(buf) else 2)
        assert len(whole) == expected, cut


def test_bad_magic_and_impossible_lengths_are_invalid() -> None:
    data = bytearray(encode_batch(0, 0, sample(), 0))
    data[16] = 9
    with pytest.raises(InvalidBatch, match="magic 9"):
        parse_batch_header(data)
    with pytest.raises(InvalidBatch, match="too few"):
        parse_batch_header(b"\x00" * (BATCH_HEADER_SIZE - 1))


def test_record_too_large_names_size_and_limit() -> None:
    with pytest.raises(RecordTooLarge, match=r"record of 1050 bytes exceeds the maximum of 1000 bytes"):
        encode_batch(0, 0, [NewRecord(b"x" * 1024)], 0, max_record_bytes=1000)


def test_empty_batch_covers_offsets_without_records() -> None:
    data = encode_empty_batch(50, 9, 2)
    header = parse_batch_header(data)
    assert (header.record_count, header.next_offset, header.leader_epoch) == (0, 60, 2)
    assert decode_records(data, header) == []
    assert batch_crc_ok(data, header)


def test_retain_records_keeps_offsets_and_range() -> None:
    data = encode_batch(100, 1, sample(), 0)
    header = parse_batch_header(data)
    kept = retain_records(data, header, [1, 3])
    assert kept is not None
    new_header = parse_batch_header(kept)
    assert new_header.next_offset == 104 and new_header.record_count == 2
    assert [r.offset for r in decode_records(kept, new_header)] == [101, 103]
    assert [o for o, _ in record_keys(kept, new_header)] == [101, 103]
    assert retain_records(data, header, []) is None


# -- the records part alone: what a batched publish sends --------------------------------

#: Records as publishers hand them over (no timestamps: the log sets them).
_NEW_RECORDS = st.lists(
    st.builds(
        NewRecord,
        st.binary(max_size=200),
        st.one_of(st.none(), st.binary(max_size=20)),
        st.dictionaries(st.text(max_size=10), st.binary(max_size=20), max_size=3),
        timestamp=st.none(),
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=100, deadline=None)
@given(_NEW_RECORDS)
def test_encoded_records_decode_to_the_same_records(records: list[NewRecord]) -> None:
    from liftlog.storage.records import decode_new_records, encode_records

    data = encode_records(records)
    assert decode_new_records(data, len(records)) == [NewRecord(r.value, r.key, r.headers) for r in records]
    assert encode_batch(0, 0, records, 0).endswith(data), "a batch's records are exactly these bytes"


@settings(max_examples=100, deadline=None)
@given(_NEW_RECORDS)
def test_prepared_records_encode_to_the_same_bytes(records: list[NewRecord]) -> None:
    """PublishAsync's batches and the Spark sink use encode_prepared; readers expect encode_records' bytes."""
    from liftlog.storage.records import encode_headers, encode_prepared, encode_records

    prepared = [(r.key, r.value, encode_headers(r.headers), len(r.headers)) for r in records]
    assert encode_prepared(prepared) == encode_records(records)


@pytest.mark.parametrize(
    ("mangle", "count", "match"),
    [
        (lambda d: d, 3, "malformed"),  # says three, has two
        (lambda d: d, 0, "at least one record"),
        (lambda d: d + b"\x00", 2, "1 bytes follow"),
        (lambda d: d[:-1], 2, "malformed"),
        (lambda d: d[:4] + b"\x00\x00\x00\x05" + d[8:], 2, "offset delta 5"),
    ],
)
def test_malformed_records_are_refused(mangle: Any, count: int, match: str) -> None:
    from liftlog.storage.records import decode_new_records, encode_records

    data = mangle(encode_records([NewRecord(b"a", None, {"h": b"v"}), NewRecord(b"bb", b"k")]))
    with pytest.raises(InvalidBatch, match=match):
        decode_new_records(data, count)


def test_sealed_records_are_the_batch_encode_batch_writes() -> None:
    from liftlog.storage.records import check_records, encode_records, seal_records

    records = [NewRecord(b"a", b"k", {"h": b"v"}), NewRecord(b"bb"), NewRecord(b"", None, {"\x00x": b""})]
    data = encode_records(records, default_timestamp=5)
    info = check_records(data, 3)
    assert (info.largest_payload, info.reserved_headers, len(info.positions)) == (2, True, 3)
    assert seal_records(10, 2, data, 3, 99) == encode_batch(10, 2, records, 99), "timestamps are the leader's"
    with pytest.raises(RecordTooLarge):
        seal_records(10, 2, data, 3, 99, max_record_bytes=info.largest_record - 1)


def test_one_reserved_header_may_be_allowed_by_name_and_value() -> None:
    from liftlog.storage.records import check_records, encode_records

    own = (b"\x00fields", b"\x52\x02in")
    ok = [NewRecord(b"a", None, {"\x00fields": own[1]}), NewRecord(b"b", b"k", {"h": b"1", "\x00fields": own[1]})]
    assert not check_records(encode_records(ok), 2, own).reserved_headers
    assert check_records(encode_records(ok), 2).reserved_headers, "nothing is allowed unless named"
    for forged in ({"\x00fields": b"\x52\x02xx"}, {"\x00other": own[1]}, {"\x00fields": own[1], "\x00ackInbox": b"x"}):
        data = encode_records([ok[0], NewRecord(b"c", None, forged)])
        assert check_records(data, 2, own).reserved_headers, forged


def test_a_batch_checked_again_is_looked_up_but_never_gets_a_wrong_answer() -> None:
    """The leader's intake re-checks what the Publish RPC checked: equal bytes, another object."""
    from liftlog.storage.records import check_records, encode_records

    own = (b"\x00fields", b"\x52\x02in")
    plain = encode_records([NewRecord(b"v%d" % i, None, {"h": b"x"}) for i in range(100)])
    first = check_records(plain, 100)
    again = check_records(bytes(bytearray(plain)), 100, own)
    assert again is first, "the same content, checked once"
    # A batch whose answer depends on what is allowed is checked every time, whatever came first.
    tagged = encode_records([NewRecord(b"v%d" % i, None, {"\x00fields": own[1]}) for i in range(100)])
    assert not check_records(tagged, 100, own).reserved_headers
    assert check_records(bytes(bytearray(tagged)), 100).reserved_headers, "nothing is allowed unless named"
    assert not check_records(bytes(bytearray(tagged)), 100, own).reserved_headers
    # Malformed content is never remembered as checked, and a different count is a different question.
    with pytest.raises(InvalidBatch):
        check_records(plain, 99)
    with pytest.raises(InvalidBatch):
        check_records(plain[:-1], 100)


def test_records_sharing_one_headers_mapping_encode_as_separate_ones() -> None:
    from liftlog.storage.records import decode_new_records, encode_records

    shared = {"h": b"v"}
    records = [NewRecord(b"a", None, shared), NewRecord(b"b", None, {"h": b"w"}), NewRecord(b"c", None, shared)]
    assert encode_records(records) == encode_records([r._replace(headers=dict(r.headers)) for r in records])
    assert [dict(r.headers) for r in decode_new_records(encode_records(records), 3)] == [shared, {"h": b"w"}, shared]


_shared_names = st.lists(st.sampled_from(["trace", "\x00own", "é", "t", "x" * 20]), unique=True, max_size=3)


@st.composite
def _records_sharing_header_names(draw: st.DrawFn) -> list[NewRecord]:
    """Records whose headers mostly have one producer's names and value sizes, so a header shape repeats."""
    names = draw(_shared_names)
    sizes = {name: draw(st.integers(0, 40)) for name in names}
    out = []
    for _ in range(draw(st.integers(1, 12))):
        if draw(st.integers(0, 3)):  # the usual record: the same names, values of the same size
            headers = {name: draw(st.binary(min_size=sizes[name], max_size=sizes[name])) for name in names}
        else:
            headers = draw(st.dictionaries(st.sampled_from(["trace", "\x00own", "é", "u"]), st.binary(max_size=40)))
        key = draw(st.one_of(st.none(), st.binary(max_size=8)))
        out.append(NewRecord(draw(st.binary(max_size=50)), key, headers))
    return out


@settings(max_examples=300, deadline=None)
@given(records=_records_sharing_header_names())
def test_check_records_learns_what_each_record_holds(records: list[NewRecord]) -> None:
    """Whatever shortcut the check takes for headers it saw before, its answer is each record's own facts."""
    from liftlog.storage.records import _check_records, encode_records

    info = _check_records(encode_records(records), len(records), None)
    sizes = [len(encode_records([r])) for r in records]
    assert info.positions == [sum(sizes[:i]) for i in range(len(records))]
    assert info.largest_payload == max(len(r.value) + len(r.key or b"") for r in records)
    assert info.largest_record == max(sizes)
    assert info.reserved_headers == any(name.startswith("\x00") for r in records for name in r.headers)


def test_a_header_shaped_like_an_earlier_one_is_still_checked() -> None:
    """Records whose header part has the earlier record's length but another name: walked, not assumed."""
    from liftlog.storage.records import _check_records, encode_headers, encode_prepared

    first = (None, b"v", encode_headers({"ab": b"1"}), 1)
    reserved = (None, b"v", encode_headers({"\x00b": b"1"}), 1)
    assert not _check_records(encode_prepared([first, first]), 2, None).reserved_headers
    assert _check_records(encode_prepared([first, reserved]), 2, None).reserved_headers
    not_text = encode_prepared([first, (None, b"v", encode_headers({"ab": b"1"}).replace(b"ab", b"\xff\xfe"), 1)])
    with pytest.raises(InvalidBatch, match=r"record 1 .* not UTF-8"):
        _check_records(not_text, 2, None)
    # The same bytes taken as two headers instead of one: a different shape, walked (and refused here).
    two = encode_prepared([first, (None, b"v", encode_headers({"ab": b"1"}), 2)])
    with pytest.raises(InvalidBatch, match="record 1"):
        _check_records(two, 2, None)
