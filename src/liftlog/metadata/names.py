"""Stream names and subjects: the one set of rules the API and the controller both apply.

A stream name becomes a directory name, and Liftbridge puts it inside internal
NATS subjects (``<namespace>.<stream>.<partition>.<leader epoch>.replicate``),
so it must be a valid run of NATS tokens: liftlog keeps that rule (its own
replication subjects name servers, not streams) so that names stay portable. A stream subject must be a valid NATS
subject that cannot match the cluster's own traffic: everything under
``<namespace>.`` (Raft, replication, notifications) and the ``_INBOX.``
inboxes acks and request replies travel on.

:meth:`Metadata.apply` does not use these rules: it must keep applying streams
an older version committed under looser ones (see ``model._check_storable``);
the server skips such streams with :func:`check_stream_usable`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

from liftlog.api.cursors import CURSORS_STREAM

from .model import InvalidStreamError, partition_subject

__all__ = [
    "ACTIVITY_STREAM",
    "CURSORS_STREAM",
    "INBOX_PREFIX",
    "SERVER_INBOX_PREFIX",
    "STREAM_NAME_MAX_LEN",
    "check_stream_usable",
    "internal_stream_subject",
    "is_internal_stream",
    "reserved_subjects",
    "subjects_overlap",
    "validate_ack_inbox",
    "validate_new_stream",
    "validate_stream_name",
    "validate_stream_subject",
    "validate_subject",
]

STREAM_NAME_MAX_LEN = 249
#: The servers' own streams, as Liftbridge names them: consumers' cursors, and the cluster's activity.
ACTIVITY_STREAM = "__activity"
#: Each internal stream's subject under the cluster's namespace (Liftbridge's: ``<namespace>.cursors``).
_INTERNAL_SUFFIXES = {CURSORS_STREAM: "cursors", ACTIVITY_STREAM: "activity"}


def is_internal_stream(name: str) -> bool:
    return name in _INTERNAL_SUFFIXES


def internal_stream_subject(name: str, namespace: str) -> str:
    """The subject of internal stream ``name``: under the namespace, where no user stream may listen."""
    return f"{namespace}.{_INTERNAL_SUFFIXES[name]}"


#: Where NATS clients (nats-py's new_inbox, this server's AckRouter) put ack and reply inboxes.
INBOX_PREFIX = "_INBOX"
#: The servers' private ack inboxes (``liftlog.server.partitions.acks``): only servers send there, sealed.
SERVER_INBOX_PREFIX = "_INBOX.liftlog."

_NAME_CHARS = re.compile(r"[A-Za-z0-9_\-.]+")


def validate_stream_name(name: str) -> None:
    """Letters, digits, ``_``, ``-`` and ``.``, forming non-empty NATS tokens; raises InvalidStreamError."""
    if not name:
        raise InvalidStreamError("stream name is empty")
    if len(name) > STREAM_NAME_MAX_LEN:
        raise InvalidStreamError(
            f"invalid stream name {name[:20]!r}... ({len(name)} characters): use at most {STREAM_NAME_MAX_LEN}"
        )
    if not _NAME_CHARS.fullmatch(name):
        bad = next(c for c in name if not _NAME_CHARS.fullmatch(c))
        raise InvalidStreamError(
            f"invalid stream name {name!r}: {bad!r} is not allowed; use letters, digits, '_', '-' or '.'"
        )
    if name.startswith(".") or name.endswith(".") or ".." in name:
        raise InvalidStreamError(
            f"invalid stream name {name!r}: the name is used in NATS subjects, so it must not start or end "
            "with '.' or contain '..' (every dot-separated part must be non-empty)"
        )


def _bad_char(text: str) -> str | None:
    for c in text:
        if c.isspace() or unicodedata.category(c) == "Cc":
            return c
    return None


def validate_subject(subject: str) -> None:
    """A NATS subject: non-empty dot-separated tokens, ``*`` as a whole token, ``>`` as a whole last token."""
    if not subject:
        raise InvalidStreamError("subject is empty")
    bad = _bad_char(subject)
    if bad is not None:
        raise InvalidStreamError(
            f"invalid subject {subject!r}: it contains {bad!r}; subjects must not contain whitespace "
            "or control characters"
        )
    tokens = subject.split(".")
    for i, token in enumerate(tokens):
        if token == "*" or (token == ">" and i == len(tokens) - 1):
            continue
        if not token or "*" in token or ">" in token:
            raise InvalidStreamError(
                f"invalid subject {subject!r}: token {i + 1} ({token!r}) must be non-empty, "
                "and '*' or '>' only as a whole token ('>' only last)"
            )


def validate_ack_inbox(inbox: str, namespace: str) -> None:
    """An ack inbox a client names: a subject the server may publish an ack to on its behalf.

    A literal NATS subject (no whitespace or control characters, no empty tokens, no wildcards), and
    none that only the servers or NATS itself speak on: the cluster's namespace, the servers' private
    inboxes, and ``$``-subjects (``$SYS``, ``$JS.API``, ...). Raises InvalidStreamError naming the rule.
    """
    try:
        validate_subject(inbox)
    except InvalidStreamError as exc:
        raise InvalidStreamError(f"ack inbox: {exc}") from None
    tokens = inbox.split(".")
    if "*" in tokens or tokens[-1] == ">":
        raise InvalidStreamError(f"invalid ack inbox {inbox!r}: an ack goes to one subject, not a wildcard")
    if inbox == namespace or inbox.startswith(namespace + "."):
        raise InvalidStreamError(
            f"invalid ack inbox {inbox!r}: subjects under {namespace + '.>'!r} are the cluster's own "
            f"(clustering.namespace {namespace!r})"
        )
    if inbox + "." == SERVER_INBOX_PREFIX or inbox.startswith(SERVER_INBOX_PREFIX):
        raise InvalidStreamError(
            f"invalid ack inbox {inbox!r}: subjects under {SERVER_INBOX_PREFIX + '>'!r} are the servers' private "
            "ack inboxes"
        )
    if inbox.startswith("$"):
        raise InvalidStreamError(
            f"invalid ack inbox {inbox!r}: '$' subjects belong to NATS itself ($SYS, $JS.API, ...)"
        )


def subjects_overlap(a: str, b: str) -> bool:
    """Whether some subject matches both (valid) patterns ``a`` and ``b``."""
    ta, tb = a.split("."), b.split(".")
    for i in range(max(len(ta), len(tb))):
        if i >= len(ta) or i >= len(tb):
            return False  # one pattern is longer and the shorter has no '>' to absorb the rest
        x, y = ta[i], tb[i]
        if x == ">" or y == ">":
            return True  # both have a token here, and '>' takes it and anything after
        if x != y and x != "*" and y != "*":
            return False
    return True


def reserved_subjects(namespace: str) -> tuple[str, ...]:
    """Patterns covering the traffic a stream must never record."""
    return (f"{namespace}.>", f"{INBOX_PREFIX}.>")


def _check_not_reserved(subject: str, namespace: str, what: str) -> None:
    if subject == ">":
        raise InvalidStreamError(
            f"invalid {what} '>': it matches every subject, including other streams' and the cluster's "
            "internal ones; use a narrower subject such as 'orders.>'"
        )
    for reserved in reserved_subjects(namespace):
        if subjects_overlap(subject, reserved):
            owner = (
                f"the cluster's internal subjects (clustering.namespace {namespace!r})"
                if reserved.startswith(namespace + ".")
                else "ack and reply inboxes"
            )
            raise InvalidStreamError(
                f"invalid {what} {subject!r}: it could match {reserved!r}, reserved for {owner}; "
                "a stream must not listen there"
            )


def validate_stream_subject(subject: str, namespace: str) -> None:
    """A valid subject that cannot match internal traffic of the cluster in ``namespace``."""
    validate_subject(subject)
    _check_not_reserved(subject, namespace, "subject")


def validate_new_stream(name: str, subject: str, partitions: int, namespace: str) -> None:
    """Everything about a new stream's name and subject(s); ``partitions`` is its partition count."""
    validate_stream_name(name)
    if is_internal_stream(name):
        raise InvalidStreamError(f"stream name {name!r} is reserved for the servers' own stream of that name")
    validate_stream_subject(subject, namespace)
    if partitions > 1 and subject.endswith(">"):
        raise InvalidStreamError(
            f"subject {subject!r} ends with '>', so partition subjects ({subject}.1 ...) would not be valid; "
            "use one partition or a subject without '>'"
        )
    if partitions > 1:
        # Every reserved pattern is "<token>.>", so partition subjects "<subject>.<n>" overlap them all alike
        # or not at all: checking one keeps this O(1) for any requested partition count.
        _check_not_reserved(partition_subject(subject, 1), namespace, "subject of partition 1")


def check_stream_usable(name: str, subjects: Iterable[str], namespace: str) -> None:
    """Raise InvalidStreamError if a committed stream's name or a partition subject breaks today's rules."""
    validate_stream_name(name)
    if is_internal_stream(name):  # under the namespace by design: exactly its own subjects
        base = internal_stream_subject(name, namespace)
        for subject in subjects:
            if subject != base and not (subject.startswith(base + ".") and subject[len(base) + 1 :].isdigit()):
                raise InvalidStreamError(f"internal stream {name!r} has the foreign subject {subject!r}")
        return
    for subject in subjects:
        validate_stream_subject(subject, namespace)
