"""The streams this server hosts: metadata changes and the partitions they open and close.

Every change follows the same order: validate, persist the new metadata,
then act on partitions (open a log, subscribe, drain, close), so a crash
between the two leaves metadata that the next start simply re-applies.
Changes are serialised by one lock; reads and publishes do not take it.

Partition data lives in ``<data dir>/streams/<stream>/<partition>/``.

Event-loop only, not thread-safe.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from liftlog.metadata import (
    CreateStream,
    DeleteStream,
    InvalidStreamError,
    Metadata,
    MetadataFile,
    NoSuchPartitionError,
    Operation,
    PartitionMeta,
    PlacementError,
    ServerInfo,
    SetPaused,
    SetReadonly,
    StreamMeta,
    StreamSettings,
    partition_subject,
    place_partitions,
    validate_stream_name,
    validate_subject,
)
from liftlog.server.config import StreamsConfig
from liftlog.storage import LogConfig

from .partition import AckSink, Partition, PartitionOptions

__all__ = ["StreamManager"]

log = logging.getLogger(__name__)


class StreamManager:
    def __init__(
        self,
        *,
        server_id: str,
        data_dir: Path,
        defaults: StreamsConfig,
        batch_max: int,
        ack_sink: AckSink,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.server_id = server_id
        self._dir = data_dir / "streams"
        self._file = MetadataFile(data_dir / "metadata.json")
        self._defaults = defaults
        self._batch_max = batch_max
        self._ack_sink = ack_sink
        self._clock = clock
        self._lock = asyncio.Lock()
        self._nats: Any = None
        self.metadata = Metadata()
        self.partitions: dict[tuple[str, int], Partition] = {}

    # -- lifecycle -------------------------------------------------------

    async def start(self, nats: Any) -> None:
        """Load the metadata and reopen every partition that is not paused."""
        self._nats = nats
        self._dir.mkdir(parents=True, exist_ok=True)
        self.metadata = self._file.load()
        for stream in self.metadata.streams.values():
            for meta in stream.partitions.values():
                part = self._new_partition(stream, meta)
                self.partitions[(stream.name, meta.id)] = part
                if meta.paused:
                    # Opened once so a paused partition reports its offsets in metadata.
                    await asyncio.to_thread(part.open_log)
                    await part.close(f"partition {stream.name}/{meta.id} is paused")
                else:
                    await self._open(part)
        log.info("hosting %d streams, %d partitions", len(self.metadata.streams), len(self.partitions))

    async def stop(self) -> None:
        """Drain every partition's intake and close its log."""
        # Stop all intake first so nothing new arrives while logs close.
        await asyncio.gather(*(p.stop_intake() for p in self.partitions.values()), return_exceptions=True)
        for part in self.partitions.values():
            try:
                await part.close("the server is shutting down")
            except Exception:
                log.exception("closing %s", part)

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

    # -- changes ---------------------------------------------------------

    async def create_stream(
        self,
        name: str,
        subject: str,
        *,
        group: str = "",
        partitions: int = 1,
        replication_factor: int = 1,
        settings: StreamSettings | None = None,
    ) -> StreamMeta:
        validate_stream_name(name)
        validate_subject(subject)
        if partitions < 0:
            raise InvalidStreamError(f"partitions must be positive, got {partitions}")
        partitions = partitions or 1
        if partitions > 1 and subject.endswith(">"):
            raise InvalidStreamError(
                f"subject {subject!r} ends with '>', so partition subjects ({subject}.1 ...) would not be valid; "
                "use one partition or a subject without '>'"
            )
        try:
            # A request that leaves replicationFactor unset (0) means one replica.
            placement = place_partitions(
                [ServerInfo(self.server_id)],
                partitions,
                replication_factor or 1,
                leader_counts=Counter(p.meta.leader for p in self.partitions.values()),
            )
        except PlacementError as exc:
            raise InvalidStreamError(str(exc)) from exc
        settings = settings or StreamSettings()
        self._log_config(settings)  # reject bad settings before anything is written
        now = self._clock()
        stream = StreamMeta(name=name, subject=subject, group=group, creation_timestamp=now, settings=settings)
        for i, replicas in enumerate(placement):
            stream.partitions[i] = PartitionMeta(
                stream=name,
                id=i,
                subject=partition_subject(subject, i),
                leader=replicas[0],
                replicas=list(replicas),
                isr=list(replicas),
            )
        async with self._lock:
            self._apply(CreateStream(stream))
            stream_dir = self._dir / name
            if stream_dir.exists():  # left over by a deletion that crashed half-way
                await asyncio.to_thread(shutil.rmtree, stream_dir)
            for meta in stream.partitions.values():
                part = self._new_partition(stream, meta)
                self.partitions[(name, meta.id)] = part
                await self._open(part)
        log.info("created stream %r on %r with %d partitions", name, subject, partitions)
        return stream

    async def delete_stream(self, name: str) -> None:
        async with self._lock:
            removed = self._apply(DeleteStream(name))
            for meta in removed:
                part = self.partitions.pop((name, meta.id), None)
                if part is not None:
                    await part.close(f"stream {name!r} was deleted")
            await asyncio.to_thread(shutil.rmtree, self._dir / name, True)
        log.info("deleted stream %r", name)

    async def pause(self, name: str, partitions: tuple[int, ...] = (), resume_all: bool = False) -> None:
        async with self._lock:
            changed = self._apply(SetPaused(name, partitions, True, self._clock(), resume_all))
            for meta in changed:
                await self.partitions[(name, meta.id)].close(f"partition {name}/{meta.id} was paused")
        if changed:
            log.info("paused %s", ", ".join(f"{name}/{m.id}" for m in changed))

    async def resume(self, name: str, partition: int) -> None:
        """Resume a paused partition (all of the stream's with resumeAll); no-op when not paused."""
        if not self.metadata.partition(name, partition).paused:
            return
        async with self._lock:
            changed = self._apply(SetPaused(name, (partition,), False, self._clock()))
            for meta in changed:
                await self._open(self.partitions[(name, meta.id)])
        if changed:
            log.info("resumed %s", ", ".join(f"{name}/{m.id}" for m in changed))

    async def set_readonly(self, name: str, partitions: tuple[int, ...], readonly: bool) -> None:
        async with self._lock:
            changed = self._apply(SetReadonly(name, partitions, readonly, self._clock()))
            for meta in changed:
                part = self.partitions[(name, meta.id)]
                if not meta.paused:
                    if readonly:
                        await part.stop_intake()
                        part.wake_readers()
                    else:
                        await part.start_intake(self._nats)

    async def auto_pause(self) -> None:
        """Pause partitions that have been idle longer than their stream's auto-pause time."""
        now = self._clock()
        idle: dict[str, list[int]] = {}
        for part in self.partitions.values():
            opts = part.options
            if not opts.auto_pause_ns or not part.is_open or part.idle_for(now) < opts.auto_pause_ns:
                continue
            if part.subscribers and opts.auto_pause_disable_if_subscribers:
                continue
            idle.setdefault(part.stream, []).append(part.id)
        for name, ids in idle.items():
            log.info("auto-pausing %s (idle)", ", ".join(f"{name}/{i}" for i in ids))
            try:
                await self.pause(name, tuple(ids))
            except Exception as exc:  # deleted meanwhile
                log.debug("auto-pause of %s: %s", name, exc)

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

    def flush_due(self) -> None:
        for part in self.partitions.values():
            if part.log is not None:
                part.log.flush_if_due()

    # -- helpers ---------------------------------------------------------

    def _apply(self, op: Operation) -> list[PartitionMeta]:
        changed = self.metadata.apply(op)
        self._file.save(self.metadata)
        return changed

    async def _open(self, part: Partition) -> None:
        await asyncio.to_thread(part.open_log)
        if not part.meta.readonly:
            await part.start_intake(self._nats)

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
        )
        return Partition(
            meta,
            directory=self._dir / stream.name / str(meta.id),
            options=options,
            queue_group=stream.group,
            ack_sink=self._ack_sink,
            clock=self._clock,
        )

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
