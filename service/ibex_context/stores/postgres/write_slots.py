"""How many of the pool's connections the memory API's writes may hold, fair between orgs.

The calls' searches and the memory API's writes share one pool. An upsert holds its
connection for its whole transaction: ~1 ms a memory, a second for a call of 1,000 memories
that brings its own vectors (no embedding to wait for). Twenty such calls from one org held
every connection of the default pool, and every org's searches waited past their cold
deadline. So writes hold at most ``capacity`` connections at once; the others stay for the
calls. A write over that waits in its org's queue, and the orgs take turns (``org_turns``):
a freed slot goes to the first waiter of the org served longest ago, so one org's flood of
writes delays another org's write by one write a slot, not by all of the flood's.

Pure asyncio bookkeeping, no I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ibex_context.org_turns import OrgTurns


class WriteSlots:
    """At most ``capacity`` holders at once; waiters queued per org, granted org by org."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._free = capacity
        self._waiting: OrgTurns[asyncio.Future[None]] = OrgTurns()

    @property
    def held(self) -> int:
        return self.capacity - self._free

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @asynccontextmanager
    async def slot(self, org_id: str) -> AsyncIterator[None]:
        """Holds one slot for ``org_id`` while the block runs."""
        await self._acquire(org_id)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, org_id: str) -> None:
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.add(org_id, granted)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self._release()  # granted in the same instant as cancelled: hand it on
            else:
                self._waiting.remove(org_id, granted)
            raise

    def _release(self) -> None:
        self._free += 1
        while self._free > 0 and (turn := self._waiting.take()) is not None:
            _, granted = turn
            if granted.done():  # its caller gave up
                continue
            granted.set_result(None)
            self._free -= 1
