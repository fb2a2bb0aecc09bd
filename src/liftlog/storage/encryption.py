"""Encryption at rest: AES-256-GCM per record batch, data keys wrapped by a master key (sans-IO).

An encrypted batch keeps its header in the clear, since offsets, epoch, counts and timestamps are
what indexing, retention, replication and recovery read, sets ``ATTR_ENCRYPTED`` in its
attributes, and stores in place of its records::

     0  uint8   envelope version (2; version 1 batches are still read)
     1  4 bytes master key id       (see ``MasterKey.id``)
     5  uint8   wrapped key length  (40: AES key wrap with padding, RFC 5649, of a 32-byte data key)
     6  ...     wrapped data key
     .  12      nonce (random)
     .  ...     AES-256-GCM ciphertext of the records, then its 16-byte tag

The GCM associated data binds the ciphertext to where it belongs. Version 2 covers the envelope
version, the header's base offset, leader epoch, last offset delta, timestamps, record count and
attributes, and the partition's context (``partition_context``: stream name, partition id and the
stream's creation time), so a batch moved under another header, into another partition or stream, or
into a later stream of the same name fails to decrypt, as does one whose attributes were changed.
Version 1 (written before 2026-11) covered the header fields only; such batches still decrypt, and
``liftlog encryption rewrap --reencrypt`` rewrites them as version 2. Relabelling a version 2 batch
as version 1 does not help a forger: its tag was computed over the version 2 data. The batch CRC covers
the stored bytes as for any batch, so followers check and store encrypted batches without
decrypting them, and crash recovery needs no key.

A data key serves many batches (unwrapping one per batch would cost more than the encryption);
each cipher makes a new one after ``data_key_uses`` batches, far below the 2**32 random nonces
GCM allows per key, and when its master key changes.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Final

from crc32c import crc32c
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.keywrap import (
    InvalidUnwrap,
    aes_key_unwrap_with_padding,
    aes_key_wrap_with_padding,
)

from liftlog.recordformat import BATCH_HEAD, BATCH_HEADER_SIZE, BATCH_TAIL, LOG_OVERHEAD, MAGIC, BatchHeader

from .errors import StorageError
from .records import iter_batch_headers, parse_batch_header

__all__ = [
    "ATTR_ENCRYPTED",
    "BatchCipher",
    "EncryptionError",
    "MasterKey",
    "MissingMasterKey",
    "PartitionCipher",
    "UndecryptableBatch",
    "envelope_of",
    "is_encrypted",
    "partition_context",
]

#: Attributes bit of a batch whose records are encrypted.
ATTR_ENCRYPTED: Final = 0x0010
ENVELOPE_VERSION: Final = 2
#: Envelope versions this code reads: 1 binds the header only, 2 also the attributes and the partition.
READABLE_VERSIONS: Final = (1, 2)
DATA_KEY_BYTES: Final = 32
NONCE_BYTES: Final = 12
TAG_BYTES: Final = 16
MASTER_KEY_SIZES: Final = (16, 32)
#: Batches one data key encrypts before the cipher makes a new one.
DATA_KEY_USES: Final = 1 << 20

_ENVELOPE_HEAD = struct.Struct(">B4sB")
_AAD_V1 = struct.Struct(">qiiqqi")
_AAD_V2 = struct.Struct(">BqiiqqiH")  # version, then the v1 fields, then attributes
_CONTEXT_LABEL: Final = b"liftlog partition\x00"
_UNWRAPPED_KEEP: Final = 256


class EncryptionError(StorageError):
    """An encrypted batch that cannot be written or read here."""


class MissingMasterKey(EncryptionError):
    """No master key at all, or not the one a batch's data key was wrapped with."""


class UndecryptableBatch(EncryptionError):
    """A batch whose data key or ciphertext does not authenticate: the wrong master key, or altered bytes."""


