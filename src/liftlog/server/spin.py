"""Keeping the event loop awake for a moment after a publish, instead of sleeping until its answer.

A server that publishes a client's message to NATS gets it back from nats-server a round trip
later, and only then writes and acknowledges it. Sleeping in epoll meanwhile is dear on a small
virtual machine: the wakeup that follows (an interrupt to another CPU, a context switch, cold
caches) took about as long as the rest of the round trip, measured with nats-py alone (45 us at
best, 130 us at the median). Go's scheduler spins an idle thread briefly before parking it for the
same reason, and one publisher at a time ran 20-30% faster with this (``docs/performance.md``).

:class:`LoopSpinner` keeps one callback scheduled on every loop turn until ``window`` seconds
have passed since the last :meth:`keep_hot`, so the loop polls without blocking; each turn gives
the CPU to any other runnable process first (``sched_yield``), so a spinning server does not
starve the nats-server or the clients sharing its cores. Idle, it costs nothing: nothing spins
unless something was published within the window, and spinning stops once a message reaches a
partition's intake (:meth:`cool`): with ack ALL the answer then waits for the followers, which need
the CPU more than this loop does. The API keeps the loop hot only after publishing for a partition
led by this server, with an ack awaited (``ApiService.publish_payload``): a message for a partition
led elsewhere never reaches this server's intake, so nothing would stop the spinning. (In a
three-server benchmark the Go producer's PublishAsync stream went to a server that did not lead
the partition; spinning the whole window after each publish took a fifth of its CPU.)

The same holds on the other side of a publish: a client publishing one message at a time sends its
next about 100 us after reading its ack, and waking for it cost the server about 50 us (a loopback
capture against in-process timestamps). So PublishAsync keeps the loop hot again after answering
ack-LEADER publishes for partitions led here (``ApiService.expect_next_publish``): one publisher at a
time ran about 15% faster. Not after ack ALL answers, for the reason ``cool`` gives.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

__all__ = ["LoopSpinner"]

#: Gives the CPU to another runnable process, if any (not on Windows, where this is a no-op).
_sched_yield: Callable[[], None] = getattr(os, "sched_yield", lambda: None)


class LoopSpinner:
    """Polls ``loop`` without sleeping for ``window`` seconds after each :meth:`keep_hot`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        window: float,
        clock: Callable[[], float] = time.perf_counter,
        yield_cpu: Callable[[], None] = _sched_yield,
    ) -> None:
        self._loop = loop
        self.window = window
        self._clock = clock
        self._yield = yield_cpu
        self._until = 0.0
        self.spinning = False
        #: Loop turns spun so far (a measure of the CPU it took).
        self.turns = 0

    def keep_hot(self) -> None:
        self._until = self._clock() + self.window
        if not self.spinning:
            self.spinning = True
            self._loop.call_soon(self._turn)

    def cool(self) -> None:
        """What the loop was kept hot for arrived (a message on an intake): the next turn stops."""
        self._until = 0.0

    def _turn(self) -> None:
        if self._clock() < self._until:
            self.turns += 1
            self._yield()
            self._loop.call_soon(self._turn)
        else:
            self.spinning = False
