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


@dataclass(frozen=True, slots=True)
class Packed:
    """The walk's outcome as indices: ``chosen`` in rank order, ``costs[k]`` the cost of
    ``chosen[k]``."""

    chosen: list[int]
    costs: list[int]
    total_tokens: int
    was_truncated: bool


def pack_ranked(
    order: Sequence[int], cost_of: Callable[[int], int], budget_tokens: int, *, max_items: int
) -> Packed:
    """The rank-order walk over candidate indices already best first (``order``);
    ``cost_of(i)`` is asked only for the candidates the walk reaches (it stops at
    ``max_items``, so a call that injects 20 of 100 candidates costs about 20)."""
    chosen: list[int] = []
    costs: list[int] = []
    used = 0
    for i in order:
        if len(chosen) >= max_items:
            break
        cost = cost_of(i)
        if cost < 0:
            raise ValueError(f"candidate {i} has a negative token cost")
        if used + cost <= budget_tokens:
            chosen.append(i)
            costs.append(cost)
            used += cost
    return Packed(chosen, costs, used, was_truncated=len(chosen) < len(order))


def pack_in_rank_order(
    candidates: Sequence[ScoredMemory], cost_of: Callable[[int], int], budget_tokens: int, *, max_items: int
) -> PackResult:
    """``pack_ranked`` over ``candidates`` in score order (ties by id)."""
    order = sorted(range(len(candidates)), key=lambda i: (-candidates[i].score, candidates[i].memory.id))
    packed = pack_ranked(order, cost_of, budget_tokens, max_items=max_items)
    selected = tuple(_with_tokens(candidates[i], c) for i, c in zip(packed.chosen, packed.costs, strict=True))
    return PackResult(
        selected=selected,
        total_tokens=packed.total_tokens,
        total_score=math.fsum(c.score for c in selected),
        skipped=len(candidates) - len(selected),
        was_truncated=packed.was_truncated,
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
