"""Authenticated server-to-server messages: a MAC keyed by the cluster secret, with replay protection.

Anyone who can publish on the cluster's NATS can otherwise speak as a server:
forge Raft messages, proposals, joins, replication fetches, acks. With a
cluster secret configured, every internal message carries a trailer:

    payload | sender boot id (8) | sequence (8, BE) | timestamp ns (8, BE) | tag (16) | b"LLA2"

``tag`` is HMAC-SHA256 (truncated to 128 bits) over the three fields, the
subject the message was published on and the payload, so a message is bound
to its subject and cannot be moved to another. HMAC-SHA256 because servers
have SHA extensions: it runs at about 1.5 GB/s here against 0.6 for keyed
BLAKE2b, and replication answers are large.

Replay protection: a message is accepted only if its timestamp lies within
``max_age`` of the receiver's clock and not before the receiver started, and
if its (boot id, sequence) was not seen before on that subscription (a
sliding window of :data:`REPLAY_WINDOW` sequences per sender, as IPsec does).
The boot id is random per process, so a restarted sender starts a new
sequence. What remains: with clocks ``d`` apart, a message captured up to
``d`` before a receiver restarted can be replayed to it once; keep clocks in
sync (NTP) and ``max_age`` short.

Sans-IO: callers pass the time and the boot id; nothing here touches NATS,
clocks or files except :func:`load_key` and :func:`generate_key_file`.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import secrets
import stat
import struct
from collections import Counter
from pathlib import Path
from typing import NoReturn

__all__ = [
    "MIN_KEY_BYTES",
    "REPLAY_WINDOW",
    "TRAILER_SIZE",
    "AuthError",
    "ClusterAuth",
    "KeyFileError",
    "ReplayGuard",
    "generate_key_file",
    "load_key",
    "private_file_problem",
    "secret_entropy_bits",
    "weak_secret_problem",
]

#: The trailer's version: v2 tags cover a request's reply subject too and are used for requests only; every
#: other message keeps v1, byte for byte what servers before v2 send and check. v1 requests (from servers
#: not yet upgraded) are still accepted; a v2 tag cannot pass as v1 (it covers other bytes), so only those
#: older servers' requests can have their reply subject swapped.
MAGIC = b"LLA2"
MAGIC_V1 = b"LLA1"
_FIELDS = struct.Struct(">8sQq")
TAG_SIZE = 16
TRAILER_SIZE = _FIELDS.size + TAG_SIZE + len(MAGIC)
#: Sequences remembered per sender and subscription; older ones are refused as possibly replayed.
REPLAY_WINDOW = 4096
#: Key material shorter than this is refused: a guessable secret protects nothing.
MIN_KEY_BYTES = 16
_SUBJECT_LEN = struct.Struct(">H")


class AuthError(Exception):
    """A message that fails authentication. ``reason`` is one word, for counting: unsigned, forged,
    stale, early, future, replayed."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(detail)


class KeyFileError(ValueError):
    """The cluster secret's file cannot be used; the message names the file and the problem."""


class ReplayGuard:
    """The sequences already accepted, per sender boot id: a sliding window of REPLAY_WINDOW bits."""

    __slots__ = ("_senders", "_window")

    def __init__(self, window: int = REPLAY_WINDOW) -> None:
        self._window = window
        # boot id -> [highest sequence, bit i set = highest - i accepted, newest timestamp seen]
        self._senders: dict[bytes, list[int]] = {}

    def accept(self, boot: bytes, seq: int, timestamp: int) -> bool:
        """True, and remembered, if (boot, seq) is new; False for a repeat or one too old to tell."""
        state = self._senders.get(boot)
        if state is None:
            self._senders[boot] = [seq, 1, timestamp]
            return True
        highest, bits, newest = state
        if seq > highest:
            shift = seq - highest
            state[0] = seq
            state[1] = ((bits << shift) | 1) & ((1 << self._window) - 1) if shift < self._window else 1
            state[2] = max(newest, timestamp)
            return True
        back = highest - seq
        if back >= self._window or bits >> back & 1:
            return False
        state[1] = bits | 1 << back
        return True

    def forget_before(self, timestamp: int) -> None:
        """Drop senders whose newest message is older than ``timestamp``: their messages are refused as
        stale anyway, so their windows are no longer needed."""
        for boot in [b for b, state in self._senders.items() if state[2] < timestamp]:
            del self._senders[boot]

    def __len__(self) -> int:
        return len(self._senders)


