"""The ``liftlog`` command line, without a server: help, option parsing, error reporting, formatting."""

from __future__ import annotations

import base64
import json
import os
import socket
import sys
import time
import types
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from liftlog.cli import params
from liftlog.cli.bench_scenarios import percentiles
from liftlog.cli.common import CommandError, addr_option, addresses, reporting_errors, root_addr_option
from liftlog.cli.main import _server_overrides, main
from liftlog.cli.messages import read_lines
from liftlog.cli.output import format_message_json, format_message_text, format_time_ns
from liftlog.cli.params import StartSpec, StopSpec, parse_header, parse_start, parse_stop, parse_time_ns
from liftlog.server.errors import ServerStartError


def invoke(*args: str, env: dict[str, str] | None = None, input: str | None = None) -> Result:
    # LIFTLOG_* variables of the developer's shell must not leak into the tests.
    clean: dict[str, str | None] = {name: None for name in os.environ if name.startswith("LIFTLOG_")}
    return CliRunner(env=clean | (env or {})).invoke(main, list(args), input=input)


def assert_one_error_line(result: Result, code: int) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# -- help ----------------------------------------------------------------------

HELP = [
    ((), ["--addr", "--version", "server", "stream", "publish", "subscribe", "bench", "cluster"]),
    (("server",), ["--config", "--id", "--data-dir", "--host", "--port", "--embedded-nats", "--no-embedded-nats"]),
    (("server",), ["--embedded-nats-port", "--nats-servers", "--namespace", "--log-level", "--set"]),
    (("server",), ["--raft-bootstrap-seed", "--raft-bootstrap-peers", "--rack"]),
    (("stream",), ["create", "delete", "list", "describe", "pause", "resume", "readonly"]),
    (("stream", "create"), ["--subject", "--partitions", "--replication-factor", "--group", "--retention-max-bytes"]),
    (("stream", "create"), ["--retention-max-messages", "--retention-max-age", "--segment-max-bytes", "--compact"]),
    (("stream", "create"), ["--no-compact", "--auto-pause-time", "--occ", "--exist-ok", "--addr"]),
    (("stream", "delete"), ["NAME", "--addr"]),
    (("stream", "list"), ["--addr"]),
    (("stream", "describe"), ["NAME", "--addr"]),
    (("stream", "pause"), ["--partition", "--resume-all"]),
    (("stream", "resume"), ["--partition", "resume"]),
    (("stream", "readonly"), ["--partition", "--off"]),
    (("publish",), ["STREAM", "--key", "--header", "--partition", "--ack-policy", "--expected-offset", "--subject"]),
    (("publish",), ["--window", "stdin"]),
    (("subscribe",), ["--partition", "--from", "--until", "--follow", "--no-follow", "--count", "--output"]),
    (("subscribe",), ["--resume", "earliest", "offset:N", "time:T", "value_b64"]),
    (("bench",), ["--start-server", "--size", "--count", "--partitions", "--ack-policy", "--window"]),
    (("bench",), ["--concurrency", "--nats-url", "--scenarios", "--json-only", "sync", "e2e", "consume"]),
    (("bench",), ["--plot", "liftlog[plot]"]),
]


@pytest.mark.parametrize(("command", "expected"), HELP, ids=lambda v: " ".join(v) if isinstance(v, tuple) else None)
def test_help_lists_the_options(command: tuple[str, ...], expected: list[str]) -> None:
    for flag in ("--help", "-h"):
        result = invoke(*command, flag)
        assert result.exit_code == 0, result.output
        for word in expected:
            assert word in result.stdout, f"{word} missing from `liftlog {' '.join(command)} --help`"


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith("liftlog, version ")


# -- addresses -----------------------------------------------------------------


@click.group()
@root_addr_option
def _probe_group() -> None:
    pass


