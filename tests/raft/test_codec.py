"""The raft wire/disk codec: exact round-trips, and CodecError (nothing else) on bad input."""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from liftlog.raft import ConfChange, ConfChangeOp, Entry, EntryKind, HardState, Message, MessageType, Snapshot
from liftlog.raft.codec import (
    ENTRY_KIND_CODES,
    MESSAGE_TYPE_CODES,
    VERSION,
    CodecError,
    decode_entry,
    decode_hard_state,
    decode_message,
    decode_snapshot,
    encode_entry,
    encode_hard_state,
    encode_message,
    encode_snapshot,
)

U64 = 2**64 - 1
SNAP = Snapshot(index=40, term=7, voters=("n1", "n2", "nœud-3"), data=b"\x00state\xff")
ENTRIES = (
    Entry(7, 41, EntryKind.NOOP),
    Entry(7, 42, EntryKind.CONF_CHANGE, ConfChange(ConfChangeOp.ADD, "n4").encode()),
    Entry(7, 43, EntryKind.NORMAL, b"payload"),
)


def full(mtype: MessageType) -> Message:
    """A message of ``mtype`` with every field away from its default."""
    return Message(
        mtype,
        src="n1",
        dst="nœud-2",
        term=U64,
        log_term=6,
        index=40,
        entries=ENTRIES,
        commit=39,
        reject=True,
        reject_hint=12,
        snapshot=SNAP,
        context=b"ctx\x00",
    )


def test_code_tables_cover_every_enum_member_once() -> None:
    assert set(MESSAGE_TYPE_CODES) == set(MessageType)
    assert len(set(MESSAGE_TYPE_CODES.values())) == len(MessageType)
    assert set(ENTRY_KIND_CODES) == set(EntryKind)
    assert len(set(ENTRY_KIND_CODES.values())) == len(EntryKind)


@pytest.mark.parametrize("mtype", list(MessageType), ids=lambda t: t.value)
def test_every_message_type_round_trips_with_all_fields(mtype: MessageType) -> None:
    m = full(mtype)
    assert decode_message(encode_message(m)) == m
    bare = Message(mtype, "a", "b", 1)
    assert decode_message(encode_message(bare)) == bare


def test_codes_are_stable_on_the_wire() -> None:
    """The bytes are a contract between versions: pin the header of a known message."""
    raw = encode_message(Message(MessageType.VOTE, "a", "b", 3, log_term=2, index=9, context=b"transfer"))
    assert raw[:3] == bytes([VERSION, 5, 0])
    assert struct.unpack_from(">QQQQQ", raw, 3) == (3, 2, 9, 0, 0)
    assert raw[43:] == b"\x00\x01a\x00\x01b\x00\x00\x00\x08transfer\x00\x00\x00\x00"


def test_vote_none_and_empty_vote_are_distinct() -> None:
    none, empty = encode_hard_state(HardState(3, None, 2)), encode_hard_state(HardState(3, "", 2))
    assert none != empty
    assert decode_hard_state(none).vote is None
    assert decode_hard_state(empty).vote == ""


def test_entry_hard_state_and_snapshot_round_trip() -> None:
    for e in ENTRIES:
        assert decode_entry(encode_entry(e)) == e
    for hs in (HardState(), HardState(5, "n2", 4), HardState(U64, "ü", U64)):
        assert decode_hard_state(encode_hard_state(hs)) == hs
    for snap in (SNAP, Snapshot(0, 0, ())):
        assert decode_snapshot(encode_snapshot(snap)) == snap


def test_decoders_accept_memoryview_and_bytearray() -> None:
    raw = encode_message(full(MessageType.APPEND))
    padded = memoryview(b"xx" + raw + b"yy")[2:-2]
    assert decode_message(padded) == full(MessageType.APPEND)
    assert decode_entry(bytearray(encode_entry(ENTRIES[2]))) == ENTRIES[2]
    decoded = decode_message(padded)
    assert type(decoded.context) is bytes and type(decoded.entries[2].data) is bytes


# --- malformed input -----------------------------------------------------------------------

VALID: list[tuple[str, bytes, Callable[[bytes], object]]] = [
    *((f"message-{t.value}", encode_message(full(t)), decode_message) for t in MessageType),
    ("message-bare", encode_message(Message(MessageType.HEARTBEAT, "", "", 0)), decode_message),
    ("entry", encode_entry(ENTRIES[1]), decode_entry),
    ("hard-state", encode_hard_state(HardState(2, "n1", 1)), decode_hard_state),
    ("hard-state-no-vote", encode_hard_state(HardState(2, None, 1)), decode_hard_state),
    ("snapshot", encode_snapshot(SNAP), decode_snapshot),
]


@pytest.mark.parametrize(("raw", "decode"), [(raw, dec) for _, raw, dec in VALID], ids=[n for n, _, _ in VALID])
def test_every_proper_prefix_raises_codec_error(raw: bytes, decode: Callable[[bytes], object]) -> None:
    for n in range(len(raw)):
        with pytest.raises(CodecError):
            decode(raw[:n])


@pytest.mark.parametrize(("raw", "decode"), [(raw, dec) for _, raw, dec in VALID], ids=[n for n, _, _ in VALID])
def test_unknown_version_and_trailing_bytes_are_rejected(raw: bytes, decode: Callable[[bytes], object]) -> None:
    for version in (0, 2, 255):
        with pytest.raises(CodecError, match=f"unknown format version {version} at offset 0"):
            decode(bytes([version]) + raw[1:])
    with pytest.raises(CodecError, match=f"1 trailing bytes at offset {len(raw)}"):
        decode(raw + b"\x00")


