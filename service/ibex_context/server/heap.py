"""Keeps the cyclic garbage collector's pauses off the request path.

A full (generation 2) collection walks every object the collector tracks and stops
the event loop while it does. After start-up that is ~80k objects (the imported
modules, protobuf descriptors, pydantic models, tokenizer tables); under load here a
full collection ran every ~11 s and took 60-80 ms, longer than the whole 45 ms call
deadline, so each one failed the few calls in flight
(2026-11-23, ``git show 10aaf5b:benchmarks/results/loadtest/2026-11-23-analysis-third-pass.md``).

Start-up objects live as long as the process, so the service moves them out of the
collector's sight once it has built them (``gc.freeze``, as the CPython docs suggest
for pre-fork servers); full collections then only walk what calls and caches created
since, and garbage cycles among frozen objects (none are expected: they are modules
and singletons) are simply kept. Pauses are measured, not assumed: ``GcPauses`` feeds
``ibex_context_gc_pause_seconds`` so a regression shows on the dashboard.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

__all__ = ["GcPauses", "freeze_startup_heap"]


def freeze_startup_heap() -> int:
    """Collects once, then freezes every surviving object; returns how many were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcPauses:
    """Times every collection through ``gc.callbacks`` and hands (generation, seconds)
    to ``observe``. The callback runs on whatever thread triggered the collection,
    which holds the GIL, so the start time needs no lock."""

    def __init__(self, observe: Callable[[int, float], None]) -> None:
        self._observe = observe
        self._started = 0.0
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._on_gc)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._on_gc)
            self._installed = False

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started:
            self._observe(int(info["generation"]), time.perf_counter() - self._started)
            self._started = 0.0
