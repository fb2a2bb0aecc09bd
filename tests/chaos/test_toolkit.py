"""The fault toolkit itself, against a real nats-server and nats-py clients, before fault tests rely on it."""

from __future__ import annotations

import asyncio
import itertools
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from tests.integration.harness import NatsProcess

from .faults import EXCLUSIVE, Fault, kill9, pause, paused, process_state, random_schedule, resume
from .proxy import TcpProxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]


@pytest.fixture
def proxy(nats_server: NatsProcess) -> Iterator[Callable[[], TcpProxy]]:
    """Started proxies to the nats-server, all stopped (threads joined) at teardown even if the test failed."""
    made: list[TcpProxy] = []

    def make() -> TcpProxy:
        made.append(TcpProxy("127.0.0.1", nats_server.port).start())
        return made[-1]

    yield make
    for p in made:
        p.stop()


PROBE = b"probe-"


@dataclass
class Watched:
    """A nats-py client plus what its callbacks reported, so tests can assert on what the client saw."""

    nc: NATS
    disconnects: int = 0
    reconnects: int = 0
    probes: int = 0
    #: Payloads received, probes excluded.
    inbox: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)

    async def subscribe(self, subject: str) -> None:
        await self.nc.subscribe(subject, cb=self._on_msg)

    async def _on_msg(self, msg: Msg) -> None:
        if msg.data.startswith(PROBE):
            self.probes += 1
        else:
            await self.inbox.put(msg.data)

    async def next_data(self, timeout: float = 5.0) -> bytes:
        return await asyncio.wait_for(self.inbox.get(), timeout)


async def routed(pub: Watched, sub: Watched, subject: str, timeout: float = 5.0) -> None:
    """Publish probes until ``sub`` gets one: its subscription is live on the server, end to end.

    ``flush()`` after ``subscribe()`` is not enough with nats-py 2.16: its PING goes straight to the socket,
    ahead of a SUB still queued for its flusher task, so the PONG can come back before the server has the
    SUB (a few percent of runs lost their first message that way).
    """
    seen, deadline = sub.probes, time.monotonic() + timeout
    for n in itertools.count():
        await pub.nc.publish(subject, PROBE + str(n).encode())
        await asyncio.sleep(0.05)
        if sub.probes > seen:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"no probe on {subject} reached the subscriber within {timeout}s")


@pytest.fixture
async def client() -> AsyncIterator[Callable[[str], Awaitable[Watched]]]:
    """Connect reconnect-forever nats-py clients; all closed at teardown."""
    made: list[Watched] = []

    async def connect(url: str) -> Watched:
        w = Watched(nc=NATS())

        async def on_disconnect() -> None:
            w.disconnects += 1

        async def on_reconnect() -> None:
            w.reconnects += 1

        async def on_error(exc: Exception) -> None:
            pass  # connection errors are the point here; nats-py would log each one

        w.nc = await nats.connect(
            servers=[url],
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.1,
            connect_timeout=1,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
            error_cb=on_error,
        )
        made.append(w)
        return w

    yield connect
    for w in made:
        await w.nc.close()


async def eventually(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.02)


async def test_cut_drops_the_connection_and_heal_lets_it_reconnect(
    proxy: Callable[[], TcpProxy], client: Callable[[str], Awaitable[Watched]]
) -> None:
    pub_proxy, sub_proxy = proxy(), proxy()
    pub, sub = await client(pub_proxy.url), await client(sub_proxy.url)
    await sub.subscribe("chaos.cut")
    await routed(pub, sub, "chaos.cut")
    await pub.nc.publish("chaos.cut", b"before")
    assert await sub.next_data() == b"before"
    assert sub_proxy.connections_accepted == 1 and sub_proxy.bytes_up > 0 and sub_proxy.bytes_down > 0

    sub_proxy.cut()
    await eventually(lambda: not sub.nc.is_connected and sub.disconnects == 1, "the client noticing the cut")
    # It keeps retrying and every attempt is closed on arrival.
    await eventually(lambda: sub_proxy.connections_refused >= 2, "refused reconnect attempts")
    await pub.nc.publish("chaos.cut", b"during")
    await pub.nc.flush()
    await asyncio.sleep(0.3)
    assert sub.inbox.empty() and not sub.nc.is_connected
    assert pub.nc.is_connected and pub_proxy.connections_accepted == 1  # the other proxy is untouched

    sub_proxy.heal()
    await eventually(lambda: sub.nc.is_connected and sub.reconnects == 1, "reconnection after heal")
    await routed(pub, sub, "chaos.cut")  # the resent SUB has reached the server
    await pub.nc.publish("chaos.cut", b"after")
    assert await sub.next_data() == b"after"  # "during" was lost for good: core NATS is at-most-once


