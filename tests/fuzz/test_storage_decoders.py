"""Fuzzing the readers of stored record batches: the storage codec, checkpoints, and the client's batch decoder.

The two properties of ``test_decoders``: random bytes, and mutated valid
encodings, are decoded or refused with the documented error (InvalidBatch,
CorruptCheckpoint, CorruptDataError), deterministically. Batches carry a
CRC, so mutated batches are also checked with the CRC recomputed: what a
buggy or hostile leader, server or publisher could send, which the CRC
does not stop.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import example, given
from hypothesis import strategies as st
from tests.fuzz.common import BINARY, decodes_or_refuses, fuzz_settings, mutate, mutated, names

from liftlog.api import api_pb2
from liftlog.api.stored import H_ACK_INBOX, H_ACK_POLICY, H_FIELDS, H_REPLY, H_SUBJECT, encode_fields
from liftlog.api.subscribe_batches import END_HEADER, batches_message
from liftlog.client import CorruptDataError, Message
from liftlog.client.batches import Columns, decode_batches
from liftlog.client.subscription import Subscription
from liftlog.recordformat import RECORD_HEADER, RECORD_OVERHEAD, BatchHeader
from liftlog.storage import InvalidBatch, NewRecord, Record
from liftlog.storage.checkpoint import CorruptCheckpoint, read_checkpoint, write_checkpoint
from liftlog.storage.encryption import BatchCipher, EncryptionError, MasterKey
from liftlog.storage.records import (
    check_records,
    decode_new_records,
    decode_records,
    encode_batch,
    encode_empty_batch,
    encode_headers,
    encode_records,
    iter_batch_headers,
    parse_batch_header,
)

# -- valid input ----------------------------------------------------------------------

_header_names = st.sampled_from(["h", "x-trace", "ünï", H_SUBJECT, H_REPLY, H_ACK_INBOX, H_ACK_POLICY]) | names


@st.composite
def records(draw: st.DrawFn) -> NewRecord:
    """A record as the server stores one: user headers, the stored fields, or the older one-header-per-field."""
    headers = draw(st.dictionaries(_header_names, st.binary(max_size=12), max_size=3))
    if draw(st.booleans()):
        headers[H_FIELDS] = encode_fields(draw(names), draw(names), draw(names), draw(names), draw(st.integers(0, 2)))
    key = draw(st.none() | st.binary(max_size=12))
    return NewRecord(draw(st.binary(max_size=40)), key, headers, draw(st.none() | st.integers(-(2**63), 2**63 - 1)))


record_lists = st.lists(records(), min_size=1, max_size=5)


@st.composite
def batches(draw: st.DrawFn) -> bytes:
    """One to three stored batches, as a segment or a fetch holds them (an empty filler batch among them)."""
    out = b""
    offset = draw(st.integers(0, 2**40))
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.integers(0, 4)) == 0:
            delta = draw(st.integers(0, 5))
            out += encode_empty_batch(offset, delta, draw(st.integers(0, 9)))
            offset += delta + 1
            continue
        batch = draw(record_lists)
        out += encode_batch(offset, draw(st.integers(0, 9)), batch, draw(st.integers(0, 2**62)))
        offset += len(batch)
    return out


def reseal(data: bytes) -> bytes:
    """Recompute the CRC of every batch whose length still fits the buffer: damage the CRC would hide."""
    buf = bytearray(data)
    pos = 0
    while len(buf) - pos >= 47:
        (length,) = struct.unpack_from(">i", buf, pos + 8)
        end = pos + 12 + length
        if length < 35 or end > len(buf):
            break
        struct.pack_into(">I", buf, pos + 17, crc32c(bytes(buf[pos + 21 : end])))
        pos = end
    return bytes(buf)


def crafted_batch(records: bytes, count: int, last_delta: int) -> bytes:
    """A batch header (docs/storage-format.md) with its CRC over ``records``, which may be anything."""
    tail = struct.pack(">Hiqqi", 0, last_delta, 0, 0, count) + records
    return struct.pack(">qiiBI", 0, 35 + len(records), 0, 1, crc32c(tail)) + tail


#: One record of length -4 (the cursor does not move) in a batch that claims 10^8 records.
STUCK_BATCH = crafted_batch(RECORD_HEADER.pack(-4, 0, 0, -1, 0, 0), 10**8, 10**8 - 1)

#: A record with one header whose name is not UTF-8 (b"\xff"), alone and in a batch.
_BAD_NAME = struct.pack(">H", 1) + b"\xff" + struct.pack(">i", 1) + b"v"
BAD_NAME_RECORDS = RECORD_HEADER.pack(22 + 1 + len(_BAD_NAME), 0, 0, -1, 1, 1) + b"x" + _BAD_NAME
BAD_NAME_BATCH = crafted_batch(BAD_NAME_RECORDS, 1, 0)


#: Values for a corrupted field: a record length that does not move on (-4) or goes back, one too small for a
#: record (22 at least), the extremes; counts of nothing or of far more records than there are.
_LENGTHS = (-4, -4, -1, 0, 21, 2**31 - 1, -(2**31))
_SIZES = (-(2**31), -2, -1, 0, 1, 2**31 - 1)
_COUNTS = (0, 100_000, 100_000)


@st.composite
def crafted_batches(draw: st.DrawFn) -> bytes:
    """Valid records behind a valid CRC, with the record count, a record's field or both replaced by an
    edge value: byte mutations rarely change two fields so that they agree (a large count and a record
    length that does not move on). Counts stay at 100,000 or below, so a decoder that does not advance
    fails the size bound instead of hanging."""
    one_header = st.dictionaries(_header_names, st.binary(max_size=8), max_size=1).map(encode_headers)
    records = draw(st.lists(st.tuples(st.binary(max_size=8), st.binary(max_size=8), one_header), max_size=4))
    fields = [
        [22 + len(key) + len(value) + len(headers), len(key), len(value), 1 if headers else 0]
        for key, value, headers in records
    ]
    count = draw(st.sampled_from(_COUNTS)) if draw(st.booleans()) else len(records)
    if records and draw(st.integers(0, 3)) != 0:
        i = draw(st.integers(0, len(records) - 1))
        if draw(st.booleans()):
            fields[i][0] = draw(st.sampled_from(_LENGTHS))
        else:
            fields[i][draw(st.integers(1, 3))] = draw(st.sampled_from(_SIZES))
    body = b""
    for delta, ((key, value, headers), (length, key_len, value_len, n_headers)) in enumerate(
        zip(records, fields, strict=True)
    ):
        body += RECORD_HEADER.pack(length, delta, 0, key_len, value_len, n_headers & 0xFFFF) + key + value + headers
    return crafted_batch(body, count, max(count - 1, 0))


# -- liftlog.storage.records ----------------------------------------------------------


def bounded(decoded: int, data: bytes) -> None:
    """A record takes 26 bytes at least: a decoder that returns more did not move on (and could hang)."""
    assert decoded <= len(data) // RECORD_OVERHEAD, f"{decoded} records from {len(data)} bytes"


def decode_stored(buf: bytes, min_offset: int = 0, max_offset: int | None = None) -> list[Record]:
    """What a log read does with a batch: its header, then its records."""
    records = decode_records(buf, parse_batch_header(buf), min_offset, max_offset)
    bounded(len(records), buf)
    return records


def test_the_crafted_batches_are_what_they_claim() -> None:
    """The regression examples below reach the record loop: their headers are valid."""
    stuck = parse_batch_header(STUCK_BATCH)
    assert (stuck.record_count, stuck.size) == (10**8, len(STUCK_BATCH))
    assert parse_batch_header(BAD_NAME_BATCH).record_count == 1


@fuzz_settings(200)
@given(data=BINARY, min_offset=st.integers(-1, 5), max_offset=st.none() | st.integers(0, 2**63))
@example(data=STUCK_BATCH, min_offset=0, max_offset=None)  # hung, building 10^8 records
@example(data=BAD_NAME_BATCH, min_offset=0, max_offset=None)  # raised UnicodeDecodeError
def test_stored_batches_on_random_bytes(data: bytes, min_offset: int, max_offset: int | None) -> None:
    """Segments are read back from disk and leaders send batches: InvalidBatch for what is not one."""
    header = decodes_or_refuses(parse_batch_header, data, InvalidBatch)
    if header is not None:
        assert isinstance(header, BatchHeader)
        decoded = decodes_or_refuses(lambda d: decode_stored(d, min_offset, max_offset), data, InvalidBatch)
        assert decoded is None or len(decoded) <= header.record_count


@fuzz_settings(200)
@given(plain=mutated(batches()), resealed=mutated(batches(), reseal), crafted=crafted_batches())
def test_stored_batches_on_mutated_batches(plain: bytes, resealed: bytes, crafted: bytes) -> None:
    """Damaged batches, the CRC left as it was or recomputed over the damage, and crafted record headers."""
    for data in (plain, resealed, crafted):
        decodes_or_refuses(decode_stored, data, InvalidBatch)


_CIPHER = BatchCipher(MasterKey(b"f" * 32))


@st.composite
def encrypted_batches(draw: st.DrawFn) -> bytes:
    """Batches of an encrypted stream as a segment stores them and a follower receives them."""
    data = draw(batches())
    return b"".join(
        _CIPHER.encrypt(data, h) if h.record_count else data[h.position : h.position + h.size]
        for h in iter_batch_headers(data)
    )


def decrypt_then_decode(data: bytes) -> list[Record]:
    """What a read of an encrypted log does: decrypt every batch, then decode its records."""
    clear = _CIPHER.decrypt_batches(data)
    out: list[Record] = []
    for h in iter_batch_headers(clear):
        out += decode_stored(clear[h.position : h.position + h.size])
    return out


@fuzz_settings(200)
@given(data=BINARY, plain=mutated(encrypted_batches()), resealed=mutated(encrypted_batches(), reseal))
def test_encrypted_batches_on_random_and_mutated_bytes(data: bytes, plain: bytes, resealed: bytes) -> None:
    """Altered ciphertext, envelopes and headers (the CRC recomputed over the damage): refused, never garbage."""
    for case in (data, plain, resealed):
        decodes_or_refuses(decrypt_then_decode, case, (InvalidBatch, EncryptionError))


def _check_then_decode(data: bytes, count: int) -> list[NewRecord] | None:
    """check_records and decode_new_records agree: records one accepts, the other decodes, all of them."""
    info = decodes_or_refuses(lambda d: check_records(d, count), data, InvalidBatch)
    decoded = decodes_or_refuses(lambda d: decode_new_records(d, count), data, InvalidBatch)
    if info is not None:
        assert decoded is not None, "check_records accepted records decode_new_records refuses"
        assert len(decoded) == count == len(info.positions)
    return decoded


@fuzz_settings(200)
@given(data=BINARY, count=st.integers(-1, 40))
@example(data=BAD_NAME_RECORDS, count=1)  # accepted by check_records, refused by decode_new_records
def test_published_records_on_random_bytes(data: bytes, count: int) -> None:
    """A batched publish's records come from any client: InvalidBatch for what is not ``count`` records."""
    _check_then_decode(data, count)


