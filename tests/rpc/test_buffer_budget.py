"""The server-wide buffer budget, sans-IO: connections share it, idle ones hold none of it, hoarders cannot
take more than it, everybody keeps their own 64 KiB, and budget that comes back reaches those that waited."""

from __future__ import annotations

import contextlib
import gzip
import random

import h2.exceptions
import pytest

from liftlog.rpc import wire
from liftlog.rpc.connection import BufferBudget
from liftlog.rpc.server_connection import ConnectionLimits
from liftlog.rpc.status import StatusCode

from .frames import grpc_message
from .test_connection import Pair

FLOOR = wire.DEFAULT_WINDOW
LIMITS = ConnectionLimits(stream_window=1 << 20, connection_window=8 << 20, max_message_bytes=4 << 20)


def held(p: Pair) -> int:
    """Bytes the server holds for this connection plus what its client may still send."""
    return p.server._footprint()


def check_budget(budget: BufferBudget, pairs: list[Pair]) -> None:
    open_pairs = [p for p in pairs if not p.server.closed]
    assert budget.used == sum(p.server.budget_charged for p in open_pairs)
    assert budget.used <= budget.limit
    for p in open_pairs:
        assert held(p) <= FLOOR + p.server.budget_charged


def test_idle_connections_hold_none_of_the_budget() -> None:
    budget = BufferBudget(1 << 20)
    pairs = [Pair(LIMITS, budget=budget) for _ in range(200)]
    assert budget.used == 0
    assert {p.client.outbound_flow_control_window for p in pairs} == {FLOOR}
    for p in pairs:
        p.server.release_budget()
    assert budget.used == 0


def test_a_busy_connection_earns_the_whole_connection_window_and_gives_it_back() -> None:
    budget = BufferBudget(64 << 20)
    p = Pair(LIMITS, budget=budget)
    sid = p.start()
    chunk = grpc_message(b"x" * 16_379)
    for _ in range(200):  # taken as they come: the peer never waits, and its window stays as it was
        assert p.send(sid, chunk) == len(chunk)
        p.consume(sid)
    assert p.client.outbound_flow_control_window == FLOOR and budget.used == 0
    windows = []
    pending = b""
    for _ in range(40):  # bursts of 1 MiB the app takes only after each: the peer runs out, the window grows
        pending += chunk * 64
        pending = pending[p.send(sid, pending) :]
        p.consume(sid)
        windows.append(p.client.outbound_flow_control_window)
    assert max(windows) > LIMITS.stream_window, "the window doubled while the peer used it up"
    assert p.server.budget_charged <= LIMITS.connection_window
    check_budget(budget, [p])
    p.server.release_budget()
    assert budget.used == 0 and not budget.waiting


def hoard(p: Pair, streams: int = 8) -> int:
    """Unfinished 4 MiB messages on ``streams`` streams, as far as the windows let the client: bytes sent."""
    big = grpc_message(b"H" * (4 << 20))
    return sum(p.send(p.start(), big) for _ in range(streams))


def test_hoarders_get_no_more_than_the_budget_and_a_newcomer_keeps_publishing() -> None:
    budget = BufferBudget(2 << 20)
    hoarders = [Pair(LIMITS, budget=budget) for _ in range(20)]
    sent = [hoard(p) for p in hoarders]
    check_budget(budget, hoarders)
    assert sum(sent) <= 20 * FLOOR + budget.limit, "what the server holds is bounded by the budget"
    assert sum(p.server._partial for p in hoarders) <= 20 * FLOOR + budget.limit
    assert budget.room < LIMITS.connection_window // 16 and budget.waiting, "hoarders wait for more"

    good = Pair(LIMITS, budget=budget)
    sid = good.start()
    for i in range(300):  # 3 MB of small messages through its own 64 KiB, taken as they come
        message = grpc_message(b"%d" % i + b"." * 10_000)
        assert good.send(sid, message) == len(message), f"message {i} stalled"
        good.consume(sid)
    assert len(good.messages(sid)) == 300
    check_budget(budget, [*hoarders, good])


def test_budget_that_comes_back_goes_to_the_connections_that_waited() -> None:
    budget = BufferBudget(1 << 20)
    hoarders = [Pair(LIMITS, budget=budget) for _ in range(8)]
    for p in hoarders:
        hoard(p)
    waiter = Pair(LIMITS, budget=budget)
    sid = waiter.start()
    big = grpc_message(b"W" * 500_000)  # more than its floor: it needs the budget to finish
    sent = waiter.send(sid, big)
    assert sent < len(big) and not waiter.messages(sid)
    assert waiter.server in budget.waiting

    for p in hoarders:  # the hoarders go (their connections closed)
        p.server.release_budget()
    assert budget.used == waiter.server.budget_charged
    assert waiter.server.grant_withheld()  # what the shell does when budget comes back
    waiter.pump()
    assert waiter.send(sid, big[sent:]) == len(big) - sent
    assert [m.data for m in waiter.messages(sid)] == [b"W" * 500_000]


def test_inflated_messages_are_charged_and_cannot_exceed_the_budget() -> None:
    budget = BufferBudget(1 << 20)
    p = Pair(LIMITS, budget=budget)
    sid = p.start(extra=[("grpc-encoding", "gzip")])
    bomb = grpc_message(gzip.compress(b"\0" * 300_000), compressed=1)  # 300 kB from a few hundred bytes
    p.send(sid, bomb * 5)
    assert len(p.messages(sid)) == 3, "three fit the budget (and the floor)"
    r = p.response(sid)
    assert r.status == StatusCode.RESOURCE_EXHAUSTED and "not yet read" in r.message
    check_budget(budget, [p])


@pytest.mark.parametrize("seed", range(40))
def test_random_traffic_keeps_the_budget_exact_and_bounded(seed: int) -> None:
    rng = random.Random(seed)
    budget = BufferBudget(rng.choice([256 << 10, 1 << 20, 4 << 20]))
    pairs = [Pair(LIMITS, budget=budget) for _ in range(rng.randint(2, 6))]
    streams: dict[int, list[int]] = {i: [] for i in range(len(pairs))}
    for _ in range(120):
        i = rng.randrange(len(pairs))
        p = pairs[i]
        if p.server.closed:
            continue
        action = rng.random()
        if action < 0.15 or not streams[i]:
            streams[i].append(p.start())
        elif action < 0.6:  # what was not sent is dropped: the next message lands mid-message (a bad one)
            size = rng.choice([100, 5_000, 70_000, 600_000, 3_000_000])
            sid = rng.choice(streams[i])
            try:
                p.send(sid, grpc_message(b"r" * size))
            except h2.exceptions.StreamClosedError:  # the server ended the call for a bad message
                streams[i].remove(sid)
        elif action < 0.85:
            p.consume(rng.choice(streams[i]))
        elif action < 0.95:
            sid = streams[i].pop(rng.randrange(len(streams[i])))
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                p.client.reset_stream(sid)
            p.pump()
        else:
            p.server.release_budget()
            p.server.close()
            p.server.closed = True  # the shell drops a connection it released
        for q in pairs:  # budget that came back reaches those that wait, as the shell hands it out
            if q.server in budget.waiting and budget.room > 0 and q.server.grant_withheld():
                q.pump()
        check_budget(budget, pairs)
