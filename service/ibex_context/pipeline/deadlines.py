"""The deadline policy of a call, in one place (ADR-0007).

A call has one budget: the profile's ``assemblyMs``, cut to what the caller's gRPC
deadline leaves after the safety margin (serialization and the way back). Retrieval
stops waiting ``compute_reserve`` before the budget ends (``ends_at``), so that scoring,
packing and rendering still finish inside it. Each source is waited for at most its own
timeout (the profile's), counted from the start of retrieval and capped by ``ends_at``,
so sources stop themselves exactly when the assembler stops waiting for them.

Pure arithmetic: the handler asks ``DeadlinePolicy.for_call`` for a call's deadlines,
the assembler anchors them to its clock with ``CallDeadlines.retrieval``; neither
computes a deadline of its own. The per-call values are ``NamedTuple``s (immutable and
cheap to build, see ``pipeline.outcome``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from ibex_context.profiles.model import Deadlines

# Seconds; the defaults of the service (``IBEX_DEADLINE_SAFETY_MARGIN_MS`` sets the first).
DEFAULT_SAFETY_MARGIN = 0.003
DEFAULT_COMPUTE_RESERVE = 0.003


class RetrievalDeadlines(NamedTuple):
    """``time.perf_counter()`` times: when the call stops waiting for retrieval, and for
    each source (the cold one covers the query embedding, the vector and the lexical
    search)."""

    ends_at: float
    directive: float
    hot: float
    cold: float


class CallDeadlines(NamedTuple):
    """One call's deadlines as durations in seconds, before the call is anchored to a clock."""

    # The whole assembly; 0 (never negative): no time at all, answer at once.
    budget: float
    # Kept after retrieval for the compose step.
    compute_reserve: float
    # Each source's own timeout (the profile's).
    directive: float
    hot: float
    cold: float

    def retrieval(self, *, started_at: float, now: float) -> RetrievalDeadlines:
        """The retrieval deadlines of an assembly that started at ``started_at`` and
        starts retrieving at ``now`` (both ``perf_counter()`` seconds)."""
        ends_at = started_at + self.budget - self.compute_reserve
        return RetrievalDeadlines(
            ends_at=ends_at,
            directive=min(now + self.directive, ends_at),
            hot=min(now + self.hot, ends_at),
            cold=min(now + self.cold, ends_at),
        )


@dataclass(frozen=True, slots=True)
class DeadlinePolicy:
    # Kept back from the caller's gRPC deadline for serialization and the network.
    safety_margin: float = DEFAULT_SAFETY_MARGIN
    # Kept for scoring, packing and formatting after retrieval stops waiting.
    compute_reserve: float = DEFAULT_COMPUTE_RESERVE

    def for_call(self, limits: Deadlines, caller_remaining: float | None) -> CallDeadlines:
        """The deadlines of a call under a profile's ``limits``, when the caller has
        ``caller_remaining`` seconds left of its gRPC deadline (None: it set none)."""
        budget = limits.assembly_ms / 1000
        if caller_remaining is not None:
            budget = min(budget, caller_remaining - self.safety_margin)
        return self.within(budget, limits)

    def within(self, budget: float, limits: Deadlines) -> CallDeadlines:
        """The deadlines of a call given ``budget`` seconds outright (the start-up warm-up,
        benchmarks); the profile's source timeouts still apply."""
        return CallDeadlines(
            budget=max(0.0, budget) if math.isfinite(budget) else 0.0,
            compute_reserve=self.compute_reserve,
            directive=limits.directive_ms / 1000,
            hot=limits.hot_ms / 1000,
            cold=limits.cold_ms / 1000,
        )
