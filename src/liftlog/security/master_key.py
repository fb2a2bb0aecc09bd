"""Where the encryption master keys come from: Liftbridge's environment variable or key files.

A key is text. ``base64:...`` and ``hex:...`` are decoded and used as they are: 16 or 32 bytes (AES-128 or
AES-256 key wrap); ``liftlog keygen --master-key FILE`` writes 32 random bytes in base64. Anything else is
a secret someone typed (as ``LIFTBRIDGE_ENCRYPTION_KEY`` is in Liftbridge's documentation): at least 16
bytes, not guessable (``weak_secret_problem``), and never used as it is: HKDF-SHA256 derives the 32-byte
key from it. Servers before this derivation used a typed key's 16 or 32 bytes directly; that form stays
among the keys that decrypt (``legacy_master_key``), so their data stays readable, and
``liftlog encryption rewrap`` moves it to the derived key.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from liftlog.security.cluster_auth import private_file_problem, weak_secret_problem, write_new_private_file
from liftlog.storage.encryption import MasterKey

__all__ = [
    "ENV_VAR",
    "MasterKeyError",
    "generate_master_key_file",
    "legacy_master_key",
    "load_master_keys",
    "parse_master_key",
]

#: HKDF's info for a typed master key: a key derived for this use and no other.
_HKDF_INFO = b"liftlog encryption master key v1"

#: Liftbridge's variable for the master key; liftlog reads the same one.
ENV_VAR = "LIFTBRIDGE_ENCRYPTION_KEY"


class MasterKeyError(Exception):
    """A master key that is missing, unreadable or not 16 or 32 bytes; the message names its source."""


def _typed(text: str) -> bool:
    return not text.startswith(("base64:", "hex:"))


def parse_master_key(text: str, source: str) -> MasterKey:
    """The master key ``text`` stands for; MasterKeyError naming ``source`` if it is not one."""
    text = text.strip()
    try:
        if text.startswith("base64:"):
            raw = base64.b64decode(text[7:], validate=True)
        elif text.startswith("hex:"):
            raw = bytes.fromhex(text[4:])
        else:
            raw = text.encode()
    except (binascii.Error, ValueError) as exc:
        raise MasterKeyError(f"the encryption master key in {source} does not decode: {exc}") from None
    if not _typed(text):
        if len(raw) not in (16, 32):
            raise MasterKeyError(
                f"the encryption master key in {source} is {len(raw)} bytes; it must be 16 or 32 bytes "
                "(AES-128 or AES-256), e.g. from `liftlog keygen --master-key FILE`"
            )
        return MasterKey(raw)
    if len(raw) < 16:
        raise MasterKeyError(
            f"the encryption master key in {source} is {len(raw)} bytes of text; it needs at least 16 (or use "
            "`liftlog keygen --master-key FILE`)"
        )
    weak = weak_secret_problem(raw)
    if weak is not None:
        raise MasterKeyError(f"the encryption master key in {source} {weak}")
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO).derive(raw)
    return MasterKey(derived)


def legacy_master_key(text: str) -> MasterKey | None:
    """The key servers before HKDF made of typed ``text`` (its bytes as they are), if it could be one."""
    text = text.strip()
    raw = text.encode()
    return MasterKey(raw) if _typed(text) and len(raw) in (16, 32) else None


def _read(path: Path, check_permissions: bool) -> str:
    problem = private_file_problem(path) if check_permissions else None
    if problem is not None:
        raise MasterKeyError(f"encryption master key file {problem}")
    try:
        return path.read_text()
    except FileNotFoundError:
        raise MasterKeyError(f"encryption master key file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise MasterKeyError(f"cannot read encryption master key file {path}: {reason}") from None


def load_master_keys(
    key_file: str,
    previous_files: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    check_permissions: bool = True,
) -> tuple[MasterKey | None, list[MasterKey]]:
    """(the key new batches are encrypted with, keys that only decrypt) from the configuration.

    The current key is ``key_file``'s or the environment's ``LIFTBRIDGE_ENCRYPTION_KEY``, not both.
    """
    environ = os.environ if env is None else env
    from_env = environ.get(ENV_VAR, "")
    if key_file and from_env:
        raise MasterKeyError(f"give the encryption master key in {ENV_VAR} or in encryption.key.file, not both")
    texts: list[tuple[str, str]] = []  # (text, source): the current key's first
    if key_file:
        texts.append((_read(Path(key_file), check_permissions), f"file {key_file}"))
    elif from_env:
        texts.append((from_env, ENV_VAR))
    current: MasterKey | None = parse_master_key(*texts[0]) if texts else None
    earlier = [(_read(Path(p), check_permissions), f"file {p}") for p in previous_files if p]
    previous = [parse_master_key(*text) for text in earlier]
    texts += earlier
    # Typed keys as servers before HKDF used them: data they encrypted stays readable.
    known = {k.id for k in previous} | ({current.id} if current is not None else set())
    for text, _ in texts:
        legacy = legacy_master_key(text)
        if legacy is not None and legacy.id not in known:
            previous.append(legacy)
            known.add(legacy.id)
    return current, previous


def generate_master_key_file(path: Path) -> bool:
    """Write a new random 32-byte master key to ``path`` (owner-only), unless it exists. True if it wrote."""
    return write_new_private_file(path, "base64:" + base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
