"""PublishAsync's hold (sans NATS): with two of a call's batches unacknowledged, new requests wait, briefly;
and after its answers, when the loop is kept polling for the client's next request.

A fake API records what the handler publishes and lets the test decide when acks come, so the order of
events is the test's, not the scheduler's.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any

import pytest

from liftlog.api import api_pb2
from liftlog.api.batch_envelope import decode_record_batch
from liftlog.server.api import publish_async
from liftlog.server.api.api_service import ApiLimits
from liftlog.server.api.publisher import Publisher

pytestmark = pytest.mark.timeout(30)


class Requests:
    """The server's request queue as the handler sees it: ``items`` and ``next_batch``."""

    def __init__(self) -> None:
        self.items: deque[api_pb2.PublishRequest] = deque()
        self.ended = False
        self._waiter: asyncio.Future[None] | None = None

    def push(self, *requests: api_pb2.PublishRequest) -> None:
        self.items.extend(requests)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next_batch(self, limit: int) -> list[api_pb2.PublishRequest]:
        while not self.items:
            if self.ended:
                return []
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return [self.items.popleft() for _ in range(min(limit, len(self.items)))]


class Api:
    """What a PublishAsyncCall calls; every publish's size and ack future are kept."""

    limits = ApiLimits()
    max_message_bytes = 1 << 20
    server_id = "s1"

    def __init__(self) -> None:
        self.published: list[int] = []  # messages per NATS publish
        self.acks: list[asyncio.Future[api_pb2.Ack]] = []
        self.leader = "s1"  # of every partition
        self.kept_hot = 0  # expect_next_publish calls
        self.sent_now: list[int] = []  # publishes so far, at each send_publishes_now

    def expect_next_publish(self) -> None:
        self.kept_hot += 1

    def send_publishes_now(self) -> None:
        self.sent_now.append(len(self.published))

    def leads(self, meta: Any) -> bool:
        return bool(meta.leader == self.server_id)

    def nats_max_payload(self) -> int:
        return 1 << 20

    async def publishable(self, stream: str, partition: int, policy: int) -> tuple[Any, bool]:
        return SimpleNamespace(subject=stream, leader=self.leader), False

    def _future(self) -> asyncio.Future[api_pb2.Ack]:
        future: asyncio.Future[api_pb2.Ack] = asyncio.get_running_loop().create_future()
        self.acks.append(future)
        return future

    async def send_checked(self, req: api_pb2.PublishRequest, meta: Any, occ: bool) -> asyncio.Future[api_pb2.Ack]:
        self.published.append(1)
        return self._future()

    def expect_ack(
        self, subject: str, policy: int, stream: str | None, *, local: bool = False
    ) -> tuple[str, str, asyncio.Future[api_pb2.Ack]]:
        return "inbox", "cid", self._future()

    async def publish_payload(self, subject: str, payload: bytes, cid: str = "", led_here: bool = False) -> None:
        envelope = decode_record_batch(payload)
        assert envelope is not None
        self.published.append(envelope.count)

    async def until_acked(self, future: asyncio.Future[api_pb2.Ack], timeout: float | None) -> None:
        await future

    def answer(self, future: asyncio.Future[api_pb2.Ack], cid: str) -> bytes:
        return cid.encode()

    def ack_result(self, future: asyncio.Future[api_pb2.Ack]) -> api_pb2.Ack:
        return future.result()


class Context:
    def __init__(self) -> None:
        self.answers: list[bytes] = []

    async def write(self, answers: list[bytes]) -> None:
        self.answers += answers


def request(i: int) -> api_pb2.PublishRequest:
    return api_pb2.PublishRequest(stream="s", value=b"v%d" % i, correlationId=f"c{i}")


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def serve(api: Api, requests: Requests, context: Context) -> Coroutine[Any, Any, None]:
    """A PublishAsyncCall over the fakes, with the server's default limits, run."""
    limits = api.limits
    call = publish_async.PublishAsyncCall(
        api,  # type: ignore[arg-type]
        requests,  # type: ignore[arg-type]
        context,  # type: ignore[arg-type]
        max_inflight=limits.max_publish_inflight,
        coalesce=limits.coalesce_publishes,
    )
    return call.run()


