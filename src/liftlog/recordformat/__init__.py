"""The record batch format, liftlog's wire and disk format, and the one walk of it every reader shares.

``layout.py`` holds the layout (offsets, sizes, magic, attributes, the ``struct``
formats and :class:`BatchHeader`); ``walk.py`` the reading: batch headers,
CRCs, and the records of a batch. Below every package that reads batches
(storage, api, client, spark, server); imports nothing of liftlog. The
encoders stay with what writes batches (``liftlog.storage.records``).
"""

from .layout import (
    ATTR_MSG_IDS,
    BATCH_HEAD,
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    BATCH_TAIL,
    CRC_START,
    HEADER_NAME,
    HEADER_VALUE,
    LAST_OFFSET_DELTA_AT,
    LOG_OVERHEAD,
    MAGIC,
    MIN_RECORD_LENGTH,
    RECORD_FIELDS,
    RECORD_HEADER,
    RECORD_OVERHEAD,
    BatchHeader,
    MalformedBatch,
)
from .walk import (
    RecordSpans,
    batch_crc_ok,
    batch_headers,
    batches_end,
    decode_headers,
    read_batch_header,
    record_starts,
    walk_records,
)

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
    "RecordSpans",
    "batch_crc_ok",
    "batch_headers",
    "batches_end",
    "decode_headers",
    "read_batch_header",
    "record_starts",
    "walk_records",
]
