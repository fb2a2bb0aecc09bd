"""The server-to-server replication messages: pure encode/decode functions, no I/O.

Every message travels in a Liftbridge envelope (``liftlog.api.envelope``) whose
message type says what it is. The fetch response keeps Liftbridge's own binary
layout; the other payloads are liftlog's struct formats (Liftbridge uses protobuf
there), so every server of a cluster must run liftlog. All integers are big-endian
and signed (``i32``/``i64``) unless marked ``u``::

    str     u16 length, then that many bytes of UTF-8

    fetch request        envelope REPLICATION_REQUEST (2), sent on replicate_subject()
      0  u8   version = 1
      1  i64  offset               first offset the follower wants (>= 0)
      9  i64  leader_epoch         the leader epoch the follower believes current (>= 0)
     17  i32  partition            (>= 0)
     21  str  replica_id, then str stream

    fetch response       envelope REPLICATION_RESPONSE (3): Liftbridge's layout, exactly
      0  i64  leader_epoch         (>= 0)
      8  i64  hw                   high watermark, -1 when nothing is committed
     16  ...  record batches, verbatim, possibly none (the follower is caught up)

    fetch error          envelope PARTITION_STATUS_RESPONSE (13), on the fetch reply inbox
      0  u8   version = 1
      1  u8   code                 FetchErrorCode
      2  i64  leader_epoch         the responder's current leader epoch, -1 if unknown
     10  i64  log_start_offset     the responder's first offset, -1 if unknown
     18  str  message

    epoch offset request envelope LEADER_EPOCH_OFFSET_REQUEST (6), sent on offset_subject()
      0  u8   version = 1
      1  i64  leader_epoch         the follower's latest epoch (>= 0)
      9  i32  partition            (>= 0)
     13  str  stream

    epoch offset reply   envelope LEADER_EPOCH_OFFSET_RESPONSE (7)
      0  u8   version = 1
      1  i64  leader_epoch         largest epoch <= the requested one, -1 when none
      9  i64  end_offset           where that epoch ends, -1 when none
     17  i64  log_start_offset     the leader's first offset, -1 if unknown

    notification         envelope PARTITION_NOTIFICATION (14), sent on notify_subject()
      0  u8   version = 1
      1  u32  count                (>= 1)
      5       count times: str stream, i32 partition (>= 0)

Why a fetch error is a separate envelope type: the fetch response layout is fixed
by Liftbridge (16 bytes, then data), so no flag fits in it, and sentinel epochs
would make a valid response ambiguous. The receiver of a fetch reply decides on
the envelope type byte alone (:func:`decode_fetch_reply`). Type 13 belongs to
Liftbridge's partition-status RPC, but a fetch error only ever arrives on the
reply inbox of a fetch request, where no partition-status reply can arrive, and a
Liftbridge follower that received one would reject it instead of misreading it.

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
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from liftlog.api.envelope import Buffer, EnvelopeError, MsgType, decode_envelope, encode_envelope

__all__ = [
    "FETCH_RESPONSE_HEADER_LEN",
    "FORMAT_VERSION",
    "EpochOffsetRequest",
    "EpochOffsetResponse",
    "FetchError",
    "FetchErrorCode",
    "FetchRequest",
    "FetchResponse",
    "PartitionNotification",
    "ProtocolError",
    "decode_epoch_offset_request",
    "decode_epoch_offset_response",
    "decode_fetch_error",
    "decode_fetch_reply",
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
    "notify_subject",
    "offset_subject",
    "replicate_subject",
]

FORMAT_VERSION: Final = 1
"""First byte of every liftlog payload (not the fetch response): lets a reader refuse a format it does not know."""

FETCH_RESPONSE_HEADER_LEN: Final = 16
"""Bytes of leader epoch and HW before the record batches of a fetch response."""

_I32_MAX: Final = 2**31 - 1
_I64_MAX: Final = 2**63 - 1
_U16_MAX: Final = 2**16 - 1
_U32_MAX: Final = 2**32 - 1

_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_FETCH_REQUEST_HEAD = struct.Struct(">qqi")  # offset, leader_epoch, partition (after the version byte)
_FETCH_RESPONSE_HEAD = struct.Struct(">qq")  # leader_epoch, hw
_FETCH_ERROR_HEAD = struct.Struct(">Bqq")  # code, leader_epoch, log_start_offset
_EPOCH_REQUEST_HEAD = struct.Struct(">qi")  # leader_epoch, partition
_EPOCH_RESPONSE = struct.Struct(">qqq")  # leader_epoch, end_offset, log_start_offset
_VERSION_BYTE: Final = _U8.pack(FORMAT_VERSION)
assert _FETCH_RESPONSE_HEAD.size == FETCH_RESPONSE_HEADER_LEN

# The 8-byte envelope header alone, so that a fetch response is built with one
# join and its batches are copied once (encode_envelope would copy them again).
_REPLICATION_RESPONSE_HEADER: Final = encode_envelope(MsgType.REPLICATION_RESPONSE, b"")


class ProtocolError(ValueError):
    """Bytes that are not a valid replication message, or a value a message cannot carry."""


class FetchErrorCode(enum.IntEnum):
    """Why a leader cannot serve a fetch. The values are the wire codes: never renumber."""

    NOT_LEADER = 1  # the responder does not lead the partition (any more), or is behind the follower's epoch
    UNKNOWN_PARTITION = 2  # the responder has no such stream partition
    OFFSET_OUT_OF_RANGE = 3  # the offset is below log_start_offset or past the log end
    STALE_EPOCH = 4  # the follower's leader epoch is older than the leader's: it must refresh and truncate


_ERROR_CODES: Final = {int(c): c for c in FetchErrorCode}


# --- messages ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """A follower asks the leader for records from `offset`.

    `offset` is also the follower's acknowledgement: everything before it is in
    its log, which is how the leader tracks the ISR and advances the HW.
    """

    replica_id: str
    stream: str
    partition: int
    offset: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class FetchResponse:
    """The leader's answer: its epoch and HW, and the record batches from the requested offset.

    `batches` is a view into the received buffer (no copy), which it keeps alive:
    take ``bytes(batches)`` to keep the records longer than the buffer.
    """

    leader_epoch: int
    hw: int
    batches: memoryview


@dataclass(frozen=True, slots=True)
class FetchError:
    """The leader cannot serve a fetch; `code` says why, the offsets help the follower recover."""

    code: FetchErrorCode
    message: str
    leader_epoch: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class EpochOffsetRequest:
    """A recovering follower asks where its latest leader epoch ends (KIP-101/279)."""

    stream: str
    partition: int
    leader_epoch: int


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


def replicate_subject(namespace: str, stream: str, partition: int, leader_epoch: int) -> str:
    """The subject the leader of ``leader_epoch`` serves fetch requests on.

    The epoch is part of the subject so that a deposed leader that has not yet heard of its successor
    never sees, let alone answers, a request meant for the new one.
    """
    return f"{namespace}.{stream}.{partition}.{leader_epoch}.replicate"


def offset_subject(namespace: str, stream: str, partition: int, leader_epoch: int) -> str:
    """The subject the leader of ``leader_epoch`` serves leader-epoch offset requests on."""
    return f"{namespace}.{stream}.{partition}.{leader_epoch}.offset"


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


def encode_fetch_request(req: FetchRequest) -> bytes:
    what = "fetch request"
    _check(what, "offset", req.offset, 0, _I64_MAX)
    _check(what, "leader_epoch", req.leader_epoch, 0, _I64_MAX)
    _check(what, "partition", req.partition, 0, _I32_MAX)
    head = _VERSION_BYTE + _FETCH_REQUEST_HEAD.pack(req.offset, req.leader_epoch, req.partition)
    payload = b"".join((head, _str(what, "replica_id", req.replica_id), _str(what, "stream", req.stream)))
    return encode_envelope(MsgType.REPLICATION_REQUEST, payload)


def encode_fetch_response(leader_epoch: int, hw: int, batches: Buffer) -> bytes:
    """A fetch response carrying `batches` verbatim (b"" when the follower is caught up).

    The batches are copied once, into the result.
    """
    what = "fetch response"
    _check(what, "leader_epoch", leader_epoch, 0, _I64_MAX)
    _check(what, "hw", hw, -1, _I64_MAX)
    return b"".join((_REPLICATION_RESPONSE_HEADER, _FETCH_RESPONSE_HEAD.pack(leader_epoch, hw), batches))


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
    _check(what, "partition", req.partition, 0, _I32_MAX)
    head = _VERSION_BYTE + _EPOCH_REQUEST_HEAD.pack(req.leader_epoch, req.partition)
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

    def version(self) -> None:
        (v,) = self.unpack(_U8, "version")
        if v != FORMAT_VERSION:
            raise self.fail(f"unknown format version {v} at offset 0 (expected {FORMAT_VERSION})")

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

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise self.fail(f"{len(self.buf) - self.pos} trailing bytes at offset {self.pos}")


def decode_fetch_request(data: Buffer) -> FetchRequest:
    r = _Reader(_payload(data, MsgType.REPLICATION_REQUEST, "fetch request"), "fetch request")
    r.version()
    offset, epoch, partition = r.unpack(_FETCH_REQUEST_HEAD, "header")
    req = FetchRequest(
        replica_id=r.str_("replica_id"),
        stream=r.str_("stream"),
        partition=r.int_("partition", partition, 17, 0),
        offset=r.int_("offset", offset, 1, 0),
        leader_epoch=r.int_("leader_epoch", epoch, 9, 0),
    )
    r.done()
    return req


def _fetch_response(payload: memoryview) -> FetchResponse:
    r = _Reader(payload, "fetch response")
    epoch, hw = r.unpack(_FETCH_RESPONSE_HEAD, "leader_epoch and hw")
    return FetchResponse(r.int_("leader_epoch", epoch, 0, 0), r.int_("hw", hw, 8, -1), payload[r.pos :])


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


def decode_fetch_response(data: Buffer) -> FetchResponse:
    """A fetch response; its `batches` is a view of `data` (no copy), not yet validated as records.

    A fetch error raises ProtocolError here: use :func:`decode_fetch_reply` on a fetch reply inbox.
    """
    return _fetch_response(_payload(data, MsgType.REPLICATION_RESPONSE, "fetch response"))


def decode_fetch_error(data: Buffer) -> FetchError:
    return _fetch_error(_payload(data, MsgType.PARTITION_STATUS_RESPONSE, "fetch error"))


def decode_fetch_reply(data: Buffer) -> FetchResponse | FetchError:
    """Whatever a leader sent to a fetch reply inbox: told apart by the envelope type alone."""
    msg_type, payload = _envelope(data, "fetch reply")
    if msg_type is MsgType.REPLICATION_RESPONSE:
        return _fetch_response(payload)
    if msg_type is MsgType.PARTITION_STATUS_RESPONSE:
        return _fetch_error(payload)
    raise ProtocolError(
        f"bad fetch reply: envelope type {int(msg_type)} ({msg_type.name}), expected "
        f"{int(MsgType.REPLICATION_RESPONSE)} (REPLICATION_RESPONSE) or "
        f"{int(MsgType.PARTITION_STATUS_RESPONSE)} (PARTITION_STATUS_RESPONSE, a fetch error)"
    )


def decode_epoch_offset_request(data: Buffer) -> EpochOffsetRequest:
    what = "epoch offset request"
    r = _Reader(_payload(data, MsgType.LEADER_EPOCH_OFFSET_REQUEST, what), what)
    r.version()
    epoch, partition = r.unpack(_EPOCH_REQUEST_HEAD, "header")
    req = EpochOffsetRequest(
        stream=r.str_("stream"),
        partition=r.int_("partition", partition, 9, 0),
        leader_epoch=r.int_("leader_epoch", epoch, 1, 0),
    )
    r.done()
    return req


def decode_epoch_offset_response(data: Buffer) -> EpochOffsetResponse:
    what = "epoch offset response"
    r = _Reader(_payload(data, MsgType.LEADER_EPOCH_OFFSET_RESPONSE, what), what)
    r.version()
    epoch, end, log_start = r.unpack(_EPOCH_RESPONSE, "body")
    r.done()
    return EpochOffsetResponse(
        leader_epoch=r.int_("leader_epoch", epoch, 1, -1),
        end_offset=r.int_("end_offset", end, 9, -1),
        log_start_offset=r.int_("log_start_offset", log_start, 17, -1),
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
