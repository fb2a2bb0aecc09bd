"""The replication wire protocol: exact round trips, Liftbridge's fetch response layout, ProtocolError on bad input."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from liftlog.api.envelope import HEADER_LEN, BadMagic, Buffer, EnvelopeError, MsgType, decode_envelope, encode_envelope
from liftlog.replication import (
    FETCH_RESPONSE_HEADER_LEN,
    FORMAT_VERSION,
    EpochOffsetRequest,
    EpochOffsetResponse,
    FetchError,
    FetchErrorCode,
    FetchRequest,
    FetchResponse,
    PartitionNotification,
    ProtocolError,
    decode_epoch_offset_request,
    decode_epoch_offset_response,
    decode_fetch_error,
    decode_fetch_reply,
    decode_fetch_request,
    decode_fetch_response,
    decode_notification,
    decode_partition_notification,
    encode_epoch_offset_request,
    encode_epoch_offset_response,
    encode_fetch_error,
    encode_fetch_request,
    encode_fetch_response,
    encode_notification,
    encode_partition_notification,
    notify_subject,
    offset_subject,
    replicate_subject,
)

I32 = 2**31 - 1
I64 = 2**63 - 1

Decoder = Callable[[Buffer], object]

# Text that survives UTF-8 (no lone surrogates), including "" and non-ASCII names.
names = st.text(st.characters(codec="utf-8"), max_size=40)
partitions = st.integers(0, I32)
offsets = st.integers(0, I64)
offsets_or_none = st.integers(-1, I64)

fetch_requests = st.builds(FetchRequest, names, names, partitions, offsets, offsets)
fetch_errors = st.builds(FetchError, st.sampled_from(FetchErrorCode), names, offsets_or_none, offsets_or_none)
epoch_requests = st.builds(EpochOffsetRequest, names, partitions, offsets)
epoch_responses = st.builds(EpochOffsetResponse, offsets_or_none, offsets_or_none, offsets_or_none)
pair_lists = st.lists(st.tuples(names, partitions), min_size=1, max_size=20)

REQ = FetchRequest("server-ä", "orders", 3, 42, 7)
ERR = FetchError(FetchErrorCode.OFFSET_OUT_OF_RANGE, "offset 42 below log start 100", 7, 100)
EPOCH_REQ = EpochOffsetRequest("orders", 3, 7)
EPOCH_RESP = EpochOffsetResponse(6, 41, 0)
PAIRS = [("orders", 0), ("flüsse", 2), ("", 0)]

# One valid encoding per decoder, and the envelope type each decoder wants.
SAMPLES: dict[str, tuple[Decoder, bytes, MsgType]] = {
    "fetch request": (decode_fetch_request, encode_fetch_request(REQ), MsgType.REPLICATION_REQUEST),
    "fetch response": (decode_fetch_response, encode_fetch_response(7, -1, b""), MsgType.REPLICATION_RESPONSE),
    "fetch error": (decode_fetch_error, encode_fetch_error(ERR), MsgType.PARTITION_STATUS_RESPONSE),
    "epoch offset request": (
        decode_epoch_offset_request,
        encode_epoch_offset_request(EPOCH_REQ),
        MsgType.LEADER_EPOCH_OFFSET_REQUEST,
    ),
    "epoch offset response": (
        decode_epoch_offset_response,
        encode_epoch_offset_response(EPOCH_RESP),
        MsgType.LEADER_EPOCH_OFFSET_RESPONSE,
    ),
    "notification": (decode_notification, encode_notification(PAIRS), MsgType.PARTITION_NOTIFICATION),
    "single notification": (
        decode_partition_notification,
        encode_partition_notification(PartitionNotification("orders", 1)),
        MsgType.PARTITION_NOTIFICATION,
    ),
}
ALL_DECODERS: list[Decoder] = [
    *(decoder for decoder, _, _ in SAMPLES.values()),
    decode_fetch_reply,
]
sample_ids = pytest.mark.parametrize("name", list(SAMPLES))


def reframe(data: bytes, msg_type: MsgType, payload: bytes | None = None) -> bytes:
    """`data`'s payload (or `payload`) in a fresh envelope of `msg_type`."""
    _, original = decode_envelope(data)
    return encode_envelope(msg_type, bytes(original) if payload is None else payload)


def payload_of(data: bytes) -> bytes:
    return bytes(decode_envelope(data)[1])


# --- round trips ------------------------------------------------------------------------


@given(fetch_requests)
def test_fetch_request_round_trips(req: FetchRequest) -> None:
    assert decode_fetch_request(encode_fetch_request(req)) == req


