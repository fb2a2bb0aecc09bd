"""Record batch codec for what writes batches: records to bytes, and back to records (sans-IO).

The layout itself (offsets, sizes, magic, attributes, :class:`BatchHeader`)
and the walk of batches and records every reader shares live below storage,
in :mod:`liftlog.recordformat` (``docs/storage-format.md`` gives it byte by
byte). Here: the encoders (:func:`encode_batch`, :func:`encode_records`,
:func:`encode_prepared`, :func:`seal_records`), the strict check of records
a publisher sent (:func:`check_records`), the storage's reads of records
(:func:`decode_records`, :func:`record_keys`, :func:`retain_records` for
compaction and truncation) and the header parse and walk with storage's
error, ``InvalidBatch`` (:func:`parse_batch_header`, :func:`iter_batch_headers`).
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Final, NamedTuple

from crc32c import crc32c

from liftlog.recordformat import (
    ATTR_MSG_IDS,
    BATCH_HEAD,
    BATCH_HEADER_SIZE,
    BATCH_TAIL,
    HEADER_NAME,
    HEADER_VALUE,
    LOG_OVERHEAD,
    MAGIC,
    RECORD_HEADER,
    RECORD_OVERHEAD,
    BatchHeader,
    MalformedBatch,
    batch_headers,
    decode_headers,
    read_batch_header,
    walk_records,
)

from .errors import InvalidBatch, RecordTooLarge

__all__ = [
    "EMPTY_HEADERS",
    "NewRecord",
    "PreparedRecord",
    "Record",
    "RecordsInfo",
    "check_records",
    "decode_new_records",
    "decode_records",
    "encode_batch",
    "encode_empty_batch",
    "encode_headers",
    "encode_prepared",
    "encode_records",
    "header_values",
    "iter_batch_headers",
    "parse_batch_header",
    "record_keys",
    "retain_records",
    "seal_records",
]

#: Reserved header names publishers may send (``liftlog.replication.duplicates.PUBLISHER_RESERVED``): a batched
#: publish's id for the whole batch, and a message id the client made up; stored, never served.
_PUBLISHER_NAMES = (b"\x00batch", b"\x00msgid")
_HEADER_NAME = HEADER_NAME
_HEADER_VALUE = HEADER_VALUE

EMPTY_HEADERS: Mapping[str, bytes] = MappingProxyType({})


class NewRecord(NamedTuple):
    """A record to append; the log assigns its offset."""

    value: bytes
    key: bytes | None = None
    headers: Mapping[str, bytes] = EMPTY_HEADERS
    #: Nanoseconds since the epoch; ``None`` means "now" at append time.
    timestamp: int | None = None


class Record(NamedTuple):
    """A record read back from the log."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes
    headers: Mapping[str, bytes]


def encode_batch(
    base_offset: int,
    leader_epoch: int,
    records: Sequence[NewRecord],
    default_timestamp: int,
    max_record_bytes: int = 2**31 - 1,
    attributes: int = 0,
) -> bytes:
    """Encode ``records`` as one batch whose first record gets ``base_offset``.

    Records without a timestamp get ``default_timestamp``. Offsets are
    consecutive; gaps only appear later, through compaction. A record whose
    encoded size exceeds ``max_record_bytes`` raises RecordTooLarge and
    nothing is encoded.
    """
    if not records:
        raise InvalidBatch("a batch needs at least one record")
    body, first_ts, max_ts = _encode_records(records, default_timestamp, max_record_bytes)
    return _seal(base_offset, leader_epoch, len(records) - 1, first_ts, max_ts, len(records), body, attributes)


def encode_records(records: Sequence[NewRecord], default_timestamp: int = 0) -> bytes:
    """The records part of a batch (offset deltas from 0), without its header: what a batched publish sends."""
    return _encode_records(records, default_timestamp, 2**31 - 1)[0]