async def test_blackhole_silences_without_closing_and_heal_resets(
    proxy: Callable[[], TcpProxy], client: Callable[[str], Awaitable[Watched]]
) -> None:
    sub_proxy = proxy()
    pub, sub = await client(proxy().url), await client(sub_proxy.url)
    await sub.subscribe("chaos.hole")
    await routed(pub, sub, "chaos.hole")

    sub_proxy.blackhole()
    await pub.nc.publish("chaos.hole", b"swallowed")
    await pub.nc.flush()
    with pytest.raises(nats.errors.TimeoutError):
        await sub.nc.flush(timeout=1)  # its PING goes nowhere: only timeouts, no error
    assert sub.inbox.empty()
    assert sub.nc.is_connected and sub.disconnects == 0 and sub_proxy.active_connections == 1
    assert sub_proxy.bytes_dropped > len(b"swallowed")

    sub_proxy.heal()
    # Heal resets the connection that lived through the blackhole; the client reconnects on its own.
    await eventually(lambda: sub.nc.is_connected and sub.reconnects == 1, "reconnection after heal")
    assert sub.disconnects == 1 and sub_proxy.connections_accepted == 2
    await routed(pub, sub, "chaos.hole")
    await pub.nc.publish("chaos.hole", b"after")
    assert await sub.next_data() == b"after"  # the swallowed message is gone, not replayed


async def test_delay_adds_latency_both_ways_and_zero_removes_it(
    nats_server: NatsProcess, proxy: Callable[[], TcpProxy], client: Callable[[str], Awaitable[Watched]]
) -> None:
    sub_proxy = proxy()
    pub, sub = await client(nats_server.url), await client(sub_proxy.url)
    await sub.subscribe("chaos.slow")
    await routed(pub, sub, "chaos.slow")

    sub_proxy.delay(0.2)
    started = time.monotonic()
    await sub.nc.flush()
    assert time.monotonic() - started >= 0.38  # PING up and PONG down are each held 0.2 s

    started = time.monotonic()
    await pub.nc.publish("chaos.slow", b"late")
    assert await sub.next_data() == b"late"
    assert time.monotonic() - started >= 0.19  # only the way down goes through the delayed proxy

    sub_proxy.delay(0)
    assert sub_proxy.latency == 0
    await pub.nc.publish("chaos.slow", b"prompt")
    assert await sub.next_data() == b"prompt"
    assert sub.disconnects == 0  # latency never broke the connection


def test_stop_releases_the_port_and_the_thread() -> None:
    with socket.socket() as target:
        target.bind(("127.0.0.1", 0))
        target.listen()
        p = TcpProxy("127.0.0.1", target.getsockname()[1]).start()
        thread = p._thread
        assert thread is not None and thread.is_alive()
        with socket.create_connection(("127.0.0.1", p.port), timeout=2):
            pass
        p.stop()
        p.stop()  # idempotent
        assert not thread.is_alive()
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", p.port)) != 0


async def wait_state(pid: int, wanted: Callable[[str], bool], what: str) -> None:
    await eventually(lambda: wanted(process_state(pid)), what, timeout=2)


async def test_sigstop_and_sigcont_pause_and_resume_a_process() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert process_state(proc.pid) != "T"
        pause(proc)
        await wait_state(proc.pid, lambda s: s == "T", "stopped state")
        resume(proc)
        await wait_state(proc.pid, lambda s: s != "T", "running again")
        with paused(proc):
            await wait_state(proc.pid, lambda s: s == "T", "stopped inside paused()")
        await wait_state(proc.pid, lambda s: s != "T", "resumed after paused()")
        pause(proc)
        assert kill9(proc) == -9  # SIGKILL reaches a stopped process too
        pause(proc)  # no-ops on a dead process rather than raising
        resume(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_random_schedule_is_deterministic_per_seed_and_respects_its_bounds() -> None:
    servers = ["a", "b", "c", "d", "e"]
    schedule = random_schedule(42, servers, 60.0, list(Fault))
    assert schedule == random_schedule(42, list(reversed(servers)), 60.0, ["kill", *Fault])
    assert len({tuple(random_schedule(seed, servers, 60.0)) for seed in range(10)}) == 10

    assert len(schedule) > 5
    assert [e.at for e in schedule] == sorted(e.at for e in schedule)
    assert {t for e in schedule for t in e.targets} <= {*servers, "nats"}
    for event in schedule:
        assert event.at > 0 and 0.5 <= event.duration <= 5.0 and event.ends <= 60.0
        delays = event.action is Fault.DELAY or (event.action is Fault.TWO and event.kind == "delay")
        assert (event.latency > 0) == delays
        assert (event.shift_s != 0) == (event.action is Fault.CLOCK)
        assert (event.rate > 0) == (event.action is Fault.DISK)
        assert (event.second != "") == (event.action is Fault.TWO)
        overlapping = [o for o in schedule if o.at <= event.at < o.ends]
        if any(o.action in EXCLUSIVE for o in overlapping):
            assert overlapping == [event]  # nothing else while NATS is down or two servers are faulted
        else:
            assert len(overlapping) <= 2  # a minority of five
        targets = [t for o in overlapping for t in o.targets]
        assert len(set(targets)) == len(targets)  # one fault per server at a time

    only = random_schedule(3, ["x", "y", "z"], 30.0, [Fault.PAUSE, "cut"])
    assert only and {e.action for e in only} <= {Fault.PAUSE, Fault.CUT}
    with pytest.raises(ValueError):
        random_schedule(1, [], 10.0)


def test_a_short_schedule_can_be_made_to_include_chosen_kinds() -> None:
    for seed in range(1, 30):
        schedule = random_schedule(seed, ["a", "b", "c"], 20.0, required=[Fault.DISK, Fault.POWER])
        assert {Fault.DISK, Fault.POWER} <= {e.action for e in schedule}, (seed, schedule)
        assert schedule == random_schedule(seed, ["a", "b", "c"], 20.0, required=[Fault.DISK, Fault.POWER])
