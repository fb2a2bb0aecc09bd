"""Three ``liftlog server`` processes, each reaching the shared nats-server through its own ``TcpProxy``.

Each server runs through ``tests/chaos/faulty_server.py``: the production server with a ``FaultyFileIO``
and an adjustable clock, steered through a control file per server. A ``ChaosCluster`` can crash (kill -9),
restart, freeze (SIGSTOP) and thaw any server, cut, blackhole, slow or half-cut (one direction) one server's
NATS link while its process keeps running, fail a share of its disk operations, cut its files back to what
was fsynced (power loss), jump its clock, and kill and restart the nats-server itself. Every server is
started with short replication timeouts so ISR changes and failovers happen within a few seconds.
``close()`` (or leaving the ``with`` block) resumes, kills and stops everything, whatever state a failed
test left it in.

Leaders and ISRs are read from the freshest metadata any reachable server has (the highest Raft applied
index), so a server that is cut off and still believes in an old layout does not mislead the workload.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import grpc

from liftlog.api import api_pb2, api_pb2_grpc, cluster_pb2, cluster_pb2_grpc
from liftlog.security.cluster_auth import generate_key_file
from liftlog.server.nats.embedded_nats import find_nats_server_binary
from liftlog.storage.faults import power_loss_from_journal
from tests.integration.harness import LiftlogProcess, NatsProcess, eventually, wait_for_port

from .faults import DISK_PROFILES, Fault, FaultEvent, kill9, pause, resume
from .faulty_server import Control, read_status, write_control
from .proxy import TcpProxy

__all__ = [
    "IDS",
    "SETTINGS",
    "ChaosCluster",
    "FaultyServerProcess",
    "PartitionView",
    "channel_options",
    "restart_nats",
    "stop_nats",
]

IDS = ("a", "b", "c")

#: Short replication and liveness timeouts: ISR shrinks, failovers and rejoins happen within seconds.
SETTINGS = (
    "--set",
    "clustering.replica.max.lag.time=2s",
    "--set",
    "clustering.replica.max.idle.wait=500ms",
    "--set",
    "clustering.server.liveness.timeout=2s",
    "--set",
    "clustering.replica.max.leader.timeout=3s",
)


_namespaces = itertools.count()
WRAPPER = Path(__file__).with_name("faulty_server.py")


class FaultyServerProcess(LiftlogProcess):
    """``liftlog server`` with the same options, run through the wrapper: a failing disk and a movable clock."""

    def __init__(self, data_dir: Path, *args: str, **kwargs: str | None) -> None:
        super().__init__(data_dir, *args, **kwargs)  # type: ignore[arg-type, unused-ignore]
        self.control = data_dir.parent / f"{data_dir.name}.control.json"
        #: Fsynced lengths of the data files, outside the data directory (it is not the server's).
        self.journal = data_dir.parent / f"{data_dir.name}.fsync-journal"
        self.wanted = Control()
        #: Failures injected by earlier lives of the process (the status file restarts at 0).
        self.injected_before = 0
        write_control(self.control, self.wanted)

    def command(self) -> list[str]:
        cmd = super().command()
        assert cmd[1:4] == ["-m", "liftlog.cli.main", "server"], cmd
        ours = ["--control", str(self.control), "--journal", str(self.journal)]
        return [sys.executable, str(WRAPPER), *ours, *cmd[4:]]

    def steer(self, **changes: object) -> None:
        """Change the control file (rates, errors, clock_offset_ms); the process follows within ~0.1 s."""
        for key, value in changes.items():
            setattr(self.wanted, key, value)
        write_control(self.control, self.wanted)

    def injected(self) -> int:
        """Disk failures injected so far, over every life of this server."""
        return self.injected_before + int(read_status(self.control).get("injected", 0))

    def forget_status(self) -> None:
        """Before a restart: keep the count, drop the dead process's status."""
        self.injected_before = self.injected()
        Path(str(self.control) + ".status").unlink(missing_ok=True)


def stop_nats(nats: NatsProcess) -> None:
    """kill -9 the nats-server: every client connection drops at once."""
    kill9(nats.proc)


