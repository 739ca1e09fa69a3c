"""What the service served, as a user's LLM request gets it: each answer's degradation
level (FULL, PARTIAL, ... or no answer at all within the deadline), the reasons it
gave, and the round trips (p50 / p99 / max)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.quality.metrics import percentile

FULL = "FULL"
_LEVEL_PREFIX = "DEGRADATION_LEVEL_"


def level_name(degradation: str) -> str:
    """``DEGRADATION_LEVEL_PARTIAL`` -> ``PARTIAL``; a client fallback (the service gave no
    answer: ``deadline_exceeded``, ``unavailable`` ...) -> ``no answer (deadline_exceeded)``."""
    if degradation.startswith(_LEVEL_PREFIX):
        return degradation.removeprefix(_LEVEL_PREFIX)
    return f"no answer ({degradation or 'unknown'})"


@dataclass(frozen=True, slots=True)
class Served:
    answers: int
    levels: dict[str, int]  # level -> answers, most common first
    reasons: dict[str, int]  # reason -> answers that gave it, most common first
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None

    @property
    def full_share(self) -> float:
        return self.levels.get(FULL, 0) / self.answers if self.answers else 0.0


def served(levels: Counter[str], reasons: Counter[str], round_trips_ms: Sequence[float]) -> Served:
    """The figures over answers whose levels (``level_name``), reasons and round trips are given."""
    trips = list(round_trips_ms)
    return Served(
        answers=sum(levels.values()),
        levels=dict(levels.most_common()),
        reasons=dict(reasons.most_common()),
        p50_ms=percentile(trips, 50) if trips else None,
        p99_ms=percentile(trips, 99) if trips else None,
        max_ms=max(trips) if trips else None,
    )
