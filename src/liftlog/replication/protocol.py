"""The server-to-server replication messages: pure encode/decode functions, no I/O.

Every message travels in a Liftbridge envelope (``liftlog.api.envelope``) whose
message type says what it is; the payloads are liftlog's own struct formats
(Liftbridge uses one protobuf request per partition), so every server of a
cluster must run liftlog. ``docs/replication-protocol.md`` explains the
exchange; this is the byte layout. All integers are big-endian and signed
(``i32``/``i64``) unless marked ``u``::

    str     u16 length, then that many bytes of UTF-8

    fetch request        envelope REPLICATION_REQUEST (2), on fetch_subject(leader server)
      0  u8   version = 2
      1  u32  session              the follower's number for this run of fetches (see below)
      5  u32  count                partitions asked for (>= 1)
      9  str  replica_id
         count times:
           i64  offset             first offset the follower wants (>= 0)
           i64  leader_epoch       the leader epoch the follower believes current (>= 0)
           i64  created            the stream's creation timestamp: which incarnation of the name (>= 0)
           i32  partition          (>= 0)
           str  stream

    fetch response       envelope REPLICATION_RESPONSE (3)
      0  u8   version = 2
      1  u32  count                partitions answered (0..the request's count)
         count times:
           u8   code               0: data follows; otherwise a FetchErrorCode
           i32  partition          (>= 0)
           str  stream
           code 0:  i64 leader_epoch (>= 0), i64 hw (-1 when nothing is committed),
                    u32 length, then that many bytes of record batches, verbatim
                    (none: the follower is caught up)
           else:    i64 leader_epoch, i64 log_start_offset (the responder's, -1 if
                    unknown), str message

    fetch error          envelope PARTITION_STATUS_RESPONSE (13), the refusal of an epoch offset request
      0  u8   version = 1
      1  u8   code                 FetchErrorCode
      2  i64  leader_epoch         the responder's current leader epoch, -1 if unknown
     10  i64  log_start_offset     the responder's first offset, -1 if unknown
     18  str  message

    epoch offset request envelope LEADER_EPOCH_OFFSET_REQUEST (6), on offset_subject(leader server)
      0  u8   version = 2
      1  i64  leader_epoch         the follower's latest epoch, the one asked about (>= 0)
      9  i64  current_epoch        the leader epoch the follower believes the responder leads in (>= 0)
     17  i64  created              the stream's creation timestamp (>= 0)
     25  i32  partition            (>= 0)
     29  str  stream

    epoch offset reply   envelope LEADER_EPOCH_OFFSET_RESPONSE (7)
      0  u8   version = 1
      1  i64  leader_epoch         largest epoch <= the requested one, -1 when none
      9  i64  end_offset           where that epoch ends, -1 when none
     17  i64  log_start_offset     the leader's first offset, -1 if unknown

    notification         envelope PARTITION_NOTIFICATION (14), sent on notify_subject()
      0  u8   version = 1
      1  u32  count                (>= 1)
      5       count times: str stream, i32 partition (>= 0)

A fetch names every partition the follower replicates from that leader server
(Kafka's fetch session, without the incremental part): one request per server
pair instead of one per partition. A response may leave out partitions (the
leader's byte budget ran out before them); the follower asks for those again at
once. ``session`` tells apart the fetches one follower has outstanding at the
same leader (one per chunk when its partitions do not fit one request): the
leader holds at most one fetch per (follower, session) and answers an earlier
one at once when a newer one arrives. The epoch offset request names the epoch
the follower believes the responder leads in, so that a deposed leader that has
not yet heard of its successor refuses it instead of answering from a log that
may have diverged. Both requests name the stream's creation timestamp: a
stream deleted and created again under the same name starts again at leader
epoch 0, and a server that has not yet heard of the deletion must not serve
the old stream's records to the new one's replicas (Kafka's topic IDs solve the
same problem).

A single :class:`PartitionNotification` and a batch share one layout (a batch of
one), so a follower decodes whatever arrives on its notify subject with
:func:`decode_notification`.

Decoders accept exactly one encoding (the envelope may carry a CRC-32C or not):
a truncated payload, trailing bytes, an unknown version or error code, an
integer outside its documented range, invalid UTF-8 or an envelope of another
type raise :class:`ProtocolError` naming the field and its offset in the
payload. Envelope problems (:class:`~liftlog.api.envelope.EnvelopeError`) are
wrapped in a ProtocolError, with the original as ``__cause__``, so that a caller
catches one exception type. Encoders raise ProtocolError too, for values the
layout cannot carry.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from liftlog.api.envelope import Buffer, EnvelopeError, MsgType, decode_envelope, encode_envelope

__all__ = [
    "FETCH_VERSION",
    "FORMAT_VERSION",
    "EpochOffsetRequest",
    "EpochOffsetResponse",
    "FetchError",
    "FetchErrorCode",
    "FetchRequest",
    "FetchResponse",
    "PartitionData",
    "PartitionFetch",
    "PartitionNotification",
    "PartitionRefusal",
    "ProtocolError",
    "decode_epoch_offset_reply",
    "decode_epoch_offset_request",
    "decode_epoch_offset_response",
    "decode_fetch_error",
    "decode_fetch_request",
    "decode_fetch_response",
    "decode_notification",
    "decode_partition_notification",
    "encode_epoch_offset_request",
    "encode_epoch_offset_response",
    "encode_fetch_error",
    "encode_fetch_request",
    "encode_fetch_response",
    "encode_notification",
    "encode_partition_notification",
    "fetch_entry_size",
    "fetch_subject",
    "notify_subject",
    "offset_subject",
]

FORMAT_VERSION: Final = 1
"""First byte of the fetch error, epoch offset reply and notification: a reader refuses a format it does not know."""

FETCH_VERSION: Final = 2
"""First byte of the multi-partition fetch request and response and of the epoch offset request (version 1
was one partition per request, on subjects named after the partition)."""

_I32_MAX: Final = 2**31 - 1
_I64_MAX: Final = 2**63 - 1
_U16_MAX: Final = 2**16 - 1
_U32_MAX: Final = 2**32 - 1

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_FETCH_REQUEST_HEAD = struct.Struct(">BII")  # version, session, count
_FETCH_ENTRY = struct.Struct(">qqqi")  # offset, leader_epoch, created, partition
_FETCH_RESPONSE_HEAD = struct.Struct(">BI")  # version, count
_ANSWER_HEAD = struct.Struct(">Bi")  # code, partition
_DATA_HEAD = struct.Struct(">qqI")  # leader_epoch, hw, length
_REFUSAL_HEAD = struct.Struct(">qq")  # leader_epoch, log_start_offset
_FETCH_ERROR_HEAD = struct.Struct(">Bqq")  # code, leader_epoch, log_start_offset
_EPOCH_REQUEST_HEAD = struct.Struct(">Bqqqi")  # version, leader_epoch, current_epoch, created, partition
_EPOCH_RESPONSE = struct.Struct(">qqq")  # leader_epoch, end_offset, log_start_offset
_VERSION_BYTE: Final = _U8.pack(FORMAT_VERSION)

# The 8-byte envelope header alone, so that a fetch response is built with one
# join and its batches are copied once (encode_envelope would copy them again).
_REPLICATION_RESPONSE_HEADER: Final = encode_envelope(MsgType.REPLICATION_RESPONSE, b"")


class ProtocolError(ValueError):
    """Bytes that are not a valid replication message, or a value a message cannot carry."""


class FetchErrorCode(enum.IntEnum):
    """Why a leader cannot serve a partition's fetch. The values are the wire codes: never renumber (0 is data)."""

    NOT_LEADER = 1  # the responder does not lead the partition (any more), or is behind the follower's epoch
    UNKNOWN_PARTITION = 2  # the responder has no such stream partition (or one of another incarnation of the name)
    OFFSET_OUT_OF_RANGE = 3  # the offset is below log_start_offset or past the log end
    STALE_EPOCH = 4  # the follower's leader epoch is not the leader's: it must refresh (and maybe truncate)
    THROTTLED = 5  # a reassignment's new replica used its share of clustering.reassignment.max.rate: ask later


