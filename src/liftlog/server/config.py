"""Server configuration: Liftbridge's key names, from a YAML file, the environment and flags.

Keys are Liftbridge's dotted names (``streams.retention.max.bytes``). A YAML
file may write them flat, nested, or mixed: ``streams: {retention.max.bytes:
1024}`` is the same key. Precedence, lowest first: defaults, the file,
``LIFTLOG_<KEY>`` environment variables (dots and hyphens become
underscores, upper case: ``LIFTLOG_STREAMS_RETENTION_MAX_BYTES``), then
command-line flags. Unknown keys and bad values raise ConfigError naming the
key.

Durations accept Go-style strings (``90s``, ``1m30s``, ``168h``, ``250ms``)
or a number of milliseconds; sizes accept a number of bytes or a unit
(``512MiB``, ``1GB``).

The result is a ``ServerConfig`` of frozen sections; each component gets its
section, not the whole config.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

import yaml

from liftlog.metadata.limits import (
    DEFAULT_MAX_PARTITIONS,
    DEFAULT_MAX_PARTITIONS_PER_SERVER,
    DEFAULT_MIN_SEGMENT_BYTES,
    StreamLimits,
)
from liftlog.security.cluster_auth import weak_secret_problem
from liftlog.storage import FsyncPolicy, LogConfig
from liftlog.units import parse_duration_ms, parse_size

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "SETTINGS",
    "ClusteringConfig",
    "ConfigError",
    "NatsConfig",
    "ServerConfig",
    "StreamsConfig",
    "load_config",
]

ENV_PREFIX = "LIFTLOG_"


class ConfigError(ValueError):
    """A configuration key or value that cannot be used; the message names the key."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"config key {key!r}: {message}")


def _int(minimum: int) -> Callable[[object], int]:
    def parse(value: object) -> int:
        if isinstance(value, bool):
            raise ValueError("expected an integer")
        try:
            number: int = int(value)  # type: ignore[call-overload]  # what int() cannot take is a TypeError
        except (TypeError, ValueError):
            raise ValueError(f"expected an integer, got {value!r}") from None
        if number < minimum:
            raise ValueError(f"must be >= {minimum}, got {number}")
        return number

    return parse


def _replicas(value: object) -> int:
    number = _int(-1)(value)
    if number == 0:
        raise ValueError("must be -1 (every server) or at least 1, got 0")
    return number


def _bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def _str(value: object) -> str:
    if isinstance(value, dict | list):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return str(value)


def _name(value: object) -> str:
    text = _str(value)
    if not text or re.search(r"[\s.*>]", text):
        raise ValueError(f"must be non-empty with no spaces, dots or wildcards, got {value!r}")
    return text


def _list(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, list | tuple):
        return tuple(_str(v) for v in value)
    raise ValueError(f"expected a list or a comma-separated string, got {value!r}")


def _choice(*options: str) -> Callable[[object], str]:
    def parse(value: object) -> str:
        text = _str(value).lower()
        if text not in options:
            raise ValueError(f"expected one of {', '.join(options)}, got {value!r}")
        return text

    return parse


def _listen(value: object) -> str:
    text = _str(value)
    _host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected host:port, got {value!r}")
    return text


@dataclass(frozen=True)
class Setting:
    key: str
    parse: Callable[[object], object]
    default: object
    help: str


def _s(key: str, parse: Callable[[object], object], default: object, help: str) -> Setting:
    return Setting(key, parse, default, help)


