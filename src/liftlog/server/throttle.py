"""A byte rate for traffic that must not crowd out the rest (a reassignment's catch-up copies)."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ByteRate"]


class ByteRate:
    """A token bucket of ``rate`` bytes per second that holds at most one second's worth.

    ``spend`` may take more than is available (a record batch is sent whole): the debt is paid
    back by waiting, so the average stays at the rate.
    """

    def __init__(self, rate: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate < 0:
            raise ValueError(f"a byte rate cannot be negative, got {rate}")
        self.rate = rate
        self._clock = clock
        self._tokens = float(rate)
        self._at = clock()

    @property
    def limited(self) -> bool:
        return self.rate > 0

    def available(self) -> int:
        """Bytes that may go now (0 or less: none until the bucket refills)."""
        now = self._clock()
        self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate)
        self._at = now
        return int(self._tokens)

    def spend(self, n: int) -> None:
        self._tokens -= n
