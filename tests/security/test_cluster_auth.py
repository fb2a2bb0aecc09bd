"""The seal/open core of server-to-server authentication, and the replay window."""

from __future__ import annotations

import os
import secrets
import stat
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from liftlog.security.cluster_auth import (
    MIN_KEY_BYTES,
    TRAILER_SIZE,
    AuthError,
    ClusterAuth,
    KeyFileError,
    ReplayGuard,
    generate_key_file,
    load_key,
)

KEY = b"k" * 32
S = 10**9
NOW = 1_700_000_000 * S


def auth(key: bytes = KEY, boot: bytes = b"\x01" * 8, started: int = NOW - 60 * S) -> ClusterAuth:
    return ClusterAuth(key, boot=boot, started=started, max_age=30 * S)


def reason(receiver: ClusterAuth, subject: str, data: bytes, now: int = NOW, guard: ReplayGuard | None = None) -> str:
    with pytest.raises(AuthError) as info:
        receiver.open(subject, data, now, guard or ReplayGuard())
    return info.value.reason


def test_a_sealed_message_opens_to_its_payload_once() -> None:
    sender, receiver, guard = auth(), auth(boot=b"\x02" * 8), ReplayGuard()
    sealed = sender.seal("ns.raft.metadata.a", b"payload", NOW)
    assert len(sealed) == len(b"payload") + TRAILER_SIZE
    assert receiver.open("ns.raft.metadata.a", sealed, NOW + S, guard) == b"payload"
    assert reason(receiver, "ns.raft.metadata.a", sealed, NOW + S, guard) == "replayed"
    # Another subscription has its own window: the same message is new there, but bound to its subject.
    assert reason(receiver, "ns.raft.metadata.b", sealed) == "forged"


def test_an_empty_payload_is_sealed_too() -> None:
    assert auth().open("ns.x", auth().seal("ns.x", b"", NOW), NOW, ReplayGuard()) == b""


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "unsigned"),
        (b"{}", "unsigned"),
        (b"x" * 100, "unsigned"),
        (b"x" * 100 + b"LLA1", "future"),  # junk: its "timestamp" is refused before any MAC is computed
    ],
)
def test_unsigned_messages_are_refused(data: bytes, expected: str) -> None:
    assert reason(auth(), "ns.x", data) == expected


def test_a_request_is_bound_to_its_reply_subject_and_v1_trailers_still_open() -> None:
    sender, receiver = auth(), auth()
    sealed = sender.seal("ns.x", b"ask", NOW, reply="_INBOX.liftlog.r1.0")
    assert sealed.endswith(b"LLA2") and sender.seal("ns.x", b"tell", NOW).endswith(b"LLA1"), "v2 for requests only"
    assert receiver.open("ns.x", sealed, NOW, ReplayGuard(), reply="_INBOX.liftlog.r1.0") == b"ask"
    assert reason(receiver, "ns.x", sealed) == "forged"  # sent on with no reply, or another one
    with pytest.raises(AuthError, match="does not match"):
        receiver.open("ns.x", sealed, NOW, ReplayGuard(), reply="_INBOX.evil.1")
    # Relabelled as v1 (whose tags do not cover the reply), it still does not pass: the tag covers other bytes.
    assert reason(receiver, "ns.x", sealed[:-4] + b"LLA1") == "forged"
    # What a server of the previous release sends (v1: subject only) still opens, during a rolling upgrade.
    fields = struct.pack(">8sQq", b"oldboot!", 1, NOW)
    legacy = b"ask" + fields + sender._tag(fields, "ns.x", b"ask") + b"LLA1"
    assert receiver.open("ns.x", legacy, NOW, ReplayGuard(), reply="_INBOX.old.1") == b"ask"


def test_junk_outside_the_time_window_costs_no_mac(monkeypatch: pytest.MonkeyPatch) -> None:
    checker = auth()
    macs: list[str] = []
    real = checker._tag

    def counted_tag(fields: bytes | memoryview, subject: str, payload: bytes | memoryview) -> bytes:
        macs.append("mac")
        return real(fields, subject, payload)

    monkeypatch.setattr(checker, "_tag", counted_tag)
    old = auth().seal("ns.x", b"data", NOW - 3600 * 10**9)
    assert reason(checker, "ns.x", old) == "stale" and macs == []
    assert reason(checker, "ns.x", auth(key=b"z" * 32).seal("ns.x", b"data", NOW)) == "forged" and macs == ["mac"]


def test_another_secret_cannot_sign() -> None:
    assert reason(auth(), "ns.x", auth(key=b"z" * 32).seal("ns.x", b"data", NOW)) == "forged"


def test_timestamps_outside_the_window_are_refused() -> None:
    sender = auth()
    assert reason(auth(), "ns.x", sender.seal("ns.x", b"d", NOW - 31 * S)) == "stale"
    assert reason(auth(), "ns.x", sender.seal("ns.x", b"d", NOW + 31 * S)) == "future"
    assert auth().open("ns.x", sender.seal("ns.x", b"d", NOW - 29 * S), NOW, ReplayGuard()) == b"d"


def test_messages_stamped_before_the_receiver_started_are_refused() -> None:
    # A receiver that restarted has forgotten what it saw: older messages could be replays.
    receiver = auth(started=NOW)
    assert reason(receiver, "ns.x", auth().seal("ns.x", b"d", NOW - S)) == "early"
    assert receiver.open("ns.x", auth().seal("ns.x", b"d", NOW + 1), NOW + S, ReplayGuard()) == b"d"


