"""The deployment recipes in deploy/, checked without a container engine or systemd running.

The liftlog configurations go through ``liftlog server``'s own option and config parsing (with the server
itself replaced), so a misspelled key or flag fails here rather than at the first start of a container.
"""

from __future__ import annotations

import configparser
import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from click.testing import CliRunner

from liftlog.cli.main import main
from liftlog.server.config import ConfigError, ServerConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
UNIT = DEPLOY / "liftlog.service"
#: Written by the dashboard change of issue 17; compose.yaml and the Grafana provider point at it.
DASHBOARD = DEPLOY / "grafana" / "liftlog-dashboard.json"
LIFTLOG_SERVICES = ("liftlog-1", "liftlog-2", "liftlog-3")
#: YAML files under deploy/ that are not liftlog configurations; every other one is loaded as one.
NOT_LIFTLOG_YAML = {COMPOSE, DEPLOY / "prometheus.yml", DEPLOY / "alerts.yml"}


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def run_server_cli(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> ServerConfig:
    """``liftlog server ARGS`` up to the point where it would start: the config the server would get."""
    started: list[ServerConfig] = []

    def run_server(config: ServerConfig) -> int:
        started.append(config)
        return 0

    monkeypatch.setitem(sys.modules, "liftlog.server.runner", types.SimpleNamespace(run_server=run_server))
    for name in list(os.environ):
        if name.startswith("LIFTLOG_"):  # this machine's settings must not mask a file's mistakes
            monkeypatch.delenv(name)
    result = CliRunner().invoke(main, ["server", *args])
    assert result.exit_code == 0, f"liftlog server {shlex.join(args)}:\n{result.output}"
    assert len(started) == 1
    return started[0]


# -- compose.yaml -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    tree = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(tree, dict)
    return tree


def _named(entries: list[Any]) -> list[dict[str, Any]]:
    """A service's secrets or configs in long syntax (``{"source": ..., "target": ...}``)."""
    return [entry if isinstance(entry, dict) else {"source": entry} for entry in entries]


def _volumes(service: dict[str, Any]) -> list[tuple[str, str]]:
    """A service's volumes as (source, target); short syntax ``source:target[:mode]`` or long."""
    out = []
    for entry in service.get("volumes", []):
        if isinstance(entry, dict):
            out.append((entry.get("source", ""), entry["target"]))
        else:
            source, _, rest = entry.partition(":")
            out.append((source, rest.partition(":")[0]) if rest else ("", source))
    return out


def _published(service: dict[str, Any]) -> list[tuple[str, int, int, str]]:
    """A service's published ports as (host ip, host port, container port, protocol)."""
    out = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            out.append(
                (entry.get("host_ip", ""), int(entry["published"]), int(entry["target"]), entry.get("protocol", "tcp"))
            )
            continue
        spec, _, protocol = str(entry).partition("/")
        parts = spec.rsplit(":", 2)
        assert len(parts) >= 2, f"{entry!r} publishes no host port: compose would pick a random one"
        host_ip = parts[0] if len(parts) == 3 else ""
        out.append((host_ip, int(parts[-2]), int(parts[-1]), protocol or "tcp"))
    return out


def _config_file(compose: dict[str, Any], service: str, target: str) -> Path:
    """The host file a service sees at ``target`` through a compose config."""
    for entry in _named(compose["services"][service].get("configs", [])):
        if entry.get("target") == target:
            return DEPLOY / str(compose["configs"][entry["source"]]["file"])
    raise AssertionError(f"{service} has no config at {target}")


def _server_config(compose: dict[str, Any], service: str, monkeypatch: pytest.MonkeyPatch) -> ServerConfig:
    """The config a liftlog service's command gives its server, with container paths read from the host."""
    targets = {
        entry["target"]: str(_config_file(compose, service, entry["target"]))
        for entry in _named(compose["services"][service].get("configs", []))
    }
    return run_server_cli(monkeypatch, [targets.get(arg, arg) for arg in compose["services"][service]["command"]])


def test_compose_has_nats_three_servers_and_monitoring(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"nats", *LIFTLOG_SERVICES, "prometheus", "grafana"}


def test_every_service_has_an_image_that_exists_or_is_built(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        if "build" in service:
            context = (DEPLOY / service["build"]["context"]).resolve()
            assert (context / service["build"]["dockerfile"]).is_file(), name
            assert (context / "pyproject.toml").is_file(), f"{name}: the build context is not the repository root"
            continue
        image = service.get("image", "")
        # A pinned tag: `latest` (or none) changes under a deployment without anyone noticing.
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image), f"{name}: image {image!r} has no tag"
        assert not image.endswith(":latest"), name


def test_every_volume_secret_and_config_used_is_declared_and_every_declared_one_used(
    compose: dict[str, Any],
) -> None:
    used: dict[str, set[str]] = {"volumes": set(), "secrets": set(), "configs": set()}
    for name, service in compose["services"].items():
        for source, target in _volumes(service):
            assert target.startswith("/"), f"{name}: {target!r}"
            if source.startswith((".", "/")):
                assert (DEPLOY / source).exists(), f"{name}: bind mount of missing {source}"
            elif source:
                used["volumes"].add(source)
        for kind in ("secrets", "configs"):
            used[kind] |= {entry["source"] for entry in _named(service.get(kind, []))}
    for kind, names in used.items():
        assert names == set(compose.get(kind) or {}), kind


def test_every_config_file_exists(compose: dict[str, Any]) -> None:
    for name, config in compose["configs"].items():
        path = DEPLOY / config["file"]
        if path == DASHBOARD:
            continue  # another change's file: test_dashboard_names_the_provisioned_datasource
        assert path.is_file(), f"config {name}: {path} is missing"


def test_the_cluster_secret_file_stays_out_of_git(compose: dict[str, Any]) -> None:
    path = DEPLOY / compose["secrets"]["cluster-key"]["file"]
    # Made by `liftlog keygen` on each machine, into a folder that exists in a checkout; git must ignore it.
    assert path.parent == DEPLOY / "secrets" and path.parent.is_dir()
    ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT, check=False)
    assert ignored.returncode == 0, f"{path} is not ignored by git"


