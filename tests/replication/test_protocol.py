"""The replication wire protocol: exact round trips, pinned layouts, ProtocolError on bad input."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from liftlog.api.envelope import HEADER_LEN, BadMagic, Buffer, EnvelopeError, MsgType, decode_envelope, encode_envelope
from liftlog.replication import (
    FETCH_VERSION,
    FORMAT_VERSION,
    EpochOffsetRequest,
    EpochOffsetResponse,
    FetchError,
    FetchErrorCode,
    FetchRequest,
    FetchResponse,
    PartitionData,
    PartitionFetch,
    PartitionNotification,
    PartitionRefusal,
    ProtocolError,
    decode_epoch_offset_reply,
    decode_epoch_offset_request,
    decode_epoch_offset_response,
    decode_fetch_error,
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
    fetch_entry_size,
    fetch_subject,
    notify_subject,
    offset_subject,
)

I32 = 2**31 - 1
I64 = 2**63 - 1

Decoder = Callable[[Buffer], object]

# Text that survives UTF-8 (no lone surrogates), including "" and non-ASCII names.
names = st.text(st.characters(codec="utf-8"), max_size=40)
partitions = st.integers(0, I32)
offsets = st.integers(0, I64)
offsets_or_none = st.integers(-1, I64)

partition_fetches = st.builds(PartitionFetch, names, partitions, offsets, offsets, offsets)
fetch_requests = st.builds(
    FetchRequest, names, st.integers(0, 2**32 - 1), st.lists(partition_fetches, min_size=1, max_size=8).map(tuple)
)
fetch_errors = st.builds(FetchError, st.sampled_from(FetchErrorCode), names, offsets_or_none, offsets_or_none)
data_answers = st.tuples(names, partitions, offsets, offsets_or_none, st.binary(max_size=100))
refusals = st.builds(PartitionRefusal, names, partitions, fetch_errors)
epoch_requests = st.builds(EpochOffsetRequest, names, partitions, offsets, offsets, offsets)
epoch_responses = st.builds(EpochOffsetResponse, offsets_or_none, offsets_or_none, offsets_or_none)
pair_lists = st.lists(st.tuples(names, partitions), min_size=1, max_size=20)

REQ = FetchRequest("server-ä", 1, (PartitionFetch("orders", 3, 42, 7, 1000), PartitionFetch("flüsse", 0, 0, 2, 5)))
ERR = FetchError(FetchErrorCode.OFFSET_OUT_OF_RANGE, "offset 42 below log start 100", 7, 100)
RESP = encode_fetch_response([("orders", 3, 7, 41, b"batch-data"), PartitionRefusal("flüsse", 0, ERR)])
EPOCH_REQ = EpochOffsetRequest("orders", 3, 7, 8, 1000)
EPOCH_RESP = EpochOffsetResponse(6, 41, 0)
PAIRS = [("orders", 0), ("flüsse", 2), ("", 0)]

# One valid encoding per decoder, and the envelope type each decoder wants.
SAMPLES: dict[str, tuple[Decoder, bytes, MsgType]] = {
    "fetch request": (decode_fetch_request, encode_fetch_request(REQ), MsgType.REPLICATION_REQUEST),
    "fetch response": (decode_fetch_response, RESP, MsgType.REPLICATION_RESPONSE),
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
ALL_DECODERS: list[Decoder] = [*(decoder for decoder, _, _ in SAMPLES.values()), decode_epoch_offset_reply]
sample_ids = pytest.mark.parametrize("name", list(SAMPLES))
#: The first byte of each sample's payload.
VERSIONS = {
    name: FETCH_VERSION if name in ("fetch request", "fetch response", "epoch offset request") else FORMAT_VERSION
    for name in SAMPLES
}


def reframe(data: bytes, msg_type: MsgType, payload: bytes | None = None) -> bytes:
    """`data`'s payload (or `payload`) in a fresh envelope of `msg_type`."""
    _, original = decode_envelope(data)
    return encode_envelope(msg_type, bytes(original) if payload is None else payload)


def payload_of(data: bytes) -> bytes:
    return bytes(decode_envelope(data)[1])


def as_tuple(answer: PartitionData | PartitionRefusal) -> object:
    if isinstance(answer, PartitionRefusal):
        return answer
    return (answer.stream, answer.partition, answer.leader_epoch, answer.hw, bytes(answer.batches))


# --- round trips ------------------------------------------------------------------------


