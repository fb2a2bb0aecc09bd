"""The ``liftlog`` command: the root group and ``liftlog server``."""

from __future__ import annotations

import os
from collections.abc import Mapping

import click

from liftlog import __version__
from liftlog.cli.acl import acl
from liftlog.cli.activity import activity
from liftlog.cli.bench import bench
from liftlog.cli.cluster import cluster
from liftlog.cli.common import CLIENT_ENV, ReportingGroup, fail, root_addr_option
from liftlog.cli.cursors import cursor
from liftlog.cli.encryption import encryption
from liftlog.cli.groups import group
from liftlog.cli.messages import publish, subscribe
from liftlog.cli.pipeline import pipeline  # imports neither pyspark nor gRPC until a command runs
from liftlog.cli.streams import stream

__all__ = ["main"]

_LOG_LEVELS = ("debug", "info", "warn", "error")


@click.group(cls=ReportingGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", "-V", prog_name="liftlog")
@root_addr_option
def main() -> None:
    """liftlog: a durable, Liftbridge-compatible message log for NATS.

    Run a server with `liftlog server --embedded-nats`, then create streams,
    publish and subscribe against it (or against any Liftbridge server):

    \b
      liftlog stream create orders --subject orders
      echo '{"id": 1}' | liftlog publish orders
      liftlog subscribe orders --from earliest --follow
      liftlog cluster status
      liftlog pipeline run --events 10000

    Commands that talk to a server take --addr/-a here or after the command.
    """


def _server_overrides(settings: tuple[str, ...], flags: Mapping[str, object]) -> dict[str, object]:
    """Config overrides (Liftbridge dotted keys): the ``--set KEY=VALUE`` `settings`, then the `flags`.

    `flags` maps config keys to the values of the dedicated flags, None for a
    flag that was not given; only the given ones count, and they win over
    ``--set`` for the same key.
    """
    overrides: dict[str, object] = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key.strip():
            fail(f"--set expects KEY=VALUE, got {setting!r}", 2)
        overrides[key.strip()] = value
    overrides.update({key: value for key, value in flags.items() if value is not None})
    return overrides


@main.command()
@click.option("-c", "--config", "config_path", metavar="FILE", help="YAML config file with Liftbridge's keys.")
@click.option("--id", "--server-id", "server_id", help="This server's id (clustering.server.id; default: random).")
@click.option(
    "-d", "--data-dir", metavar="DIR", help="Where streams and metadata are stored (data.dir; default ./data)."
)
@click.option("--host", help="Interface of the gRPC API (host; default 127.0.0.1).")
@click.option("-p", "--port", type=click.IntRange(0, 65535), help="Port of the gRPC API (port; default 9292).")
@click.option(
    "--embedded-nats/--no-embedded-nats",
    "-e/ ",
    default=None,
    help="Start and supervise a nats-server child process (nats.embedded).",
)
@click.option(
    "--embedded-nats-config",
    "--nc",
    metavar="FILE",
    help="nats-server config file for the embedded server; implies --embedded-nats (nats.embedded.config).",
)
@click.option(
    "--embedded-nats-port",
    type=click.IntRange(0, 65535),
    help="Port of the embedded nats-server, 0 for any free port (nats.embedded.port; default 4222).",
)
@click.option("-n", "--nats-servers", metavar="URLS", help="Comma-separated NATS URLs to connect to (nats.servers).")
@click.option("--namespace", "--ns", help="Cluster namespace, a prefix of internal subjects (clustering.namespace).")
@click.option(
    "--raft-bootstrap-seed",
    is_flag=True,
    default=None,
    help="Found a new cluster with this server; others join it (clustering.raft.bootstrap.seed).",
)
@click.option(
    "--raft-bootstrap-peers",
    metavar="IDS",
    help="Found a new cluster of these comma-separated server ids (clustering.raft.bootstrap.peers).",
)
@click.option("--rack", help="This server's rack; replicas of a partition go to different racks (clustering.rack).")
@click.option(
    "--tls-cert", metavar="FILE", help="Server certificate for the gRPC API; with --tls-key enables TLS (tls.cert)."
)
@click.option("--tls-key", metavar="FILE", help="Private key of the server certificate (tls.key).")
@click.option(
    "--log-level",
    "-l",
    "--level",
    "log_level",
    type=click.Choice(_LOG_LEVELS, case_sensitive=False),
    help="Log level (logging.level; default info).",
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="Any other config key, e.g. --set streams.retention.max.age=24h (repeatable).",
)
def server(
    config_path: str | None,
    server_id: str | None,
    data_dir: str | None,
    host: str | None,
    port: int | None,
    embedded_nats: bool | None,
    embedded_nats_config: str | None,
    embedded_nats_port: int | None,
    nats_servers: str | None,
    namespace: str | None,
    raft_bootstrap_seed: bool | None,
    raft_bootstrap_peers: str | None,
    rack: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    log_level: str | None,
    settings: tuple[str, ...],
) -> None:
    """Run a liftlog server until SIGINT or SIGTERM.

    Settings come from, lowest precedence first: defaults, the --config file,
    LIFTLOG_<KEY> environment variables (LIFTLOG_STREAMS_RETENTION_MAX_AGE=24h),
    then these flags. Liftbridge's flag names work too (--server-id, --ns,
    -d, -p, -n, -e, --nc/--embedded-nats-config, -l/--level).

    A server with --embedded-nats and no Raft state founds its own cluster;
    otherwise give one server --raft-bootstrap-seed (the others join it) or
    give every founding server the same --raft-bootstrap-peers.

    \b
      liftlog server --embedded-nats --data-dir ./data
      liftlog server -c liftlog.yaml --port 9293
      liftlog server --id a --raft-bootstrap-seed --nats-servers nats://127.0.0.1:4222
    """
    from liftlog.server.config import load_config

    overrides = _server_overrides(
        settings,
        {
            "clustering.server.id": server_id,
            "data.dir": data_dir,
            "host": host,
            "port": port,
            "nats.embedded": True if embedded_nats_config and embedded_nats is None else embedded_nats,
            "nats.embedded.config": embedded_nats_config,
            "nats.embedded.port": embedded_nats_port,
            "nats.servers": nats_servers,
            "clustering.namespace": namespace,
            "clustering.raft.bootstrap.seed": raft_bootstrap_seed,
            "clustering.raft.bootstrap.peers": raft_bootstrap_peers,
            "clustering.rack": rack,
            "tls.cert": tls_cert,
            "tls.key": tls_key,
            "logging.level": log_level.lower() if log_level else None,
        },
    )
    env = {name: value for name, value in os.environ.items() if name not in CLIENT_ENV}
    config = load_config(config_path, overrides, env)
    # Imported here: the server pulls in gRPC and the whole broker, which other commands do not need.
    from liftlog.server.runner import run_server

    raise click.exceptions.Exit(run_server(config))


@main.command()
@click.argument("path", type=click.Path())
@click.option(
    "--master-key",
    is_flag=True,
    help="write an encryption master key (32 random bytes, base64) for encryption.key.file instead",
)
@click.option(
    "--tls",
    is_flag=True,
    help="make PATH a directory of TLS files instead: a CA, a server and a client certificate and their keys",
)
@click.option(
    "--host",
    "hosts",
    multiple=True,
    help="with --tls: a name or address clients reach the server by (repeat; default 127.0.0.1 and localhost)",
)
@click.option(
    "--client-name",
    default="client",
    show_default=True,
    help="with --tls: the client certificate's common name, the identity authorization policies name",
)
def keygen(path: str, master_key: bool, tls: bool, hosts: tuple[str, ...], client_name: str) -> None:
    """Write a new cluster secret to PATH (readable by you only) for clustering.auth.key.file.

    Give every server of the cluster a copy; servers sign their messages to each
    other with it and drop what is not signed. An existing file is left alone.
    With --master-key, write a master key for encrypted streams instead; every
    server needs a copy of that too. With --tls, make PATH a directory holding a
    private CA (ca.pem, ca.key), a server certificate for --host names
    (server.pem, server.key) and a client certificate (client.pem, client.key).

    \b
      liftlog keygen /etc/liftlog/cluster.key
      liftlog server --set clustering.auth.key.file=/etc/liftlog/cluster.key ...
      liftlog keygen --master-key /etc/liftlog/master.key
      liftlog server --set encryption.key.file=/etc/liftlog/master.key ...
      liftlog keygen --tls tls --host 127.0.0.1 --host db.example.com --client-name alice
      liftlog server --tls-cert tls/server.pem --tls-key tls/server.key ...
      liftlog stream list --tls-ca tls/ca.pem
    """
    from pathlib import Path

    if tls:
        if master_key:
            raise click.UsageError("--tls and --master-key exclude each other")
        from liftlog.security.certificates import make_tls_files

        try:
            written = make_tls_files(Path(path), list(hosts) or ["127.0.0.1", "localhost"], client_name)
        except (OSError, ValueError) as exc:
            fail(f"cannot write TLS files to {path}: {exc}")
        click.echo("wrote " + ", ".join(str(p) for p in written))
        return
    if hosts or client_name != "client":
        raise click.UsageError("--host and --client-name go with --tls")

    from liftlog.security.cluster_auth import generate_key_file
    from liftlog.security.master_key import generate_master_key_file

    what = "encryption master key" if master_key else "cluster secret"
    try:
        written_key = (generate_master_key_file if master_key else generate_key_file)(Path(path))
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}")
    if not written_key:
        fail(f"{path} exists; remove it first to replace the {what} (every server needs the new one)")
    click.echo(f"wrote a new {what} to {path}")


main.add_command(stream)
main.add_command(publish)
main.add_command(subscribe)
main.add_command(bench)
main.add_command(cluster)
main.add_command(acl)
main.add_command(cursor)
main.add_command(group)
main.add_command(activity)
main.add_command(pipeline)
main.add_command(encryption)


if __name__ == "__main__":  # `python -m liftlog.cli.main`, as `liftlog bench --start-server` runs it
    main()
