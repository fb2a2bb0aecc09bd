"""Cursor keys, partitions and record values as Liftbridge's servers and clients compute them."""

from __future__ import annotations

import pytest

from liftlog.api.cursors import (
    CursorValueError,
    cursor_key,
    cursor_partition,
    decode_cursor,
    encode_cursor,
    group_cursor_id,
)
from liftlog.metadata import InvalidStreamError, check_stream_usable, validate_new_stream


def test_the_key_is_liftbridges() -> None:
    assert cursor_key("c1", "orders", 3) == b"c1,orders,3"
    assert group_cursor_id("billing") == "__group:billing"


def test_the_partition_is_crc32_ieee_modulo_the_partition_count() -> None:
    # CRC-32/IEEE's check value (Go's crc32.ChecksumIEEE, which Liftbridge uses): crc("123456789") = 0xCBF43926
    assert [cursor_partition(b"123456789", n) for n in (1, 2, 3, 10, 7919)] == [
        0xCBF43926 % n for n in (1, 2, 3, 10, 7919)
    ]
    spread = {cursor_partition(cursor_key(f"c{i}", "s", 0), 8) for i in range(200)}
    assert spread == set(range(8))


def test_cursor_values_round_trip_and_garbage_is_refused() -> None:
    cursor = decode_cursor(encode_cursor("c", "s", 2, 99))
    assert (cursor.cursorId, cursor.stream, cursor.partition, cursor.offset) == ("c", "s", 2, 99)
    with pytest.raises(CursorValueError):
        decode_cursor(b"\xff\xff\xff")


def test_internal_stream_names_are_reserved_and_their_subjects_allowed() -> None:
    for name in ("__cursors", "__activity"):
        with pytest.raises(InvalidStreamError, match="reserved"):
            validate_new_stream(name, "anything", 1, "ns")
    check_stream_usable("__cursors", ["ns.cursors", "ns.cursors.1", "ns.cursors.12"], "ns")
    with pytest.raises(InvalidStreamError, match="foreign subject"):
        check_stream_usable("__cursors", ["ns.cursors", "ns.raft.metadata.a.propose"], "ns")
    with pytest.raises(InvalidStreamError):
        check_stream_usable("__cursors", ["ns.cursors.x"], "ns")