@_probe_group.command("probe")
@addr_option
def _probe() -> None:
    click.echo(" ".join(addresses()))


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], {}, "127.0.0.1:9292"),
        ([], {"LIFTLOG_ADDR": "a:1,b:2"}, "a:1 b:2"),
        (["-a", "a:1", "-a", "b:2, c:3"], {}, "a:1 b:2 c:3"),
        (["--addr", "a:1"], {"LIFTLOG_ADDR": "env:1"}, "a:1"),
        (["-a", "a:1", "probe", "-a", "sub:1"], {"LIFTLOG_ADDR": "env:1"}, "sub:1"),
        (["probe", "-a", "sub:1"], {"LIFTLOG_ADDR": "env:1"}, "sub:1"),
    ],
)
def test_addresses_from_group_subcommand_and_env(args: list[str], env: dict[str, str], expected: str) -> None:
    argv = args if "probe" in args else [*args, "probe"]
    unset: dict[str, str | None] = {"LIFTLOG_ADDR": None}
    result = CliRunner(env=unset | env).invoke(_probe_group, argv)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == expected


def test_split_addresses() -> None:
    assert params.split_addresses(["a:1,b:2", " c:3 ", "d:4 e:5", ""]) == ("a:1", "b:2", "c:3", "d:4", "e:5")


# -- value parsers -------------------------------------------------------------


def test_parse_start() -> None:
    assert parse_start("earliest") == StartSpec("EARLIEST")
    assert parse_start("LATEST") == StartSpec("LATEST")
    assert parse_start("new") == parse_start("new-only") == StartSpec("NEW_ONLY")
    assert parse_start("offset:42") == StartSpec("OFFSET", offset=42)
    assert parse_start("time:1700000000000000000ns") == StartSpec("TIMESTAMP", timestamp_ns=1_700_000_000_000_000_000)
    for bad in ("", "first", "offset:", "offset:-1", "offset:x", "earliest:3", "time:yesterday"):
        with pytest.raises(ValueError):
            parse_start(bad)


def test_parse_stop() -> None:
    assert parse_stop("latest") == StopSpec("STOP_LATEST")
    assert parse_stop("offset:7") == StopSpec("STOP_OFFSET", offset=7)
    assert parse_stop("time:2024-05-01T12:00:00Z").position == "STOP_TIMESTAMP"
    for bad in ("earliest", "new", "offset", "time:"):
        with pytest.raises(ValueError):
            parse_stop(bad)


def test_parse_time_ns() -> None:
    assert parse_time_ns("2024-05-01T12:00:00Z") == 1_714_564_800 * 10**9
    assert parse_time_ns("2024-05-01T14:00:00.250+02:00") == 1_714_564_800 * 10**9 + 250_000_000
    assert parse_time_ns("1714564800000000123ns") == 1_714_564_800_000_000_123
    assert parse_time_ns("1714564800s") == parse_time_ns("1714564800000ms") == 1_714_564_800 * 10**9
    assert parse_time_ns("1714564800000001us") == 1_714_564_800_000_001_000
    naive = datetime(2024, 5, 1, 12, 0, 0).astimezone()  # no offset: local time
    assert parse_time_ns("2024-05-01T12:00:00") == int(naive.timestamp()) * 10**9
    before = time.time_ns()
    ninety_seconds_ago = parse_time_ns("-90s")
    assert before - 90 * 10**9 <= ninety_seconds_ago <= time.time_ns() - 90 * 10**9


@pytest.mark.parametrize("bare", ["1714564800", "1714564800000", "1714564800000000000"])
def test_a_unix_time_without_its_unit_is_refused_naming_the_units(bare: str) -> None:
    """A bare number read as ns would quietly start at offset 0 for someone who meant seconds or ms."""
    with pytest.raises(ValueError, match=f"needs a unit: {bare}s .* {bare}ms, {bare}us or {bare}ns"):
        parse_time_ns(bare)
    with pytest.raises(ValueError, match="needs a unit"):
        parse_start(f"time:{bare}")