#: Every key the server accepts, with its parser, default and meaning.
SETTINGS: tuple[Setting, ...] = (
    _s(
        "listen",
        _listen,
        "",
        "host:port the gRPC API binds to (0.0.0.0:9292: every interface); default host:port. As in Liftbridge, "
        "host stays what the server advertises to clients and other servers",
    ),
    _s("host", _str, "127.0.0.1", "host clients and other servers reach the gRPC API at (and, without listen, binds)"),
    _s("port", _int(0), 9292, "port of the gRPC API (without listen)"),
    _s("tls.key", _str, "", "private key of the server certificate"),
    _s("tls.cert", _str, "", "server certificate; with tls.key enables TLS"),
    _s("tls.client.auth.enabled", _bool, False, "require client certificates"),
    _s("tls.client.auth.ca", _str, "", "CA for client certificates"),
    _s(
        "tls.client.authz.enabled",
        _bool,
        False,
        "check every call against authorization policies (identities from client certificates)",
    ),
    _s("tls.client.authz.model", _str, "", "casbin model file (with .policy: policies from files, not metadata)"),
    _s("tls.client.authz.policy", _str, "", "casbin policy file (CSV), reloaded on SIGHUP"),
    _s(
        "tls.reload.interval",
        parse_duration_ms,
        10_000,
        "check the TLS files this often; changed ones serve new connections without a restart (0: never)",
    ),
    _s("logging.level", _choice("debug", "info", "warn", "error"), "info", "log level"),
    _s(
        "logging.format",
        _choice("text", "json"),
        "text",
        "text: one readable line per record; json: one JSON object per line, for log shippers",
    ),
    _s(
        "metrics.listen",
        lambda v: "" if _str(v) == "" else _listen(v),
        "",
        "host:port of the HTTP endpoint serving Prometheus metrics (/metrics) and health (/healthz, /readyz); "
        "empty: off",
    ),
    _s(
        "metrics.partitions.max",
        _int(0),
        1000,
        "most partitions given their own stream/partition labels in metrics; the rest are summed under "
        'stream="_other" (bounds the series a scrape returns)',
    ),
    _s("logging.recovery", _bool, False, "accepted for Liftbridge configs; no effect (recovery always logs at info)"),
    _s("logging.raft", _bool, False, "log the metadata group's Raft internals (elections, messages) at debug"),
    _s(
        "logging.nats",
        _bool,
        False,
        "log the NATS connections and all of the embedded nats-server's output at debug (by default only its "
        "warnings and errors)",
    ),
    _s(
        "logging.warnings.interval",
        parse_duration_ms,
        10_000,
        "per-message warnings (malformed internal messages, ...): one line per kind this often, with a count of "
        "the others (0: every line)",
    ),
    _s("data.dir", _str, "./data", "where streams and metadata are stored"),
    _s("batch.max.messages", _int(1), 1024, "most messages written to a partition in one batch"),
    _s(
        "batch.max.time",
        parse_duration_ms,
        0,
        "accepted for Liftbridge configs; no effect: a partition writes what arrived together at once",
    ),
    _s(
        "subscribe.fetch.max.messages",
        _int(1),
        128,
        "most messages a subscription reads from the log at a time (batched subscriptions of liftlog clients are "
        "bounded by subscribe.buffer.max.bytes only)",
    ),
    _s(
        "subscribe.buffer.max.bytes",
        parse_size,
        32 << 10,
        "most message bytes one subscription holds while its client is slow to read (one message at least)",
    ),
    _s("subscribe.max.concurrent", _int(0), 4096, "most Subscribe calls open on this server at once (0: no limit)"),
    _s(
        "subscribe.max.concurrent.per.connection",
        _int(0),
        1024,
        "most Subscribe calls open at once from one client connection (address:port; 0: no limit)",
    ),
    _s(
        "publish.async.max.inflight",
        _int(1),
        1024,
        "PublishAsync requests one call may have unanswered; past it the server reads no more of its requests",
    ),
    _s(
        "publish.async.coalesce",
        _bool,
        True,
        "PublishAsync requests that arrive together for one partition go to NATS as one liftlog record batch "
        "(false: one Liftbridge envelope each, for NATS subscribers that read envelopes)",
    ),
    _s(
        "publish.spin.us",
        _int(0),
        300,
        "after publishing a client's message to NATS, the server polls without sleeping this long (microseconds) "
        "for its return, yielding the CPU each turn: waking from sleep costs about as much as the round trip; "
        "likewise after answering a PublishAsync call's ack-LEADER publish, for the client's next one "
        "(0: sleep at once)",
    ),
    _s(
        "metadata.cache.max.age",
        parse_duration_ms,
        120_000,
        "accepted for Liftbridge configs; no effect: servers answer from their committed metadata",
    ),
    _s("nats.servers", _list, (), "NATS URLs to connect to (empty with nats.embedded: the embedded one)"),
    _s("nats.user", _str, "", "NATS user"),
    _s("nats.password", _str, "", "NATS password"),
    _s("nats.token", _str, "", "NATS token"),
    _s("nats.nkey.seed", _str, "", "file holding this server's NATS nkey seed (nkey authentication)"),
    _s("nats.credentials", _str, "", "NATS credentials file (JWT and nkey seed, for NATS accounts)"),
    _s(
        "nats.acks.user",
        _str,
        "",
        "NATS user for acks to clients' inboxes, on a connection of their own: give it no more rights than an "
        "application's, so NATS refuses an ack a client names a subject for that it may not publish to "
        "(unset: acks go out on the server's connection, after the server's own checks)",
    ),
    _s("nats.acks.password", _str, "", "password of nats.acks.user"),
    _s("nats.acks.token", _str, "", "NATS token for the acks connection (see nats.acks.user)"),
    _s("nats.acks.nkey.seed", _str, "", "file holding the acks connection's nkey seed (see nats.acks.user)"),
    _s("nats.acks.credentials", _str, "", "NATS credentials file for the acks connection (see nats.acks.user)"),
    _s(
        "rpc.max.connections",
        _int(0),
        10_000,
        "gRPC connections served at once; past it new ones are closed on arrival and counted (0: no cap)",
    ),
    _s(
        "rpc.idle.timeout",
        parse_duration_ms,
        600_000,
        "close a gRPC connection without calls for this long (clients reconnect on their next call; 0: never)",
    ),
    _s(
        "rpc.max.message.bytes",
        parse_size,
        0,
        "largest gRPC request message (0: the larger of streams.max.message.bytes and the NATS max payload, plus "
        "64 KiB for keys, headers and framing)",
    ),
    _s(
        "rpc.abuse.cooldown",
        parse_duration_ms,
        1_000,
        "after a client's connection is closed for abuse (ENHANCE_YOUR_CALM), close new connections from its "
        "address on arrival for this long, doubling with each repeat up to a minute (0: never)",
    ),
    _s(
        "rpc.max.buffered.bytes",
        parse_size,
        256 << 20,
        "bytes all gRPC connections together may hold or let their clients send beyond 64 KiB each; a client "
        "gets no more window than it covers, and one that holds it without progress while others wait is closed "
        "(0: no server-wide bound)",
    ),
    _s(
        "security.key.permissions.check",
        _bool,
        True,
        "refuse a cluster secret or master key file that others (or, unless root owns it, its group) may read",
    ),
    _s("nats.tls.cert", _str, "", "client certificate for NATS"),
    _s("nats.tls.key", _str, "", "client key for NATS"),
    _s("nats.tls.ca", _str, "", "CA for the NATS servers"),
    _s("nats.embedded", _bool, False, "start and supervise a nats-server child process"),
    _s("nats.embedded.config", _str, "", "nats-server config file for the embedded server"),
    _s("nats.embedded.host", _str, "127.0.0.1", "interface the embedded nats-server listens on"),
    _s("nats.embedded.port", _int(0), 4222, "port of the embedded nats-server (0: any free port)"),
    _s(
        "nats.lean.connection",
        _bool,
        True,
        "partition intake, clients' publishes and replication on a second, lean NATS connection"
        " (false: all on nats-py's)",
    ),
    _s("streams.retention.max.bytes", parse_size, 0, "delete old segments past this size (0: no limit)"),
    _s("streams.retention.max.messages", _int(0), 0, "delete old segments past this many messages (0: no limit)"),
    _s("streams.retention.max.age", parse_duration_ms, 7 * 24 * 3600_000, "delete segments older than this (0: never)"),
    _s("streams.cleaner.interval", parse_duration_ms, 300_000, "how often retention and compaction run"),
    _s("streams.segment.max.bytes", parse_size, 256 << 20, "roll a segment past this size"),
    _s(
        "streams.segment.max.bytes.min",
        parse_size,
        DEFAULT_MIN_SEGMENT_BYTES,
        "smallest segment.max.bytes a stream (or this server) may use: tiny segments exhaust open files",
    ),
    _s("streams.max.partitions", _int(1), DEFAULT_MAX_PARTITIONS, "most partitions one stream may have"),
    _s("streams.segment.max.age", parse_duration_ms, 0, "roll a segment this old (0: size only)"),
    _s("streams.compact.enabled", _bool, False, "keep only the newest message per key"),
    _s(
        "streams.compact.max.goroutines",
        _int(1),
        10,
        "accepted for Liftbridge configs; no effect: each log is compacted by one worker thread",
    ),
    _s("streams.auto.pause.time", parse_duration_ms, 0, "pause partitions idle this long (0: never)"),
    _s("streams.auto.pause.disable.if.subscribers", _bool, False, "do not auto-pause partitions with subscribers"),
    _s("streams.concurrency.control", _bool, False, "enable expectedOffset checks on publish"),
    _s(
        "streams.encryption",
        _bool,
        False,
        "encrypt the stored messages of streams created without an encryption setting (needs a master key: "
        "LIFTBRIDGE_ENCRYPTION_KEY or encryption.key.file)",
    ),
    _s(
        "encryption.key.file",
        _str,
        "",
        "file holding the master key that wraps encrypted streams' data keys (16 or 32 bytes, base64:... or hex:..., "
        "e.g. from `liftlog keygen --master-key`); instead of LIFTBRIDGE_ENCRYPTION_KEY; every server needs it; "
        "re-read on SIGHUP",
    ),
    _s(
        "encryption.previous.key.files",
        _list,
        (),
        "files of earlier master keys, kept to decrypt what they encrypted while keys are rotated; re-read on SIGHUP",
    ),
    _s("streams.max.message.bytes", parse_size, 1 << 20, "largest message accepted"),
    _s(
        "streams.duplicate.window",
        parse_duration_ms,
        120_000,
        "a message with an id (Nats-Msg-Id header) is stored at most once per partition within this window; "
        "a duplicate is acked with the original's offset (0: off)",
    ),
    _s(
        "streams.duplicate.max.ids",
        _int(0),
        100_000,
        "most message ids a partition's leader remembers (about 200 bytes each); past it the oldest are "
        "forgotten early, shortening the window (liftlog_partition_duplicate_ids_evicted_total)",
    ),
    _s("streams.fsync.policy", _choice("never", "interval", "always"), "never", "when the log is fsynced"),
    _s("streams.fsync.interval", parse_duration_ms, 1000, "fsync interval with the interval policy"),
    _s(
        "streams.segment.files.max",
        _int(0),
        0,
        "descriptors sealed segments may hold open, least recently read closed first (0: half the open-file limit)",
    ),
    _s("clustering.server.id", _name, "", "this server's id (default: the one kept in its data dir, else random)"),
    _s("clustering.namespace", _name, "liftbridge-default", "cluster namespace, a prefix of internal subjects"),
    _s("clustering.raft.snapshot.retain", _int(1), 2, "Raft snapshots kept on disk"),
    _s("clustering.raft.snapshot.threshold", _int(1), 8192, "Raft entries between snapshots"),
    _s(
        "clustering.raft.cache.size",
        _int(0),
        512,
        "accepted for Liftbridge configs; no effect: the metadata log since the last snapshot stays in memory",
    ),
    _s("clustering.raft.bootstrap.seed", _bool, False, "found a new cluster with this server"),
    _s("clustering.raft.bootstrap.peers", _list, (), "found a new cluster with these server ids"),
    _s(
        "clustering.raft.max.quorum.size",
        _int(0),
        0,
        "accepted for Liftbridge configs; no effect: every server is a voter of the metadata group",
    ),
    _s(
        "clustering.raft.heartbeat.interval",
        parse_duration_ms,
        100,
        "Raft tick: the metadata leader heartbeats this often",
    ),
    _s("clustering.raft.election.timeout", parse_duration_ms, 1000, "elect a new metadata leader after this silence"),
    _s("clustering.raft.fsync", _bool, True, "fsync the metadata Raft log (off only for tests)"),
    _s("clustering.server.heartbeat.interval", parse_duration_ms, 1000, "servers tell the controller they are alive"),
    _s("clustering.server.liveness.timeout", parse_duration_ms, 3000, "a silent server counts as dead after this"),
    _s(
        "clustering.leader.lease.time",
        parse_duration_ms,
        0,
        "a partition leader that has had no answer from the metadata leader for this long writes and acknowledges "
        "nothing, whatever the ack policy, until it hears again; below clustering.server.liveness.timeout, so "
        "that a leader the controller replaces has stopped before its successor starts (0: half the liveness "
        "timeout); it bounds how long a cut-off leader's ack-LEADER messages can be lost",
    ),
    _s("clustering.replica.max.lag.time", parse_duration_ms, 15_000, "drop a follower from the ISR after this"),
    _s("clustering.replica.max.lag.messages", _int(0), 0, "also drop a follower this many messages behind (0: off)"),
    _s("clustering.replica.max.leader.timeout", parse_duration_ms, 15_000, "report a silent leader after this"),
    _s("clustering.replica.max.idle.wait", parse_duration_ms, 10_000, "a caught-up follower's sleep"),
    _s("clustering.replica.fetch.timeout", parse_duration_ms, 3_000, "timeout of one replication fetch"),
    _s(
        "clustering.replica.fetch.wait",
        parse_duration_ms,
        500,
        "how long a leader holds a caught-up follower's fetch, answering as soon as data arrives (0: at once; "
        "at most half the fetch timeout)",
    ),
    _s("clustering.min.insync.replicas", _int(1), 1, "ISR size needed to commit"),
    _s("clustering.replication.max.bytes", parse_size, 1 << 20, "most bytes in one replication response"),
    _s(
        "clustering.reassignment.max.rate",
        parse_size,
        0,
        "bytes per second a leader sends to the replicas a reassignment adds, all together (0: no limit)",
    ),
    _s("clustering.rack", _str, "", "rack of this server, for replica placement"),
    _s(
        "clustering.max.partitions.per.server",
        _int(1),
        DEFAULT_MAX_PARTITIONS_PER_SERVER,
        "most partition replicas one server may host (each keeps files open); checked by the controller",
    ),
    _s("clustering.unclean.leader.election", _bool, False, "let an out-of-sync replica lead (may lose data)"),
    _s(
        "clustering.leader.rebalance.delay",
        parse_duration_ms,
        10_000,
        "give leadership back to a preferred replica in sync this long (0: never)",
    ),
    _s(
        "clustering.auth.key.file",
        _str,
        "",
        "file holding the cluster secret (16+ bytes, e.g. from `liftlog keygen`): server-to-server messages are "
        "signed with it and unsigned ones dropped; without it anyone who can publish on NATS controls the cluster",
    ),
    _s(
        "clustering.auth.key",
        _str,
        "",
        "the cluster secret itself (16+ characters), for deployments that pass secrets in the environment "
        "(LIFTLOG_CLUSTERING_AUTH_KEY); instead of clustering.auth.key.file",
    ),
    _s(
        "clustering.auth.key.generate",
        _bool,
        False,
        "create clustering.auth.key.file with a new random secret if it does not exist (make run sets it)",
    ),
    _s(
        "clustering.auth.insecure",
        _bool,
        False,
        "run without a cluster secret: anyone who can publish on this NATS can then act as a server of the "
        "cluster (without it, a server with no clustering.auth.key.file uses <data.dir>/cluster.key, made if it "
        "founds a cluster alone, and refuses to start otherwise)",
    ),
    _s(
        "clustering.auth.max.age",
        parse_duration_ms,
        30_000,
        "signed server-to-server messages older or further ahead than this are dropped as replays; it must exceed "
        "the clock difference between servers",
    ),
    _s("activity.stream.enabled", _bool, False, "publish cluster events to the activity stream"),
    _s("activity.stream.publish.timeout", parse_duration_ms, 5_000, "timeout of an activity publish"),
    _s("activity.stream.publish.ack.policy", _choice("leader", "all", "none"), "all", "ack policy of activity"),
    _s(
        "cursors.stream.partitions",
        _int(0),
        0,
        "partitions of __cursors, the stream SetCursor and FetchCursor keep cursors in (0: cursors off); fixed "
        "once the controller created it",
    ),
    _s(
        "cursors.stream.replication.factor",
        _replicas,
        -1,
        "replicas of each __cursors partition (-1: every server of the cluster when it is created)",
    ),
    _s(
        "cursors.stream.auto.pause.time",
        parse_duration_ms,
        60_000,
        "pause an idle __cursors partition after this (0: never); a cursor call resumes it",
    ),
    _s("groups.consumer.timeout", parse_duration_ms, 15_000, "drop a silent group consumer after this"),
    _s("groups.coordinator.timeout", parse_duration_ms, 15_000, "replace a silent group coordinator after this"),
)
_BY_KEY = {s.key: s for s in SETTINGS}
#: Each key's help text.
SETTING_HELP = {s.key: s.help for s in SETTINGS}
_BY_ENV = {ENV_PREFIX + re.sub(r"[.\-]", "_", s.key).upper(): s.key for s in SETTINGS}


