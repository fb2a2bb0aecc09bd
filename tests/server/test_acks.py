"""The ack router: local hand-over, NATS for foreign inboxes, no leaked waiters."""

from __future__ import annotations

import asyncio

import pytest

from liftlog.api import api_pb2
from liftlog.api.envelope import decode_ack
from liftlog.server.acks import AckRouter


class FakeNats:
    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.published.append((subject, data))

    async def subscribe(self, subject: str, cb: object = None) -> object:
        return None


async def test_local_waiter_gets_the_ack_without_nats() -> None:
    router = AckRouter("s1")
    nats = FakeNats()
    await router.start(nats)
    fut = router.expect(router.inbox, "c1")
    router.deliver(api_pb2.Ack(ackInbox=router.inbox, correlationId="c1", offset=3))
    assert (await fut).offset == 3
    await asyncio.sleep(0)
    assert nats.published == []
    await router.stop()


async def test_foreign_inbox_goes_over_nats_and_to_the_waiter() -> None:
    router = AckRouter("s1")
    nats = FakeNats()
    await router.start(nats)
    fut = router.expect("client.inbox", "c2")
    router.deliver(api_pb2.Ack(ackInbox="client.inbox", correlationId="c2", offset=7))
    assert (await fut).offset == 7
    await asyncio.sleep(0.01)
    ((subject, data),) = nats.published
    assert subject == "client.inbox" and decode_ack(data).offset == 7
    await router.stop()


async def test_a_timed_out_waiter_is_forgotten() -> None:
    router = AckRouter("s1")
    await router.start(FakeNats())
    fut = router.expect(router.inbox, "late")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(fut, 0.01)
    assert router.waiting == 0
    router.deliver(api_pb2.Ack(ackInbox=router.inbox, correlationId="late"))  # a late ack is dropped quietly
    await router.stop()
