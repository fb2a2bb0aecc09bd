"""Writing rows to liftlog streams from a Spark task, at least once or exactly once.

A task gets Arrow record batches with a ``value`` column and optionally
``key``, ``headers``, ``partition`` and ``stream`` (other columns are
ignored, so a DataFrame read from liftlog can be written back). Rows are
grouped by target partition and published with ``publish_many``, ack ALL,
one call per partition at a time, so each partition receives a task's rows
in order (liftlog servers take them in atomic chunks through
``liftlog.Batches/Publish``, Liftbridge servers through PublishAsync). Any
refusal or timeout fails the task.

Exactly once, for streaming writes (:class:`Txn`): Spark re-runs a failed
micro-batch task with the same input, so a task's output is the same multiset
of rows each time, though perhaps in another order (shuffles). Each message
carries the task's identity, ``<query id>/<batch id>/<task partition>``, in
header :data:`TXN_HEADER`, and a row id (a digest of the row plus its
occurrence number) in :data:`ROW_HEADER`. Before its first write to a
partition, a task reads that partition backwards from its end, collecting the
row ids of earlier attempts of the same task, until it meets a message of the
same query from an earlier batch (micro-batches run one after another, so
nothing of this batch lies before it) or the start of the log; rows already
there are skipped. Each message also carries ``<task>/<row id>`` as its
message id (``Nats-Msg-Id``): a liftlog server stores it at most once within
its duplicate window, which covers what the scan cannot see, a zombie
attempt still writing while its retry runs. The scan stays for retries that
come later than the window (a query restarted hours after a failure).
Keyless rows without a partition go to a partition chosen from their digest,
not round robin, so a re-run sends them to the same place.
The scan first waits for the partition's commits to reach its log end, so a
message an earlier attempt sent without seeing its ack is not missed. The
same check replaces the client's blind resend when a partition's leader goes
away mid-write: the task reads what got in and sends only the rest.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import functools
import hashlib
import itertools
import logging
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from liftlog.client import (
    AckPolicy,
    AckTimeoutError,
    Client,
    LiftlogError,
    NotLeaderError,
    PartitionInfo,
    PublishAsyncFailed,
    StartPosition,
    StopPosition,
    UnavailableError,
    UnimplementedError,
)
from liftlog.client.msg_ids import MSG_ID_HEADER
from liftlog.client.routing import partition_for_key
from liftlog.client.tls import TlsConfig
from liftlog.storage.records import PreparedRecord, decode_new_records, encode_headers, encode_prepared

from .blocking import BlockingClient, LiftlogSparkError

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("liftlog.spark")

__all__ = ["ROW_HEADER", "TXN_HEADER", "Txn", "WriteResult", "existing_rows", "write_batches"]

TXN_HEADER = "liftlog-spark-txn"
ROW_HEADER = "liftlog-spark-row"
_COLUMNS = ("value", "key", "headers", "partition", "stream")
#: Unacknowledged messages per partition in flight: four chunks of 1000 against a liftlog server (two left the
#: server idle between them: an AvailableNow copy ran 110-132k rows/s with 2000, 127-140k with 4000).
WINDOW = 4000
#: First backward read of the exactly-once scan; each next one is 4x longer.
SCAN_WINDOW = 1024
#: Longest wait for a partition's committed messages to reach its log end before an exactly-once scan.
SETTLE_S = 10.0
#: Exactly once: how often a partition's writes are checked and resumed after its leader went away.
REWRITES = 5
#: The first pause before such a check; it doubles, up to 2 s.
REWRITE_BACKOFF_S = 0.1


@dataclass(frozen=True, slots=True)
class Txn:
    """The identity of one streaming write task: which query, micro-batch and task partition."""

    query: str
    batch: int
    task: int

    @property
    def tag(self) -> bytes:
        return f"{self.query}/{self.batch}/{self.task}".encode()

    @staticmethod
    def parse(tag: bytes) -> tuple[str, int, int] | None:
        try:
            query, batch, task = tag.decode().rsplit("/", 2)
            return query, int(batch), int(task)
        except ValueError:
            return None


@dataclass(slots=True)
class WriteResult:
    """What a task wrote: messages per ``stream/partition`` and rows skipped as already written."""

    written: dict[str, int] = field(default_factory=dict)
    skipped: int = 0

    @property
    def total(self) -> int:
        return sum(self.written.values())


def _as_bytes(value: object, column: str, row: int) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise LiftlogSparkError(f"column {column!r} must be binary or string; row {row} has {type(value).__name__}")


def _headers(value: Any, row: int) -> dict[str, bytes]:
    """A headers cell: a list of {key, value} structs or a map (a list of (key, value) pairs in Arrow)."""
    out: dict[str, bytes] = {}
    if value is None:
        return out
    for item in value:
        k, v = (item["key"], item["value"]) if isinstance(item, dict) else item
        if not isinstance(k, str) or not k:
            raise LiftlogSparkError(f"row {row}: a header key must be a non-empty string, got {k!r}")
        if k in (TXN_HEADER, ROW_HEADER):
            raise LiftlogSparkError(f"row {row}: header {k!r} is reserved for liftlog's exactly-once writes")
        out[k] = _as_bytes(v, "headers", row) or b""
    return out


def check_columns(names: Iterable[str], default_stream: str | None) -> None:
    """Fail at the first batch (not deep in a publish) when the columns cannot make messages."""
    names = set(names)
    if "value" not in names:
        raise LiftlogSparkError(
            f"the DataFrame written to liftlog needs a 'value' column (binary or string); it has {sorted(names)}"
        )
    if default_stream is None and "stream" not in names:
        raise LiftlogSparkError("say which stream to write to: option 'stream' or a 'stream' column")


class _Router:
    """Target partition of each row: its partition column, else its key's hash, else round robin (or digest)."""

    def __init__(self, bc: BlockingClient, start: int) -> None:
        self._bc = bc
        self._counts: dict[str, int] = {}
        self._next = itertools.count(start)

    def partitions(self, stream: str) -> int:
        n = self._counts.get(stream)
        if n is None:
            n = self._counts[stream] = self._bc.run(functools.partial(_partition_count, stream=stream))
        return n

    def route(self, stream: str, partition: int | None, key: bytes | None, digest: bytes | None, row: int) -> int:
        n = self._counts.get(stream) or self.partitions(stream)
        if partition is not None:
            if not 0 <= partition < n:
                raise LiftlogSparkError(
                    f"row {row}: stream {stream!r} has no partition {partition} (it has {n}: 0 to {n - 1})"
                )
            return partition
        if key:
            return partition_for_key(key, n)
        if digest is not None:
            return int.from_bytes(digest[:4], "big") % n
        return next(self._next) % n