async def test_requests_read_while_two_batches_are_unacked_wait_and_go_as_one() -> None:
    api, requests, context = Api(), Requests(), Context()
    call = asyncio.create_task(serve(api, requests, context))
    try:
        requests.push(request(0))
        await settle()
        requests.push(request(1))
        await settle()
        assert api.published == [1, 1], "nothing waits while fewer than two are unacknowledged"
        requests.push(request(2))
        await settle()
        requests.push(*(request(i) for i in range(3, 8)))  # they arrive during the hold
        await settle()
        assert api.published == [1, 1], "held while the oldest batch is unacknowledged"
        api.acks[0].set_result(api_pb2.Ack(offset=0))
        await settle()
        assert api.published == [1, 1, 6], "what arrived during the hold joined the held request"
    finally:
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)


async def test_the_hold_is_brief_when_no_ack_comes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publish_async, "HOLD_S", 0.05)
    api, requests, context = Api(), Requests(), Context()
    call = asyncio.create_task(serve(api, requests, context))
    try:
        for i in range(2):
            requests.push(request(i))
            await settle()
        requests.push(request(2))
        started = asyncio.get_running_loop().time()
        while len(api.published) < 3:
            assert asyncio.get_running_loop().time() - started < 2, "a lost ack must not stall the call"
            await asyncio.sleep(0.01)
        assert api.published == [1, 1, 1]
    finally:
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)


async def test_without_coalescing_nothing_is_held() -> None:
    api, requests, context = Api(), Requests(), Context()
    api.limits = ApiLimits(coalesce_publishes=False)
    call = asyncio.create_task(serve(api, requests, context))
    try:
        for i in range(4):
            requests.push(request(i))
            await settle()
        assert api.published == [1, 1, 1, 1]
    finally:
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)


@pytest.mark.parametrize(
    ("policy", "leader", "polls"),
    [(api_pb2.LEADER, "s1", True), (api_pb2.ALL, "s1", False), (api_pb2.LEADER, "s2", False)],
    ids=["ack-leader-led-here", "ack-all", "led-elsewhere"],
)
async def test_only_answers_a_leader_here_acked_keep_the_loop_polling_for_the_next_request(
    policy: int, leader: str, polls: bool
) -> None:
    api, requests, context = Api(), Requests(), Context()
    api.leader = leader
    call = asyncio.create_task(serve(api, requests, context))
    try:
        req = request(0)
        req.ackPolicy = policy  # type: ignore[assignment]
        requests.push(req)
        await settle()
        assert api.published == [1] and api.kept_hot == 0, "not before the answer"
        api.acks[0].set_result(api_pb2.Ack(offset=0))
        await settle()
        assert context.answers == [b"c0"]
        assert api.kept_hot == (1 if polls else 0)
        assert not call.done()
    finally:
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)


async def test_the_publishes_of_one_read_are_sent_at_once_after_the_last_of_them() -> None:
    api, requests, context = Api(), Requests(), Context()
    call = asyncio.create_task(serve(api, requests, context))
    try:
        reqs = [request(i) for i in range(3)]
        reqs[1].stream = "other"  # two partitions: two publishes
        requests.push(*reqs)
        await settle()
        assert sorted(api.published) == [1, 2]
        assert api.sent_now == [2], "one send, after both publishes"
        for i, ack in enumerate(api.acks):
            ack.set_result(api_pb2.Ack(offset=i))
        await settle()
        requests.push(request(3))
        await settle()
        assert api.sent_now == [2, 3]
    finally:
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)


class AckTimeoutApi(Api):
    """Acks that never come, waited for the way the server waits (its ack timeout, 50 ms here)."""

    _ack_timeout = 0.05
    until_acked = Publisher.until_acked
    ack_result = Publisher.ack_result


async def test_every_request_of_a_batch_whose_ack_never_came_is_told_so() -> None:
    api, requests, context = AckTimeoutApi(), Requests(), Context()
    call = asyncio.create_task(serve(api, requests, context))
    try:
        requests.push(*(request(i) for i in range(3)))
        await until(lambda: len(context.answers) == 3)
        answers = [api_pb2.PublishResponse.FromString(a) for a in context.answers]
        assert api.published == [3]
        assert [a.correlationId for a in answers] == ["c0", "c1", "c2"]
        for answer in answers:
            assert answer.asyncError.message.startswith("no ack within"), answer
    finally:
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)


async def until(check: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)
