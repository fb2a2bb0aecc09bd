"""Every partition of a stream as one subscription, merged by time (``Client.subscribe_all``).

Each partition has its own :class:`~liftlog.client.subscription.Subscription` and a task that reads it
into a small queue. The next message is the earliest (by the server's receive timestamp, then by
partition) among the partitions' next messages, but only once every partition that still has
messages to deliver has shown its next one:

- with a stop position, every partition until it ends: the whole read comes out in time order;
- following (``STOP_ON_CANCEL``), every partition until it has delivered what it held when the
  subscription started (its high watermark then), or has shown nothing for ``PATIENCE`` (it started
  past that, at a time or an offset): the backlog comes out in time order, and after that messages
  come as they arrive, so an idle partition never holds the others back.

Within a partition the order is always the log's.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .errors import NoSuchPartitionError, NoSuchStreamError
from .types import Message, StopPosition

if TYPE_CHECKING:
    from .client import Client
    from .subscription import Subscription

__all__ = ["MergedSubscription"]

#: Messages read ahead per partition while the merge waits for another partition.
READ_AHEAD = 1000
#: Following, how long a partition with nothing to show may hold the others back (seconds).
PATIENCE = 0.25


class MergedSubscription:
    """An async iterator of the messages of a stream's partitions, merged by timestamp.

    Made by :meth:`Client.subscribe_all`. Starting it (``async with``, :meth:`started` or the first
    message) finds the stream's partitions and starts a subscription on each; ``backlog`` says that
    they start at or before their high watermark, whose messages a following merge keeps in time order.
    """

    def __init__(
        self,
        client: Client,
        stream: str,
        partitions: Sequence[int] | None,
        subscribe: Callable[[int], Subscription],
        stop: StopPosition,
        *,
        backlog: bool,
    ) -> None:
        self._client = client
        self._stream = stream
        self._wanted = None if partitions is None else list(partitions)
        self._subscribe = subscribe
        self._follow = stop == StopPosition.STOP_ON_CANCEL
        self._backlog = backlog
        self._subs: list[Subscription] = []
        self._backlog_ends: list[int] = []
        self._last: list[int] = []
        self._heads: list[collections.deque[Message]] = []
        self._ended: list[bool] = []
        self._error: BaseException | None = None
        self._changed = asyncio.Event()
        self._room: list[asyncio.Event] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False

    @property
    def stream(self) -> str:
        return self._stream

    @property
    def partitions(self) -> list[int]:
        """The partitions read, once started."""
        return [s.partition for s in self._subs]

    async def started(self) -> None:
        """Find the partitions and start a subscription on each (a missing stream or partition raises here)."""
        if self._started:
            return
        self._started = True
        metadata = await self._client.fetch_metadata(self._stream)
        info = metadata.streams.get(self._stream)
        if info is None:
            raise NoSuchStreamError(f"no such stream: {self._stream!r}")
        chosen = sorted(info.partitions) if self._wanted is None else self._wanted
        for p in chosen:
            if p not in info.partitions:
                have = len(info.partitions)
                raise NoSuchPartitionError(f"stream {self._stream!r} has no partition {p} (it has {have})")
        self._subs = [self._subscribe(p) for p in chosen]
        self._backlog_ends = [info.partitions[p].high_watermark if self._backlog else -1 for p in chosen]
        self._last = [-1] * len(chosen)
        self._heads = [collections.deque() for _ in chosen]
        self._ended = [False] * len(chosen)
        self._room = [asyncio.Event() for _ in chosen]
        try:
            await asyncio.gather(*(s.started() for s in self._subs))
        except BaseException:
            await self.close()
            raise
        self._tasks = [asyncio.ensure_future(self._read(i)) for i in range(len(self._subs))]

    async def _read(self, i: int) -> None:
        heads, room = self._heads[i], self._room[i]
        try:
            async for msg in self._subs[i]:
                heads.append(msg)
                self._changed.set()
                while len(heads) >= READ_AHEAD:
                    room.clear()
                    await room.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._error = exc
        finally:
            self._ended[i] = True
            self._changed.set()

    def _holds_back(self, i: int) -> bool:
        """Whether partition ``i``, with nothing queued, may still have a message earlier than the others'."""
        if self._ended[i]:
            return False
        return not self._follow or self._last[i] < self._backlog_ends[i]

    def __aiter__(self) -> MergedSubscription:
        return self

    async def __anext__(self) -> Message:
        await self.started()
        heads = self._heads
        while True:
            waiting = False
            best = -1
            for i, queue in enumerate(heads):
                if queue:
                    if best < 0 or queue[0].timestamp < heads[best][0].timestamp:
                        best = i
                elif self._holds_back(i):
                    waiting = True
            if best >= 0 and not waiting:
                msg = heads[best].popleft()
                self._last[best] = msg.offset
                self._room[best].set()
                return msg
            if self._error is not None:
                raise self._error
            if best < 0 and all(self._ended):
                raise StopAsyncIteration
            self._changed.clear()
            if not (self._follow and best >= 0):
                await self._changed.wait()
                continue
            try:
                await asyncio.wait_for(self._changed.wait(), PATIENCE)
            except TimeoutError:  # the silent ones have no backlog to show (they started past it)
                for i, queue in enumerate(heads):
                    if not queue:
                        self._backlog_ends[i] = -1

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(s.close() for s in self._subs), return_exceptions=True)

    async def __aenter__(self) -> MergedSubscription:
        await self.started()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