async def _partition_count(client: Client, stream: str) -> int:
    meta = await client.fetch_metadata(stream)
    info = meta.streams.get(stream)
    if info is None:
        raise LiftlogSparkError(f"cannot write to stream {stream!r}: no such stream")
    return len(info.partitions)


def _digest(stream: str, key: bytes | None, value: bytes, headers: dict[str, bytes], partition: int | None) -> bytes:
    """A row's identity: blake2b over its length-prefixed stream, key, value, partition and sorted headers."""
    return _row_digest(_part(stream.encode()), key, value, headers, _part(str(partition).encode()))


def _part(data: bytes) -> bytes:
    return _LENGTH(len(data)) + data


_LENGTH = struct.Struct(">Q").pack


def _row_digest(
    stream_part: bytes, key: bytes | None, value: bytes, headers: dict[str, bytes], partition_part: bytes
) -> bytes:
    """``_digest`` with the stream and partition parts encoded once per batch (one hash call per row)."""
    if key is None and not headers:  # the usual row: one join, no list
        return _blake2b(
            b"".join((stream_part, _NO_KEY, _LENGTH(len(value)), value, partition_part)), digest_size=12
        ).digest()
    key_part = b"-" if key is None else b"+" + key
    parts = [stream_part, _LENGTH(len(key_part)), key_part, _LENGTH(len(value)), value, partition_part]
    for k, v in sorted(headers.items()):
        parts.append(_LENGTH(len(k)) + k.encode() + _LENGTH(len(v)) + v)
    return _blake2b(b"".join(parts), digest_size=12).digest()


_blake2b = hashlib.blake2b
_NO_KEY = _LENGTH(1) + b"-"