# -- sections -----------------------------------------------------------------


class NatsIdentity(TypedDict):
    """``LeanNats``'s login arguments."""

    user: str
    password: str
    token: str
    nkey_seed_file: str
    credentials_file: str


@dataclass(frozen=True)
class NatsConfig:
    servers: tuple[str, ...]
    user: str
    password: str
    token: str
    nkey_seed: str
    credentials: str
    tls_cert: str
    tls_key: str
    tls_ca: str
    embedded: bool
    embedded_config: str
    embedded_host: str
    embedded_port: int
    lean_connection: bool = True
    acks_user: str = ""
    acks_password: str = ""
    acks_token: str = ""
    acks_nkey_seed: str = ""
    acks_credentials: str = ""

    def identity(self, *, acks: bool = False) -> NatsIdentity:
        """Who a lean connection (``LeanNats``) logs in as: the server's NATS user, or nats.acks.*'s."""
        if acks:
            user, password, token = self.acks_user, self.acks_password, self.acks_token
            seed, creds = self.acks_nkey_seed, self.acks_credentials
        else:
            user, password, token, seed, creds = self.user, self.password, self.token, self.nkey_seed, self.credentials
        return NatsIdentity(user=user, password=password, token=token, nkey_seed_file=seed, credentials_file=creds)

    @property
    def acks_connection(self) -> bool:
        """Whether acks to clients go out on a connection of their own, with its own NATS identity."""
        return bool(self.acks_user or self.acks_token or self.acks_nkey_seed or self.acks_credentials)


