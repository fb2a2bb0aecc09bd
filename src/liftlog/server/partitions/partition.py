"""One partition hosted by this server: its log, its NATS intake, acks and waiting readers.

Intake is batched: the NATS callback collects messages until the
subscription's queue is empty, so every burst nats-py read from the socket
is encoded, CRC'd and written as one record batch, and its acks are sent
together.

Rules:
- A message is acked only after it is in the log (``LEADER``) or committed,
  i.e. the high watermark reached it (``ALL``); ``NONE`` is never acked.
  With one replica, committed means written.
- Rejected messages (expected offset, size) are not written; their ack
  carries the error so the publisher learns why.
- ``stop`` drains the NATS subscription and writes what was received
  before closing the log, so nothing the server took in is dropped.
- A leader whose lease ran out (``LeaderReplica.may_ack``) writes nothing and
  acknowledges nothing, not even with an error: the controller may already
  have named a successor that takes the same messages, and an error ack would
  race with its ack. It holds what arrives (bounded, for a few leases) and
  writes it if the lease is renewed while it still leads, which is the usual
  end of a lapse (a metadata election); if it is deposed instead, the held
  messages are dropped and their publishers' acks time out (UNKNOWN), as for
  a leader cut off altogether. Held LEADER acks are checked again at the fsync.

Event-loop only, not thread-safe. ``start``/``stop``/``pause`` await.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from liftlog.api import api_pb2
from liftlog.histogram import Histogram
from liftlog.metadata import EventTimestamps, PartitionMeta
from liftlog.natswire import Event as NatsEvent
from liftlog.natswire import LeanNats
from liftlog.recordformat import ATTR_MSG_IDS
from liftlog.replication.admission import AdmissionRules, Intake, Refusal, admit, intake
from liftlog.replication.duplicates import (
    BATCH_ID_HEADER,
    HIDDEN_MSG_ID_HEADER,
    MSG_ID_HEADER,
    DuplicateWindow,
    batch_key,
)
from liftlog.replication.follower import FollowerReplica
from liftlog.replication.leader import FetchAnswer, HighWatermark, LeaderAction, LeaderReplica
from liftlog.server.changes import Changes
from liftlog.server.clock import SYSTEM_CLOCK, Clock
from liftlog.server.nats.nats_types import IntakeNats, NatsMessage, NatsSubscription
from liftlog.server.partitions.duplicates import Screened, record_offsets, screen
from liftlog.server.partitions.messages import Incoming, incoming_from_nats, msg_id_in_nats_headers, record_size
from liftlog.server.ratelimit import LogLimiter
from liftlog.storage import (
    CommitLog,
    FileIO,
    InvalidBatch,
    LogConfig,
    LogFenced,
    NewRecord,
    RecordTooLarge,
    StorageError,
)
from liftlog.storage.descriptors import DescriptorBudget
from liftlog.storage.encryption import BatchCipher, EncryptionError, PartitionCipher, partition_context
from liftlog.storage.fileio import DEFAULT_FILE_IO
from liftlog.storage.records import decode_records

#: Write-to-ack seconds per ack policy (LEADER, ALL).
AckLatency = dict[int, Histogram]


def new_ack_latency() -> AckLatency:
    return {api_pb2.LEADER: Histogram(), api_pb2.ALL: Histogram()}


__all__ = ["AckSink", "Partition", "PartitionClosed", "PartitionOptions"]

log = logging.getLogger(__name__)
#: Per-batch warnings: one line per partition and kind per logging.warnings.interval, with a count.
_limited = LogLimiter(log)

#: A leader whose lease ran out holds what arrives for this many leases, up to these limits (see ``append``).
PARK_LEASES = 4
PARK_MAX_ITEMS = 10_000
PARK_MAX_BYTES = 64 * 1024 * 1024

#: Sends an Ack to its inbox (locally or over NATS). Must not block.
AckSink = Callable[[api_pb2.Ack], None]
#: Carries out a leader's ISR proposals and follower notifications (server-level work). Must not block.
LeaderActionSink = Callable[["Partition", Sequence[LeaderAction]], None]
#: Told when the log of a partition this replica leads fenced itself (server-level: hand leadership over).
FencedSink = Callable[["Partition"], None]
#: Told that this partition appended batches that wait for an fsync (fsync policy "always"): the group
#: committer fsyncs every such log once at the end of the event-loop turn, then calls ``synced``.
SyncSink = Callable[["Partition"], None]


class PartitionClosed(Exception):
    """The partition was paused, deleted or the server is stopping."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class PartitionOptions:
    """Settings one partition needs, resolved from server defaults and stream overrides."""

    __slots__ = (
        "admission",
        "auto_pause_disable_if_subscribers",
        "auto_pause_ns",
        "batch_max",
        "cipher",
        "cleaner_interval_ns",
        "created",
        "descriptors",
        "duplicate_max_ids",
        "duplicate_window_ns",
        "encrypt",
        "file_io",
        "local_only",
        "log_config",
        "min_isr",
        "occ",
    )

    def __init__(
        self,
        log_config: LogConfig,
        *,
        occ: bool = False,
        batch_max: int = 1024,
        auto_pause_ns: int = 0,
        auto_pause_disable_if_subscribers: bool = False,
        cleaner_interval_ns: int = 300 * 1_000_000_000,
        min_isr: int = 1,
        created: int = 0,
        file_io: FileIO = DEFAULT_FILE_IO,
        descriptors: DescriptorBudget | None = None,
        cipher: BatchCipher | None = None,
        encrypt: bool = False,
        local_only: bool = False,
        duplicate_window_ns: int = 0,
        duplicate_max_ids: int = 0,
    ) -> None:
        self.log_config = log_config
        #: Message ids are deduplicated within this window (0: off), at most this many per partition.
        self.duplicate_window_ns = duplicate_window_ns
        self.duplicate_max_ids = duplicate_max_ids
        #: A servers' own stream (cursors): written only by this server (``take_local``), never from NATS.
        self.local_only = local_only
        #: The server's batch cipher (its master keys); ``encrypt``: the stream is encrypted at rest.
        self.cipher = cipher
        self.encrypt = encrypt
        #: The server's budget of descriptors for sealed segments (None: every segment keeps its own).
        self.descriptors = descriptors
        #: What the log does its file operations through (the fault suite passes a failing one).
        self.file_io = file_io
        self.min_isr = min_isr
        #: The stream's creation timestamp: which incarnation of the stream name this partition belongs
        #: to. Replication requests carry it, so a replica of a deleted stream never serves its successor.
        self.created = created
        self.cleaner_interval_ns = cleaner_interval_ns
        self.occ = occ
        self.batch_max = batch_max
        self.auto_pause_ns = auto_pause_ns
        self.auto_pause_disable_if_subscribers = auto_pause_disable_if_subscribers
        self.admission = AdmissionRules(min_isr, log_config.max_record_bytes, occ)


