"""Log output: readable lines, or one JSON object per line for log shippers (``logging.format``).

A record about a partition carries ``stream`` and ``partition`` fields, so a
shipper can filter on them. ``PartitionFields`` finds them, in this order:
``extra=about(stream, partition)``; a Partition among the record's arguments
(most lines format one with ``%s``); a message starting ``partition %s/%d``
or ``removed partition %s/%d`` (its first two arguments); a storage path
``<data>/streams/<stream>/<partition>/...`` as the first argument (the
commit log's own lines).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import PurePath
from typing import Any

from liftlog.server.partitions.partition import Partition

__all__ = ["JsonFormatter", "PartitionFields", "about", "setup_logging"]

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}
TEXT_FORMAT = "%(asctime)s %(levelname)-5s %(name)s: %(message)s"


def about(stream: str, partition: int) -> dict[str, Any]:
    """``extra=`` for a log call about one partition whose arguments do not include the partition object."""
    return {"stream": stream, "partition": partition}


_NAMED = ("partition %s/%d", "removed partition %s/%d")


class PartitionFields(logging.Filter):
    """Sets ``stream`` and ``partition`` on records about one partition (see the module docstring)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if hasattr(record, "stream") or not isinstance(record.args, tuple) or not record.args:
            return True
        args = record.args
        for arg in args:
            if isinstance(arg, Partition):
                record.stream, record.partition = arg.stream, arg.id
                return True
        if isinstance(record.msg, str) and record.msg.startswith(_NAMED) and len(args) >= 2:
            record.stream, record.partition = args[0], args[1]
        elif isinstance(args[0], PurePath):
            parts = args[0].parts
            for i in range(len(parts) - 2, 0, -1):
                if parts[i - 1] == "streams" and parts[i + 1].isdigit():
                    record.stream, record.partition = parts[i], int(parts[i + 1])
                    break
        return True


class JsonFormatter(logging.Formatter):
    """``{"time", "level", "logger", "message"[, "stream", "partition"][, "exception"]}`` per line."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        out: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        stream = getattr(record, "stream", None)
        if stream is not None:
            out["stream"] = stream
            out["partition"] = getattr(record, "partition", None)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


#: What logging.raft and logging.nats turn to debug whatever logging.level says.
RAFT_LOGGERS = ("liftlog.raft", "liftlog.server.control.metadata_raft")
NATS_LOGGERS = ("liftlog.server.nats.embedded_nats", "liftlog.natswire", "nats")


def setup_logging(level: str, fmt: str = "text", *, raft: bool = False, nats: bool = False) -> None:
    """The root handler on stderr, at ``level`` (``logging.level``), as text or JSON (``logging.format``);
    ``raft``/``nats`` (logging.raft, logging.nats) log those parts at debug too: the metadata group's
    elections and messages, and the NATS connections with the embedded nats-server's own lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(PartitionFields())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LEVELS.get(level, logging.INFO))
    if level != "debug" and not nats:
        logging.getLogger("nats").setLevel(logging.WARNING)
    for name in (RAFT_LOGGERS if raft else ()) + (NATS_LOGGERS if nats else ()):
        logging.getLogger(name).setLevel(logging.DEBUG)