@dataclass(frozen=True)
class StreamsConfig:
    retention_max_bytes: int
    retention_max_messages: int
    retention_max_age: int
    cleaner_interval: int
    segment_max_bytes: int
    segment_max_age: int
    compact_enabled: bool
    compact_max_goroutines: int
    auto_pause_time: int
    auto_pause_disable_if_subscribers: bool
    concurrency_control: bool
    encryption: bool
    max_message_bytes: int
    duplicate_window: int
    duplicate_max_ids: int
    fsync_policy: str
    fsync_interval: int
    segment_max_bytes_min: int
    max_partitions: int
    segment_files_max: int

    def log_config(self) -> LogConfig:
        """Storage settings for a new partition log (durations are in ms)."""
        return LogConfig(
            segment_max_bytes=self.segment_max_bytes,
            segment_max_age_ms=self.segment_max_age,
            retention_max_bytes=self.retention_max_bytes,
            retention_max_messages=self.retention_max_messages,
            retention_max_age_ms=self.retention_max_age,
            compact_enabled=self.compact_enabled,
            max_record_bytes=self.max_message_bytes,
            fsync=FsyncPolicy(self.fsync_policy),
            fsync_interval_ms=self.fsync_interval,
        )


@dataclass(frozen=True)
class ClusteringConfig:
    server_id: str
    namespace: str
    raft_snapshot_retain: int
    raft_snapshot_threshold: int
    raft_cache_size: int
    raft_bootstrap_seed: bool
    raft_bootstrap_peers: tuple[str, ...]
    raft_max_quorum_size: int
    raft_heartbeat_interval: int
    raft_election_timeout: int
    raft_fsync: bool
    server_heartbeat_interval: int
    server_liveness_timeout: int
    leader_lease_time: int
    replica_max_lag_time: int
    replica_max_lag_messages: int
    replica_max_leader_timeout: int
    replica_max_idle_wait: int
    replica_fetch_wait: int
    replica_fetch_timeout: int
    min_insync_replicas: int
    replication_max_bytes: int
    reassignment_max_rate: int
    rack: str
    unclean_leader_election: bool
    leader_rebalance_delay: int
    max_partitions_per_server: int
    auth_key_file: str
    auth_key: str = field(repr=False)
    auth_key_generate: bool
    auth_max_age: int
    auth_insecure: bool = False