def _encode_records(
    records: Sequence[NewRecord], default_timestamp: int, max_record_bytes: int
) -> tuple[bytes, int, int]:
    """(encoded records, first timestamp, max timestamp)."""
    limit = max_record_bytes - 4
    parts: list[bytes] = [b""]
    append = parts.append
    pack = RECORD_HEADER.pack
    first_ts = max_ts = -1
    last_headers: object = None
    encoded = b""
    for delta, (value, key, headers, ts) in enumerate(records):
        if ts is None:
            ts = default_timestamp
        if delta == 0:
            first_ts = max_ts = ts
        elif ts > max_ts:
            max_ts = ts
        key_len = -1 if key is None else len(key)
        body = len(value) + (0 if key is None else key_len)
        if headers:
            if headers is not last_headers:  # records often share one headers mapping (a batch's stored fields)
                encoded = encode_headers(headers)
                last_headers = headers
            if 22 + body + len(encoded) > limit:
                raise RecordTooLarge(26 + body + len(encoded), max_record_bytes)
            append(pack(22 + body + len(encoded), delta, ts, key_len, len(value), len(headers)))
            if key:
                append(key)
            append(value)
            append(encoded)
        else:
            if 22 + body > limit:
                raise RecordTooLarge(26 + body, max_record_bytes)
            append(pack(22 + body, delta, ts, key_len, len(value), 0))
            if key:
                append(key)
            append(value)
    return b"".join(parts), first_ts, max_ts


#: A record ready to encode, for writers that make millions (the Spark sink): its key (None for none),
#: value, headers already encoded (:func:`encode_headers`, possibly several concatenated) and their number.
PreparedRecord = tuple[bytes | None, bytes, bytes, int]


def encode_prepared(records: Sequence[PreparedRecord]) -> bytes:
    """The records part of a batch, as :func:`encode_records` makes it, from prepared records (timestamps 0)."""
    parts: list[bytes] = []
    append = parts.append
    pack = RECORD_HEADER.pack
    for delta, (key, value, headers, n_headers) in enumerate(records):
        if key is None:
            append(pack(22 + len(value) + len(headers), delta, 0, -1, len(value), n_headers))
        else:
            append(pack(22 + len(key) + len(value) + len(headers), delta, 0, len(key), len(value), n_headers))
            append(key)
        append(value)
        if n_headers:
            append(headers)
    return b"".join(parts)


def decode_new_records(data: bytes, count: int) -> list[NewRecord]:
    """Records encoded by :func:`encode_records`, to append again (timestamps dropped: the log sets them).

    Checks the structure strictly (see :func:`check_records`), since the
    bytes come from the network; raises InvalidBatch naming the first problem.
    """
    check_records(data, count)
    out: list[NewRecord] = []
    append = out.append
    unpack = RECORD_HEADER.unpack_from
    unpack_name = _HEADER_NAME.unpack_from
    unpack_value = _HEADER_VALUE.unpack_from
    pos = 0
    try:
        for _ in range(count):
            length, _delta, _ts, key_len, value_len, n_headers = unpack(data, pos)
            p = pos + RECORD_OVERHEAD
            key = None
            if key_len >= 0:
                key = data[p : p + key_len]
                p += key_len
            value = data[p : p + value_len]
            p += value_len
            headers: Mapping[str, bytes] = EMPTY_HEADERS
            if n_headers:
                found: dict[str, bytes] = {}
                for _ in range(n_headers):
                    (name_len,) = unpack_name(data, p)
                    name = data[p + 2 : p + 2 + name_len].decode()
                    p += 2 + name_len
                    (size,) = unpack_value(data, p)
                    found[name] = data[p + 4 : p + 4 + size]
                    p += 4 + size
                headers = found
            append(NewRecord(value, key, headers))
            pos += 4 + length
    except UnicodeDecodeError as exc:
        raise InvalidBatch(f"record {len(out)} of the batch has a header name that is not UTF-8: {exc}") from exc
    return out


class RecordsInfo(NamedTuple):
    """What :func:`check_records` learned about encoded records."""

    #: Where each record starts.
    positions: list[int]
    #: The largest key + value (what publishing checks against streams.max.message.bytes).
    largest_payload: int
    #: The largest encoded record (what the log checks against its max record bytes).
    largest_record: int
    #: Whether a header name starts with NUL (reserved for the server).
    reserved_headers: bool
    #: Whether any record has a header.
    has_headers: bool = False
    #: Whether a record other than the first has a header.
    later_headers: bool = False


#: Batches checked lately, by content. A batched publish is checked by the RPC that takes it and again by the
#: leader's intake when the same bytes come back from NATS; the second check is then a lookup (hashing 350 KB
#: takes about 150 µs, checking its 1,000 records 2 ms). Only answers that found no reserved header with none
#: allowed are kept: they are the same whatever ``allowed_header`` is. Keyed by content, so servers that share
#: a process (tests) may share it.
_CHECKED: OrderedDict[tuple[bytes, int], RecordsInfo] = OrderedDict()
_CHECKED_KEEP: Final = 8
_CHECKED_MIN_RECORDS: Final = 32  # smaller batches take less time to check than to hash