def _plain_values(batch: Any, default_stream: str | None) -> tuple[str, int | None, list[bytes]] | None:
    """A batch whose rows are only values: its stream, its one partition (None: no column) and the values.

    That is a batch without keys or headers, binary or string values without
    nulls, one stream and at most one partition value: what a copy of a liftlog
    read writes. Its rows are made column-wise (:func:`_plain_groups`). Any
    other batch (or a bad one: the per-row path names the row) returns None.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    names = batch.schema.names
    n = batch.num_rows
    for name in ("key", "headers"):
        if name in names and batch.column(name).null_count != n:
            return None
    values = batch.column("value")
    if values.null_count:
        return None
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        values = values.cast(pa.binary())  # the bytes of str.encode(): the same rows, the same digests
    elif not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
        return None
    stream = default_stream
    if stream is None:
        column = batch.column("stream")
        if column.null_count or not pa.types.is_string(column.type):
            return None
        first = column[0].as_py() if n else None
        if not first or pc.any(pc.not_equal(column, first)).as_py():
            return None
        stream = first
    partition: int | None = None
    if "partition" in names:
        column = batch.column("partition")
        if column.null_count == n:
            partition = None
        elif column.null_count or not pa.types.is_integer(column.type):
            return None
        else:
            low, high = pc.min_max(column).values()
            if low != high:
                return None
            partition = low.as_py()
    return stream, partition, values.to_pylist()


def _plain_digests(stream_part: bytes, values: list[bytes], partition_part: bytes) -> list[bytes]:
    """:func:`_row_digest` of keyless, headerless rows: the common prefix hashed once, its state copied per row."""
    copy = _blake2b(stream_part + _NO_KEY, digest_size=12).copy
    out: list[bytes] = []
    append = out.append
    length = _LENGTH
    for value in values:
        h = copy()
        h.update(length(len(value)))
        h.update(value)
        h.update(partition_part)
        append(h.digest())
    return out


async def _settled(client: Client, stream: str, partition: int) -> PartitionInfo:
    """The partition's high watermark once it covers what the leader's log held when asked (waits up to 10 s).

    A message an earlier attempt sent but never saw acknowledged can still be
    committed after that attempt died; a scan of the committed messages that
    ran before would miss it, and the row would be written twice.
    """
    info = await client.fetch_partition_metadata(stream, partition)
    target = info.newest_offset
    deadline = asyncio.get_running_loop().time() + SETTLE_S
    while info.high_watermark < min(target, info.newest_offset):
        if asyncio.get_running_loop().time() > deadline:
            raise LiftlogSparkError(
                f"stream {stream!r} partition {partition}: the high watermark stays at {info.high_watermark}, "
                f"below the log end {info.newest_offset}; cannot tell which rows an earlier attempt wrote"
            )
        await asyncio.sleep(0.05)
        info = await client.fetch_partition_metadata(stream, partition)
    return info


async def existing_rows(client: Client, stream: str, partition: int, txn: Txn) -> set[bytes]:
    """Row ids already written to a partition by earlier attempts of ``txn``'s task (see the module doc)."""
    info = await _settled(client, stream, partition)
    hi = info.high_watermark + 1
    start = info.log_start_offset  # None from a Liftbridge server
    floor = 0 if start is None else start
    found: set[bytes] = set()
    window = SCAN_WINDOW
    while hi > 0:
        lo = max(floor, hi - window)
        done = lo == floor
        first: int | None = None
        sub = client.subscribe(
            stream,
            partition=partition,
            start_position=StartPosition.OFFSET,
            start_offset=lo,
            stop_position=StopPosition.STOP_OFFSET,
            stop_offset=hi - 1,
        )
        async with sub:
            async for msg in sub:
                if first is None:
                    first = msg.offset
                tag = msg.headers.get(TXN_HEADER)
                if tag is None:
                    continue
                parsed = Txn.parse(tag)
                if parsed is None or parsed[0] != txn.query:
                    continue
                if parsed[1] < txn.batch:
                    done = True  # an earlier micro-batch: this batch's messages all come after it
                elif parsed[1] == txn.batch and parsed[2] == txn.task:
                    found.add(msg.headers.get(ROW_HEADER, b""))
        if start is None and (first is None or first > lo):
            # No log start from the server: a window that begins after lo is taken for the log's start.
            # (liftlog servers report it, so compaction gaps are not mistaken for it.)
            done = True
        if done:
            break
        hi = lo
        window *= 4
    return found


