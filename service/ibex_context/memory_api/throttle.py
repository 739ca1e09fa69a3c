"""A rate limit on rows, shared by every export call of a process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


class RowRateLimit:
    """Spaces work out to at most ``rows_per_second`` on average.

    Each ``acquire(n)`` reserves the next n/rate seconds of a shared timeline and
    sleeps until its slot starts, so concurrent exports queue behind each other
    instead of multiplying the rate. Idle time is not banked: after a pause the
    next call starts at once but cannot burst past the rate.
    """

    def __init__(
        self,
        rows_per_second: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if rows_per_second <= 0:
            raise ValueError("rows_per_second must be positive")
        self._interval = 1.0 / rows_per_second
        self._clock = clock
        self._sleep = sleep
        self._next_free = -float("inf")

    def reserve(self, rows: int) -> float:
        """Reserves ``rows``; returns the seconds to wait before using them."""
        now = self._clock()
        start = max(self._next_free, now)
        self._next_free = start + rows * self._interval
        return start - now

    async def acquire(self, rows: int) -> None:
        wait = self.reserve(rows)
        if wait > 0:
            await self._sleep(wait)