class ClusterAuth:
    """Seals and opens internal messages with the cluster secret.

    ``boot``: 8 random bytes for this process (a restarted server is a new
    sender); ``started``: when this process started, in ns (messages stamped
    earlier are refused); ``max_age``: how far, in ns, a timestamp may be from
    the receiver's clock either way.
    """

    def __init__(self, key: bytes, *, boot: bytes, started: int, max_age: int) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the cluster secret needs at least {MIN_KEY_BYTES} bytes, got {len(key)}")
        if len(boot) != 8:
            raise ValueError(f"a boot id has 8 bytes, got {len(boot)}")
        if max_age <= 0:
            raise ValueError(f"max_age must be positive, got {max_age}")
        # Derived, so the same secret could key other uses without one tag standing for another.
        mac_key = hmac.digest(key, b"liftlog cluster messages v1", "sha256")
        #: Keys the ack routes of calls waiting in a server (``liftlog.security.ack_routes``).
        self.route_key = hmac.digest(key, b"liftlog ack routes v1", "sha256")
        self._mac = hmac.new(mac_key, digestmod=hashlib.sha256)
        self._boot = boot
        self._seq = 0
        self.started = started
        self.max_age = max_age

    def _tag(self, fields: bytes | memoryview, subject: str, payload: bytes | memoryview) -> bytes:
        mac = self._mac.copy()
        name = subject.encode()
        mac.update(fields)
        mac.update(_SUBJECT_LEN.pack(len(name)))
        mac.update(name)
        mac.update(payload)
        return mac.digest()[:TAG_SIZE]

    def seal(self, subject: str, payload: bytes, now: int, reply: str = "") -> bytes:
        """``payload`` with its trailer, for publishing on ``subject`` (asking for replies on ``reply``) at
        time ``now`` (ns)."""
        self._seq += 1
        fields = _FIELDS.pack(self._boot, self._seq, now)
        if not reply:  # v1: what servers of every release check, so that a rolling upgrade keeps them talking
            return b"".join((payload, fields, self._tag(fields, subject, payload), MAGIC_V1))
        return b"".join((payload, fields, self._tag(fields, _bound(subject, reply), payload), MAGIC))

    def open(self, subject: str, data: bytes, now: int, guard: ReplayGuard, reply: str = "") -> bytes:
        """The payload of ``data`` received on ``subject`` (with reply subject ``reply``) at ``now``; AuthError
        if it is not an authentic, fresh message from a holder of the secret that ``guard`` has not seen."""
        size = len(data)
        magic = data[size - len(MAGIC) :]
        if size < TRAILER_SIZE or magic not in (MAGIC, MAGIC_V1):
            raise AuthError(
                "unsigned", "the message carries no cluster signature (a server without the secret, or a forgery)"
            )
        if magic == MAGIC:
            subject = _bound(subject, reply)
        at = size - TRAILER_SIZE
        view = memoryview(data)
        fields = view[at : at + _FIELDS.size]
        tag = view[at + _FIELDS.size : size - len(MAGIC)]
        # The cheap checks first: a flood of junk must not cost a MAC each. Their fields are not yet
        # authenticated, so what they refuse is refused whatever its tag says; what they pass is checked next.
        boot, seq, stamp = _FIELDS.unpack(fields)
        if stamp > now + self.max_age or stamp < now - self.max_age or stamp < self.started:
            self._refuse_stamp(stamp, now)
        if not hmac.compare_digest(self._tag(fields, subject, view[:at]), tag):
            raise AuthError("forged", "the message's signature does not match (another secret, or altered)")
        if not guard.accept(bytes(boot), seq, stamp):
            raise AuthError("replayed", "the message was received before (or is too far behind to tell)")
        return data[:at]

    def _refuse_stamp(self, stamp: int, now: int) -> NoReturn:
        if stamp > now + self.max_age:
            raise AuthError("future", f"the message is stamped {(stamp - now) / 1e9:.1f} s ahead of this clock")
        if stamp < now - self.max_age:
            raise AuthError("stale", f"the message is {(now - stamp) / 1e9:.1f} s old")
        raise AuthError("early", "the message is stamped before this server started")