@dataclass(frozen=True)
class TlsConfig:
    key: str
    cert: str
    client_auth_enabled: bool
    client_auth_ca: str
    client_authz_enabled: bool
    client_authz_model: str
    client_authz_policy: str
    reload_interval: int


@dataclass(frozen=True)
class LoggingConfig:
    level: str
    format: str
    recovery: bool
    raft: bool
    nats: bool
    warnings_interval: int


@dataclass(frozen=True)
class MetricsConfig:
    listen: str
    partitions_max: int


@dataclass(frozen=True)
class BatchConfig:
    max_messages: int
    max_time: int


@dataclass(frozen=True)
class SubscribeConfig:
    fetch_max_messages: int
    buffer_max_bytes: int
    max_concurrent: int
    max_concurrent_per_connection: int


@dataclass(frozen=True)
class PublishConfig:
    async_max_inflight: int
    async_coalesce: bool
    spin_us: int


@dataclass(frozen=True)
class RpcConfig:
    max_connections: int
    idle_timeout: int
    max_message_bytes: int
    abuse_cooldown: int
    max_buffered_bytes: int


@dataclass(frozen=True)
class SecurityConfig:
    key_permissions_check: bool


@dataclass(frozen=True)
class EncryptionConfig:
    key_file: str
    previous_key_files: tuple[str, ...]


