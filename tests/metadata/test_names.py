"""The rules for stream names and subjects, shared by the API and the controller."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from liftlog.metadata import (
    CreateStream,
    InvalidStreamError,
    Metadata,
    PartitionMeta,
    StreamMeta,
    StreamSettings,
    check_stream_usable,
    partition_subject,
    subjects_overlap,
    validate_new_stream,
    validate_stream_name,
    validate_stream_subject,
    validate_subject,
)
from liftlog.metadata.names import reserved_subjects

NS = "liftbridge-default"


# --- stream names ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        (".x", "must not start or end with '.'"),
        ("x.", "must not start or end with '.'"),
        (".", "must not start or end with '.'"),
        ("..", "must not start or end with '.'"),
        ("...", "must not start or end with '.'"),
        ("a..b", "contain '..'"),
        ("", "stream name is empty"),
        ("a b", "' ' is not allowed"),
        ("a/b", "'/' is not allowed"),
        ("a\x00b", r"'\\x00' is not allowed"),
        ("caf\u00e9", "'\u00e9' is not allowed"),
        ("a*", "'\\*' is not allowed"),
        ("x" * 250, "250 characters.*at most 249"),
    ],
)
def test_invalid_stream_names_name_the_rule(name: str, rule: str) -> None:
    with pytest.raises(InvalidStreamError, match=rule) as err:
        validate_stream_name(name)
    assert "stream name" in str(err.value)


@pytest.mark.parametrize("name", ["a", "orders", "a.b", "a-b_c.d9", "A.1.-._", "x" * 249])
def test_valid_stream_names_are_accepted(name: str) -> None:
    validate_stream_name(name)


# A NATS subject one can publish and subscribe to: non-empty tokens of printable, non-space characters.
_PLAIN_SUBJECT = re.compile(r"[!-~]+(\.[!-~]+)*")


@given(st.text(alphabet="ab9_-.", min_size=1, max_size=12))
def test_every_accepted_name_is_a_run_of_nats_tokens(name: str) -> None:
    """What Liftbridge requires (its replication subjects embed the name); liftlog keeps the rule."""
    try:
        validate_stream_name(name)
    except InvalidStreamError:
        return
    assert _PLAIN_SUBJECT.fullmatch(name), name
    tokens = name.split(".")
    assert "" not in tokens and "*" not in tokens and ">" not in tokens
    validate_subject(f"{NS}.{name}.0")


@given(st.text(alphabet="ab9_-.", min_size=1, max_size=12))
def test_names_with_empty_tokens_are_refused(name: str) -> None:
    empty_token = "" in name.split(".")
    try:
        validate_stream_name(name)
    except InvalidStreamError:
        assert empty_token
    else:
        assert not empty_token


# --- subject syntax ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("subject", "rule"),
    [
        ("", "subject is empty"),
        ("a..b", "token 2 \\(''\\) must be non-empty"),
        ("a.b.", "token 3 \\(''\\) must be non-empty"),
        ("a.>.b", "'>' only last"),
        ("a*", "'\\*' or '>' only as a whole token"),
        ("foo.b>", "'\\*' or '>' only as a whole token"),
        ("a b", "contains ' '.*whitespace or control characters"),
        ("a\tb", "contains '\\\\t'"),
        ("a\x00b", "contains '\\\\x00'"),
        ("a\x7fb", "contains '\\\\x7f'"),
    ],
)
def test_invalid_subjects_name_the_rule(subject: str, rule: str) -> None:
    with pytest.raises(InvalidStreamError, match=rule) as err:
        validate_subject(subject)
    assert repr(subject) in str(err.value) or not subject


# --- subjects a stream may listen on ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("subject", "rule"),
    [
        (">", "'>': it matches every subject"),
        (f"{NS}.>", f"could match '{NS}.>', reserved for the cluster's internal subjects"),
        (f"{NS}.raft.>", f"could match '{NS}.>'"),
        (f"{NS}.orders", f"could match '{NS}.>'"),
        ("*.>", f"could match '{NS}.>'"),
        ("*.raft.>", f"could match '{NS}.>'"),
        ("*.*", f"could match '{NS}.>'"),
        ("_INBOX.>", "could match '_INBOX.>', reserved for ack and reply inboxes"),
        ("_INBOX.liftlog.a.b", "could match '_INBOX.>'"),
        ("_INBOX.*", "could match '_INBOX.>'"),
    ],
)
def test_subjects_that_could_match_internal_traffic_are_refused(subject: str, rule: str) -> None:
    with pytest.raises(InvalidStreamError, match=re.escape(rule) if "'>'" not in rule else rule) as err:
        validate_stream_subject(subject, NS)
    assert repr(subject) in str(err.value)


def test_the_reserved_namespace_is_the_configured_one() -> None:
    validate_stream_subject("custom.raft.>", NS)
    with pytest.raises(InvalidStreamError, match=r"clustering\.namespace 'custom'"):
        validate_stream_subject("custom.raft.>", "custom")


@pytest.mark.parametrize("subject", ["orders", "orders.*", "orders.>", "*", "a.*.c", NS, "_INBOX", "other.raft.>"])
def test_ordinary_subjects_are_accepted(subject: str) -> None:
    validate_stream_subject(subject, NS)


def test_partition_subjects_must_stay_clear_of_internal_ones_too() -> None:
    validate_new_stream("s", "*", 1, NS)
    with pytest.raises(InvalidStreamError, match=re.escape("subject of partition 1 '*.1': it could match")):
        validate_new_stream("s", "*", 2, NS)
    with pytest.raises(InvalidStreamError, match=re.escape(f"subject of partition 1 '{NS}.1'")):
        validate_new_stream("s", NS, 2, NS)
    with pytest.raises(InvalidStreamError, match="ends with '>'"):
        validate_new_stream("s", "orders.>", 2, NS)
    validate_new_stream("s", "orders.*", 3, NS)


def test_a_huge_partition_count_is_checked_at_once() -> None:
    # The API checks before the controller's partition limits: the check must not walk every partition.
    validate_new_stream("s", "orders", 2**40, NS)
    with pytest.raises(InvalidStreamError, match="subject of partition 1"):
        validate_new_stream("s", "*", 2**40, NS)


# --- overlap of two patterns ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "overlap"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
        ("a.*", "a.b", True),
        ("*.b", "a.*", True),
        ("a", "a.>", False),
        ("a.b", "a.>", True),
        ("a.b.c.d", "a.>", True),
        ("*", "a.>", False),
        ("*.*.c", "a.>", True),
        ("b.>", "a.>", False),
        (">", "x", True),
        ("a.b", "a.b.c", False),
        ("*.x.>", "a.*.y", True),
    ],
)
def test_subjects_overlap(a: str, b: str, overlap: bool) -> None:
    assert subjects_overlap(a, b) is overlap
    assert subjects_overlap(b, a) is overlap


def _matches(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    if p[-1] == ">":
        return len(s) >= len(p) and all(x in ("*", y) for x, y in zip(p[:-1], s, strict=False))
    return len(s) == len(p) and all(x in ("*", y) for x, y in zip(p, s, strict=True))


_patterns = st.lists(st.sampled_from(["a", "b", "*"]), min_size=1, max_size=4).flatmap(
    lambda tokens: st.sampled_from([".".join(tokens), ".".join([*tokens, ">"])])
) | st.just(">")


@given(_patterns, _patterns)
def test_overlap_agrees_with_brute_force(a: str, b: str) -> None:
    # Subjects over the patterns' tokens plus one neither names, up to one token longer than both: if any
    # subject matches both, one of these does.
    longest = max(len(a.split(".")), len(b.split("."))) + 1
    common = any(
        _matches(a, ".".join(s)) and _matches(b, ".".join(s))
        for n in range(1, longest + 1)
        for s in itertools.product(["a", "b", "z"], repeat=n)
    )
    assert subjects_overlap(a, b) is common


def _with_reserved_tokens(pattern: str) -> str:
    """``pattern`` with token a as the namespace and b as the inbox prefix."""
    return ".".join({"a": NS, "b": "_INBOX"}.get(t, t) for t in pattern.split("."))


@given(_patterns, st.integers(2, 30))
def test_partition_one_stands_for_every_partition(subject: str, partitions: int) -> None:
    subject = _with_reserved_tokens(subject)
    if subject.endswith(">"):
        return

    def reserved(s: str) -> bool:
        return any(subjects_overlap(s, r) for r in reserved_subjects(NS))

    expected = [reserved(partition_subject(subject, i)) for i in range(1, partitions)]
    assert expected == [reserved(partition_subject(subject, 1))] * (partitions - 1)


@given(_patterns)
def test_no_accepted_subject_overlaps_the_reserved_ones(subject: str) -> None:
    subject = _with_reserved_tokens(subject)
    try:
        validate_stream_subject(subject, NS)
    except InvalidStreamError:
        return
    assert not any(subjects_overlap(subject, r) for r in reserved_subjects(NS))


# --- committed streams under older rules ---------------------------------------------------------------


def _legacy(name: str, subject: str, partitions: int = 1) -> StreamMeta:
    s = StreamMeta(name=name, subject=subject, group="", creation_timestamp=1, settings=StreamSettings())
    for i in range(partitions):
        s.partitions[i] = PartitionMeta(name, i, partition_subject(subject, i), "a", ["a"], ["a"])
    return s


@pytest.mark.parametrize(("name", "subject"), [(".x", "x"), ("a..b", "x"), ("...", "x"), ("ok", ">")])
def test_streams_an_older_version_committed_still_apply_and_restore(name: str, subject: str) -> None:
    meta = Metadata()
    meta.apply(CreateStream(_legacy(name, subject)))
    assert Metadata.from_dict(meta.to_dict()).stream(name).subject == subject
    with pytest.raises(InvalidStreamError):
        check_stream_usable(name, [subject], NS)


def test_a_legacy_multi_partition_full_wildcard_stream_is_unusable() -> None:
    stream = _legacy("old", "old.>", partitions=2)
    with pytest.raises(InvalidStreamError, match=re.escape("'old.>.1'")):
        check_stream_usable(stream.name, [p.subject for p in stream.partitions.values()], NS)
    check_stream_usable("old", ["old.*", "old.*.1"], NS)