def test_published_ports_do_not_clash_and_stay_on_loopback(compose: dict[str, Any]) -> None:
    seen: dict[tuple[int, str], str] = {}
    for name, service in compose["services"].items():
        for host_ip, host_port, _container_port, protocol in _published(service):
            assert host_ip == "127.0.0.1", f"{name} publishes {host_port} on every interface"
            assert (host_port, protocol) not in seen, f"{name} and {seen[host_port, protocol]} publish {host_port}"
            seen[host_port, protocol] = name


def test_the_three_servers_form_one_cluster(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    configs = {name: _server_config(compose, name, monkeypatch) for name in LIFTLOG_SERVICES}
    nats_ports = {container for _, _, container, _ in _published(compose["services"]["nats"])}
    secret_targets = {
        "/run/secrets/" + entry.get("target", entry["source"])
        for name in LIFTLOG_SERVICES
        for entry in _named(compose["services"][name]["secrets"])
    }
    data_volumes = set()
    for name, config in configs.items():
        service = compose["services"][name]
        assert config.clustering.server_id == name
        assert config.host == name, "the advertised host must be the name other containers resolve"
        assert set(config.clustering.raft_bootstrap_peers) == set(LIFTLOG_SERVICES)
        assert not config.clustering.raft_bootstrap_seed
        for url in config.nats.servers:
            parts = urlsplit(url)
            assert parts.hostname in compose["services"], url
            assert parts.port in nats_ports, url
        assert not config.nats.embedded
        assert config.clustering.auth_key_file in secret_targets
        volumes = {target: source for source, target in _volumes(service)}
        assert str(config.data_dir) in volumes, f"{name}: data.dir {config.data_dir} is not on a volume"
        data_volumes.add(volumes[str(config.data_dir)])
        # Published on the same port: the advertised host:port is then the address from the host too.
        assert (config.port, config.port) in {(h, c) for _, h, c, _ in _published(service)}, name
        assert _port(config.values["metrics.listen"]) in {c for _, _, c, _ in _published(service)}, name
    assert len(data_volumes) == len(LIFTLOG_SERVICES), "each server needs a volume of its own"
    assert len({c.port for c in configs.values()}) == len(LIFTLOG_SERVICES)


def test_prometheus_scrapes_every_server_metrics_endpoint(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    scrape = yaml.safe_load(_config_file(compose, "prometheus", "/etc/prometheus/prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    targets = {target for group in jobs["liftlog"]["static_configs"] for target in group["targets"]}
    expected = {
        f"{name}:{_port(_server_config(compose, name, monkeypatch).values['metrics.listen'])}"
        for name in LIFTLOG_SERVICES
    }
    assert targets == expected
    assert jobs["liftlog"].get("metrics_path", "/metrics") == "/metrics"


def test_grafana_provisioning_points_at_prometheus_and_the_dashboard(compose: dict[str, Any]) -> None:
    datasources = yaml.safe_load(
        _config_file(compose, "grafana", "/etc/grafana/provisioning/datasources/prometheus.yaml").read_text()
    )["datasources"]
    (prometheus,) = [d for d in datasources if d["type"] == "prometheus"]
    url = urlsplit(prometheus["url"])
    assert url.hostname == "prometheus"
    assert url.port in {c for _, _, c, _ in _published(compose["services"]["prometheus"])}
    providers = yaml.safe_load(
        _config_file(compose, "grafana", "/etc/grafana/provisioning/dashboards/liftlog.yaml").read_text()
    )["providers"]
    dashboard_targets = [
        PurePosixPath(entry["target"])
        for entry in _named(compose["services"]["grafana"]["configs"])
        if DEPLOY / compose["configs"][entry["source"]]["file"] == DASHBOARD
    ]
    assert len(dashboard_targets) == 1
    assert PurePosixPath(providers[0]["options"]["path"]) == dashboard_targets[0].parent


def _datasource_uids(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        source = node.get("datasource")
        if isinstance(source, dict) and isinstance(source.get("uid"), str):
            yield source["uid"]
        for value in node.values():
            yield from _datasource_uids(value)
    elif isinstance(node, list):
        for value in node:
            yield from _datasource_uids(value)


def test_dashboard_names_the_provisioned_datasource() -> None:
    if not DASHBOARD.exists():
        pytest.skip(f"{DASHBOARD.relative_to(ROOT)} is not written yet (the dashboard change of issue 17)")
    provisioned = {
        d["uid"]
        for d in yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text())[
            "datasources"
        ]
    }
    uids = set(_datasource_uids(json.loads(DASHBOARD.read_text())))
    # A template variable (${datasource}) is resolved by Grafana; any other uid must be the provisioned one.
    fixed = {uid for uid in uids if not uid.startswith("$") and uid not in ("-- Grafana --", "grafana")}
    assert fixed <= provisioned, f"the dashboard names datasources Grafana is not given: {fixed - provisioned}"


def test_docker_compose_accepts_the_file() -> None:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client on this machine")
    version = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, check=False)
    if version.returncode != 0:
        reason = (version.stderr.strip() or version.stdout.strip()).splitlines()
        pytest.skip(f"the docker client has no compose plugin ({reason[0] if reason else version.returncode})")
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, check=False
    )
    secret = DEPLOY / "secrets" / "cluster.key"
    if result.returncode != 0 and not secret.exists() and "cluster.key" in result.stderr:
        pytest.skip(f"compose wants the cluster secret: liftlog keygen {secret.relative_to(ROOT)}")
    assert result.returncode == 0, result.stderr


# -- liftlog configurations ---------------------------------------------------------------------------


def _liftlog_yaml_files() -> list[Path]:
    return sorted(
        path
        for pattern in ("*.yaml", "*.yml")
        for path in DEPLOY.rglob(pattern)
        if path not in NOT_LIFTLOG_YAML and "grafana" not in path.relative_to(DEPLOY).parts
    )


def test_the_deploy_folder_has_liftlog_configs() -> None:
    names = {str(path.relative_to(DEPLOY)) for path in _liftlog_yaml_files()}
    assert names == {"liftlog.yaml", *(f"config/{name}.yaml" for name in LIFTLOG_SERVICES)}


@pytest.mark.parametrize("path", _liftlog_yaml_files(), ids=lambda path: str(path.relative_to(DEPLOY)))
def test_liftlog_config_loads(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(path, env={})
    assert config.values["metrics.listen"], "the health checks and Prometheus need metrics.listen"
    assert config.clustering.auth_key_file, "a cluster on a shared NATS needs its secret"
    assert run_server_cli(monkeypatch, ["--config", str(path)]) == config


def test_a_misspelled_key_fails_loading(tmp_path: Path) -> None:
    # What test_liftlog_config_loads relies on: load_config refuses what it does not know.
    text = (DEPLOY / "liftlog.yaml").read_text()
    assert "metrics.listen:" in text
    path = tmp_path / "liftlog.yaml"
    path.write_text(text.replace("metrics.listen:", "metric.listen:"))
    with pytest.raises(ConfigError, match=re.escape("'metric.listen': unknown key")):
        load_config(path, env={})


# -- Dockerfile ---------------------------------------------------------------------------------------


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends in a continuation"
    return out


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return _instructions(DOCKERFILE.read_text())


def _stages(instructions: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for instruction in instructions:
        if instruction[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def test_dockerfile_builds_a_wheel_and_runs_it_on_python_slim(dockerfile: list[tuple[str, str]]) -> None:
    global_args = dict(
        args.partition("=")[::2] for word, args in dockerfile[: [w for w, _ in dockerfile].index("FROM")]
    )
    stages = _stages(dockerfile)
    assert len(stages) >= 2
    build, runtime = stages[0], stages[-1]
    assert any(word == "RUN" and "pip wheel" in args for word, args in build)
    build_name = build[0][1].split()[-1]
    assert build[0][1].split()[-2].upper() == "AS"
    # The runtime stage takes the wheels from the build stage, not from an index.
    assert any(word == "RUN" and f"from={build_name}" in args and "--no-index" in args for word, args in runtime)
    image = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], runtime[0][1].split()[0])
    assert image == "python:3.11-slim"


def test_dockerfile_runs_as_a_user_with_a_volume_ports_and_a_health_check(
    dockerfile: list[tuple[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = _stages(dockerfile)[-1]
    last = {word: args for word, args in runtime}  # the instruction that counts is the last of each kind
    assert last["USER"].partition(":")[0] not in ("root", "0", "")
    assert json.loads(last["ENTRYPOINT"]) == ["liftlog", "server"]
    volumes = set(json.loads(last["VOLUME"]))
    exposed = {int(port.partition("/")[0]) for port in last["EXPOSE"].split()}
    assert exposed == {9292, 9464}
    health = last["HEALTHCHECK"]
    assert "http://127.0.0.1:9464/healthz" in health
    # The default CMD through the real CLI: its data, API and metrics agree with VOLUME, EXPOSE and the check.
    config = run_server_cli(monkeypatch, json.loads(last["CMD"]))
    assert str(config.data_dir) in volumes
    assert config.bind_host == "0.0.0.0" and config.port in exposed
    assert config.values["metrics.listen"] == "0.0.0.0:9464"
    assert config.nats.embedded


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False), (None, False)])
def test_dockerfile_health_check_command(dockerfile: list[tuple[str, str]], status: int | None, healthy: bool) -> None:
    """The check's own command against a server answering ``status`` (None: nothing listening)."""
    health = dict(_stages(dockerfile)[-1])["HEALTHCHECK"]
    command = json.loads(health.partition(" CMD ")[2])
    assert command[:2] == ["python", "-c"]
    handler = type("Handler", (_Health,), {"status": status or 200})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    port = server.server_address[1]
    if status is None:
        server.server_close()  # the port is free again: the check meets a refused connection
    else:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code = command[2].replace("127.0.0.1:9464", f"127.0.0.1:{port}")
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30, check=False)
    finally:
        if status is not None:
            server.shutdown()
            server.server_close()
    assert (result.returncode == 0) is healthy, result.stderr.decode(errors="replace")


# -- systemd ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True, empty_lines_in_values=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def test_systemd_unit_has_the_operating_settings(unit: configparser.ConfigParser) -> None:
    service = unit["Service"]
    assert service["User"] not in ("", "root")
    assert service["Restart"] == "on-failure"
    assert int(service["LimitNOFILE"]) >= 65536
    assert service["ExecReload"].split()[-2:] == ["-HUP", "$MAINPID"]
    assert service.get("KillSignal", "SIGTERM") == "SIGTERM"
    assert service["TimeoutStopSec"]
    assert service["NoNewPrivileges"] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert f"/var/lib/{service['StateDirectory']}" in service["ReadWritePaths"].split()
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_systemd_unit_runs_the_example_config(unit: configparser.ConfigParser, monkeypatch: pytest.MonkeyPatch) -> None:
    binary, *args = shlex.split(unit["Service"]["ExecStart"])
    assert Path(binary).name == "liftlog"
    assert args[:2] == ["server", "--config"] and args[2] == "/etc/liftlog/liftlog.yaml"
    # deploy/README.md installs deploy/liftlog.yaml there.
    config = run_server_cli(monkeypatch, ["--config", str(DEPLOY / "liftlog.yaml"), *args[3:]])
    assert config.data_dir == Path("/var/lib") / unit["Service"]["StateDirectory"]
    assert str(config.data_dir) in unit["Service"]["ReadWritePaths"].split()


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("no systemd-analyze on this machine (test_systemd_unit_has_the_operating_settings still ran)")
    # verify insists that ExecStart's binary exists: point it at this environment's liftlog.
    text = UNIT.read_text()
    assert "/opt/liftlog/bin/liftlog" in text
    copy = tmp_path / "liftlog.service"
    copy.write_text(text.replace("/opt/liftlog/bin/liftlog", str(Path(sys.executable).parent / "liftlog")))
    result = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True, check=False)
    # verify exits 0 on unknown keys and bad values too, and only says so: any line about this unit fails.
    about_unit = [line for line in (result.stdout + result.stderr).splitlines() if "liftlog.service" in line]
    assert result.returncode == 0 and not about_unit, result.stdout + result.stderr