_ERROR_CODES: Final = {int(c): c for c in FetchErrorCode}


# --- messages ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionFetch:
    """One partition of a fetch: records from ``offset``, from the leader of ``leader_epoch``.

    ``offset`` is also the follower's acknowledgement: everything before it is in
    its log, which is how the leader tracks the ISR and advances the HW.
    """

    stream: str
    partition: int
    offset: int
    leader_epoch: int
    #: The stream's creation timestamp (ns): the incarnation of the stream name the follower replicates.
    created: int = 0


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """A follower asks one leader server for every partition it follows there."""

    replica_id: str
    session: int
    partitions: tuple[PartitionFetch, ...]


@dataclass(frozen=True, slots=True)
class PartitionData:
    """The leader's epoch and HW for a partition, and its record batches from the requested offset.

    ``batches`` is a view into the received buffer (no copy), which it keeps alive:
    take ``bytes(batches)`` to keep the records longer than the buffer. Empty: caught up.
    """

    stream: str
    partition: int
    leader_epoch: int
    hw: int
    batches: memoryview


@dataclass(frozen=True, slots=True)
class FetchError:
    """The leader cannot serve a request; ``code`` says why, the offsets help the follower recover."""

    code: FetchErrorCode
    message: str
    leader_epoch: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class PartitionRefusal:
    """One partition of a fetch that the leader cannot serve (the others are answered as usual)."""

    stream: str
    partition: int
    error: FetchError


