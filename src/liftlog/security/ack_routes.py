"""Correlation ids for acks that a call in a server waits for: unguessable, and signed where the cluster has a secret.

A Publish that a server makes for a gRPC call goes out on NATS with the
server's private inbox (``_INBOX.liftlog.<server>.<random>``) and one of
these ids; the partition's leader sends its ack there. The id is the only
thing that ties an ack to its call, so it must not be guessable:

    id = hex(token)            without a cluster secret (32 hex digits)
    id = hex(token | tag)      with one (64 hex digits)

``token`` is 16 random bytes (128 bits). ``tag`` is keyed BLAKE2b (128-bit
output), keyed by a key derived from the cluster secret, over the token, the
inbox, the subject the message is published on and the ack policy. BLAKE2b's
keyed mode rather than HMAC-SHA256 (as ``cluster_auth`` uses for large
messages) because a tag is made per publish over about 80 bytes: 0.85 against
2.8-3.4 us here. A leader
acks to another server's inbox only if the tag holds, so a client that
copies an inbox and id out of an envelope it saw on NATS cannot have a
leader send an ack for its own message (on another subject, or with ack
LEADER where the original asked for ALL) to the waiting call. The waiting
server checks the ack's stream, subjects and policy itself as well
(``liftlog.server.partitions.acks``).

Sans-IO but for the random bytes (``os.urandom``, read in blocks: one system call per 256 ids).
"""

from __future__ import annotations

import hashlib
import hmac
import os

__all__ = ["RouteIds"]

TOKEN_BYTES = 16
TAG_BYTES = 16
_BLOCK = 256 * TOKEN_BYTES


class RouteIds:
    """Makes and checks route ids; ``key`` None: unsigned ids (a cluster without a secret)."""

    __slots__ = ("_at", "_key", "_pool")

    def __init__(self, key: bytes | None) -> None:
        self._key = key
        self._pool = b""
        self._at = 0

    @property
    def signed(self) -> bool:
        return self._key is not None

    def _token(self) -> bytes:
        at = self._at
        if at >= len(self._pool):
            self._pool, at = os.urandom(_BLOCK), 0
        self._at = at + TOKEN_BYTES
        return self._pool[at : at + TOKEN_BYTES]

    def _tag(self, token: bytes, inbox: str, subject: str, policy: int) -> bytes:
        assert self._key is not None
        signed = b"\0".join((token, inbox.encode(), subject.encode(), str(policy).encode()))
        return hashlib.blake2b(signed, key=self._key, digest_size=TAG_BYTES).digest()

    def new(self, inbox: str, subject: str, policy: int) -> str:
        """A fresh id for a message to ``subject`` whose ack (with ``policy``) goes to ``inbox``."""
        token = self._token()
        if self._key is None:
            return token.hex()
        return (token + self._tag(token, inbox, subject, policy)).hex()

    def valid(self, correlation_id: str, inbox: str, subject: str, policy: int) -> bool:
        """Whether a leader may ack to ``inbox`` with this id: signed for exactly this inbox, subject and policy
        (always True without a secret: then anyone on the NATS account can speak as a server anyway)."""
        if self._key is None:
            return True
        if len(correlation_id) != 2 * (TOKEN_BYTES + TAG_BYTES):
            return False
        try:
            raw = bytes.fromhex(correlation_id)
        except ValueError:
            return False
        token, tag = raw[:TOKEN_BYTES], raw[TOKEN_BYTES:]
        return hmac.compare_digest(self._tag(token, inbox, subject, policy), tag)
