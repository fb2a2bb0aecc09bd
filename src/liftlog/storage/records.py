"""Record batch codec: pure functions from records to bytes and back (sans-IO).

A batch is the unit of writing, CRC, replication and indexing, like Kafka's
v2 record batch. ``docs/storage-format.md`` gives the layout byte by byte;
in short (all integers big-endian)::

    batch header (47 bytes)
      0  int64   base_offset
      8  int32   length             bytes that follow this field
     12  int32   leader_epoch
     16  uint8   magic              = 1
     17  uint32  crc                CRC-32C of bytes [21, end of batch)
     21  uint16  attributes         0 (reserved for compression)
     23  int32   last_offset_delta
     27  int64   first_timestamp    ns
     35  int64   max_timestamp      ns
     43  int32   record_count
    record (26-byte fixed part, then variable data)
      0  int32   length             bytes that follow this field
      4  int32   offset_delta
      8  int64   timestamp          ns
     16  int32   key_length         -1 for a null key
     20  int32   value_length
     24  uint16  header_count
     26  key, value, then per header: uint16 name length, name (UTF-8),
         int32 value length, value

Records use fixed-width fields rather than Kafka's varints: a few bytes more
per record, but one ``struct.unpack_from`` per record instead of a Python
varint loop, which is what decides throughput in CPython.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, NamedTuple

from crc32c import crc32c

from .errors import InvalidBatch, RecordTooLarge

__all__ = [
    "ATTR_MSG_IDS",
    "BATCH_HEADER_SIZE",
    "EMPTY_HEADERS",
    "LOG_OVERHEAD",
    "MAGIC",
    "RECORD_OVERHEAD",
    "BatchHeader",
    "NewRecord",
    "PreparedRecord",
    "Record",
    "RecordsInfo",
    "batch_crc_ok",
    "batches_end",
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

MAGIC = 1
#: Reserved header names publishers may send (``liftlog.replication.duplicates.PUBLISHER_RESERVED``): a batched
#: publish's id for the whole batch, and a message id the client made up; stored, never served.
_PUBLISHER_NAMES = (b"\x00batch", b"\x00msgid")
#: Batch attribute: some record of the batch has a ``Nats-Msg-Id`` header (a message id), so a new leader
#: rebuilding its duplicate window reads this batch's records; it skips the others by their header alone.
ATTR_MSG_IDS = 0x0020
BATCH_HEADER = struct.Struct(">qiiBIHiqqi")
BATCH_HEADER_SIZE = BATCH_HEADER.size  # 47
#: Bytes needed to learn a batch's total size: base_offset and length.
LOG_OVERHEAD = 12
_CRC_START = 21
_LENGTH = struct.Struct(">qi")
RECORD_HEADER = struct.Struct(">iiqiiH")
RECORD_OVERHEAD = RECORD_HEADER.size  # 26
_HEADER_NAME = struct.Struct(">H")
_HEADER_VALUE = struct.Struct(">i")

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


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed header of one batch, plus where it sits in its buffer."""

    base_offset: int
    length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    record_count: int
    position: int = 0

    @property
    def size(self) -> int:
        """Total bytes of the batch, header included."""
        return self.length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1


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
    tail = struct.pack(">Hiqqi", attributes, last_offset_delta, first_ts, max_ts, count) + records
    crc = crc32c(tail)
    length = BATCH_HEADER_SIZE - LOG_OVERHEAD + len(records)
    return struct.pack(">qiiBI", base_offset, length, leader_epoch, MAGIC, crc) + tail


