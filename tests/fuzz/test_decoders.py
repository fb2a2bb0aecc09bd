"""Fuzzing the decoders of bytes that come from outside the process: envelopes, stored fields, Raft, cluster auth.

Every decoder is held to two properties (the other ``test_*_decoders``
modules cover storage, the control and replication protocols, and the
network entry points the same way):

1. random bytes: it returns a value or raises its documented error class,
   never anything else (no IndexError, struct.error, KeyError, a bare
   UnicodeDecodeError, RecursionError, ...) and never hangs;
2. mutated valid encodings (made by the module's own encoder from random
   fields, then a byte flipped, the end cut off, bytes inserted, a slice
   duplicated or a length overwritten; behind a checksum, the checksum is
   then recomputed so the damage reaches the parser): the same, and a
   value it returns is the same on a second decode (deterministic).

Random bytes mostly fail the first check a decoder makes; mutated valid
encodings get past it and reach the fields behind. LIFTLOG_FUZZ_EXAMPLES
sets the examples per property for a longer soak (``tests/fuzz/common.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import crc32c
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from tests.fuzz.common import BINARY, decodes_or_refuses, fuzz_settings, mutate, mutated, names
from tests.raft import test_codec as raft_strategies

from liftlog.api import api_pb2
from liftlog.api._gen.batches_pb2 import RecordBatchEnvelope
from liftlog.api.batch_envelope import decode_record_batch, encode_record_batch
from liftlog.api.envelope import (
    EnvelopeError,
    MsgType,
    decode_ack,
    decode_envelope,
    decode_header,
    decode_publish_message,
    encode_ack,
    encode_envelope,
    encode_publish_message,
)
from liftlog.api.stored import StoredFields, decode_fields, encode_fields
from liftlog.raft import ConfChange, ConfChangeOp, HardState
from liftlog.raft.codec import (
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
from liftlog.security.cluster_auth import AuthError, ClusterAuth, ReplayGuard

U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)

# -- liftlog.api.envelope -------------------------------------------------------------

messages = st.builds(
    api_pb2.Message,
    offset=I64,
    key=st.binary(max_size=16),
    value=st.binary(max_size=64),
    headers=st.dictionaries(names, st.binary(max_size=8), max_size=3),
    ackInbox=names,
    correlationId=names,
    ackPolicy=st.integers(0, 2),
    subject=names,
)
acks = st.builds(
    api_pb2.Ack,
    stream=names,
    partitionSubject=names,
    msgSubject=names,
    offset=I64,
    ackInbox=names,
    correlationId=names,
    ackPolicy=st.integers(0, 2),
    receptionTimestamp=I64,
    ackError=st.integers(0, 4),
)
publish_envelopes = st.builds(encode_publish_message, messages, st.booleans())
ack_envelopes = st.builds(encode_ack, acks, st.booleans())
any_envelopes = st.builds(encode_envelope, st.sampled_from(MsgType), st.binary(max_size=64), st.booleans())

ENVELOPE_DECODERS: list[tuple[Callable[[bytes], object], tuple[type[Exception], ...]]] = [
    (decode_header, (EnvelopeError,)),
    (decode_envelope, (EnvelopeError,)),
    (decode_publish_message, ()),  # never raises: anything else is a plain value
    (decode_ack, (EnvelopeError,)),
]
ENVELOPE_IDS = ["decode_header", "decode_envelope", "decode_publish_message", "decode_ack"]


@pytest.mark.parametrize(("decode", "errors"), ENVELOPE_DECODERS, ids=ENVELOPE_IDS)
@fuzz_settings(150)
@given(data=BINARY)
@example(data=b"\xb9\x0e\x43\xb4")  # the magic number alone
@example(data=b"\xb9\x0e\x43\xb4\x00\x0c\x01\x00\x00\x00")  # a CRC header cut short
def test_envelope_decoders_on_random_bytes(
    decode: Callable[[bytes], object], errors: tuple[type[Exception], ...], data: bytes
) -> None:
    """Whatever a NATS publisher sends, the envelope decoders answer or raise EnvelopeError."""
    decodes_or_refuses(decode, data, errors)
    decodes_or_refuses(decode, b"\xb9\x0e\x43\xb4" + data, errors)  # past the magic number check


@pytest.mark.parametrize(("decode", "errors"), ENVELOPE_DECODERS, ids=ENVELOPE_IDS)
@fuzz_settings(150)
@given(data=mutated(publish_envelopes | ack_envelopes | any_envelopes))
def test_envelope_decoders_on_mutated_envelopes(
    decode: Callable[[bytes], object], errors: tuple[type[Exception], ...], data: bytes
) -> None:
    """Damaged envelopes of every type, with and without a CRC."""
    decodes_or_refuses(decode, data, errors)


def _reseal_envelope(data: bytes) -> bytes:
    """Recompute the CRC of a CRC-flagged envelope, so a damaged payload reaches the protobuf parser."""
    if len(data) >= 12 and data[6] & 1:
        return data[:8] + crc32c.crc32c(data[12:]).to_bytes(4, "big") + data[12:]
    return data


@fuzz_settings(150)
@given(
    publish=mutated(st.builds(encode_publish_message, messages, st.just(True)), _reseal_envelope),
    ack=mutated(st.builds(encode_ack, acks, st.just(True)), _reseal_envelope),
)
def test_envelope_payloads_damaged_behind_a_valid_crc(publish: bytes, ack: bytes) -> None:
    """A corrupt payload behind a good CRC: the protobuf parser's errors become None or BadPayload."""
    message = decodes_or_refuses(decode_publish_message, publish, ())
    assert message is None or isinstance(message, api_pb2.Message)
    decoded = decodes_or_refuses(decode_ack, ack, EnvelopeError)
    assert decoded is None or isinstance(decoded, api_pb2.Ack)