def test_parse_header() -> None:
    assert parse_header("source=web") == ("source", b"web")
    assert parse_header("expr=a=b") == ("expr", b"a=b")
    assert parse_header("empty=") == ("empty", b"")
    assert parse_header("ünï=cödé") == ("ünï", "cödé".encode())
    for bad in ("novalue", "=value", " =x"):
        with pytest.raises(ValueError):
            parse_header(bad)


def test_size_and_duration_types() -> None:
    assert params.SIZE.convert("512MiB", None, None) == 512 << 20
    assert params.SIZE.convert("1GB", None, None) == 10**9
    assert params.SIZE.convert("4096", None, None) == 4096
    assert params.DURATION.convert("1h30m", None, None) == 5_400_000
    assert params.DURATION.convert("250ms", None, None) == 250
    assert params.DURATION.convert("1500", None, None) == 1500
    with pytest.raises(click.BadParameter):
        params.SIZE.convert("12XB", None, None)
    with pytest.raises(click.BadParameter):
        params.DURATION.convert("soon", None, None)


@pytest.mark.parametrize(
    "args",
    [
        ("stream", "create", "s", "--subject", "s", "--retention-max-bytes", "12XB"),
        ("stream", "create", "s", "--subject", "s", "--retention-max-age", "soon"),
        ("stream", "create", "s"),  # --subject is required
        ("subscribe", "s", "--from", "first"),
        ("subscribe", "s", "--until", "new"),
        ("subscribe", "s", "--follow", "--until", "latest"),
        ("publish", "s", "-H", "novalue", "x"),
        ("publish", "s", "a", "b", "--expected-offset", "3"),
        ("publish", "s", "--ack-policy", "some", "x"),
        ("bench", "--scenarios", "sync,warp"),
        ("bench", "--start-server", "--fsync", "never,sometimes"),
        ("bench", "--fsync", "always"),  # the policy of a server it does not start
    ],
)
def test_bad_values_are_usage_errors(args: tuple[str, ...]) -> None:
    result = invoke(*args, "-a", closed_address())
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert "Error:" in result.stderr


# -- errors --------------------------------------------------------------------