def write_batches(
    servers: tuple[str, ...],
    batches: Iterator[pa.RecordBatch],
    *,
    default_stream: str | None,
    txn: Txn | None,
    task: int = 0,
    tls: TlsConfig | None = None,
) -> WriteResult:
    """Publish every row of ``batches`` with ack ALL; raises LiftlogSparkError on the first failure."""
    result = WriteResult()
    bc = BlockingClient(servers, timeout=30.0, tls=tls)
    inflight: asyncio.Task[object] | None = None  # the publish of the previous batch
    try:
        router = _Router(bc, start=task)
        seen: dict[tuple[str, int], set[bytes]] = {}  # exactly once: row ids already in each partition
        occurrences: dict[bytes, int] = {}
        occurrence = 0
        row_number = 0
        tag = txn.tag if txn is not None else b""
        encoded: dict[tuple[str, int | None], tuple[bytes, bytes]] = {}  # digest parts by (stream, partition)
        groups: dict[Place, _Group]
        txn_header = encode_headers({TXN_HEADER: tag})
        for batch in batches:
            if row_number == 0:
                check_columns(batch.schema.names, default_stream)
            plain = _plain_values(batch, default_stream)
            if plain is not None:
                groups = _plain_groups(
                    plain, bc, router, txn, txn_header, encoded, occurrences, seen, result, row_number, inflight
                )
            else:
                # Columns as lists, a record per row: no per-row tuple, message object or conversion on the way out.
                names = batch.schema.names
                values = batch.column("value").to_pylist()
                keys = batch.column("key").to_pylist() if "key" in names else None
                header_cells = batch.column("headers").to_pylist() if "headers" in names else None
                partitions = batch.column("partition").to_pylist() if "partition" in names else None
                # The 'stream' option wins over a 'stream' column (a DataFrame read from liftlog has one).
                streams = batch.column("stream").to_pylist() if default_stream is None else None
                groups = {}
                stream = default_stream
                key: bytes | None = None
                partition: int | None = None
                headers: dict[str, bytes] = {}
                user_headers = b""  # the row's own headers, encoded
                n_headers = 0
                for i, value in enumerate(values):
                    if inflight is not None and not i & 511:
                        bc.pump()  # the previous batch's publish goes on while this one's rows are made
                    row = row_number + i
                    if streams is not None:
                        stream = streams[i]
                    if not stream:
                        raise LiftlogSparkError(f"row {row} has no stream: its 'stream' column is null or empty")
                    if type(value) is not bytes:
                        value = _as_bytes(value, "value", row)
                        if value is None:
                            raise LiftlogSparkError(f"row {row} of the write to stream {stream!r} has a null value")
                    if keys is not None:
                        key = _as_bytes(keys[i], "key", row)
                    if header_cells is not None:
                        headers = _headers(header_cells[i], row)
                        user_headers = encode_headers(headers) if headers else b""
                        n_headers = len(headers)
                    if partitions is not None:
                        partition = partitions[i]
                    digest = None
                    if txn is not None:
                        parts = encoded.get((stream, partition))
                        if parts is None:
                            parts = (_part(stream.encode()), _part(str(partition).encode()))
                            encoded[stream, partition] = parts
                        digest = _row_digest(parts[0], key, value, headers, parts[1])
                        occurrence = occurrences.get(digest, 0) + 1  # a dict: a Counter's += is several times slower
                        occurrences[digest] = occurrence
                    target = router.route(stream, partition, key, digest, row)
                    group = groups.get((stream, target))
                    if group is None:
                        group = groups[stream, target] = _Group()
                    if digest is not None and txn is not None:
                        row_id = b"%s.%d" % (digest.hex().encode(), occurrence)
                        have = seen.get((stream, target))
                        if have is None:
                            have = seen[stream, target] = bc.run(
                                functools.partial(existing_rows, stream=stream, partition=target, txn=txn)
                            )
                        if row_id in have:
                            result.skipped += 1
                            continue
                        txn_part = txn_header + _ROW_NAME + _I32(len(row_id)) + row_id
                        if MSG_ID_HEADER in headers:  # the row's own id governs the server's deduplication
                            group.records.append((key, value, user_headers + txn_part, n_headers + 2))
                        else:
                            id_part = _msg_id_header(tag, row_id)
                            group.records.append((key, value, id_part + txn_part + user_headers, n_headers + 3))
                        group.row_ids.append(row_id)
                    else:
                        group.records.append((key, value, user_headers, n_headers))
            row_number += batch.num_rows
            groups = {place: group for place, group in groups.items() if group.records}
            if inflight is not None:  # one batch at a time: each partition gets the task's rows in order
                bc.wait(inflight)
                inflight = None
            if groups:
                if txn is None:
                    inflight = bc.start(functools.partial(_publish, groups=groups, resend_unacked=True))
                else:
                    inflight = bc.start(functools.partial(_publish_exactly_once, groups=groups, seen=seen, txn=txn))
                for (stream, partition), group in groups.items():
                    name = f"{stream}/{partition}"
                    result.written[name] = result.written.get(name, 0) + len(group.records)
        if inflight is not None:
            bc.wait(inflight)
            inflight = None
    finally:
        if inflight is not None:  # the rows failed: the publish under way is abandoned with the task
            inflight.cancel()
            with contextlib.suppress(BaseException):
                bc.wait(inflight)
        bc.close()
    return result


