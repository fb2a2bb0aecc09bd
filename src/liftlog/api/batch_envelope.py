"""The NATS payload of a batched publish (``liftlog.Batches/Publish``): liftlog's own framing (sans-IO).

Many messages travel as one NATS message on the partition's subject, so the
subject stays the source of truth: every stream on it stores them. Layout::

    offset  size  field
    0       4     magic      B9 0E 4C 4C  (not Liftbridge's B9 0E 43 B4)
    4       1     version    1
    5       3     reserved   0
    8       4     CRC-32C (Castagnoli) of the payload, big-endian
    12      ...   payload    a protobuf RecordBatchEnvelope (proto/batches.proto)

A Liftbridge server, or any other NATS subscriber, sees one opaque message:
Liftbridge stores it as a plain value. :func:`decode_record_batch` returns
None for anything that is not a valid batch envelope; the server then stores
the payload as a plain value too.
"""

from __future__ import annotations

import struct
from typing import Final

import crc32c
from google.protobuf.message import DecodeError

from liftlog.api._gen.batches_pb2 import RecordBatchEnvelope

__all__ = ["BATCH_MAGIC", "decode_record_batch", "encode_record_batch"]

BATCH_MAGIC: Final = b"\xb9\x0e\x4c\x4c"
_VERSION: Final = 1
_HEADER: Final = struct.Struct(">4sB3xI")


def encode_record_batch(envelope: RecordBatchEnvelope) -> bytes:
    payload = envelope.SerializeToString()
    return _HEADER.pack(BATCH_MAGIC, _VERSION, crc32c.crc32c(payload)) + payload


def decode_record_batch(data: bytes | memoryview) -> RecordBatchEnvelope | None:
    """The envelope in ``data``, or None when it is not a valid batch envelope (bad magic, version, CRC, payload)."""
    if len(data) < _HEADER.size or data[:4] != BATCH_MAGIC:
        return None
    _, version, crc = _HEADER.unpack_from(data)
    payload = memoryview(data)[_HEADER.size :]
    if version != _VERSION or crc32c.crc32c(payload) != crc:
        return None
    try:
        return RecordBatchEnvelope.FromString(bytes(payload))
    except (DecodeError, UnicodeDecodeError):
        return None