def closed_address() -> str:
    """An address nothing listens on (a port just released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.timeout(60)
def test_unreachable_server_is_one_error_line() -> None:
    line = assert_one_error_line(invoke("stream", "list", "-a", closed_address()), 1)
    assert "no liftlog server answered" in line


def test_missing_config_file_is_one_error_line(tmp_path: Path) -> None:
    result = invoke("server", "--data-dir", str(tmp_path / "data"), "-c", str(tmp_path / "missing.yaml"))
    line = assert_one_error_line(result, 2)
    assert "missing.yaml" in line


def test_unknown_config_key_is_one_error_line() -> None:
    line = assert_one_error_line(invoke("server", "--set", "streams.retention.max.bites=1"), 2)
    assert "did you mean 'streams.retention.max.bytes'" in line


def test_server_builds_overrides_only_for_given_flags() -> None:
    assert _server_overrides((), {"host": None, "port": None}) == {}
    overrides = _server_overrides(("port=1", "x.y=z=w"), {"host": None, "port": 0, "nats.embedded": False})
    assert overrides == {
        "port": 0,  # the flag wins over --set port=1
        "nats.embedded": False,
        "x.y": "z=w",
    }


def test_server_flags_map_to_config_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []

    def load_config(path: str | None, overrides: dict[str, Any], env: dict[str, str]) -> object:
        seen.append(overrides)
        return object()

    monkeypatch.setattr("liftlog.server.config.load_config", load_config)
    monkeypatch.setitem(sys.modules, "liftlog.server.runner", types.SimpleNamespace(run_server=lambda config: 0))
    flags: tuple[str, ...] = (
        "--id",
        "a",
        "--data-dir",
        "./d",
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--no-embedded-nats",
    )
    flags += ("--embedded-nats-port", "4223", "--nats-servers", "nats://x:4222,nats://y:4222", "--namespace", "ns")
    result = invoke("server", *flags, "--log-level", "DEBUG", "--set", "port=1", "--set", "x.y=z=w")
    assert result.exit_code == 0, result.output
    assert seen == [
        {
            "clustering.server.id": "a",
            "data.dir": "./d",
            "host": "0.0.0.0",
            "port": 0,  # the flag wins over --set port=1
            "nats.embedded": False,
            "nats.embedded.port": 4223,
            "nats.servers": "nats://x:4222,nats://y:4222",
            "clustering.namespace": "ns",
            "logging.level": "debug",
            "x.y": "z=w",
        }
    ]


def test_server_runs_with_the_loaded_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[Any] = []

    def run_server(config: Any) -> int:
        seen.append(config)
        return 3

    monkeypatch.setitem(sys.modules, "liftlog.server.runner", types.SimpleNamespace(run_server=run_server))
    config_file = tmp_path / "liftlog.yaml"
    config_file.write_text("port: 9000\nlogging.level: warn\n")
    result = invoke(
        "server",
        *("-c", str(config_file), "--id", "s1", "--embedded-nats", "--embedded-nats-port", "0", "--port", "9001"),
        # The CLI's LIFTLOG_ADDR is not one of the server's LIFTLOG_<KEY> settings and must not be read as one.
        env={"LIFTLOG_ADDR": "127.0.0.1:1", "LIFTLOG_STREAMS_RETENTION_MAX_AGE": "1h"},
    )
    assert result.exit_code == 3, result.output
    (config,) = seen
    assert (config.port, config.clustering.server_id, config.log_level) == (9001, "s1", "warn")
    assert config.nats.embedded is True and config.nats.embedded_port == 0
    assert config.streams.retention_max_age == 3_600_000


def test_server_start_error_is_one_error_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def run_server(config: Any) -> int:
        raise ServerStartError("port 9292 is in use")

    monkeypatch.setitem(sys.modules, "liftlog.server.runner", types.SimpleNamespace(run_server=run_server))
    assert assert_one_error_line(invoke("server"), 1) == "error: port 9292 is in use"


def test_pipeline_generate_without_nats_is_one_error_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import nats

    class Liftlog:  # a liftlog that has the input stream, so that the generator goes on to NATS
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        async def __aenter__(self) -> Liftlog:
            return self

        async def __aexit__(self, *exc: object) -> None:
            pass

        async def create_stream(self, *args: Any, **kwargs: Any) -> None:
            pass

        async def fetch_metadata(self, stream: str) -> Any:
            return types.SimpleNamespace(streams={stream: types.SimpleNamespace(partitions={0: None})})

    monkeypatch.setattr("liftlog.client.Client", Liftlog)
    connect = nats.connect  # the real one, with quick reconnection attempts
    monkeypatch.setattr(nats, "connect", lambda *args, **kwargs: connect(*args, **kwargs, reconnect_time_wait=0.05))
    line = assert_one_error_line(invoke("pipeline", "generate", "--nats", "nats://127.0.0.1:1", "--events", "3"), 1)
    assert line.startswith("error: cannot connect to NATS at nats://127.0.0.1:1")


@pytest.mark.parametrize(
    ("exc", "code", "stderr"),
    [
        (KeyboardInterrupt(), 130, ""),
        (CommandError("no such stream: x"), 1, "error: no such stream: x\n"),
        (ConnectionRefusedError(111, "Connection refused"), 1, "error: [Errno 111] Connection refused\n"),
        (TimeoutError(), 1, "error: timed out\n"),
        (OSError("two\nlines"), 1, "error: two lines\n"),
    ],
)
def test_reporting_errors(
    exc: BaseException, code: int, stderr: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "20")  # a narrow terminal must not wrap the line
    with pytest.raises(click.exceptions.Exit) as caught, reporting_errors():
        raise exc
    assert caught.value.exit_code == code
    assert capsys.readouterr().err == stderr


def test_reporting_errors_lets_bugs_through() -> None:
    with pytest.raises(ZeroDivisionError), reporting_errors():
        _ = 1 / 0


# -- output --------------------------------------------------------------------


@dataclass
class Msg:
    offset: int = 5
    key: bytes | None = None
    value: bytes = b"hello"
    timestamp: int = 1_714_564_800_000_000_000
    stream: str = "orders"
    partition: int = 1
    subject: str = "orders.eu"
    headers: dict[str, bytes] = field(default_factory=dict)


def test_format_message_json_text_values() -> None:
    line = format_message_json(Msg(key=b"k-1", value="grüße".encode(), headers={"source": b"web"}))
    assert "\n" not in line
    assert json.loads(line) == {
        "offset": 5,
        "key": "k-1",
        "value": "grüße",
        "timestamp": 1_714_564_800_000_000_000,
        "stream": "orders",
        "partition": 1,
        "subject": "orders.eu",
        "headers": {"source": "web"},
    }


def test_format_message_json_binary_values() -> None:
    raw = b"\xff\x00\xfe"
    obj = json.loads(format_message_json(Msg(key=raw, value=raw, headers={"bin": raw, "txt": b"ok"})))
    assert "value" not in obj and base64.b64decode(obj["value_b64"]) == raw
    assert "key" not in obj and base64.b64decode(obj["key_b64"]) == raw
    assert obj["headers"] == {"txt": "ok"}
    assert base64.b64decode(obj["headers_b64"]["bin"]) == raw


def test_format_message_json_no_key_and_multiline_value() -> None:
    obj = json.loads(format_message_json(Msg(key=None, value=b"a\nb")))
    assert obj["key"] is None and obj["value"] == "a\nb" and obj["headers"] == {}
    assert "headers_b64" not in obj


def test_format_message_text() -> None:
    assert format_message_text(Msg()) == "5  -  hello"
    assert format_message_text(Msg(key=b"k", value=b"caf\xc3\xa9 \xff")) == "5  k  café \ufffd"


def test_format_time_ns() -> None:
    assert format_time_ns(0) == format_time_ns(None) == "-"
    parsed = datetime.fromisoformat(format_time_ns(1_714_564_800_123_456_789))
    assert parsed.astimezone(UTC) == datetime(2024, 5, 1, 12, 0, 0, 123000, tzinfo=UTC)
    assert "+" not in format_time_ns(1_714_564_800_000_000_000, offset=False)[10:]


async def test_read_lines_splits_and_batches() -> None:
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"a\nb\r\n\nc\nd\ne")  # a blank line is a message; the last line has no newline
    os.close(write_fd)
    try:
        batches = [batch async for batch in read_lines(read_fd, max_lines=2)]
    finally:
        os.close(read_fd)
    assert batches == [[b"a", b"b"], [b"", b"c"], [b"d"], [b"e"]]


def test_percentiles() -> None:
    latencies = [i * 1000 for i in range(1, 1001)]  # 1..1000 µs
    assert percentiles(latencies) == {"p50": 500.0, "p99": 990.0, "p99.9": 999.0}
    assert percentiles([7000]) == {"p50": 7.0, "p99": 7.0, "p99.9": 7.0}


# -- keygen --------------------------------------------------------------------


def test_keygen_writes_a_private_secret_once(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "cluster.key"
    result = invoke("keygen", str(path))
    assert result.exit_code == 0, result.output
    assert f"wrote a new cluster secret to {path}" in result.output
    secret = path.read_text()
    assert len(secret.strip()) == 64 and int(secret, 16) > 0
    assert path.stat().st_mode & 0o777 == 0o600
    line = assert_one_error_line(invoke("keygen", str(path)), 1)
    assert "exists" in line and path.read_text() == secret