PartitionAnswer = PartitionData | PartitionRefusal


@dataclass(frozen=True, slots=True)
class FetchResponse:
    """The answers, in the leader's order; partitions of the request that are missing get asked for again."""

    partitions: tuple[PartitionAnswer, ...]


@dataclass(frozen=True, slots=True)
class EpochOffsetRequest:
    """A recovering follower asks where its latest leader epoch ends (KIP-101/279).

    ``current_epoch`` is the epoch in which the follower believes the responder
    leads: a responder that leads in another epoch (or not at all) refuses.
    """

    stream: str
    partition: int
    leader_epoch: int
    current_epoch: int
    #: The stream's creation timestamp (ns), as in :class:`PartitionFetch`.
    created: int = 0


@dataclass(frozen=True, slots=True)
class EpochOffsetResponse:
    """The largest epoch <= the requested one that the leader knows and its end offset (-1, -1: none).

    The follower truncates its log to `end_offset` (if shorter), then repeats
    the request with `leader_epoch` until both agree, then fetches.
    """

    leader_epoch: int
    end_offset: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class PartitionNotification:
    """New data for a partition: wakes an idle follower's replication loop."""

    stream: str
    partition: int


# --- subjects ---------------------------------------------------------------------------


def fetch_subject(namespace: str, server_id: str) -> str:
    """The subject server ``server_id`` serves fetches on, for every partition it leads.

    A deposed leader still hears fetches meant for its successor's epoch: it refuses them
    partition by partition (NOT_LEADER, STALE_EPOCH), which the request's epochs let it do.
    """
    return f"{namespace}.fetch.{server_id}"


def offset_subject(namespace: str, server_id: str) -> str:
    """The subject server ``server_id`` serves leader-epoch offset requests on."""
    return f"{namespace}.offset.{server_id}"


def notify_subject(namespace: str, server_id: str) -> str:
    """The subject a server receives new-data notifications on, for all partitions it follows."""
    return f"{namespace}.notify.{server_id}"


# --- encoding ---------------------------------------------------------------------------