@given(fetch_requests)
def test_fetch_request_round_trips(req: FetchRequest) -> None:
    assert decode_fetch_request(encode_fetch_request(req)) == req


@given(st.lists(st.one_of(data_answers, refusals), max_size=8))
def test_fetch_response_round_trips_in_order(
    answers: list[tuple[str, int, int, int, bytes] | PartitionRefusal],
) -> None:
    resp = decode_fetch_response(encode_fetch_response(answers))
    assert [as_tuple(a) for a in resp.partitions] == answers


@given(fetch_errors)
def test_fetch_error_round_trips(err: FetchError) -> None:
    assert decode_fetch_error(encode_fetch_error(err)) == err
    assert decode_epoch_offset_reply(encode_fetch_error(err)) == err


@given(epoch_requests)
def test_epoch_offset_request_round_trips(req: EpochOffsetRequest) -> None:
    assert decode_epoch_offset_request(encode_epoch_offset_request(req)) == req


@given(epoch_responses)
def test_epoch_offset_response_round_trips(resp: EpochOffsetResponse) -> None:
    assert decode_epoch_offset_response(encode_epoch_offset_response(resp)) == resp
    assert decode_epoch_offset_reply(encode_epoch_offset_response(resp)) == resp


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


# --- the fetch response: zero copy, sizes -----------------------------------------------


@pytest.mark.parametrize("wrap", [bytes, bytearray], ids=["bytes", "bytearray"])
def test_fetch_response_batches_are_a_view_of_the_input(wrap: Callable[[bytes], bytes]) -> None:
    data = wrap(encode_fetch_response([("s", 0, 2, 10, b"batch-data"), ("t", 1, 2, 10, b"more")]))
    first, second = decode_fetch_response(data).partitions
    assert isinstance(first, PartitionData) and isinstance(second, PartitionData)
    assert first.batches.obj is data and second.batches.obj is data
    assert (bytes(first.batches), bytes(second.batches)) == (b"batch-data", b"more")


def test_fetch_response_view_of_a_memoryview_input_shares_its_buffer() -> None:
    buf = bytearray(encode_fetch_response([("s", 0, 2, 10, b"batch-data")]))
    (answer,) = decode_fetch_response(memoryview(buf)).partitions
    assert isinstance(answer, PartitionData)
    assert answer.batches.obj is buf
    buf[-1:] = b"!"  # a view, not a copy
    assert bytes(answer.batches) == b"batch-dat!"


def test_fetch_response_encoder_takes_a_memoryview_of_batches() -> None:
    segment = bytearray(b"....batch-data....")
    (answer,) = decode_fetch_response(encode_fetch_response([("s", 0, 1, 0, memoryview(segment)[4:-4])])).partitions
    assert isinstance(answer, PartitionData)
    assert bytes(answer.batches) == b"batch-data"


def test_an_empty_fetch_response_is_valid() -> None:
    """Every partition left out for the byte budget (or none asked): the follower asks again."""
    assert decode_fetch_response(encode_fetch_response([])) == FetchResponse(())


@given(names, st.binary(max_size=50))
def test_entry_size_is_what_a_data_answer_adds(stream: str, batches: bytes) -> None:
    empty = len(encode_fetch_response([]))
    one = len(encode_fetch_response([(stream, 1, 1, 1, batches)]))
    assert one - empty <= fetch_entry_size(stream) + len(batches)
    req = len(encode_fetch_request(FetchRequest("r", 0, (PartitionFetch(stream, 0, 0, 0),))))
    assert req - len(encode_fetch_request(FetchRequest("r", 0, (PartitionFetch("", 0, 0, 0),)))) <= fetch_entry_size(
        stream
    )


def test_epoch_offset_reply_is_told_apart_by_the_envelope_type() -> None:
    assert decode_epoch_offset_reply(encode_epoch_offset_response(EPOCH_RESP)) == EPOCH_RESP
    assert decode_epoch_offset_reply(encode_fetch_error(ERR)) == ERR
    assert encode_fetch_error(ERR)[7] == MsgType.PARTITION_STATUS_RESPONSE


@pytest.mark.parametrize("msg_type", [t for t in MsgType if t not in (7, 13)], ids=lambda t: t.name)
def test_epoch_offset_reply_of_another_type_raises(msg_type: MsgType) -> None:
    with pytest.raises(ProtocolError, match="bad epoch offset reply: envelope type"):
        decode_epoch_offset_reply(reframe(encode_epoch_offset_response(EPOCH_RESP), msg_type))


