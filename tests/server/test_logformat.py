"""Log output as JSON lines, with the stream and partition of lines about one partition."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from liftlog.server.ops.logformat import JsonFormatter, PartitionFields, about


def record(msg: str, *args: object, name: str = "liftlog.test", **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)
    for key, value in extra.items():
        setattr(rec, key, value)
    PartitionFields().filter(rec)
    return rec


def formatted(rec: logging.LogRecord) -> dict[str, object]:
    line = JsonFormatter().format(rec)
    assert "\n" not in line
    out = json.loads(line)
    assert isinstance(out, dict)
    return out


def test_one_object_per_line_with_time_level_logger_message() -> None:
    out = formatted(record('quote " and\nnewline: %s', "ünïcode"))
    assert out["level"] == "warning" and out["logger"] == "liftlog.test"
    assert out["message"] == 'quote " and\nnewline: ünïcode'
    assert str(out["time"]).endswith("Z") and "T" in str(out["time"])
    assert "stream" not in out


def test_partition_fields_from_extra_a_named_message_and_a_storage_path() -> None:
    assert formatted(record("x %d", 1, **about("orders", 3)))["stream"] == "orders"
    out = formatted(record("partition %s/%d is fenced: %s", "orders", 2, "disk full"))
    assert (out["stream"], out["partition"]) == ("orders", 2)
    out = formatted(record("%s: deleted by retention", Path("/data/streams/my-stream/7/00000000000000000000.log")))
    assert (out["stream"], out["partition"]) == ("my-stream", 7)
    assert "stream" not in formatted(record("%s: nothing about a partition", Path("/data/raft/log")))


def test_a_partition_among_the_arguments_names_itself() -> None:
    from liftlog.metadata import PartitionMeta
    from liftlog.server.partitions.partition import Partition, PartitionOptions
    from liftlog.storage import LogConfig

    part = Partition(
        PartitionMeta(stream="clicks", id=5, subject="clicks", leader="a", replicas=["a"], isr=["a"]),
        directory=Path("/nonexistent"),
        options=PartitionOptions(LogConfig()),
        queue_group="g",
        ack_sink=lambda ack: None,
    )
    out = formatted(record("%s: leading in leader epoch %d", part, 4))
    assert (out["stream"], out["partition"]) == ("clicks", 5)


def test_exceptions_stay_inside_the_object() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        rec = logging.LogRecord("liftlog.x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    out = formatted(rec)
    assert "ValueError: boom" in str(out["exception"])