def test_bad_codes_flags_and_utf8_name_the_offset() -> None:
    raw = bytearray(encode_message(full(MessageType.APPEND)))
    with pytest.raises(CodecError, match="unknown message type 99 at offset 1"):
        decode_message(bytes(raw[:1]) + b"\x63" + bytes(raw[2:]))
    with pytest.raises(CodecError, match="unknown flags 0x04 at offset 2"):
        decode_message(bytes(raw[:2]) + b"\x04" + bytes(raw[3:]))
    bad_src = bytes(raw[:45]) + b"\xff" + bytes(raw[46:])  # src "n1" starts at 45
    with pytest.raises(CodecError, match="src at offset 45 is not UTF-8"):
        decode_message(bad_src)
    entry = bytearray(encode_entry(ENTRIES[0]))
    entry[17] = 9
    with pytest.raises(CodecError, match="unknown entry kind 9 in the entry at offset 1"):
        decode_entry(bytes(entry))
    hs = bytearray(encode_hard_state(HardState(1, None, 1)))
    hs[17] = 2
    with pytest.raises(CodecError, match="has_vote byte is 2 at offset 17"):
        decode_hard_state(bytes(hs))


def test_a_huge_entry_count_is_refused_without_allocating() -> None:
    raw = encode_message(Message(MessageType.APPEND, "a", "b", 1))
    huge = raw[:-4] + struct.pack(">I", 2**32 - 1)
    with pytest.raises(CodecError, match="4294967295 entries cannot fit"):
        decode_message(huge)


def test_unencodable_values_raise_codec_error() -> None:
    with pytest.raises(CodecError, match="cannot encode entry"):
        encode_entry(Entry(-1, 1))
    with pytest.raises(CodecError, match="cannot encode append message"):
        encode_message(Message(MessageType.APPEND, "a", "b", 2**64))
    with pytest.raises(CodecError, match="src: 65536 bytes"):
        encode_message(Message(MessageType.APPEND, "x" * 65536, "b", 1))
    with pytest.raises(CodecError, match="cannot encode hard state"):
        encode_hard_state(HardState(1, "\ud800", 1))  # a lone surrogate is not UTF-8


# --- properties ------------------------------------------------------------------------------

u64 = st.integers(min_value=0, max_value=U64)
names = st.text(max_size=12)
blobs = st.binary(max_size=40)
entries = st.builds(Entry, u64, u64, st.sampled_from(EntryKind), blobs)
snapshots = st.builds(Snapshot, u64, u64, st.lists(names, max_size=5).map(tuple), blobs)
messages = st.builds(
    Message,
    st.sampled_from(MessageType),
    names,
    names,
    u64,
    log_term=u64,
    index=u64,
    entries=st.lists(entries, max_size=6).map(tuple),
    commit=u64,
    reject=st.booleans(),
    reject_hint=u64,
    snapshot=st.none() | snapshots,
    context=blobs,
)


@given(messages)
def test_messages_round_trip(m: Message) -> None:
    assert decode_message(encode_message(m)) == m


@given(st.builds(HardState, u64, st.none() | names, u64), entries, snapshots)
def test_storage_types_round_trip(hs: HardState, e: Entry, snap: Snapshot) -> None:
    assert decode_hard_state(encode_hard_state(hs)) == hs
    assert decode_entry(encode_entry(e)) == e
    assert decode_snapshot(encode_snapshot(snap)) == snap


def reencode(value: object) -> bytes:
    if isinstance(value, Message):
        return encode_message(value)
    if isinstance(value, Entry):
        return encode_entry(value)
    if isinstance(value, HardState):
        return encode_hard_state(value)
    assert isinstance(value, Snapshot)
    return encode_snapshot(value)


@settings(max_examples=300)
@given(st.binary(max_size=120), st.sampled_from([decode_message, decode_entry, decode_hard_state, decode_snapshot]))
def test_garbage_decodes_canonically_or_raises_codec_error(raw: bytes, decode: Callable[[bytes], object]) -> None:
    try:
        value = decode(b"\x01" + raw)  # a valid version byte, so the garbage reaches the body
    except CodecError:
        return
    assert reencode(value) == b"\x01" + raw  # exactly one encoding per value


@given(messages, st.data())
def test_flipping_a_byte_never_leaks_another_exception(m: Message, data: st.DataObject) -> None:
    raw = bytearray(encode_message(m))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with contextlib.suppress(CodecError):
        decode_message(bytes(raw))


def test_a_64_entry_append_encodes_and_decodes_well_under_a_millisecond() -> None:
    batch = tuple(Entry(9, i, EntryKind.NORMAL, b"v" * 200) for i in range(1000, 1064))
    m = Message(MessageType.APPEND, "n1", "n2", 9, log_term=9, index=999, entries=batch, commit=998)
    raw = encode_message(m)
    assert decode_message(raw) == m
    rounds = 200
    start = time.perf_counter()
    for _ in range(rounds):
        decode_message(encode_message(m))
    per_round = (time.perf_counter() - start) / rounds
    assert per_round < 0.001, f"{per_round * 1e6:.0f} µs per encode+decode"
