"""Walking record batches (sans-IO): the one reading of the layout every reader shares.

Two levels, as batches are read:

- Batches: :func:`read_batch_header` parses one header and holds it to the
  format's rules, :func:`batch_headers` walks whole batches, :func:`batch_crc_ok`
  checks one's CRC and :func:`batches_end` finds where a reader goes on. Per
  batch, so every reader uses them: storage (``liftlog.storage.records``,
  with its ``InvalidBatch``), the client's fetch decoder and the Spark source
  (``liftlog.client.batches.checked_batches``) and, through storage, the
  server's Subscribe encoder.
- Records: :func:`walk_records` yields each record's fields and where its key,
  value and headers sit, checked against its batch, with no object made per
  record but the one tuple; :func:`decode_headers` reads one record's headers;
  :func:`record_starts` only finds where records start (what a numpy reader
  gathers from). Storage's ``decode_records`` is built on ``walk_records`` and
  the Spark source on ``record_starts``. The client's ``_decode_records`` and
  the server's ``encode_messages`` inline the same walk in their own loops,
  since a generator step costs them 5 to 10%; ``walk_records`` is the
  reference ``tests/recordformat/test_record_readers.py`` holds every reader
  to, on the same bytes.

Everything here raises :class:`MalformedBatch`, which each layer turns into
its own error.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterator
from typing import Final

from crc32c import crc32c

from .layout import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    CRC_START,
    HEADER_NAME,
    HEADER_VALUE,
    LAST_OFFSET_DELTA_AT,
    LOG_OVERHEAD,
    MAGIC,
    MIN_RECORD_LENGTH,
    RECORD_HEADER,
    RECORD_OVERHEAD,
    BatchHeader,
    MalformedBatch,
)

__all__ = [
    "RecordSpans",
    "batch_crc_ok",
    "batch_headers",
    "batches_end",
    "decode_headers",
    "read_batch_header",
    "record_starts",
    "walk_records",
]

Buffer = bytes | bytearray | memoryview

#: One record as :func:`walk_records` yields it: (offset, timestamp, where its key starts, key length (-1 for
#: a null key), where its value starts, value length, header count, where it ends). Its headers fill the bytes
#: from the value's end to the record's.
RecordSpans = tuple[int, int, int, int, int, int, int, int]


_new = tuple.__new__
# Methods of imported objects, bound once: CPython 3.11 compiles ``IMPORTED.method(...)`` to make a bound
# method per call (it treats the name as a module's), which the per-header loop would pay each time.
_unpack_header = BATCH_HEADER.unpack_from
_unpack_name = HEADER_NAME.unpack_from
_unpack_value = HEADER_VALUE.unpack_from


def read_batch_header(buf: Buffer, position: int = 0) -> BatchHeader:
    """The header at ``position``, held to the format's rules; MalformedBatch if it cannot be one.

    Reads the header alone: whether the buffer holds the rest of the batch is
    the caller's question (``position + header.size``).
    """
    if len(buf) - position < BATCH_HEADER_SIZE:
        raise MalformedBatch(f"{len(buf) - position} bytes at position {position} are too few for a batch header")
    base, length, epoch, magic, crc, attrs, last_delta, first_ts, max_ts, count = _unpack_header(buf, position)
    if magic != MAGIC or length < _MIN_BATCH_LENGTH or count < 0 or last_delta < count - 1 or base < 0:
        if magic != MAGIC:
            raise MalformedBatch(f"batch at position {position} has magic {magic}, expected {MAGIC}")
        if length < _MIN_BATCH_LENGTH:
            raise MalformedBatch(f"batch at position {position} has impossible length {length}")
        raise MalformedBatch(
            f"batch at position {position} has inconsistent counts "
            f"(base offset {base}, {count} records, last offset delta {last_delta})"
        )
    return _new(BatchHeader, (base, length, epoch, magic, crc, attrs, last_delta, first_ts, max_ts, count, position))


_MIN_BATCH_LENGTH: Final = BATCH_HEADER_SIZE - LOG_OVERHEAD


def batch_crc_ok(buf: Buffer, header: BatchHeader) -> bool:
    """True when the batch's stored CRC matches its bytes (buffer must hold it all)."""
    start = header.position
    end = start + LOG_OVERHEAD + header.length
    if len(buf) < end:
        return False
    return crc32c(memoryview(buf)[start + CRC_START : end]) == header.crc


