"""Which replica here may serve a read of a partition, and what to tell a client when none may."""

from __future__ import annotations

from liftlog.api.errors import NOT_LEADER_MESSAGE, Reason
from liftlog.metadata import MetadataError
from liftlog.rpc import StatusCode as Code
from liftlog.server.api.failures import RpcFailure, failure_from
from liftlog.server.control.cluster import MetadataService
from liftlog.server.partitions.partition import Partition
from liftlog.server.partitions.streams import StreamManager

__all__ = ["PartitionReads"]


class PartitionReads:
    def __init__(self, *, server_id: str, streams: StreamManager, cluster: MetadataService) -> None:
        self.server_id = server_id
        self._streams = streams
        self._cluster = cluster

    async def readable(self, stream: str, partition: int, *, resume: bool, allow_replica: bool) -> Partition:
        """The replica here that may serve reads of a partition (resuming it first if asked to).

        Raises RpcFailure: NOT_FOUND, PAUSED (paused and not ``resume``), NOT_LEADER, UNAVAILABLE.
        """
        try:
            meta = self._streams.metadata.partition(stream, partition)
            if meta.paused:
                if not resume:
                    raise RpcFailure(
                        Code.FAILED_PRECONDITION,
                        Reason.PAUSED,
                        f"partition {stream}/{partition} is paused; subscribe with resume to resume it",
                    )
                await self._cluster.resume(stream, partition)
            return self.hosted(stream, partition, allow_replica=allow_replica)
        except MetadataError as exc:
            raise failure_from(exc) from exc

    def gone(self, stream: str, partition: int, reason: str) -> RpcFailure:
        """Why a read that was being served ended: the stream deleted, the partition paused, or ``reason``."""
        try:
            meta = self._streams.metadata.partition(stream, partition)
        except MetadataError:
            return RpcFailure(Code.NOT_FOUND, Reason.STREAM_DELETED, f"stream {stream!r} was deleted")
        if meta.paused:
            return RpcFailure(Code.FAILED_PRECONDITION, Reason.PAUSED, f"partition {stream}/{partition} was paused")
        return RpcFailure(Code.UNAVAILABLE, Reason.UNAVAILABLE, reason)

    def hosted(self, stream: str, partition: int, allow_replica: bool = False) -> Partition:
        """This server's replica of a partition it leads (or, with ``allow_replica``, is in the ISR of).

        Raises NoSuchStream/NoSuchPartition for unknown ones, RpcFailure NOT_LEADER otherwise.
        """
        meta = self._streams.metadata.partition(stream, partition)
        part = self._streams.partitions.get((stream, partition))
        if part is not None and part.log is None and part.fenced is not None:
            # Not NOT_LEADER: clients would re-route to this same server until their deadline.
            raise self.unavailable(part)
        # Named leader is not enough: right after a restart or mid-election this server has not taken up
        # the leadership, and its HW may be behind what the partition committed.
        leading = self._streams.is_leading(stream, partition)
        if part is None or not (leading or (allow_replica and self.server_id in meta.isr)):
            raise RpcFailure(Code.FAILED_PRECONDITION, Reason.NOT_LEADER, NOT_LEADER_MESSAGE)
        return part

    def unavailable(self, part: Partition) -> RpcFailure:
        """UNAVAILABLE for a replica that is fenced here (a storage fault), naming the fault."""
        return RpcFailure(
            Code.UNAVAILABLE,
            Reason.UNAVAILABLE,
            f"partition {part.stream}/{part.id} is unavailable on server {self.server_id}: {part.fenced}",
        )
