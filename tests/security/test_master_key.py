"""Master keys from Liftbridge's environment variable and from files, and every way they can be wrong."""

from __future__ import annotations

import base64
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from liftlog.security.master_key import (
    ENV_VAR,
    MasterKeyError,
    generate_master_key_file,
    legacy_master_key,
    load_master_keys,
    parse_master_key,
)
from liftlog.storage.encryption import MasterKey


def test_typed_keys_go_through_hkdf_and_their_old_raw_form_still_decrypts() -> None:
    typed = "t7w!z%C*F-JaNcRf"  # as Liftbridge's documentation gives one: 16 bytes of text
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"liftlog encryption master key v1")
    assert parse_master_key(typed, "env").id == MasterKey(derived.derive(typed.encode())).id
    assert parse_master_key(typed + "\n", "env").id == parse_master_key(typed, "env").id
    assert parse_master_key(typed, "env").id != MasterKey(typed.encode()).id, "never the typed bytes themselves"
    legacy = legacy_master_key(typed)
    assert legacy is not None and legacy.id == MasterKey(typed.encode()).id
    assert legacy_master_key("base64:" + base64.b64encode(bytes(32)).decode()) is None, "a decoded key was never typed"
    longer = "Vf3#nQ8!pZ1@rT6$wY2%kM7^bH4&cJ9*-and-more"  # any length from 16 on, now that it is derived
    assert parse_master_key(longer, "env") is not None and legacy_master_key(longer) is None


def test_a_typed_current_key_brings_its_old_form_as_a_decrypt_only_key(tmp_path: Path) -> None:
    typed = "t7w!z%C*F-JaNcRf"
    current, previous = load_master_keys("", [], env={ENV_VAR: typed})
    assert current is not None and current.id == parse_master_key(typed, "x").id
    assert [k.id for k in previous] == [MasterKey(typed.encode()).id]


@pytest.mark.parametrize(
    ("text", "why"),
    [("k" * 16, "repeats itself"), ("ab" * 16, "repeats itself"), ("1234567890123456", "draws on too few characters")],
)
def test_a_guessable_typed_key_is_refused(text: str, why: str) -> None:
    with pytest.raises(MasterKeyError, match=f"in {ENV_VAR} looks guessable: it {why}"):
        parse_master_key(text, ENV_VAR)


def test_base64_and_hex_keys_are_decoded() -> None:
    raw = bytes(range(32))
    assert parse_master_key("base64:" + base64.b64encode(raw).decode(), "f").id == MasterKey(raw).id
    assert parse_master_key("hex:" + raw[:16].hex(), "f").id == MasterKey(raw[:16]).id


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("short", "is 5 bytes of text; it needs at least 16"),
        ("hex:" + "ab" * 24, "is 24 bytes; it must be 16 or 32 bytes"),
        ("base64:!!!", "does not decode"),
        ("hex:zz", "does not decode"),
        ("base64:" + base64.b64encode(b"x" * 20).decode(), "is 20 bytes"),
        ("", "is 0 bytes of text"),
    ],
)
def test_a_bad_key_names_its_source_and_the_problem(text: str, problem: str) -> None:
    with pytest.raises(MasterKeyError, match="in file /etc/k") as info:
        parse_master_key(text, "file /etc/k")
    assert problem in str(info.value)


def test_keys_come_from_the_environment_or_a_file_not_both(tmp_path: Path) -> None:
    assert load_master_keys("", [], env={}) == (None, [])
    typed = "Qz8!rT2#mW5$kY9&"
    current, previous = load_master_keys("", [], env={ENV_VAR: typed})
    assert current is not None and current.id == parse_master_key(typed, "x").id
    assert [k.id for k in previous] == [MasterKey(typed.encode()).id]  # its form before HKDF: decrypts only
    path = tmp_path / "master.key"
    assert generate_master_key_file(path)
    with pytest.raises(MasterKeyError, match="not both"):
        load_master_keys(str(path), [], env={ENV_VAR: typed})
    old = tmp_path / "old.key"
    old.write_text("hex:" + "6f" * 32)
    old.chmod(0o600)
    current, previous = load_master_keys(str(path), [str(old)], env={})
    assert current is not None and [k.id for k in previous] == [MasterKey(b"o" * 32).id]  # 0x6f is "o"
    with pytest.raises(MasterKeyError, match=r"missing\.key does not exist"):
        load_master_keys(str(path), [str(tmp_path / "missing.key")], env={})


def test_a_key_file_others_may_read_is_refused_unless_told_not_to_check(open_folder: Path) -> None:
    path = open_folder / "master.key"
    generate_master_key_file(path)
    path.chmod(0o644)
    with pytest.raises(MasterKeyError, match=rf"master key file {path} may be read by others \(mode 0644\).*chmod"):
        load_master_keys(str(path), [], env={})
    current, _ = load_master_keys(str(path), [], env={}, check_permissions=False)
    assert current is not None


def test_a_generated_key_file_is_private_random_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "dir" / "master.key"
    assert generate_master_key_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = path.read_text()
    assert first.startswith("base64:") and len(base64.b64decode(first[7:].strip())) == 32
    assert not generate_master_key_file(path) and path.read_text() == first
    other = tmp_path / "other.key"
    generate_master_key_file(other)
    assert other.read_text() != first