@dataclass(frozen=True)
class ActivityConfig:
    """``activity.stream.*``."""

    enabled: bool
    publish_timeout: int
    publish_ack_policy: str


@dataclass(frozen=True)
class CursorsConfig:
    """``cursors.stream.*``."""

    partitions: int
    replication_factor: int
    auto_pause_time: int


@dataclass(frozen=True)
class GroupsConfig:
    consumer_timeout: int
    coordinator_timeout: int


@dataclass(frozen=True)
class ServerConfig:
    """The whole configuration; pass each component only its section."""

    #: Where clients and other servers reach the API (advertised in the metadata).
    host: str
    port: int
    data_dir: Path
    log_level: str
    nats: NatsConfig
    streams: StreamsConfig
    clustering: ClusteringConfig
    tls: TlsConfig
    logging: LoggingConfig
    metrics: MetricsConfig
    batch: BatchConfig
    subscribe: SubscribeConfig
    publish: PublishConfig
    rpc: RpcConfig
    security: SecurityConfig
    encryption: EncryptionConfig
    activity: ActivityConfig
    cursors: CursorsConfig
    groups: GroupsConfig
    #: Every key's final value, by key (``liftlog config`` and tests read them so).
    values: Mapping[str, Any] = field(repr=False)
    #: Where the API binds (``listen``; by default host and port).
    bind_host: str = ""
    bind_port: int = 0

    @property
    def listen(self) -> str:
        return f"{self.bind_host or self.host}:{self.bind_port if self.bind_host else self.port}"

    def stream_limits(self) -> StreamLimits:
        """What one CreateStream may ask for, as the controller checks it."""
        return StreamLimits(
            max_partitions=self.streams.max_partitions,
            max_partitions_per_server=self.clustering.max_partitions_per_server,
            min_segment_bytes=self.streams.segment_max_bytes_min,
        )


