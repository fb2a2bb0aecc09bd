from __future__ import annotations

from pathlib import Path

import pytest

from liftlog.server.config import ConfigError, load_config
from liftlog.storage import FsyncPolicy
from liftlog.units import parse_duration_ms, parse_size


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "liftlog.yaml"
    path.write_text(text)
    return path


def test_defaults_are_loopback_and_liftbridge_like() -> None:
    cfg = load_config(env={})
    assert cfg.listen == "127.0.0.1:9292"
    assert cfg.clustering.namespace == "liftbridge-default"
    assert cfg.streams.retention_max_age == 7 * 24 * 3600 * 1000
    assert cfg.clustering.server_id == ""  # the server takes the id kept in its data dir, or makes one
    assert cfg.nats.embedded is False and cfg.nats.embedded_host == "127.0.0.1"


def test_flat_nested_and_mixed_keys_are_the_same(tmp_path: Path) -> None:
    flat = load_config(write(tmp_path, "streams.retention.max.bytes: 1024\nlogging.level: debug\n"), env={})
    nested = load_config(
        write(tmp_path, "streams:\n  retention:\n    max:\n      bytes: 1024\nlogging: {level: debug}\n"), env={}
    )
    mixed = load_config(write(tmp_path, "streams:\n  retention.max.bytes: 1024\nlogging:\n  level: debug\n"), env={})
    assert flat.streams.retention_max_bytes == nested.streams.retention_max_bytes == mixed.streams.retention_max_bytes
    assert flat.log_level == nested.log_level == mixed.log_level == "debug"


def test_nats_embedded_with_its_config_key(tmp_path: Path) -> None:
    path = write(tmp_path, "nats:\n  embedded: true\n  embedded.config: /etc/nats.conf\n  embedded.port: 0\n")
    cfg = load_config(path, env={})
    assert (cfg.nats.embedded, cfg.nats.embedded_config, cfg.nats.embedded_port) == (True, "/etc/nats.conf", 0)


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    path = write(tmp_path, "port: 1000\nclustering.server.id: from-file\ndata.dir: /from/file\n")
    env = {"LIFTLOG_PORT": "2000", "LIFTLOG_CLUSTERING_SERVER_ID": "from-env"}
    cfg = load_config(path, overrides={"port": 3000, "clustering.server.id": None}, env=env)
    assert (cfg.port, cfg.clustering.server_id, cfg.data_dir) == (3000, "from-env", Path("/from/file"))


def test_listen_is_where_it_binds_and_host_what_it_advertises() -> None:
    # Liftbridge's split: bind to every interface, tell clients the name they can reach
    cfg = load_config(overrides={"listen": "0.0.0.0:7000", "host": "broker-1.example", "port": 1}, env={})
    assert (cfg.bind_host, cfg.bind_port, cfg.host, cfg.port) == ("0.0.0.0", 7000, "broker-1.example", 7000)
    assert cfg.listen == "0.0.0.0:7000"
    # listen alone: advertised as bound, unless that is a wildcard (then the default host)
    alone = load_config(overrides={"listen": "10.1.2.3:7001"}, env={})
    assert (alone.host, alone.port, alone.bind_host) == ("10.1.2.3", 7001, "10.1.2.3")
    wildcard = load_config(overrides={"listen": "0.0.0.0:7002"}, env={})
    assert (wildcard.host, wildcard.port, wildcard.bind_host) == ("127.0.0.1", 7002, "0.0.0.0")
    plain = load_config(overrides={"host": "10.9.9.9", "port": 7003}, env={})
    assert plain.listen == "10.9.9.9:7003" and (plain.host, plain.port) == ("10.9.9.9", 7003)


def test_units_for_durations_and_sizes(tmp_path: Path) -> None:
    path = write(tmp_path, "streams:\n  segment.max.bytes: 64MiB\n  retention.max.age: 1h30m\n  fsync.policy: always\n")
    cfg = load_config(path, env={})
    assert cfg.streams.segment_max_bytes == 64 << 20
    assert cfg.streams.retention_max_age == 90 * 60 * 1000
    log = cfg.streams.log_config()
    assert (log.segment_max_bytes, log.fsync, log.retention_max_age_ms) == (64 << 20, FsyncPolicy.ALWAYS, 5_400_000)
    assert parse_duration_ms("250ms") == 250 and parse_duration_ms(0) == 0 and parse_duration_ms("1.5s") == 1500
    assert parse_size("1GB") == 10**9 and parse_size("1k") == 1000


