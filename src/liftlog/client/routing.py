"""Where the client's requests go: channels, the metadata cache, retries with backoff.

:class:`Routing` is the base class of :class:`~liftlog.client.Client` that
holds its connection settings and state: one :class:`~liftlog.client.stubs.Stub`
per server address, the broker addresses and stream metadata learned from
``FetchMetadata``, and the two retry loops every RPC goes through.
:meth:`Routing._call_any` sends a request to any server, failing over to the
next address when one is unavailable; :meth:`Routing.call_leader` sends a
partition request to the partition's leader, refreshing the metadata and
backing off (exponentially, with jitter) on :class:`NotLeaderError` and
:class:`UnavailableError`.

Like the client it is part of, it may be shared by the tasks of one event
loop: concurrent metadata refreshes of a stream share one request. Its
public methods (``call_leader``, ``check_open``, ``closed``) are what the
client's other modules (subscriptions, batched publishing) build on.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from liftlog.api import api_pb2
from liftlog.client.errors import (
    ClientClosedError,
    ConfigurationError,
    DeadlineExceededError,
    NoSuchPartitionError,
    NoSuchStreamError,
    NotLeaderError,
    PublishAsyncFailed,
    UnavailableError,
    error_from_rpc,
)
from liftlog.client.stubs import Stub, open_stub
from liftlog.client.tls import TlsOption, tls_context
from liftlog.client.types import Metadata, StreamInfo
from liftlog.rpc import RpcError

__all__ = ["Routing", "partition_for_key"]


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition of a keyed message: ``crc32(key) % partitions``, as the Liftbridge clients place it."""
    return zlib.crc32(key) % partitions if partitions > 1 else 0


T = TypeVar("T")


@dataclass(slots=True)
class _CachedStream:
    info: StreamInfo
    fetched_at: float  # loop time


