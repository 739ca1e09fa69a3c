"""Choose the memories that fit: in rank order, each one that still fits.

The candidates are taken in score order (ties by id); a memory is taken when its
cost fits what the memories ranked above it left, and skipped otherwise, and the
walk goes on past a skip (a shorter memory further down may still fit) until
``max_items`` are taken or the candidates run out.

This is deliberately not a knapsack. ADR-0002 maximised the *sum* of scores
within the budget, and on real memories that objective buys several short,
barely relevant memories instead of one long relevant one: on the LoCoMo dev set
it left out the single best match in 47.5 % of questions and recalled a quarter
of what plain top-k did at 1,000 tokens (ADR-0008). Here a memory is never left
out in favour of memories ranked below it, unless it does not fit on its own
next to those ranked above it.

``was_truncated`` is True when any candidate was left out (every candidate given
here passed the relevance floor, so a left-out one lost to the budget or to
``max_items``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ibex_context.models import ScoredMemory


@dataclass(frozen=True, slots=True)
class PackResult:
    selected: tuple[ScoredMemory, ...]  # in score order, with ``tokens`` set to their cost
    total_tokens: int
    total_score: float
    skipped: int
    was_truncated: bool


def pack_costed(
    candidates: Sequence[ScoredMemory], costs: Sequence[int], budget_tokens: int, *, max_items: int
) -> PackResult:
    """Packs ``candidates`` whose costs are ``costs[i]`` (their ``tokens`` are ignored).

    The selected memories come back with ``tokens`` set to their cost; only
    those are rebuilt, so the caller need not copy every candidate to cost it.
    """
    if len(costs) != len(candidates):
        raise ValueError("costs and candidates differ in length")
    for i, cost in enumerate(costs):
        if cost < 0:
            raise ValueError(f"memory {candidates[i].memory.id!r} has a negative token cost")
    return pack_in_rank_order(candidates, lambda i: int(costs[i]), budget_tokens, max_items=max_items)


def pack_in_rank_order(
    candidates: Sequence[ScoredMemory], cost_of: Callable[[int], int], budget_tokens: int, *, max_items: int
) -> PackResult:
    """``pack_costed`` with ``cost_of(i)`` asked only for the candidates the walk reaches:
    the walk stops at ``max_items``, so a call that injects 20 of 100 candidates costs
    about 20 (the assembler costs a memory exactly, which is not free)."""
    order = sorted(range(len(candidates)), key=lambda i: (-candidates[i].score, candidates[i].memory.id))
    selected: list[ScoredMemory] = []
    used = 0
    for i in order:
        if len(selected) >= max_items:
            break
        cost = cost_of(i)
        if cost < 0:
            raise ValueError(f"memory {candidates[i].memory.id!r} has a negative token cost")
        if used + cost <= budget_tokens:
            selected.append(_with_tokens(candidates[i], cost))
            used += cost
    skipped = len(candidates) - len(selected)
    return PackResult(
        selected=tuple(selected),
        total_tokens=used,
        total_score=math.fsum(c.score for c in selected),
        skipped=skipped,
        was_truncated=skipped > 0,
    )


def _with_tokens(candidate: ScoredMemory, tokens: int) -> ScoredMemory:
    if candidate.tokens == tokens:
        return candidate
    # The constructor, not dataclasses.replace: several times cheaper per item.
    return ScoredMemory(
        candidate.memory,
        candidate.score,
        candidate.relevance,
        candidate.recency,
        candidate.usefulness,
        candidate.confidence,
        candidate.frequency,
        tokens,
        candidate.semantic,
        candidate.lexical,
    )
