"""The ack router: acks reach the call that waits for them and nobody else, and never go where a client says
a server's rights should carry them."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from liftlog.api import api_pb2
from liftlog.api.envelope import decode_ack, encode_ack
from liftlog.metadata import InvalidStreamError, validate_ack_inbox
from liftlog.security.ack_routes import RouteIds
from liftlog.server.partitions.acks import AckRouter, DuplicateRoute

pytestmark = pytest.mark.timeout(10)
ALL, LEADER = api_pb2.ALL, api_pb2.LEADER
KEY = b"k" * 32


class FakeNats:
    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, data: bytes) -> None:
        self.published.append((subject, data))

    async def subscribe(self, subject: str, cb: object = None) -> object:
        return None


def ack_for(inbox: str, cid: str, *, stream: str = "orders", subject: str = "orders", **fields: Any) -> api_pb2.Ack:
    values: dict[str, Any] = {
        "stream": stream,
        "partitionSubject": subject,
        "msgSubject": subject,
        "ackPolicy": ALL,
        "offset": 3,
        **fields,
    }
    return api_pb2.Ack(ackInbox=inbox, correlationId=cid, **values)


async def started(key: bytes | None = None, **kwargs: Any) -> tuple[AckRouter, FakeNats, FakeNats]:
    router = AckRouter("s1", RouteIds(key), **kwargs)
    internal, clients = FakeNats(), FakeNats()
    await router.start(internal, clients.publish)  # type: ignore[arg-type]
    return router, internal, clients


async def test_a_local_waiter_gets_its_ack_without_nats_and_with_no_trace_of_the_route() -> None:
    router, internal, clients = await started()
    inbox, cid, fut = router.expect("orders", ALL, "orders")
    assert inbox == router.inbox and inbox.startswith("_INBOX.liftlog.s1.")
    router.deliver(ack_for(inbox, cid))
    ack = await fut
    assert ack.offset == 3
    assert ack.ackInbox == "" and ack.correlationId == ""  # the caller named neither
    await asyncio.sleep(0)
    assert internal.published == [] and clients.published == []
    await router.stop()


async def test_route_ids_are_128_random_bits_never_a_counter() -> None:
    router, _, _ = await started()
    ids = [router.expect("orders", ALL)[1] for _ in range(1000)]
    assert len(set(ids)) == 1000
    assert all(len(cid) == 32 and int(cid, 16) >= 0 for cid in ids)
    # No shared prefix beyond chance: a counter or a fixed prefix would share most digits.
    assert len({cid[:8] for cid in ids}) > 990
    signed, _, _ = await started(KEY)
    assert len(signed.expect("orders", ALL)[1]) == 64  # token and tag
    await router.stop()
    await signed.stop()


async def test_an_ack_that_does_not_match_the_waiter_is_dropped_and_counted() -> None:
    router, _, _ = await started()
    inbox, cid, fut = router.expect("victim", ALL, "victim")
    router.deliver(ack_for(inbox, cid, stream="attacker", subject="attacker"))  # another stream and subject
    router.deliver(ack_for(inbox, cid, stream="victim", subject="victim", ackPolicy=LEADER))  # ALL promised
    router.deliver(ack_for(inbox, cid, stream="other", subject="victim"))  # a second stream on the subject
    router.deliver(ack_for(inbox, "0" * 32, stream="victim", subject="victim"))  # nobody's
    await asyncio.sleep(0)
    assert not fut.done()
    assert router.dropped == {"mismatch": 2, "other_stream": 1, "no_waiter": 1}
    router.deliver(ack_for(inbox, cid, stream="victim", subject="victim", offset=9))
    assert (await fut).offset == 9
    await router.stop()


async def test_publish_to_subject_waits_for_any_stream_on_its_subject() -> None:
    router, _, _ = await started()
    inbox, cid, fut = router.expect("orders.eu", LEADER, None)
    router.deliver(
        ack_for(inbox, cid, stream="all-orders", subject="orders.*", msgSubject="orders.eu", ackPolicy=LEADER)
    )
    assert (await fut).stream == "all-orders"
    await router.stop()


async def test_a_second_registration_of_an_id_is_refused_and_the_first_keeps_waiting() -> None:
    class Repeating(RouteIds):
        def new(self, inbox: str, subject: str, policy: int) -> str:
            return "f" * 32  # a broken random source

    router = AckRouter("s1", Repeating(None))
    await router.start(FakeNats())  # type: ignore[arg-type]
    inbox, cid, first = router.expect("orders", ALL, "orders")
    with pytest.raises(DuplicateRoute):
        router.expect("orders", ALL, "orders")
    router.deliver(ack_for(inbox, cid))
    assert (await first).offset == 3
    await router.stop()


async def test_a_timed_out_waiter_is_forgotten() -> None:
    router, _, _ = await started()
    inbox, cid, fut = router.expect("orders", ALL, "orders")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(fut, 0.01)
    assert router.waiting == 0
    router.deliver(ack_for(inbox, cid))  # a late ack is dropped quietly
    assert router.dropped == {"no_waiter": 1}
    await router.stop()


async def test_a_callers_own_inbox_gets_a_copy_on_the_clients_connection_with_its_own_id() -> None:
    router, internal, clients = await started(KEY)
    inbox, cid, fut = router.expect("orders", ALL, "orders", ("_INBOX.client.1", "mine"))
    router.deliver(ack_for(inbox, cid))
    ack = await fut
    assert (ack.ackInbox, ack.correlationId) == ("_INBOX.client.1", "mine")
    await asyncio.sleep(0.01)
    ((subject, data),) = clients.published
    sent = decode_ack(data)
    assert subject == "_INBOX.client.1" and (sent.correlationId, sent.offset) == ("mine", 3)
    assert internal.published == []
    await router.stop()


async def test_another_servers_inbox_gets_acks_on_the_internal_connection_only_with_a_signed_route() -> None:
    sender, _, _ = await started(KEY)
    inbox, cid, _ = sender.expect("orders", ALL, "orders")  # made on another server, read off NATS
    leader = AckRouter("s2", RouteIds(KEY))
    internal, clients = FakeNats(), FakeNats()
    await leader.start(internal, clients.publish)  # type: ignore[arg-type]
    leader.deliver(ack_for(inbox, cid))
    # A client copied the inbox and id into its own envelope: another subject, or ack LEADER for ALL.
    leader.deliver(ack_for(inbox, cid, stream="evil", subject="evil"))
    leader.deliver(ack_for(inbox, cid, ackPolicy=LEADER))
    leader.deliver(ack_for(inbox, "ab" * 32))  # a made-up id
    leader.deliver(ack_for(inbox, "nothex!" * 8 + "zz" * 4))
    await asyncio.sleep(0.01)
    assert [subject for subject, _ in internal.published] == [inbox]
    assert clients.published == []
    assert leader.dropped == {"unsigned_route": 4}
    await leader.stop()
    await sender.stop()


@pytest.mark.parametrize(
    "inbox",
    [
        "liftbridge-default.evil.ack",  # the cluster's namespace
        "liftbridge-default",
        "_INBOX.liftlog.evil.x",  # a server's private inbox
        "$SYS.REQ.SERVER.PING",
        "$JS.API.STREAM.DELETE.ORDERS",
        "inbox\r\nPUB orders 5\r\nhello",  # CR/LF: a command of the sender's choosing on a text protocol
        "inbox with spaces",
        "a..b",
        ".a",
        "a.",
        "acks.*",
        "acks.>",
        "",
    ],
)
def test_client_inboxes_must_be_literal_subjects_outside_the_clusters_and_nats_own(inbox: str) -> None:
    with pytest.raises(InvalidStreamError, match=r"ack inbox|subject is empty"):
        validate_ack_inbox(inbox, "liftbridge-default")


def test_ordinary_client_inboxes_are_accepted() -> None:
    for inbox in ("_INBOX.abc123", "_INBOX.liftlogx.1", "acks.orders.7", "my-app.replies"):
        validate_ack_inbox(inbox, "liftbridge-default")


async def test_a_refused_client_inbox_gets_no_ack_and_is_counted() -> None:
    def check(inbox: str) -> None:
        validate_ack_inbox(inbox, "ns")

    router, internal, clients = await started(check_inbox=check)
    for inbox in ("ns.evil.ack", "bad\r\ninbox", "$JS.API.INFO"):
        router.deliver(ack_for(inbox, "c"))
    # Without a cluster secret no signature tells a server's route from a copy: at least the inbox must
    # have a server inbox's shape.
    for inbox in ("_INBOX.liftlog.evil.x", "_INBOX.liftlog.0123456789abcdef", "_INBOX.liftlog.s2.x"):
        router.deliver(ack_for(inbox, "c"))
    router.deliver(ack_for("_INBOX.liftlog.s2.0123456789abcdef", "c"))
    router.deliver(ack_for("_INBOX.fine", "c"))
    await asyncio.sleep(0.01)
    assert [s for s, _ in clients.published] == ["_INBOX.fine"]
    assert [s for s, _ in internal.published] == ["_INBOX.liftlog.s2.0123456789abcdef"]
    assert router.dropped == {"refused_inbox": 3, "unsigned_route": 3}
    await router.stop()


async def test_for_a_partition_led_here_only_this_servers_own_ack_counts() -> None:
    """A replaced leader that has not learned it yet writes the same message at an offset of its stale log
    and acks it over NATS; that ack must not win the race with the real leader's (this server's)."""
    router, _, _ = await started()
    inbox, cid, fut = router.expect("orders", LEADER, "orders", local=True)
    await router._on_nats_ack(_Msg(inbox, encode_ack(ack_for(inbox, cid, ackPolicy=LEADER, offset=99))))
    assert not fut.done() and router.dropped == {"foreign_leader": 1}
    router.deliver(ack_for(inbox, cid, ackPolicy=LEADER, offset=5))
    assert (await fut).offset == 5
    # Led elsewhere: the leader's ack comes over NATS, as it must.
    inbox, cid, fut = router.expect("orders", LEADER, "orders")
    await router._on_nats_ack(_Msg(inbox, encode_ack(ack_for(inbox, cid, ackPolicy=LEADER, offset=6))))
    assert (await fut).offset == 6
    await router.stop()


class _Msg:
    def __init__(self, subject: str, data: bytes) -> None:
        self.subject, self.data, self.reply = subject, data, ""

    async def respond(self, data: bytes) -> None:  # a NatsMessage; an ack is never answered
        raise AssertionError("an ack was answered")