class Routing:
    """The connection settings and routing state of a client; see the module docstring."""

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        timeout: float,
        retries: int,
        backoff: float,
        max_backoff: float,
        metadata_max_age: float,
        tls: TlsOption = None,
    ) -> None:
        if isinstance(addresses, str):
            addresses = [a.strip() for a in addresses.split(",")]
        self.addresses: tuple[str, ...] = tuple(a for a in addresses if a)
        if not self.addresses:
            raise ConfigurationError("no server address given")
        if retries < 0:
            raise ConfigurationError(f"retries must be >= 0, got {retries}")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.metadata_max_age = metadata_max_age
        self._ssl, self._server_name = tls_context(tls)
        self._stubs: dict[str, Stub] = {}
        self._brokers: dict[str, str] = {}  # broker id -> "host:port"
        self._streams: dict[str, _CachedStream] = {}
        self._refreshing: dict[str, asyncio.Task[Metadata]] = {}
        self._preferred: str | None = None  # the last address that answered a non-partition RPC
        self._closed = False

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran; every call then raises :class:`ClientClosedError`."""
        return self._closed

    def check_open(self) -> None:
        """Raise :class:`ClientClosedError` once the client is closed."""
        if self._closed:
            raise ClientClosedError("the client is closed")

    async def _close_channels(self) -> None:
        """Cancel metadata refreshes and close every channel (once ``_closed`` is set)."""
        for task in self._refreshing.values():
            task.cancel()
        stubs, self._stubs = list(self._stubs.values()), {}
        for stub in stubs:
            await stub.channel.close()

    def _stub(self, address: str) -> Stub:
        stub = self._stubs.get(address)
        if stub is None:
            self.check_open()
            stub = open_stub(address, self._ssl, self._server_name)
            self._stubs[address] = stub
        return stub

    async def _sleep_backoff(self, attempt: int) -> None:
        delay = min(self.max_backoff, self.backoff * (2**attempt))
        await asyncio.sleep(delay * random.uniform(0.8, 1.2))

    # ------------------------------------------------------------------ retry loops

    def _any_addresses(self) -> list[str]:
        """Seed addresses then known brokers, starting with the last one that answered."""
        addresses = list(self.addresses)
        for address in self._brokers.values():
            if address not in addresses:
                addresses.append(address)
        preferred = self._preferred
        if preferred is not None and preferred in addresses:
            i = addresses.index(preferred)
            addresses = addresses[i:] + addresses[:i]
        return addresses

    async def _call_any(
        self,
        method: str,
        request: object,
        *,
        timeout: float | None = None,
        timeout_error: type[DeadlineExceededError] = DeadlineExceededError,
    ) -> Any:
        """Call `method` on any server: the next address on UNAVAILABLE, `retries` more rounds with backoff."""
        self.check_open()
        deadline = self.timeout if timeout is None else timeout
        attempt = 0
        while True:
            last: UnavailableError | None = None
            for address in self._any_addresses():
                try:
                    result = await getattr(self._stub(address), method)(request, timeout=deadline)
                except RpcError as exc:
                    err = error_from_rpc(exc, timeout_error=timeout_error)
                    if not isinstance(err, UnavailableError):
                        raise err from exc
                    last = err
                    continue
                self._preferred = address
                return result
            assert last is not None
            if attempt >= self.retries:
                raise last
            await self._sleep_backoff(attempt)
            attempt += 1

    async def call_leader(
        self,
        stream: str,
        partition: int,
        fn: Callable[[Stub], Awaitable[T]],
        *,
        timeout_error: type[DeadlineExceededError] = DeadlineExceededError,
        isr: bool = False,
        retryable: Callable[[], bool] | None = None,
    ) -> T:
        """Run `fn` against the partition's leader (or an ISR replica), re-routing on failure.

        NotLeader and Unavailable: refresh metadata, back off, retry up to
        `retries` times. NoSuchStream/NoSuchPartition from a route that came
        from the cache: refresh and retry once. `retryable` can veto retries.
        """
        attempt = 0
        refresh = False
        retried_not_found = False
        while True:
            fresh = True  # a NotFound raised by _route comes from metadata just fetched
            routing = True
            try:
                address, fresh = await self._route(stream, partition, refresh=refresh, isr=isr)
                routing = False
                try:
                    return await fn(self._stub(address))
                except RpcError as exc:
                    raise error_from_rpc(exc, timeout_error=timeout_error) from exc
            except (NotLeaderError, UnavailableError) as err:
                if routing and err.code is not None:
                    raise  # no server answered FetchMetadata, even after _call_any's own retries
                if attempt >= self.retries or (retryable is not None and not retryable()):
                    raise
                await self._sleep_backoff(attempt)
                attempt += 1
                refresh = True
            except (NoSuchStreamError, NoSuchPartitionError) as err:
                if isinstance(err, PublishAsyncFailed) or fresh or retried_not_found:
                    raise
                if retryable is not None and not retryable():
                    raise
                retried_not_found = True
                refresh = True

    async def _route(self, stream: str, partition: int, *, refresh: bool, isr: bool = False) -> tuple[str, bool]:
        """The address serving `partition` of `stream`, and whether the metadata was just fetched."""
        fresh = False
        info = None if refresh else self._cached_stream(stream)
        if info is None or partition not in info.partitions:
            info = await self._refresh_stream(stream)
            fresh = True
        p = info.partitions.get(partition)
        if p is None:
            raise NoSuchPartitionError(f"no such partition: stream {stream!r} has no partition {partition}")
        broker_id = p.leader
        if isr:
            candidates = [b for b in p.isr if b in self._brokers]
            if candidates:
                broker_id = random.choice(candidates)
        if not broker_id:
            raise UnavailableError(f"partition {partition} of stream {stream!r} has no leader")
        address = self._brokers.get(broker_id)
        if address is None:
            raise UnavailableError(f"the leader {broker_id!r} of stream {stream!r} partition {partition} is unknown")
        return address, fresh

    # ------------------------------------------------------------------ metadata cache

    async def _fetch_metadata(self, *streams: str) -> Metadata:
        """``FetchMetadata`` from any server, refreshing the cache (all streams when none are given)."""
        req = api_pb2.FetchMetadataRequest(streams=list(streams))
        resp: api_pb2.FetchMetadataResponse = await self._call_any("fetch_metadata", req)
        md = Metadata.from_proto(resp)
        self._update_cache(md, all_streams=not streams)
        return md

    def _cached_stream(self, stream: str) -> StreamInfo | None:
        entry = self._streams.get(stream)
        if entry is None or asyncio.get_running_loop().time() - entry.fetched_at > self.metadata_max_age:
            return None
        return entry.info

    async def _refresh_stream(self, stream: str) -> StreamInfo:
        """Fetch the metadata of `stream` (one request for all callers asking at once)."""
        task = self._refreshing.get(stream)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._fetch_metadata(stream))
            self._refreshing[stream] = task
            task.add_done_callback(partial(self._refresh_done, stream))
        md = await asyncio.shield(task)
        info = md.streams.get(stream)
        if info is None:
            raise NoSuchStreamError(f"no such stream: {stream!r}")
        return info

    def _refresh_done(self, stream: str, task: asyncio.Task[Metadata]) -> None:
        if self._refreshing.get(stream) is task:
            del self._refreshing[stream]
        if not task.cancelled():
            task.exception()  # retrieved: every waiter got it, or none is left to care

    def _update_cache(self, md: Metadata, *, all_streams: bool) -> None:
        if md.brokers:
            self._brokers = {b.id: b.address for b in md.brokers}
        now = asyncio.get_running_loop().time()
        if all_streams:
            self._streams = {}
        for name, info in md.streams.items():
            self._streams[name] = _CachedStream(info, now)
        for name in md.unknown_streams:
            self._streams.pop(name, None)

    async def _partition_for_key(self, stream: str, key: bytes) -> int:
        if not key:
            return 0
        info = self._cached_stream(stream)
        if info is None:
            info = await self._refresh_stream(stream)
        return partition_for_key(key, len(info.partitions))