def _plain_groups(
    plain: tuple[str, int | None, list[bytes]],
    bc: BlockingClient,
    router: _Router,
    txn: Txn | None,
    txn_header: bytes,
    encoded: dict[tuple[str, int | None], tuple[bytes, bytes]],
    occurrences: dict[bytes, int],
    seen: dict[Place, set[bytes]],
    result: WriteResult,
    row_number: int,
    inflight: asyncio.Task[object] | None,
) -> dict[Place, _Group]:
    """The records of a batch :func:`_plain_values` accepted, by target partition: the rows the per-row loop
    of :func:`write_batches` would make (the same digests, row ids, targets and skips), a column at a time."""
    stream, partition, values = plain
    n = router.partitions(stream)
    if partition is not None:
        router.route(stream, partition, None, None, row_number)  # a partition the stream lacks: the row's error
    groups: dict[Place, _Group] = {}
    if txn is None:
        if partition is not None:
            groups[stream, partition] = _Group([(None, value, b"", 0) for value in values])
            return groups
        for value in values:
            target = next(router._next) % n
            group = groups.get((stream, target))
            if group is None:
                group = groups[stream, target] = _Group()
            group.records.append((None, value, b"", 0))
        return groups
    parts = encoded.get((stream, partition))
    if parts is None:
        parts = encoded[stream, partition] = (_part(stream.encode()), _part(str(partition).encode()))
    digests: list[bytes] = []
    for at in range(0, len(values), _PUMP_ROWS):
        if inflight is not None:
            bc.pump()  # the previous batch's publish goes on while this one's rows are made
        digests += _plain_digests(parts[0], values[at : at + _PUMP_ROWS], parts[1])
    if len(set(digests)) == len(digests) and occurrences.keys().isdisjoint(digests):
        occurrences.update(dict.fromkeys(digests, 1))  # the usual batch: every row new, each its first occurrence
        row_ids = [_hex(digest) + b".1" for digest in digests]
    else:
        row_ids = []
        for digest in digests:
            occurrence = occurrences.get(digest, 0) + 1
            occurrences[digest] = occurrence
            row_ids.append(b"%s.%d" % (_hex(digest), occurrence))
    places: list[Place]
    if partition is not None:
        targets: list[int] | None = None
        places = [(stream, partition)]
    else:
        targets = [int.from_bytes(digest[:4], "big") % n for digest in digests]
        places = [(stream, target) for target in sorted(set(targets))]
    for place in places:
        if place not in seen:
            seen[place] = bc.run(functools.partial(existing_rows, stream=place[0], partition=place[1], txn=txn))
    head = txn_header + _ROW_NAME
    tag = txn.tag
    if targets is None and not seen[places[0]]:  # the usual batch: one partition, nothing written yet
        group = groups[places[0]] = _Group(row_ids=row_ids)
        if all(len(row_id) == _PLAIN_ROW_ID for row_id in row_ids):
            id_head = _MSG_ID_NAME + _I32(len(tag) + 1 + _PLAIN_ROW_ID) + tag + b"/"
            head += _I32(_PLAIN_ROW_ID)
            group.records = [
                (None, value, id_head + row_id + head + row_id, 3)
                for value, row_id in zip(values, row_ids, strict=True)
            ]
        else:
            group.records = [
                (None, value, _msg_id_header(tag, row_id) + head + _I32(len(row_id)) + row_id, 3)
                for value, row_id in zip(values, row_ids, strict=True)
            ]
        return groups
    for i, (value, row_id) in enumerate(zip(values, row_ids, strict=True)):
        place = places[0] if targets is None else (stream, targets[i])
        if row_id in seen[place]:
            result.skipped += 1
            continue
        group = groups.get(place)
        if group is None:
            group = groups[place] = _Group()
        group.records.append((None, value, _msg_id_header(tag, row_id) + head + _I32(len(row_id)) + row_id, 3))
        group.row_ids.append(row_id)
    return groups