class Partition:
    def __init__(
        self,
        meta: PartitionMeta,
        *,
        directory: Path,
        options: PartitionOptions,
        queue_group: str,
        ack_sink: AckSink,
        clock: Clock = SYSTEM_CLOCK,
        on_fenced: FencedSink | None = None,
        group_commit: SyncSink | None = None,
        leader_actions: LeaderActionSink | None = None,
        ack_latency: AckLatency | None = None,
        intake_arrived: Callable[[], None] | None = None,
    ) -> None:
        self.meta = meta
        self._monotonic = clock.monotonic_ns  # the leader lease's clock (a wall clock may jump; a lease is a duration)
        #: Messages not written, and LEADER acks not sent, because the leader lease had run out (metrics).
        self.lease_refused = 0
        #: What arrived while the lease had run out, with its arrival (monotonic ns) and size: written in
        #: order if the lease is renewed within ``PARK_LEASES`` leases (see ``append``).
        self._parked: deque[tuple[int, int, Incoming]] = deque()
        self._parked_bytes = 0
        #: Called for each message the intake receives from NATS (the loop spinner's ``cool``).
        self._intake_arrived = intake_arrived
        self.stream = meta.stream
        self.id = meta.id
        self.subject = meta.subject
        self.directory = directory
        self.options = options
        self._queue_group = queue_group
        self._ack_sink = ack_sink
        self._clock = clock.wall_ns
        self.log: CommitLog | None = None
        self.messages_received = EventTimestamps()
        #: ns of the last publish or subscribe, for auto-pause.
        self.last_activity = self._clock()
        self.subscribers = 0
        #: ns of the last retention/compaction pass.
        self.last_cleaned = self._clock()
        self._sub: NatsSubscription | None = None
        self._local_intake = False
        self.intake_changes = Changes()  # notified as intake starts or stops and on close (``accepting``)
        self._pending: list[Incoming] = []
        #: Why this replica refuses writes (its log failed to open, or fenced itself after a write it could
        #: not undo); None when healthy.
        self.fenced: str | None = None
        #: Told when this replica fences itself while leading (its server hands the leadership over).
        self._on_fenced = on_fenced
        #: Group commit (fsync "always"): when set, a leader's appends are fsynced by the committer in one
        #: fsync per turn; their LEADER acks and the commit (HW) wait for ``synced``.
        self._group_commit = group_commit
        self._unsynced_acks: list[api_pb2.Ack] = []
        #: Why the last write failed (a full disk, ...); None after a write succeeds.
        self.write_error: str | None = None
        self._commit_waiters: deque[api_pb2.Ack] = deque()
        self._data_waiter: asyncio.Future[None] | None = None
        self._append_waiter: asyncio.Future[None] | None = None
        self._closed_reason: str | None = "not started"
        # What a closed (paused) partition reports in its metadata.
        self._closed_hw = -1
        self._closed_newest = -1
        #: Replication state of this replica's role: at most one is set.
        self.leader: LeaderReplica | None = None
        self.follower: FollowerReplica | None = None
        self._checkpointed_hw: int | None = None
        #: Where the leader core's notifications and ISR proposals go (the replicator).
        self._leader_actions = leader_actions
        #: Stepped down from leading: intake that still arrives must not be written (see ``append``).
        self._deposed = False
        #: For metrics, read at scrape time: plain ints, one add per batch or read on the hot path.
        self.messages_in = 0  # written as leader (published)
        self.bytes_in = 0
        self.messages_out = 0  # delivered to subscribers and batch fetches
        self.bytes_out = 0
        self.fetches_served = 0  # followers' replication fetches answered as leader
        self.fetch_bytes_served = 0
        self.messages_replicated = 0  # copied from the leader as a follower
        self.bytes_replicated = 0
        #: Seconds from a message's write to its ack, per ack policy (shared by the server's partitions).
        self._ack_latency = ack_latency if ack_latency is not None else new_ack_latency()
        self._acked_now = 0
        #: The message ids this replica stored lately, as leader (rebuilt from the log when it takes over).
        self.duplicates = DuplicateWindow(options.duplicate_window_ns, options.duplicate_max_ids)
        #: Acks of duplicates that wait for their originals' commit: (offset needed, ack).
        self._duplicate_waiters: list[tuple[int, api_pb2.Ack]] = []
        #: Duplicates acknowledged as such, as leader (a metric).
        self.duplicates_acked = 0

    # -- lifecycle -------------------------------------------------------

    @property
    def is_open(self) -> bool:
        return self.log is not None and self._closed_reason is None

    def _cipher(self) -> PartitionCipher | None:
        cipher = self.options.cipher
        if cipher is None:
            return None
        return cipher.bind(partition_context(self.meta.stream, self.meta.id, self.options.created))

    def open_log(self) -> None:
        """Open (recover) the log; readers may use it from now on."""
        if self.log is None:
            self.log = CommitLog.open(
                self.directory,
                self.options.log_config,
                clock=self._clock,
                io=self.options.file_io,
                budget=self.options.descriptors,
                cipher=self._cipher(),
                encrypt=self.options.encrypt,
            )
            if len(self.meta.replicas) == 1:
                # One replica: everything written is committed. With more, the checkpointed HW stands
                # until the leader learns better from its followers: the tail may never have been copied.
                self.log.set_high_watermark(self.log.newest_offset)
        self._closed_reason = None
        self.last_activity = self._clock()

    async def start_intake(self, nats: IntakeNats) -> None:
        """Subscribe to the partition's subject and start writing what arrives."""
        if self.options.local_only:
            self._local_intake = True
        elif self._sub is None:
            if isinstance(nats, LeanNats):  # a read buffer's messages at a time
                self._sub = await nats.subscribe_batches(self.subject, self._queue_group, self._on_nats_batch)
            else:
                self._sub = await nats.subscribe(self.subject, queue=self._queue_group, cb=self._on_nats_message)
        self.intake_changes.notify()

    def take_local(self, data: bytes) -> None:
        """Write one Publish envelope this server made (a cursor), as if it had arrived on the subject."""
        if not self.accepting:
            raise PartitionClosed(self._closed_reason or f"{self} takes no writes here")
        self._pending.append(incoming_from_nats(self.subject, "", data, self.subject))
        self._write_pending()

    async def stop_intake(self) -> None:
        """Unsubscribe, then write every message already received."""
        self._local_intake = False
        sub, self._sub = self._sub, None
        self.intake_changes.notify()
        if sub is not None:
            try:
                await sub.drain()
            except Exception as exc:  # a closed connection has nothing left to drain
                log.debug("draining %s: %s", self, exc)
                # nats-py refuses to drain while it reconnects; left registered, the subscription would be
                # renewed with the connection and deliver again.
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
        if self._pending:
            self._write_pending()

    async def close(self, reason: str) -> None:
        """Stop intake, close the log (checkpointing the HW) and end every reader."""
        await self.stop_intake()
        self._sync_now()
        self._drop_parked("messages not written (held, then the partition closed)")
        self.leader = None
        self.follower = None
        self.fail_commit_waiters(reason)
        self._closed_reason = reason
        self.intake_changes.notify()
        self.wake_readers()
        if self.log is not None:
            self._closed_hw = self.log.high_watermark
            self._closed_newest = self.log.newest_offset
            self.log.close()
            self.log = None

    # -- intake ----------------------------------------------------------

    async def _on_nats_message(self, msg: NatsMessage) -> None:
        # nats-py calls this once per message, from one task that drains the subscription's
        # queue without yielding; writing when the queue is empty makes every burst one batch.
        if self._intake_arrived is not None:
            self._intake_arrived()
        headers = getattr(msg, "headers", None)  # nats-py's Msg: a dict of its NATS headers, or None
        msg_id = headers.get(MSG_ID_HEADER, "").encode() if headers else b""
        self._pending.append(incoming_from_nats(msg.subject, msg.reply, msg.data, self.subject, msg_id))
        sub = self._sub
        if sub is None or not sub.pending_msgs or len(self._pending) >= self.options.batch_max:
            try:
                self._write_pending()
            except Exception:
                log.exception("writing to %s failed", self)

    def _on_nats_batch(self, msgs: list[NatsEvent]) -> None:
        # The lean connection calls this from its data_received, once per read buffer, with its parser's
        # events: (MSG, sid, subject, reply, payload, headers).
        if self._intake_arrived is not None:
            self._intake_arrived()
        subject = self.subject
        self._pending.extend(
            [incoming_from_nats(m[2], m[3], m[4], subject, msg_id_in_nats_headers(m[5]) if m[5] else b"") for m in msgs]
        )
        try:
            self._write_pending()
        except Exception:
            log.exception("writing to %s failed", self)

    def _write_pending(self) -> None:
        pending, self._pending = self._pending, []
        step = self.options.batch_max
        for i in range(0, len(pending), step):
            self.append(pending[i : i + step])

    def append(self, items: list[Incoming]) -> None:
        """Write ``items`` as one batch (dropping rejected ones), then ack them."""
        log_ = self.log
        if log_ is None:
            raise PartitionClosed(self._closed_reason or "closed")
        leader = self.leader
        mono = self._monotonic() if leader is not None else 0
        verdict = intake(leader is not None, self._deposed, leader is None or leader.may_ack(mono))
        if verdict is Intake.PARK:
            self._park(items, mono)
            return
        if leader is not None and self._parked:
            self._release_parked(mono)  # first: they arrived before these
        now = self._clock()
        if verdict is Intake.REFUSE:
            # A follower's log takes only its leader's batches (see replication.admission).
            for item in items:
                self._refused(item, api_pb2.Ack.UNKNOWN, now)
            _limited.warning(
                "%s: refused %d messages that arrived after this replica stopped leading",
                self,
                len(items),
                key=f"{self}:deposed",
            )
            return
        screened: list[Screened] | None = None
        if self.duplicates.enabled:
            for item in items:
                if item.msg_ids or item.batch_id:
                    # Duplicates are answered, not written; what is new goes on to the checks below.
                    screened = screen(items, self.duplicates, now)
                    items = [s.write for s in screened if s.write is not None]
                    break
        next_offset = log_.log_end_offset
        rules = self.options.admission
        in_sync = len(leader.isr) if leader is not None else rules.min_isr  # no role yet: nothing to count
        too_few_copies = 0
        accepted: list[Incoming] = []
        rejected: list[tuple[Incoming, int]] = []
        for item in items:
            refusal = admit(rules, item.ack_policy, in_sync, _payload(item), item.expected_offset, next_offset)
            if refusal is None:
                accepted.append(item)
                next_offset += _count(item)
            else:
                rejected.append((item, _ACK_ERROR[refusal]))
                too_few_copies += refusal is Refusal.TOO_FEW_IN_SYNC
        base = log_.log_end_offset
        written: list[tuple[Incoming, int]] = []
        if accepted:
            # Group commit: the fsync waits for the end of this event-loop turn, shared with other batches.
            log_.defer_fsync = self._group_commit is not None
            try:
                written = self._write_runs(log_, accepted, rejected, now)
            finally:
                log_.defer_fsync = False
        if written:
            self.messages_received = self.messages_received.record(now)
            self.last_activity = now
        if screened is None:
            for item, last_offset in written:
                self._written(item, last_offset, now)  # a batch is acknowledged with its last offset
        else:
            self._remember_ids(written, now)
            self._written_screened(screened, written, now)
        if self._acked_now:
            self._ack_latency[api_pb2.LEADER].observe(0.0, self._acked_now)
            self._acked_now = 0
        for item, error in rejected:
            self._refused(item, error, now)
        if log_.unsynced and self._group_commit is not None:
            self._group_commit(self)
        elif log_.log_end_offset > base:
            self._log_grew(now)
        if too_few_copies:
            _limited.warning(
                "%s: refused %d ack-ALL messages: %d in-sync replicas, min.insync.replicas is %d",
                self,
                too_few_copies,
                len(self.leader.isr) if self.leader else 0,
                self.options.min_isr,
                key=f"{self}:min-isr",
            )

    @property
    def _write_epoch(self) -> int:
        # The epoch this replica leads in, not the metadata's: metadata naming a new leader may arrive
        # before intake stops, and a batch tagged with the new epoch would survive the epoch check.
        return self.leader.leader_epoch if self.leader is not None else self.meta.leader_epoch

    @property
    def under_min_isr(self) -> bool:
        return self.leader is not None and len(self.leader.isr) < self.options.min_isr

    def _log_grew(self, now: int) -> None:
        assert self.log is not None
        self.appended()
        if self.leader is None:
            # Not replicated (no role yet, as in unit tests): written means committed.
            self.set_high_watermark(self.log.newest_offset)
            return
        self._leader_did(self.leader.appended(self.log.log_end_offset, now))

    # -- replication: leader side ---------------------------------------

    def become_leader(
        self,
        server_id: str,
        now: int,
        *,
        max_lag_ns: int,
        max_lag_messages: int = 0,
        lease_ns: int | None = None,
        lease_until: int = 0,
    ) -> None:
        """Lead from the current metadata: record the new leader epoch at the LEO, then track followers.

        ``lease_ns``/``lease_until``: the leader lease and the server's latest renewal (monotonic ns)."""
        assert self.log is not None
        meta = self.meta
        self.follower = None
        self._deposed = False
        self.log.epoch_cache.assign(meta.leader_epoch, self.log.log_end_offset)
        self.leader = LeaderReplica(
            server_id,
            tuple(meta.replicas),
            tuple(meta.isr),
            meta.leader_epoch,
            self.log.log_end_offset,
            self.log.high_watermark,
            now,
            max_lag_ns,
            max_lag_messages,
            lease_ns=lease_ns,
            lease_until=lease_until,
        )
        self._leader_did(self.leader.isr_committed(tuple(meta.isr), now))
        self.rebuild_duplicates(now)

    def serve_fetch(self, follower: str, offset: int, epoch: int, max_bytes: int) -> tuple[FetchAnswer, bytes]:
        """A follower's fetch: what to answer and the raw batches (empty when it is caught up)."""
        assert self.leader is not None and self.log is not None
        answer = self.leader.fetch(follower, offset, epoch, self._clock())
        # Only what is durable: a batch waiting for its group fsync may still be taken back if that fails.
        data = b"" if answer.empty else self.log.read_raw(offset, max_bytes, max_offset=self.log.durable_end)
        self.fetches_served += 1
        self.fetch_bytes_served += len(data)
        self._leader_did(list(answer.actions))
        return answer, data

    def epoch_end(self, epoch: int) -> tuple[int, int]:
        """(largest epoch <= ``epoch`` in this log, where it ends), for a follower about to truncate."""
        assert self.log is not None
        return self.log.epoch_cache.end_offset_for(epoch, self.log.log_end_offset)

    def leader_tick(self, now: int) -> None:
        if self.leader is not None:
            self.duplicates.expire(now)
            if self._parked:
                self._expire_parked(self._monotonic())
            self._leader_did(self.leader.tick(now))

    def lease_renewed(self, asked_at: int) -> None:
        """The server's leader lease was renewed by a request sent at ``asked_at`` (monotonic ns)."""
        if self.leader is not None:
            self.leader.renewed(asked_at)
            mono = self._monotonic()
            if self._parked and self.leader.may_ack(mono):
                try:
                    self._release_parked(mono)
                except Exception:
                    log.exception("writing to %s failed", self)

    @property
    def lease_held(self) -> int:
        """Messages held since the lease ran out, to be written if it is renewed in time."""
        return len(self._parked)

    def _park(self, items: list[Incoming], mono: int) -> None:
        """Hold ``items``, which arrived while the lease had run out, up to the park limits."""
        self._expire_parked(mono)
        held = 0
        for item in items:
            size = _size(item)
            if len(self._parked) >= PARK_MAX_ITEMS or self._parked_bytes + size > PARK_MAX_BYTES:
                break
            self._parked.append((mono, size, item))
            self._parked_bytes += size
            held += 1
        if held < len(items):
            self._lease_lapsed(len(items) - held, "messages not written (too many held already)")
        if held:
            _limited.warning(
                "%s: the leader lease ran out (no word from the controller): holding %d messages until it is renewed",
                self,
                len(self._parked),
                key=f"{self}:park",
            )

    def _expire_parked(self, mono: int) -> None:
        assert self.leader is not None
        hold = PARK_LEASES * (self.leader.lease_ns or 0)
        expired = 0
        while self._parked and mono - self._parked[0][0] > hold:
            self._parked_bytes -= self._parked.popleft()[1]
            expired += 1
        if expired:
            self._lease_lapsed(expired, "messages not written (held until the lease was past renewing)")

    def _drop_parked(self, why: str) -> None:
        if self._parked:
            self._lease_lapsed(len(self._parked), why)
            self._parked.clear()
            self._parked_bytes = 0

    def _release_parked(self, mono: int) -> None:
        """Write what was held, in arrival order, now that the lease holds again."""
        self._expire_parked(mono)
        parked, self._parked = self._parked, deque()
        self._parked_bytes = 0
        items = [item for _, _, item in parked]
        step = self.options.batch_max
        for i in range(0, len(items), step):
            self.append(items[i : i + step])

    def _lease_lapsed(self, count: int, what: str) -> None:
        self.lease_refused += count
        _limited.warning(
            "%s: the leader lease ran out (no word from the controller): %d %s", self, count, what, key=f"{self}:lease"
        )

    def isr_committed(self, now: int) -> None:
        """The metadata's ISR or replicas changed (``self.meta`` is current)."""
        if self.leader is not None:
            replicas = tuple(self.meta.replicas)
            if replicas != self.leader.replicas:
                self._leader_did(self.leader.replicas_changed(replicas, now))
            self._leader_did(self.leader.isr_committed(tuple(self.meta.isr), now))

    def _leader_did(self, actions: list[LeaderAction]) -> None:
        rest: list[LeaderAction] = []
        for action in actions:
            if isinstance(action, HighWatermark):
                self.set_high_watermark(action.hw)
            else:
                rest.append(action)
        if rest and self._leader_actions is not None:
            self._leader_actions(self, rest)

    def become_follower(self) -> None:
        """Stop leading; the replicator sets ``follower`` when it starts fetching."""
        self._sync_now()  # acks held for an fsync go out (or fail) as a leader's would
        self._drop_parked("messages not written (held, then the partition got a new leader)")
        self.leader = None
        self._deposed = True
        self.duplicates.clear()  # rebuilt from the log if it leads again: the log is the only truth
        self.fail_commit_waiters("the partition has a new leader")

    def fail_commit_waiters(self, reason: str) -> None:
        """Acks waiting for a commit this replica can no longer make: tell their publishers."""
        waiters, self._commit_waiters = self._commit_waiters, deque()
        waiters.extend(ack for _, ack in self._duplicate_waiters)
        self._duplicate_waiters = []
        for ack in waiters:
            ack.ackError = api_pb2.Ack.UNKNOWN
            ack.offset = -1
            self._ack_sink(ack)
        if waiters:
            _limited.warning(
                "%s: %d ack-ALL messages not acknowledged: %s", self, len(waiters), reason, key=f"{self}:unacked"
            )

    def _write_runs(
        self, log_: CommitLog, items: list[Incoming], rejected: list[tuple[Incoming, int]], now: int
    ) -> list[tuple[Incoming, int]]:
        """Write ``items``: (item, its last offset) of those written; the others go to ``rejected``.

        Messages go together as one batch; a batched publish whose records arrived encoded is stored as
        it is, as a batch of its own.
        """
        written: list[tuple[Incoming, int]] = []
        epoch = self._write_epoch
        runs = _runs(items)
        for i, run in enumerate(runs):
            start = log_.log_end_offset
            encoded = run[0].encoded
            try:
                if encoded is not None:
                    attributes = ATTR_MSG_IDS if run[0].msg_ids or run[0].batch_id else 0
                    log_.append_encoded(encoded.data, encoded.record_count, epoch, now, encoded.info, attributes)
                else:
                    with_ids = any(i.msg_ids or i.batch_id for i in run)
                    log_.append(_records(run), epoch, now, ATTR_MSG_IDS if with_ids else 0)
            except RecordTooLarge:
                if encoded is not None:
                    rejected.append((run[0], api_pb2.Ack.TOO_LARGE))
                else:  # header overhead pushed one over the limit: write these one by one
                    written.extend(self._append_one_by_one(run, rejected, now))
                continue
            except InvalidBatch:
                rejected.append((run[0], api_pb2.Ack.UNKNOWN))  # checked on arrival: cannot happen
                continue
            except EncryptionError as exc:  # no master key here: every run fails alike, the log is untouched
                self.encryption_failed(exc)
                rejected.extend((item, api_pb2.Ack.ENCRYPTION) for later in runs[i:] for item in later)
                break
            except (StorageError, OSError) as exc:
                self.write_failed(exc)
                rejected.extend((item, api_pb2.Ack.UNKNOWN) for later in runs[i:] for item in later)
                break
            self.write_succeeded()
            self.messages_in += log_.log_end_offset - start
            self.bytes_in += log_.last_append_bytes
            offset = start
            for item in run:
                offset += _count(item)
                written.append((item, offset - 1))
        return written

    def _append_one_by_one(
        self, items: list[Incoming], rejected: list[tuple[Incoming, int]], now: int
    ) -> list[tuple[Incoming, int]]:
        assert self.log is not None
        written: list[tuple[Incoming, int]] = []
        for item in items:
            try:
                with_ids = bool(item.msg_ids or item.batch_id)
                self.log.append([item.record, *item.more], self._write_epoch, now, ATTR_MSG_IDS if with_ids else 0)
            except (RecordTooLarge, StorageError, OSError) as exc:
                if isinstance(exc, RecordTooLarge):
                    rejected.append((item, api_pb2.Ack.TOO_LARGE))
                elif isinstance(exc, EncryptionError):
                    self.encryption_failed(exc)
                    rejected.append((item, api_pb2.Ack.ENCRYPTION))
                else:
                    self.write_failed(exc)
                    rejected.append((item, api_pb2.Ack.UNKNOWN))
                continue
            self.write_succeeded()
            self.messages_in += 1 + len(item.more)
            self.bytes_in += self.log.last_append_bytes
            written.append((item, self.log.log_end_offset - 1))
        return written

    def _written(self, item: Incoming, offset: int, now: int) -> None:
        """Ack a written message now (LEADER) or once committed (ALL)."""
        if item.ack_inbox and item.ack_policy != api_pb2.NONE:
            ack = self._ack(item, offset, now)
            if item.ack_policy != api_pb2.LEADER:
                self._commit_waiters.append(ack)
            elif self.log is not None and self.log.unsynced:
                self._unsynced_acks.append(ack)
            else:
                self._ack_sink(ack)
                self._acked_now += 1

    # -- group commit ------------------------------------------------------

    def synced(self, error: OSError | None) -> None:
        """The group committer fsynced this log (or failed to, ``error``): ack and commit, or refuse."""
        log_ = self.log
        held, self._unsynced_acks = self._unsynced_acks, []
        if log_ is None:  # closed: close() synced first, so nothing is held
            return
        if error is None and not held and not log_.unsynced:
            return
        try:
            log_.finish_sync(error)
        except (StorageError, OSError) as exc:
            # The batches that waited were taken back off the log (or it fenced): none may be acked.
            self.write_failed(exc)
            for ack in held:
                ack.ackError = api_pb2.Ack.UNKNOWN
                ack.offset = -1
                self._ack_sink(ack)
            self._fail_waiters_from(log_.log_end_offset, f"the fsync of partition {self.stream}/{self.id} failed")
            return
        now = self._clock()
        if held and self.leader is not None and not self.leader.may_ack(self._monotonic()):
            # Written and fsynced, but a successor may be acknowledging by now: it stays unacknowledged.
            self._lease_lapsed(len(held), "LEADER acks not sent")
            held = []
        for ack in held:
            self._ack_sink(ack)
        if held:
            self._ack_latency[api_pb2.LEADER].observe((now - held[0].receptionTimestamp) / 1e9, len(held))
        self._log_grew(now)

    def _sync_now(self) -> None:
        if self.log is not None and self.log.unsynced:
            error: OSError | None = None
            try:
                self.log.fsync_unsynced()
            except OSError as exc:
                error = exc
            self.synced(error)

    def _fail_waiters_from(self, offset: int, reason: str) -> None:
        """Ack-ALL messages at or past ``offset`` (no longer in the log) are told they failed."""
        self.duplicates.truncate(offset)  # those ids' records are gone: a retry must be stored again
        waiters = self._commit_waiters
        failed = 0
        gone = [ack for needed, ack in self._duplicate_waiters if needed >= offset]
        if gone:
            self._duplicate_waiters = [(n, ack) for n, ack in self._duplicate_waiters if n < offset]
        while waiters and waiters[-1].offset >= offset:
            gone.append(waiters.pop())
        for ack in gone:
            ack.ackError = api_pb2.Ack.UNKNOWN
            ack.offset = -1
            self._ack_sink(ack)
            failed += 1
        if failed:
            _limited.warning(
                "%s: %d ack-ALL messages not acknowledged: %s", self, failed, reason, key=f"{self}:unsynced"
            )

    # -- message ids -------------------------------------------------------

    @property
    def duplicate_ids_evicted(self) -> int:
        return self.duplicates.evicted

    def _remember_ids(self, written: list[tuple[Incoming, int]], now: int) -> None:
        """Add the ids of what was just written (at ``now``) to the duplicate window."""
        add = self.duplicates.add
        for item, last in written:
            ids = item.msg_ids
            if ids:
                first = last - len(ids) + 1
                for k, msg_id in enumerate(ids):
                    if msg_id:
                        add(msg_id, first + k, now)
            if item.batch_id:
                add(batch_key(item.batch_id), last - _count(item) + 1, now)

    def _written_screened(self, screened: list[Screened], written: list[tuple[Incoming, int]], now: int) -> None:
        """Ack what ``append`` screened for duplicates: the new as written, duplicates with their originals."""
        last_by_item = {id(item): last for item, last in written}
        last_offsets = {
            i: last_by_item[id(s.write)]
            for i, s in enumerate(screened)
            if s.write is not None and id(s.write) in last_by_item
        }
        for i, (s, offsets) in enumerate(zip(screened, record_offsets(screened, last_offsets), strict=True)):
            if offsets is None:  # all of it was new
                if i in last_offsets:
                    assert s.write is not None
                    self._written(s.write, last_offsets[i], now)
                continue
            if s.write is not None and i not in last_offsets:
                continue  # its new records were refused: _refused answers it
            assert s.places is not None
            duplicates = [k for k, place in enumerate(s.places) if place[0] != "new"]
            self.duplicates_acked += len(duplicates)
            item = s.received
            if not item.ack_inbox or item.ack_policy == api_pb2.NONE:
                continue
            if -1 in offsets:  # a duplicate of a record of this append that was not written after all
                self._refused(item, api_pb2.Ack.UNKNOWN, now)
                continue
            ack = self._ack(item, offsets[-1], now)
            ack.duplicate = s.write is None
            if len(offsets) > 1:
                ack.recordOffsets.extend(offsets)
                ack.duplicateRecords.extend(duplicates)
            self._ack_once_kept(ack, max(offsets))

    def _ack_once_kept(self, ack: api_pb2.Ack, needed: int) -> None:
        """Send ``ack`` once what its policy promises holds up to offset ``needed``: in the leader's log
        (durable, under group commit) for LEADER, committed for ALL."""
        log_ = self.log
        assert log_ is not None
        if ack.ackPolicy == api_pb2.LEADER:
            if log_.unsynced and needed >= log_.durable_end:
                self._unsynced_acks.append(ack)
            else:
                self._ack_sink(ack)
        elif needed <= log_.high_watermark:
            ack.commitTimestamp = self._clock()
            self._ack_sink(ack)
        else:
            self._duplicate_waiters.append((needed, ack))

    def rebuild_duplicates(self, now: int) -> None:
        """Load the ids of the records still within the duplicate window from the log (a new leader)."""
        window = self.duplicates
        window.clear()
        if not window.enabled or self.log is None:
            return
        log_ = self.log
        try:
            start = log_.offset_for_timestamp(now - window.window_ns)
            if start is None:
                return
            for data, header in log_.read_batches(start):
                if header.attributes & ATTR_MSG_IDS:  # no other batch holds an id
                    for record in decode_records(data, header, start):
                        msg_id = record.headers.get(MSG_ID_HEADER) or record.headers.get(HIDDEN_MSG_ID_HEADER)
                        if msg_id:
                            window.add(bytes(msg_id), record.offset, record.timestamp)
                        batch_id = record.headers.get(BATCH_ID_HEADER)
                        if batch_id and record.offset == header.base_offset:
                            window.add(batch_key(bytes(batch_id)), record.offset, record.timestamp)
        except (EncryptionError, StorageError, OSError) as exc:
            # Leading matters more than the window: an encrypted log without its master key, or a log that
            # cannot be read, still leads (its readers and writers get the specific errors); only retries of
            # what it stored before are not recognized.
            window.clear()
            log.warning(
                "%s: cannot rebuild the duplicate window from the log, message ids are not checked "
                "against what it stored before: %s",
                self,
                exc,
            )

    def _refused(self, item: Incoming, error: int, now: int) -> None:
        if item.ack_inbox:
            ack = self._ack(item, -1, now)
            ack.ackError = error  # type: ignore[assignment]
            self._ack_sink(ack)

    def write_failed(self, exc: Exception) -> None:
        # Nothing of the batch is acknowledged; publishers get an error ack and may retry.
        self.write_error = f"cannot write to partition {self.stream}/{self.id}: {exc}"
        if isinstance(exc, LogFenced):
            if self.fenced is None:
                self.fenced = str(exc)
                log.error("partition %s/%d is fenced: %s", self.stream, self.id, exc)
                if self.leader is not None and self._on_fenced is not None:
                    self._on_fenced(self)
        else:
            log.error("%s", self.write_error)

    def encryption_failed(self, exc: EncryptionError) -> None:
        self.write_error = f"cannot write to partition {self.stream}/{self.id}: {exc}"
        _limited.error("%s", self.write_error, key=f"{self}:encryption")

    def write_succeeded(self) -> None:
        self.write_error = None
        if self.fenced is not None and self.log is not None and self.log.fenced is None:
            log.warning("partition %s/%d takes writes again (it was fenced: %s)", self.stream, self.id, self.fenced)
            self.fenced = None

    def try_repair(self) -> None:
        """A fenced log retries its repair (writes do too; this covers a partition nobody writes to).

        Not under a follower core: a repair can move the log end, and the core would fetch from where it
        thought the log ended (the replicator repairs before it starts a core).
        """
        if self.follower is not None:
            return
        if self.fenced is not None and self.log is not None and self.log.fenced is not None and self.log.repair():
            self.write_succeeded()

    def _ack(self, item: Incoming, offset: int, now: int) -> api_pb2.Ack:
        return api_pb2.Ack(
            stream=self.stream,
            partitionSubject=self.subject,
            msgSubject=item.subject,
            offset=offset,
            ackInbox=item.ack_inbox,
            correlationId=item.correlation_id,
            ackPolicy=item.ack_policy,  # type: ignore[arg-type]
            receptionTimestamp=now,
        )

    def checkpoint_high_watermark(self) -> None:
        """Write the HW to the log's checkpoint if it moved since the last time (a restart resumes from it)."""
        if self.log is not None and self.log.high_watermark != self._checkpointed_hw:
            self.log.checkpoint_high_watermark()
            self._checkpointed_hw = self.log.high_watermark

    def set_high_watermark(self, offset: int) -> None:
        """Commit up to ``offset``: send ALL acks it covers and wake readers."""
        assert self.log is not None
        self.log.set_high_watermark(offset)
        waiters = self._commit_waiters
        if waiters:
            now = self._clock()
            received, count = 0, 0
            latency = self._ack_latency[api_pb2.ALL]
            while waiters and waiters[0].offset <= offset:
                ack = waiters.popleft()
                ack.commitTimestamp = now
                self._ack_sink(ack)
                # Acks of one batch share their reception time: one observation per batch.
                if ack.receptionTimestamp != received:
                    if count:
                        latency.observe((now - received) / 1e9, count)
                    received, count = ack.receptionTimestamp, 0
                count += 1
            if count:
                latency.observe((now - received) / 1e9, count)
        if self._duplicate_waiters:
            now = self._clock()
            waiting: list[tuple[int, api_pb2.Ack]] = []
            for needed, ack in self._duplicate_waiters:
                if needed <= offset:
                    ack.commitTimestamp = now
                    self._ack_sink(ack)
                else:
                    waiting.append((needed, ack))
            self._duplicate_waiters = waiting
        self.wake_readers()

    # -- readers ---------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark if self.log is not None else self._closed_hw

    @property
    def newest_offset(self) -> int:
        return self.log.newest_offset if self.log is not None else self._closed_newest

    @property
    def accepting(self) -> bool:
        """Open and taking writes: listening on NATS, or locally for a servers' own stream (not paused, not
        readonly)."""
        return self._sub is not None or self._local_intake

    def wake_readers(self) -> None:
        waiter, self._data_waiter = self._data_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self.appended()

    def appended(self) -> None:
        """Wake readers of uncommitted data: the log grew (or the partition changed state)."""
        waiter, self._append_waiter = self._append_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def wait_for_append(self) -> Awaitable[None]:
        """Like ``wait_for_data``, but completes when the log grows, committed or not."""
        if self._append_waiter is None or self._append_waiter.done():
            self._append_waiter = asyncio.get_running_loop().create_future()
        return asyncio.shield(self._append_waiter)

    def wait_for_data(self) -> Awaitable[None]:
        """A future that completes at the next commit (or when the partition closes).

        Callers re-check ``high_watermark`` and ``is_open`` afterwards. One
        future is shared by every reader, so a commit costs one wake-up however
        many subscribers there are.
        """
        if self._data_waiter is None or self._data_waiter.done():
            self._data_waiter = asyncio.get_running_loop().create_future()
        return asyncio.shield(self._data_waiter)

    @property
    def closed_reason(self) -> str | None:
        return self._closed_reason

    def idle_for(self, now: int) -> int:
        return now - self.last_activity

    def __repr__(self) -> str:
        return f"<Partition {self.stream}/{self.id} subject={self.subject!r}>"