@given(st.integers(0, I64), st.integers(-1, I64), st.binary(max_size=200))
def test_fetch_response_round_trips(epoch: int, hw: int, batches: bytes) -> None:
    resp = decode_fetch_response(encode_fetch_response(epoch, hw, batches))
    assert (resp.leader_epoch, resp.hw, bytes(resp.batches)) == (epoch, hw, batches)
    assert decode_fetch_reply(encode_fetch_response(epoch, hw, batches)) == resp


@given(fetch_errors)
def test_fetch_error_round_trips(err: FetchError) -> None:
    assert decode_fetch_error(encode_fetch_error(err)) == err
    assert decode_fetch_reply(encode_fetch_error(err)) == err


@given(epoch_requests)
def test_epoch_offset_request_round_trips(req: EpochOffsetRequest) -> None:
    assert decode_epoch_offset_request(encode_epoch_offset_request(req)) == req


@given(epoch_responses)
def test_epoch_offset_response_round_trips(resp: EpochOffsetResponse) -> None:
    assert decode_epoch_offset_response(encode_epoch_offset_response(resp)) == resp


@given(pair_lists)
def test_notification_round_trips_in_order_with_duplicates(pairs: list[tuple[str, int]]) -> None:
    assert decode_notification(encode_notification(pairs + pairs[:1])) == [*pairs, pairs[0]]


@given(names, partitions)
def test_single_notification_is_a_batch_of_one(stream: str, partition: int) -> None:
    data = encode_partition_notification(PartitionNotification(stream, partition))
    assert data == encode_notification([(stream, partition)])
    assert decode_partition_notification(data) == PartitionNotification(stream, partition)
    assert decode_notification(data) == [(stream, partition)]


def test_notification_accepts_any_iterable_of_pairs() -> None:
    assert decode_notification(encode_notification(iter(PAIRS))) == PAIRS


def test_decoders_accept_envelopes_with_a_crc_and_any_bytes_like_input() -> None:
    for decoder, data, msg_type in SAMPLES.values():
        with_crc = encode_envelope(msg_type, payload_of(data), crc=True)
        expected = decoder(data)
        assert decoder(with_crc) == expected
        assert decoder(bytearray(data)) == expected
        assert decoder(memoryview(data)) == expected


# --- the fetch response: Liftbridge's layout, zero copy ---------------------------------


def test_fetch_response_layout_is_pinned_byte_for_byte() -> None:
    batches = b"\x00\x01record-batches\xff"
    data = encode_fetch_response(0x0102030405060708, -1, batches)
    assert data[:HEADER_LEN] == encode_envelope(MsgType.REPLICATION_RESPONSE, b"")
    body = data[HEADER_LEN:]
    assert body[:8] == bytes.fromhex("0102030405060708")  # LeaderEpoch, big-endian
    assert body[8:16] == b"\xff" * 8  # HW -1 as a signed int64
    assert body[16:] == batches  # verbatim
    assert len(data) == HEADER_LEN + FETCH_RESPONSE_HEADER_LEN + len(batches)


def test_caught_up_fetch_response_is_exactly_the_header_and_16_bytes() -> None:
    data = encode_fetch_response(3, 41, b"")
    assert data[HEADER_LEN:] == struct.pack(">qq", 3, 41)
    resp = decode_fetch_response(data)
    assert (resp.leader_epoch, resp.hw, len(resp.batches)) == (3, 41, 0)


@pytest.mark.parametrize("wrap", [bytes, bytearray], ids=["bytes", "bytearray"])
def test_fetch_response_batches_are_a_view_of_the_input(wrap: Callable[[bytes], bytes]) -> None:
    data = wrap(encode_fetch_response(2, 10, b"batch-data"))
    for decode in (decode_fetch_response, decode_fetch_reply):
        resp = decode(data)
        assert isinstance(resp, FetchResponse)
        assert resp.batches.obj is data
        assert bytes(resp.batches) == b"batch-data"


def test_fetch_response_view_of_a_memoryview_input_shares_its_buffer() -> None:
    buf = bytearray(encode_fetch_response(2, 10, b"batch-data"))
    resp = decode_fetch_response(memoryview(buf))
    assert resp.batches.obj is buf
    buf[-1:] = b"!"  # a view, not a copy
    assert bytes(resp.batches) == b"batch-dat!"


def test_fetch_response_encoder_takes_a_memoryview_of_batches() -> None:
    segment = bytearray(b"....batch-data....")
    data = encode_fetch_response(1, 0, memoryview(segment)[4:-4])
    assert bytes(decode_fetch_response(data).batches) == b"batch-data"


