"""The ``liftlog`` Spark format's options, parsed and checked before any task runs.

Names follow Spark's Kafka source (``servers`` stands for its
``kafka.bootstrap.servers``): ``stream`` / ``streamPattern`` / ``assign``,
``startingOffsets``, ``endingOffsets``, ``startingTimestamp``,
``maxOffsetsPerTrigger``, ``minOffsetsPerTrigger`` with ``maxTriggerDelay``,
``failOnDataLoss``, ``includeHeaders``. Names are case-insensitive. Every
mistake, including an unknown name or a combination that makes no sense for
the kind of query, raises :class:`OptionError` naming the option.

Pure Python: importing this module does not import pyspark.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from liftlog.client.errors import ConfigurationError
from liftlog.client.tls import TlsConfig

from .offsets import EARLIEST

__all__ = [
    "Assign",
    "OptionError",
    "ReadOptions",
    "StreamList",
    "StreamPattern",
    "WriteOptions",
    "parse_read_options",
    "parse_write_options",
]


#: What the user may write for starting/ending offsets: a keyword or stream -> partition -> offset.
OffsetSpec = Literal["earliest", "latest"] | dict[str, dict[int, int]]


class OptionError(ValueError):
    """A ``liftlog`` source or sink option that is missing, malformed or not allowed here."""


@dataclass(frozen=True, slots=True)
class StreamList:
    streams: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StreamPattern:
    pattern: re.Pattern[str]


@dataclass(frozen=True, slots=True)
class Assign:
    partitions: dict[str, tuple[int, ...]]


Subscription = StreamList | StreamPattern | Assign


@dataclass(frozen=True, slots=True)
class ReadOptions:
    servers: tuple[str, ...]
    subscription: Subscription
    starting_offsets: OffsetSpec
    #: None when streaming (a streaming query has no end).
    ending_offsets: OffsetSpec | None
    #: Unix ms: start each partition at its first message at or after this time.
    starting_timestamp: int | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    fail_on_data_loss: bool = True
    include_headers: bool = False
    #: Split reads into at least this many tasks (None: the driver's core count).
    min_partitions: int | None = None
    #: TLS to the servers (options tls.ca, tls.cert, tls.key, tls.serverName); None: plain text.
    tls: TlsConfig | None = None

    @property
    def starting_option(self) -> str:
        """The option the starting offsets came from, for error messages."""
        return "startingTimestamp" if self.starting_timestamp is not None else "startingOffsets"


@dataclass(frozen=True, slots=True)
class WriteOptions:
    servers: tuple[str, ...]
    #: The target stream when the rows have no ``stream`` column.
    stream: str | None = None
    tls: TlsConfig | None = None


#: TLS to the servers: the files must be readable where the tasks run (each executor).
_TLS = {"tls.ca", "tls.cert", "tls.key", "tls.servername"}
_READ = {
    "servers",
    "stream",
    "streampattern",
    "assign",
    "startingoffsets",
    "endingoffsets",
    "startingtimestamp",
    "maxoffsetspertrigger",
    "minoffsetspertrigger",
    "maxtriggerdelay",
    "failondataloss",
    "includeheaders",
    "minpartitions",
    *_TLS,
}
_WRITE = {"servers", "stream", *_TLS}
#: Options Spark itself reads (and passes on to every source); not ours to judge.
_SPARK_OWNED = {"path", "checkpointlocation", "queryname"}
_SPELLING = {
    name.lower(): name
    for name in (
        "servers",
        "stream",
        "streamPattern",
        "assign",
        "startingOffsets",
        "endingOffsets",
        "startingTimestamp",
        "maxOffsetsPerTrigger",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "failOnDataLoss",
        "includeHeaders",
        "minPartitions",
        "tls.ca",
        "tls.cert",
        "tls.key",
        "tls.serverName",
    )
}
_STREAMING_ONLY = ("maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay")
_DURATION = re.compile(r"\s*(\d+)\s*(ms|s|m|min|h|d)?\s*", re.IGNORECASE)
_DURATION_MS = {None: 1, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _lower(options: Mapping[str, str], known: set[str], kind: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in options.items():
        key = name.lower()
        if key in _SPARK_OWNED:
            continue
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hint = f"; did you mean {_SPELLING[close[0]]!r}?" if close else ""
            names = ", ".join(_SPELLING[k] for k in sorted(known))
            raise OptionError(f"unknown liftlog {kind} option {name!r}{hint} (known: {names})")
        out[key] = value
    return out


def _servers(opts: Mapping[str, str]) -> tuple[str, ...]:
    raw = opts.get("servers", "")
    servers = tuple(s.strip() for s in raw.split(",") if s.strip())
    if not servers:
        raise OptionError("option 'servers' is required: comma-separated host:port of liftlog servers")
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise OptionError(f"option 'servers': {server!r} is not host:port")
    return servers


def _tls(opts: Mapping[str, str]) -> TlsConfig | None:
    given = {key: opts[key].strip() for key in _TLS if opts.get(key, "").strip()}
    if not given:
        return None
    try:
        tls = TlsConfig(
            ca=given.get("tls.ca"),
            cert=given.get("tls.cert"),
            key=given.get("tls.key"),
            server_name=given.get("tls.servername"),
        )
        tls.context()  # on the driver: a missing or unreadable file fails here, naming it
    except ConfigurationError as exc:
        raise OptionError(f"options tls.*: {exc}") from None
    return tls


def _subscription(opts: Mapping[str, str]) -> Subscription:
    given = [k for k in ("stream", "streampattern", "assign") if opts.get(k, "").strip()]
    if len(given) != 1:
        which = ", ".join(_SPELLING[k] for k in given) if given else "none"
        raise OptionError(f"give exactly one of 'stream', 'streamPattern' or 'assign' (got {which})")
    kind = given[0]
    text = opts[kind].strip()
    if kind == "stream":
        return StreamList(tuple(s.strip() for s in text.split(",") if s.strip()))
    if kind == "streampattern":
        try:
            return StreamPattern(re.compile(text))
        except re.error as exc:
            raise OptionError(f"option 'streamPattern': {text!r} is not a regular expression: {exc}") from None
    try:
        body = json.loads(text)
    except ValueError:
        raise OptionError(f"option 'assign': {text!r} is not JSON like {{\"stream\":[0,1]}}") from None
    if not isinstance(body, dict) or not body:
        raise OptionError("option 'assign' must be a JSON object like {\"stream\":[0,1]}")
    parts: dict[str, tuple[int, ...]] = {}
    for stream, ids in body.items():
        if (
            not isinstance(ids, list)
            or not ids
            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
        ):
            raise OptionError(f"option 'assign': stream {stream!r} needs a non-empty list of partition numbers")
        parts[str(stream)] = tuple(sorted(set(ids)))
    return Assign(parts)


def _offsets(opts: Mapping[str, str], key: str, default: str) -> OffsetSpec:
    name = _SPELLING[key]
    text = opts.get(key, default).strip()
    if text.lower() in ("earliest", "latest"):
        return "earliest" if text.lower() == "earliest" else "latest"
    try:
        body = json.loads(text)
    except ValueError:
        raise OptionError(
            f"option {name!r}: {text!r} is neither 'earliest', 'latest' nor JSON like "
            '{"stream":{"0":23,"1":-2}}'
        ) from None
    if not isinstance(body, dict) or not body:
        raise OptionError(f'option {name!r} must be a JSON object like {{"stream":{{"0":23,"1":-2}}}}')
    spec: dict[str, dict[int, int]] = {}
    for stream, parts in body.items():
        if not isinstance(parts, dict) or not parts:
            raise OptionError(f"option {name!r}: stream {stream!r} needs an object of partition -> offset")
        spec[str(stream)] = {}
        for pid, offset in parts.items():
            if not str(pid).isdigit() or not isinstance(offset, int) or isinstance(offset, bool) or offset < EARLIEST:
                raise OptionError(
                    f"option {name!r}: stream {stream!r} partition {pid!r} -> {offset!r}: partitions are numbers, "
                    "offsets are >= 0, or -2 (earliest) / -1 (latest)"
                )
            spec[str(stream)][int(pid)] = offset
    return spec


def _int(opts: Mapping[str, str], key: str, minimum: int = 1) -> int | None:
    if key not in opts:
        return None
    text = opts[key].strip()
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option {_SPELLING[key]!r}: {text!r} is not a whole number") from None
    if value < minimum:
        raise OptionError(f"option {_SPELLING[key]!r} must be at least {minimum}, got {value}")
    return value


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    if key not in opts:
        return default
    text = opts[key].strip().lower()
    if text not in ("true", "false"):
        raise OptionError(f"option {_SPELLING[key]!r} must be true or false, got {opts[key]!r}")
    return text == "true"


def _duration_ms(opts: Mapping[str, str], key: str, default: int) -> int:
    if key not in opts:
        return default
    match = _DURATION.fullmatch(opts[key])
    if match is None:
        raise OptionError(f"option {_SPELLING[key]!r}: {opts[key]!r} is not a duration like 500ms, 30s or 15m")
    unit = match.group(2).lower() if match.group(2) else None
    return int(match.group(1)) * _DURATION_MS[unit]


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    """Check the options of ``spark.read`` (``streaming=False``) or ``spark.readStream``."""
    opts = _lower(options, _READ, "source")
    kind = "streaming" if streaming else "batch"
    if streaming and "endingoffsets" in opts:
        raise OptionError("option 'endingOffsets' is for batch queries only: a streaming query has no end")
    if not streaming:
        for key in _STREAMING_ONLY:
            if key in opts:
                raise OptionError(f"option {_SPELLING[key]!r} is for streaming queries only (this is a {kind} read)")
    if "startingtimestamp" in opts and "startingoffsets" in opts:
        raise OptionError("give 'startingOffsets' or 'startingTimestamp', not both")
    starting = _offsets(opts, "startingoffsets", "earliest" if not streaming else "latest")
    ending = None if streaming else _offsets(opts, "endingoffsets", "latest")
    if not streaming and starting == "latest":
        raise OptionError("option 'startingOffsets' cannot be 'latest' in a batch query: it would read nothing")
    if ending == "earliest" or (isinstance(ending, dict) and any(EARLIEST in p.values() for p in ending.values())):
        raise OptionError("option 'endingOffsets' cannot be earliest (-2): use 'latest' (-1) or offsets")
    if isinstance(starting, dict) and isinstance(ending, dict):
        for stream, parts in starting.items():
            for pid, first in parts.items():
                last = ending.get(stream, {}).get(pid)
                if first >= 0 and last is not None and last >= 0 and last < first:
                    raise OptionError(
                        f"stream {stream!r} partition {pid}: endingOffsets {last} is before startingOffsets {first}"
                    )
    max_rows = _int(opts, "maxoffsetspertrigger")
    min_rows = _int(opts, "minoffsetspertrigger")
    if max_rows is not None and min_rows is not None and min_rows > max_rows:
        raise OptionError(f"minOffsetsPerTrigger ({min_rows}) is larger than maxOffsetsPerTrigger ({max_rows})")
    if "maxtriggerdelay" in opts and min_rows is None:
        raise OptionError("option 'maxTriggerDelay' only makes sense with 'minOffsetsPerTrigger'")
    return ReadOptions(
        servers=_servers(opts),
        subscription=_subscription(opts),
        starting_offsets="earliest" if "startingtimestamp" in opts else starting,
        ending_offsets=ending,
        starting_timestamp=_int(opts, "startingtimestamp", minimum=0),
        max_offsets_per_trigger=max_rows,
        min_offsets_per_trigger=min_rows,
        max_trigger_delay_ms=_duration_ms(opts, "maxtriggerdelay", 15 * 60 * 1000),
        fail_on_data_loss=_bool(opts, "failondataloss", True),
        include_headers=_bool(opts, "includeheaders", False),
        min_partitions=_int(opts, "minpartitions"),
        tls=_tls(opts),
    )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Check the options of ``df.write`` / ``df.writeStream`` with format ``liftlog``."""
    opts = _lower(options, _WRITE, "sink")
    stream = opts.get("stream", "").strip() or None
    if stream is not None and "," in stream:
        raise OptionError(f"option 'stream' of a write names one stream, got {stream!r}")
    return WriteOptions(servers=_servers(opts), stream=stream, tls=_tls(opts))