#: A typed secret must reach this many bits, counted from the kinds of characters it uses, and carry at least
#: ``MIN_BITS_PER_CHAR`` bits per character among its own characters (see ``weak_secret_problem``).
MIN_SECRET_BITS = 72
MIN_BITS_PER_CHAR = 2.0
_CLASSES = (
    (frozenset(b"abcdefghijklmnopqrstuvwxyz"), 26),
    (frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"), 26),
    (frozenset(b"0123456789"), 10),
)


def secret_entropy_bits(secret: bytes) -> tuple[float, float]:
    """Two cautious estimates for a secret someone typed: (the length of the unit it repeats, itself if none,
    times log2 of the alphabet its kinds of characters come from; the Shannon entropy of its own characters
    per character)."""
    if not secret:
        return 0.0, 0.0
    present = set(secret)
    alphabet = sum(size for chars, size in _CLASSES if present & chars)
    if present - frozenset().union(*(chars for chars, _ in _CLASSES)):
        alphabet += 33 if all(32 <= c < 127 for c in present) else 256 - 62  # punctuation, or raw bytes
    n = len(secret)
    per_char = max(0.0, -sum(c / n * math.log2(c / n) for c in Counter(secret).values()))
    return _period(secret) * math.log2(alphabet), per_char


def _period(secret: bytes) -> int:
    """The length of the shortest unit ``secret`` repeats ("passwordpassword": 8), or its own length."""
    n = len(secret)
    for p in range(1, n // 2 + 1):
        if n % p == 0 and secret[p:] == secret[:-p]:
            return p
    return n


def weak_secret_problem(secret: bytes) -> str | None:
    """Why ``secret`` is too guessable to protect anything, or None. It stops the obvious (digits only, a
    repeated unit, one character over and over), not dictionary words: `liftlog keygen` makes keys."""
    bits, per_char = secret_entropy_bits(secret)
    if bits >= MIN_SECRET_BITS and per_char >= MIN_BITS_PER_CHAR:
        return None
    if _period(secret) < len(secret) or per_char < MIN_BITS_PER_CHAR:
        why = f"repeats itself (about {min(bits, per_char * len(secret)):.0f} bits)"
    else:
        why = f"draws on too few characters (about {bits:.0f} bits; at least {MIN_SECRET_BITS})"
    return f"looks guessable: it {why}; use random bytes, e.g. from `liftlog keygen FILE`"


def private_file_problem(path: Path) -> str | None:
    """Why ``path`` is too open to hold a secret, or None. As PostgreSQL rules for its TLS key: no access for
    others, and none for the group either unless root owns the file and the group may only read it
    (``root:liftlog 0640``, where a service's group reads a key an administrator owns). A file inside a
    folder nobody else may enter (``mkdtemp``'s 0700, owned by the same user or root) is private whatever its
    own mode says."""
    try:
        st = path.stat()
    except OSError:
        return None  # the read that follows reports it
    mode = stat.S_IMODE(st.st_mode)
    too_open = mode & 0o007 or (mode & 0o070 and (st.st_uid != 0 or mode & 0o030))
    if not too_open or _in_closed_folder(path, st.st_uid):
        return None
    fix = "chmod 600" if st.st_uid != 0 else "chmod 640"
    return (
        f"{path} may be read by {'others' if mode & 0o007 else 'its group'} (mode {mode:04o}): a secret must "
        f"be readable by its owner only (or, owned by root, by its group): run `{fix} {path}`, "
        "or set security.key.permissions.check: false"
    )


def _in_closed_folder(path: Path, owner: int) -> bool:
    for folder in path.resolve().parents:
        try:
            st = folder.stat()
        except OSError:
            return False
        if not stat.S_IMODE(st.st_mode) & 0o011 and st.st_uid in (owner, 0):
            return True
    return False


def load_key(path: Path, *, check_permissions: bool = True) -> bytes:
    """The secret in ``path``: its bytes without surrounding whitespace; KeyFileError if unusable (or, with
    ``check_permissions``, readable by others: ``private_file_problem``)."""
    problem = private_file_problem(path) if check_permissions else None
    if problem is not None:
        raise KeyFileError(f"cluster secret file {problem}")
    try:
        key = path.read_bytes().strip()
    except FileNotFoundError:
        raise KeyFileError(f"cluster secret file {path} does not exist") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read cluster secret file {path}: {exc.strerror or exc}") from None
    if len(key) < MIN_KEY_BYTES:
        raise KeyFileError(
            f"cluster secret file {path} holds {len(key)} bytes; it needs at least {MIN_KEY_BYTES} "
            "(e.g. `liftlog keygen FILE` writes 64 random hex digits)"
        )
    weak = weak_secret_problem(key)
    if weak is not None:
        raise KeyFileError(f"the cluster secret in {path} {weak}")
    return key


def generate_key_file(path: Path) -> bool:
    """Write a new random secret (64 hex digits) to ``path``, readable by its owner only, unless the file
    exists. True if it wrote one."""
    return write_new_private_file(path, secrets.token_hex(32) + "\n")


def write_new_private_file(path: Path, text: str) -> bool:
    """Create ``path`` (and its folder) readable by its owner only, holding ``text``, fsynced; False (and
    nothing written) if it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    return True


def _bound(subject: str, reply: str) -> str:
    """What a v2 tag covers: the subject and, for a request, its reply subject (NATS subjects hold no spaces,
    so the pair is unambiguous)."""
    return f"{subject} {reply}" if reply else subject
