"""Fetched record batches, decoded into columns (sans-IO).

``liftlog.Batches/Fetch`` returns a partition's committed record batches as
they are stored (``liftlog.recordformat``, ``docs/storage-format.md``), so a
reader pays neither a protobuf message nor a Python object per record on the
way: this module walks the records with one ``struct`` unpack each and
appends their parts to column lists, which the Spark source hands to Arrow
as they are. Every batch's header is held to the format's rules
(``liftlog.recordformat``) and its CRC checked here, so what the client gets
is what the leader wrote. The per-record loop is ``recordformat.walk_records``'s
walk and checks inlined, since a generator step per record would cost a fetch
5 to 10%; ``tests/recordformat/test_record_readers.py`` holds the two to the
same records.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from crc32c import crc32c

from liftlog.api.stored import (
    H_ACK_INBOX,
    H_ACK_POLICY,
    H_CORRELATION_ID,
    H_FIELDS,
    H_REPLY,
    H_SUBJECT,
    StoredFields,
    decode_fields,
    stored_subject,
)
from liftlog.recordformat import (
    ATTR_MSG_IDS,
    BATCH_HEADER_SIZE,
    CRC_START,
    HEADER_NAME,
    HEADER_VALUE,
    LOG_OVERHEAD,
    MIN_RECORD_LENGTH,
    RECORD_HEADER,
    RECORD_OVERHEAD,
    BatchHeader,
    MalformedBatch,
    read_batch_header,
)

from .errors import CorruptDataError
from .types import Message, message

__all__ = ["Columns", "Fetched", "FetchedBatches", "checked_batches", "decode_batches"]

_FIELDS = H_FIELDS.encode()
#: The name of the \x00fields header as stored: its uint16 length, then the name.
FIELDS_NAME = HEADER_NAME.pack(len(_FIELDS)) + _FIELDS
#: Where a record's only header's value length and value start, from where its headers do.
_FIELDS_NAME_SIZE = len(FIELDS_NAME)
_FIELDS_VALUE_AT = len(FIELDS_NAME) + HEADER_VALUE.size
_SUBJECT = H_SUBJECT.encode()
_OLD_FIELDS = {
    H_SUBJECT.encode(): 0,
    H_REPLY.encode(): 1,
    H_ACK_INBOX.encode(): 2,
    H_CORRELATION_ID.encode(): 3,
    H_ACK_POLICY.encode(): 4,
}


@dataclass(slots=True)
class Columns:
    """Records of one partition, a list per field, in offset order.

    ``subjects`` holds each record's NATS subject (the partition's unless the
    stream is on a wildcard). ``headers`` (user headers) and ``fields`` (reply,
    ack inbox, ...) are filled only when asked for, else left empty.
    """

    stream: str = ""
    partition: int = 0
    offsets: list[int] = field(default_factory=list)
    timestamps: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)
    subjects: list[str] = field(default_factory=list)
    headers: list[dict[str, bytes]] = field(default_factory=list)
    fields: list[StoredFields] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)

    def messages(self) -> list[Message]:
        """The records as :class:`Message` objects (``headers`` and ``fields`` must have been decoded)."""
        n = len(self.offsets)
        if len(self.headers) != n or len(self.fields) != n:
            raise ValueError("messages() needs columns decoded with headers=True and fields=True")
        stream, partition = self.stream, self.partition
        return [
            message(
                offset,
                key,
                value,
                ts,
                stream,
                partition,
                subject,
                f.reply,
                hdrs,
                f.ack_inbox,
                f.correlation_id,
                f.ack_policy,
            )
            for offset, key, value, ts, subject, hdrs, f in zip(
                self.offsets,
                self.keys,
                self.values,
                self.timestamps,
                self.subjects,
                self.headers,
                self.fields,
                strict=True,
            )
        ]


@dataclass(frozen=True, slots=True)
class FetchedBatches:
    """One ``liftlog.Batches/Fetch`` answer as it came: stored record batches, not yet checked or decoded.

    Decode ``batches`` with :func:`decode_batches` (offsets ``start`` to ``limit``);
    readers that decode batch-wise in their own way (the Spark source, into Arrow)
    take the bytes themselves.
    """

    batches: bytes
    #: The first offset asked for and the end of the range asked for (at most the answer's next offset).
    start: int
    limit: int
    #: The partition's NATS subject: the subject of every record that stores none.
    subject: str
    #: The partition's last committed offset when it answered (-1 when none).
    high_watermark: int
    #: The first offset retention kept.
    log_start_offset: int
    #: Where the next fetch starts.
    next_offset: int


@dataclass(frozen=True, slots=True)
class Fetched:
    """One ``liftlog.Batches/Fetch`` answer, decoded."""

    columns: Columns
    #: The partition's last committed offset when it answered (-1 when none).
    high_watermark: int
    #: The first offset retention kept.
    log_start_offset: int
    #: Where the next fetch starts.
    next_offset: int


def decode_batches(
    data: bytes,
    start: int,
    limit: int,
    partition_subject: str,
    *,
    out: Columns | None = None,
    headers: bool = False,
    fields: bool = False,
) -> tuple[Columns, int]:
    """Append the records of ``data`` with offsets in ``[start, limit)`` to ``out`` (a new Columns by default).

    ``data`` is whole batches. Returns the columns and the offset after the
    last one ``data`` covers (at most ``limit``): where the next fetch
    starts, also across offsets compaction removed. Raises CorruptDataError
    for bytes that are not whole, intact batches.
    """
    cols = Columns() if out is None else out
    next_offset = start
    for header in checked_batches(data, limit):
        if header.last_offset >= start and header.record_count:
            _decode_records(data, header, start, limit, partition_subject, cols, headers, fields)
        next_offset = max(next_offset, min(header.next_offset, limit))
    return cols, next_offset


def checked_batches(data: bytes, limit: int) -> Iterator[BatchHeader]:
    """The batches of fetched ``data`` that begin before ``limit``, each checked (layout, CRC, attributes).

    Each header is parsed and held to the format's rules by
    :func:`liftlog.recordformat.read_batch_header`; ``data`` must be whole
    batches. Raises CorruptDataError for bytes that are not whole, intact
    batches of records.
    """
    pos, end = 0, len(data)
    view = memoryview(data)
    while pos < end:
        try:
            header = read_batch_header(data, pos)
        except MalformedBatch as exc:
            raise CorruptDataError(f"fetched data holds no valid batch at byte {pos} of {end}: {exc}") from None
        base, length, _epoch, _magic, crc, attrs, _last, _first, _max, _count, _at = header
        batch_end = pos + LOG_OVERHEAD + length
        if batch_end > end:
            raise CorruptDataError(f"fetched data ends inside the batch at byte {pos} of {end} (offset {base})")
        if crc32c(view[pos + CRC_START : batch_end]) != crc:
            raise CorruptDataError(f"the batch at offset {base} fails its CRC check")
        if base >= limit:
            return
        if attrs & ~ATTR_MSG_IDS:  # servers decrypt before they answer: these bytes are not records
            raise CorruptDataError(
                f"the batch at offset {base} has attributes {attrs:#x} (encrypted?), which no read returns"
            )
        yield header
        pos = batch_end


def _decode_records(
    data: bytes,
    header: BatchHeader,
    start: int,
    limit: int,
    partition_subject: str,
    cols: Columns,
    want_headers: bool,
    want_fields: bool,
) -> None:
    """``liftlog.recordformat.walk_records`` inlined (a generator step per record costs a fetch 5 to 10%)."""
    unpack, unpack_i32 = RECORD_HEADER.unpack_from, HEADER_VALUE.unpack_from
    offsets, stamps, keys, values, subjects = cols.offsets, cols.timestamps, cols.keys, cols.values, cols.subjects
    base, pos, batch_end = header.base_offset, header.position + BATCH_HEADER_SIZE, header.position + header.size
    try:
        for _ in range(header.record_count):
            length, delta, ts, key_len, value_len, n_headers = unpack(data, pos)
            record_end = pos + 4 + length
            if length < MIN_RECORD_LENGTH or record_end > batch_end:  # else a record could loop or run on
                raise CorruptDataError(f"a record of the batch at offset {base} has an impossible length {length}")
            offset = base + delta
            if offset >= limit:
                return
            if offset < start:
                pos = record_end
                continue
            p = pos + RECORD_OVERHEAD
            if key_len >= 0:
                keys.append(data[p : p + key_len])
                p += key_len
            else:
                keys.append(None)
            if value_len < 0 or p + value_len > record_end:
                raise CorruptDataError(f"the record at offset {offset} runs past its length")
            values.append(data[p : p + value_len])
            p += value_len
            offsets.append(offset)
            stamps.append(ts)
            subject = partition_subject
            if n_headers == 1 and data[p : p + _FIELDS_NAME_SIZE] == FIELDS_NAME:
                # The usual record: no user headers, only the stored fields (the subject first, if stored).
                (size,) = unpack_i32(data, p + _FIELDS_NAME_SIZE)
                p += _FIELDS_VALUE_AT
                if size < 0 or p + size > record_end:
                    raise CorruptDataError(f"the record at offset {offset} runs past its length")
                if want_fields:
                    only = decode_fields(data[p : p + size])
                    subject = only.subject or subject
                    cols.fields.append(only)
                elif size and data[p] == 0x3A:
                    subject = stored_subject(data[p : p + size])
                if want_headers:
                    cols.headers.append({})
            elif n_headers:
                user: dict[str, bytes] = {}
                found: list[object] | None = None
                stored: StoredFields | None = None
                for _ in range(n_headers):
                    name_len = (data[p] << 8) | data[p + 1]
                    name = data[p + 2 : p + 2 + name_len]
                    p += 2 + name_len
                    (size,) = unpack_i32(data, p)
                    value = data[p + 4 : p + 4 + size]
                    p += 4 + size
                    if size < 0 or p > record_end:
                        raise CorruptDataError(f"the record at offset {offset} runs past its length")
                    if name == _FIELDS:
                        if want_fields:
                            stored = decode_fields(value)
                            subject = stored.subject or subject
                        else:
                            subject = stored_subject(value) or subject
                    elif name[:1] != b"\x00":
                        if want_headers:
                            user[name.decode()] = value
                    elif name in _OLD_FIELDS:  # records written before the \x00fields header
                        if found is None:
                            found = ["", "", "", "", 0]
                        slot = _OLD_FIELDS[name]
                        found[slot] = (value[0] if value else 0) if slot == 4 else value.decode()
                        if name == _SUBJECT:
                            subject = value.decode()
                if want_headers:
                    cols.headers.append(user)
                if want_fields:
                    if stored is None:
                        stored = StoredFields(*found) if found is not None else _NO_FIELDS  # type: ignore[arg-type]
                    cols.fields.append(stored)
            else:
                if want_headers:
                    cols.headers.append({})
                if want_fields:
                    cols.fields.append(_NO_FIELDS)
            subjects.append(subject)
            pos = record_end
    except (struct.error, IndexError, ValueError) as exc:
        raise CorruptDataError(f"a record of the batch at offset {base} is malformed: {exc}") from exc
    if pos > batch_end:
        raise CorruptDataError(f"the records of the batch at offset {base} run past its end")


_NO_FIELDS = StoredFields()