def batch_headers(buf: Buffer, position: int = 0, verify: bool = False) -> Iterator[BatchHeader]:
    """Yield the header of every whole batch in ``buf`` from ``position``.

    Stops silently at a trailing partial batch (its header or body is cut
    off by the buffer's end); the caller decides whether that is a torn
    write, a read limit or corrupt data (the next batch starts at the last
    header's ``position + size``). Raises MalformedBatch for a header that
    cannot be valid or, with ``verify``, a CRC mismatch.
    """
    end = len(buf)
    while end - position >= BATCH_HEADER_SIZE:
        header = read_batch_header(buf, position)
        size = LOG_OVERHEAD + header.length
        if position + size > end:
            return
        if verify and not batch_crc_ok(buf, header):
            raise MalformedBatch(f"batch at position {position} (base offset {header.base_offset}) fails its CRC")
        yield header
        position += size


_BATCH_START: Final = struct.Struct(">qi")
_LAST_DELTA: Final = struct.Struct(">i")


def batches_end(batches: Buffer, offset: int, end: int) -> int:
    """The offset after the last one whole ``batches`` cover, at most ``end`` (``offset`` when they cover none).

    Where a reader of ``batches`` goes on: past offsets compaction removed too.
    """
    pos, size = 0, len(batches)
    last = offset
    while pos + LAST_OFFSET_DELTA_AT + 4 <= size:
        base, length = _BATCH_START.unpack_from(batches, pos)
        (delta,) = _LAST_DELTA.unpack_from(batches, pos + LAST_OFFSET_DELTA_AT)
        last = max(last, base + delta + 1)
        pos += LOG_OVERHEAD + length
    return min(last, end)


def walk_records(buf: Buffer, header: BatchHeader, start: int = 0, limit: int | None = None) -> Iterator[RecordSpans]:
    """The records of one batch (its header parsed from ``buf``) with ``start <= offset < limit``.

    Yields :data:`RecordSpans`. Every record's length is checked against the
    batch, and its value against the record, so no walk loops or runs on;
    a key length below -1 reads as a null key. Raises MalformedBatch.
    """
    pos = header.position + BATCH_HEADER_SIZE
    end = header.position + header.size
    base = header.base_offset
    if limit is None:
        limit = header.next_offset
    unpack = RECORD_HEADER.unpack_from
    try:
        for _ in range(header.record_count):
            length, delta, ts, key_len, value_len, n_headers = unpack(buf, pos)
            record_end = pos + 4 + length
            if length < MIN_RECORD_LENGTH or record_end > end:
                raise MalformedBatch(f"batch at base offset {base} has a record of impossible length {length}")
            offset = base + delta
            if offset >= limit:
                return
            if offset >= start:
                key_at = pos + RECORD_OVERHEAD
                value_at = key_at + key_len if key_len > 0 else key_at
                if value_len < 0 or value_at + value_len > record_end:
                    raise MalformedBatch(f"batch at base offset {base} has a record that runs past its length")
                yield offset, ts, key_at, key_len, value_at, value_len, n_headers, record_end
            pos = record_end
    except struct.error as exc:
        raise MalformedBatch(f"batch at base offset {base} has a record that runs past its end") from exc


def decode_headers(buf: Buffer, pos: int, count: int, end: int) -> dict[str, bytes]:
    """The ``count`` headers of a record from ``pos``, which must end by ``end``; MalformedBatch otherwise.

    ``buf`` is best a memoryview (slices of it are not copied twice).
    """
    mv = buf
    headers: dict[str, bytes] = {}
    try:
        for _ in range(count):
            (name_len,) = _unpack_name(mv, pos)
            pos += 2
            name = str(mv[pos : pos + name_len], "utf-8")
            pos += name_len
            (value_len,) = _unpack_value(mv, pos)
            pos += 4
            if value_len < 0 or pos + value_len > end:
                raise MalformedBatch(f"a record header of length {value_len} runs past its record")
            headers[name] = bytes(mv[pos : pos + value_len])
            pos += value_len
    except struct.error as exc:
        raise MalformedBatch("a record's headers run past its batch") from exc
    except UnicodeDecodeError as exc:
        raise MalformedBatch(f"a record has a header name that is not UTF-8 ({exc.reason})") from None
    return headers


_LENGTH: Final = struct.Struct(">i").unpack_from


def record_starts(buf: Buffer, pos: int, count: int) -> array[int]:
    """Where each of ``count`` records from ``pos`` starts, by their lengths alone (none checked).

    For readers that then gather the records' fields at once (numpy) and
    check every length against its batch there; a length that leads off
    the buffer raises MalformedBatch.
    """
    starts = array("q")
    add = starts.append
    length = _LENGTH
    try:
        for _ in range(count):
            add(pos)
            pos += 4 + length(buf, pos)[0]
    except struct.error as exc:
        raise MalformedBatch(f"a record length at byte {pos} leads past the data") from exc
    return starts