def test_unknown_key_suggests_the_close_one(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'streams.retention.max.byte'.*did you mean 'streams.retention.max.bytes'"):
        load_config(write(tmp_path, "streams.retention.max.byte: 5\n"), env={})
    with pytest.raises(ConfigError, match="LIFTLOG_NOPE"):
        load_config(env={"LIFTLOG_NOPE": "1"})


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        ("port: abc\n", "port", "expected an integer"),
        ("port: -1\n", "port", "must be >= 0"),
        ("streams.retention.max.age: forever\n", "streams.retention.max.age", "expected a duration"),
        ("streams.segment.max.bytes: 12 parsecs\n", "streams.segment.max.bytes", "expected a size"),
        ("streams.compact.enabled: maybe\n", "streams.compact.enabled", "expected true or false"),
        ("logging.level: loud\n", "logging.level", "expected one of debug, info, warn, error"),
        ("clustering.server.id: a.b\n", "clustering.server.id", "no spaces, dots or wildcards"),
        ("listen: nowhere\n", "listen", "expected host:port"),
        ("tls.key: k.pem\n", "tls.cert", "must be set together"),
        ("nats: {embedded: true, servers: [nats://x:4222]}\n", "nats.servers", "nats.embedded"),
    ],
)
def test_bad_values_name_the_key(tmp_path: Path, text: str, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), env={})
    assert info.value.key == key and fragment in str(info.value)


def test_bad_files_are_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml", env={})
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "a: [\n"), env={})
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(write(tmp_path, "- 1\n"), env={})
    assert load_config(write(tmp_path, ""), env={}).port == 9292


def test_clustering_settings_and_their_conflicts() -> None:
    c = load_config(
        None,
        {"clustering.raft.bootstrap.peers": "a, b,c", "clustering.raft.election.timeout": "2s"},
        env={},
    ).clustering
    assert c.raft_bootstrap_peers == ("a", "b", "c") and c.raft_election_timeout == 2000
    assert (c.raft_heartbeat_interval, c.server_heartbeat_interval, c.server_liveness_timeout) == (100, 1000, 3000)
    with pytest.raises(ConfigError, match=r"cannot be combined with clustering\.raft\.bootstrap\.seed"):
        load_config(None, {"clustering.raft.bootstrap.peers": "a", "clustering.raft.bootstrap.seed": True}, env={})
    with pytest.raises(ConfigError, match=r"at least twice clustering\.raft\.heartbeat\.interval"):
        load_config(None, {"clustering.raft.election.timeout": "150ms"}, env={})


def test_resource_limit_settings(tmp_path: Path) -> None:
    defaults = load_config(env={}).values
    assert defaults["subscribe.buffer.max.bytes"] == 32 << 10 and defaults["subscribe.fetch.max.messages"] == 128
    assert defaults["subscribe.max.concurrent"] == 4096 and defaults["subscribe.max.concurrent.per.connection"] == 1024
    assert defaults["publish.async.max.inflight"] == 1024 and defaults["logging.warnings.interval"] == 10_000
    path = write(tmp_path, "subscribe:\n  buffer.max.bytes: 1MiB\n  max.concurrent: 0\nlogging.warnings.interval: 1s\n")
    values = load_config(path, env={"LIFTLOG_PUBLISH_ASYNC_MAX_INFLIGHT": "64"}).values
    assert values["subscribe.buffer.max.bytes"] == 1 << 20 and values["subscribe.max.concurrent"] == 0
    assert values["publish.async.max.inflight"] == 64 and values["logging.warnings.interval"] == 1000
    with pytest.raises(ConfigError, match=r"'publish.async.max.inflight': must be >= 1, got 0"):
        load_config(overrides={"publish.async.max.inflight": 0}, env={})
    with pytest.raises(ConfigError, match=r"'subscribe.fetch.max.messages': must be >= 1"):
        load_config(overrides={"subscribe.fetch.max.messages": "0"}, env={})


def test_cluster_secret_settings(tmp_path: Path) -> None:
    cfg = load_config(None, {"clustering.auth.key.file": "k", "clustering.auth.max.age": "5s"}, env={})
    assert (cfg.clustering.auth_key_file, cfg.clustering.auth_max_age) == ("k", 5000)
    assert load_config(env={"LIFTLOG_CLUSTERING_AUTH_KEY_FILE": "/etc/k"}).clustering.auth_key_file == "/etc/k"
    with pytest.raises(ConfigError, match=r"clustering.auth.key.generate.*needs clustering.auth.key.file"):
        load_config(None, {"clustering.auth.key.generate": True}, env={})
    with pytest.raises(ConfigError, match=r"clustering.auth.max.age.*positive"):
        load_config(None, {"clustering.auth.key.file": "k", "clustering.auth.max.age": 0}, env={})


def test_the_cluster_secret_itself_from_the_environment() -> None:
    secret = "s3cret-from-a-k8s-secret"
    cfg = load_config(env={"LIFTLOG_CLUSTERING_AUTH_KEY": secret})
    assert cfg.clustering.auth_key == secret
    assert secret not in repr(cfg)  # never in a log line that prints the config
    with pytest.raises(ConfigError, match="at least 16"):
        load_config(env={"LIFTLOG_CLUSTERING_AUTH_KEY": "short"})
    with pytest.raises(ConfigError, match="not both"):
        load_config(None, {"clustering.auth.key": secret, "clustering.auth.key.file": "k"}, env={})


