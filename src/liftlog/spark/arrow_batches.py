"""Fetched record batches straight into an Arrow record batch, without a Python object per record.

:func:`liftlog.client.batches.decode_batches` appends every record's parts to
Python lists, which Arrow then walks again: about a microsecond a record, most
of a Spark read task's time. Here the only per-record Python is the walk that
finds where each record starts (records have variable length, so each start
depends on the one before: ``liftlog.recordformat.record_starts``, or numpy
steps across batches); every field is then gathered with numpy from the
fetched bytes, and keys and values become Arrow binary-view arrays that point
into those bytes, cast to plain binary in one C++ copy.

It takes the records a read usually meets: no headers, or only the
``\\x00fields`` header without a stored subject (what PublishAsync and NATS
publishes with a reply leave). For anything else (user headers wanted or
present, per-record subjects of a wildcard stream) :func:`arrow_batch`
returns None and the caller decodes with ``decode_batches``. Checks are those
of ``decode_batches``: every batch's CRC, and every length within its batch.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pyarrow as pa

from liftlog.api.stored import PUBLISHER_RESERVED
from liftlog.client import CorruptDataError
from liftlog.client.batches import FIELDS_NAME, checked_batches
from liftlog.recordformat import (
    BATCH_HEADER_SIZE,
    HEADER_NAME,
    LOG_OVERHEAD,
    RECORD_FIELDS,
    RECORD_OVERHEAD,
    MalformedBatch,
    record_starts,
)

__all__ = ["arrow_batch"]

#: Batches still walking for which a numpy step beats a Python walk (measured: about 24).
_LOCKSTEP = 24
#: Records from which a batch is walked at once, in Python, while its bytes are in the cache.
_WALK_AT_ONCE = 256
_NO_POSITIONS = np.empty(0, np.int64)
#: The \x00fields header: name (2 + 7 bytes), value length (4), then the value's first byte (0x3A: a subject).
_FIELDS_HEADER = len(FIELDS_NAME) + 4
#: The reserved headers publishers send (liftlog.replication.duplicates.PUBLISHER_RESERVED) as stored: the
#: name's uint16 length, then the name. Both names have one length, so one gather compares both.
_HIDDEN_NAMES = sorted(HEADER_NAME.pack(len(name)) + name.encode() for name in PUBLISHER_RESERVED)
_HIDDEN_ARRAYS = [np.frombuffer(name, np.uint8) for name in _HIDDEN_NAMES]
assert len({len(name) for name in _HIDDEN_NAMES}) == 1
_SUBJECT_TAG = 0x3A
#: Values and keys of up to this many bytes are stored inside an Arrow view; longer ones are referenced.
_INLINE = 12
#: A record's fixed part (liftlog.recordformat.RECORD_FIELDS), big-endian.
_RECORD_HEADER = np.dtype([(name, ">" + code) for name, code in RECORD_FIELDS])


def arrow_batch(
    data: bytes, start: int, limit: int, schema: pa.Schema, stream: str, partition: int, subject: str
) -> tuple[pa.RecordBatch | None, int] | None:
    """The records of ``data`` with offsets in ``[start, limit)`` as one record batch in ``schema``.

    ``schema`` is the Spark source's without headers. Returns the batch (None
    when no record is in range) and the offset after the last one ``data``
    covers (at most ``limit``), as ``decode_batches`` does; or None when a
    record needs the per-record decoder. Raises CorruptDataError for bytes
    that are not whole, intact batches.
    """
    at, bases, counts, batch_ends, next_offset = _record_starts(data, start, limit)
    n = len(at)
    if n == 0:
        return None, next_offset
    if at.min() < 0 or at.max() > len(data) - RECORD_OVERHEAD:  # a walk a bad length led astray
        raise CorruptDataError(f"a record of the batches fetched from offset {start} has an impossible length")
    buf = np.frombuffer(data, np.uint8)
    fixed = buf[at[:, None] + np.arange(RECORD_OVERHEAD)].view(_RECORD_HEADER).reshape(n)
    length = fixed["length"].astype(np.int64)
    key_len = fixed["key_length"].astype(np.int64)
    value_len = fixed["value_length"].astype(np.int64)
    n_headers = fixed["header_count"]
    record_end = at + 4 + length
    batch_end = np.repeat(np.asarray(batch_ends, np.int64), counts)
    key_at = at + RECORD_OVERHEAD
    value_at = key_at + np.maximum(key_len, 0)
    fields_at = value_at + value_len
    # A length under 22 fails the last check (fields_at is at least 26 past the start): so does a walk looping.
    if (
        (record_end > batch_end).any()
        or (key_len < -1).any()
        or (value_len < 0).any()
        or (fields_at > record_end).any()
    ):
        raise CorruptDataError(f"a record of the batches fetched from offset {start} has an impossible length")
    if not _columnar_headers(buf, n_headers, fields_at, record_end, start):
        return None

    offsets = np.repeat(np.asarray(bases, np.int64), counts) + fixed["offset_delta"].astype(np.int64)
    keep = (offsets >= start) & (offsets < limit)
    if not keep.all():
        offsets, key_at, key_len, value_at, value_len = (
            offsets[keep],
            key_at[keep],
            key_len[keep],
            value_at[keep],
            value_len[keep],
        )
        fixed = fixed[keep]
        n = len(offsets)
        if n == 0:
            return None, next_offset
    micros = fixed["timestamp"].astype(np.int64) // 1000
    columns: list[Any] = [
        _binary(buf, data, key_at, key_len, n),
        _binary(buf, data, value_at, value_len, n),
        pa.repeat(pa.scalar(stream, pa.string()), n),
        pa.repeat(pa.scalar(subject, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.array(offsets, pa.int64()),
        pa.array(micros, pa.timestamp("us", tz="UTC")),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema), next_offset


def _columnar_headers(buf: Any, n_headers: Any, fields_at: Any, record_end: Any, start: int) -> bool:
    """Whether every record's headers leave it to the columns: none, a publisher's hidden one, or only a
    ``\\x00fields`` header with no subject in it (which keeps the partition's). ``fields_at``: where each
    record's headers start. Raises CorruptDataError for a ``\\x00fields`` value past its record."""
    if (n_headers > 1).any():
        return False
    with_fields = n_headers == 1
    if with_fields.any():
        where = fields_at[with_fields]
        ends = record_end[with_fields]
        # A publisher's hidden header (a client's own message id, a chunk's batch id) is no header to a
        # reader: those records count as having none.
        fits = where + len(_HIDDEN_NAMES[0]) <= ends
        named = buf[np.where(fits, where, 0)[:, None] + np.arange(len(_HIDDEN_NAMES[0]))]
        hidden = fits & np.logical_or.reduce([(named == name).all(axis=1) for name in _HIDDEN_ARRAYS])
        if hidden.any():
            with_fields = with_fields.copy()
            with_fields[np.flatnonzero(with_fields)[hidden]] = False
            where, ends = where[~hidden], ends[~hidden]
    if with_fields.any():
        # Only a \x00fields header, with no subject in it, keeps the partition's subject.
        if (where + _FIELDS_HEADER > ends).any():
            return False
        head = buf[where[:, None] + np.arange(_FIELDS_HEADER)]
        if not (head[:, : len(FIELDS_NAME)] == np.frombuffer(FIELDS_NAME, np.uint8)).all():
            return False
        size = head[:, len(FIELDS_NAME) :].copy().view(">i4").reshape(-1).astype(np.int64)
        if (size < 0).any() or (where + _FIELDS_HEADER + size > ends).any():
            raise CorruptDataError(f"a record of the batches fetched from offset {start} runs past its length")
        stored = size > 0
        if stored.any() and (buf[where[stored] + _FIELDS_HEADER] == _SUBJECT_TAG).any():
            return False  # a subject per record: a wildcard stream
    return True


def _record_starts(data: bytes, start: int, limit: int) -> tuple[Any, Any, Any, Any, int]:
    """Where each record of the batches in range starts, with each such batch's base offset, count and end.

    Records have variable length, so each start follows from the one before: a
    walk per batch. A long batch is walked in Python as soon as its CRC is
    checked, while its bytes are in the CPU's cache. Walks of the other
    batches do not depend on each other, so while enough of them are still
    walking one numpy step moves them all on a record (longest first: those
    still walking are a prefix), and the few left finish in Python. On 130
    batches of 100 records that is 0.06 instead of 0.16 us a record. Lengths
    are not checked on the way: :func:`arrow_batch` checks every record's
    against its batch afterwards, and a count of records its batch's bytes
    cannot hold is refused here, so no walk outlasts its bytes.
    """
    picked: list[tuple[int, int, int, int]] = []
    walked: dict[int, array[int]] = {}  # the long batches, by their place in picked
    next_offset = start
    # Headers unpacked, not read through their properties: a fetch of small batches has thousands.
    for base, length, _epoch, _magic, _crc, _attrs, last_delta, _first, _max, count, at in checked_batches(data, limit):
        if base + last_delta >= start and count > 0:
            records_at, batch_end = at + BATCH_HEADER_SIZE, at + LOG_OVERHEAD + length
            if count > (batch_end - records_at) // RECORD_OVERHEAD:
                raise CorruptDataError(f"the batch at offset {base} claims {count} records, more than its bytes hold")
            if count >= _WALK_AT_ONCE:
                walked[len(picked)] = _walk(data, records_at, count, start)
            picked.append((base, count, records_at, batch_end))
        next_offset = max(next_offset, min(base + last_delta + 1, limit))
    if not picked:
        return _NO_POSITIONS, (), (), (), next_offset
    bases, counts, records_at, batch_ends = np.array(picked, np.int64).T
    first = np.zeros(len(counts), np.int64)  # where each batch's records go in the result
    np.cumsum(counts[:-1], out=first[1:])
    positions = np.empty(int(first[-1] + counts[-1]), np.int64)
    for i, done in walked.items():
        positions[first[i] : first[i] + counts[i]] = np.frombuffer(done, np.int64)
    order = np.argsort(-counts, kind="stable")[len(walked) :]  # the long ones sort first
    left, dest, at = counts[order], first[order], records_at[order]
    descending = -left
    lengths = np.ndarray((len(data) - 3,), ">i4", buffer=data, strides=(1,))  # a length at every byte
    k = 0  # records each walking batch has taken
    walking = len(left)
    try:
        while walking >= _LOCKSTEP:
            now = at[:walking]
            positions[dest[:walking] + k] = now
            now += lengths[now]
            now += 4
            k += 1
            walking = int(np.searchsorted(descending, -k))  # batches of more than k records
    except IndexError:  # a length that led past the data
        raise CorruptDataError(
            f"a record of the batches fetched from offset {start} has an impossible length"
        ) from None
    for b in range(walking):
        rest = _walk(data, int(at[b]), int(left[b]) - k, start)
        to = int(dest[b]) + k
        positions[to : to + len(rest)] = np.frombuffer(rest, np.int64)
    return positions, bases, counts, batch_ends, next_offset


def _walk(data: bytes, p: int, count: int, start: int) -> array[int]:
    """The starts of ``count`` records from ``p`` on, in Python (the format's shared walk)."""
    try:
        return record_starts(data, p, count)
    except MalformedBatch as exc:
        raise CorruptDataError(f"a record of the batches fetched from offset {start} is malformed: {exc}") from exc


def _binary(buf: Any, data: bytes, at: Any, size: Any, n: int) -> pa.Array:
    """A binary array of the ``size`` bytes at each of ``at`` (a negative size: null), copied out of ``data``."""
    valid = size >= 0
    if not valid.any():
        return pa.nulls(n, pa.binary())
    length = size if valid.all() else np.where(valid, size, 0)
    views = np.zeros((n, 4), "<i4")
    raw = views.view(np.uint8)
    views[:, 0] = length
    long = length > _INLINE
    if long.all():  # every value referenced: its first 4 bytes, where it is
        raw[:, 4:8] = buf[at[:, None] + np.arange(4)]
        views[:, 3] = at
    else:
        # Short values are stored in the view itself, zero-padded to 12 bytes; long ones as above.
        first = buf[np.minimum(at[:, None] + np.arange(_INLINE), len(data) - 1)]
        first[np.arange(_INLINE) >= np.minimum(length, _INLINE)[:, None]] = 0
        raw[:, 4:] = first
        views[long, 2] = 0  # the one data buffer
        views[long, 3] = at[long]
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    viewed = pa.Array.from_buffers(pa.binary_view(), n, [validity, pa.py_buffer(views), pa.py_buffer(data)])
    return viewed.cast(pa.binary())
