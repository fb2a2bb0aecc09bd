"""Rate-limited logging for warnings that one message can trigger.

Anyone who can publish on the cluster's NATS subjects can send garbage, and a
flood of it must not become a flood of log lines. A :class:`LogLimiter` lets
through at most one line per key (by default the format string: the kind of
problem) per interval; the next line that passes says how many were dropped
since the previous one. When the flood stops, a timer logs the last dropped
message with the count, so the count is never lost.

``logging.warnings.interval`` sets the interval for every limiter (0: log
every line).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["LogLimiter", "configure", "interval"]

DEFAULT_INTERVAL_S = 10.0
#: Keys remembered per limiter; a caller keying by something unbounded cannot grow memory without end.
MAX_KEYS = 256

_interval = DEFAULT_INTERVAL_S


def configure(seconds: float) -> None:
    """Set the interval of every limiter that has none of its own (0 turns rate limiting off)."""
    global _interval
    if seconds < 0:
        raise ValueError(f"the warning interval cannot be negative, got {seconds}")
    _interval = seconds


def interval() -> float:
    return _interval


@dataclass
class _Key:
    last: float
    dropped: int = 0
    #: The newest dropped line, logged with the count if nothing else passes before the interval ends.
    pending: tuple[int, str, tuple[object, ...]] | None = None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class LogLimiter:
    """At most one line per key per interval for ``logger``; the rest are counted.

    Use on the event loop (the summary timer needs a running loop); without
    one, call :meth:`flush` to log pending counts.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self._interval = interval
        self._clock = clock
        self._keys: dict[str, _Key] = {}

    @property
    def interval(self) -> float:
        return _interval if self._interval is None else self._interval

    def warning(self, msg: str, *args: object, key: str | None = None) -> bool:
        return self.log(logging.WARNING, msg, *args, key=key)

    def error(self, msg: str, *args: object, key: str | None = None) -> bool:
        return self.log(logging.ERROR, msg, *args, key=key)

    def log(self, level: int, msg: str, *args: object, key: str | None = None) -> bool:
        """Log unless a line with the same key passed less than an interval ago; True if logged."""
        if not self.logger.isEnabledFor(level):
            return False
        period = self.interval
        if period <= 0:
            self.logger.log(level, msg, *args)
            return True
        key = msg if key is None else key
        now = self._clock()
        state = self._keys.get(key)
        if state is None or now - state.last >= period:
            dropped = state.dropped if state is not None else 0
            if state is not None and state.timer is not None:
                state.timer.cancel()
            self._emit(level, msg, args, dropped, now - state.last if state is not None else 0.0)
            self._remember(key, _Key(now))
            return True
        state.dropped += 1
        state.pending = (level, msg, args)
        if state.timer is None:
            self._schedule(key, state, state.last + period - now)
        return False

    def flush(self) -> None:
        """Log the pending counts of keys whose interval has ended."""
        now = self._clock()
        for key, state in list(self._keys.items()):
            if state.pending is not None and now - state.last >= self.interval:
                self._summarize(key)

    def _emit(self, level: int, msg: str, args: tuple[object, ...], dropped: int, since: float) -> None:
        if dropped:
            self.logger.log(level, msg + " (and %d more dropped in the %.3g s before)", *args, dropped, since)
        else:
            self.logger.log(level, msg, *args)

    def _summarize(self, key: str) -> None:
        state = self._keys.get(key)
        if state is None or state.pending is None:
            return
        level, msg, args = state.pending
        now = self._clock()
        # The pending line is one of the dropped ones: it is logged now, the others are counted.
        self._emit(level, msg, args, state.dropped - 1, now - state.last)
        state.last, state.dropped, state.pending, state.timer = now, 0, None, None

    def _schedule(self, key: str, state: _Key, delay: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        state.timer = loop.call_later(max(delay, 0.0), self._summarize, key)

    def _remember(self, key: str, state: _Key) -> None:
        self._keys.pop(key, None)
        self._keys[key] = state
        if len(self._keys) > MAX_KEYS:
            oldest = next(iter(self._keys))
            gone = self._keys[oldest]
            if gone.timer is not None:
                gone.timer.cancel()
            self._summarize(oldest)  # its count is logged, not lost
            del self._keys[oldest]