def test_fetch_response_with_batches_that_look_like_an_error_is_still_a_response() -> None:
    batches = payload_of(encode_fetch_error(ERR))
    reply = decode_fetch_reply(encode_fetch_response(7, 5, batches))
    assert isinstance(reply, FetchResponse)
    assert bytes(reply.batches) == batches


# --- fetch error vs fetch response ------------------------------------------------------


def test_fetch_reply_is_told_apart_by_the_envelope_type() -> None:
    assert isinstance(decode_fetch_reply(encode_fetch_response(7, -1, b"")), FetchResponse)
    assert decode_fetch_reply(encode_fetch_error(ERR)) == ERR
    assert encode_fetch_error(ERR)[7] == MsgType.PARTITION_STATUS_RESPONSE
    assert encode_fetch_response(7, -1, b"")[7] == MsgType.REPLICATION_RESPONSE


def test_fetch_error_is_rejected_by_the_fetch_response_decoder_and_vice_versa() -> None:
    with pytest.raises(ProtocolError, match="PARTITION_STATUS_RESPONSE"):
        decode_fetch_response(encode_fetch_error(ERR))
    with pytest.raises(ProtocolError, match="REPLICATION_RESPONSE"):
        decode_fetch_error(encode_fetch_response(7, -1, b""))


@pytest.mark.parametrize("msg_type", [t for t in MsgType if t not in (3, 13)], ids=lambda t: t.name)
def test_fetch_reply_of_another_type_raises(msg_type: MsgType) -> None:
    with pytest.raises(ProtocolError, match="bad fetch reply: envelope type"):
        decode_fetch_reply(reframe(encode_fetch_response(7, -1, b""), msg_type))


def test_fetch_error_codes_are_pinned() -> None:
    assert {c.name: c.value for c in FetchErrorCode} == {
        "NOT_LEADER": 1,
        "UNKNOWN_PARTITION": 2,
        "OFFSET_OUT_OF_RANGE": 3,
        "STALE_EPOCH": 4,
    }


def test_fetch_error_layout() -> None:
    err = FetchError(FetchErrorCode.NOT_LEADER, "é", -1, 5)
    assert payload_of(encode_fetch_error(err)) == b"\x01\x01" + struct.pack(">qqH", -1, 5, 2) + "é".encode()


def test_other_layouts() -> None:
    assert payload_of(encode_fetch_request(FetchRequest("r", "s", 2, 9, 4))) == (
        b"\x01" + struct.pack(">qqiH", 9, 4, 2, 1) + b"r" + struct.pack(">H", 1) + b"s"
    )
    assert payload_of(encode_epoch_offset_request(EpochOffsetRequest("s", 2, 4))) == (
        b"\x01" + struct.pack(">qiH", 4, 2, 1) + b"s"
    )
    assert payload_of(encode_epoch_offset_response(EpochOffsetResponse(-1, -1, 0))) == (
        b"\x01" + struct.pack(">qqq", -1, -1, 0)
    )
    assert payload_of(encode_notification([("a", 1), ("bc", 2)])) == (
        b"\x01" + struct.pack(">IH", 2, 1) + b"a" + struct.pack(">iH", 1, 2) + b"bc" + struct.pack(">i", 2)
    )


# --- malformed input --------------------------------------------------------------------


@sample_ids
def test_every_truncated_prefix_raises(name: str) -> None:
    decoder, data, _ = SAMPLES[name]
    for n in range(len(data)):
        with pytest.raises(ProtocolError):
            decoder(data[:n])


def test_fetch_response_prefixes_past_the_16_bytes_are_shorter_batches() -> None:
    """Liftbridge's layout has no batch length: record-batch framing is checked by the storage decoder."""
    data = encode_fetch_response(7, 3, b"abcdef")
    for n in range(HEADER_LEN + FETCH_RESPONSE_HEADER_LEN):
        with pytest.raises(ProtocolError):
            decode_fetch_response(data[:n])
    for n in range(HEADER_LEN + FETCH_RESPONSE_HEADER_LEN, len(data) + 1):
        assert bytes(decode_fetch_response(data[:n]).batches) == b"abcdef"[: n - len(data) + 6]


@sample_ids
def test_truncation_message_names_field_and_offset(name: str) -> None:
    decoder, data, _ = SAMPLES[name]
    with pytest.raises(ProtocolError, match=r"truncated: .* at offset \d+ needs \d+ bytes"):
        decoder(data[: HEADER_LEN + 3])