def test_fetch_error_codes_are_pinned() -> None:
    assert {c.name: c.value for c in FetchErrorCode} == {
        "NOT_LEADER": 1,
        "UNKNOWN_PARTITION": 2,
        "OFFSET_OUT_OF_RANGE": 3,
        "STALE_EPOCH": 4,
        "THROTTLED": 5,
    }


# --- layouts, byte for byte -------------------------------------------------------------


def test_fetch_error_layout() -> None:
    err = FetchError(FetchErrorCode.NOT_LEADER, "é", -1, 5)
    assert payload_of(encode_fetch_error(err)) == b"\x01\x01" + struct.pack(">qqH", -1, 5, 2) + "é".encode()


def test_fetch_layouts() -> None:
    req = FetchRequest("r", 5, (PartitionFetch("s", 2, 9, 4, 77), PartitionFetch("tt", 0, 1, 4, 78)))
    assert payload_of(encode_fetch_request(req)) == (
        b"\x02" + struct.pack(">IIH", 5, 2, 1) + b"r"
        + struct.pack(">qqqiH", 9, 4, 77, 2, 1) + b"s"
        + struct.pack(">qqqiH", 1, 4, 78, 0, 2) + b"tt"
    )  # fmt: skip
    resp = encode_fetch_response([("s", 2, 4, -1, b"\x00data"), PartitionRefusal("t", 1, FetchError(3, "m", 4, 0))])  # type: ignore[arg-type]
    assert resp[:HEADER_LEN] == encode_envelope(MsgType.REPLICATION_RESPONSE, b"")
    assert payload_of(resp) == (
        b"\x02" + struct.pack(">I", 2)
        + struct.pack(">BiH", 0, 2, 1) + b"s" + struct.pack(">qqI", 4, -1, 5) + b"\x00data"
        + struct.pack(">BiH", 3, 1, 1) + b"t" + struct.pack(">qqH", 4, 0, 1) + b"m"
    )  # fmt: skip


