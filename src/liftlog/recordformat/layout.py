"""The record batch layout: liftlog's wire format and its on-disk format, byte for byte.

A batch is the unit of writing, CRC, replication, fetching and indexing, like
Kafka's v2 record batch; the log stores it, replication ships it, ``Fetch`` and
liftlog subscriptions hand it to clients, and clients publish its records part.
``docs/storage-format.md`` gives the layout with examples; in short (all
integers big-endian)::

    batch header (47 bytes)
      0  int64   base_offset
      8  int32   length             bytes that follow this field
     12  int32   leader_epoch
     16  uint8   magic              = 1
     17  uint32  crc                CRC-32C of bytes [21, end of batch)
     21  uint16  attributes         ATTR_MSG_IDS, or storage's encryption flag
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
varint loop, which is what decides throughput in CPython. Offset deltas
rise within a batch but may leave gaps (compaction removes records, never
renumbers), and a batch may hold no record at all (it still covers
``[base_offset, base_offset + last_offset_delta]``).

Constants and types only; :mod:`liftlog.recordformat.walk` reads batches.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple

__all__ = [
    "ATTR_MSG_IDS",
    "BATCH_HEAD",
    "BATCH_HEADER",
    "BATCH_HEADER_SIZE",
    "BATCH_TAIL",
    "CRC_START",
    "HEADER_NAME",
    "HEADER_VALUE",
    "LAST_OFFSET_DELTA_AT",
    "LOG_OVERHEAD",
    "MAGIC",
    "MIN_RECORD_LENGTH",
    "RECORD_FIELDS",
    "RECORD_HEADER",
    "RECORD_OVERHEAD",
    "BatchHeader",
    "MalformedBatch",
]

MAGIC: Final = 1
#: Batch attribute: some record of the batch has a ``Nats-Msg-Id`` header (a message id), so a new leader
#: rebuilding its duplicate window reads this batch's records; it skips the others by their header alone.
ATTR_MSG_IDS: Final = 0x0020
#: The whole batch header, as :class:`BatchHeader`'s fields but ``position``.
BATCH_HEADER: Final = struct.Struct(">qiiBIHiqqi")
BATCH_HEADER_SIZE: Final = BATCH_HEADER.size  # 47
#: The header up to the CRC (base offset, length, leader epoch, magic, crc) and the CRC'd rest of it
#: (attributes, last offset delta, first and max timestamp, record count).
BATCH_HEAD: Final = struct.Struct(">qiiBI")
BATCH_TAIL: Final = struct.Struct(">Hiqqi")
#: Bytes needed to learn a batch's total size: base_offset and length.
LOG_OVERHEAD: Final = 12
#: Where the bytes the CRC covers start, and where last_offset_delta sits.
CRC_START: Final = BATCH_HEAD.size  # 21
LAST_OFFSET_DELTA_AT: Final = 23

#: A record's fixed part, field by field: (name, ``struct`` code). Readers that gather columns with numpy
#: build their dtype from it (``np.dtype([(name, ">" + code) for name, code in RECORD_FIELDS])``).
RECORD_FIELDS: Final = (
    ("length", "i"),
    ("offset_delta", "i"),
    ("timestamp", "q"),
    ("key_length", "i"),
    ("value_length", "i"),
    ("header_count", "H"),
)
RECORD_HEADER: Final = struct.Struct(">" + "".join(code for _, code in RECORD_FIELDS))
RECORD_OVERHEAD: Final = RECORD_HEADER.size  # 26
#: The smallest record length: the fixed part after the length field (no key, an empty value, no header).
MIN_RECORD_LENGTH: Final = RECORD_OVERHEAD - 4
#: A header's name length (then the name) and value length (then the value).
HEADER_NAME: Final = struct.Struct(">H")
HEADER_VALUE: Final = struct.Struct(">i")


class MalformedBatch(ValueError):
    """Bytes that are not batches of this format.

    The shared readers raise it; each layer names it in its own terms
    (storage's ``InvalidBatch``, the client's ``CorruptDataError``).
    """


class BatchHeader(NamedTuple):
    """The fixed header of one batch, plus where it sits in its buffer.

    A tuple, not a dataclass: readers make one per batch, and a tuple is made
    five times faster (a fetch of small batches makes thousands).
    """

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
