"""The metadata state machine: operations, validation, persistence."""

from __future__ import annotations

from pathlib import Path

import pytest

from liftlog.metadata import (
    CorruptMetadataError,
    CreateStream,
    DeleteStream,
    InvalidStreamError,
    Metadata,
    MetadataFile,
    NoSuchPartitionError,
    NoSuchStreamError,
    PartitionMeta,
    SetPaused,
    SetReadonly,
    StreamExistsError,
    StreamMeta,
    StreamSettings,
    partition_subject,
    validate_stream_name,
    validate_subject,
)


def stream(name: str = "orders", subject: str = "orders", partitions: int = 2) -> StreamMeta:
    s = StreamMeta(name=name, subject=subject, group="", creation_timestamp=1, settings=StreamSettings(min_isr=1))
    for i in range(partitions):
        s.partitions[i] = PartitionMeta(name, i, partition_subject(subject, i), "a", ["a"], ["a"])
    return s


def test_partition_subjects_follow_liftbridge() -> None:
    assert partition_subject("foo.bar", 0) == "foo.bar"
    assert partition_subject("foo.bar", 3) == "foo.bar.3"


@pytest.mark.parametrize("name", ["", "a b", "a/b", "..", ".", "x" * 250, "caf\u00e9"])
def test_invalid_stream_names_are_rejected(name: str) -> None:
    with pytest.raises(InvalidStreamError, match="stream name"):
        validate_stream_name(name)


@pytest.mark.parametrize("subject", ["", "a..b", "a.b.", "a b", "a.>.b", "a*", "foo.b>"])
def test_invalid_subjects_are_rejected(subject: str) -> None:
    with pytest.raises(InvalidStreamError, match="subject"):
        validate_subject(subject)


@pytest.mark.parametrize("subject", ["a", "a.b", "a.*", "a.>", "*.b.>", ">"])
def test_wildcard_subjects_are_accepted(subject: str) -> None:
    validate_subject(subject)


def test_create_twice_is_rejected_and_changes_nothing() -> None:
    meta = Metadata()
    meta.apply(CreateStream(stream()))
    with pytest.raises(StreamExistsError, match="orders"):
        meta.apply(CreateStream(stream(subject="other")))
    assert meta.stream("orders").subject == "orders"


def test_delete_unknown_stream() -> None:
    with pytest.raises(NoSuchStreamError, match="nope"):
        Metadata().apply(DeleteStream("nope"))


def test_pause_records_timestamps_and_resume_all() -> None:
    meta = Metadata()
    meta.apply(CreateStream(stream()))
    changed = meta.apply(SetPaused("orders", (0,), True, 100, resume_all=True))
    assert [p.id for p in changed] == [0]
    meta.apply(SetPaused("orders", (1,), True, 200))  # resume_all now False again
    meta.apply(SetPaused("orders", (0, 1), True, 300, resume_all=True))
    p0 = meta.partition("orders", 0)
    assert (p0.pause_timestamps.first, p0.pause_timestamps.latest) == (100, 100)  # already paused at 300
    resumed = meta.apply(SetPaused("orders", (1,), False, 400))
    assert sorted(p.id for p in resumed) == [0, 1]
    assert not any(p.paused for p in meta.stream("orders").partitions.values())


def test_unknown_partition_in_an_operation() -> None:
    meta = Metadata()
    meta.apply(CreateStream(stream()))
    with pytest.raises(NoSuchPartitionError, match="no partition 7"):
        meta.apply(SetReadonly("orders", (0, 7), True, 1))
    assert not meta.partition("orders", 0).readonly


def test_round_trip_through_the_file(tmp_path: Path) -> None:
    meta = Metadata()
    meta.apply(CreateStream(stream()))
    meta.apply(SetReadonly("orders", (1,), True, 5))
    store = MetadataFile(tmp_path / "metadata.json")
    store.save(meta)
    loaded = store.load()
    assert loaded.to_dict() == meta.to_dict()
    assert loaded.partition("orders", 1).readonly_timestamps.latest == 5
    assert loaded.stream("orders").settings.min_isr == 1


def test_missing_file_is_empty_and_corrupt_file_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "metadata.json"
    assert MetadataFile(path).load().streams == {}
    path.write_text("{not json")
    with pytest.raises(CorruptMetadataError, match=r"metadata\.json"):
        MetadataFile(path).load()
