"""Batched Subscribe: stored record batches carried in ``Subscribe``'s messages (a liftlog extension, sans-IO).

A ``Subscribe`` call costs the server a protobuf ``Message`` per record and
the client a gRPC message, a parse and an object per record. A client that
sends the request metadata ``liftlog-batches: 1`` to a liftlog server gets
the partition's stored batches instead, in the same call, with the same
start and stop positions, errors and end:

- the set-up message (the first, otherwise empty) carries the header
  ``\\x00batches``: the server agreed. Liftbridge servers ignore the metadata
  and send one message per record, so a client must look at the set-up
  message before it decodes anything;
- every later message carries whole stored batches (docs/storage-format.md)
  in ``value``, the first offset to deliver in ``offset``, the offset after
  the last one to deliver in the header ``\\x00end`` (8 bytes, big-endian)
  and the partition's subject in ``subject``. The first batch may begin
  before ``offset`` and the last may run past the end: the client skips
  those records, as it skips offsets compaction removed.

A subscription with a stop timestamp is served one message per record
(the set-up message then has no ``\\x00batches`` header): where to stop
depends on each record's timestamp.
"""

from __future__ import annotations

import struct
from typing import Final

from liftlog.api._gen.api_pb2 import Message

__all__ = ["BATCHES_HEADER", "END_HEADER", "REQUEST_KEY", "SETUP_BATCHED", "batches_message", "delivery_end"]

#: The request metadata key (and value ``1``) that asks for batches.
REQUEST_KEY: Final = "liftlog-batches"
BATCHES_HEADER: Final = "\x00batches"
END_HEADER: Final = "\x00end"
_END: Final = struct.Struct(">q")

#: The set-up message of a batched subscription.
SETUP_BATCHED: Final = Message(headers={BATCHES_HEADER: b"1"})


def batches_message(stream: str, partition: int, subject: str, batches: bytes, start: int, end: int) -> bytes:
    """The encoded ``Message`` that carries ``batches`` for the offsets ``[start, end)``."""
    return Message(
        offset=start,
        value=batches,
        stream=stream,
        partition=partition,
        subject=subject,
        headers={END_HEADER: _END.pack(end)},
    ).SerializeToString()


def delivery_end(msg: Message) -> int:
    """The offset after the last one a batches message delivers; ValueError when it names none."""
    end = msg.headers.get(END_HEADER)
    if end is None or len(end) != _END.size:
        raise ValueError(f"a batches message has no valid {END_HEADER!r} header")
    value: int = _END.unpack(end)[0]
    return value