@pytest.mark.parametrize("name", [n for n in SAMPLES if n != "fetch response"])
def test_trailing_bytes_raise(name: str) -> None:
    decoder, data, _ = SAMPLES[name]
    with pytest.raises(ProtocolError, match="1 trailing bytes"):
        decoder(data + b"\x00")


@sample_ids
def test_wrong_envelope_type_raises(name: str) -> None:
    decoder, data, msg_type = SAMPLES[name]
    for other in MsgType:
        if other is not msg_type:
            with pytest.raises(ProtocolError, match=f"envelope type {int(other)} \\({other.name}\\)"):
                decoder(reframe(data, other))


@pytest.mark.parametrize("name", [n for n in SAMPLES if n != "fetch response"])
def test_unknown_format_version_raises(name: str) -> None:
    decoder, data, msg_type = SAMPLES[name]
    payload = payload_of(data)
    assert payload[0] == FORMAT_VERSION
    with pytest.raises(ProtocolError, match="unknown format version 2 at offset 0"):
        decoder(reframe(data, msg_type, b"\x02" + payload[1:]))


def test_unknown_fetch_error_code_raises() -> None:
    payload = bytearray(payload_of(encode_fetch_error(ERR)))
    for code in (0, 5, 255):
        payload[1] = code
        data = encode_envelope(MsgType.PARTITION_STATUS_RESPONSE, bytes(payload))
        for decode in (decode_fetch_error, decode_fetch_reply):
            with pytest.raises(ProtocolError, match=f"unknown error code {code} at offset 1"):
                decode(data)


@pytest.mark.parametrize(
    ("name", "payload", "field"),
    [
        ("fetch request", b"\x01" + struct.pack(">qqiH", 0, 0, 0, 1) + b"\xff" + b"\x00\x00", "replica_id"),
        ("fetch request", b"\x01" + struct.pack(">qqiH", 0, 0, 0, 0) + b"\x00\x02\xc3\x28", "stream"),
        ("fetch error", b"\x01\x01" + struct.pack(">qqH", 0, 0, 1) + b"\x80", "message"),
        ("epoch offset request", b"\x01" + struct.pack(">qiH", 0, 0, 1) + b"\xfe", "stream"),
        ("notification", b"\x01" + struct.pack(">IH", 1, 2) + b"\xed\xa0" + b"\x00" * 4, "stream of pair 0"),
    ],
)
def test_bad_utf8_raises_naming_the_field(name: str, payload: bytes, field: str) -> None:
    decoder, _, msg_type = SAMPLES[name]
    with pytest.raises(ProtocolError, match=f"{field} at offset \\d+ is not UTF-8"):
        decoder(encode_envelope(msg_type, payload))


@pytest.mark.parametrize(
    ("decoder", "msg_type", "payload", "problem"),
    [
        (decode_fetch_response, MsgType.REPLICATION_RESPONSE, struct.pack(">qq", -1, 0), "leader_epoch -1 at offset 0"),
        (decode_fetch_response, MsgType.REPLICATION_RESPONSE, struct.pack(">qq", 0, -2), "hw -2 at offset 8"),
        (
            decode_fetch_request,
            MsgType.REPLICATION_REQUEST,
            b"\x01" + struct.pack(">qqiHH", -1, 0, 0, 0, 0),
            "offset -1",
        ),
        (
            decode_fetch_request,
            MsgType.REPLICATION_REQUEST,
            b"\x01" + struct.pack(">qqiHH", 0, 0, -3, 0, 0),
            "partition",
        ),
        (
            decode_epoch_offset_response,
            MsgType.LEADER_EPOCH_OFFSET_RESPONSE,
            b"\x01" + struct.pack(">qqq", 0, -2, 0),
            "end_offset -2 at offset 9",
        ),
        (
            decode_notification,
            MsgType.PARTITION_NOTIFICATION,
            b"\x01" + struct.pack(">IHi", 1, 0, -1),
            "partition of pair 0 -1 at offset 7",
        ),
        (decode_notification, MsgType.PARTITION_NOTIFICATION, b"\x01" + struct.pack(">I", 0), "count at offset 1 is 0"),
    ],
)
def test_out_of_range_values_raise(decoder: Decoder, msg_type: MsgType, payload: bytes, problem: str) -> None:
    with pytest.raises(ProtocolError, match=problem):
        decoder(encode_envelope(msg_type, payload))