#: Rows made between two turns of the client's loop (the previous batch's publish goes on meanwhile).
_PUMP_ROWS = 512
#: A row id's length in the usual case: 24 hex digits, ".1".
_PLAIN_ROW_ID = 26
_hex = binascii.hexlify

Place = tuple[str, int]
_I32 = struct.Struct(">i").pack
#: The row id header's encoded name (its value follows: int32 length, bytes).
_ROW_NAME = encode_headers({ROW_HEADER: b""})[:-4]
#: The message id header's (Nats-Msg-Id: the server deduplicates within its window).
_MSG_ID_NAME = encode_headers({MSG_ID_HEADER: b""})[:-4]


def _msg_id_header(tag: bytes, row_id: bytes) -> bytes:
    """A row's message id header, encoded: ``<task>/<row id>``. It goes first among the row's headers: a
    leader reads a record's headers until it finds its id."""
    msg_id = tag + b"/" + row_id
    return _MSG_ID_NAME + _I32(len(msg_id)) + msg_id


@dataclass(slots=True)
class _Group:
    """One target partition's rows of an Arrow batch, ready to encode; exactly once: their row ids alongside."""

    records: list[PreparedRecord] = field(default_factory=list)
    row_ids: list[bytes] = field(default_factory=list)


async def _publish(client: Client, *, groups: dict[Place, _Group], resend_unacked: bool) -> dict[Place, LiftlogError]:
    """Publish each group to its partition, concurrently; returns the leader changes left to the caller.

    With ``resend_unacked`` the client resends what a leader change left
    unacknowledged (at least once) and every failure raises. Without it, a
    group whose leader went away mid-way is returned, for the caller to check
    the log before sending the rest.
    """
    moved: dict[Place, LiftlogError] = {}

    async def one(stream: str, partition: int, records: list[PreparedRecord]) -> None:
        try:
            try:
                await client.publish_prepared(
                    stream,
                    records,
                    partition=partition,
                    ack_policy=AckPolicy.ALL,
                    window=WINDOW,
                    resend_unacked=resend_unacked,
                )
            except UnimplementedError:  # a Liftbridge server: PublishAsync, a message per record
                await client.publish_many(
                    stream,
                    decode_new_records(encode_prepared(records), len(records)),
                    partition=partition,
                    ack_policy=AckPolicy.ALL,
                    window=WINDOW,
                    resend_unacked=resend_unacked,
                    return_acks=False,
                )
        except (NotLeaderError, UnavailableError, AckTimeoutError) as exc:
            if resend_unacked or isinstance(exc, PublishAsyncFailed):
                raise _failed(stream, partition, len(records), exc) from exc
            moved[stream, partition] = exc
        except LiftlogError as exc:
            raise _failed(stream, partition, len(records), exc) from exc

    await asyncio.gather(*(one(s, p, g.records) for (s, p), g in groups.items()))
    return moved


def _failed(stream: str, partition: int, count: int, exc: LiftlogError) -> LiftlogSparkError:
    return LiftlogSparkError(
        f"writing {count} messages to stream {stream!r} partition {partition} failed: {exc.message}"
    )


async def _publish_exactly_once(
    client: Client, *, groups: dict[Place, _Group], seen: dict[Place, set[bytes]], txn: Txn
) -> None:
    """Publish without blind resends: after a leader change, read what got in and send only the rest."""
    pending = groups
    for attempt in range(REWRITES + 1):
        moved = await _publish(client, groups=pending, resend_unacked=False)
        if not moved:
            return
        if attempt == REWRITES:
            (stream, partition), exc = next(iter(moved.items()))
            raise _failed(stream, partition, len(pending[stream, partition].records), exc)
        await asyncio.sleep(min(2.0, REWRITE_BACKOFF_S * 2**attempt))
        pending = {}
        for (stream, partition), exc in moved.items():
            log.warning("stream %r partition %d: %s; checking what was written", stream, partition, exc.message)
            have = await existing_rows(client, stream, partition, txn)
            seen[stream, partition] = have
            group = groups[stream, partition]
            rest = _Group()
            for record, row_id in zip(group.records, group.row_ids, strict=True):
                if row_id not in have:
                    rest.records.append(record)
                    rest.row_ids.append(row_id)
            if rest.records:
                pending[stream, partition] = rest
