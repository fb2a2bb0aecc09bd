"""The server's one clock, given to every component that decides by time (tests and the fault suite give
their own).

Two readings, for two purposes:

- ``wall_ns``: nanoseconds since the epoch, for what leaves the process or outlives it: record and ack
  timestamps, metadata timestamps, retention ages, the seals of server-to-server messages;
- ``monotonic_ns``: nanoseconds no NTP step moves, for durations measured within the process: the
  leader lease, liveness, consumer and coordinator timeouts, throttles.

Timers on the event loop (``call_later``, ``asyncio.timeout``) keep the loop's own clock: they schedule
wake-ups, they decide nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["SYSTEM_CLOCK", "Clock"]


@dataclass(frozen=True, slots=True)
class Clock:
    wall_ns: Callable[[], int] = time.time_ns
    monotonic_ns: Callable[[], int] = time.monotonic_ns

    def monotonic(self) -> float:
        """``monotonic_ns`` in seconds."""
        return self.monotonic_ns() / 1e9


SYSTEM_CLOCK = Clock()
