"""Waiting for a condition without polling it.

Whoever changes some state calls ``notify()``; whoever waits for a condition on that state
passes it to ``until()``, which checks it at once and again after each notification, up to a
timeout. Unlike ``asyncio.Condition`` it needs no lock, so plain callbacks can notify, and
unlike an ``Event`` nobody has to clear it: a notification wakes the waiters of the moment.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

__all__ = ["Changes"]


class Changes:
    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        """Something changed: every waiter checks its condition again."""
        if not self._waiters:
            return
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def until(self, condition: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``condition()`` holds, checked now and at each notification; False after ``timeout`` s."""
        if condition():
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return condition()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                return condition()
            finally:
                # Timed out or cancelled, it is still listed: not kept until the next notification.
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            if condition():
                return True