def _size(item: Incoming) -> int:
    """Roughly the bytes an item holds, to bound what a lapsed leader keeps."""
    if item.encoded is not None:
        return len(item.encoded.data)
    return record_size(item.record) + sum(record_size(r) for r in item.more)


#: The ack error of each admission refusal (UNKNOWN: the client may retry; the publish was not written).
_ACK_ERROR = {
    Refusal.WRONG_OFFSET: api_pb2.Ack.INCORRECT_OFFSET,
    Refusal.TOO_LARGE: api_pb2.Ack.TOO_LARGE,
    Refusal.TOO_FEW_IN_SYNC: api_pb2.Ack.UNKNOWN,
    Refusal.UNACKED_OCC: api_pb2.Ack.UNKNOWN,  # checked by the RPC, before a message gets here
}


def _payload(item: Incoming) -> int:
    """The largest value among an item's records (a longer key or headers fail the encoding instead)."""
    if item.encoded is not None:
        return item.encoded.info.largest_payload
    size = len(item.record.value)
    if item.more:
        return max(size, *(len(r.value) for r in item.more))
    return size


def _count(item: Incoming) -> int:
    """How many records (offsets) an item takes."""
    return item.encoded.record_count if item.encoded is not None else 1 + len(item.more)


def _runs(items: list[Incoming]) -> list[list[Incoming]]:
    """``items`` cut into what is written as one batch each: runs of messages, and each encoded batch alone."""
    runs: list[list[Incoming]] = []
    run: list[Incoming] = []
    for item in items:
        if item.encoded is None:
            run.append(item)
            continue
        if run:
            runs.append(run)
            run = []
        runs.append([item])
    if run:
        runs.append(run)
    return runs


def _records(items: list[Incoming]) -> list[NewRecord]:
    """The records of ``items``, a batch's all in a row."""
    if not any(item.more for item in items):
        return [item.record for item in items]
    out: list[NewRecord] = []
    for item in items:
        out.append(item.record)
        out.extend(item.more)
    return out
