"""The batch cipher: encrypted batches round-trip, hide their records, and refuse every wrong key or altered byte."""

from __future__ import annotations

import random
import struct

import pytest
from crc32c import crc32c
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st

from liftlog.recordformat import BATCH_HEADER_SIZE, batch_crc_ok
from liftlog.storage.encryption import (
    ATTR_ENCRYPTED,
    BatchCipher,
    EncryptionError,
    MasterKey,
    MissingMasterKey,
    UndecryptableBatch,
    envelope_of,
    partition_context,
)
from liftlog.storage.records import NewRecord, decode_records, encode_batch, parse_batch_header

KEY_A = MasterKey(b"A" * 32)
KEY_B = MasterKey(b"b" * 16)


def plain_batch(base: int = 100, n: int = 5, secret: bytes = b"card-4111-1111") -> bytes:
    records = [NewRecord(secret + b"-%d" % i, key=b"k%d" % i, headers={"h": b"hv%d" % i}) for i in range(n)]
    return encode_batch(base, 7, records, default_timestamp=1_700_000_000_000_000_000)


def refresh_crc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


def test_an_encrypted_batch_keeps_its_header_hides_its_records_and_decrypts_to_the_same_bytes() -> None:
    cipher = BatchCipher(KEY_A)
    plain = plain_batch()
    sealed = cipher.encrypt(plain)
    h, e = parse_batch_header(plain), parse_batch_header(sealed)
    assert e.attributes == ATTR_ENCRYPTED
    for field in ("base_offset", "leader_epoch", "last_offset_delta", "first_timestamp", "max_timestamp"):
        assert getattr(e, field) == getattr(h, field)
    assert e.record_count == h.record_count
    assert batch_crc_ok(sealed, e), "followers check the CRC of encrypted bytes without the key"
    for clear in (b"card-4111-1111", b"k1", b"hv2"):
        assert clear not in sealed
    assert cipher.decrypt(sealed, e) == plain
    assert [r.value for r in decode_records(plain, h)] == [b"card-4111-1111-%d" % i for i in range(5)]


def test_the_same_batch_encrypts_differently_each_time_and_nonces_never_repeat() -> None:
    cipher = BatchCipher(KEY_A)
    plain = plain_batch()
    sealed = [cipher.encrypt(plain) for _ in range(500)]
    nonces = {s[BATCH_HEADER_SIZE + 6 + 40 : BATCH_HEADER_SIZE + 6 + 40 + 12] for s in sealed}
    assert len(nonces) == 500
    assert len(set(sealed)) == 500


def test_another_master_key_is_named_not_guessed() -> None:
    sealed = BatchCipher(KEY_A).encrypt(plain_batch())
    with pytest.raises(MissingMasterKey) as info:
        BatchCipher(KEY_B).decrypt(sealed, parse_batch_header(sealed))
    message = str(info.value)
    assert f"needs master key {KEY_A.id.hex()}" in message
    assert f"its master keys: {KEY_B.id.hex()}" in message
    with pytest.raises(MissingMasterKey, match="its master keys: none"):
        BatchCipher(None).decrypt(sealed, parse_batch_header(sealed))


def test_a_master_key_with_the_id_of_another_fails_authentication_not_with_garbage() -> None:
    """Forge the envelope's key id so another key is tried: the key wrap's integrity check refuses it."""
    sealed = bytearray(BatchCipher(KEY_A).encrypt(plain_batch()))
    sealed[BATCH_HEADER_SIZE + 1 : BATCH_HEADER_SIZE + 5] = KEY_B.id
    forged = refresh_crc(sealed)
    with pytest.raises(UndecryptableBatch, match="cannot unwrap its data key"):
        BatchCipher(KEY_B).decrypt(forged, parse_batch_header(forged))


@pytest.mark.parametrize(
    ("where", "what"),
    [
        (BATCH_HEADER_SIZE + 10, "the wrapped data key"),
        (BATCH_HEADER_SIZE + 47, "the nonce"),
        (BATCH_HEADER_SIZE + 70, "the ciphertext"),
        (-1, "the tag"),
        (0, "the base offset"),
        (15, "the leader epoch"),
        (30, "the first timestamp"),
        (44, "the record count"),
    ],
)
def test_every_altered_byte_is_refused(where: int, what: str) -> None:
    cipher = BatchCipher(KEY_A)
    sealed = bytearray(cipher.encrypt(plain_batch()))
    sealed[where] ^= 0x01
    altered = refresh_crc(sealed)
    try:
        header = parse_batch_header(altered)
    except Exception:  # the header no longer parses (record count): refused before decryption
        return
    with pytest.raises(UndecryptableBatch):
        cipher.decrypt(altered, header)


