"""``Changes``: waiting for a condition, woken by notifications instead of polling."""

from __future__ import annotations

import asyncio

from liftlog.server.changes import Changes


async def test_a_condition_that_holds_returns_at_once() -> None:
    assert await Changes().until(lambda: True, 0.0)


async def test_a_notification_wakes_the_waiter_to_check_again() -> None:
    changes, state = Changes(), {"ready": False}
    waiting = asyncio.ensure_future(changes.until(lambda: state["ready"], 5.0))
    await asyncio.sleep(0)
    changes.notify()  # not ready yet: it waits on
    await asyncio.sleep(0)
    assert not waiting.done()
    state["ready"] = True
    changes.notify()
    assert await asyncio.wait_for(waiting, 1.0)


async def test_a_condition_that_never_holds_times_out_and_leaves_no_waiter_behind() -> None:
    changes = Changes()
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert not await changes.until(lambda: False, 0.05)
    assert loop.time() - began >= 0.05
    assert changes._waiters == []


async def test_a_cancelled_wait_leaves_no_waiter_behind() -> None:
    changes = Changes()
    waiting = asyncio.ensure_future(changes.until(lambda: False, 5.0))
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert changes._waiters == []


async def test_one_notification_wakes_every_waiter() -> None:
    changes, state = Changes(), {"n": 0}
    waits = [asyncio.ensure_future(changes.until(lambda: state["n"] > 0, 5.0)) for _ in range(3)]
    await asyncio.sleep(0)
    state["n"] = 1
    changes.notify()
    assert await asyncio.wait_for(asyncio.gather(*waits), 1.0) == [True, True, True]