class MasterKey:
    """A key-encryption key: 16 or 32 bytes (AES-128 or AES-256 key wrap), as Liftbridge takes it."""

    __slots__ = ("_key", "id")

    def __init__(self, key: bytes) -> None:
        if len(key) not in MASTER_KEY_SIZES:
            raise ValueError(f"an encryption master key must be 16 or 32 bytes (AES-128 or AES-256), got {len(key)}")
        self._key = bytes(key)
        #: Names the key in every batch it wraps a data key for, so a reader without it can say which
        #: key it lacks. A hash of the key under a fixed label; it does not reveal the key.
        self.id = hashlib.sha256(b"liftlog master key id\x00" + self._key).digest()[:4]

    def wrap(self, data_key: bytes) -> bytes:
        return aes_key_wrap_with_padding(self._key, data_key)

    def unwrap(self, wrapped: bytes) -> bytes:
        return aes_key_unwrap_with_padding(self._key, wrapped)

    def __repr__(self) -> str:  # never the key itself
        return f"MasterKey(id={self.id.hex()})"


class BatchCipher:
    """Encrypts whole batches under ``current`` and decrypts batches under any of ``keys``.

    Safe to share between logs and threads (compaction runs in a worker thread). ``random`` makes data
    keys and nonces; tests pass a seeded one.
    """

    def __init__(
        self,
        current: MasterKey | None,
        previous: Iterable[MasterKey] = (),
        *,
        random: Callable[[int], bytes] = os.urandom,
        data_key_uses: int = DATA_KEY_USES,
    ) -> None:
        self._random = random
        self._data_key_uses = data_key_uses
        self._lock = threading.Lock()
        self._current: MasterKey | None = None
        self._keys: dict[bytes, MasterKey] = {}
        # (aead, envelope prefix) of the data key new batches are encrypted with, and its uses left.
        self._writer: tuple[AESGCM, bytes] | None = None
        self._uses_left = 0
        self._unwrapped: OrderedDict[bytes, AESGCM] = OrderedDict()
        self.set_keys(current, previous)

    def set_keys(self, current: MasterKey | None, previous: Iterable[MasterKey] = ()) -> None:
        """Change the master keys (a reload): new batches use ``current``; ``previous`` still decrypt."""
        keys = {k.id: k for k in previous}
        if current is not None:
            keys[current.id] = current
        with self._lock:
            if current is None or self._current is None or current.id != self._current.id:
                self._writer = None  # the next batch makes a data key wrapped by the new master key
            self._current = current
            self._keys = keys
            self._unwrapped.clear()

    @property
    def current(self) -> MasterKey | None:
        """The master key new batches are encrypted under."""
        return self._current

    @property
    def can_encrypt(self) -> bool:
        return self._current is not None

    @property
    def key_ids(self) -> list[str]:
        """Hex ids of the master keys this cipher holds, the current one first."""
        current = self._current
        ids = [current.id.hex()] if current is not None else []
        return ids + sorted(k.hex() for k in self._keys if current is None or k != current.id)

    # -- writing ---------------------------------------------------------

    def encrypt(
        self, batch: bytes | bytearray | memoryview, header: BatchHeader | None = None, context: bytes = b""
    ) -> bytes:
        """``batch`` (one whole plaintext batch, header at ``header.position``) as an encrypted batch.

        ``context`` (``partition_context``) names the partition the batch belongs to; reading it back
        needs the same context.
        """
        if header is None:
            header = parse_batch_header(batch)
        if header.attributes & ATTR_ENCRYPTED:
            raise EncryptionError(f"batch at base offset {header.base_offset} is already encrypted")
        aead, prefix = self._data_key()
        nonce = self._random(NONCE_BYTES)
        start = header.position + BATCH_HEADER_SIZE
        records = memoryview(batch)[start : header.position + header.size]
        attributes = header.attributes | ATTR_ENCRYPTED
        sealed = aead.encrypt(nonce, bytes(records), _aad_v2(header, attributes, context))
        return _seal(header, attributes, prefix + nonce + sealed)

    def _data_key(self) -> tuple[AESGCM, bytes]:
        with self._lock:
            writer = self._writer
            if writer is None or self._uses_left <= 0:
                current = self._current
                if current is None:
                    raise MissingMasterKey(
                        "cannot encrypt: this server has no encryption master key "
                        "(set LIFTBRIDGE_ENCRYPTION_KEY or encryption.key.file)"
                    )
                data_key = self._random(DATA_KEY_BYTES)
                wrapped = current.wrap(data_key)
                prefix = _ENVELOPE_HEAD.pack(ENVELOPE_VERSION, current.id, len(wrapped)) + wrapped
                writer = self._writer = (AESGCM(data_key), prefix)
                self._uses_left = self._data_key_uses
            self._uses_left -= 1
            return writer

    # -- reading ---------------------------------------------------------

    def decrypt(self, batch: bytes | bytearray | memoryview, header: BatchHeader, context: bytes = b"") -> bytes:
        """The plaintext batch (attributes bit cleared, CRC recomputed) of one encrypted batch.

        ``context`` must be the one the batch was encrypted with (version 2 batches).
        """
        mv = memoryview(batch)
        start = header.position + BATCH_HEADER_SIZE
        end = header.position + header.size
        base = header.base_offset
        min_size = _ENVELOPE_HEAD.size + NONCE_BYTES + TAG_BYTES
        if end - start < min_size:
            raise UndecryptableBatch(f"encrypted batch at base offset {base} is too short ({end - start} bytes)")
        version, key_id, wrapped_len = _ENVELOPE_HEAD.unpack_from(mv, start)
        if version not in READABLE_VERSIONS:
            raise UndecryptableBatch(f"encrypted batch at base offset {base} has unknown envelope version {version}")
        p = start + _ENVELOPE_HEAD.size
        if end - p < wrapped_len + NONCE_BYTES + TAG_BYTES:
            raise UndecryptableBatch(f"encrypted batch at base offset {base} is shorter than its envelope says")
        wrapped = bytes(mv[p : p + wrapped_len])
        p += wrapped_len
        aead = self._aead(key_id, wrapped, base)
        nonce = bytes(mv[p : p + NONCE_BYTES])
        aad = _aad_v1(header) if version == 1 else _aad_v2(header, header.attributes, context)
        try:
            plain = aead.decrypt(nonce, bytes(mv[p + NONCE_BYTES : end]), aad)
        except InvalidTag:
            moved = "" if version == 1 else ", or it belongs to another partition or stream"
            raise UndecryptableBatch(
                f"encrypted batch at base offset {base} fails authentication: its bytes were altered{moved} "
                f"(master key {key_id.hex()} unwrapped its data key)"
            ) from None
        return _seal(header, header.attributes & ~ATTR_ENCRYPTED, plain)

    def _aead(self, key_id: bytes, wrapped: bytes, base: int) -> AESGCM:
        with self._lock:
            aead = self._unwrapped.get(wrapped)
            if aead is not None:
                self._unwrapped.move_to_end(wrapped)
                return aead
            key = self._keys.get(key_id)
            held = self.key_ids
        if key is None:
            have = ", ".join(held) if held else "none"
            raise MissingMasterKey(
                f"encrypted batch at base offset {base} needs master key {key_id.hex()}, "
                f"which this server does not have (its master keys: {have})"
            )
        try:
            data_key = key.unwrap(wrapped)
        except InvalidUnwrap:
            raise UndecryptableBatch(
                f"encrypted batch at base offset {base}: master key {key_id.hex()} cannot unwrap its data key "
                "(the wrapped key was altered)"
            ) from None
        if len(data_key) not in (16, 24, 32):
            raise UndecryptableBatch(f"encrypted batch at base offset {base} has a data key of {len(data_key)} bytes")
        aead = AESGCM(data_key)
        with self._lock:
            self._unwrapped[wrapped] = aead
            if len(self._unwrapped) > _UNWRAPPED_KEEP:
                self._unwrapped.popitem(last=False)
        return aead

    def decrypt_batches(self, data: bytes, context: bytes = b"") -> bytes:
        """``data`` (whole batches) with every encrypted batch decrypted; ``data`` itself when none is."""
        headers = list(iter_batch_headers(data))
        if not any(h.attributes & ATTR_ENCRYPTED for h in headers):
            return data
        mv = memoryview(data)
        parts: list[bytes | memoryview] = []
        for h in headers:
            if h.attributes & ATTR_ENCRYPTED:
                parts.append(self.decrypt(mv, h, context))
            else:
                parts.append(mv[h.position : h.position + h.size])
        return b"".join(parts)

    def rewrap(self, batch: bytes | bytearray | memoryview, header: BatchHeader, context: bytes = b"") -> bytes:
        """One encrypted batch with its data key wrapped by the current master key instead.

        The nonce, ciphertext and envelope version stay (the data key is the same), so the batch keeps
        its size and position. The batch is decrypted first, so a damaged one is refused, not carried on.
        """
        current = self._current
        if current is None:
            raise MissingMasterKey("cannot rewrap: no current master key")
        self.decrypt(batch, header, context)  # proves the key, the ciphertext and the binding
        mv = memoryview(batch)[header.position : header.position + header.size]
        version, key_id, wrapped_len = _ENVELOPE_HEAD.unpack_from(mv, BATCH_HEADER_SIZE)
        p = BATCH_HEADER_SIZE + _ENVELOPE_HEAD.size
        wrapped = bytes(mv[p : p + wrapped_len])
        with self._lock:
            aead_key = self._keys[key_id]  # present: decrypt unwrapped with it
        rewrapped = current.wrap(aead_key.unwrap(wrapped))
        if len(rewrapped) != wrapped_len:
            raise EncryptionError(
                f"batch at base offset {header.base_offset}: its data key wraps to {len(rewrapped)} bytes "
                f"under the new master key, not {wrapped_len}; use a re-encryption instead"
            )
        body = bytearray(mv[BATCH_HEADER_SIZE:])
        body[: p - BATCH_HEADER_SIZE + wrapped_len] = _ENVELOPE_HEAD.pack(version, current.id, wrapped_len) + rewrapped
        return _seal(header, header.attributes, bytes(body))

    def bind(self, context: bytes) -> PartitionCipher:
        """This cipher for one partition's batches (see ``partition_context``)."""
        return PartitionCipher(self, context)