def test_single_notification_decoder_wants_exactly_one_pair() -> None:
    with pytest.raises(ProtocolError, match="names 3 partitions, expected exactly 1"):
        decode_partition_notification(encode_notification(PAIRS))


def test_huge_notification_count_fails_fast_on_truncation() -> None:
    data = encode_envelope(MsgType.PARTITION_NOTIFICATION, b"\x01" + struct.pack(">IHi", 2**32 - 1, 1, 0) + b"x")
    with pytest.raises(ProtocolError, match="truncated"):
        decode_notification(data)


def test_envelope_errors_are_wrapped_with_their_cause() -> None:
    with pytest.raises(ProtocolError, match="bad fetch request: not an envelope") as info:
        decode_fetch_request(b"not an envelope at all")
    assert isinstance(info.value.__cause__, BadMagic)
    assert not isinstance(info.value, EnvelopeError)
    assert isinstance(info.value, ValueError)


def test_crc_mismatch_is_a_protocol_error() -> None:
    data = bytearray(encode_envelope(MsgType.REPLICATION_RESPONSE, struct.pack(">qq", 1, 1) + b"data", crc=True))
    data[-1] ^= 0xFF
    with pytest.raises(ProtocolError, match="CRC-32C mismatch"):
        decode_fetch_response(data)


@pytest.mark.parametrize("decoder", ALL_DECODERS, ids=lambda d: d.__name__)
@given(data=st.binary(max_size=64))
def test_garbage_raises_only_protocol_error(decoder: Decoder, data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decoder(data)


@pytest.mark.parametrize("name", list(SAMPLES))
@given(payload=st.binary(max_size=64))
def test_garbage_payload_in_the_right_envelope_raises_only_protocol_error(name: str, payload: bytes) -> None:
    decoder, _, msg_type = SAMPLES[name]
    with contextlib.suppress(ProtocolError):
        decoder(encode_envelope(msg_type, payload))


@pytest.mark.parametrize("name", list(SAMPLES))
@given(data=st.data())
def test_single_byte_corruption_raises_only_protocol_error(name: str, data: st.DataObject) -> None:
    decoder, sample, _ = SAMPLES[name]
    corrupt = bytearray(sample)
    corrupt[data.draw(st.integers(0, len(corrupt) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(ProtocolError):
        decoder(bytes(corrupt))


# --- encoding errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encode", "problem"),
    [
        (lambda: encode_fetch_request(FetchRequest("r", "s", 0, -1, 0)), "offset -1 is outside 0.."),
        (lambda: encode_fetch_request(FetchRequest("r", "s", 2**31, 0, 0)), "partition 2147483648"),
        (lambda: encode_fetch_request(FetchRequest("r", "s", 0, 0, 2**63)), "leader_epoch"),
        (lambda: encode_fetch_request(FetchRequest("r" * 65536, "s", 0, 0, 0)), "replica_id is 65536 bytes"),
        (lambda: encode_fetch_request(FetchRequest("\ud800", "s", 0, 0, 0)), "replica_id is not valid Unicode"),
        (lambda: encode_fetch_response(0, -2, b""), "hw -2 is outside -1.."),
        (lambda: encode_fetch_response(-1, 0, b""), "leader_epoch -1 is outside 0.."),
        (lambda: encode_fetch_error(FetchError(9, "", 0, 0)), "unknown error code 9"),  # type: ignore[arg-type]
        (lambda: encode_fetch_error(FetchError(FetchErrorCode.NOT_LEADER, "", -2, 0)), "leader_epoch -2"),
        (lambda: encode_epoch_offset_request(EpochOffsetRequest("s", -1, 0)), "partition -1"),
        (lambda: encode_epoch_offset_response(EpochOffsetResponse(0, 2**63, 0)), "end_offset"),
        (lambda: encode_notification([]), "names no partition"),
        (lambda: encode_notification([("s", -1)]), "partition -1"),
    ],
)
def test_values_the_layout_cannot_carry_raise(encode: Callable[[], bytes], problem: str) -> None:
    with pytest.raises(ProtocolError, match=problem.replace("(", r"\(")):
        encode()


# --- subjects ---------------------------------------------------------------------------


def test_subjects() -> None:
    # The leader epoch is in the subject: a deposed leader does not listen on its successor's subjects.
    assert replicate_subject("liftbridge-default", "orders", 3, 7) == "liftbridge-default.orders.3.7.replicate"
    assert offset_subject("liftbridge-default", "orders", 3, 7) == "liftbridge-default.orders.3.7.offset"
    assert notify_subject("liftbridge-default", "srv-1") == "liftbridge-default.notify.srv-1"
