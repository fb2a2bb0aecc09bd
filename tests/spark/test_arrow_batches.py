"""Fetched batches straight into Arrow: the same record batch the per-record decoder gives, or a refusal."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from unittest.mock import patch

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liftlog.api.stored import encode_fields
from liftlog.client import CorruptDataError
from liftlog.client.batches import decode_batches
from liftlog.spark import arrow_batches
from liftlog.spark.arrow_batches import arrow_batch
from liftlog.spark.offsets import OffsetRange
from liftlog.spark.reading import arrow_schema, columns_batch
from liftlog.storage import NewRecord
from liftlog.storage.records import encode_batch, encode_empty_batch

from ..server.test_messages import _records

SCHEMA = arrow_schema(False)
SUBJECT = "orders.new"


def per_record(data: bytes, start: int, limit: int) -> tuple[pa.RecordBatch | None, int]:
    cols, next_offset = decode_batches(data, start, limit, SUBJECT)
    if not cols:
        return None, next_offset
    return columns_batch(SCHEMA, OffsetRange("orders", 3, start, limit), cols, False), next_offset


def column_wise(data: bytes, start: int, limit: int) -> tuple[pa.RecordBatch | None, int] | None:
    return arrow_batch(data, start, limit, SCHEMA, "orders", 3, SUBJECT)


def decoded_column_wise(data: bytes, start: int, limit: int) -> tuple[pa.RecordBatch | None, int]:
    """``column_wise`` where the records are known to suit it (None would leave them to the per-record one)."""
    got = column_wise(data, start, limit)
    assert got is not None
    return got


# Records as the read path usually meets them: no headers, or only \x00fields without a subject.
plain_records = st.builds(
    lambda value, key, headers: NewRecord(value, key, headers),
    st.one_of(st.binary(max_size=40), st.binary(min_size=200, max_size=3000)),
    st.one_of(st.none(), st.binary(max_size=30)),
    st.one_of(
        st.just({}),
        st.builds(
            lambda inbox, cid: {"\x00fields": encode_fields("", "", inbox, cid, 1)},
            st.text(max_size=20),
            st.text(max_size=20),
        ),
    ),
)


@contextmanager
def walks(lockstep: int, at_once: int) -> Iterator[None]:
    """Numpy steps while ``lockstep`` batches still walk; batches of ``at_once`` records walked as they come."""
    with patch.object(arrow_batches, "_LOCKSTEP", lockstep), patch.object(arrow_batches, "_WALK_AT_ONCE", at_once):
        yield


def encoded(batches: list[list[NewRecord]], base: int, ts: int, gaps: list[int]) -> bytes:
    data = b""
    offset = base
    for i, records in enumerate(batches):
        gap = gaps[i] if i < len(gaps) else 0
        data += encode_batch(offset, 1, records, ts)
        offset += len(records)
        if gap:  # an empty batch: offsets compaction removed
            data += encode_empty_batch(offset, gap - 1, 1)
            offset += gap
    return data


@settings(max_examples=300, deadline=None)
@given(
    batches=st.lists(st.lists(plain_records, min_size=1, max_size=8), min_size=1, max_size=4),
    base=st.sampled_from([0, 1, 2**40]),
    ts=st.sampled_from([0, 1, -5_000, 1_763_884_800_123_456_789]),
    gaps=st.lists(st.integers(0, 3), max_size=4),
    start_delta=st.integers(0, 14),
    end_cut=st.integers(0, 14),
    lockstep=st.sampled_from([1, 2, 24]),  # batches walked by numpy steps while this many still walk
    at_once=st.sampled_from([1, 3, 256]),  # batches of this many records walked in Python as they come
)
def test_plain_records_give_the_per_record_decoders_batch(
    batches: list[list[NewRecord]],
    base: int,
    ts: int,
    gaps: list[int],
    start_delta: int,
    end_cut: int,
    lockstep: int,
    at_once: int,
) -> None:
    data = encoded(batches, base, ts, gaps)
    total = sum(len(b) for b in batches) + sum(gaps[: len(batches)])
    start = base + start_delta
    limit = max(start, base + total - end_cut)
    with walks(lockstep, at_once):
        got = column_wise(data, start, limit)
    assert got is not None
    want = per_record(data, start, limit)
    assert got[1] == want[1]
    if want[0] is None:
        assert got[0] is None
    else:
        assert got[0] is not None
        assert got[0].equals(want[0])
        got[0].validate(full=True)


@settings(max_examples=200, deadline=None)
@given(batches=st.lists(st.lists(_records(), min_size=1, max_size=6), min_size=1, max_size=3))
def test_any_records_are_decoded_alike_or_left_to_the_per_record_decoder(batches: list[list[NewRecord]]) -> None:
    data = encoded(batches, 7, 1_000_000, [])
    limit = 7 + sum(len(b) for b in batches)
    got = column_wise(data, 7, limit)
    if got is not None:  # none of the records carried user headers or a subject
        batch, next_offset = got
        want, want_next = per_record(data, 7, limit)
        assert next_offset == want_next
        assert batch is not None and want is not None and batch.equals(want)


def test_user_headers_and_stored_subjects_are_left_to_the_per_record_decoder() -> None:
    with_header = encode_batch(0, 1, [NewRecord(b"v", None, {"trace": b"1"})], 5)
    assert column_wise(with_header, 0, 1) is None
    subject = {"\x00fields": encode_fields("orders.eu", "", "", "", 0)}
    assert column_wise(encode_batch(0, 1, [NewRecord(b"v", None, subject)], 5), 0, 1) is None


def test_nothing_in_range() -> None:
    data = encode_batch(10, 1, [NewRecord(b"a", None, {}), NewRecord(b"b", None, {})], 5)
    assert column_wise(data, 20, 30) == (None, 20)
    assert column_wise(b"", 4, 9) == (None, 4)
    batch, next_offset = decoded_column_wise(data, 11, 30)
    assert batch is not None
    assert next_offset == 12 and batch.column("offset").to_pylist() == [11]
    assert batch.column("value").to_pylist() == [b"b"]


def test_nulls_short_and_long_values() -> None:
    records = [
        NewRecord(b"", None, {}),
        NewRecord(b"x" * 12, b"", {}),
        NewRecord(b"y" * 13, b"k" * 100, {}),
        NewRecord(bytes(range(256)) * 3, None, {}),
    ]
    batch, _ = decoded_column_wise(encode_batch(0, 1, records, 2_000_000), 0, 4)
    assert batch is not None
    assert batch.column("key").to_pylist() == [None, b"", b"k" * 100, None]
    assert batch.column("value").to_pylist() == [r.value for r in records]
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [2000] * 4
    assert batch.column("subject").to_pylist() == [SUBJECT] * 4


def test_a_damaged_batch_is_refused() -> None:
    data = bytearray(encode_batch(0, 1, [NewRecord(b"value", None, {})], 5))
    data[-1] ^= 1
    with pytest.raises(CorruptDataError, match="CRC"):
        column_wise(bytes(data), 0, 1)
    with pytest.raises(CorruptDataError, match="batch header"):
        column_wise(b"\x00" * 20, 0, 1)


def _resealed(records: bytes, count: int) -> bytes:
    """A batch of ``count`` records holding ``records`` as they are, with a valid CRC."""
    from crc32c import crc32c

    from liftlog.recordformat import BATCH_HEADER, BATCH_HEADER_SIZE

    length = BATCH_HEADER_SIZE - 12 + len(records)
    head = BATCH_HEADER.pack(0, length, 1, 1, 0, 0, count - 1, 0, 0, count)
    body = head[21:] + records
    return head[:17] + struct.pack(">I", crc32c(body)) + body


@pytest.mark.parametrize("length", [-4, -1, 0, 21, 2**31 - 1])
def test_impossible_record_lengths_are_refused_without_looping(length: int) -> None:
    from liftlog.recordformat import RECORD_HEADER

    data = _resealed(RECORD_HEADER.pack(length, 0, 0, -1, 0, 0), 10**8)
    with pytest.raises(CorruptDataError):
        column_wise(data, 0, 2**62)


@pytest.mark.parametrize(("key_len", "value_len"), [(-2, 0), (0, -1), (50, 0), (0, 50), (-1, 2**31 - 1)], ids=str)
def test_lengths_past_their_record_are_refused(key_len: int, value_len: int) -> None:
    from liftlog.recordformat import RECORD_HEADER

    data = _resealed(RECORD_HEADER.pack(22 + 4, 0, 0, key_len, value_len, 0) + b"abcd", 1)
    with pytest.raises(CorruptDataError):
        column_wise(data, 0, 2**62)


def test_many_batches_of_any_count_are_walked_alike() -> None:
    """Enough batches for numpy steps, of counts that leave some to finish in Python."""
    batches = [
        [NewRecord(bytes([i]) * ((i * 37 + j * 11) % 300), None if j % 3 else b"k", {}) for j in range(1 + i % 40)]
        for i in range(70)
    ]
    data = encoded(batches, 5, 1_000, [])
    limit = 5 + sum(len(b) for b in batches)
    want, want_next = per_record(data, 5, limit)
    for lockstep, at_once in [(1, 10**6), (24, 10**6), (1, 20), (24, 30), (10**6, 10**6), (10**6, 1)]:
        with walks(lockstep, at_once):
            batch, next_offset = decoded_column_wise(data, 5, limit)
        assert next_offset == want_next and batch is not None and batch.equals(want)


def test_a_batch_claiming_more_records_than_its_bytes_hold_is_refused() -> None:
    from liftlog.recordformat import RECORD_HEADER

    data = _resealed(RECORD_HEADER.pack(22, 0, 0, -1, 0, 0), 2)
    with pytest.raises(CorruptDataError, match="claims 2 records"):
        column_wise(data, 0, 2**62)


@pytest.mark.parametrize(("lockstep", "at_once"), [(1, 256), (24, 256), (24, 5)])
@pytest.mark.parametrize("length", [30, -26, -4, -1, 0, 21, 23, 2**31 - 1])
def test_a_bad_length_amid_many_batches_is_refused(length: int, lockstep: int, at_once: int) -> None:
    """One record's length, in the middle of one of 30 batches, sends its walk astray (or off the data)."""
    from liftlog.recordformat import RECORD_HEADER

    record = RECORD_HEADER.pack(30, 0, 0, -1, 8, 0) + b"v" * 8  # 4 + 30 bytes
    damaged = struct.pack(">i", length) + record[4:]
    batches = [_resealed(record * 5, 5) for _ in range(30)]
    batches[17] = _resealed(record * 2 + damaged + record * 2, 5)
    with walks(lockstep, at_once):
        if length == 30:  # undamaged: the control
            batch, _ = decoded_column_wise(b"".join(batches), 0, 2**62)
            assert batch is not None
            assert batch.num_rows == 150
        else:
            with pytest.raises(CorruptDataError):
                column_wise(b"".join(batches), 0, 2**62)


@pytest.mark.parametrize(("lockstep", "at_once"), [(1, 256), (24, 256), (24, 2)])
@pytest.mark.parametrize("where", ["before the data", "in its last bytes"])
def test_a_length_leading_out_of_the_data_is_refused(where: str, lockstep: int, at_once: int) -> None:
    """A batch's last record placed before the data (numpy would read from its end) or in its last bytes."""
    from liftlog.recordformat import BATCH_HEADER_SIZE, RECORD_HEADER

    record = RECORD_HEADER.pack(30, 0, 0, -1, 8, 0) + b"v" * 8
    rest = [_resealed(record * 5, 5) for _ in range(29)]
    size = len(_resealed(record * 2, 2)) + sum(len(b) for b in rest)
    target = -40 if where == "before the data" else size - 10
    damaged = struct.pack(">i", target - (BATCH_HEADER_SIZE + 4)) + record[4:]
    data = b"".join([_resealed(damaged + record, 2), *rest])
    with walks(lockstep, at_once), pytest.raises(CorruptDataError):
        column_wise(data, 0, 2**62)
