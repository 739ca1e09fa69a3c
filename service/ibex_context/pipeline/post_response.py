"""Work done after the response, off the request path: record which memories were
injected (retrieval_count, last_injected_at) and refresh them in the hot set.

A bounded queue drained in batches: when it is full, new items are dropped and
counted (the request path never waits); failures are logged and counted, never
raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ibex_context.stores.base import InjectionRecord, InjectionRecorder

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class QueueHooks:
    """Observability callbacks (metrics); no-ops by default."""

    depth: Callable[[int], None] = lambda _: None
    dropped: Callable[[int], None] = lambda _: None
    failed: Callable[[int], None] = lambda _: None


class InjectionQueue:
    def __init__(
        self,
        recorder: InjectionRecorder,
        *,
        max_size: int,
        batch_size: int,
        flush_interval: float,
        hooks: QueueHooks | None = None,
    ) -> None:
        self._recorder = recorder
        self._queue: asyncio.Queue[InjectionRecord] = asyncio.Queue(max_size)
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self._hooks = hooks or QueueHooks()
        self._task: asyncio.Task[None] | None = None
        # The batch being written: shielded from the drain's cancellation of ``_run``, so
        # a shutdown waits for it instead of losing it half-way.
        self._in_flight: asyncio.Future[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="post-response-queue")

    def submit(self, org_id: str, agent_id: str, memory_ids: Sequence[str]) -> None:
        """Enqueue without waiting; drops (and counts) what does not fit."""
        now = time.time()
        dropped = 0
        for memory_id in memory_ids:
            try:
                self._queue.put_nowait(InjectionRecord(org_id, agent_id, memory_id, now))
            except asyncio.QueueFull:
                dropped += 1
        if dropped:
            self._hooks.dropped(dropped)
        self._hooks.depth(self._queue.qsize())

    @property
    def depth(self) -> int:
        return self._queue.qsize()

    async def _run(self) -> None:
        while True:
            first = await self._queue.get()
            batch = [first]
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
            # cancellation that races with the get() completing (CPython gh-86296).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(asyncio.get_running_loop().time() + self._flush_interval):
                    while len(batch) < self._batch_size:
                        batch.append(await self._queue.get())
            self._in_flight = asyncio.ensure_future(self._flush(batch))
            await asyncio.shield(self._in_flight)
            self._in_flight = None

    async def _flush(self, batch: list[InjectionRecord]) -> None:
        try:
            await self._recorder.record_injections(batch)
        except Exception as exc:
            self._hooks.failed(len(batch))
            log.warning("recording %d injections failed: %s", len(batch), type(exc).__name__)
        finally:
            self._hooks.depth(self._queue.qsize())

    async def drain(self, timeout: float) -> None:
        """Flush what is queued (at shutdown), the batch being written included, then stop."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=timeout)
            self._task = None
        if self._in_flight is not None:
            await asyncio.wait({self._in_flight}, timeout=timeout)
            self._in_flight = None
        pending: list[InjectionRecord] = []
        while not self._queue.empty():
            pending.append(self._queue.get_nowait())
        if pending:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    for i in range(0, len(pending), self._batch_size):
                        await self._flush(pending[i : i + self._batch_size])