# -- liftlog.api.batch_envelope -------------------------------------------------------

batch_envelopes = st.builds(
    RecordBatchEnvelope,
    records=st.binary(max_size=64),
    count=I32,
    ackInbox=names,
    correlationId=names,
    ackPolicy=st.integers(0, 2),
    expectedOffset=I64,
).map(encode_record_batch)


def _reseal_batch_envelope(data: bytes) -> bytes:
    if len(data) < 12:
        return data
    return data[:8] + crc32c.crc32c(data[12:]).to_bytes(4, "big") + data[12:]


@fuzz_settings(200)
@given(data=BINARY)
@example(data=b"\xb9\x0e\x4c\x4c")  # the magic number alone
def test_record_batch_envelope_on_random_bytes(data: bytes) -> None:
    """decode_record_batch never raises: what is not a batch envelope is stored as a plain value."""
    decoded = decodes_or_refuses(decode_record_batch, data, ())
    assert decoded is None or isinstance(decoded, RecordBatchEnvelope)
    decodes_or_refuses(decode_record_batch, b"\xb9\x0e\x4c\x4c\x01\x00\x00\x00" + data, ())


@fuzz_settings(200)
@given(plain=mutated(batch_envelopes), resealed=mutated(batch_envelopes, _reseal_batch_envelope))
def test_record_batch_envelope_on_mutated_envelopes(plain: bytes, resealed: bytes) -> None:
    """Damage caught by the CRC, and damage behind a recomputed CRC that the protobuf parser meets."""
    decodes_or_refuses(decode_record_batch, plain, ())
    decodes_or_refuses(decode_record_batch, resealed, ())


# -- liftlog.api.stored ---------------------------------------------------------------

stored_fields = st.builds(encode_fields, names, names, names, names, st.integers(0, 2**62))


@fuzz_settings(200)
@given(data=BINARY)
@example(data=b"\x3a\x01\xff")  # a subject that is not UTF-8
def test_stored_fields_on_random_bytes(data: bytes) -> None:
    """A record's \\x00fields header comes from disk or a leader: ValueError names a malformed one."""
    fields = decodes_or_refuses(decode_fields, data, ValueError)
    assert fields is None or isinstance(fields, StoredFields)


@fuzz_settings(200)
@given(data=mutated(stored_fields))
def test_stored_fields_on_mutated_encodings(data: bytes) -> None:
    """Damaged \\x00fields values, as encode_fields writes them."""
    decodes_or_refuses(decode_fields, data, ValueError)


# -- liftlog.raft.codec and ConfChange ------------------------------------------------