def parse_batch_header(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """Parse the header at ``position``; raises InvalidBatch if it cannot be one."""
    if len(buf) - position < BATCH_HEADER_SIZE:
        raise InvalidBatch(f"{len(buf) - position} bytes at position {position} are too few for a batch header")
    base, length, epoch, magic, crc, attributes, last_delta, first_ts, max_ts, count = BATCH_HEADER.unpack_from(
        buf, position
    )
    header = BatchHeader(base, length, epoch, magic, crc, attributes, last_delta, first_ts, max_ts, count, position)
    _check_header(header)
    return header


def _check_header(h: BatchHeader) -> None:
    if h.magic != MAGIC:
        raise InvalidBatch(f"batch at position {h.position} has magic {h.magic}, expected {MAGIC}")
    if h.length < BATCH_HEADER_SIZE - LOG_OVERHEAD:
        raise InvalidBatch(f"batch at position {h.position} has impossible length {h.length}")
    if h.record_count < 0 or h.last_offset_delta < h.record_count - 1 or h.base_offset < 0:
        raise InvalidBatch(
            f"batch at position {h.position} has inconsistent counts "
            f"(base offset {h.base_offset}, {h.record_count} records, "
            f"last offset delta {h.last_offset_delta})"
        )


def batch_crc_ok(buf: bytes | bytearray | memoryview, header: BatchHeader) -> bool:
    """True when the batch's stored CRC matches its bytes (buffer must hold it all)."""
    start = header.position + _CRC_START
    end = header.position + header.size
    if len(buf) < end:
        return False
    return crc32c(memoryview(buf)[start:end]) == header.crc


_BATCH_START: Final = struct.Struct(">qi")
_LAST_DELTA: Final = struct.Struct(">i")


def batches_end(batches: bytes | memoryview, offset: int, end: int) -> int:
    """The offset after the last one whole ``batches`` cover, at most ``end`` (``offset`` when they cover none).

    Where a reader of ``batches`` goes on: past offsets compaction removed too.
    """
    pos, size = 0, len(batches)
    last = offset
    while pos + 27 <= size:
        base, length = _BATCH_START.unpack_from(batches, pos)
        (delta,) = _LAST_DELTA.unpack_from(batches, pos + 23)
        last = max(last, base + delta + 1)
        pos += 12 + length
    return min(last, end)


def iter_batch_headers(
    buf: bytes | bytearray | memoryview, position: int = 0, verify: bool = False
) -> Iterator[BatchHeader]:
    """Yield the header of every whole batch in ``buf`` from ``position``.

    Stops silently at a trailing partial batch (its header or body is cut
    off by the buffer's end); the caller decides whether that is a torn
    write or simply a read limit. Raises InvalidBatch for a header that
    cannot be valid or, with ``verify``, a CRC mismatch.
    """
    end = len(buf)
    while end - position >= BATCH_HEADER_SIZE:
        header = parse_batch_header(buf, position)
        if position + header.size > end:
            return
        if verify and not batch_crc_ok(buf, header):
            raise InvalidBatch(f"batch at position {position} (base offset {header.base_offset}) fails its CRC")
        yield header
        position += header.size


def decode_records(
    buf: bytes | bytearray | memoryview,
    header: BatchHeader,
    min_offset: int = 0,
    max_offset: int | None = None,
) -> list[Record]:
    """The records of one batch with ``min_offset <= offset < max_offset``; InvalidBatch if they are malformed."""
    out: list[Record] = []
    pos = header.position + BATCH_HEADER_SIZE
    end = header.position + header.size
    base = header.base_offset
    limit = header.next_offset if max_offset is None else max_offset
    unpack = RECORD_HEADER.unpack_from
    new = tuple.__new__
    append = out.append
    mv = memoryview(buf)
    try:
        for _ in range(header.record_count):
            length, delta, ts, key_len, value_len, n_headers = unpack(mv, pos)
            record_end = pos + 4 + length
            if length < RECORD_OVERHEAD - 4 or record_end > end:  # else a record could loop or run on
                raise InvalidBatch(f"batch at base offset {base} has a record of impossible length {length}")
            offset = base + delta
            if offset >= limit:
                break
            if offset >= min_offset:
                p = pos + RECORD_OVERHEAD
                if key_len >= 0:
                    key: bytes | None = bytes(mv[p : p + key_len])
                    p += key_len
                else:
                    key = None
                if value_len < 0 or p + value_len > record_end:
                    raise InvalidBatch(f"batch at base offset {base} has a record that runs past its length")
                value = bytes(mv[p : p + value_len])
                headers = _decode_headers(mv, p + value_len, n_headers, record_end) if n_headers else EMPTY_HEADERS
                append(new(Record, (offset, ts, key, value, headers)))
            pos = record_end
    except struct.error as exc:
        raise InvalidBatch(f"batch at base offset {base} has a record that runs past its end") from exc
    except UnicodeDecodeError as exc:
        raise InvalidBatch(f"batch at base offset {base} has a header name that is not UTF-8 ({exc.reason})") from None
    if pos > end:
        raise InvalidBatch(f"batch at base offset {base} has records that run past its end")
    return out


def _decode_headers(mv: memoryview, pos: int, count: int, end: int) -> dict[str, bytes]:
    """A record's headers, which end by ``end`` (InvalidBatch otherwise)."""
    headers: dict[str, bytes] = {}
    for _ in range(count):
        (name_len,) = _HEADER_NAME.unpack_from(mv, pos)
        pos += 2
        name = str(mv[pos : pos + name_len], "utf-8")
        pos += name_len
        (value_len,) = _HEADER_VALUE.unpack_from(mv, pos)
        pos += 4
        if value_len < 0 or pos + value_len > end:
            raise InvalidBatch(f"a record header of length {value_len} runs past its record")
        headers[name] = bytes(mv[pos : pos + value_len])
        pos += value_len
    return headers


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
    pos = header.position + BATCH_HEADER_SIZE
    parts: list[bytes] = []
    first_ts: int | None = None
    max_ts = -1
    kept = 0
    unpack = RECORD_HEADER.unpack_from
    for _ in range(header.record_count):
        length, delta, ts, _k, _v, _h = unpack(mv, pos)
        if delta in wanted:
            parts.append(bytes(mv[pos : pos + 4 + length]))
            if first_ts is None:
                first_ts = ts
            max_ts = max(max_ts, ts)
            kept += 1
        pos += 4 + length
    if not kept or first_ts is None:
        return None
    lod = header.last_offset_delta if last_offset_delta is None else last_offset_delta
    attributes = header.attributes & ATTR_MSG_IDS  # a rebuilt duplicate window must still find its ids
    return _seal(header.base_offset, header.leader_epoch, lod, first_ts, max_ts, kept, b"".join(parts), attributes)


def record_keys(buf: bytes | bytearray | memoryview, header: BatchHeader) -> list[tuple[int, bytes | None]]:
    """(offset, key) of every record of a batch: what compaction needs."""
    mv = memoryview(buf)
    pos = header.position + BATCH_HEADER_SIZE
    out: list[tuple[int, bytes | None]] = []
    unpack = RECORD_HEADER.unpack_from
    base = header.base_offset
    for _ in range(header.record_count):
        length, delta, _ts, key_len, _v, _h = unpack(mv, pos)
        key = bytes(mv[pos + RECORD_OVERHEAD : pos + RECORD_OVERHEAD + key_len]) if key_len >= 0 else None
        out.append((base + delta, key))
        pos += 4 + length
    return out