def restart_nats(nats: NatsProcess, timeout: float = 10.0) -> None:
    """Start the nats-server again on the same port (and log)."""
    if nats.proc.poll() is None:
        return
    deadline = time.monotonic() + timeout
    while True:
        nats.proc = subprocess.Popen(
            [str(find_nats_server_binary()), "-a", "127.0.0.1", "-p", str(nats.port)],
            stdout=nats._log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for_port(nats.port, 3.0)
            return
        except TimeoutError:
            kill9(nats.proc)
            if time.monotonic() > deadline:
                raise


def channel_options() -> list[tuple[str, int]]:
    """gRPC channel options for servers that die and come back on the same port: reconnect within ~0.5 s."""
    return [
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 500),
    ]


@dataclass(frozen=True)
class PartitionView:
    """One partition as one server's metadata has it, with that server's own replica offsets."""

    leader: str
    replicas: tuple[str, ...]
    isr: tuple[str, ...]
    high_watermark: int
    newest_offset: int


class ChaosCluster:
    """Servers ``a``, ``b`` and ``c`` founded together (``--raft-bootstrap-peers a,b,c``), one proxy each."""

    def __init__(self, root: Path, nats: NatsProcess, *extra: str, ids: tuple[str, ...] = IDS) -> None:
        self.root = root
        self.nats = nats
        self.ids = ids
        self.namespace = f"chaos-{next(_namespaces)}-{int(time.time() * 1000) % 1_000_000}"
        self.proxies: dict[str, TcpProxy] = {}
        self.servers: dict[str, FaultyServerProcess] = {}
        self.paused: set[str] = set()
        self.faulted: set[str] = set()  # cut, blackholed or delayed links
        #: Server -> times (monotonic) it was killed or lost power: a LEADER ack it gave before may be lost.
        self.crashes: dict[str, list[float]] = {sid: [] for sid in ids}
        #: What was done, for the report: fault kind -> count.
        self.injected: dict[str, int] = {}
        #: Bytes cut from data files by power losses, and how many files were cut.
        self.power_lost_bytes = 0
        self.power_lost_files = 0
        self._channels: dict[str, grpc.Channel] = {}
        # Faults hit signed traffic, as in a secure deployment: replays and reordering must not hurt it.
        key_file = root / "cluster.key"
        generate_key_file(key_file)
        for sid in ids:
            proxy = TcpProxy("127.0.0.1", nats.port).start()
            self.proxies[sid] = proxy
            self.servers[sid] = FaultyServerProcess(
                root / sid,
                "--namespace",
                self.namespace,
                "--set",
                f"clustering.auth.key.file={key_file}",
                *SETTINGS,
                *extra,
                nats_url=proxy.url,
                server_id=sid,
                bootstrap=",".join(ids),
            )

    # -- lifecycle ------------------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> ChaosCluster:
        """Start every server and wait until all are alive voters with one controller."""
        for proc in self.servers.values():
            proc.start()
        self.wait_formed(timeout)
        return self

    def close(self) -> None:
        """Resume, kill and reap every server, stop every proxy and close channels; safe to call twice."""
        for sid, proc in self.servers.items():
            if proc.proc is not None:
                resume(proc.proc)
                kill9(proc.proc)
            self.paused.discard(sid)
        for proxy in self.proxies.values():
            proxy.stop()
        if self.nats.proc.poll() is not None:
            restart_nats(self.nats)  # the next cluster on this nats-server needs it
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def __enter__(self) -> ChaosCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def address(self, sid: str) -> str:
        return self.servers[sid].address

    def running(self, sid: str) -> bool:
        proc = self.servers[sid].proc
        return proc is not None and proc.poll() is None

    def reachable(self) -> list[str]:
        """Servers whose process runs and is not frozen (a cut server still answers gRPC)."""
        return [sid for sid in self.ids if self.running(sid) and sid not in self.paused]

    # -- faults ---------------------------------------------------------------------------------------------

    def kill(self, sid: str) -> None:
        """kill -9: no flush, no goodbye (works on a paused server too)."""
        proc = self.servers[sid].proc
        if proc is not None:
            kill9(proc)
        self.paused.discard(sid)
        self.crashes[sid].append(time.monotonic())

    def power_off(self, sid: str) -> dict[Path, int]:
        """kill -9, then every data file loses what was not fsynced (the metadata Raft log always fsyncs)."""
        self.kill(sid)
        server = self.servers[sid]
        lost = power_loss_from_journal(server.journal) if server.journal.exists() else {}
        self.power_lost_bytes += sum(lost.values())
        self.power_lost_files += len(lost)
        return lost

    def restart(self, sid: str, timeout: float = 30.0) -> None:
        """Start a killed server again with the same data directory, port and proxy (disk and clock healthy)."""
        if self.running(sid):
            raise RuntimeError(f"{sid} is still running")
        server = self.servers[sid]
        server.forget_status()
        server.steer(rates={}, clock_offset_ms=0)
        server.start(timeout)

    def disk_faults(self, sid: str, operations: tuple[str, ...], rate: float, errors: list[str]) -> None:
        """Fail ``rate`` of ``sid``'s calls of ``operations`` with one of ``errors`` (names: EIO, ENOSPC...)."""
        self.servers[sid].steer(rates={op: rate for op in operations}, errors=errors)

    def disk_ok(self, sid: str) -> None:
        self.servers[sid].steer(rates={})

    def shift_clock(self, sid: str, seconds: float) -> None:
        """Jump ``sid``'s wall clock to ``seconds`` away from the real time (0: back to the real time)."""
        self.servers[sid].steer(clock_offset_ms=int(seconds * 1000))

    def disk_failures_injected(self) -> int:
        return sum(server.injected() for server in self.servers.values())

    def stop_nats(self) -> None:
        stop_nats(self.nats)

    def start_nats(self) -> None:
        restart_nats(self.nats)

    def pause(self, sid: str) -> None:
        proc = self.servers[sid].proc
        assert proc is not None
        pause(proc)
        self.paused.add(sid)

    def resume(self, sid: str) -> None:
        proc = self.servers[sid].proc
        assert proc is not None
        resume(proc)
        self.paused.discard(sid)

    def cut(self, sid: str) -> None:
        self.proxies[sid].cut()
        self.faulted.add(sid)

    def blackhole(self, sid: str) -> None:
        self.proxies[sid].blackhole()
        self.faulted.add(sid)

    def delay(self, sid: str, seconds: float) -> None:
        self.proxies[sid].delay(seconds)
        self.faulted.add(sid)

    def oneway(self, sid: str, direction: str) -> None:
        """``direction`` "up": the server's bytes to NATS are lost; "down": what NATS sends it is lost."""
        self.proxies[sid].oneway(direction)
        self.faulted.add(sid)

    def heal(self, sid: str) -> None:
        self.proxies[sid].heal()
        self.faulted.discard(sid)

    def apply(self, event: FaultEvent) -> None:
        """Start a scheduled fault."""
        self.injected[event.action.value] = self.injected.get(event.action.value, 0) + 1
        if event.action is Fault.TWO:
            sub = Fault(event.kind.partition(":")[0])
            for sid in event.targets:
                self._apply_one(sub, sid, event)
        else:
            self._apply_one(event.action, event.target, event)

    def _apply_one(self, action: Fault, sid: str, event: FaultEvent) -> None:
        if action is Fault.KILL:
            self.kill(sid)
        elif action is Fault.PAUSE:
            self.pause(sid)
        elif action is Fault.CUT:
            self.cut(sid)
        elif action is Fault.BLACKHOLE:
            self.blackhole(sid)
        elif action is Fault.DELAY:
            self.delay(sid, event.latency)
        elif action is Fault.ONEWAY:
            self.oneway(sid, event.direction)
        elif action is Fault.DISK:
            profile, _, error = event.kind.partition(":")
            self.disk_faults(sid, DISK_PROFILES[profile], event.rate, [error or "EIO"])
        elif action is Fault.POWER:
            self.power_off(sid)
        elif action is Fault.CLOCK:
            self.shift_clock(sid, event.shift_s)
        elif action is Fault.NATS:
            self.stop_nats()

    def undo(self, event: FaultEvent) -> None:
        """End a scheduled fault: restart, resume, heal, clear the disk, put the clock right."""
        if event.action is Fault.TWO:
            sub = Fault(event.kind.partition(":")[0])
            for sid in event.targets:
                self._undo_one(sub, sid)
        else:
            self._undo_one(event.action, event.target)

    def _undo_one(self, action: Fault, sid: str) -> None:
        if action in (Fault.KILL, Fault.POWER):
            self.restart(sid)
        elif action is Fault.PAUSE:
            self.resume(sid)
        elif action is Fault.DISK:
            self.disk_ok(sid)
        elif action is Fault.CLOCK:
            self.shift_clock(sid, 0)
        elif action is Fault.NATS:
            self.start_nats()
        else:
            self.heal(sid)

    def heal_all(self) -> None:
        """Undo every fault: NATS back, heal links, healthy disks and clocks, resume frozen servers, restart
        dead ones."""
        if self.nats.proc.poll() is not None:
            self.start_nats()
        for sid in self.ids:
            self.heal(sid)
            if self.running(sid):
                self.servers[sid].steer(rates={}, clock_offset_ms=0)
            if sid in self.paused:
                self.resume(sid)
        for sid in self.ids:
            if not self.running(sid):
                self.restart(sid)

    # -- looking at the cluster -----------------------------------------------------------------------------

    def channel(self, sid: str) -> grpc.Channel:
        ch = self._channels.get(sid)
        if ch is None:
            ch = grpc.insecure_channel(self.address(sid), options=channel_options())
            self._channels[sid] = ch
        return ch

    def api(self, sid: str) -> api_pb2_grpc.APIStub:
        return api_pb2_grpc.APIStub(self.channel(sid))

    def status(self, sid: str, timeout: float = 2.0) -> cluster_pb2.ClusterStatusResponse:
        return cluster_pb2_grpc.ClusterStub(self.channel(sid)).Status(
            cluster_pb2.ClusterStatusRequest(), timeout=timeout
        )

    def partitions(self, sid: str, stream: str, timeout: float = 2.0) -> dict[int, PartitionView] | None:
        """``sid``'s view of ``stream`` (None when it does not know the stream)."""
        meta = self.api(sid).FetchMetadata(api_pb2.FetchMetadataRequest(streams=[stream]), timeout=timeout)
        sm = meta.streamMetadata[0]
        if sm.error == api_pb2.StreamMetadata.UNKNOWN_STREAM:
            return None
        return {
            pid: PartitionView(p.leader, tuple(p.replicas), tuple(p.isr), p.highWatermark, p.newestOffset)
            for pid, p in sm.partitions.items()
        }

    def freshest(self, stream: str, timeout: float = 1.0) -> dict[int, PartitionView] | None:
        """The view of ``stream`` held by the reachable server with the highest applied metadata index."""
        best: tuple[int, dict[int, PartitionView]] | None = None
        for sid in self.reachable():
            try:
                applied = self.status(sid, timeout).appliedIndex
                view = self.partitions(sid, stream, timeout)
            except grpc.RpcError:
                continue
            if view is not None and (best is None or applied > best[0]):
                best = (applied, view)
        return None if best is None else best[1]

    def leader(self, stream: str, partition: int = 0) -> str | None:
        view = self.freshest(stream)
        return view[partition].leader or None if view and partition in view else None

    def isr(self, stream: str, partition: int = 0) -> tuple[str, ...]:
        view = self.freshest(stream)
        return view[partition].isr if view and partition in view else ()

    def wait_formed(self, timeout: float = 30.0) -> str:
        """Wait until every reachable server sees all servers alive as voters and one controller; return it."""

        def check() -> str | None:
            seen: set[str] = set()
            for sid in self.reachable():
                st = self.status(sid)
                if {s.id for s in st.servers if s.alive and s.voter} != set(self.ids) or not st.controller:
                    return None
                seen.add(st.controller)
            return seen.pop() if len(seen) == 1 else None

        return self.eventually(check, timeout, f"a cluster of {', '.join(self.ids)}")

    def create_stream(self, name: str, partitions: int = 1, rf: int = 3) -> dict[int, PartitionView]:
        """Create ``name`` and wait until every server agrees on its layout, with full ISRs."""
        sid = self.reachable()[0]
        req = api_pb2.CreateStreamRequest(name=name, subject=name, partitions=partitions, replicationFactor=rf)
        self.api(sid).CreateStream(req, timeout=10)

        def agreed() -> dict[int, PartitionView] | None:
            views = [self.partitions(s, name) for s in self.reachable()]
            first = views[0]
            if first is None or any(v is None for v in views):
                return None
            layouts = [{p: (v.leader, v.replicas, v.isr) for p, v in view.items()} for view in views if view]
            if any(layout != layouts[0] for layout in layouts):
                return None
            return first if all(len(v.isr) == rf and v.leader for v in first.values()) else None

        return self.eventually(agreed, 20, f"agreement on stream {name}")

    def fenced(self, sid: str, timeout: float = 2.0) -> list[cluster_pb2.PartitionStatus]:
        """``sid``'s fenced replicas, as its cluster status reports them."""
        return list(self.status(sid, timeout).fenced)

    def logs(self) -> dict[str, str]:
        """The tail of every server's log, for failure messages."""
        return {sid: proc.output() for sid, proc in self.servers.items()}

    #: Poll until true (gRPC errors count as not yet); one helper for every cluster test.
    eventually = staticmethod(eventually)
