"""Where the encryption master keys come from: Liftbridge's environment variable or key files.

A key is text. ``base64:...`` and ``hex:...`` are decoded; anything else is taken as its UTF-8 bytes,
as Liftbridge takes ``LIFTBRIDGE_ENCRYPTION_KEY``. Either way it must come to 16 or 32 bytes
(AES-128 or AES-256 key wrap). ``liftlog keygen --master-key FILE`` writes 32 random bytes in base64.
"""

from __future__ import annotations

import base64
import binascii
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

from liftlog.security.cluster_auth import private_file_problem, weak_secret_problem, write_new_private_file
from liftlog.storage.encryption import MasterKey

__all__ = ["ENV_VAR", "MasterKeyError", "generate_master_key_file", "load_master_keys", "parse_master_key"]

#: Liftbridge's variable for the master key; liftlog reads the same one.
ENV_VAR = "LIFTBRIDGE_ENCRYPTION_KEY"


class MasterKeyError(Exception):
    """A master key that is missing, unreadable or not 16 or 32 bytes; the message names its source."""


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
    if len(raw) not in (16, 32):
        raise MasterKeyError(
            f"the encryption master key in {source} is {len(raw)} bytes; it must be 16 or 32 bytes "
            "(AES-128 or AES-256), e.g. from `liftlog keygen --master-key FILE`"
        )
    if not text.startswith(("base64:", "hex:")):  # typed text, used as its bytes: it must not be guessable
        weak = weak_secret_problem(raw)
        if weak is not None:
            raise MasterKeyError(f"the encryption master key in {source} {weak}")
    return MasterKey(raw)


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
    current: MasterKey | None = None
    if key_file:
        current = parse_master_key(_read(Path(key_file), check_permissions), f"file {key_file}")
    elif from_env:
        current = parse_master_key(from_env, ENV_VAR)
    previous = [parse_master_key(_read(Path(p), check_permissions), f"file {p}") for p in previous_files if p]
    return current, previous


def generate_master_key_file(path: Path) -> bool:
    """Write a new random 32-byte master key to ``path`` (owner-only), unless it exists. True if it wrote."""
    return write_new_private_file(path, "base64:" + base64.b64encode(secrets.token_bytes(32)).decode() + "\n")