class PartitionCipher:
    """A ``BatchCipher`` bound to one partition: what a commit log encrypts and decrypts with."""

    __slots__ = ("cipher", "context")

    def __init__(self, cipher: BatchCipher, context: bytes = b"") -> None:
        self.cipher = cipher
        self.context = context

    @property
    def can_encrypt(self) -> bool:
        return self.cipher.can_encrypt

    def encrypt(self, batch: bytes | bytearray | memoryview, header: BatchHeader | None = None) -> bytes:
        return self.cipher.encrypt(batch, header, self.context)

    def decrypt(self, batch: bytes | bytearray | memoryview, header: BatchHeader) -> bytes:
        return self.cipher.decrypt(batch, header, self.context)

    def decrypt_batches(self, data: bytes) -> bytes:
        return self.cipher.decrypt_batches(data, self.context)


def partition_context(stream: str, partition: int, created: int) -> bytes:
    """What version 2 batches of partition ``partition`` of stream ``stream`` are bound to.

    ``created`` is the stream's creation timestamp, which tells apart streams that reused a name.
    """
    name = stream.encode()
    return _CONTEXT_LABEL + struct.pack(">H", len(name)) + name + struct.pack(">iq", partition, created)


def envelope_of(batch: bytes | bytearray | memoryview, header: BatchHeader) -> tuple[int, bytes]:
    """The envelope version and master key id of one encrypted batch (nothing is decrypted)."""
    start = header.position + BATCH_HEADER_SIZE
    if header.size - BATCH_HEADER_SIZE < _ENVELOPE_HEAD.size:
        raise UndecryptableBatch(f"encrypted batch at base offset {header.base_offset} is too short")
    version, key_id, _ = _ENVELOPE_HEAD.unpack_from(batch, start)
    return version, bytes(key_id)


def is_encrypted(header: BatchHeader) -> bool:
    return bool(header.attributes & ATTR_ENCRYPTED)


def _aad_v1(h: BatchHeader) -> bytes:
    return _AAD_V1.pack(
        h.base_offset, h.leader_epoch, h.last_offset_delta, h.first_timestamp, h.max_timestamp, h.record_count
    )


def _aad_v2(h: BatchHeader, attributes: int, context: bytes) -> bytes:
    head = _AAD_V2.pack(
        2,
        h.base_offset,
        h.leader_epoch,
        h.last_offset_delta,
        h.first_timestamp,
        h.max_timestamp,
        h.record_count,
        attributes,
    )
    return head + context


def _seal(h: BatchHeader, attributes: int, body: bytes) -> bytes:
    """A batch with ``h``'s header fields, ``attributes`` and ``body`` in place of its records."""
    tail = BATCH_TAIL.pack(attributes, h.last_offset_delta, h.first_timestamp, h.max_timestamp, h.record_count) + body
    length = BATCH_HEADER_SIZE - LOG_OVERHEAD + len(body)
    return BATCH_HEAD.pack(h.base_offset, length, h.leader_epoch, MAGIC, crc32c(tail)) + tail
