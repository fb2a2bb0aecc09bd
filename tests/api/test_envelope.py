"""The envelope codec: layout, roundtrips, every error, plain and hostile payloads."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from liftlog.api import api_pb2
from liftlog.api.envelope import (
    HEADER_LEN,
    HEADER_LEN_CRC,
    MAGIC,
    BadHeaderLength,
    BadMagic,
    BadPayload,
    CrcMismatch,
    EnvelopeError,
    EnvelopeHeader,
    MsgType,
    TruncatedEnvelope,
    UnexpectedMessageType,
    UnknownMessageType,
    UnknownVersion,
    decode_ack,
    decode_envelope,
    decode_header,
    decode_publish_message,
    encode_ack,
    encode_envelope,
    encode_publish_message,
    has_magic,
)

# CRC-32C("123456789") is the standard check value 0xE3069283.
CHECK_PAYLOAD = b"123456789"


def full_message() -> api_pb2.Message:
    return api_pb2.Message(
        key=b"order-1",
        value=b"\x00paid\xff",
        headers={"trace": b"abc", "empty": b""},
        ackInbox="_INBOX.acks",
        correlationId="c-42",
        ackPolicy=api_pb2.ALL,
    )


def full_ack() -> api_pb2.Ack:
    return api_pb2.Ack(
        stream="orders",
        partitionSubject="orders.1",
        msgSubject="orders.1",
        offset=41,
        ackInbox="_INBOX.acks",
        correlationId="c-42",
        ackPolicy=api_pb2.LEADER,
        receptionTimestamp=1_700_000_000_000_000_000,
        commitTimestamp=1_700_000_000_000_500_000,
        ackError=api_pb2.Ack.OK,
    )


def header(version: int = 0, header_len: int = 8, flags: int = 0, msg_type: int = 0) -> bytes:
    return MAGIC + bytes((version, header_len, flags, msg_type))


# --- layout ---------------------------------------------------------------


def test_layout_without_crc() -> None:
    assert encode_envelope(MsgType.ACK, b"xyz") == bytes.fromhex("B9 0E 43 B4 00 08 00 01") + b"xyz"


def test_layout_with_crc_is_big_endian_crc32c_of_payload() -> None:
    encoded = encode_envelope(MsgType.PUBLISH, CHECK_PAYLOAD, crc=True)
    assert encoded == bytes.fromhex("B9 0E 43 B4 00 0C 01 00 E3 06 92 83") + CHECK_PAYLOAD


def test_msg_type_numbers_match_liftbridge() -> None:
    assert [(t.name, t.value) for t in MsgType] == [
        ("PUBLISH", 0),
        ("ACK", 1),
        ("REPLICATION_REQUEST", 2),
        ("REPLICATION_RESPONSE", 3),
        ("RAFT_JOIN_REQUEST", 4),
        ("RAFT_JOIN_RESPONSE", 5),
        ("LEADER_EPOCH_OFFSET_REQUEST", 6),
        ("LEADER_EPOCH_OFFSET_RESPONSE", 7),
        ("PROPAGATED_REQUEST", 8),
        ("PROPAGATED_RESPONSE", 9),
        ("SERVER_INFO_REQUEST", 10),
        ("SERVER_INFO_RESPONSE", 11),
        ("PARTITION_STATUS_REQUEST", 12),
        ("PARTITION_STATUS_RESPONSE", 13),
        ("PARTITION_NOTIFICATION", 14),
    ]


def test_encode_rejects_unknown_type_number() -> None:
    with pytest.raises(ValueError):
        encode_envelope(15, b"")  # type: ignore[arg-type]


# --- roundtrips -----------------------------------------------------------


@pytest.mark.parametrize("crc", [False, True])
@pytest.mark.parametrize("msg_type", list(MsgType))
def test_roundtrip_every_type(msg_type: MsgType, crc: bool) -> None:
    payload = b"payload of " + msg_type.name.encode()
    decoded_type, decoded_payload = decode_envelope(encode_envelope(msg_type, payload, crc=crc))
    assert decoded_type is msg_type
    assert isinstance(decoded_payload, memoryview)
    assert bytes(decoded_payload) == payload


@pytest.mark.parametrize("crc", [False, True])
def test_roundtrip_empty_payload(crc: bool) -> None:
    encoded = encode_envelope(MsgType.PUBLISH, b"", crc=crc)
    assert len(encoded) == (HEADER_LEN_CRC if crc else HEADER_LEN)
    assert decode_envelope(encoded) == (MsgType.PUBLISH, memoryview(b""))


@given(payload=st.binary(max_size=2048), msg_type=st.sampled_from(list(MsgType)), crc=st.booleans())
def test_roundtrip_any_payload(payload: bytes, msg_type: MsgType, crc: bool) -> None:
    decoded_type, decoded_payload = decode_envelope(encode_envelope(msg_type, payload, crc=crc))
    assert (decoded_type, bytes(decoded_payload)) == (msg_type, payload)


def test_payload_is_a_view_of_the_input() -> None:
    data = encode_envelope(MsgType.ACK, b"abc", crc=True)
    _, payload = decode_envelope(data)
    assert payload.obj is data


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
@pytest.mark.parametrize("crc", [False, True])
def test_publish_message_roundtrip(crc: bool, wrap: type) -> None:
    message = full_message()
    encoded = encode_publish_message(message, crc=crc)
    assert encoded[7] == MsgType.PUBLISH
    assert decode_publish_message(wrap(encoded)) == message


@pytest.mark.parametrize("crc", [False, True])
def test_ack_roundtrip(crc: bool) -> None:
    ack = full_ack()
    encoded = encode_ack(ack, crc=crc)
    assert encoded[7] == MsgType.ACK
    assert decode_ack(encoded) == ack


def test_decode_header() -> None:
    assert decode_header(encode_envelope(MsgType.ACK, b"x")) == EnvelopeHeader(MsgType.ACK, 8, 0, None)
    assert decode_header(encode_envelope(MsgType.PUBLISH, CHECK_PAYLOAD, crc=True)) == EnvelopeHeader(
        MsgType.PUBLISH, 12, 1, 0xE3069283
    )


def test_has_magic() -> None:
    assert has_magic(encode_envelope(MsgType.PUBLISH, b""))
    assert has_magic(MAGIC)
    assert not has_magic(MAGIC[:3])
    assert not has_magic(b"plain value")


@pytest.mark.parametrize(("flags", "header_len"), [(0x02, 8), (0x80, 8), (0xFF, 12), (0x03, 12)])
def test_unknown_flag_bits_are_ignored(flags: int, header_len: int) -> None:
    # Liftbridge only looks at bit 0, so other bits must not make a valid envelope invalid.
    crc = bytes.fromhex("E3069283") if flags & 1 else b""
    data = header(header_len=header_len, flags=flags, msg_type=MsgType.ACK) + crc + CHECK_PAYLOAD
    msg_type, payload = decode_envelope(data)
    assert (msg_type, bytes(payload)) == (MsgType.ACK, CHECK_PAYLOAD)


# --- errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "error", "message"),
    [
        (b"hello world", BadMagic, "not an envelope: starts with 68 65 6C 6C, expected the magic number B9 0E 43 B4"),
        (b"hi", BadMagic, "not an envelope: starts with 68 69, expected the magic number B9 0E 43 B4"),
        (b"\xb9\x0e\x43\xb5" + bytes(8), BadMagic, "starts with B9 0E 43 B5"),
        (b"", TruncatedEnvelope, "truncated envelope: 0 bytes, the header needs 8"),
        (MAGIC[:2], TruncatedEnvelope, "truncated envelope: 2 bytes, the header needs 8"),
        (MAGIC + b"\x00\x08", TruncatedEnvelope, "truncated envelope: 6 bytes, the header needs 8"),
        (header(version=1), UnknownVersion, "unknown envelope version 1, only version 0 is supported"),
        (header(version=0xFF), UnknownVersion, "unknown envelope version 255"),
        (header(header_len=12), BadHeaderLength, "bad envelope header length 12: must be 8 with the CRC flag clear"),
        (header(header_len=0), BadHeaderLength, "bad envelope header length 0: must be 8 with the CRC flag clear"),
        (header(header_len=9), BadHeaderLength, "bad envelope header length 9: must be 8 with the CRC flag clear"),
        (
            header(header_len=8, flags=1) + bytes(8),
            BadHeaderLength,
            "bad envelope header length 8: must be 12 with the CRC flag set",
        ),
        (
            header(header_len=255, flags=1),
            BadHeaderLength,
            "bad envelope header length 255: must be 12 with the CRC flag set",
        ),
        (
            header(header_len=12, flags=1) + b"\xe3\x06",
            TruncatedEnvelope,
            "truncated envelope: 10 bytes, the header with its CRC-32C needs 12",
        ),
        (header(msg_type=15), UnknownMessageType, "unknown envelope message type 15, known types are 0..14"),
        (header(msg_type=255), UnknownMessageType, "unknown envelope message type 255"),
        (
            header(header_len=12, flags=1) + bytes.fromhex("E3069283") + b"123456780",
            CrcMismatch,
            "envelope CRC-32C mismatch: header says 0xe3069283, the 9-byte payload has 0x",
        ),
        (
            header(header_len=12, flags=1) + bytes.fromhex("E3069284") + CHECK_PAYLOAD,
            CrcMismatch,
            "envelope CRC-32C mismatch: header says 0xe3069284, the 9-byte payload has 0xe3069283",
        ),
        (
            header(header_len=12, flags=1) + bytes(4) + b"x",
            CrcMismatch,
            "envelope CRC-32C mismatch: header says 0x00000000, the 1-byte payload has 0x",
        ),
    ],
)
def test_decode_errors(data: bytes, error: type[EnvelopeError], message: str) -> None:
    with pytest.raises(error) as info:
        decode_envelope(data)
    assert message in str(info.value)
    assert isinstance(info.value, EnvelopeError)
    assert isinstance(info.value, ValueError)
    # The server's path never raises: anything that is not a valid envelope is a plain value.
    assert decode_publish_message(data) is None


def test_empty_payload_with_zero_crc_is_valid() -> None:
    # CRC-32C of nothing is 0, so a zero CRC over an empty payload is correct.
    assert decode_envelope(header(header_len=12, flags=1) + bytes(4)) == (MsgType.PUBLISH, memoryview(b""))


def test_decode_ack_rejects_other_types() -> None:
    with pytest.raises(UnexpectedMessageType, match=r"expected an Ack envelope \(type 1\), got type 0 \(PUBLISH\)"):
        decode_ack(encode_publish_message(full_message()))


def test_decode_ack_rejects_undecodable_payload() -> None:
    with pytest.raises(BadPayload, match=r"Ack envelope payload \(3 bytes\) is not a valid Ack"):
        decode_ack(encode_envelope(MsgType.ACK, b"\xff\xff\xff"))


def test_decode_ack_reports_header_problems() -> None:
    with pytest.raises(BadMagic):
        decode_ack(b"not an ack")
    data = bytearray(encode_ack(full_ack(), crc=True))
    data[-1] ^= 0x01
    with pytest.raises(CrcMismatch):
        decode_ack(data)


# --- plain and hostile payloads on the server's path ----------------------


@pytest.mark.parametrize(
    "data",
    [b"", b"hello", b'{"order": 1}', MAGIC[:3], b"\x00" * 64, "caf\u00e9".encode(), bytes(range(256))],
)
def test_plain_payload_is_not_an_envelope(data: bytes) -> None:
    assert decode_publish_message(data) is None


def test_magic_followed_by_garbage() -> None:
    data = MAGIC + b"garbage that is not a header"
    # A strict decoder names the problem ...
    with pytest.raises(UnknownVersion, match="unknown envelope version 103"):
        decode_envelope(data)
    # ... while the server, like Liftbridge, stores such a payload as a plain value.
    assert decode_publish_message(data) is None


def test_valid_header_with_undecodable_message_is_plain() -> None:
    data = encode_envelope(MsgType.PUBLISH, b"\xff\xff\xff")  # a truncated varint tag
    assert bytes(decode_envelope(data)[1]) == b"\xff\xff\xff"  # the envelope itself is fine
    assert decode_publish_message(data) is None


def test_invalid_utf8_in_string_field_is_plain() -> None:
    # Message.ackInbox (field 10, string) holding invalid UTF-8.
    data = encode_envelope(MsgType.PUBLISH, b"\x52\x02\xc3\x28")
    assert decode_publish_message(data) is None
    # Ack.stream (field 1, string) likewise: a BadPayload, whichever protobuf backend runs.
    with pytest.raises(BadPayload):
        decode_ack(encode_envelope(MsgType.ACK, b"\x0a\x02\xc3\x28"))


def test_other_envelope_types_are_plain_for_publish() -> None:
    assert decode_publish_message(encode_ack(full_ack())) is None
    assert decode_publish_message(encode_envelope(MsgType.REPLICATION_REQUEST, b"")) is None


def test_corrupt_crc_publish_is_plain() -> None:
    data = bytearray(encode_publish_message(full_message(), crc=True))
    data[-1] ^= 0x80
    assert decode_publish_message(data) is None


def test_empty_publish_message_decodes() -> None:
    assert decode_publish_message(encode_publish_message(api_pb2.Message())) == api_pb2.Message()


# --- prefixes and fuzzing -------------------------------------------------


@pytest.mark.parametrize("crc", [False, True])
def test_every_prefix(crc: bool) -> None:
    message = full_message()
    encoded = encode_publish_message(message, crc=crc)
    payload = message.SerializeToString()
    header_len = HEADER_LEN_CRC if crc else HEADER_LEN
    for n in range(len(encoded) + 1):
        prefix = encoded[:n]
        if n < header_len:
            with pytest.raises(EnvelopeError):
                decode_envelope(prefix)
            assert decode_publish_message(prefix) is None
        elif crc and n < len(encoded):
            # The CRC is what detects a cut payload ...
            with pytest.raises(CrcMismatch):
                decode_envelope(prefix)
            assert decode_publish_message(prefix) is None
        elif not crc:
            # ... without it the envelope has no length (NATS frames the message), so a cut
            # payload is still a valid envelope; only the protobuf decode may notice.
            assert bytes(decode_envelope(prefix)[1]) == payload[: n - header_len]
            result = decode_publish_message(prefix)
            assert result is None or isinstance(result, api_pb2.Message)
    assert decode_publish_message(encoded) == message


@given(st.binary(max_size=64))
def test_arbitrary_bytes_only_raise_envelope_errors(data: bytes) -> None:
    for candidate in (data, MAGIC + data, header() + data, header(header_len=12, flags=1) + data):
        with contextlib.suppress(EnvelopeError):
            decode_envelope(candidate)
        result = decode_publish_message(candidate)
        assert result is None or isinstance(result, api_pb2.Message)
        with contextlib.suppress(EnvelopeError):
            decode_ack(candidate)


@given(
    st.one_of(
        st.integers(-(2**63), 2**63 - 1),
        st.sampled_from([0, 127, 128, 2**14 - 1, 2**14, 2**21 - 1, 2**21, 2**28 - 1, 2**28]),
    )
)
def test_varint_is_protobuf_int64_encoding(n: int) -> None:
    from google.protobuf.internal.encoder import _VarintBytes  # type: ignore[attr-defined]  # private, not in the stubs

    from liftlog.api.stored import varint

    assert varint(n) == _VarintBytes(n % 2**64)