def _check(what: str, field: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ProtocolError(f"cannot encode {what}: {field} {value} is outside {low}..{high}")


def _str(what: str, field: str, s: str) -> bytes:
    try:
        raw = s.encode()
    except UnicodeEncodeError as exc:  # lone surrogates
        raise ProtocolError(f"cannot encode {what}: {field} is not valid Unicode ({exc.reason})") from None
    if len(raw) > _U16_MAX:
        raise ProtocolError(f"cannot encode {what}: {field} is {len(raw)} bytes of UTF-8, the limit is {_U16_MAX}")
    return _U16.pack(len(raw)) + raw


def fetch_entry_size(stream: str) -> int:
    """Bytes one partition of ``stream`` adds to a fetch request, or (before its batches) to a response."""
    return (
        max(_FETCH_ENTRY.size, _DATA_HEAD.size + _ANSWER_HEAD.size) + _U16.size + len(stream.encode(errors="replace"))
    )


def encode_fetch_request(req: FetchRequest) -> bytes:
    what = "fetch request"
    _check(what, "session", req.session, 0, _U32_MAX)
    _check(what, "count", len(req.partitions), 1, _U32_MAX)
    parts = [_FETCH_REQUEST_HEAD.pack(FETCH_VERSION, req.session, len(req.partitions))]
    parts.append(_str(what, "replica_id", req.replica_id))
    for p in req.partitions:
        _check(what, "offset", p.offset, 0, _I64_MAX)
        _check(what, "leader_epoch", p.leader_epoch, 0, _I64_MAX)
        _check(what, "created", p.created, 0, _I64_MAX)
        _check(what, "partition", p.partition, 0, _I32_MAX)
        parts.append(_FETCH_ENTRY.pack(p.offset, p.leader_epoch, p.created, p.partition))
        parts.append(_str(what, "stream", p.stream))
    return encode_envelope(MsgType.REPLICATION_REQUEST, b"".join(parts))


def encode_fetch_response(answers: Sequence[tuple[str, int, int, int, Buffer] | PartitionRefusal]) -> bytes:
    """A fetch response; data answers are ``(stream, partition, leader_epoch, hw, batches)`` tuples.

    Each partition's batches are copied once, into the result (tuples rather than
    :class:`PartitionData`, so that the leader need not make a view of what it read).
    """
    what = "fetch response"
    _check(what, "count", len(answers), 0, _U32_MAX)
    parts: list[Buffer] = [_REPLICATION_RESPONSE_HEADER, _FETCH_RESPONSE_HEAD.pack(FETCH_VERSION, len(answers))]
    for answer in answers:
        if isinstance(answer, PartitionRefusal):
            err = answer.error
            code = _ERROR_CODES.get(err.code)
            if code is None:
                raise ProtocolError(f"cannot encode {what}: unknown error code {err.code!r}")
            _check(what, "partition", answer.partition, 0, _I32_MAX)
            _check(what, "leader_epoch", err.leader_epoch, -1, _I64_MAX)
            _check(what, "log_start_offset", err.log_start_offset, -1, _I64_MAX)
            parts.append(_ANSWER_HEAD.pack(code, answer.partition))
            parts.append(_str(what, "stream", answer.stream))
            parts.append(_REFUSAL_HEAD.pack(err.leader_epoch, err.log_start_offset))
            parts.append(_str(what, "message", err.message))
            continue
        stream, partition, leader_epoch, hw, batches = answer
        _check(what, "partition", partition, 0, _I32_MAX)
        _check(what, "leader_epoch", leader_epoch, 0, _I64_MAX)
        _check(what, "hw", hw, -1, _I64_MAX)
        size = memoryview(batches).nbytes
        _check(what, "batches length", size, 0, _U32_MAX)
        parts.append(_ANSWER_HEAD.pack(0, partition))
        parts.append(_str(what, "stream", stream))
        parts.append(_DATA_HEAD.pack(leader_epoch, hw, size))
        parts.append(batches)
    return b"".join(parts)


def encode_fetch_error(err: FetchError) -> bytes:
    what = "fetch error"
    code = _ERROR_CODES.get(err.code)
    if code is None:
        raise ProtocolError(f"cannot encode {what}: unknown error code {err.code!r}")
    _check(what, "leader_epoch", err.leader_epoch, -1, _I64_MAX)
    _check(what, "log_start_offset", err.log_start_offset, -1, _I64_MAX)
    head = _VERSION_BYTE + _FETCH_ERROR_HEAD.pack(code, err.leader_epoch, err.log_start_offset)
    return encode_envelope(MsgType.PARTITION_STATUS_RESPONSE, head + _str(what, "message", err.message))


def encode_epoch_offset_request(req: EpochOffsetRequest) -> bytes:
    what = "epoch offset request"
    _check(what, "leader_epoch", req.leader_epoch, 0, _I64_MAX)
    _check(what, "current_epoch", req.current_epoch, 0, _I64_MAX)
    _check(what, "created", req.created, 0, _I64_MAX)
    _check(what, "partition", req.partition, 0, _I32_MAX)
    head = _EPOCH_REQUEST_HEAD.pack(FETCH_VERSION, req.leader_epoch, req.current_epoch, req.created, req.partition)
    return encode_envelope(MsgType.LEADER_EPOCH_OFFSET_REQUEST, head + _str(what, "stream", req.stream))


def encode_epoch_offset_response(resp: EpochOffsetResponse) -> bytes:
    what = "epoch offset response"
    _check(what, "leader_epoch", resp.leader_epoch, -1, _I64_MAX)
    _check(what, "end_offset", resp.end_offset, -1, _I64_MAX)
    _check(what, "log_start_offset", resp.log_start_offset, -1, _I64_MAX)
    payload = _VERSION_BYTE + _EPOCH_RESPONSE.pack(resp.leader_epoch, resp.end_offset, resp.log_start_offset)
    return encode_envelope(MsgType.LEADER_EPOCH_OFFSET_RESPONSE, payload)


def encode_notification(pairs: Iterable[tuple[str, int]]) -> bytes:
    """One notification naming every (stream, partition) in `pairs`, in order.

    Raises ProtocolError when `pairs` is empty: a notification that wakes
    nothing is a bug in the sender. The caller keeps the result under the NATS
    max_payload (about 100 KB per 10,000 short stream names).
    """
    what = "notification"
    parts = [b""]  # the head goes here once the pairs are counted
    for stream, partition in pairs:
        _check(what, "partition", partition, 0, _I32_MAX)
        parts.append(_str(what, "stream", stream))
        parts.append(_I32.pack(partition))
    count = (len(parts) - 1) // 2
    if count == 0:
        raise ProtocolError(f"cannot encode {what}: it names no partition")
    _check(what, "count", count, 1, _U32_MAX)
    parts[0] = _VERSION_BYTE + _U32.pack(count)
    return encode_envelope(MsgType.PARTITION_NOTIFICATION, b"".join(parts))


def encode_partition_notification(n: PartitionNotification) -> bytes:
    """A notification for one partition: the batched layout with one pair."""
    return encode_notification(((n.stream, n.partition),))


# --- decoding ---------------------------------------------------------------------------


def _payload(data: Buffer, expected: MsgType, what: str) -> memoryview:
    """The payload of an envelope of type `expected`, as a view of `data`."""
    msg_type, payload = _envelope(data, what)
    if msg_type is not expected:
        raise ProtocolError(
            f"bad {what}: envelope type {int(msg_type)} ({msg_type.name}), expected {int(expected)} ({expected.name})"
        )
    return payload


def _envelope(data: Buffer, what: str) -> tuple[MsgType, memoryview]:
    view = memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")  # keeps .obj: still a view of the caller's buffer
    try:
        return decode_envelope(view)
    except EnvelopeError as exc:
        raise ProtocolError(f"bad {what}: {exc}") from exc


class _Reader:
    """A cursor over a payload; every read checks the length first and names the field."""

    __slots__ = ("buf", "pos", "what")

    def __init__(self, buf: memoryview, what: str) -> None:
        self.buf = buf
        self.pos = 0
        self.what = what

    def fail(self, problem: str) -> ProtocolError:
        return ProtocolError(f"bad {self.what}: {problem}")

    def unpack(self, st: struct.Struct, field: str) -> tuple[int, ...]:
        pos = self.pos
        if pos + st.size > len(self.buf):
            raise self.fail(f"truncated: {field} at offset {pos} needs {st.size} bytes, {len(self.buf) - pos} left")
        self.pos = pos + st.size
        return st.unpack_from(self.buf, pos)

    def version(self, value: int | None = None, expected: int = FORMAT_VERSION) -> None:
        """Check the version byte (read here unless the caller unpacked it as ``value``)."""
        v = self.unpack(_U8, "version")[0] if value is None else value
        if v != expected:
            raise self.fail(f"unknown format version {v} at offset 0 (expected {expected})")

    def int_(self, field: str, value: int, offset: int, low: int) -> int:
        """`value`, read at `offset`, after checking it is not below `low` (-1 or 0)."""
        if value < low:
            raise self.fail(f"{field} {value} at offset {offset} is below {low}")
        return value

    def str_(self, field: str) -> str:
        (n,) = self.unpack(_U16, f"{field} length")
        pos = self.pos
        if pos + n > len(self.buf):
            raise self.fail(f"truncated: {field} at offset {pos} needs {n} bytes, {len(self.buf) - pos} left")
        self.pos = pos + n
        try:
            return str(self.buf[pos : pos + n], "utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{field} at offset {pos} is not UTF-8 ({exc.reason})") from None

    def bytes_(self, n: int, field: str) -> memoryview:
        pos = self.pos
        if pos + n > len(self.buf):
            raise self.fail(f"truncated: {field} at offset {pos} needs {n} bytes, {len(self.buf) - pos} left")
        self.pos = pos + n
        return self.buf[pos : pos + n]

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise self.fail(f"{len(self.buf) - self.pos} trailing bytes at offset {self.pos}")


def decode_fetch_request(data: Buffer) -> FetchRequest:
    r = _Reader(_payload(data, MsgType.REPLICATION_REQUEST, "fetch request"), "fetch request")
    version, session, count = r.unpack(_FETCH_REQUEST_HEAD, "header")
    r.version(version, FETCH_VERSION)
    if count == 0:
        raise r.fail("count at offset 5 is 0: a fetch asks for at least one partition")
    replica_id = r.str_("replica_id")
    entries: list[PartitionFetch] = []
    for i in range(count):  # a huge count hits the end of the buffer first: no allocation up front
        pos = r.pos
        offset, epoch, created, partition = r.unpack(_FETCH_ENTRY, f"entry {i}")
        entries.append(
            PartitionFetch(
                stream=r.str_(f"stream of entry {i}"),
                partition=r.int_(f"partition of entry {i}", partition, pos + 24, 0),
                offset=r.int_(f"offset of entry {i}", offset, pos, 0),
                leader_epoch=r.int_(f"leader_epoch of entry {i}", epoch, pos + 8, 0),
                created=r.int_(f"created of entry {i}", created, pos + 16, 0),
            )
        )
    r.done()
    return FetchRequest(replica_id, session, tuple(entries))


def decode_fetch_response(data: Buffer) -> FetchResponse:
    """A fetch response; each partition's ``batches`` is a view of `data` (no copy), not yet validated as records."""
    r = _Reader(_payload(data, MsgType.REPLICATION_RESPONSE, "fetch response"), "fetch response")
    version, count = r.unpack(_FETCH_RESPONSE_HEAD, "header")
    r.version(version, FETCH_VERSION)
    answers: list[PartitionAnswer] = []
    for i in range(count):
        pos = r.pos
        code, partition = r.unpack(_ANSWER_HEAD, f"answer {i}")
        partition = r.int_(f"partition of answer {i}", partition, pos + 1, 0)
        stream = r.str_(f"stream of answer {i}")
        pos = r.pos
        if code == 0:
            epoch, hw, length = r.unpack(_DATA_HEAD, f"data head of answer {i}")
            answers.append(
                PartitionData(
                    stream,
                    partition,
                    r.int_(f"leader_epoch of answer {i}", epoch, pos, 0),
                    r.int_(f"hw of answer {i}", hw, pos + 8, -1),
                    r.bytes_(length, f"batches of answer {i}"),
                )
            )
            continue
        known = _ERROR_CODES.get(code)
        if known is None:
            raise r.fail(f"unknown error code {code} in answer {i}")
        epoch, log_start = r.unpack(_REFUSAL_HEAD, f"refusal head of answer {i}")
        error = FetchError(
            known,
            r.str_(f"message of answer {i}"),
            r.int_(f"leader_epoch of answer {i}", epoch, pos, -1),
            r.int_(f"log_start_offset of answer {i}", log_start, pos + 8, -1),
        )
        answers.append(PartitionRefusal(stream, partition, error))
    r.done()
    return FetchResponse(tuple(answers))


def _fetch_error(payload: memoryview) -> FetchError:
    r = _Reader(payload, "fetch error")
    r.version()
    code, epoch, log_start = r.unpack(_FETCH_ERROR_HEAD, "header")
    known = _ERROR_CODES.get(code)
    if known is None:
        raise r.fail(f"unknown error code {code} at offset 1")
    err = FetchError(
        code=known,
        message=r.str_("message"),
        leader_epoch=r.int_("leader_epoch", epoch, 2, -1),
        log_start_offset=r.int_("log_start_offset", log_start, 10, -1),
    )
    r.done()
    return err


def decode_fetch_error(data: Buffer) -> FetchError:
    return _fetch_error(_payload(data, MsgType.PARTITION_STATUS_RESPONSE, "fetch error"))


def decode_epoch_offset_request(data: Buffer) -> EpochOffsetRequest:
    what = "epoch offset request"
    r = _Reader(_payload(data, MsgType.LEADER_EPOCH_OFFSET_REQUEST, what), what)
    version, epoch, current, created, partition = r.unpack(_EPOCH_REQUEST_HEAD, "header")
    r.version(version, FETCH_VERSION)
    req = EpochOffsetRequest(
        stream=r.str_("stream"),
        partition=r.int_("partition", partition, 25, 0),
        leader_epoch=r.int_("leader_epoch", epoch, 1, 0),
        current_epoch=r.int_("current_epoch", current, 9, 0),
        created=r.int_("created", created, 17, 0),
    )
    r.done()
    return req


def _epoch_offset_response(payload: memoryview) -> EpochOffsetResponse:
    r = _Reader(payload, "epoch offset response")
    r.version()
    epoch, end, log_start = r.unpack(_EPOCH_RESPONSE, "body")
    r.done()
    return EpochOffsetResponse(
        leader_epoch=r.int_("leader_epoch", epoch, 1, -1),
        end_offset=r.int_("end_offset", end, 9, -1),
        log_start_offset=r.int_("log_start_offset", log_start, 17, -1),
    )


def decode_epoch_offset_response(data: Buffer) -> EpochOffsetResponse:
    what = "epoch offset response"
    return _epoch_offset_response(_payload(data, MsgType.LEADER_EPOCH_OFFSET_RESPONSE, what))


def decode_epoch_offset_reply(data: Buffer) -> EpochOffsetResponse | FetchError:
    """Whatever a leader sent to an epoch offset request's inbox: told apart by the envelope type alone."""
    msg_type, payload = _envelope(data, "epoch offset reply")
    if msg_type is MsgType.LEADER_EPOCH_OFFSET_RESPONSE:
        return _epoch_offset_response(payload)
    if msg_type is MsgType.PARTITION_STATUS_RESPONSE:
        return _fetch_error(payload)
    raise ProtocolError(
        f"bad epoch offset reply: envelope type {int(msg_type)} ({msg_type.name}), expected "
        f"{int(MsgType.LEADER_EPOCH_OFFSET_RESPONSE)} (LEADER_EPOCH_OFFSET_RESPONSE) or "
        f"{int(MsgType.PARTITION_STATUS_RESPONSE)} (PARTITION_STATUS_RESPONSE, a refusal)"
    )


def decode_notification(data: Buffer) -> list[tuple[str, int]]:
    """The (stream, partition) pairs of a notification, single or batched, in the sender's order."""
    r = _Reader(_payload(data, MsgType.PARTITION_NOTIFICATION, "notification"), "notification")
    r.version()
    (count,) = r.unpack(_U32, "count")
    if count == 0:
        raise r.fail("count at offset 1 is 0: a notification names at least one partition")
    pairs: list[tuple[str, int]] = []
    for i in range(count):  # a huge count hits the end of the buffer first: no allocation up front
        stream = r.str_(f"stream of pair {i}")
        pos = r.pos
        (partition,) = r.unpack(_I32, f"partition of pair {i}")
        pairs.append((stream, r.int_(f"partition of pair {i}", partition, pos, 0)))
    r.done()
    return pairs


def decode_partition_notification(data: Buffer) -> PartitionNotification:
    """A notification that must name exactly one partition (see :func:`decode_notification` for batches)."""
    pairs = decode_notification(data)
    if len(pairs) != 1:
        raise ProtocolError(f"bad notification: names {len(pairs)} partitions, expected exactly 1")
    stream, partition = pairs[0]
    return PartitionNotification(stream, partition)
