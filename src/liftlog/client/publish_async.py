"""The machinery behind :meth:`Client.publish_many <liftlog.client.Client.publish_many>`: windowed PublishAsync.

A :class:`PublishBatch` holds what one ``publish_many`` has read from its
input and the requests still waiting for their ack. :func:`publish_async_attempt`
runs one ``PublishAsync`` call for it: a writer task sends the unacknowledged
requests again, then the rest of the input, at most a window ahead of the
acks, while the attempt reads the acks and a watchdog task cancels the call
when nothing moves for the timeout. When an attempt fails with
:class:`NotLeaderError` or :class:`UnavailableError` the client runs another
with the same batch on the (new) leader. A write that fails because the
server ended the call raises ``asyncio.InvalidStateError``; the reader then
reports the server's status.

A :class:`PublishBatch` belongs to one ``publish_many`` call, whose attempts
run one after another; it is not to be shared with other tasks (each attempt
shares it only with the writer task it starts and waits for).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping
from typing import Any

from liftlog.api import api_pb2
from liftlog.client.errors import (
    AckTimeoutError,
    NotLeaderError,
    UnavailableError,
    error_from_async_error,
    error_from_rpc,
)
from liftlog.client.nats_helpers import to_bytes, to_headers
from liftlog.client.stubs import EOF, Stub, being_cancelled
from liftlog.client.types import Ack, AckPolicy, OutgoingMessage, PublishValue
from liftlog.rpc import RpcError
from liftlog.storage.records import NewRecord

__all__ = ["PublishBatch", "publish_async_attempt"]


def _task_error(task: asyncio.Task[object]) -> BaseException | None:
    """The exception `task` ended with, if it is done and neither succeeded nor was cancelled."""
    if not task.done() or task.cancelled():
        return None
    return task.exception()


class PublishBatch:
    """What one ``publish_many`` has read from its input and what is still unacknowledged.

    It outlives a failed PublishAsync call: a retry resends ``pending``, then
    goes on reading the input.
    """

    __slots__ = ("acks", "async_values", "count", "exhausted", "pending", "prefix", "sync_values", "template")

    def __init__(
        self,
        values: Iterable[PublishValue] | AsyncIterable[PublishValue],
        *,
        stream: str,
        partition: int,
        key: bytes | str | None,
        headers: Mapping[str, bytes | str] | None,
        ack_policy: AckPolicy,
    ) -> None:
        # PublishRequest fields shared by every message
        self.template: dict[str, Any] = {"stream": stream, "partition": partition, "ackPolicy": int(ack_policy)}
        if key is not None:
            self.template["key"] = to_bytes(key)
        if headers:
            self.template["headers"] = to_headers(headers)
        self.sync_values: Iterator[PublishValue] | None = None
        self.async_values: AsyncIterator[PublishValue] | None = None
        if isinstance(values, AsyncIterable):
            self.async_values = aiter(values)
        else:
            self.sync_values = iter(values)
        self.prefix = f"{secrets.token_hex(6)}-"
        self.count = 0  # messages taken from the input
        self.exhausted = False
        self.acks: list[Ack | None] = []  # by input index (only when acks are wanted)
        # correlation id -> (input index, request) until acknowledged (only when acks are wanted)
        self.pending: dict[str, tuple[int, api_pb2.PublishRequest]] | None = (
            {} if ack_policy != AckPolicy.NONE else None
        )


async def publish_async_attempt(stub: Stub, batch: PublishBatch, window_size: int, timeout: float) -> None:
    """One PublishAsync call: send what is pending then the rest of the input, collect acks.

    Returns once every message of the input is sent and, when acks are
    wanted, acknowledged, with the acks in ``batch.acks``. Raises the
    :class:`PublishAsyncFailed` of the first refused message,
    :class:`AckTimeoutError` when nothing moves for `timeout` seconds,
    :class:`UnavailableError` when the server ends the call early, the error
    the call failed with, or the error of the caller's iterable.
    """
    await _Attempt(stub, batch, window_size, timeout).run()


class _Attempt:
    """One PublishAsync call and what its three tasks share: the reader (``run``), the writer, the watchdog.

    State, all of it here: ``stop`` (the reader is done: the writer must not send more), ``in_source``
    (the writer waits on the caller's async iterable), ``in_write`` (a request is being written),
    ``writer_done`` (every request written and the call half-closed), ``progress`` (requests written
    plus responses read, which the watchdog watches), ``timed_out`` (the watchdog gave up) and
    ``all_acked`` (every request written and acknowledged: nothing left to wait for, not even the
    server's end of the call, which Liftbridge sometimes sends only seconds later).
    """

    def __init__(self, stub: Stub, batch: PublishBatch, window_size: int, timeout: float) -> None:
        self.stub = stub
        self.batch = batch
        self.timeout = timeout
        self.call = stub.publish_async()
        self.window = asyncio.Semaphore(window_size) if batch.pending is not None else None
        self.stop = False
        self.in_source = False
        self.in_write = False
        self.writer_done = False
        self.progress = 0
        self.timed_out = False
        self.all_acked = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        batch, call, window = self.batch, self.call, self.window
        pending, acks = batch.pending, batch.acks
        writer = loop.create_task(self._write_all())
        writer.add_done_callback(self._writer_ended)
        dog = loop.create_task(self._watchdog())
        failure: BaseException | None = None
        try:
            read = call.read
            while True:
                resp = await read()
                if resp is EOF:
                    break
                self.progress += 1
                if window is not None:
                    window.release()
                corr = resp.correlationId
                if resp.HasField("asyncError"):
                    if pending is not None:
                        pending.pop(corr, None)
                    raise error_from_async_error(resp.asyncError, corr, [a for a in acks if a is not None])
                if pending is not None:
                    entry = pending.pop(corr, None)
                    if entry is not None:
                        acks[entry[0]] = Ack.from_proto(resp.ack)
                    if not pending and self.writer_done:
                        break  # every ack is in: the server's end of the call adds nothing
            # The server completed the call: normally after our half-close, with every ack sent.
            self.stop = True
            if window is not None:
                window.release()  # wake a writer waiting for room; it sees `stop`
            if not self.in_source:
                await asyncio.wait([writer])
            writer_error = _task_error(writer)
            if writer_error is not None:
                raise writer_error
            if pending:
                raise UnavailableError(f"the server ended PublishAsync with {len(pending)} messages unacknowledged")
            if not batch.exhausted:
                raise UnavailableError(f"the server ended PublishAsync after {batch.count} messages, before the last")
        except RpcError as exc:
            failure = error_from_rpc(exc, timeout_error=AckTimeoutError)
            raise failure from exc
        except asyncio.CancelledError:
            if being_cancelled():
                raise
            writer_error = _task_error(writer)
            if writer_error is not None:
                failure = writer_error
                raise writer_error from None
            if self.timed_out or self.all_acked:
                if self.writer_done and not pending:
                    return  # everything sent and acknowledged; the server just did not end the call
                failure = AckTimeoutError(
                    f"no progress on PublishAsync to {self.stub.address} for {self.timeout:g} s "
                    f"({len(pending) if pending is not None else 0} messages unacknowledged)"
                )
                raise failure from None
            raise
        except BaseException as exc:
            failure = exc
            raise
        finally:
            self.stop = True
            dog.cancel()
            if not writer.done():
                if self.in_source and isinstance(failure, (NotLeaderError, UnavailableError)) and pending is not None:
                    # Let the caller's async iterable hand over its item (kept in pending for the retry)
                    # rather than cancelling it half-way.
                    if window is not None:
                        window.release()
                    await asyncio.wait([writer])
                else:
                    writer.cancel()
                    await asyncio.wait([writer])
            if not call.done():
                call.cancel()
            await asyncio.wait([dog])

    async def _write_all(self) -> None:
        """Send the requests still unacknowledged from an earlier attempt, then the rest of the input."""
        batch, window = self.batch, self.window
        pending = batch.pending
        try:
            if pending:
                for _, req in sorted(pending.values(), key=lambda entry: entry[0]):
                    if window is not None:
                        await window.acquire()
                    if self.stop:
                        return
                    await self._write(req)
            while not batch.exhausted:
                if window is not None:
                    await window.acquire()
                if self.stop:
                    return
                fresh = await self._next_request()
                if fresh is None:
                    break
                await self._write(fresh)
            await self.call.done_writing()
            self.writer_done = True
            if pending is not None and not pending and not self.stop:
                self.all_acked = True  # the last ack came before this: wake the reader
                self.call.cancel()
        except (RpcError, asyncio.InvalidStateError):
            return  # the call ended; the reader reports why

    async def _write(self, req: api_pb2.PublishRequest) -> None:
        self.in_write = True
        await self.call.write(req)
        self.in_write = False
        self.progress += 1

    async def _next_request(self) -> api_pb2.PublishRequest | None:
        """The next input value as a request (kept in ``pending`` when acks are wanted); None at the end."""
        batch = self.batch
        try:
            if batch.sync_values is not None:
                value = next(batch.sync_values)
            else:
                assert batch.async_values is not None
                self.in_source = True
                try:
                    value = await anext(batch.async_values)
                finally:
                    self.in_source = False
        except (StopIteration, StopAsyncIteration):
            batch.exhausted = True
            return None
        index = batch.count
        batch.count = index + 1
        corr = batch.prefix + str(index)
        if isinstance(value, (OutgoingMessage, NewRecord)):
            req = api_pb2.PublishRequest(value=to_bytes(value.value), correlationId=corr, **batch.template)
            if value.key is not None:
                req.key = to_bytes(value.key)
            if value.headers:
                req.headers.clear()
                # A record's header values are bytes already; a message's may be str.
                req.headers.update(value.headers if isinstance(value, NewRecord) else to_headers(value.headers))
        else:
            if isinstance(value, str):
                value = value.encode()
            req = api_pb2.PublishRequest(value=value, correlationId=corr, **batch.template)
        if batch.pending is not None:
            batch.acks.append(None)
            batch.pending[corr] = (index, req)
        return req

    def _writer_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.call.cancel()  # the caller's iterable failed: stop the reader, which re-raises it

    async def _watchdog(self) -> None:
        """Cancel the call when nothing moved for the timeout while something was owed."""
        loop = asyncio.get_running_loop()
        last = -1
        since = loop.time()
        period = min(max(self.timeout / 4, 0.005), 1.0)
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            waiting = bool(self.batch.pending) or self.writer_done or self.in_write
            if self.progress != last or not waiting:
                last = self.progress
                since = now
            elif now - since >= self.timeout:
                self.timed_out = True
                self.call.cancel()
                return