def check_records(data: bytes, count: int, allowed_header: tuple[bytes, bytes] | None = None) -> RecordsInfo:
    """Check that ``data`` is ``count`` records as :func:`encode_records` writes them.

    Offset deltas must be 0, 1, ..., every length must stay within its
    record and the data must end with the last record. Raises InvalidBatch
    naming the first problem. Builds no record objects: a publish is checked
    where it arrives, and the leader stores checked records as they are.
    A reserved header (name starting with NUL) counts in ``reserved_headers``
    unless it is exactly ``allowed_header`` (name, value). The answer may be
    shared with other callers: do not change it.
    """
    if count < _CHECKED_MIN_RECORDS or type(data) is not bytes:
        return _check_records(data, count, allowed_header)
    key = (data, count)
    info = _CHECKED.get(key)
    if info is None:
        info = _check_records(data, count, allowed_header)
        if allowed_header is None and not info.reserved_headers:  # no NUL header at all
            _CHECKED[key] = info
            if len(_CHECKED) > _CHECKED_KEEP:
                _CHECKED.popitem(last=False)
    return info


def _check_records(data: bytes, count: int, allowed_header: tuple[bytes, bytes] | None) -> RecordsInfo:
    if count < 1:
        raise InvalidBatch(f"a batch needs at least one record, it says it has {count}")
    end = len(data)
    pos = 0
    largest = largest_record = 0
    reserved = any_headers = later_headers = False
    positions: list[int] = []
    append = positions.append
    unpack = RECORD_HEADER.unpack_from
    # The allowed header as encoded: a record whose only header it is is checked with one comparison.
    allowed = encode_headers({allowed_header[0].decode(): allowed_header[1]}) if allowed_header else b"\xff"
    # The headers of the first record that has some, as a shape: the bytes of each header but its value,
    # where they sit in the record's header part. Records whose headers have the same shape (one producer's
    # headers, with other values) are checked by comparing those bytes, not by walking their headers again.
    shape: tuple[int, int, tuple[tuple[int, bytes], ...]] | None = None
    i = 0
    try:
        for i in range(count):
            length, delta, _ts, key_len, value_len, n_headers = unpack(data, pos)
            record_end = pos + 4 + length
            if delta != i or record_end > end or key_len < -1 or value_len < 0:
                raise InvalidBatch(f"record {i} of the batch is malformed (offset delta {delta}, length {length})")
            size = value_len + key_len if key_len > 0 else value_len
            p = pos + RECORD_OVERHEAD + size
            if n_headers:
                any_headers = True
                if i:
                    later_headers = True
                known = (n_headers == 1 and data[p:record_end] == allowed) or (
                    shape is not None
                    and n_headers == shape[0]
                    and record_end - p == shape[1]
                    and _same_shape(data, p, shape[2])
                )
                if not known:
                    found, named_reserved = _check_headers(data, p, record_end, n_headers, i, allowed_header)
                    if named_reserved:
                        reserved = True
                    elif shape is None and found is not None:
                        shape = (n_headers, record_end - p, found)
            elif p != record_end:
                raise InvalidBatch(f"record {i} of the batch has {record_end - p} bytes its fields do not account for")
            if size > largest:
                largest = size
            if length > largest_record:
                largest_record = length
            append(pos)
            pos = record_end
    except (struct.error, IndexError) as exc:
        raise InvalidBatch(f"record {i} of the batch is malformed: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidBatch(f"record {i} of the batch has a header name that is not UTF-8 ({exc.reason})") from None
    if pos != end:
        raise InvalidBatch(f"{end - pos} bytes follow the batch's {count} records")
    return RecordsInfo(positions, largest, largest_record + 4, reserved, any_headers, later_headers)


def header_values(data: bytes | memoryview, positions: list[int], name: bytes) -> list[bytes | None]:
    """The value of header ``name`` of each record starting at ``positions`` of checked records (None where a
    record has no such header)."""
    unpack = RECORD_HEADER.unpack_from
    unpack_name = _HEADER_NAME.unpack_from
    unpack_value = _HEADER_VALUE.unpack_from
    out: list[bytes | None] = []
    for pos in positions:
        _length, _delta, _ts, key_len, value_len, n_headers = unpack(data, pos)
        found = None
        p = pos + RECORD_OVERHEAD + value_len + (key_len if key_len > 0 else 0)
        for _ in range(n_headers):
            (name_len,) = unpack_name(data, p)
            name_end = p + 2 + name_len
            (size,) = unpack_value(data, name_end)
            if data[p + 2 : name_end] == name:
                found = bytes(data[name_end + 4 : name_end + 4 + size])
                break
            p = name_end + 4 + size
        out.append(found)
    return out


def _same_shape(data: bytes, p: int, parts: tuple[tuple[int, bytes], ...]) -> bool:
    for at, expected in parts:
        start = p + at
        if data[start : start + len(expected)] != expected:
            return False
    return True


def _check_headers(
    data: bytes, p: int, record_end: int, n_headers: int, i: int, allowed_header: tuple[bytes, bytes] | None
) -> tuple[tuple[tuple[int, bytes], ...] | None, bool]:
    """Walk record ``i``'s headers (at ``p``): their shape (None when a name is reserved) and whether a
    reserved name other than ``allowed_header`` is among them."""
    start = p
    parts: list[tuple[int, bytes]] = []
    reserved = named = False
    for _ in range(n_headers):
        (name_len,) = _HEADER_NAME.unpack_from(data, p)
        name_at = p + 2
        head = p
        p += 2 + name_len
        if not data[name_at:p].isascii():
            str(data[name_at:p], "utf-8")  # header names are text: UnicodeDecodeError, refused by the caller
        (size,) = _HEADER_VALUE.unpack_from(data, p)
        if size < 0:
            raise InvalidBatch(f"record {i} of the batch has a header of length {size}")
        parts.append((head - start, data[head : p + 4]))
        p += 4 + size
        if name_len and data[name_at] == 0 and data[name_at : name_at + name_len] not in _PUBLISHER_NAMES:
            named = True
            if not reserved:
                reserved = (
                    allowed_header is None
                    or data[name_at : name_at + name_len] != allowed_header[0]
                    or data[p - size : p] != allowed_header[1]
                )
    if p != record_end:
        raise InvalidBatch(f"record {i} of the batch has {record_end - p} bytes its fields do not account for")
    return (None if named else tuple(parts)), reserved


def seal_records(
    base_offset: int,
    leader_epoch: int,
    data: bytes,
    count: int,
    timestamp: int,
    max_record_bytes: int = 2**31 - 1,
    info: RecordsInfo | None = None,
    attributes: int = 0,
) -> bytes:
    """A batch of records encoded elsewhere (a batched publish), stored as they are but for their timestamps.

    Every record gets ``timestamp``, as records appended through :func:`encode_batch` get the time they
    were written. ``info`` is :func:`check_records`'s answer if the caller already has it. Raises
    InvalidBatch for malformed records and RecordTooLarge (nothing encoded) for one over
    ``max_record_bytes``.
    """
    if info is None:
        info = check_records(data, count)
    if info.largest_record > max_record_bytes:
        raise RecordTooLarge(info.largest_record, max_record_bytes)
    buf = bytearray(data)
    stamp = _TIMESTAMP.pack_into
    for pos in info.positions:
        stamp(buf, pos + 8, timestamp)
    return _seal(base_offset, leader_epoch, count - 1, timestamp, timestamp, count, bytes(buf), attributes)


_TIMESTAMP = struct.Struct(">q")


def encode_empty_batch(base_offset: int, last_offset_delta: int, leader_epoch: int) -> bytes:
    """A batch with no records that still covers ``[base, base + last_offset_delta]``.

    Compaction and truncation use it so that offsets stay assigned (and the
    log end offset survives a restart) when every record of a range is gone.
    """
    return _seal(base_offset, leader_epoch, last_offset_delta, -1, -1, 0, b"")


def encode_headers(headers: Mapping[str, bytes]) -> bytes:
    """Headers as a record stores them (per header: uint16 name length, name, int32 value length, value)."""
    parts: list[bytes] = []
    names = _ENCODED_NAMES
    pack_value = _HEADER_VALUE.pack
    for name, value in headers.items():
        prefix = names.get(name)
        if prefix is None:
            raw = name.encode()
            prefix = _HEADER_NAME.pack(len(raw)) + raw
            if len(names) < 1024:  # header names repeat from record to record
                names[name] = prefix
        parts += (prefix, pack_value(len(value)), value)
    return b"".join(parts)


#: Encoded header names (length prefix and UTF-8), by name.
_ENCODED_NAMES: dict[str, bytes] = {}


def _seal(
    base_offset: int,
    leader_epoch: int,
    last_offset_delta: int,
    first_ts: int,
    max_ts: int,
    count: int,
    records: bytes,
    attributes: int = 0,
) -> bytes:
    """Prefix encoded records with a batch header and its CRC."""
    tail = BATCH_TAIL.pack(attributes, last_offset_delta, first_ts, max_ts, count) + records
    crc = crc32c(tail)
    length = BATCH_HEADER_SIZE - LOG_OVERHEAD + len(records)
    return BATCH_HEAD.pack(base_offset, length, leader_epoch, MAGIC, crc) + tail


def parse_batch_header(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """Parse the header at ``position`` (:func:`liftlog.recordformat.read_batch_header`); InvalidBatch if it
    cannot be one."""
    try:
        return read_batch_header(buf, position)
    except MalformedBatch as exc:
        raise InvalidBatch(str(exc)) from None


def iter_batch_headers(
    buf: bytes | bytearray | memoryview, position: int = 0, verify: bool = False
) -> Iterator[BatchHeader]:
    """Yield the header of every whole batch in ``buf`` from ``position``.

    :func:`liftlog.recordformat.batch_headers` with storage's error: stops
    silently at a trailing partial batch (its header or body is cut off by
    the buffer's end); the caller decides whether that is a torn write or
    simply a read limit. Raises InvalidBatch for a header that cannot be
    valid or, with ``verify``, a CRC mismatch.
    """
    try:
        yield from batch_headers(buf, position, verify)
    except MalformedBatch as exc:
        raise InvalidBatch(str(exc)) from None


def decode_records(
    buf: bytes | bytearray | memoryview,
    header: BatchHeader,
    min_offset: int = 0,
    max_offset: int | None = None,
) -> list[Record]:
    """The records of one batch with ``min_offset <= offset < max_offset``; InvalidBatch if they are malformed.

    The shared walk (:func:`liftlog.recordformat.walk_records`) with a Record each.
    """
    out: list[Record] = []
    new = tuple.__new__
    append = out.append
    mv = memoryview(buf)
    try:
        for offset, ts, key_at, key_len, value_at, value_len, n_headers, end in walk_records(
            mv, header, min_offset, max_offset
        ):
            key = bytes(mv[key_at : key_at + key_len]) if key_len >= 0 else None
            value_end = value_at + value_len
            headers = decode_headers(mv, value_end, n_headers, end) if n_headers else EMPTY_HEADERS
            append(new(Record, (offset, ts, key, bytes(mv[value_at:value_end]), headers)))
    except MalformedBatch as exc:
        raise InvalidBatch(str(exc)) from None
    return out


def retain_records(
    buf: bytes | bytearray | memoryview,
    header: BatchHeader,
    keep: Sequence[int],
    last_offset_delta: int | None = None,
) -> bytes | None:
    """Re-seal a batch with only the records whose offset deltas are in ``keep``.

    Record bytes are copied unchanged, so timestamps, keys and offset deltas
    survive (compaction leaves offset gaps, it never renumbers). The base
    offset and leader epoch stay; ``last_offset_delta`` defaults to the
    original so the batch still covers the same offset range. Returns None
    when nothing is kept.
    """
    wanted = set(keep)
    if not wanted:
        return None
    mv = memoryview(buf)
    base = header.base_offset
    parts: list[bytes] = []
    first_ts: int | None = None
    max_ts = -1
    kept = 0
    try:
        for offset, ts, key_at, _k, _va, _vl, _h, end in walk_records(mv, header):
            if offset - base in wanted:
                parts.append(bytes(mv[key_at - RECORD_OVERHEAD : end]))
                if first_ts is None:
                    first_ts = ts
                max_ts = max(max_ts, ts)
                kept += 1
    except MalformedBatch as exc:
        raise InvalidBatch(str(exc)) from None
    if not kept or first_ts is None:
        return None
    lod = header.last_offset_delta if last_offset_delta is None else last_offset_delta
    attributes = header.attributes & ATTR_MSG_IDS  # a rebuilt duplicate window must still find its ids
    return _seal(header.base_offset, header.leader_epoch, lod, first_ts, max_ts, kept, b"".join(parts), attributes)


def record_keys(buf: bytes | bytearray | memoryview, header: BatchHeader) -> list[tuple[int, bytes | None]]:
    """(offset, key) of every record of a batch: what compaction needs."""
    mv = memoryview(buf)
    try:
        return [
            (offset, bytes(mv[key_at : key_at + key_len]) if key_len >= 0 else None)
            for offset, _ts, key_at, key_len, _va, _vl, _h, _end in walk_records(mv, header)
        ]
    except MalformedBatch as exc:
        raise InvalidBatch(str(exc)) from None