def test_a_restarted_sender_starts_a_new_sequence() -> None:
    guard = ReplayGuard()
    first, second = auth(boot=b"\x01" * 8), auth(boot=b"\x03" * 8)
    assert auth().open("ns.x", first.seal("ns.x", b"1", NOW), NOW, guard) == b"1"
    assert auth().open("ns.x", second.seal("ns.x", b"2", NOW), NOW, guard) == b"2"


def test_the_window_takes_reordered_messages_and_refuses_what_is_too_old() -> None:
    guard = ReplayGuard(window=8)
    boot = b"b" * 8
    assert guard.accept(boot, 10, 0)
    assert guard.accept(boot, 7, 0)  # out of order, inside the window
    assert not guard.accept(boot, 7, 0)
    assert guard.accept(boot, 3, 0)
    assert not guard.accept(boot, 2, 0)  # 8 behind: cannot tell, refused
    assert guard.accept(boot, 30, 0)  # a jump past the window forgets the old bits
    assert not guard.accept(boot, 10, 0)
    assert guard.accept(boot, 29, 0)


def test_the_guard_forgets_silent_senders() -> None:
    guard = ReplayGuard()
    guard.accept(b"a" * 8, 1, 100)
    guard.accept(b"b" * 8, 1, 200)
    guard.forget_before(150)
    assert len(guard) == 1


def test_the_core_refuses_bad_parameters() -> None:
    with pytest.raises(ValueError, match="at least 16"):
        ClusterAuth(b"short", boot=b"\x00" * 8, started=0, max_age=S)
    with pytest.raises(ValueError, match="8 bytes"):
        ClusterAuth(KEY, boot=b"\x00", started=0, max_age=S)
    with pytest.raises(ValueError, match="positive"):
        ClusterAuth(KEY, boot=b"\x00" * 8, started=0, max_age=0)


@given(payload=st.binary(max_size=300), position=st.integers(min_value=0), flip=st.integers(min_value=1, max_value=255))
def test_any_altered_byte_is_refused(payload: bytes, position: int, flip: int) -> None:
    sealed = bytearray(auth().seal("ns.x", payload, NOW))
    sealed[position % len(sealed)] ^= flip
    with pytest.raises(AuthError):
        auth().open("ns.x", bytes(sealed), NOW, ReplayGuard())


@given(payload=st.binary(max_size=300), cut=st.integers(min_value=1, max_value=400))
def test_any_truncation_is_refused(payload: bytes, cut: int) -> None:
    sealed = auth().seal("ns.x", payload, NOW)
    with pytest.raises(AuthError):
        auth().open("ns.x", sealed[: max(len(sealed) - cut, 0)], NOW, ReplayGuard())
    with pytest.raises(AuthError):
        auth().open("ns.x", sealed[min(cut, len(sealed)) :], NOW, ReplayGuard())


@pytest.mark.parametrize(
    ("mode", "owner", "refused"),
    [
        (0o600, 1000, False),
        (0o400, 1000, False),
        (0o640, 0, False),  # root:liftlog 0640, as deploy/ installs it
        (0o640, 1000, True),  # the group may read a key a user owns
        (0o660, 0, True),  # the group may write it
        (0o604, 0, True),  # others may read it
        (0o644, 1000, True),
    ],
)
def test_a_secret_others_may_read_is_refused(
    open_folder: Path, monkeypatch: pytest.MonkeyPatch, mode: int, owner: int, refused: bool
) -> None:
    path = open_folder / "cluster.key"
    generate_key_file(path)
    path.chmod(mode)
    real_stat = Path.stat

    def owned(self: Path, **kwargs: bool) -> os.stat_result:
        st = real_stat(self, **kwargs)
        return os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, owner, *tuple(st)[5:]))

    monkeypatch.setattr(Path, "stat", owned)
    if refused:
        with pytest.raises(KeyFileError, match=rf"may be read by .* \(mode {mode:04o}\).*`chmod 6[04]0 "):
            load_key(path)
        assert len(load_key(path, check_permissions=False)) == 64
    else:
        assert len(load_key(path)) == 64


def test_a_secret_in_a_folder_nobody_else_may_enter_is_private(tmp_path: Path, open_folder: Path) -> None:
    closed = open_folder / "closed"
    closed.mkdir(mode=0o700)
    for folder in (closed, tmp_path):  # tmp_path: pytest's own folder is 0700 too
        path = folder / "cluster.key"
        generate_key_file(path)
        path.chmod(0o644)
        assert len(load_key(path)) == 64
    closed.chmod(0o711)  # others may pass through (and read a file whose name they know)
    with pytest.raises(KeyFileError, match="may be read by others"):
        load_key(closed / "cluster.key")


def test_a_guessable_secret_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cluster.key"
    path.write_text("password" * 4)
    path.chmod(0o600)
    with pytest.raises(KeyFileError, match="looks guessable: it repeats itself"):
        load_key(path)
    path.write_text("31415926535897932384")  # digits only
    with pytest.raises(KeyFileError, match="draws on too few characters"):
        load_key(path)
    path.write_text(secrets.token_hex(32))  # what `liftlog keygen` writes
    assert len(load_key(path)) == 64


def test_key_files(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "cluster.key"
    assert generate_key_file(path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    key = load_key(path)
    assert len(key) == 64
    assert not generate_key_file(path)  # an existing secret is never replaced
    assert load_key(path) == key
    with pytest.raises(KeyFileError, match="does not exist"):
        load_key(tmp_path / "missing.key")
    short = tmp_path / "short.key"
    short.write_text("tooshort\n")
    short.chmod(0o600)
    with pytest.raises(KeyFileError, match=f"at least {MIN_KEY_BYTES}"):
        load_key(short)
    with pytest.raises(KeyFileError, match="cannot read"):
        load_key(tmp_path)