# The raft codec's own round-trip strategies, mutated here.
entries, snapshots, raft_messages = raft_strategies.entries, raft_strategies.snapshots, raft_strategies.messages
hard_states = st.builds(HardState, U64, st.none() | names, U64)
RAFT_DECODERS: list[tuple[Callable[[bytes], object], st.SearchStrategy[bytes]]] = [
    (decode_message, raft_messages.map(encode_message)),
    (decode_entry, entries.map(encode_entry)),
    (decode_hard_state, hard_states.map(encode_hard_state)),
    (decode_snapshot, snapshots.map(encode_snapshot)),
]
RAFT_IDS = ["decode_message", "decode_entry", "decode_hard_state", "decode_snapshot"]


@pytest.mark.parametrize("decode", [d for d, _ in RAFT_DECODERS], ids=RAFT_IDS)
@fuzz_settings(150)
@given(data=BINARY)
@example(data=b"\x01\x01\x00" + bytes(48) + b"\xff\xff\xff\xff")  # an append claiming 2^32-1 entries
def test_raft_decoders_on_random_bytes(decode: Callable[[bytes], object], data: bytes) -> None:
    """Raft messages arrive over NATS and state from disk: CodecError for anything malformed."""
    decodes_or_refuses(decode, data, CodecError)
    decodes_or_refuses(decode, b"\x01" + data, CodecError)  # past the version byte


@pytest.mark.parametrize(("decode", "valid"), RAFT_DECODERS, ids=RAFT_IDS)
@fuzz_settings(150)
@given(data=st.data())
def test_raft_decoders_on_mutated_encodings(
    decode: Callable[[bytes], object], valid: st.SearchStrategy[bytes], data: st.DataObject
) -> None:
    """Damaged encodings of messages, entries, hard states and snapshots."""
    decodes_or_refuses(decode, data.draw(mutated(valid)), CodecError)


conf_changes = st.builds(ConfChange, st.sampled_from(ConfChangeOp), names.filter(bool)).map(ConfChange.encode)


@fuzz_settings(200)
@given(data=BINARY)
@example(data=b"add:\xff")  # a node id that is not UTF-8
@example(data=b"move:n1")  # an unknown operation
def test_conf_change_on_random_bytes(data: bytes) -> None:
    """A CONF_CHANGE entry's data comes from the leader: ValueError naming the problem, nothing else."""
    change = decodes_or_refuses(ConfChange.decode, data, ValueError)
    assert change is None or change.encode() == data


@fuzz_settings(200)
@given(data=mutated(conf_changes))
def test_conf_change_on_mutated_encodings(data: bytes) -> None:
    """Damaged conf changes; one that still decodes encodes back to the same bytes."""
    change = decodes_or_refuses(ConfChange.decode, data, ValueError)
    assert change is None or change.encode() == data


# -- liftlog.security.cluster_auth ----------------------------------------------------

KEY = b"k" * 32
NOW = 1_800_000_000 * 10**9
SUBJECT = "liftlog.raft.n1"


def _auth() -> ClusterAuth:
    return ClusterAuth(KEY, boot=b"bootbyte", started=0, max_age=60 * 10**9)


@fuzz_settings(200)
@given(data=BINARY, tail=st.booleans())
def test_cluster_auth_refuses_random_bytes(data: bytes, tail: bool) -> None:
    """No random message opens: AuthError, whatever its trailer looks like."""
    if tail:
        data += b"LLA1"  # the trailer's magic: the stamp and the MAC are checked
    with pytest.raises(AuthError) as caught:
        _auth().open(SUBJECT, data, NOW, ReplayGuard())
    # The timestamp is checked before the MAC (junk costs no HMAC): a damaged stamp reads as out of the window.
    assert caught.value.reason in ("unsigned", "forged", "stale", "future", "early")


@fuzz_settings(200)
@given(payload=st.binary(max_size=200), subject=names, data=st.data())
def test_cluster_auth_refuses_every_mutated_sealed_message(payload: bytes, subject: str, data: st.DataObject) -> None:
    """A sealed message opens only as it was sealed: any change to payload or trailer is refused."""
    sealed = _auth().seal(subject, payload, NOW)
    damaged = mutate(data.draw, sealed)
    if damaged == sealed:
        assert _auth().open(subject, damaged, NOW, ReplayGuard()) == payload
        return
    with pytest.raises(AuthError) as caught:
        _auth().open(subject, damaged, NOW, ReplayGuard())
    # The timestamp is checked before the MAC (junk costs no HMAC): a damaged stamp reads as out of the window.
    assert caught.value.reason in ("unsigned", "forged", "stale", "future", "early")
    assert _auth().open(subject, sealed, NOW, ReplayGuard()) == payload  # the original still opens
