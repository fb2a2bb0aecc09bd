"""The activity stream's events as the metadata keeps them: our own frozen type, not the wire's.

An event is decided where the metadata changes (``activity.activity_event``) and kept in the replicated
metadata until the controller has published it; only the publisher (``server.control.activity``) turns
it into Liftbridge's ``ActivityStreamEvent``. The snapshot holds its JSON form.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from liftlog.jsontypes import JSONObject

__all__ = ["ActivityEvent", "ActivityOp"]


class ActivityOp(enum.Enum):
    """What an event reports; the values are the names of Liftbridge's ``ActivityStreamOp``."""

    CREATE_STREAM = "CREATE_STREAM"
    DELETE_STREAM = "DELETE_STREAM"
    PAUSE_STREAM = "PAUSE_STREAM"
    RESUME_STREAM = "RESUME_STREAM"
    SET_STREAM_READONLY = "SET_STREAM_READONLY"
    JOIN_CONSUMER_GROUP = "JOIN_CONSUMER_GROUP"
    LEAVE_CONSUMER_GROUP = "LEAVE_CONSUMER_GROUP"


@dataclass(frozen=True, slots=True)
class ActivityEvent:
    """One event; ``id`` is the Raft index of the operation that made it. Fields an op does not use stay empty."""

    id: int
    op: ActivityOp
    stream: str = ""
    partitions: tuple[int, ...] = ()
    resume_all: bool = False
    readonly: bool = False
    group: str = ""
    consumer: str = ""
    streams: tuple[str, ...] = ()
    expired: bool = False

    def to_dict(self) -> JSONObject:
        out: JSONObject = {"id": self.id, "op": self.op.value}
        for name, value in (("stream", self.stream), ("group", self.group), ("consumer", self.consumer)):
            if value:
                out[name] = value
        if self.partitions:
            out["partitions"] = list(self.partitions)
        if self.streams:
            out["streams"] = list(self.streams)
        for name, flag in (("resume_all", self.resume_all), ("readonly", self.readonly), ("expired", self.expired)):
            if flag:
                out[name] = True
        return out

    @classmethod
    def from_dict(cls, data: object) -> ActivityEvent:
        if not isinstance(data, dict):
            raise TypeError(f"an activity event must be an object, got {type(data).__name__}")
        try:
            op = ActivityOp(data["op"])
        except (KeyError, ValueError) as exc:
            raise TypeError(f"activity event: unknown op {data.get('op')!r}") from exc
        partitions, streams = data.get("partitions", []), data.get("streams", [])
        if not isinstance(partitions, list) or not all(isinstance(p, int) for p in partitions):
            raise TypeError("activity event: partitions must be a list of integers")
        if not isinstance(streams, list) or not all(isinstance(s, str) for s in streams):
            raise TypeError("activity event: streams must be a list of names")
        return cls(
            id=int(data["id"]),
            op=op,
            stream=str(data.get("stream", "")),
            partitions=tuple(partitions),
            resume_all=bool(data.get("resume_all", False)),
            readonly=bool(data.get("readonly", False)),
            group=str(data.get("group", "")),
            consumer=str(data.get("consumer", "")),
            streams=tuple(streams),
            expired=bool(data.get("expired", False)),
        )