def test_a_ciphertext_moved_under_another_batch_header_is_refused() -> None:
    cipher = BatchCipher(KEY_A)
    first = cipher.encrypt(plain_batch(base=0))
    second = cipher.encrypt(plain_batch(base=5))
    transplanted = bytearray(second[:BATCH_HEADER_SIZE] + first[BATCH_HEADER_SIZE:])
    struct.pack_into(">i", transplanted, 8, len(transplanted) - 12)
    moved = refresh_crc(transplanted)
    with pytest.raises(UndecryptableBatch, match="fails authentication"):
        cipher.decrypt(moved, parse_batch_header(moved))


ORDERS_0 = partition_context("orders", 0, 1_700_000_000_000_000_000)


@pytest.mark.parametrize(
    "elsewhere",
    [
        partition_context("orders", 1, 1_700_000_000_000_000_000),  # another partition
        partition_context("orders-eu", 0, 1_700_000_000_000_000_000),  # another stream
        partition_context("orders", 0, 1_800_000_000_000_000_000),  # a later stream of the same name
        b"",  # no partition at all
    ],
)
def test_a_batch_moved_to_another_partition_or_stream_is_refused(elsewhere: bytes) -> None:
    cipher = BatchCipher(KEY_A)
    sealed = cipher.encrypt(plain_batch(), context=ORDERS_0)
    header = parse_batch_header(sealed)
    assert cipher.decrypt(sealed, header, ORDERS_0) == plain_batch()
    with pytest.raises(UndecryptableBatch, match="another partition or stream"):
        cipher.decrypt(sealed, header, elsewhere)


def test_stream_names_cannot_run_into_partition_ids_in_the_context() -> None:
    contexts = {partition_context(s, p, 5) for s in ("a", "a\x00", "a\x00\x00\x00") for p in (0, 1, 256)}
    assert len(contexts) == 9


@pytest.mark.parametrize("bit", [0x0001, 0x0008, 0x0020, 0x4000])
def test_a_batch_whose_attributes_were_changed_is_refused(bit: int) -> None:
    """Flipping compression, timestamp type or transactional bits would change how the records read."""
    cipher = BatchCipher(KEY_A)
    sealed = bytearray(cipher.encrypt(plain_batch(), context=ORDERS_0))
    attributes = struct.unpack_from(">H", sealed, 21)[0]
    struct.pack_into(">H", sealed, 21, attributes ^ bit)
    altered = refresh_crc(sealed)
    with pytest.raises(UndecryptableBatch, match="fails authentication"):
        cipher.decrypt(altered, parse_batch_header(altered), ORDERS_0)


def version_1_batch(key: MasterKey, plain: bytes) -> bytes:
    """A batch as servers before envelope version 2 wrote it: the AAD binds the header fields only."""
    h = parse_batch_header(plain)
    data_key, nonce = b"d" * 32, b"n" * 12
    wrapped = key.wrap(data_key)
    aad = struct.pack(
        ">qiiqqi",
        h.base_offset,
        h.leader_epoch,
        h.last_offset_delta,
        h.first_timestamp,
        h.max_timestamp,
        h.record_count,
    )
    body = struct.pack(">B4sB", 1, key.id, len(wrapped)) + wrapped + nonce
    body += AESGCM(data_key).encrypt(nonce, plain[BATCH_HEADER_SIZE:], aad)
    batch = bytearray(plain[:BATCH_HEADER_SIZE] + body)
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">H", batch, 21, h.attributes | ATTR_ENCRYPTED)
    return refresh_crc(batch)


def test_version_1_batches_still_decrypt_in_any_partition() -> None:
    cipher = BatchCipher(KEY_A)
    old = version_1_batch(KEY_A, plain_batch())
    header = parse_batch_header(old)
    assert envelope_of(old, header) == (1, KEY_A.id)
    assert cipher.decrypt(old, header, ORDERS_0) == plain_batch()
    assert cipher.decrypt(old, header, b"") == plain_batch()
    new = cipher.encrypt(plain_batch(), context=ORDERS_0)
    assert envelope_of(new, parse_batch_header(new)) == (2, KEY_A.id)