def test_encryption_settings_nested_as_the_readme_writes_them(tmp_path: Path) -> None:
    text = (
        "streams:\n  encryption: true\n"
        "encryption:\n  key.file: /etc/liftlog/master.key\n  previous.key.files: [/a.key, /b.key]\n"
    )
    cfg = load_config(write(tmp_path, text), env={})
    assert cfg.streams.encryption is True
    assert cfg.values["encryption.key.file"] == "/etc/liftlog/master.key"
    assert cfg.values["encryption.previous.key.files"] == ("/a.key", "/b.key")
    flags = load_config(None, {"encryption.previous.key.files": "/a.key,/b.key"}, env={})
    assert flags.values["encryption.previous.key.files"] == ("/a.key", "/b.key")
    # Liftbridge's variable is not a LIFTLOG_* one: the configuration leaves it to the server
    assert load_config(env={"LIFTBRIDGE_ENCRYPTION_KEY": "x" * 16}).values["encryption.key.file"] == ""


def test_liftbridge_keys_without_effect_say_so() -> None:
    from liftlog.server.config import NO_EFFECT, SETTING_HELP, ignored_settings

    for key in NO_EFFECT:
        assert SETTING_HELP[key].startswith("accepted for Liftbridge configs; no effect"), key
    cfg = load_config(None, {"clustering.raft.cache.size": 64, "batch.max.time": "5ms"}, env={})
    assert ignored_settings(cfg.values) == ["batch.max.time", "clustering.raft.cache.size"]
    assert ignored_settings(load_config(env={}).values) == []
    # the keys issue 16 names all act now: none of them is documented as doing nothing
    for key in SETTING_HELP:
        if key.startswith(("cursors.", "groups.", "activity.")):
            assert "no effect" not in SETTING_HELP[key] and key not in NO_EFFECT


def test_metrics_and_log_format_keys() -> None:
    assert load_config(env={}).values["metrics.listen"] == ""  # off by default
    config = load_config(overrides={"metrics.listen": "0.0.0.0:9464", "logging.format": "JSON"}, env={})
    assert config.values["metrics.listen"] == "0.0.0.0:9464"
    assert config.values["logging.format"] == "json"
    with pytest.raises(ConfigError, match=r"'metrics\.listen'.*host:port"):
        load_config(overrides={"metrics.listen": "9464"}, env={})
    with pytest.raises(ConfigError, match=r"'logging\.format'.*text, json"):
        load_config(overrides={"logging.format": "xml"}, env={})
    with pytest.raises(ConfigError, match=r"'metrics\.partitions\.max'"):
        load_config(overrides={"metrics.partitions.max": -1}, env={})


#: The section each key prefix lands in (``ServerConfig`` attribute); keys without one are top-level fields.
_SECTIONS = {
    "nats.": "nats",
    "streams.": "streams",
    "clustering.": "clustering",
    "tls.": "tls",
    "logging.": "logging",
    "metrics.": "metrics",
    "batch.": "batch",
    "subscribe.": "subscribe",
    "publish.": "publish",
    "rpc.": "rpc",
    "security.": "security",
    "encryption.": "encryption",
    "activity.stream.": "activity",
    "cursors.stream.": "cursors",
    "groups.": "groups",
}
_TOP_LEVEL = {"listen": "listen", "host": "host", "port": "port", "data.dir": "data_dir"}


def test_every_key_is_a_typed_field_of_its_section() -> None:
    from liftlog.server.config import NO_EFFECT, SETTINGS

    config = load_config(env={})
    missing = []
    for setting in SETTINGS:
        if setting.key in _TOP_LEVEL:
            assert hasattr(config, _TOP_LEVEL[setting.key]), setting.key
            continue
        prefix = max((p for p in _SECTIONS if setting.key.startswith(p)), key=len, default=None)
        if prefix is None:
            if setting.key not in NO_EFFECT:  # accepted from Liftbridge's configs, read by nobody
                missing.append(setting.key)
            continue
        section = getattr(config, _SECTIONS[prefix])
        name = setting.key[len(prefix) :].replace(".", "_").replace("-", "_")
        if not hasattr(section, name):
            missing.append(setting.key)
        elif setting.key not in ("listen", "port") and getattr(section, name) != config.values[setting.key]:
            missing.append(f"{setting.key} (section says {getattr(section, name)!r})")
    assert missing == []


def test_sections_carry_the_values_read_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "liftlog.yaml"
    path.write_text("tls:\n  reload:\n    interval: 3s\ncursors.stream.partitions: 4\nactivity.stream.enabled: true\n")
    config = load_config(path, env={})
    assert (config.tls.reload_interval, config.cursors.partitions, config.activity.enabled) == (3000, 4, True)
