"""The composition root: builds a server's parts in order and tears them down in reverse.

``start`` order: data directory (locked against a second server), embedded
nats-server when configured, the NATS connection, the ack router, the
stream manager, the metadata service (Raft log replayed, partitions reopened
as the metadata says), the gRPC API, then the housekeeping tasks. A failing
step stops what was started and raises ServerStartError naming the step.
``stop`` closes the API first (no new work), leaves the metadata group's
loop, drains every partition's NATS intake and writes what it received,
closes the logs with their checkpoints, then NATS and the child nats-server.

Founding a cluster (only when the data directory has no Raft state yet):
``clustering.raft.bootstrap.seed`` founds it alone, ``.peers`` with a fixed
set of ids; with neither, a server with an embedded nats-server founds its
own (the standalone case) and any other asks the running cluster to join.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import logging
import os
import secrets
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any

import nats

from liftlog.api import api_pb2, batches_pb2, cluster_pb2
from liftlog.metadata import (
    CorruptMetadataError,
    InvalidStreamError,
    MetadataFile,
    subjects_overlap,
    validate_ack_inbox,
)
from liftlog.metadata.codec import encode_operation
from liftlog.metadata.controller import CreateStreamRequest
from liftlog.metadata.model import CreateStream, ServerMeta, StreamSettings
from liftlog.metadata.names import ACTIVITY_STREAM, CURSORS_STREAM, internal_stream_subject
from liftlog.metadata.protocol import ControlRequest, IsrChange, LeaderConfirmation, LeaderReport
from liftlog.natswire import LeanNats, NatsConnectError
from liftlog.natswire.client import LeanNatsClient
from liftlog.raft import NotLeader, ProposalDropped
from liftlog.raft.disk import RaftStorageError
from liftlog.replication.follower import ReportLeader
from liftlog.rpc import ConnectionLimits, RpcServer, ServerOptions, service_methods
from liftlog.security.ack_routes import RouteIds
from liftlog.security.authz import Authorizer
from liftlog.security.cluster_auth import ClusterAuth, KeyFileError, generate_key_file, load_key
from liftlog.security.master_key import MasterKeyError, load_master_keys
from liftlog.server import ratelimit
from liftlog.server.api.access import AccessControl
from liftlog.server.api.api_service import ApiLimits, ApiService
from liftlog.server.api.batches_service import BatchesService
from liftlog.server.api.cluster_service import ClusterService
from liftlog.server.api.cursors import CursorService
from liftlog.server.api.groups import GroupService
from liftlog.server.api.publisher import Publisher
from liftlog.server.api.reads import PartitionReads
from liftlog.server.clock import SYSTEM_CLOCK, Clock
from liftlog.server.config import SETTING_HELP, ServerConfig, ignored_settings
from liftlog.server.control.activity import ActivitySettings
from liftlog.server.control.cluster import ActivityWiring, MetadataService
from liftlog.server.control.metadata_raft import RaftSettings
from liftlog.server.errors import ServerStartError
from liftlog.server.nats.authenticated_nats import AuthenticatedNats, internal_subjects
from liftlog.server.nats.embedded_nats import EmbeddedNats, EmbeddedNatsConfig, EmbeddedNatsError
from liftlog.server.nats.nats_types import NatsClient
from liftlog.server.ops.metrics import LoopLagMonitor, ServerCollector, new_registry
from liftlog.server.ops.ops_http import Check, OpsEndpoint
from liftlog.server.ops.tls_files import ReloadingTls, TlsFiles
from liftlog.server.partitions.acks import AckRouter
from liftlog.server.partitions.partition import Partition
from liftlog.server.partitions.replicator import Replicator, ReplicatorSettings
from liftlog.server.partitions.streams import StreamManager
from liftlog.server.ratelimit import LogLimiter
from liftlog.server.spin import LoopSpinner
from liftlog.storage import FileIO, StorageError
from liftlog.storage.encryption import BatchCipher, MasterKey
from liftlog.storage.fileio import DEFAULT_FILE_IO

__all__ = ["Server"]

_ACK_POLICIES: dict[str, api_pb2.AckPolicy] = {"leader": api_pb2.LEADER, "all": api_pb2.ALL, "none": api_pb2.NONE}

log = logging.getLogger(__name__)
#: Per-message warnings: whoever can publish on our subjects must not be able to flood the log.
_warn = LogLimiter(log)

#: How long a Publish waits for its ack when the request has no deadline.
DEFAULT_ACK_TIMEOUT_S = 5.0
#: The cluster secret of a server configured with none, in its data.dir (``make run`` uses the same file).
DEFAULT_KEY_FILE = "cluster.key"
GRPC_MAX_MESSAGE_BYTES = 64 << 20
#: What a request carries besides its message or batch: key, headers, the fields around them.
REQUEST_FRAMING_BYTES = 64 << 10


class Server:
    """One liftlog server. Not thread-safe; ``start`` and ``stop`` await."""

    def __init__(self, config: ServerConfig, *, clock: Clock = SYSTEM_CLOCK, file_io: FileIO = DEFAULT_FILE_IO) -> None:
        self.config = config
        self._clock = clock
        #: The partition logs' file operations (the fault suite passes one that fails on purpose).
        self._file_io = file_io
        self.server_id = ""
        self.nats_url = ""
        self.port = config.port
        self._lock_file: IO[str] | None = None
        self._embedded: EmbeddedNats | None = None
        self._nc: nats.aio.client.Client | None = None
        #: The hot path's connection (partition intake, clients' publishes), unless nats.lean.connection is off.
        self._lean: LeanNats | None = None
        #: What the server-to-server parts publish and subscribe through: signed when a secret is set.
        self._internal_nats: NatsClient
        self._replication_nats: NatsClient
        self._acks: AckRouter | None = None
        #: Acks to clients' inboxes, as the NATS user nats.acks.* names (None: on the hot connection).
        self._acks_nats: LeanNats | None = None
        self.streams: StreamManager | None = None
        self.cluster: MetadataService | None = None
        self.replicator: Replicator | None = None
        #: Keeps the loop polling after client publishes (``publish.spin.us``); None when that is 0.
        self.spinner: LoopSpinner | None = None
        self._grpc: RpcServer | None = None
        self._grpc_tls: ReloadingTls | None = None
        self.access: AccessControl | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        #: NATS connections lost so far: leadership resumes only after a metadata barrier begun since the last.
        self._nats_outages = 0
        #: Proving the metadata current before leading (at start, and after every lost NATS connection).
        self._confirming: asyncio.Task[None] | None = None
        #: Set when a part the server cannot run without broke (the metadata Raft loop); see ``failure``.
        self.failed = asyncio.Event()
        self.failure = ""
        #: Messages the NATS client dropped for a full subscription queue (it reports each as an error).
        self.nats_slow_consumer_drops = 0
        #: Set once ``start`` finished: the server serves and may be reported ready.
        self._serving = False
        self._ops: OpsEndpoint | None = None
        self._loop_lag = LoopLagMonitor()

    @property
    def _hot_nats(self) -> nats.aio.client.Client | LeanNats:
        """Where partitions listen and clients' messages are published: the lean connection if there is one."""
        return self._lean if self._lean is not None else self._connected_nats

    @property
    def _connected_nats(self) -> nats.aio.client.Client:
        assert self._nc is not None, "used before _start_nats"
        return self._nc

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    @property
    def nats_connection(self) -> nats.aio.client.Client | None:
        return self._nc

    @property
    def ack_router(self) -> AckRouter | None:
        """Routes acks to the calls that wait for them (None before start)."""
        return self._acks

    @property
    def lean_nats_connection(self) -> LeanNats | None:
        """The hot path's connection (``nats.lean.connection``), if there is one."""
        return self._lean

    @property
    def metrics_address(self) -> str | None:
        """host:port of /metrics, /healthz and /readyz (``metrics.listen``); None when off."""
        return self._ops.address if self._ops is not None else None

    # -- start -----------------------------------------------------------

    async def start(self) -> None:
        ratelimit.configure(self.config.logging.warnings_interval / 1000)
        for key in ignored_settings(self.config.values):
            log.warning("%s is set but has no effect in liftlog: %s", key, SETTING_HELP[key])
        try:
            # Secrets and certificates named in the configuration first: one missing or unreadable stops the
            # server before it creates or locks anything (the default secret lives in the data directory).
            c = self.config.clustering
            configured = bool(c.auth_key or c.auth_key_file or c.auth_insecure)
            auth = self._cluster_auth() if configured else None
            cipher = self._batch_cipher()
            self._grpc_tls = self._tls_context()
            self._open_data_dir()
            await self._start_ops_endpoint()  # liveness answers while the server catches up
            if not configured:
                auth = self._cluster_auth()
            await self._start_nats()
            self._internal_nats = self._connected_nats if auth is None else self._authenticated(auth)
            self._replication_nats = self._replication_connection(auth)
            self._acks = AckRouter(
                self.server_id,
                RouteIds(auth.route_key if auth is not None else None),
                self._check_ack_inbox,
            )
            # Clients' acks never sealed, never on the internal connection: on a connection of their own with
            # an application's rights (nats.acks.*), or else on the hot connection as it is.
            clients = self._acks_nats if self._acks_nats is not None else self._hot_nats
            await self._acks.start(self._replication_nats, clients.publish)
            self.replicator = self._make_replicator()
            spin_window = self.config.publish.spin_us / 1e6
            if spin_window > 0:
                self.spinner = LoopSpinner(asyncio.get_running_loop(), spin_window)
            self.streams = StreamManager(
                server_id=self.server_id,
                data_dir=self.config.data_dir,
                namespace=self.config.clustering.namespace,
                defaults=self.config.streams,
                batch_max=int(self.config.batch.max_messages),
                ack_sink=self._acks.deliver,
                clock=self._clock,
                file_io=self._file_io,
                segment_files=int(self.config.streams.segment_files_max),
                replicator=self.replicator,
                min_isr_default=self.config.clustering.min_insync_replicas,
                request_pause=self._request_pause,
                resign=self._resign,
                confirm_candidate=self._confirm_candidate,
                cipher=cipher,
                intake_arrived=self.spinner.cool if self.spinner is not None else None,
                leader_lease_ns=self.config.clustering.leader_lease_time * 1_000_000,
            )
            self.streams.defer_leading()  # until _catch_up_with_cluster
            await self.streams.start(
                self._hot_nats, self._internal_nats
            )  # hosts nothing until the metadata service starts, below
            await self.replicator.start(self._replication_nats)
            self._create_metadata()
            self._bind_grpc()  # the port the metadata advertises
            await self._start_metadata()
            await self._await_standalone_registration()
            await self._catch_up_locally()
            await self._catch_up_with_cluster()
            assert self._grpc is not None
            await self._grpc.start(self._grpc_tls.base if self._grpc_tls is not None else None)
            self._start_housekeeping()
        except BaseException:
            await self.stop()
            raise
        self._serving = True
        log.info("liftlog server %s listening on %s (NATS %s)", self.server_id, self.address, self.nats_url)

    async def _publish_for_clients(self, subject: str, payload: bytes) -> None:
        """Publish a client's message on the hot connection; ConnectionError at once while it is down.

        nats-py would buffer it and send it seconds later, after the reconnect: by then its caller has been
        told it timed out (and may retry: a duplicate), and the partition may have a new leader. The lean
        connection refuses such publishes itself.
        """
        nc = self._hot_nats
        if isinstance(nc, nats.aio.client.Client) and (nc.is_reconnecting or not nc.is_connected):
            raise ConnectionError("not connected to NATS (reconnecting)")
        await nc.publish(subject, payload)

    def _check_ack_inbox(self, inbox: str) -> None:
        """Whether this server may publish an ack to ``inbox`` for a client (InvalidStreamError if not): a
        literal subject outside the cluster's own and NATS's (``validate_ack_inbox``), where no stream
        listens (the ack would be stored there, sent with this server's rights)."""
        validate_ack_inbox(inbox, self.config.clustering.namespace)
        if self.streams is None:
            return
        for stream in self.streams.metadata.streams.values():
            for part in stream.partitions.values():
                if subjects_overlap(inbox, part.subject):
                    raise InvalidStreamError(
                        f"invalid ack inbox {inbox!r}: stream {stream.name!r} listens on it ({part.subject!r})"
                    )

    def _open_data_dir(self) -> None:
        data_dir = self.config.data_dir
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            lock = open(data_dir / "LOCK", "a+")  # noqa: SIM115 (held until stop)
        except OSError as exc:
            raise ServerStartError(f"cannot use data directory {data_dir}: {exc}") from exc
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            lock.close()
            raise ServerStartError(
                f"data directory {data_dir} is in use by another liftlog server (pid {holder})"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(str(os.getpid()))
        lock.flush()
        self._lock_file = lock
        self.server_id = self._server_id(data_dir)

    def _server_id(self, data_dir: Path) -> str:
        """The configured id, else the one this data directory was first started with."""
        path = data_dir / "server_id"
        configured = self.config.clustering.server_id
        try:
            kept = path.read_text().strip()
        except FileNotFoundError:
            kept = ""
        if kept and configured and kept != configured:
            # Its streams name the kept id as their leader; another id would orphan them.
            raise ServerStartError(
                f"data directory {data_dir} belongs to server {kept!r}, not {configured!r}: "
                f"start with --id {kept} or use another data directory"
            )
        server_id = kept or configured or secrets.token_hex(8)
        if not kept:
            path.write_text(server_id + "\n")
        return server_id

    def _cluster_auth(self) -> ClusterAuth | None:
        """The signer of server-to-server messages, from the configured secret; None (and a warning) without."""
        c = self.config.clustering
        if c.auth_key:
            key = c.auth_key.strip().encode()
        elif c.auth_key_file:
            path = Path(c.auth_key_file)
            try:
                if c.auth_key_generate and generate_key_file(path):
                    log.warning(
                        "wrote a new cluster secret to %s; servers that join this cluster need a copy of it", path
                    )
                key = load_key(path, check_permissions=self.config.security.key_permissions_check)
            except (KeyFileError, OSError) as exc:
                raise ServerStartError(f"clustering.auth.key.file: {exc}") from exc
        elif c.auth_insecure:
            log.warning(
                "clustering.auth.insecure: NO CLUSTER SECRET. Anyone who can publish on this NATS can act as a "
                "server of this cluster, change its metadata and its data; see docs/security.md"
            )
            return None
        else:
            key = self._default_key()
        return ClusterAuth(
            key, boot=secrets.token_bytes(8), started=self._clock.wall_ns(), max_age=c.auth_max_age * 1_000_000
        )

    def _default_key(self) -> bytes:
        """The secret of a server configured with none: ``<data.dir>/cluster.key``, written when this server
        founds a cluster alone; a server that joins, or founds one with others, must be given the cluster's."""
        path = self.config.data_dir / DEFAULT_KEY_FILE
        peers = self._bootstrap_peers()
        if not path.exists():
            if peers != (self.server_id,):
                what = (
                    f"founds a cluster of {len(peers)} servers (clustering.raft.bootstrap.peers)"
                    if peers
                    else "joins a cluster (no clustering.raft.bootstrap.seed or .peers)"
                )
                raise ServerStartError(
                    f"no cluster secret: this server {what}, and the servers of a cluster share a secret that signs "
                    "their messages. Set clustering.auth.key.file to a copy of the cluster's (a lone server that "
                    f"founded it keeps it as {DEFAULT_KEY_FILE} in its data.dir; `liftlog keygen FILE` makes a new "
                    "one, clustering.auth.key.generate writes it if missing), or clustering.auth.insecure: true to "
                    "run without one. See docs/security.md"
                )
            generate_key_file(path)
            log.warning(
                "wrote a new cluster secret to %s: servers that join this cluster need a copy of it "
                "(clustering.auth.key.file)",
                path,
            )
        try:
            return load_key(path, check_permissions=self.config.security.key_permissions_check)
        except KeyFileError as exc:
            raise ServerStartError(f"the cluster secret in data.dir: {exc}") from exc

    def _batch_cipher(self) -> BatchCipher:
        """The cipher of encrypted streams, with the configured master keys (maybe none)."""
        current, previous = self._master_keys()
        if current is not None:
            log.info(
                "encryption at rest: master key %s encrypts, %d earlier key(s) decrypt",
                current.id.hex(),
                len(previous),
            )
        elif self.config.streams.encryption:
            raise ServerStartError(
                "streams.encryption needs a master key: set LIFTBRIDGE_ENCRYPTION_KEY or encryption.key.file "
                "(`liftlog keygen --master-key FILE` writes one)"
            )
        return BatchCipher(current, previous)

    def _master_keys(self) -> tuple[MasterKey | None, list[MasterKey]]:
        try:
            return load_master_keys(
                self.config.encryption.key_file,
                self.config.encryption.previous_key_files,
                check_permissions=self.config.security.key_permissions_check,
            )
        except MasterKeyError as exc:
            raise ServerStartError(str(exc)) from exc

    @property
    def rpc_server(self) -> RpcServer | None:
        """The gRPC server, once bound."""
        return self._grpc

    @property
    def signs_internal_messages(self) -> bool:
        """Whether this server signs and checks its server-to-server messages (a cluster secret)."""
        return self._auth_state()[0]

    def _auth_state(self) -> tuple[bool, dict[str, int]]:
        """Whether server-to-server messages are signed here, and the internal messages dropped by reason."""
        nc = getattr(self, "_internal_nats", None)
        if isinstance(nc, AuthenticatedNats):
            dropped = collections.Counter(nc.dropped)
            replication = getattr(self, "_replication_nats", None)
            if isinstance(replication, AuthenticatedNats) and replication is not nc:
                dropped.update(replication.dropped)
            return True, dict(dropped)
        return False, {}

    def _replication_connection(self, auth: ClusterAuth | None) -> NatsClient:
        """Fetches, their answers and acks ride the lean connection when there is one: they are most of the
        traffic between servers, and nats-py's tasks and queues cost the followers, the leader and a server
        waiting for another's acks CPU per message (and, for the acks, a loop turn or two of latency)."""
        if self._lean is None:
            return self._internal_nats
        client = LeanNatsClient(self._lean)
        if auth is None:
            return client
        return AuthenticatedNats(client, auth, internal_subjects(self.config.clustering.namespace), self._clock)

    def _authenticated(self, auth: ClusterAuth) -> AuthenticatedNats:
        namespace = self.config.clustering.namespace
        return AuthenticatedNats(self._connected_nats, auth, internal_subjects(namespace), self._clock)

    async def _start_nats(self) -> None:
        cfg = self.config.nats
        servers = list(cfg.servers)
        if cfg.embedded:
            self._embedded = EmbeddedNats(
                EmbeddedNatsConfig(
                    host=cfg.embedded_host,
                    port=cfg.embedded_port,
                    config_file=Path(cfg.embedded_config) if cfg.embedded_config else None,
                    server_name=f"liftlog-{self.server_id}",
                )
            )
            try:
                await self._embedded.start()
            except EmbeddedNatsError as exc:
                raise ServerStartError(f"cannot start the embedded nats-server: {exc}") from exc
            servers = [self._embedded.url]
        if not servers:
            servers = ["nats://127.0.0.1:4222"]
        self.nats_url = ",".join(servers)
        options: dict[str, Any] = {
            "servers": servers,
            "name": f"liftlog-{self.server_id}",
            "connect_timeout": 5,
            # A few tries at start-up so a wrong URL fails with a clear error; forever once connected.
            "max_reconnect_attempts": 4,
            "reconnect_time_wait": 0.5,
            # Large write buffer: publishes and acks are flushed in big chunks.
            "pending_size": 32 << 20,
            "flusher_queue_size": 4096,
            "error_cb": self._on_nats_error,
            "disconnected_cb": self._on_nats_disconnected,
            "reconnected_cb": self._on_nats_reconnected,
        }
        if cfg.user:
            options["user"] = cfg.user
            options["password"] = cfg.password
        if cfg.token:
            options["token"] = cfg.token
        if cfg.nkey_seed:
            options["nkeys_seed"] = cfg.nkey_seed
        if cfg.credentials:
            options["user_credentials"] = cfg.credentials
        if cfg.tls_ca or cfg.tls_cert:
            context = ssl.create_default_context(cafile=cfg.tls_ca or None)
            if cfg.tls_cert:
                context.load_cert_chain(cfg.tls_cert, cfg.tls_key or None)
            options["tls"] = context
        try:
            self._nc = await nats.connect(**options)
        except Exception as exc:
            raise ServerStartError(f"cannot connect to NATS at {self.nats_url}: {exc or type(exc).__name__}") from exc
        self._nc.options["max_reconnect_attempts"] = -1
        if cfg.lean_connection:
            await self._start_lean_nats(servers, options.get("tls"))
        if cfg.acks_connection:
            await self._start_acks_nats(servers, options.get("tls"))

    async def _start_acks_nats(self, servers: list[str], tls: ssl.SSLContext | None) -> None:
        """The connection acks to clients' inboxes go out on, as the NATS user nats.acks.* names."""
        cfg = self.config.nats
        try:
            acks = LeanNats(
                servers,
                name=f"liftlog-{self.server_id}-acks",
                tls=tls,
                **cfg.identity(acks=True),
                on_error=self._on_acks_nats_error,
            )
        except ValueError as exc:
            raise ServerStartError(f"nats.acks.*: cannot open the acks connection: {exc}") from exc
        try:
            await acks.connect()
        except NatsConnectError as exc:
            raise ServerStartError(f"cannot connect to NATS at {self.nats_url} as nats.acks.user: {exc}") from exc
        self._acks_nats = acks

    def _on_acks_nats_error(self, text: str) -> None:
        # NATS refusing an ack's subject (a permissions violation) is the point of this connection: counted.
        if self._acks is not None:
            self._acks.refused_by_nats(text)

    async def _start_lean_nats(self, servers: list[str], tls: ssl.SSLContext | None) -> None:
        cfg = self.config.nats
        try:
            lean = LeanNats(
                servers,
                on_disconnected=self._nats_lost,
                on_reconnected=self._on_lean_reconnected,
                name=f"liftlog-{self.server_id}-intake",
                tls=tls,
                **cfg.identity(),
            )
        except ValueError as exc:  # e.g. a ws:// URL: nats-py carries the hot path too
            log.info("no lean NATS connection (%s): intake and publishes use nats-py's", exc)
            return
        try:
            await lean.connect()
        except NatsConnectError as exc:
            raise ServerStartError(f"cannot connect to NATS at {self.nats_url}: {exc}") from exc
        self._lean = lean

    def _bootstrap_peers(self) -> tuple[str, ...]:
        c = self.config.clustering
        if c.raft_bootstrap_peers:
            if self.server_id not in c.raft_bootstrap_peers:
                raise ServerStartError(
                    f"clustering.raft.bootstrap.peers ({', '.join(c.raft_bootstrap_peers)}) "
                    f"must include this server's id {self.server_id!r}"
                )
            return tuple(c.raft_bootstrap_peers)
        if c.raft_bootstrap_seed or (self.config.nats.embedded and not c.raft_bootstrap_seed):
            return (self.server_id,)
        return ()

    def _make_replicator(self) -> Replicator:
        c = self.config.clustering
        return Replicator(
            server_id=self.server_id,
            namespace=c.namespace,
            settings=ReplicatorSettings(
                max_lag_ns=c.replica_max_lag_time * 1_000_000,
                max_lag_messages=c.replica_max_lag_messages,
                idle_wait_s=c.replica_max_idle_wait / 1000,
                fetch_timeout_s=c.replica_fetch_timeout / 1000,
                fetch_wait_s=c.replica_fetch_wait / 1000,
                leader_timeout_ns=c.replica_max_leader_timeout * 1_000_000,
                max_bytes=c.replication_max_bytes,
                reassignment_rate=c.reassignment_max_rate,
            ),
            propose_isr=self._propose_isr,
            report_leader=self._report_leader,
            clock=self._clock,
        )

    async def _request_pause(self, name: str, partitions: tuple[int, ...]) -> None:
        """Auto-pause: have the controller pause these partitions (once the metadata service runs)."""
        if self.cluster is not None:
            await self.cluster.pause(name, partitions)

    async def _propose_isr(self, part: Partition, change: IsrChange) -> None:
        # On failure (a newer epoch, no controller) the leader proposes again later.
        await self._tell_controller(part, change, f"ISR change to {','.join(change.isr)} not applied")

    async def _confirm_candidate(self, part: Partition) -> None:
        confirmation = LeaderConfirmation(part.stream, part.id, self.server_id)
        # On failure (too late, no controller) the election moves on without us.
        await self._tell_controller(part, confirmation, "confirming leadership failed")

    async def _report_leader(self, part: Partition, report: ReportLeader) -> None:
        silent = LeaderReport(part.stream, part.id, self.server_id, report.leader, part.meta.epoch, report.leader_epoch)
        await self._tell_controller(part, silent, f"reporting leader {report.leader} failed")

    async def _resign(self, part: Partition, reason: str) -> None:
        meta = part.meta
        if meta.leader != self.server_id or len(meta.isr) < 2:
            return  # nobody in sync to hand over to: lead on, refusing publishes, until the log repairs
        fenced = LeaderReport(
            part.stream, part.id, self.server_id, self.server_id, meta.epoch, meta.leader_epoch, fenced=reason
        )
        await self._tell_controller(part, fenced, "handing leadership over from a fenced log")

    async def _tell_controller(self, part: Partition, change: ControlRequest, failed: str) -> None:
        """Send a replica's request to the controller; a failure is only logged (each caller retries its way)."""
        if self.cluster is None:
            return
        try:
            await self.cluster.request(change)
        except Exception as exc:
            log.info("%s: %s: %s", part, failed, exc)

    def _fail(self, exc: BaseException) -> None:
        self.failure = f"the metadata Raft group stopped on this server: {exc}"
        self.failed.set()

    def _create_metadata(self) -> None:
        assert self.streams is not None and self._acks is not None
        c = self.config.clustering
        tick = max(c.raft_heartbeat_interval, 1) / 1000
        self.cluster = MetadataService(
            server_id=self.server_id,
            advertise=ServerMeta(self.server_id, self.config.host, self.config.port, c.rack),  # port set at start
            raft_dir=self.config.data_dir / "raft" / "metadata",
            namespace=c.namespace,
            raft_settings=RaftSettings(
                tick_seconds=tick,
                election_ticks=max(2, round(c.raft_election_timeout / max(c.raft_heartbeat_interval, 1))),
                snapshot_threshold=c.raft_snapshot_threshold,
                snapshot_retain=c.raft_snapshot_retain,
                fsync=c.raft_fsync,
            ),
            bootstrap_peers=self._bootstrap_peers(),
            streams=self.streams,
            heartbeat_interval=c.server_heartbeat_interval / 1000,
            liveness_timeout=c.server_liveness_timeout / 1000,
            clock=self._clock,
            on_failure=self._fail,
            unclean_leader_election=c.unclean_leader_election,
            rebalance_delay=c.leader_rebalance_delay / 1000,
            limits=self.config.stream_limits(),
            internal_streams=self._internal_streams(),
            group_coordinator_timeout=self.config.groups.coordinator_timeout / 1000,
            activity=ActivityWiring(
                ActivitySettings(
                    enabled=bool(self.config.activity.enabled),
                    timeout=self.config.activity.publish_timeout / 1000,
                    ack_policy=_ACK_POLICIES[self.config.activity.publish_ack_policy],
                ),
                self._internal_nats,
                self._acks,
            ),
        )

    def _internal_streams(self) -> tuple[CreateStreamRequest, ...]:
        """The servers' own streams this configuration asks for: ``__activity`` and ``__cursors`` when on."""
        namespace = self.config.clustering.namespace
        wanted: list[CreateStreamRequest] = []
        if self.config.activity.enabled:
            wanted.append(
                CreateStreamRequest(
                    ACTIVITY_STREAM,
                    internal_stream_subject(ACTIVITY_STREAM, namespace),
                    replication_factor=-1,
                    settings=StreamSettings(auto_pause_time_ms=0),  # never idle-paused: events must flow
                )
            )
        partitions = int(self.config.cursors.partitions)
        if partitions <= 0:
            return tuple(wanted)
        # Compacted (a cursor's newest value is all that matters) and never cut by retention: a cursor
        # nobody moved for a week is still a checkpoint someone resumes from.
        settings = StreamSettings(
            compact_enabled=True,
            auto_pause_time_ms=int(self.config.cursors.auto_pause_time),
            auto_pause_disable_if_subscribers=True,
            retention_max_bytes=0,
            retention_max_messages=0,
            retention_max_age_ms=0,
            encryption=False,
        )
        wanted.append(
            CreateStreamRequest(
                CURSORS_STREAM,
                internal_stream_subject(CURSORS_STREAM, namespace),
                partitions=partitions,
                replication_factor=int(self.config.cursors.replication_factor),
                settings=settings,
            )
        )
        return tuple(wanted)

    async def _start_metadata(self) -> None:
        assert self.cluster is not None
        c = self.config.clustering
        self.cluster.advertise = ServerMeta(self.server_id, self.config.host, self.port, c.rack)
        try:
            await self.cluster.start(self._internal_nats)
        except (RaftStorageError, StorageError, OSError, ValueError) as exc:
            raise ServerStartError(f"cannot open the metadata log in {self.config.data_dir / 'raft'}: {exc}") from exc

    async def _await_standalone_registration(self) -> None:
        """A server that is the whole metadata group serves once its address is in the metadata."""
        cluster = self.cluster
        assert cluster is not None
        if cluster.voters != (self.server_id,):
            return
        try:
            await asyncio.wait_for(cluster.registered.wait(), 10)
        except TimeoutError:
            raise ServerStartError("the metadata group did not accept this server within 10 s") from None
        await self._import_legacy_metadata()

    async def _import_legacy_metadata(self) -> None:
        """Streams of a pre-Raft standalone data directory (``metadata.json``) move into the Raft log once."""
        path = self.config.data_dir / "metadata.json"
        if not path.exists() or self.cluster is None:
            return
        try:
            legacy = MetadataFile(path).load()
        except CorruptMetadataError as exc:
            raise ServerStartError(str(exc)) from exc
        for stream in legacy.streams.values():
            if stream.name not in self.cluster.metadata.streams:
                await self.cluster.raft.propose(encode_operation(CreateStream(stream)))
        path.rename(path.with_suffix(".json.imported"))
        log.info("imported %d streams from %s into the metadata log", len(legacy.streams), path)

    async def _on_nats_error(self, exc: Exception) -> None:
        if isinstance(exc, nats.errors.SlowConsumerError):
            self.nats_slow_consumer_drops += 1
        _warn.warning("NATS: %s", exc or type(exc).__name__, key=f"nats:{type(exc).__name__}")

    async def _on_nats_disconnected(self) -> None:
        if not self._stopping:
            log.warning("disconnected from NATS; reconnecting")
        await self._nats_lost()

    async def _on_nats_reconnected(self) -> None:
        url = self._nc.connected_url if self._nc is not None else None
        log.info("reconnected to NATS at %s", url.netloc if url is not None else "?")
        self._nats_back()

    async def _on_lean_reconnected(self) -> None:
        self._nats_back()

    async def _nats_lost(self) -> None:
        """A NATS connection dropped: what this server missed meanwhile may include the loss of its
        leaderships. Partitions led here stop taking writes until the metadata is proven current."""
        self._nats_outages += 1
        if self._stopping or self.streams is None or not self.streams.may_lead:
            return  # not leading yet (starting): the start's barrier decides
        led = sum(1 for p in self.streams.partitions.values() if p.leader is not None)
        if led:
            log.warning(
                "NATS connection lost: the %d partition(s) led here take no writes until the metadata is current", led
            )
        await self.streams.suspend_leading()

    def _nats_back(self) -> None:
        """A NATS connection is back: once every one is, prove the metadata current, then lead again."""
        if self._stopping or self.streams is None or self.streams.may_lead:
            return
        # Not before the start's own barrier began (it runs after the local catch-up), nor twice at once.
        if self._confirming is not None and self._confirming.done():
            self._confirming = asyncio.get_running_loop().create_task(self._lead_when_current(), name="catch-up")
            self._tasks.append(self._confirming)

    # -- operations: metrics and health -------------------------------------

    async def _start_ops_endpoint(self) -> None:
        self._loop_lag.start()
        listen = self.config.metrics.listen
        if not listen:
            return
        collector = ServerCollector(self, self._loop_lag, int(self.config.metrics.partitions_max), clock=self._clock)
        self._ops = OpsEndpoint(listen, new_registry(collector), self.health, self.readiness)
        try:
            await self._ops.start()
        except OSError as exc:
            self._ops = None
            raise ServerStartError(f"metrics.listen: cannot listen on {listen}: {exc}") from exc
        log.info("metrics and health on http://%s/metrics (/healthz, /readyz)", self._ops.address)

    def health(self) -> Check:
        """Alive: the loop answers (this very call runs on it) and no part the server needs has failed."""
        details: dict[str, object] = {
            "server_id": self.server_id,
            "event_loop_lag_seconds": round(self._loop_lag.lag, 6),
        }
        if self.failure:
            details["failure"] = self.failure
        return Check(not self.failure, details)

    def readiness(self) -> Check:
        """Ready for clients: started, NATS connected, metadata caught up, every hosted partition open."""
        problems: list[str] = []
        if not self._serving:
            problems.append("stopping" if self._stopping else "starting")
        if self._nc is None or not self._nc.is_connected or (self._lean is not None and not self._lean.is_connected):
            problems.append("not connected to NATS")
        cluster, streams = self.cluster, self.streams
        node = cluster.raft.node if cluster is not None else None
        if cluster is None or node is None:
            problems.append("no metadata service")
        else:
            if cluster.leader_id is None:
                problems.append("no metadata leader known")
            if node.applied_index < node.commit_index:
                problems.append(f"metadata applied to {node.applied_index} of {node.commit_index} committed")
        if cluster is not None and streams is not None:
            closed = []
            for stream in cluster.metadata.streams.values():
                for p in stream.partitions.values():
                    if self.server_id not in p.replicas or p.paused:
                        continue
                    part = streams.partitions.get((stream.name, p.id))
                    if part is None or part.log is None:
                        closed.append(f"{stream.name}/{p.id} not open")
                    elif part.fenced is not None:
                        closed.append(f"{stream.name}/{p.id} fenced")
            if closed:
                problems.append(f"{len(closed)} hosted partition(s) not open: {', '.join(closed[:10])}")
        return Check(not problems, {"server_id": self.server_id, "problems": problems})

    async def _catch_up_locally(self) -> None:
        """Serve only once the metadata this server had committed is replayed and its partitions reopened."""
        assert self.cluster is not None and self.streams is not None and self.cluster.raft.node is not None
        commit = self.cluster.raft.node.commit_index
        if not await self.streams.wait_reconciled(commit, 60, leading=False):
            raise ServerStartError(f"replaying the metadata log to index {commit} took more than 60 s")

    async def _catch_up_with_cluster(self) -> None:
        """Lead partitions only by current metadata: a restarted leader may have been replaced meanwhile.

        A read-index barrier proves this server has applied everything the
        group committed before it asked. Alone in the group that is immediate;
        otherwise it is retried in the background until a leader answers.
        """
        cluster = self.cluster
        assert cluster is not None
        self._confirming = asyncio.get_running_loop().create_task(self._lead_when_current(), name="catch-up")
        self._tasks.append(self._confirming)
        self._tasks.append(asyncio.get_running_loop().create_task(self._keep_lease(), name="leader-lease"))
        if cluster.voters == (self.server_id,):
            await self._confirming

    def _nats_connected(self) -> bool:
        return (self._nc is None or self._nc.is_connected) and (self._lean is None or self._lean.is_connected)

    async def _lead_when_current(self) -> None:
        """Wait for a read-index barrier begun with every NATS connection up and none lost since, then lead."""
        cluster, streams = self.cluster, self.streams
        assert cluster is not None and streams is not None
        # A request the metadata leader never got (NATS just came back, or the leader is still deaf) is
        # retried soon: the partitions led here take no writes meanwhile. Slower answers get longer.
        timeout = 1.0
        while not self._stopping:
            outages = self._nats_outages
            if not self._nats_connected():
                await asyncio.sleep(0.1)
                continue
            asked_at = self._clock.monotonic_ns()
            try:
                index = await cluster.raft.read_barrier(timeout=timeout)
            except (NotLeader, ProposalDropped, TimeoutError) as exc:
                log.debug("waiting for the metadata leader before leading partitions: %s", exc)
                timeout = min(timeout * 2, 5.0)
                await asyncio.sleep(0.2)
                continue
            if outages != self._nats_outages or not self._nats_connected():
                continue  # a connection dropped meanwhile: what it missed may postdate the barrier
            log.info("metadata current at index %d: taking up partition leaderships", index)
            streams.allow_leading()
            # The barrier is lease evidence too: leaders need not wait for the next renewal to acknowledge.
            await self._lease_renewed_by(asked_at, index, outages, timeout)
            return

    async def _keep_lease(self) -> None:
        """Renew the leader lease (clustering.leader.lease.time) three times per lease.

        The evidence is a metadata read-index barrier, sent at ``asked_at`` (monotonic) and acted on: its
        answer means a metadata leader confirmed its term with a quorum after we asked, and counted the
        request as a sign of life (``MetadataService._on_read_request``), so it cannot declare us dead before
        ``asked_at`` + the liveness timeout; applying and acting on everything up to its index means no
        ChangeLeader committed before we asked is still unknown here. See ``LeaderReplica``'s rules.
        """
        cluster, streams = self.cluster, self.streams
        assert cluster is not None and streams is not None
        if streams.lease_ns is None:
            return
        period = streams.lease_ns / 3e9
        loop = asyncio.get_running_loop()
        while not self._stopping:
            began = loop.time()
            streams.check_lease()
            if streams.may_lead and self._nats_connected():
                outages = self._nats_outages
                asked_at = self._clock.monotonic_ns()
                try:
                    index = await cluster.raft.read_barrier(timeout=2 * period)
                except (NotLeader, ProposalDropped, TimeoutError) as exc:
                    log.debug("renewing the leader lease: %s", exc)
                else:
                    await self._lease_renewed_by(asked_at, index, outages, 2 * period)
            await asyncio.sleep(max(period - (loop.time() - began), 0.01))

    async def _lease_renewed_by(self, asked_at: int, index: int, outages: int, timeout: float) -> None:
        """Renew the lease with a barrier sent at ``asked_at`` that returned ``index``, once acted on."""
        streams = self.streams
        assert streams is not None
        if not await streams.wait_reconciled(index, timeout, leading=False):
            return
        if outages == self._nats_outages and streams.may_lead and self._nats_connected():
            streams.renew_lease(asked_at)

    def _max_request_bytes(self) -> int:
        """The largest gRPC request worth reading: a message (streams.max.message.bytes) or a batch (one NATS
        message), with room for keys, headers and framing; never more than a gRPC message can be here."""
        configured = int(self.config.rpc.max_message_bytes)
        if configured:
            return min(configured, GRPC_MAX_MESSAGE_BYTES)
        largest = max(self.config.streams.max_message_bytes, int(self._hot_nats.max_payload))
        return min(largest + REQUEST_FRAMING_BYTES, GRPC_MAX_MESSAGE_BYTES)

    def _bind_grpc(self) -> None:
        assert self.streams is not None and self._acks is not None and self.cluster is not None
        bind_host = self.config.bind_host or self.config.host
        bind_port = self.config.bind_port if self.config.bind_host else self.config.port
        address = f"{bind_host}:{bind_port}"
        options = ServerOptions(
            limits=ConnectionLimits(
                max_message_bytes=self._max_request_bytes(),
                max_message_hint=(
                    f": messages are stored up to streams.max.message.bytes ({self.config.streams.max_message_bytes}"
                    " bytes) and batches up to the NATS max payload; rpc.max.message.bytes sets this limit"
                ),
            ),
            idle_timeout=self.config.rpc.idle_timeout / 1000,
            max_connections=self.config.rpc.max_connections,
            max_buffered_bytes=self.config.rpc.max_buffered_bytes,
            abuse_cooldown=self.config.rpc.abuse_cooldown / 1000,
        )
        server = RpcServer((), options)
        try:
            port = server.bind(bind_host, bind_port)
        except OSError as exc:
            raise ServerStartError(f"cannot listen on {address}: {exc} (is another server using the port?)") from exc
        self._grpc = server
        self.access = AccessControl(self._authorizer())
        self.port = port
        publisher, reads, service = self._api_services()
        guard = self.access.guard
        server.add_methods(guard(service_methods(api_pb2.DESCRIPTOR.services_by_name["API"], service)))
        server.add_methods(
            guard(service_methods(batches_pb2.DESCRIPTOR.services_by_name["Batches"], BatchesService(publisher, reads)))
        )
        server.add_methods(
            guard(
                service_methods(
                    cluster_pb2.DESCRIPTOR.services_by_name["Cluster"],
                    ClusterService(self.cluster, self.streams, self.access, self._auth_state),
                )
            )
        )

    def _api_services(self) -> tuple[Publisher, PartitionReads, ApiService]:
        """The API service and the collaborators it and the Batches service share (the composition root)."""
        assert self.streams is not None and self._acks is not None and self.cluster is not None
        reads = PartitionReads(server_id=self.server_id, streams=self.streams, cluster=self.cluster)
        publisher = Publisher(
            server_id=self.server_id,
            streams=self.streams,
            cluster=self.cluster,
            reads=reads,
            acks=self._acks,
            publish=self._publish_for_clients,
            ack_timeout=DEFAULT_ACK_TIMEOUT_S,
            max_message_bytes=self.config.streams.max_message_bytes,
            keep_hot=self.spinner.keep_hot if self.spinner is not None else None,
            send_publishes=self._lean.send_now if self._lean is not None else None,
            nats_max_payload=lambda: int(self._hot_nats.max_payload),
        )
        groups = GroupService(
            server_id=self.server_id,
            streams=self.streams,
            cluster=self.cluster,
            consumer_timeout=self.config.groups.consumer_timeout / 1000,
            coordinator_timeout=self.config.groups.coordinator_timeout / 1000,
            clock=self._clock,
        )
        cursors = CursorService(
            server_id=self.server_id,
            streams=self.streams,
            cluster=self.cluster,
            publisher=publisher,
            reads=reads,
            enabled=int(self.config.cursors.partitions) > 0,
        )
        service = ApiService(
            server_id=self.server_id,
            streams=self.streams,
            cluster=self.cluster,
            publisher=publisher,
            reads=reads,
            cursors=cursors,
            groups=groups,
            limits=ApiLimits(
                fetch_max_messages=self.config.subscribe.fetch_max_messages,
                buffer_max_bytes=self.config.subscribe.buffer_max_bytes,
                max_subscriptions=self.config.subscribe.max_concurrent,
                max_subscriptions_per_connection=self.config.subscribe.max_concurrent_per_connection,
                max_publish_inflight=self.config.publish.async_max_inflight,
                coalesce_publishes=self.config.publish.async_coalesce,
            ),
            access=self.access,
        )
        self._tasks.append(asyncio.get_running_loop().create_task(groups.run(), name="group-expiry"))
        return publisher, reads, service

    def _authorizer(self) -> Authorizer | None:
        """The policy decisions of ``tls.client.authz.*``: from its files, else from the metadata."""
        if not self.config.tls.client_authz_enabled:
            return None
        model, policy = self.config.tls.client_authz_model, self.config.tls.client_authz_policy
        if model:
            try:
                return Authorizer.from_files(model, policy)
            except Exception as exc:  # casbin raises what its parsers raise
                raise ServerStartError(f"cannot load tls.client.authz.model {model} / .policy {policy}: {exc}") from exc
        authorizer = Authorizer()
        cluster = self.cluster
        assert cluster is not None, "the metadata service is made before the API"
        cluster.policies_changed = lambda policies: authorizer.set_policies(
            (p.subject, p.resource, p.action) for p in policies
        )
        cluster.policies_changed(tuple(cluster.metadata.policies))
        return authorizer

    def reload(self) -> None:
        """SIGHUP: read the authorization policy file, the TLS files and the encryption key files again."""
        authorizer = self.access.authorizer if self.access is not None else None
        if authorizer is not None and self.config.tls.client_authz_policy:
            try:
                authorizer.reload_files()
                log.info("reloaded the authorization policies from %s", self.config.tls.client_authz_policy)
            except Exception as exc:
                log.warning("cannot reload the authorization policies (keeping the previous ones): %s", exc)
        if self._grpc_tls is not None:
            self._grpc_tls.reload_if_changed()
        if self.streams is not None:
            try:
                current, previous = self._master_keys()
            except ServerStartError as exc:
                log.warning("cannot reload the encryption master keys (keeping the previous ones): %s", exc)
            else:
                if current is None and self.streams.cipher.can_encrypt:
                    log.warning("the encryption master key is gone from the configuration: keeping the previous one")
                else:
                    outgoing = self.streams.cipher.current
                    if outgoing is not None and (current is None or outgoing.id != current.id):
                        # What the outgoing key encrypted stays readable until a restart drops it.
                        previous = [*previous, outgoing]
                    self.streams.cipher.set_keys(current, previous)
                    log.info("encryption master keys reloaded: %s", ", ".join(self.streams.cipher.key_ids) or "none")

    def _tls_context(self) -> ReloadingTls | None:
        """The API's TLS settings (``tls.*``): server certificate, and client certificates if asked for."""
        if not (self.config.tls.cert and self.config.tls.key):
            return None
        files = TlsFiles(
            self.config.tls.cert,
            self.config.tls.key,
            self.config.tls.client_auth_ca,
            self.config.tls.client_auth_enabled,
        )
        named = [("tls.cert", self.config.tls.cert), ("tls.key", self.config.tls.key)]
        if self.config.tls.client_auth_enabled:
            named.append(("tls.client.auth.ca", self.config.tls.client_auth_ca))
        for key, path in named:  # the ssl module's own error would not say which file
            if not Path(path).is_file():
                raise ServerStartError(f"cannot load the API's TLS certificate or key: {key}: {path} does not exist")
        try:
            return ReloadingTls(files)
        except (OSError, ssl.SSLError) as exc:
            raise ServerStartError(f"cannot load the API's TLS certificate or key: {exc}") from exc

    def _start_housekeeping(self) -> None:
        assert self.streams is not None
        streams = self.streams
        loop = asyncio.get_running_loop()
        self._tasks += [
            loop.create_task(self._every(1.0, streams.auto_pause), name="auto-pause"),
            # Each partition has its own cleaner interval (streams.cleaner.interval or the stream's).
            loop.create_task(self._every(1.0, streams.clean), name="cleaner"),
        ]
        replicator = self.replicator
        if replicator is not None:

            async def judge_followers() -> None:
                replicator.tick()

            self._tasks.append(loop.create_task(self._every(1.0, judge_followers), name="isr"))

        async def checkpoint() -> None:
            streams.checkpoint_high_watermarks()
            streams.repair_fenced()

        tls = self._grpc_tls
        reload_every = self.config.tls.reload_interval / 1000
        if tls is not None and reload_every > 0:

            async def reload_tls() -> None:
                tls.reload_if_changed()

            self._tasks.append(loop.create_task(self._every(reload_every, reload_tls), name="tls-reload"))

        # A restart after a crash resumes from this, not from -1 (seed 000: followers checkpoint the HW).
        self._tasks.append(loop.create_task(self._every(5.0, checkpoint), name="hw-checkpoint"))
        if self.config.streams.fsync_policy == "interval":
            interval = max(self.config.streams.fsync_interval / 1000, 0.01)

            async def flush() -> None:
                streams.flush_due()

            self._tasks.append(loop.create_task(self._every(interval, flush), name="fsync"))

    @staticmethod
    async def _every(seconds: float, job: Callable[[], Awaitable[object]]) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await job()
            except Exception:
                log.exception("background job %s failed", getattr(job, "__name__", job))

    # -- stop ------------------------------------------------------------

    async def stop(self, grace: float = 2.0) -> None:
        """Stop serving, write everything received, close logs, NATS and nats-server. Idempotent."""
        self._stopping = True
        self._serving = False
        for task in self._tasks:
            task.cancel()
        self._tasks = []
        # Refuse new RPCs at once; in-flight publishes get their acks while the partitions drain,
        # and followers end when their partition closes.
        grpc_stopped = asyncio.ensure_future(self._grpc.stop(grace)) if self._grpc is not None else None
        self._grpc = None
        if self.cluster is not None:
            await self.cluster.stop()
            self.cluster = None
        if self.replicator is not None:
            await self.replicator.stop()
            self.replicator = None
        if self.streams is not None:
            await self.streams.stop()
            self.streams = None
        if grpc_stopped is not None:
            await grpc_stopped
        if self._acks is not None:
            await self._acks.stop()
            self._acks = None
        if self._lean is not None:
            with contextlib.suppress(Exception):
                await self._lean.close()
            self._lean = None
        if self._acks_nats is not None:
            with contextlib.suppress(Exception):
                await self._acks_nats.close()
            self._acks_nats = None
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.drain()
            with contextlib.suppress(Exception):
                await self._nc.close()
            self._nc = None
        if self._embedded is not None:
            await self._embedded.stop()
            self._embedded = None
        await self._loop_lag.stop()
        if self._ops is not None:
            await self._ops.stop()
            self._ops = None
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None
