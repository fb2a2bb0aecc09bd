"""The partition replicas this server hosts, kept in line with the committed metadata.

The metadata Raft group decides; this module follows. After the metadata
changes (an applied entry, a restored snapshot, a restart) ``reconcile``
compares the partitions assigned to this server with the ones it hosts and
opens, closes, starts or stops intake, and deletes data, one change at a
time in one task. ``reconciled_index`` tells which metadata index the
hosted partitions reflect, so a change's caller can wait until every
affected server has acted on it.

Partition data lives in ``<data dir>/streams/<stream>/<partition>/``; the
stream directory holds ``.created`` with the stream's creation time, so data
left by a deleted stream is never mistaken for a new stream of the same name.

Event-loop only, not thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from liftlog.metadata import (
    CURSORS_STREAM,
    InvalidStreamError,
    Metadata,
    NoSuchPartitionError,
    PartitionMeta,
    RefusedError,
    StreamMeta,
    StreamSettings,
    check_stream_usable,
    is_internal_stream,
)
from liftlog.replication.roles import (
    ConfirmCandidacy,
    Follow,
    Lead,
    ReplicaRole,
    RoleKind,
    StandBy,
    SyncMembership,
    decide_role,
)
from liftlog.server.changes import Changes
from liftlog.server.clock import SYSTEM_CLOCK, Clock
from liftlog.server.config import StreamsConfig
from liftlog.server.nats.nats_types import IntakeNats, NatsClient
from liftlog.server.partitions.group_commit import GroupCommitter
from liftlog.server.partitions.partition import AckSink, Partition, PartitionOptions, new_ack_latency
from liftlog.server.partitions.replicator import Replicator
from liftlog.server.ratelimit import LogLimiter
from liftlog.server.rlimits import segment_files_budget
from liftlog.storage import FileIO, FsyncPolicy, LogConfig, StorageError
from liftlog.storage.descriptors import DescriptorBudget
from liftlog.storage.encryption import BatchCipher
from liftlog.storage.fileio import DEFAULT_FILE_IO

__all__ = ["StreamManager"]

log = logging.getLogger(__name__)
_limited = LogLimiter(log)

#: Asks the controller to pause these partitions of a stream (auto-pause).
PauseRequest = Callable[[str, tuple[int, ...]], Awaitable[None]]


@dataclass(slots=True)
class _Hosted:
    """What a hosted partition was last set up as."""

    part: Partition
    created: int
    paused: bool
    readonly: bool
    #: What the replica was last set up as; None while closed (and always without a replicator).
    role: ReplicaRole | None = None
    #: Partition epoch at which this replica last confirmed it was asked to take over.
    confirmed_at: int = -1
    #: Its log failed to open (the partition is fenced with the reason); tried again at each reconcile.
    open_failed: bool = False
    #: Acting on the metadata failed for it (fenced with the reason); retried with the next reconcile.
    apply_failed: bool = False


class StreamManager:
    def __init__(
        self,
        *,
        server_id: str,
        data_dir: Path,
        namespace: str,
        defaults: StreamsConfig,
        batch_max: int,
        ack_sink: AckSink,
        clock: Clock = SYSTEM_CLOCK,
        file_io: FileIO = DEFAULT_FILE_IO,
        segment_files: int = 0,
        replicator: Replicator | None = None,
        min_isr_default: int = 1,
        request_pause: PauseRequest | None = None,
        resign: Callable[[Partition, str], Awaitable[None]] | None = None,
        confirm_candidate: Callable[[Partition], Awaitable[None]] | None = None,
        cipher: BatchCipher | None = None,
        intake_arrived: Callable[[], None] | None = None,
        leader_lease_ns: int | None = None,
    ) -> None:
        self.server_id = server_id
        #: clustering.leader.lease.time in ns (None: no lease). One lease for the whole server: the evidence
        #: that renews it (a metadata read-index barrier) is about this server, not about one partition.
        self.lease_ns = leader_lease_ns
        #: Monotonic ns until which the latest renewal lets this server's leaders acknowledge.
        self.lease_until = 0
        #: How often the lease ran out while this server led some partition, and renewals (metrics).
        self.lease_lapses = 0
        self.lease_renewals = 0
        self._lease_lapsed = False
        self.clock = clock
        self._monotonic = clock.monotonic_ns
        self._intake_arrived = intake_arrived
        #: Encrypts and decrypts encrypted streams' batches (its master keys may be none).
        self.cipher = cipher if cipher is not None else BatchCipher(None)
        self._file_io = file_io
        #: Descriptors of sealed segments, shared by every hosted log (streams.segment.files.max).
        self.descriptors = DescriptorBudget(segment_files_budget(segment_files))
        #: One fsync per log per event-loop turn for partitions with the "always" fsync policy.
        self.committer = GroupCommitter()
        #: Write-to-ack seconds per ack policy, over every partition this server leads (metrics).
        self.ack_latency = new_ack_latency()
        self._dir = data_dir / "streams"
        self._namespace = namespace
        #: Streams (name, creation time) skipped because an older version let in a name or subject
        #: that would break NATS subscriptions or record internal traffic; each is warned about once.
        self._unusable: set[tuple[str, int]] = set()
        self._defaults = defaults
        self._batch_max = batch_max
        self._ack_sink = ack_sink
        self._clock = clock.wall_ns
        self._nats: IntakeNats
        self._internal_nats: IntakeNats
        #: The committed metadata; the metadata service replaces it when it restores a snapshot.
        self.metadata = Metadata()
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._hosted: dict[tuple[str, int], _Hosted] = {}
        self.reconciled_index = 0
        #: clustering.min.insync.replicas, for streams without their own minIsr.
        self.min_isr_default = min_isr_default
        self._target_index = 0
        self._dirty = asyncio.Event()
        #: Notified when hosted roles change and after each reconcile (``reconciled_index``, ``is_leading``).
        self.changes = Changes()
        self._task: asyncio.Task[None] | None = None
        #: Asks the controller to pause partitions (auto-pause); None: nothing pauses them.
        self._request_pause = request_pause
        #: Replication of partitions with several replicas; None runs every partition unreplicated.
        self.replicator = replicator
        #: Asks the controller to move leadership away from a replica whose log fenced itself.
        self._resign = resign
        #: Tells the controller this replica is ready to lead (an election picked it).
        self._confirm_candidate = confirm_candidate
        #: False until this server has caught up with the cluster's metadata: a restarted server must not
        #: lead (take publishes, ack them) by metadata it replayed from its own log, which may be stale.
        self.may_lead = True
        self._leading_reconciled = False
        self._confirmations: set[asyncio.Future[None]] = set()
        self._retry: asyncio.TimerHandle | None = None

    # -- lifecycle -------------------------------------------------------

    async def start(self, nats: IntakeNats, internal_nats: NatsClient | None = None) -> None:
        """Follow the metadata; intake listens on ``nats``, the servers' own streams' on ``internal_nats``
        (which, with a cluster secret, takes only what a server of the cluster signed)."""
        self._nats = nats
        self._internal_nats = internal_nats or nats
        self._dir.mkdir(parents=True, exist_ok=True)
        self._task = asyncio.get_running_loop().create_task(self._reconcile_loop(), name="reconcile-partitions")

    async def stop(self) -> None:
        """Stop following the metadata, drain every partition's intake and close its log."""
        if self._retry is not None:
            self._retry.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        for task in list(self._confirmations):  # a confirmation would retry against a stopped client
            task.cancel()
        await asyncio.gather(*self._confirmations, return_exceptions=True)
        # Stop all intake first so nothing new arrives while logs close.
        await asyncio.gather(*(p.stop_intake() for p in self.partitions.values()), return_exceptions=True)
        for part in self.partitions.values():
            try:
                await part.close("the server is shutting down")
            except Exception:
                log.exception("closing %s", part)
        self.committer.close()

    # -- following the metadata -----------------------------------------

    def defer_leading(self) -> None:
        """Take up no leadership until ``allow_leading``: the metadata may be stale (a restart)."""
        self.may_lead = False
        self._leading_reconciled = False

    async def suspend_leading(self) -> None:
        """Stop taking writes for the partitions led here until ``allow_leading``: a NATS connection
        dropped, so the controller may have given our leaderships to others meanwhile.

        Left listening, a leader that was replaced while cut off takes the messages published on its
        subject the moment its connection is back, before the metadata telling it that it was replaced
        arrives (over 100 ms in the chaos runs): it writes and acknowledges each at an offset of its
        stale log that is truncated soon after, while the new leader stores the same message elsewhere,
        and the publisher takes whichever ack comes first. The publisher's server then gives an offset
        where the message is not (ack LEADER), or an error for a message that was committed (the old
        leader's ack-ALL waiters fail when it steps down). Leaders keep their role and their followers;
        only their intake stops, and a publish through this server waits for it (``until_listening``).
        """
        self.defer_leading()
        await asyncio.gather(
            *(p.stop_intake() for p in self.partitions.values() if p.leader is not None and p.accepting),
            return_exceptions=True,
        )

    def renew_lease(self, asked_at: int) -> None:
        """A metadata read-index barrier sent at ``asked_at`` (monotonic ns) was answered, and every change it
        covers acted on: the partitions led here may acknowledge until ``asked_at`` + the lease."""
        if self.lease_ns is None:
            return
        self.lease_renewals += 1
        self.lease_until = max(self.lease_until, asked_at + self.lease_ns)
        self._lease_lapsed = False
        for part in self.partitions.values():
            part.lease_renewed(asked_at)

    def lease_left(self) -> int:
        """Nanoseconds the lease still holds (0 once run out, or without a lease)."""
        return max(self.lease_until - self._monotonic(), 0) if self.lease_ns is not None else 0

    def check_lease(self) -> bool:
        """Whether the lease holds now; a lapse while leading is counted (and logged) once."""
        if self.lease_ns is None or self._monotonic() < self.lease_until:
            return True
        led = sum(1 for p in self.partitions.values() if p.leader is not None)
        if led and not self._lease_lapsed:
            self._lease_lapsed = True
            self.lease_lapses += 1
            log.warning(
                "leader lease ran out (no answer from the metadata leader within %d ms): the %d partition(s) led "
                "here acknowledge nothing until it is renewed",
                self.lease_ns // 1_000_000,
                led,
            )
        return False

    def allow_leading(self) -> None:
        """The metadata is known to be current: take up the leaderships it gives us."""
        if not self.may_lead:
            self.may_lead = True
            self._dirty.set()

    def metadata_changed(self, index: int) -> None:
        """The committed metadata now reflects ``index``; reconcile soon."""
        self._target_index = max(self._target_index, index)
        self._dirty.set()

    async def wait_reconciled(self, index: int, timeout: float, *, leading: bool = True) -> bool:
        """Wait until the hosted partitions reflect metadata ``index``; False on timeout.

        With ``leading`` this includes taking up the leaderships the metadata gives this server,
        which a restarted server defers until it caught up with the cluster (see ``may_lead``).
        """

        def done() -> bool:
            return self.reconciled_index >= index and (self._leading_reconciled or not leading)

        return await self.changes.until(done, timeout)

    async def _reconcile_loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            target = self._target_index
            leading = self.may_lead
            try:
                await self.reconcile()
            except Exception:
                log.exception("acting on metadata index %d failed; retrying", target)
                await asyncio.sleep(1.0)
                self._dirty.set()
                continue
            self.reconciled_index = max(self.reconciled_index, target)
            self._leading_reconciled = self._leading_reconciled or leading
            self.changes.notify()

    async def reconcile(self) -> None:
        """Open, close and reconfigure hosted partitions to match ``metadata``."""
        wanted: dict[tuple[str, int], tuple[StreamMeta, PartitionMeta]] = {}
        for stream in self.metadata.streams.values():
            if not self._usable(stream):
                continue
            for meta in stream.partitions.values():
                if self.server_id in meta.replicas:
                    wanted[(stream.name, meta.id)] = (stream, meta)
        for key in [
            k for k, h in self._hosted.items() if k not in wanted or wanted[k][0].creation_timestamp != h.created
        ]:
            await self._isolated(key, self._remove(key))
        for key, (stream, meta) in wanted.items():
            hosted = self._hosted.get(key)
            if hosted is None:
                await self._isolated(key, self._add(stream, meta))
            else:
                hosted.part.meta = meta
                await self._isolated(key, self._update(hosted, meta))
        if any(h.open_failed or h.apply_failed for h in self._hosted.values()):
            self._retry_soon()
        self.changes.notify()

    async def _isolated(self, key: tuple[str, int], step: Awaitable[None]) -> None:
        """One partition's step; if it fails, that partition is fenced and the others carry on.

        A failing partition must not hold back this server's other partitions, nor the callers waiting
        for the metadata change to take effect here (they would all time out).
        """
        try:
            await step
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            hosted = self._hosted.get(key)
            if hosted is None:
                log.exception("partition %s/%d: acting on the metadata failed", *key)
                return
            if not hosted.apply_failed:
                log.exception("partition %s/%d: acting on the metadata failed; fenced until a retry works", *key)
            hosted.apply_failed = True
            hosted.part.fenced = f"this server could not act on the metadata for it: {exc!r}"
            return
        hosted = self._hosted.get(key)
        if hosted is not None and hosted.apply_failed:
            hosted.apply_failed = False
            if not hosted.open_failed:
                hosted.part.fenced = None
            log.info("partition %s/%d: acting on the metadata works again", *key)

    def _retry_soon(self, delay: float = 2.0) -> None:
        if self._retry is None or self._retry.cancelled():
            self._retry = asyncio.get_running_loop().call_later(delay, self._retried)

    def _retried(self) -> None:
        self._retry = None
        self._dirty.set()

    def _usable(self, stream: StreamMeta) -> bool:
        """False (warning once) for a stream whose name or subjects today's rules refuse."""
        try:
            check_stream_usable(stream.name, (p.subject for p in stream.partitions.values()), self._namespace)
        except InvalidStreamError as exc:
            key = (stream.name, stream.creation_timestamp)
            if key not in self._unusable:
                self._unusable.add(key)
                log.warning(
                    "not hosting stream %r: %s. An older version accepted it; delete it "
                    "(liftlog stream delete %r) and create it again under a valid name and subject",
                    stream.name,
                    exc,
                    stream.name,
                )
            return False
        return True

    async def _remove(self, key: tuple[str, int]) -> None:
        hosted = self._hosted.pop(key)
        self.partitions.pop(key, None)
        name, pid = key
        await self._drop_role(hosted)
        gone = name not in self.metadata.streams
        await hosted.part.close(f"stream {name!r} was deleted" if gone else f"{name}/{pid} moved to other servers")
        stream_dir = self._dir / name
        await asyncio.to_thread(shutil.rmtree, stream_dir / str(pid), True)
        if not any(k[0] == name for k in self._hosted):
            await asyncio.to_thread(shutil.rmtree, stream_dir, True)
        log.info("removed partition %s/%d", name, pid)

    async def _add(self, stream: StreamMeta, meta: PartitionMeta) -> None:
        await asyncio.to_thread(self._claim_stream_dir, stream)
        part = self._new_partition(stream, meta)
        key = (stream.name, meta.id)
        hosted = _Hosted(part, stream.creation_timestamp, paused=meta.paused, readonly=meta.readonly)
        self._hosted[key] = hosted
        self.partitions[key] = part
        if not await self._open(hosted):
            return
        if meta.paused:
            # Opened once so a paused partition reports its offsets in metadata.
            await part.close(f"partition {stream.name}/{meta.id} is paused")
        else:
            await self._set_role(hosted, meta)

    async def _update(self, hosted: _Hosted, meta: PartitionMeta) -> None:
        part = hosted.part
        if meta.paused != hosted.paused:
            hosted.paused = meta.paused
            if meta.paused:
                await self._drop_role(hosted)
                await part.close(f"partition {part.stream}/{part.id} was paused")
                return
        if not meta.paused and part.log is None and not await self._open(hosted):
            return
        if not meta.paused:
            await self._set_role(hosted, meta)

    async def _open(self, hosted: _Hosted) -> bool:
        """Open the partition's log; on failure fence it with the reason, so its callers hear why.

        One broken log must not stop this server from following the metadata: every later change
        (and a restart) would wait on it.
        """
        part = hosted.part
        try:
            await asyncio.to_thread(part.open_log)
        except (StorageError, OSError) as exc:
            part.fenced = f"its log in {part.directory} cannot be opened: {exc}"
            if not hosted.open_failed:
                log.error("partition %s/%d is unavailable: %s", part.stream, part.id, part.fenced)
            hosted.open_failed = True
            return False
        if hosted.open_failed:
            hosted.open_failed = False
            part.fenced = None
            log.info("partition %s/%d opened after all", part.stream, part.id)
        return True

    async def _drop_role(self, hosted: _Hosted) -> None:
        if self.replicator is not None:
            self.replicator.unfollow(hosted.part)
            self.replicator.stop_leading(hosted.part)
        hosted.role = None

    async def _set_role(self, hosted: _Hosted, meta: PartitionMeta) -> None:
        """Lead, follow or stand by as ``decide_role`` says; only a leader that is not readonly takes writes."""
        part = hosted.part
        replicator = self.replicator
        core = part.leader
        decision = decide_role(
            self.server_id,
            meta,
            hosted.role,
            hosted.confirmed_at,
            may_lead=self.may_lead,
            membership=(core.replicas, core.isr) if core is not None else None,
        )
        hosted.confirmed_at = decision.confirmed_at
        for action in decision.actions:
            if isinstance(action, ConfirmCandidacy):
                # Asked to take over: stop fetching from the old leader, and say we are ready.
                if replicator is not None:
                    replicator.unfollow(part)
                if self._confirm_candidate is not None:
                    task: asyncio.Future[None] = asyncio.ensure_future(self._confirm_candidate(part))
                    self._confirmations.add(task)
                    task.add_done_callback(self._confirmations.discard)
            elif replicator is None:
                continue  # unreplicated (tests): the named leader takes writes, nobody fetches
            elif isinstance(action, Lead):
                replicator.unfollow(part)
                part.become_leader(
                    self.server_id,
                    self._clock(),
                    max_lag_ns=replicator.settings.max_lag_ns,
                    max_lag_messages=replicator.settings.max_lag_messages,
                    lease_ns=self.lease_ns,
                    lease_until=self.lease_until,
                )
                replicator.lead(part)
                log.info("%s: leading in leader epoch %d (ISR %s)", part, meta.leader_epoch, ",".join(meta.isr))
            elif isinstance(action, Follow | StandBy):
                # Step down before anything awaits: from here on, messages the subscription still
                # delivers are refused, never written to what is now a follower's log.
                if part.leader is not None:
                    part.become_follower()
                await part.stop_intake()
                replicator.stop_leading(part)
                if isinstance(action, StandBy):
                    replicator.unfollow(part)
                    log.info("%s: neither leading nor following while the partition is %s", part, action.state.value)
                else:
                    replicator.follow(part)
                    log.info("%s: following %s in leader epoch %d", part, action.leader, action.leader_epoch)
            elif isinstance(action, SyncMembership):
                part.isr_committed(self._clock())
        if decision.held:
            if part.accepting:  # suspended (suspend_leading): no writes until the metadata is known current
                await part.stop_intake()
            return  # decided again once allowed
        if replicator is not None:
            hosted.role = decision.role
            self.changes.notify()
        if decision.listen and not part.accepting:
            await part.start_intake(self._internal_nats if is_internal_stream(part.stream) else self._nats)
        elif not decision.listen and part.accepting:
            await part.stop_intake()
        if meta.readonly != hosted.readonly:
            part.wake_readers()  # readers at the end learn the partition is readonly
        hosted.readonly = meta.readonly

    def _claim_stream_dir(self, stream: StreamMeta) -> None:
        """Make ``streams/<name>`` this incarnation's: data of an older stream of that name goes."""
        stream_dir = self._dir / stream.name
        marker = stream_dir / ".created"
        stamp = str(stream.creation_timestamp)
        try:
            kept = marker.read_text().strip()
        except FileNotFoundError:
            kept = None
        if kept is not None and kept != stamp:
            log.info("removing data of an earlier stream %r (created %s)", stream.name, kept)
            shutil.rmtree(stream_dir, ignore_errors=True)
        if kept != stamp:
            stream_dir.mkdir(parents=True, exist_ok=True)
            marker.write_text(stamp + "\n")

    # -- lookups ---------------------------------------------------------

    def stream(self, name: str) -> StreamMeta:
        return self.metadata.stream(name)

    def partition(self, name: str, partition: int) -> Partition:
        """The hosted partition, or NoSuchStreamError / NoSuchPartitionError."""
        part = self.partitions.get((name, partition))
        if part is None:
            self.metadata.partition(name, partition)  # raises the specific error
            raise NoSuchPartitionError(name, partition)
        return part

    def is_leading(self, name: str, partition: int) -> bool:
        """Whether this server has taken up leadership of the partition (not only been named leader)."""
        hosted = self._hosted.get((name, partition))
        if hosted is None:
            return False
        if self.replicator is None or hosted.paused:  # unreplicated (tests), or paused: named is leading
            return hosted.part.meta.leader == self.server_id
        return hosted.role is not None and hosted.role.kind is RoleKind.LEAD

    def occ_enabled(self, name: str) -> bool:
        """Whether publishes to the stream check expectedOffset (its setting, else the server's)."""
        occ = self.metadata.stream(name).settings.optimistic_concurrency_control
        return occ if occ is not None else self._defaults.concurrency_control

    def min_isr(self, name: str) -> int:
        """In-sync replicas an ack-ALL publish needs (the stream's minIsr, else the server's)."""
        own = self.metadata.stream(name).settings.min_isr
        return own if own is not None else self.min_isr_default

    def check_settings(self, settings: StreamSettings) -> StreamSettings:
        """``settings`` as the stream is created with them; InvalidStreamError for settings the log would refuse.

        Encryption is decided here, from ``streams.encryption`` when the request leaves it open: every replica
        must agree on it, whatever its own defaults. An encrypted stream needs a master key (RefusedError).
        """
        self._log_config(settings)
        encrypt = settings.encryption if settings.encryption is not None else self._defaults.encryption
        if encrypt and not self.cipher.can_encrypt:
            raise RefusedError(
                "cannot create an encrypted stream: this server has no encryption master key "
                "(set LIFTBRIDGE_ENCRYPTION_KEY or encryption.key.file on every server)"
            )
        return dataclasses.replace(settings, encryption=encrypt)

    async def auto_pause(self) -> None:
        """Pause partitions that have been idle longer than their stream's auto-pause time."""
        now = self._clock()
        idle: dict[str, list[int]] = {}
        for part in self.partitions.values():
            opts = part.options
            if part.meta.leader != self.server_id:
                continue  # the leader decides; followers see no publishes
            if not opts.auto_pause_ns or not part.is_open or part.idle_for(now) < opts.auto_pause_ns:
                continue
            if part.subscribers and opts.auto_pause_disable_if_subscribers:
                continue
            idle.setdefault(part.stream, []).append(part.id)
        for name, ids in idle.items():
            if self._request_pause is None:
                return
            log.info("auto-pausing %s (idle)", ", ".join(f"{name}/{i}" for i in ids))
            try:
                await self._request_pause(name, tuple(ids))
            except Exception as exc:  # deleted meanwhile, or no controller right now
                log.info("auto-pause of %s: %s", name, exc)

    async def clean(self) -> None:
        """Enforce retention and compact the partitions whose cleaner interval has passed.

        Compaction runs in a worker thread; the log swaps segments in under its lock.
        """
        now = self._clock()
        for part in list(self.partitions.values()):
            if part.log is None or now - part.last_cleaned < part.options.cleaner_interval_ns:
                continue
            part.last_cleaned = now
            try:
                part.log.enforce_retention()
                if part.options.log_config.compact_enabled:
                    await asyncio.to_thread(part.log.compact)
            except Exception:
                log.exception("cleaning %s", part)

    def checkpoint_high_watermarks(self) -> None:
        """Write each open partition's HW to its checkpoint when it moved (a restart resumes from it)."""
        for part in self.partitions.values():
            try:
                part.checkpoint_high_watermark()
            except OSError as exc:  # a full disk: the next round tries again; the other partitions go on
                _limited.warning("%s: cannot checkpoint the high watermark: %s", part, exc, key=f"{part}:hw")

    def flush_due(self) -> None:
        for part in self.partitions.values():
            if part.log is not None:
                part.log.flush_if_due()

    # -- helpers ---------------------------------------------------------

    def _new_partition(self, stream: StreamMeta, meta: PartitionMeta) -> Partition:
        s = stream.settings
        d = self._defaults
        auto_pause_ms = s.auto_pause_time_ms if s.auto_pause_time_ms is not None else d.auto_pause_time
        cleaner_ms = s.cleaner_interval_ms if s.cleaner_interval_ms is not None else d.cleaner_interval
        options = PartitionOptions(
            self._log_config(s),
            occ=s.optimistic_concurrency_control
            if s.optimistic_concurrency_control is not None
            else d.concurrency_control,
            batch_max=self._batch_max,
            auto_pause_ns=auto_pause_ms * 1_000_000,
            cleaner_interval_ns=cleaner_ms * 1_000_000,
            auto_pause_disable_if_subscribers=s.auto_pause_disable_if_subscribers
            if s.auto_pause_disable_if_subscribers is not None
            else d.auto_pause_disable_if_subscribers,
            min_isr=s.min_isr if s.min_isr is not None else self.min_isr_default,
            created=stream.creation_timestamp,
            file_io=self._file_io,
            descriptors=self.descriptors,
            cipher=self.cipher,
            encrypt=bool(s.encryption),
            local_only=stream.name == CURSORS_STREAM,
            duplicate_window_ns=(s.duplicate_window_ms if s.duplicate_window_ms is not None else d.duplicate_window)
            * 1_000_000,
            duplicate_max_ids=d.duplicate_max_ids,
        )
        part = Partition(
            meta,
            directory=self._dir / stream.name / str(meta.id),
            options=options,
            queue_group=stream.group,
            ack_sink=self._ack_sink,
            clock=self.clock,
            on_fenced=self._fenced_while_leading,
            group_commit=self.committer.add if options.log_config.fsync is FsyncPolicy.ALWAYS else None,
            leader_actions=self.replicator.on_leader_actions if self.replicator is not None else None,
            ack_latency=self.ack_latency,
            intake_arrived=self._intake_arrived,
        )
        return part

    def _fenced_while_leading(self, part: Partition) -> None:
        if self._resign is not None and part.fenced is not None:
            task = asyncio.ensure_future(self._resign(part, part.fenced))
            self._confirmations.add(task)
            task.add_done_callback(self._confirmations.discard)

    def repair_fenced(self) -> None:
        """Fenced logs retry their repair, so a partition nobody writes to resumes too."""
        for part in self.partitions.values():
            part.try_repair()

    def _log_config(self, s: StreamSettings) -> LogConfig:
        """The server's ``streams.*`` log settings with the stream's overrides."""
        overrides: dict[str, Any] = {
            "segment_max_bytes": s.segment_max_bytes,
            "segment_max_age_ms": s.segment_max_age_ms,
            "retention_max_bytes": s.retention_max_bytes,
            "retention_max_messages": s.retention_max_messages,
            "retention_max_age_ms": s.retention_max_age_ms,
            "compact_enabled": s.compact_enabled,
        }
        try:
            return dataclasses.replace(
                self._defaults.log_config(), **{k: v for k, v in overrides.items() if v is not None}
            )
        except ValueError as exc:
            raise InvalidStreamError(str(exc)) from exc
