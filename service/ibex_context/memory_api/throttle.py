"""A rate limit on rows, shared by every export call of a process, fair between orgs.

Exports take turns: a call waits in its org's queue, orgs take turns (one call at a time
from the org served longest ago, ``org_turns``), and a turn starts once the process's
timeline is free. A turn reserves the rows it may read; when it ends, the rows it did
not deliver are given back (a page shorter than asked for, a failed query, a caller
that gave up). A call cancelled while it waits reserves nothing: 2,000 exports with a
1 ms deadline leave the timeline as they found it, and one org's queue of exports
delays another org's next page by at most one page.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from ibex_context.org_turns import OrgTurns


@dataclass(slots=True)
class Turn:
    """One call's turn: ``rows`` reserved; the call says how many it ``delivered``."""

    rows: int
    delivered: int = 0

    def used(self, rows: int) -> None:
        self.delivered = min(max(rows, 0), self.rows)


@dataclass(slots=True, eq=False)
class _Waiter:
    rows: int
    granted: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class RowRateLimit:
    """Spaces work out to at most ``rows_per_second`` on average, fairly between keys (orgs).

    Idle time is not banked: after a pause the next turn starts at once but cannot
    burst past the rate. The turns are granted by one task, started when a call waits
    and ended when none does.
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
        self._queues: OrgTurns[_Waiter] = OrgTurns()
        self._granter: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    @property
    def waiting(self) -> int:
        """Calls waiting for a turn (cancelled ones not yet swept included)."""
        return len(self._queues)

    def reserved_seconds(self) -> float:
        """How far ahead of now the timeline is reserved."""
        return max(0.0, self._next_free - self._clock())

    @asynccontextmanager
    async def turn(self, key: str, rows: int) -> AsyncIterator[Turn]:
        """Waits for ``key``'s turn to read up to ``rows``; what the turn did not
        deliver (``Turn.used``) is given back when it ends."""
        waiter = _Waiter(rows)
        self._queues.add(key, waiter)
        self._wake()
        try:
            await waiter.granted
        except BaseException:
            if waiter.granted.done() and not waiter.granted.cancelled():
                self._give_back(rows)  # granted in the same instant as cancelled
            else:  # out of the queue at once: it holds a gRPC call's memory
                self._queues.remove(key, waiter)
            raise
        turn = Turn(rows)
        try:
            yield turn
        finally:
            self._give_back(turn.rows - turn.delivered)

    async def acquire(self, key: str, rows: int) -> None:
        """A turn of ``rows`` that keeps them all (tests, callers that read no rows back)."""
        async with self.turn(key, rows) as turn:
            turn.used(rows)

    def _give_back(self, rows: int) -> None:
        if rows <= 0:
            return
        now = self._clock()
        if self._next_free > now:
            self._next_free = max(now, self._next_free - rows * self._interval)
            self._changed.set()

    def _wake(self) -> None:
        self._changed.set()
        if self._granter is None or self._granter.done():
            self._granter = asyncio.get_running_loop().create_task(
                self._grant_turns(), name="ibex-export-turns"
            )

    async def _grant_turns(self) -> None:
        while self._queues:
            wait = self._next_free - self._clock()
            if wait > 0:
                await self._wait_or_change(wait)
                continue
            taken = self._queues.take()
            if taken is None:
                break
            _, waiter = taken
            if waiter.granted.done():  # its caller gave up while waiting: nothing reserved
                continue
            waiter.granted.set_result(None)
            self._next_free = max(self._next_free, self._clock()) + waiter.rows * self._interval

    async def _wait_or_change(self, seconds: float) -> None:
        """Sleeps ``seconds`` or until rows are given back (the timeline may be free sooner)."""
        self._changed.clear()
        sleeping = asyncio.ensure_future(self._sleep(seconds))
        changed = asyncio.ensure_future(self._changed.wait())
        try:
            await asyncio.wait((sleeping, changed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()
            changed.cancel()
