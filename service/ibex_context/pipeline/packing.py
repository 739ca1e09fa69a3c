"""Choose the memories that fit: a bounded 0/1 knapsack over token costs.

Maximise the total score of the chosen memories subject to
sum(tokens) <= budget and count <= max_items. Each candidate's cost is its
``tokens`` (the caller fills it with the formatted cost).

Method
------
* Costs are bucketed: bucket size q = ceil(budget / buckets); an item
  weighs ceil(tokens / q) buckets and the capacity is floor(budget / q)
  buckets. Rounding the weights *up* and the capacity *down* means any set the
  DP accepts has an exact sum <= q·floor(budget/q) <= budget: bucketing can lose
  a little score, never overflow. ``buckets`` is the largest count (<=
  ``max_buckets``) that keeps the table under ``cell_ceiling``; for a budget that
  small q = 1 and the DP is exact.
* The item-count dimension is added only when it can bind (the
  ``max_items + 1`` lightest items fit together); otherwise a 1-D DP over
  buckets is already optimal for the bounded problem.
* Repair/refill: the slack the rounding left is refilled greedily with the
  best remaining items whose exact cost fits, and the exact sum is checked.
* Greedy runs first in every case (O(n)): in score order, take what fits and
  continue past misses. Its score is the lower bound for the reduction below
  and the answer when the DP table would be too large (even ``MIN_BUCKETS``
  buckets over ``cell_ceiling``). Costs are precomputed, so the greedy scans
  every candidate: the reference design's stop after 3 consecutive misses only
  saved tiktoken calls, and here it would only lose score.
  ``pack_greedy(max_consecutive_skips=3)`` keeps that rule for comparison.
* Reduction: items whose upper bound (see ``_bound_reduction``) is below the
  greedy score, and items dominated by ``max_items`` better, cheaper ones, are
  dropped before the DP; at production sizes this leaves a fraction of them.

``was_truncated`` is True when any candidate was left out (every candidate
given here passed the relevance floor, so a left-out one lost to the budget
or to ``max_items``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ibex_context.models import ScoredMemory

# The DP's resolution adapts to its size: as many token buckets (up to
# MAX_BUCKETS, and never coarser than one token when the budget is smaller) as
# keep the table within DP_CELL_CEILING cells (items x count rows x buckets).
# 250k cells is ~1 ms on one core of the 2-vCPU reference machine (see
# benchmarks/results/packing.md). If even MIN_BUCKETS buckets would exceed it
# (~180 candidates with the count dimension, ~3,800 without), the packer falls
# back to its greedy answer: a coarser DP would lose more to rounding than greedy.
MAX_BUCKETS = 512
MIN_BUCKETS = 64
DP_CELL_CEILING = 100_000
MAX_CONSECUTIVE_SKIPS = 3

Method = Literal["dp", "greedy", "empty"]


@dataclass(frozen=True, slots=True)
class PackResult:
    selected: tuple[ScoredMemory, ...]  # in score order
    total_tokens: int
    total_score: float
    skipped: int
    was_truncated: bool
    method: Method


def _score_order(candidates: Sequence[ScoredMemory]) -> list[ScoredMemory]:
    for candidate in candidates:
        if candidate.tokens < 0:
            raise ValueError(f"memory {candidate.memory.id!r} has a negative token cost")
    return sorted(candidates, key=lambda c: (-c.score, c.memory.id))


def _result(ordered: list[ScoredMemory], chosen: set[int], method: Method) -> PackResult:
    selected = tuple(ordered[i] for i in sorted(chosen))
    skipped = len(ordered) - len(selected)
    return PackResult(
        selected=selected,
        total_tokens=sum(c.tokens for c in selected),
        total_score=math.fsum(c.score for c in selected),
        skipped=skipped,
        was_truncated=skipped > 0,
        method=method,
    )


def pack_greedy(
    candidates: Sequence[ScoredMemory],
    budget_tokens: int,
    *,
    max_items: int,
    max_consecutive_skips: int | None = MAX_CONSECUTIVE_SKIPS,
) -> PackResult:
    """Greedy skip-and-continue in score order; ``None`` scans every candidate."""
    ordered = _score_order(candidates)
    if not ordered or budget_tokens <= 0 or max_items <= 0:
        return _result(ordered, set(), "empty")
    chosen: set[int] = set()
    used = 0
    misses = 0
    for i, candidate in enumerate(ordered):
        if len(chosen) >= max_items:
            break
        if used + candidate.tokens <= budget_tokens:
            chosen.add(i)
            used += candidate.tokens
            misses = 0
        else:
            misses += 1
            if max_consecutive_skips is not None and misses >= max_consecutive_skips:
                break
    return _result(ordered, chosen, "greedy")


def _dp_unbounded_count(weights: list[int], values: list[float], capacity: int) -> list[int]:
    """0/1 knapsack on bucket weights; indices chosen."""
    n = len(weights)
    best = np.zeros(capacity + 1, dtype=np.float64)
    take = np.zeros((n, capacity + 1), dtype=np.bool_)
    for i in range(n):
        w = weights[i]
        with_item = best[: capacity + 1 - w] + values[i]  # a copy: best is updated below
        current = best[w:]
        np.greater(with_item, current, out=take[i, w:])
        np.maximum(current, with_item, out=current)
    chosen: list[int] = []
    c = capacity
    for i in range(n - 1, -1, -1):
        if take[i, c]:
            chosen.append(i)
            c -= weights[i]
    return chosen


def _dp_bounded_count(weights: list[int], values: list[float], capacity: int, max_items: int) -> list[int]:
    """0/1 knapsack with at most ``max_items`` items; indices chosen."""
    n = len(weights)
    # best[k, c]: best score with at most k items and at most c buckets.
    best = np.zeros((max_items + 1, capacity + 1), dtype=np.float64)
    take = np.zeros((n, max_items + 1, capacity + 1), dtype=np.bool_)
    for i in range(n):
        w = weights[i]
        with_item = best[:-1, : capacity + 1 - w] + values[i]  # a copy: best is updated below
        current = best[1:, w:]
        np.greater(with_item, current, out=take[i, 1:, w:])
        np.maximum(current, with_item, out=current)
    chosen: list[int] = []
    k, c = max_items, capacity
    for i in range(n - 1, -1, -1):
        if k > 0 and take[i, k, c]:
            chosen.append(i)
            k -= 1
            c -= weights[i]
    return chosen


def _undominated(tokens: list[int], max_items: int) -> list[int]:
    """Positions (in score order) of items some optimal packing may need.

    An item with at least ``max_items`` items ranked above it that cost no
    more can always be swapped for one of them (a packing holds at most
    ``max_items - 1`` others), so dropping it keeps an optimum.
    """
    costs = np.asarray(tokens, dtype=np.int64)
    cheaper_and_better = np.tril(costs[None, :] <= costs[:, None], k=-1)
    keep = cheaper_and_better.sum(axis=1) < max_items
    return [int(i) for i in np.flatnonzero(keep)]


def _bound_reduction(
    tokens: list[int], scores: list[float], budget: int, max_items: int, floor: float
) -> list[int]:
    """Positions of items that can belong to a packing scoring more than ``floor``.

    For each item, an upper bound on any packing that contains it: its score
    plus the lesser of (a) the fractional-knapsack (LP) value of the budget left
    after it, over all items, and (b) the sum of the best ``max_items - 1``
    other scores. Items whose bound is below ``floor`` (the greedy packing's
    score, which the optimum is at least) cannot be in an optimum.
    """
    cost = np.maximum(np.asarray(tokens, dtype=np.float64), 1e-9)
    value = np.asarray(scores, dtype=np.float64)
    by_ratio = np.argsort(-(value / cost), kind="stable")
    prefix_cost = np.concatenate(([0.0], np.cumsum(cost[by_ratio])))
    prefix_value = np.concatenate(([0.0], np.cumsum(value[by_ratio])))
    left = budget - cost
    whole = np.searchsorted(prefix_cost, left, side="right") - 1  # items that fit whole
    ratio_sorted = np.concatenate(((value / cost)[by_ratio], [0.0]))
    lp = prefix_value[whole] + (left - prefix_cost[whole]) * ratio_sorted[whole]
    top = np.sort(value)[::-1]
    k = max(0, max_items - 1)
    best_others = np.where(
        value >= (top[k] if k < len(top) else -np.inf), top[: k + 1].sum() - value, top[:k].sum()
    )
    bound = value + np.minimum(lp, best_others)
    return [int(i) for i in np.flatnonzero(bound >= floor - 1e-9)]


def pack(
    candidates: Sequence[ScoredMemory],
    budget_tokens: int,
    *,
    max_items: int,
    max_buckets: int = MAX_BUCKETS,
    cell_ceiling: int = DP_CELL_CEILING,
) -> PackResult:
    ordered = _score_order(candidates)
    if not ordered or budget_tokens <= 0 or max_items <= 0:
        return _result(ordered, set(), "empty")
    fitting = [i for i, c in enumerate(ordered) if c.tokens <= budget_tokens]
    if not fitting:
        return _result(ordered, set(), "empty")
    greedy = pack_greedy(ordered, budget_tokens, max_items=max_items, max_consecutive_skips=None)
    reduced = [
        fitting[j]
        for j in _bound_reduction(
            [ordered[i].tokens for i in fitting],
            [ordered[i].score for i in fitting],
            budget_tokens,
            max_items,
            greedy.total_score,
        )
    ]
    candidates_for_dp = [reduced[j] for j in _undominated([ordered[i].tokens for i in reduced], max_items)]
    if not candidates_for_dp:
        return greedy
    n = len(candidates_for_dp)
    count_bound = min(max_items, n)
    costs = sorted(ordered[i].tokens for i in candidates_for_dp)
    # The count can only bind if the count_bound + 1 cheapest items fit together.
    count_may_bind = n > count_bound and sum(costs[: count_bound + 1]) <= budget_tokens
    rows = count_bound + 1 if count_may_bind else 1
    buckets = min(max_buckets, budget_tokens, cell_ceiling // (n * rows) - 1)
    if buckets < min(MIN_BUCKETS, budget_tokens):
        return greedy
    bucket = math.ceil(budget_tokens / buckets)
    capacity = budget_tokens // bucket
    weights = [math.ceil(ordered[i].tokens / bucket) for i in candidates_for_dp]
    values = [ordered[i].score for i in candidates_for_dp]
    if count_may_bind:
        picked = _dp_bounded_count(weights, values, capacity, count_bound)
    else:
        picked = _dp_unbounded_count(weights, values, capacity)
    chosen = {candidates_for_dp[j] for j in picked}

    # Refill the slack the bucket rounding left, best first, by exact cost.
    used = sum(ordered[i].tokens for i in chosen)
    for i in fitting:
        if len(chosen) >= max_items:
            break
        if i not in chosen and used + ordered[i].tokens <= budget_tokens:
            chosen.add(i)
            used += ordered[i].tokens
    result = _result(ordered, chosen, "dp")
    # used > budget cannot happen (weights round up); never ship an overflow, and
    # never do worse than greedy.
    if used > budget_tokens or result.total_score < greedy.total_score:
        return greedy
    return result
