"""How busy the process's CPU is: what fair admission reads to tell a busy process from a
saturated one (``server/admission.py``).

Slots are not the core: a flooding org holding its share of the assembly slots keeps
the one core it runs on busy, and a quiet org's call beside those calls waits its turn
for the core at every step (measured: a quiet org 67.7 % FULL beside a flood with fair
shares of four slots; docs/adr/0014). The meter reads two clocks every ``window``
seconds, on the thread that asks (the event loop's):

* the process's CPU time (every thread: the event loop, the embedding workers, grpc's
  poller) over the cores it may use (``available_cpus``);
* the asking thread's own CPU time: one event loop runs every call, so it saturates at
  one core however many the process has.

``busy`` is the larger of the two, as a fraction of the window.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["CpuMeter", "available_cpus"]

_CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def available_cpus(cgroup_cpu_max: Path = _CGROUP_CPU_MAX) -> float:
    """Cores the process may use: its CPU affinity, bounded by a cgroup v2 quota (a
    Kubernetes CPU limit) when one is set."""
    cores = float(len(os.sched_getaffinity(0)))
    try:
        quota, period = cgroup_cpu_max.read_text(encoding="ascii").split()[:2]
    except (OSError, ValueError):
        return cores
    if quota == "max":
        return cores
    try:
        return max(0.01, min(cores, int(quota) / int(period)))
    except (ValueError, ZeroDivisionError):
        return cores


class CpuMeter:
    """The CPU the process used over the last ``window`` seconds, as a fraction of what it
    may use (``busy``), read at most once a window."""

    def __init__(
        self,
        cpus: float,
        *,
        window: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        process_clock: Callable[[], float] = time.process_time,
        thread_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        if cpus <= 0 or window <= 0:
            raise ValueError("cpus and window must be > 0")
        self._cpus = cpus
        self._window = window
        self._clock = clock
        self._process_clock = process_clock
        self._thread_clock = thread_clock
        # Read first by the first ``busy``, on the thread that asks from then on.
        self._read_at: float | None = None
        self._process = self._thread = 0.0
        self._busy = 0.0

    @property
    def cpus(self) -> float:
        return self._cpus

    def busy(self) -> float:
        """0 (idle) to 1 (every core it may use, or the asking thread's own, all the
        time) over the last whole window; the first window reads 0."""
        now = self._clock()
        if self._read_at is None:
            self._read_at, self._process, self._thread = now, self._process_clock(), self._thread_clock()
            return 0.0
        elapsed = now - self._read_at
        if elapsed >= self._window:
            process, thread = self._process_clock(), self._thread_clock()
            used = max((process - self._process) / (elapsed * self._cpus), (thread - self._thread) / elapsed)
            self._busy = max(0.0, min(1.0, used))
            self._read_at, self._process, self._thread = now, process, thread
        return self._busy
