"""How long the event loop keeps ready work waiting: a lag probe and, on the service's
own loop, the longest stretch of work between two polls for I/O.

One event loop runs every call of a process, so a step that holds it (a big
conversion, a garbage collection, a slow callback) delays every other call's next
step by as much. Two measurements show it:

* ``LoopLagProbe``: a timer due every ``interval`` seconds observes how late it ran
  (``ibex_context_event_loop_lag_seconds``). Works on any loop (asyncio, uvloop). An
  idle loop shows up to ~1 ms of lag: epoll waits in whole milliseconds, rounded up
  (``selectors.EpollSelector``; libuv likewise), so read the histogram above 1 ms.
* ``TimedEventLoop``: the asyncio loop ``ibex-context serve`` runs on when
  ``IBEX_USE_UVLOOP=false`` (uvloop is the default, ADR-0010), with a selector
  that times the work between two polls (one loop iteration: every callback that
  was ready, back to back). The probe observes the longest iteration of each
  interval (``ibex_context_event_loop_longest_iteration_seconds``). The cost is two
  clock reads per iteration; uvloop has no such hook, so on uvloop only the lag is
  reported.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Callable
from typing import Any

__all__ = ["IterationClock", "LoopLagProbe", "TimedEventLoop"]

DEFAULT_INTERVAL_SECONDS = 0.05


class IterationClock(selectors.BaseSelector):
    """A selector that delegates to the default one and records the longest stretch
    between a poll's return and the next poll (the loop iteration's work)."""

    def __init__(self, inner: selectors.BaseSelector | None = None) -> None:
        self._inner = inner or selectors.DefaultSelector()
        self._returned_at = 0.0
        self._longest = 0.0

    def take_longest(self) -> float:
        """The longest iteration since the last call (seconds), and start over."""
        longest, self._longest = self._longest, 0.0
        return longest

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        now = time.perf_counter()
        if self._returned_at:
            busy = now - self._returned_at
            if busy > self._longest:
                self._longest = busy
        events = self._inner.select(timeout)
        self._returned_at = time.perf_counter()
        return events

    # The rest is the inner selector's.
    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def close(self) -> None:
        self._inner.close()

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.get_key(fileobj)

    def get_map(self) -> Any:
        return self._inner.get_map()


class TimedEventLoop(asyncio.SelectorEventLoop):
    """asyncio's selector loop over an ``IterationClock``."""

    def __init__(self) -> None:
        self.iterations = IterationClock()
        super().__init__(selector=self.iterations)


class LoopLagProbe:
    """Every ``interval`` seconds: ``observe_lag(seconds late)`` and, on a
    ``TimedEventLoop``, ``observe_longest_iteration(seconds)``."""

    def __init__(
        self,
        observe_lag: Callable[[float], None],
        observe_longest_iteration: Callable[[float], None] | None = None,
        *,
        interval: float = DEFAULT_INTERVAL_SECONDS,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self._observe_lag = observe_lag
        self._observe_longest = observe_longest_iteration
        self._interval = interval
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clock: IterationClock | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    @property
    def times_iterations(self) -> bool:
        return self._clock is not None

    def start(self) -> None:
        """Start on the running loop."""
        if self._handle is not None:
            return
        loop = asyncio.get_running_loop()
        self._loop = loop
        if self._observe_longest is not None and isinstance(loop, TimedEventLoop):
            self._clock = loop.iterations
            self._clock.take_longest()
        self._schedule(loop.time())

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self, now: float) -> None:
        assert self._loop is not None
        self._due = now + self._interval
        self._handle = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        self._observe_lag(max(0.0, now - self._due))
        if self._clock is not None and self._observe_longest is not None:
            self._observe_longest(self._clock.take_longest())
        self._schedule(now)