def test_a_version_2_batch_relabelled_as_version_1_is_refused() -> None:
    """Downgrading the envelope to escape the partition binding fails: the tag covers the version 2 data."""
    cipher = BatchCipher(KEY_A)
    sealed = bytearray(cipher.encrypt(plain_batch(), context=ORDERS_0))
    assert sealed[BATCH_HEADER_SIZE] == 2
    sealed[BATCH_HEADER_SIZE] = 1
    relabelled = refresh_crc(sealed)
    with pytest.raises(UndecryptableBatch, match="fails authentication"):
        cipher.decrypt(relabelled, parse_batch_header(relabelled), b"")


def test_rotation_new_batches_use_the_new_key_and_old_ones_still_decrypt() -> None:
    cipher = BatchCipher(KEY_A)
    old = cipher.encrypt(plain_batch(base=0))
    cipher.set_keys(KEY_B, [KEY_A])
    new = cipher.encrypt(plain_batch(base=5))
    assert new[BATCH_HEADER_SIZE + 1 : BATCH_HEADER_SIZE + 5] == KEY_B.id
    assert old[BATCH_HEADER_SIZE + 1 : BATCH_HEADER_SIZE + 5] == KEY_A.id
    assert cipher.decrypt(old, parse_batch_header(old)) == plain_batch(base=0)
    assert cipher.key_ids == [KEY_B.id.hex(), KEY_A.id.hex()]
    cipher.set_keys(KEY_B)  # the old key retired: what it wrapped is out of reach, and says so
    with pytest.raises(MissingMasterKey, match=KEY_A.id.hex()):
        cipher.decrypt(old, parse_batch_header(old))
    assert cipher.decrypt(new, parse_batch_header(new)) == plain_batch(base=5)


def test_a_data_key_is_replaced_after_its_uses() -> None:
    cipher = BatchCipher(KEY_A, data_key_uses=3)
    wrapped = {cipher.encrypt(plain_batch())[BATCH_HEADER_SIZE + 6 : BATCH_HEADER_SIZE + 46] for _ in range(9)}
    assert len(wrapped) == 3


def test_without_a_master_key_nothing_is_encrypted() -> None:
    with pytest.raises(MissingMasterKey, match="no encryption master key"):
        BatchCipher(None).encrypt(plain_batch())
    with pytest.raises(EncryptionError, match="already encrypted"):
        cipher = BatchCipher(KEY_A)
        cipher.encrypt(cipher.encrypt(plain_batch()))


def test_decrypt_batches_decrypts_only_the_encrypted_ones() -> None:
    cipher = BatchCipher(KEY_A)
    a, b, c = plain_batch(base=0), plain_batch(base=5), plain_batch(base=10)
    mixed = cipher.encrypt(a) + b + cipher.encrypt(c)
    assert cipher.decrypt_batches(mixed) == a + b + c
    assert cipher.decrypt_batches(a + b) == a + b


@pytest.mark.parametrize("size", [0, 15, 17, 31, 33, 64])
def test_master_keys_are_16_or_32_bytes(size: int) -> None:
    with pytest.raises(ValueError, match="16 or 32 bytes"):
        MasterKey(b"x" * size)


def test_a_master_key_never_shows_itself() -> None:
    assert "AAAA" not in repr(KEY_A) and KEY_A.id.hex() in repr(KEY_A)


def test_a_seeded_random_makes_the_same_ciphertext() -> None:
    """Tests and simulations can reproduce a ciphertext from a seed."""

    def seeded() -> BatchCipher:
        rng = random.Random(7)
        return BatchCipher(KEY_A, random=rng.randbytes)

    assert seeded().encrypt(plain_batch()) == seeded().encrypt(plain_batch())


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=200), flips=st.lists(st.integers(min_value=0, max_value=400), max_size=4))
def test_hostile_envelopes_fail_only_with_encryption_errors(body: bytes, flips: list[int]) -> None:
    cipher = BatchCipher(KEY_A)
    sealed = bytearray(cipher.encrypt(plain_batch()))
    envelope = bytearray(sealed[BATCH_HEADER_SIZE:][:6]) + bytearray(body) if body else sealed[BATCH_HEADER_SIZE:]
    for at in flips:
        if envelope:
            envelope[at % len(envelope)] ^= 0x5A
    forged = bytearray(sealed[:BATCH_HEADER_SIZE]) + envelope
    struct.pack_into(">i", forged, 8, len(forged) - 12)
    data = refresh_crc(forged)
    header = parse_batch_header(data)
    try:
        clear = cipher.decrypt(data, header)
    except EncryptionError:
        return
    assert bytes(envelope) == bytes(sealed[BATCH_HEADER_SIZE:]), "only the untouched envelope decrypts"
    assert clear == plain_batch()
