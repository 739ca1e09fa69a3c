"""In-flight call tracking, so shutdown can wait for calls instead of cutting them (the cap
on assemblies running at once is fair admission's: ``server/admission.py``)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager


async def stop_signal() -> None:
    """Returns once the process is asked to stop: SIGTERM (Kubernetes, systemd) or SIGINT (Ctrl-C)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


class InflightCalls:
    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._last_started = 0.0

    @property
    def count(self) -> int:
        return self._count

    @property
    def last_started(self) -> float:
        """``time.monotonic()`` when the latest call started (0.0: none yet)."""
        return self._last_started

    @contextmanager
    def track(self) -> Iterator[None]:
        self._count += 1
        self._last_started = time.monotonic()
        self._idle.clear()
        try:
            yield
        finally:
            self._count -= 1
            if self._count == 0:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """True when every call finished within ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    async def wait_quiet(self, quiet: float, timeout: float) -> bool:
        """True once no call has been in flight, nor started, for ``quiet`` seconds.

        Idle alone is not enough while clients still send: a server faster than its
        clients is idle between two calls of the same burst.
        """
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await self.wait_idle(remaining):
                return False
            settle = self._last_started + quiet - time.monotonic()
            if settle <= 0 and self._count == 0:
                return True
            await asyncio.sleep(min(max(settle, 0.01), max(deadline - time.monotonic(), 0)))
