"""Cursors as Liftbridge keeps them (sans-IO): their key, their partition of ``__cursors``, their record value.

A cursor is one offset, named by (cursor id, stream, partition). Its key is
``<cursorId>,<stream>,<partition>`` and it lives in partition
``crc32(key) % <partitions of __cursors>`` (CRC-32 IEEE, unsigned, as
Liftbridge's servers and clients compute it), so every client finds the
server that leads a cursor's partition without asking. Each SetCursor adds a
record with that key and a ``liftlog.Cursor`` value (``cluster_pb2.Cursor``); the partition is compacted,
so the newest value per key is what stays.
"""

from __future__ import annotations

import zlib
from typing import Final

from liftlog.api import cluster_pb2

__all__ = [
    "CURSORS_STREAM",
    "MAX_CURSOR_ID",
    "CursorValueError",
    "cursor_key",
    "cursor_partition",
    "decode_cursor",
    "encode_cursor",
    "group_cursor_id",
]

#: The internal stream that holds every cursor (Liftbridge's name for it).
CURSORS_STREAM: Final = "__cursors"

#: The longest cursor id taken: every one is a key in the servers' memory and in __cursors.
MAX_CURSOR_ID: Final = 1024


class CursorValueError(ValueError):
    """A ``__cursors`` record value that is not a cursor."""


def cursor_key(cursor_id: str, stream: str, partition: int) -> bytes:
    return f"{cursor_id},{stream},{partition}".encode()


def cursor_partition(key: bytes, partitions: int) -> int:
    """The partition of ``__cursors`` (of ``partitions``) that holds the cursor with this key."""
    return zlib.crc32(key) % partitions


def group_cursor_id(group_id: str) -> str:
    """The cursor a consumer group checkpoints its partitions under (Liftbridge's Go client's choice)."""
    return f"__group:{group_id}"


def encode_cursor(cursor_id: str, stream: str, partition: int, offset: int) -> bytes:
    return cluster_pb2.Cursor(stream=stream, partition=partition, cursorId=cursor_id, offset=offset).SerializeToString()


def decode_cursor(data: bytes) -> cluster_pb2.Cursor:
    cursor = cluster_pb2.Cursor()
    try:
        cursor.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError, and RecursionError on hostile nesting
        raise CursorValueError(f"not a cursor: {exc}") from None
    return cursor