#: Keys Liftbridge's configs may hold that change nothing here; a server given one warns at start.
NO_EFFECT: frozenset[str] = frozenset(
    {
        "logging.recovery",
        "batch.max.time",
        "metadata.cache.max.age",
        "streams.compact.max.goroutines",
        "clustering.raft.cache.size",
        "clustering.raft.max.quorum.size",
    }
)


def ignored_settings(values: Mapping[str, object]) -> list[str]:
    """The no-effect keys (``NO_EFFECT``) set to something other than their default."""
    return sorted(k for k in NO_EFFECT if values.get(k, _BY_KEY[k].default) != _BY_KEY[k].default)


# -- loading ------------------------------------------------------------------


def _flatten(tree: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for raw_key, value in tree.items():
        key = f"{prefix}{raw_key}"
        if isinstance(value, dict) and key not in _BY_KEY:
            flat.update(_flatten(value, key + "."))
        else:
            flat[key] = value
    return flat


def _unknown(key: str, source: str) -> ConfigError:
    close = difflib.get_close_matches(key, _BY_KEY, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(key, f"unknown key in {source}{hint}")


def _read_file(path: Path) -> dict[str, object]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror}") from None
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("config", f"{path} is not valid YAML: {exc}") from None
    if tree is None:
        return {}
    if not isinstance(tree, dict):
        raise ConfigError("config", f"{path} must hold a mapping of keys to values")
    return _flatten(tree)


_Section = TypeVar("_Section", bound="DataclassInstance")


def _section(cls: type[_Section], prefix: str, values: Mapping[str, object]) -> _Section:
    """Build a section dataclass from the keys under ``prefix`` (``a.b.c`` -> field ``b_c``)."""
    names = {f.name for f in fields(cls)}
    picked = {k[len(prefix) :].replace(".", "_"): v for k, v in values.items() if k.startswith(prefix)}
    return cls(**{name: value for name, value in picked.items() if name in names})


def load_config(
    path: str | Path | None = None,
    overrides: Mapping[str, object] | None = None,
    env: Mapping[str, str] | None = None,
) -> ServerConfig:
    """Build the configuration: defaults < file < ``LIFTLOG_*`` env < ``overrides`` (flags)."""
    raw: dict[str, tuple[object, str]] = {}
    if path is not None:
        for key, value in _read_file(Path(path)).items():
            if key not in _BY_KEY:
                raise _unknown(key, str(path))
            raw[key] = (value, str(path))
    for name, value in (os.environ if env is None else env).items():
        if name.startswith(ENV_PREFIX):
            if name not in _BY_ENV:
                raise ConfigError(name, "unknown environment variable (keys map to LIFTLOG_<KEY_WITH_UNDERSCORES>)")
            raw[_BY_ENV[name]] = (value, name)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in _BY_KEY:
            raise _unknown(key, "command-line flags")
        raw[key] = (value, "flag")

    values: dict[str, Any] = {s.key: s.default for s in SETTINGS}
    for key, (value, source) in raw.items():
        try:
            values[key] = _BY_KEY[key].parse(value)
        except ValueError as exc:
            raise ConfigError(key, f"{exc} (from {source})") from None

    bind_host, bind_port = values["host"], values["port"]
    if values["listen"]:
        listen_host, _, listen_port = values["listen"].rpartition(":")
        bind_host, bind_port = listen_host, int(listen_port)
        values["port"] = bind_port  # one port: where it binds is where it is reached
        if "host" not in raw and listen_host not in ("", "0.0.0.0", "::", "[::]"):
            values["host"] = listen_host  # no host given: advertise the address bound to
    if values["tls.client.authz.enabled"] and not values["tls.client.auth.enabled"]:
        raise ConfigError(
            "tls.client.authz.enabled",
            "needs tls.client.auth.enabled (and tls.cert, tls.key, tls.client.auth.ca): identities come from client "
            "certificates",
        )
    if bool(values["tls.client.authz.model"]) != bool(values["tls.client.authz.policy"]):
        raise ConfigError(
            "tls.client.authz.policy" if values["tls.client.authz.model"] else "tls.client.authz.model",
            "tls.client.authz.model and tls.client.authz.policy go together (or neither: policies in the metadata)",
        )
    if values["tls.client.auth.enabled"] and not values["tls.cert"]:
        raise ConfigError("tls.client.auth.enabled", "needs TLS on the API: tls.cert and tls.key")
    if bool(values["tls.key"]) != bool(values["tls.cert"]):
        raise ConfigError("tls.cert" if values["tls.key"] else "tls.key", "tls.key and tls.cert must be set together")
    if values["nats.embedded"] and values["nats.servers"]:
        raise ConfigError("nats.servers", "cannot be combined with nats.embedded: true (the embedded server is used)")
    if values["clustering.raft.bootstrap.seed"] and values["clustering.raft.bootstrap.peers"]:
        raise ConfigError(
            "clustering.raft.bootstrap.peers",
            "cannot be combined with clustering.raft.bootstrap.seed: found a cluster one way or the other",
        )
    if values["streams.segment.max.bytes.min"] < 1:
        raise ConfigError("streams.segment.max.bytes.min", "must be at least 1 byte")
    if values["streams.segment.max.bytes"] < values["streams.segment.max.bytes.min"]:
        raise ConfigError(
            "streams.segment.max.bytes",
            f"{values['streams.segment.max.bytes']} is smaller than streams.segment.max.bytes.min "
            f"({values['streams.segment.max.bytes.min']}): every segment keeps files open and tiny segments "
            "exhaust the open-file limit; use a larger size, or lower streams.segment.max.bytes.min",
        )
    if values["clustering.raft.election.timeout"] < 2 * values["clustering.raft.heartbeat.interval"]:
        raise ConfigError(
            "clustering.raft.election.timeout", "must be at least twice clustering.raft.heartbeat.interval"
        )
    liveness = values["clustering.server.liveness.timeout"]
    if not values["clustering.leader.lease.time"]:
        values["clustering.leader.lease.time"] = max(liveness // 2, 1)
    elif values["clustering.leader.lease.time"] >= liveness:
        raise ConfigError(
            "clustering.leader.lease.time",
            f"{values['clustering.leader.lease.time']} ms is not below clustering.server.liveness.timeout "
            f"({liveness} ms): a leader the controller replaces could still acknowledge while its successor does "
            "(half the liveness timeout leaves room for clock drift and the controller's checks; 0 picks that)",
        )
    if values["clustering.auth.key"] and values["clustering.auth.key.file"]:
        raise ConfigError(
            "clustering.auth.key", "give the cluster secret or its file (clustering.auth.key.file), not both"
        )
    if values["clustering.auth.key"] and len(values["clustering.auth.key"].strip()) < 16:
        raise ConfigError("clustering.auth.key", "the cluster secret needs at least 16 characters")
    if values["clustering.auth.key"]:
        weak = weak_secret_problem(values["clustering.auth.key"].strip().encode())
        if weak is not None:
            raise ConfigError("clustering.auth.key", f"the cluster secret {weak}")
    if values["clustering.auth.insecure"] and (values["clustering.auth.key"] or values["clustering.auth.key.file"]):
        raise ConfigError(
            "clustering.auth.insecure", "a cluster secret is configured too: drop one (the secret, preferably)"
        )
    if values["clustering.auth.key.generate"] and not values["clustering.auth.key.file"]:
        raise ConfigError("clustering.auth.key.generate", "needs clustering.auth.key.file: where to write the secret")
    if values["clustering.auth.max.age"] <= 0:
        raise ConfigError("clustering.auth.max.age", "must be positive")

    return _server_config(values, bind_host, bind_port)


def _server_config(values: dict[str, Any], bind_host: str, bind_port: int) -> ServerConfig:
    """The configuration's typed sections, from every key's checked final value."""
    return ServerConfig(
        host=values["host"],
        port=values["port"],
        bind_host=bind_host,
        bind_port=bind_port,
        data_dir=Path(values["data.dir"]),
        log_level=values["logging.level"],
        nats=_section(NatsConfig, "nats.", values),
        streams=_section(StreamsConfig, "streams.", values),
        clustering=_section(ClusteringConfig, "clustering.", values),
        tls=_section(TlsConfig, "tls.", values),
        logging=_section(LoggingConfig, "logging.", values),
        metrics=_section(MetricsConfig, "metrics.", values),
        batch=_section(BatchConfig, "batch.", values),
        subscribe=_section(SubscribeConfig, "subscribe.", values),
        publish=_section(PublishConfig, "publish.", values),
        rpc=_section(RpcConfig, "rpc.", values),
        security=_section(SecurityConfig, "security.", values),
        encryption=_section(EncryptionConfig, "encryption.", values),
        activity=_section(ActivityConfig, "activity.stream.", values),
        cursors=_section(CursorsConfig, "cursors.stream.", values),
        groups=_section(GroupsConfig, "groups.", values),
        values=values,
    )