@fuzz_settings(200)
@given(valid=record_lists, data=st.data())
def test_published_records_on_mutated_encodings(valid: list[NewRecord], data: st.DataObject) -> None:
    """Damaged encode_records output, with the right count, one more and one less."""
    damaged = mutate(data.draw, encode_records(valid))
    count = len(valid) + data.draw(st.sampled_from([0, 0, 0, 1, -1]))
    _check_then_decode(damaged, count)


# -- liftlog.storage.checkpoint -------------------------------------------------------

KIND = "high-watermark"


@pytest.fixture(scope="module")
def checkpoint_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file, rewritten by every example (a function-scoped tmp_path would be shared by examples anyway)."""
    return tmp_path_factory.mktemp("checkpoints") / "checkpoint"


def read_as_checkpoint(path: Path, data: bytes, arity: int) -> list[tuple[int, ...]] | None:
    path.write_bytes(data)
    entries = decodes_or_refuses(lambda _: read_checkpoint(path, KIND, arity), data, CorruptCheckpoint)
    if entries is not None:
        assert all(len(e) == arity for e in entries)
    return entries


def reseal_checkpoint(data: bytes) -> bytes:
    """Rewrite the CRC line over the (damaged) lines above it, so the damage reaches the parser."""
    body, sep, _ = data.rstrip(b"\n").rpartition(b"\n")
    body += b"\n"
    return body + f"crc32c {crc32c(body):08x}\n".encode() if sep else data


@fuzz_settings(150)
@given(data=BINARY, arity=st.integers(1, 2))
@example(data=reseal_checkpoint(b"liftlog-checkpoint high-watermark v1\n1\n" + b"9" * 5000 + b"\nx\n"), arity=1)
def test_checkpoints_on_random_bytes(checkpoint_path: Path, data: bytes, arity: int) -> None:
    """A checkpoint file torn or damaged on disk: CorruptCheckpoint, which makes the log rebuild."""
    read_as_checkpoint(checkpoint_path, data, arity)
    read_as_checkpoint(checkpoint_path, reseal_checkpoint(b"liftlog-checkpoint high-watermark v1\n" + data), arity)


@fuzz_settings(150)
@given(
    entries=st.lists(st.tuples(st.integers(-(2**70), 2**70), st.integers(0, 2**63)), max_size=4),
    arity=st.integers(1, 2),
    resealed=st.booleans(),
    data=st.data(),
)
def test_checkpoints_on_mutated_files(
    checkpoint_path: Path, entries: list[tuple[int, int]], arity: int, resealed: bool, data: st.DataObject
) -> None:
    """Damaged checkpoint files as write_checkpoint writes them, the CRC line recomputed or not."""
    rows = [e[:arity] for e in entries]
    write_checkpoint(checkpoint_path, KIND, rows)
    damaged = mutate(data.draw, checkpoint_path.read_bytes())
    read = read_as_checkpoint(checkpoint_path, reseal_checkpoint(damaged) if resealed else damaged, arity)
    if not resealed and read is not None:  # past the CRC unchanged: it was not damaged where it matters
        assert read == rows


# -- liftlog.client.batches and the batched Subscribe ---------------------------------


def client_decode(data: bytes, start: int, limit: int, headers: bool, fields: bool) -> tuple[Columns, int]:
    cols, next_offset = decode_batches(data, start, limit, "orders.new", headers=headers, fields=fields)
    bounded(len(cols), data)
    return cols, next_offset


@fuzz_settings(150)
@given(
    data=BINARY,
    start=st.integers(-1, 10),
    limit=st.integers(0, 2**63),
    headers=st.booleans(),
    fields=st.booleans(),
)
@example(data=STUCK_BATCH, start=0, limit=2**62, headers=False, fields=False)  # hung, 10^8 records of nothing
@example(data=BAD_NAME_BATCH, start=0, limit=2**62, headers=True, fields=False)
def test_fetched_batches_on_random_bytes(data: bytes, start: int, limit: int, headers: bool, fields: bool) -> None:
    """What Batches/Fetch returns comes from a server: CorruptDataError for what is not whole batches."""
    decodes_or_refuses(lambda d: client_decode(d, start, limit, headers, fields), data, CorruptDataError)


@fuzz_settings(150)
@given(
    plain=mutated(batches()),
    resealed=mutated(batches(), reseal),
    crafted=crafted_batches(),
    headers=st.booleans(),
    fields=st.booleans(),
)
def test_fetched_batches_on_mutated_batches(
    plain: bytes, resealed: bytes, crafted: bytes, headers: bool, fields: bool
) -> None:
    """Damaged fetched batches (the CRC recomputed or not) and crafted ones, decoded with every flag."""
    for data in (plain, resealed, crafted):
        decodes_or_refuses(lambda d: client_decode(d, 0, 2**62, headers, fields), data, CorruptDataError)


def arrow_decode(data: bytes, start: int, limit: int) -> object:
    """The Spark source's column-wise decoder: a record batch bounded like the per-record decoder's, or None."""
    from liftlog.spark.arrow_batches import arrow_batch
    from liftlog.spark.reading import arrow_schema

    got = arrow_batch(data, start, limit, arrow_schema(False), "orders", 1, "orders.new")
    if got is not None and got[0] is not None:
        bounded(got[0].num_rows, data)
        got[0].validate(full=True)
    return got


@fuzz_settings(150)
@given(data=BINARY, start=st.integers(0, 10), limit=st.integers(0, 2**63 - 1))
@example(data=STUCK_BATCH, start=0, limit=2**62)
@example(data=BAD_NAME_BATCH, start=0, limit=2**62)
def test_arrow_batches_on_random_bytes(data: bytes, start: int, limit: int) -> None:
    """The column-wise decoder refuses what is not whole batches with CorruptDataError, like decode_batches."""
    decodes_or_refuses(lambda d: arrow_decode(d, start, limit), data, CorruptDataError)


@fuzz_settings(150)
@given(plain=mutated(batches()), resealed=mutated(batches(), reseal), crafted=crafted_batches())
def test_arrow_batches_on_mutated_batches(plain: bytes, resealed: bytes, crafted: bytes) -> None:
    """Damaged and crafted batches behind a valid CRC: a record batch, None (per-record decoding), or a refusal."""
    for data in (plain, resealed, crafted):
        decodes_or_refuses(lambda d: arrow_decode(d, 0, 2**62), data, CorruptDataError)


def _subscription() -> Subscription:
    """A subscription past its set-up message, without a client: only its decoding is used."""
    sub = Subscription.__new__(Subscription)
    sub._request = api_pb2.SubscribeRequest(stream="orders", partition=1)
    sub._call = None
    sub._done = False
    return sub


def subscription_decode(raw: bytes) -> list[Message]:
    """What a batched subscription does with one Subscribe message (parsed by the gRPC layer first)."""
    return _subscription()._decode(api_pb2.Message.FromString(raw))


@fuzz_settings(150)
@given(
    value=BINARY,
    offset=st.integers(-(2**63), 2**63 - 1),
    end=st.binary(max_size=10),
    subject=names,
)
@example(value=STUCK_BATCH, offset=0, end=struct.pack(">q", 2**62), subject="s")
def test_subscribe_batches_on_random_values(value: bytes, offset: int, end: bytes, subject: str) -> None:
    """A batched Subscribe message with any value and end header: CorruptDataError, nothing else."""
    raw = api_pb2.Message(value=value, offset=offset, subject=subject, headers={END_HEADER: end}).SerializeToString()
    out = decodes_or_refuses(subscription_decode, raw, CorruptDataError)
    assert out is None or all(isinstance(m, Message) for m in out)


@fuzz_settings(150)
@given(valid=batches(), start=st.integers(0, 2**40), cut=st.integers(0, 20), resealed=st.booleans(), data=st.data())
def test_subscribe_batches_on_mutated_messages(
    valid: bytes, start: int, cut: int, resealed: bool, data: st.DataObject
) -> None:
    """Damaged batches in a Subscribe message as the server builds it (batches_message)."""
    value = mutate(data.draw, valid)
    if resealed:
        value = reseal(value)
    raw = batches_message("orders", 1, "orders.new", value, start, start + cut)
    decodes_or_refuses(subscription_decode, raw, CorruptDataError)