def test_other_layouts() -> None:
    assert payload_of(encode_epoch_offset_request(EpochOffsetRequest("s", 2, 4, 5, 6))) == (
        b"\x02" + struct.pack(">qqqiH", 4, 5, 6, 2, 1) + b"s"
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


@sample_ids
def test_truncation_message_names_field_and_offset(name: str) -> None:
    decoder, data, _ = SAMPLES[name]
    with pytest.raises(ProtocolError, match=r"truncated: .* at offset \d+ needs \d+ bytes"):
        decoder(data[: HEADER_LEN + 3])


@sample_ids
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


@sample_ids
def test_unknown_format_version_raises(name: str) -> None:
    decoder, data, msg_type = SAMPLES[name]
    payload = payload_of(data)
    assert payload[0] == VERSIONS[name]
    for version in (0, 3) if VERSIONS[name] == FETCH_VERSION else (0, 2):
        with pytest.raises(ProtocolError, match=f"unknown format version {version} at offset 0"):
            decoder(reframe(data, msg_type, bytes([version]) + payload[1:]))


def test_unknown_fetch_error_code_raises() -> None:
    payload = bytearray(payload_of(encode_fetch_error(ERR)))
    for code in (0, 6, 255):
        payload[1] = code
        data = encode_envelope(MsgType.PARTITION_STATUS_RESPONSE, bytes(payload))
        for decode in (decode_fetch_error, decode_epoch_offset_reply):
            with pytest.raises(ProtocolError, match=f"unknown error code {code} at offset 1"):
                decode(data)
    refusal = bytearray(payload_of(encode_fetch_response([PartitionRefusal("s", 0, ERR)])))
    refusal[5] = 9
    with pytest.raises(ProtocolError, match="unknown error code 9 in answer 0"):
        decode_fetch_response(encode_envelope(MsgType.REPLICATION_RESPONSE, bytes(refusal)))


def test_a_batch_length_past_the_end_is_a_truncation() -> None:
    """The length is checked before a view is made: a forged length cannot read past the message."""
    payload = (
        b"\x02" + struct.pack(">I", 1) + struct.pack(">BiH", 0, 0, 1) + b"s" + struct.pack(">qqI", 0, 0, 2**32 - 1)
    )
    with pytest.raises(ProtocolError, match="truncated: batches of answer 0"):
        decode_fetch_response(encode_envelope(MsgType.REPLICATION_RESPONSE, payload + b"abc"))


@pytest.mark.parametrize(
    ("name", "payload", "field"),
    [
        ("fetch request", b"\x02" + struct.pack(">IIH", 0, 1, 1) + b"\xff", "replica_id"),
        ("fetch request", b"\x02" + struct.pack(">IIH", 0, 1, 0) + struct.pack(">qqqiH", 0, 0, 0, 0, 2) + b"\xc3\x28",
         "stream of entry 0"),
        ("fetch response", b"\x02" + struct.pack(">IBiH", 1, 0, 0, 1) + b"\x80", "stream of answer 0"),
        ("fetch error", b"\x01\x01" + struct.pack(">qqH", 0, 0, 1) + b"\x80", "message"),
        ("epoch offset request", b"\x02" + struct.pack(">qqqiH", 0, 0, 0, 0, 1) + b"\xfe", "stream"),
        ("notification", b"\x01" + struct.pack(">IH", 1, 2) + b"\xed\xa0" + b"\x00" * 4, "stream of pair 0"),
    ],
)  # fmt: skip
def test_bad_utf8_raises_naming_the_field(name: str, payload: bytes, field: str) -> None:
    decoder, _, msg_type = SAMPLES[name]
    with pytest.raises(ProtocolError, match=f"{field} at offset \\d+ is not UTF-8"):
        decoder(encode_envelope(msg_type, payload))


def _answer(code: int, partition: int, tail: bytes) -> bytes:
    return b"\x02" + struct.pack(">IBiH", 1, code, partition, 1) + b"s" + tail


@pytest.mark.parametrize(
    ("decoder", "msg_type", "payload", "problem"),
    [
        (decode_fetch_response, MsgType.REPLICATION_RESPONSE, _answer(0, -1, struct.pack(">qqI", 0, 0, 0)),
         "partition of answer 0 -1 at offset 6"),
        (decode_fetch_response, MsgType.REPLICATION_RESPONSE, _answer(0, 0, struct.pack(">qqI", -1, 0, 0)),
         "leader_epoch of answer 0 -1 at offset 13"),
        (decode_fetch_response, MsgType.REPLICATION_RESPONSE, _answer(0, 0, struct.pack(">qqI", 0, -2, 0)),
         "hw of answer 0 -2 at offset 21"),
        (decode_fetch_response, MsgType.REPLICATION_RESPONSE, _answer(1, 0, struct.pack(">qqH", -2, 0, 0)),
         "leader_epoch of answer 0 -2"),
        (decode_fetch_request, MsgType.REPLICATION_REQUEST, b"\x02" + struct.pack(">IIH", 0, 0, 0),
         "count at offset 5 is 0"),
        (decode_fetch_request, MsgType.REPLICATION_REQUEST,
         b"\x02" + struct.pack(">IIH", 0, 1, 0) + struct.pack(">qqqiH", -1, 0, 0, 0, 0), "offset of entry 0 -1"),
        (decode_fetch_request, MsgType.REPLICATION_REQUEST,
         b"\x02" + struct.pack(">IIH", 0, 1, 0) + struct.pack(">qqqiH", 0, -1, 0, 0, 0), "leader_epoch of entry 0 -1"),
        (decode_fetch_request, MsgType.REPLICATION_REQUEST,
         b"\x02" + struct.pack(">IIH", 0, 1, 0) + struct.pack(">qqqiH", 0, 0, 0, -3, 0), "partition of entry 0 -3"),
        (decode_epoch_offset_request, MsgType.LEADER_EPOCH_OFFSET_REQUEST,
         b"\x02" + struct.pack(">qqqiH", 0, -1, 0, 0, 0), "current_epoch -1 at offset 9"),
        (decode_epoch_offset_response, MsgType.LEADER_EPOCH_OFFSET_RESPONSE,
         b"\x01" + struct.pack(">qqq", 0, -2, 0), "end_offset -2 at offset 9"),
        (decode_notification, MsgType.PARTITION_NOTIFICATION, b"\x01" + struct.pack(">IHi", 1, 0, -1),
         "partition of pair 0 -1 at offset 7"),
        (decode_notification, MsgType.PARTITION_NOTIFICATION, b"\x01" + struct.pack(">I", 0), "count at offset 1 is 0"),
    ],
)  # fmt: skip
def test_out_of_range_values_raise(decoder: Decoder, msg_type: MsgType, payload: bytes, problem: str) -> None:
    with pytest.raises(ProtocolError, match=problem):
        decoder(encode_envelope(msg_type, payload))


def test_single_notification_decoder_wants_exactly_one_pair() -> None:
    with pytest.raises(ProtocolError, match="names 3 partitions, expected exactly 1"):
        decode_partition_notification(encode_notification(PAIRS))


@pytest.mark.parametrize(
    ("decoder", "msg_type", "payload"),
    [
        (decode_notification, MsgType.PARTITION_NOTIFICATION, b"\x01" + struct.pack(">IHi", 2**32 - 1, 1, 0) + b"x"),
        (decode_fetch_request, MsgType.REPLICATION_REQUEST, b"\x02" + struct.pack(">IIH", 0, 2**32 - 1, 0)),
        (decode_fetch_response, MsgType.REPLICATION_RESPONSE, b"\x02" + struct.pack(">I", 2**32 - 1)),
    ],
)
def test_huge_counts_fail_fast_on_truncation(decoder: Decoder, msg_type: MsgType, payload: bytes) -> None:
    with pytest.raises(ProtocolError, match="truncated"):
        decoder(encode_envelope(msg_type, payload))


def test_envelope_errors_are_wrapped_with_their_cause() -> None:
    with pytest.raises(ProtocolError, match="bad fetch request: not an envelope") as info:
        decode_fetch_request(b"not an envelope at all")
    assert isinstance(info.value.__cause__, BadMagic)
    assert not isinstance(info.value, EnvelopeError)
    assert isinstance(info.value, ValueError)


def test_crc_mismatch_is_a_protocol_error() -> None:
    data = bytearray(encode_envelope(MsgType.REPLICATION_RESPONSE, payload_of(RESP), crc=True))
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


def _req(replica: str = "r", *entries: PartitionFetch, session: int = 0) -> FetchRequest:
    return FetchRequest(replica, session, entries or (PartitionFetch("s", 0, 0, 0),))


@pytest.mark.parametrize(
    ("encode", "problem"),
    [
        (lambda: encode_fetch_request(_req("r", PartitionFetch("s", 0, -1, 0))), "offset -1 is outside 0.."),
        (lambda: encode_fetch_request(_req("r", PartitionFetch("s", 2**31, 0, 0))), "partition 2147483648"),
        (lambda: encode_fetch_request(_req("r", PartitionFetch("s", 0, 0, 2**63))), "leader_epoch"),
        (lambda: encode_fetch_request(_req("r" * 65536)), "replica_id is 65536 bytes"),
        (lambda: encode_fetch_request(_req("\ud800")), "replica_id is not valid Unicode"),
        (lambda: encode_fetch_request(FetchRequest("r", 0, ())), "count 0 is outside 1.."),
        (lambda: encode_fetch_request(_req(session=-1)), "session -1"),
        (lambda: encode_fetch_response([("s", 0, 0, -2, b"")]), "hw -2 is outside -1.."),
        (lambda: encode_fetch_response([("s", 0, -1, 0, b"")]), "leader_epoch -1 is outside 0.."),
        (lambda: encode_fetch_response([("s", -1, 0, 0, b"")]), "partition -1"),
        (lambda: encode_fetch_response([PartitionRefusal("s", 0, FetchError(9, "", 0, 0))]), "unknown error code 9"),  # type: ignore[arg-type]
        (lambda: encode_fetch_error(FetchError(9, "", 0, 0)), "unknown error code 9"),  # type: ignore[arg-type]
        (lambda: encode_fetch_error(FetchError(FetchErrorCode.NOT_LEADER, "", -2, 0)), "leader_epoch -2"),
        (lambda: encode_epoch_offset_request(EpochOffsetRequest("s", -1, 0, 0)), "partition -1"),
        (lambda: encode_epoch_offset_request(EpochOffsetRequest("s", 0, 0, -1)), "current_epoch -1"),
        (lambda: encode_epoch_offset_request(EpochOffsetRequest("s", 0, 0, 0, -5)), "created -5"),
        (lambda: encode_fetch_request(_req("r", PartitionFetch("s", 0, 0, 0, -5))), "created -5"),
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
    # One subject per server, not per partition: every fetch a follower server makes of a leader server.
    assert fetch_subject("liftbridge-default", "srv-1") == "liftbridge-default.fetch.srv-1"
    assert offset_subject("liftbridge-default", "srv-1") == "liftbridge-default.offset.srv-1"
    assert notify_subject("liftbridge-default", "srv-1") == "liftbridge-default.notify.srv-1"
