"""Choose the memories that fit: a bounded 0/1 knapsack over token costs.

Maximise the total score of the chosen memories subject to
sum(tokens) <= budget and count <= max_items. Each candidate's cost is its
``tokens`` (the caller fills it with the formatted cost).

Method
------
1. Greedy (O(n)): in score order, take what fits, continue past misses, scan
   every candidate. Costs are precomputed, so the reference design's stop
   after 3 consecutive misses only saved tiktoken calls; here it would only
   lose score (``pack_greedy(max_consecutive_skips=3)`` keeps it for
   comparison). Its score is the lower bound below and the floor of the answer.
2. Reduction: items whose upper bound (``_bound_reduction``) is below the
   greedy score, and items dominated by ``max_items`` better-ranked,
   no-costlier ones, are dropped; an optimum never needs them.
3. DP over token buckets: bucket size q = ceil(budget / buckets); an item
   weighs ceil(tokens / q) buckets, the capacity is floor(budget / q).
   Weights round *up* and capacity *down*, so any set the DP accepts has an
   exact sum <= q·floor(budget/q) <= budget: rounding can lose a little score,
   never overflow. ``buckets`` is the most that keeps the table within
   ``cell_ceiling`` cells, up to one per token (then the DP is exact).
   A 1-D DP runs first; if its optimum respects ``max_items`` it is optimal
   for the bounded problem too. Otherwise a DP over (count <= max_items,
   buckets) runs if it fits ``bounded_cell_ceiling``, else the best
   ``max_items`` of the 1-D optimum are kept. Below ``MIN_BUCKETS`` buckets
   the greedy answer is returned (``method="greedy"``).
4. Repair: the slack left by rounding is refilled by exact cost, single swaps
   (a better left-out item for the weakest chosen one the exact costs allow)
   improve the set, the exact sum is checked, and the answer is never worse
   than greedy.

``was_truncated`` is True when any candidate was left out (every candidate
given here passed the relevance floor, so a left-out one lost to the budget
or to ``max_items``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from ibex_context.models import ScoredMemory

# The DP's resolution adapts to its size (see the module docstring). The
# ceilings bound time (roughly 5-15 ns a cell on the shared 2-vCPU machine,
# see benchmarks/results/packing.md) and memory; MAX_BUCKETS only caps huge
# budgets. At n=100, budget 4000 the reduction leaves ~20-50 candidates, so
# the 1-D DP runs at 2-5k buckets (often one token per bucket).
MAX_BUCKETS = 1 << 16
MIN_BUCKETS = 64
DP_CELL_CEILING = 100_000
# The count dimension multiplies the table by max_items + 1, so its DP gets a
# smaller ceiling; above it (~22 undominated candidates at max_items=20) the
# best max_items of the 1-D optimum, refilled and improved by swaps, are used
# (within 1 % of the optimum on average in benchmarks/results/packing.md).
DP_BOUNDED_CELL_CEILING = 30_000
MAX_CONSECUTIVE_SKIPS = 3
# The bound reduction (~25 numpy calls) pays for itself only when it lets the DP
# run on many fewer items; up to this many undominated items the DP runs on them all.
BOUND_REDUCTION_ABOVE = 64

_Floats = npt.NDArray[np.float64]
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
    ordered = sorted(candidates, key=_rank)
    for candidate in ordered:
        if candidate.tokens < 0:
            raise ValueError(f"memory {candidate.memory.id!r} has a negative token cost")
    return ordered


def _rank(candidate: ScoredMemory) -> tuple[float, str]:
    return (-candidate.score, candidate.memory.id)


def _result(ordered: list[ScoredMemory], chosen: Iterable[int], method: Method) -> PackResult:
    return _packed(tuple(ordered[i] for i in sorted(chosen)), len(ordered), method)


def _packed(selected: tuple[ScoredMemory, ...], candidates: int, method: Method) -> PackResult:
    skipped = candidates - len(selected)
    return PackResult(
        selected=selected,
        total_tokens=sum(c.tokens for c in selected),
        total_score=math.fsum(c.score for c in selected),
        skipped=skipped,
        was_truncated=skipped > 0,
        method=method,
    )


def _greedy(tokens: list[int], budget: int, max_items: int, max_consecutive_skips: int | None) -> list[int]:
    """Positions taken by skip-and-continue over costs already in score order."""
    chosen: list[int] = []
    used = 0
    misses = 0
    for i, cost in enumerate(tokens):
        if len(chosen) >= max_items:
            break
        if used + cost <= budget:
            chosen.append(i)
            used += cost
            misses = 0
        else:
            misses += 1
            if max_consecutive_skips is not None and misses >= max_consecutive_skips:
                break
    return chosen


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
        return _result(ordered, (), "empty")
    tokens = [c.tokens for c in ordered]
    return _result(ordered, _greedy(tokens, budget_tokens, max_items, max_consecutive_skips), "greedy")


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


def _lp_values(cost: _Floats, value: _Floats, capacities: _Floats) -> _Floats:
    """Fractional-knapsack optimum over all items, for each capacity."""
    ratio = value / cost
    by_ratio = np.argsort(-ratio, kind="stable")
    prefix_cost = np.concatenate(([0.0], np.cumsum(cost[by_ratio])))
    prefix_value = np.concatenate(([0.0], np.cumsum(value[by_ratio])))
    next_ratio = np.concatenate((ratio[by_ratio], [0.0]))
    whole = np.searchsorted(prefix_cost, capacities, side="right") - 1  # items that fit whole
    result: _Floats = prefix_value[whole] + (capacities - prefix_cost[whole]) * next_ratio[whole]
    return result


def _bound_reduction(
    tokens: list[int], scores: list[float], budget: int, max_items: int, floor: float
) -> list[int]:
    """Positions of items that can belong to a packing scoring more than ``floor``.

    For each item, an upper bound on any packing that contains it: its score plus
    a bound on the best packing of the others into the budget it leaves, with at
    most ``max_items - 1`` of them. Lagrangian relaxation of the count: for any
    mu >= 0 that is at most mu·(max_items - 1) + the fractional-knapsack value of
    the scores reduced by mu (negatives dropped); a few mu are tried and the
    smallest bound kept, as is the sum of the best ``max_items - 1`` scores.
    Items whose bound is below ``floor`` (the greedy packing's score, which the
    optimum is at least) cannot be in an optimum.
    """
    cost = np.maximum(np.asarray(tokens, dtype=np.float64), 1e-9)
    value = np.asarray(scores, dtype=np.float64)
    left = budget - cost
    others = max(0, max_items - 1)
    top = np.sort(value)[::-1]
    kth = top[others] if others < len(top) else -np.inf
    bound = np.where(value >= kth, top[: others + 1].sum() - value, top[:others].sum())
    for rank in (others, len(top)):  # mu = the max_items-th best score, and mu = 0
        mu = max(0.0, float(top[rank])) if rank < len(top) else 0.0
        relaxed = mu * others + _lp_values(cost, np.maximum(value - mu, 0.0), left)
        bound = np.minimum(bound, relaxed)
    return [int(i) for i in np.flatnonzero(value + bound >= floor - 1e-9)]


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
    )


def pack(
    candidates: Sequence[ScoredMemory],
    budget_tokens: int,
    *,
    max_items: int,
    max_buckets: int = MAX_BUCKETS,
    cell_ceiling: int = DP_CELL_CEILING,
    bounded_cell_ceiling: int = DP_BOUNDED_CELL_CEILING,
) -> PackResult:
    """``pack_costed`` with each candidate's cost taken from its ``tokens``."""
    return pack_costed(
        candidates,
        [c.tokens for c in candidates],
        budget_tokens,
        max_items=max_items,
        max_buckets=max_buckets,
        cell_ceiling=cell_ceiling,
        bounded_cell_ceiling=bounded_cell_ceiling,
    )


def pack_costed(
    candidates: Sequence[ScoredMemory],
    costs: Sequence[int],
    budget_tokens: int,
    *,
    max_items: int,
    max_buckets: int = MAX_BUCKETS,
    cell_ceiling: int = DP_CELL_CEILING,
    bounded_cell_ceiling: int = DP_BOUNDED_CELL_CEILING,
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
    order = sorted(range(len(candidates)), key=lambda i: (-candidates[i].score, candidates[i].memory.id))
    all_tokens = [int(costs[i]) for i in order]
    all_scores = [candidates[i].score for i in order]
    chosen, method = _choose(
        all_tokens, all_scores, budget_tokens, max_items, max_buckets, cell_ceiling, bounded_cell_ceiling
    )
    selected = tuple(_with_tokens(candidates[order[p]], all_tokens[p]) for p in sorted(chosen))
    return _packed(selected, len(candidates), method)


def _choose(
    all_tokens: list[int],
    all_scores: list[float],
    budget_tokens: int,
    max_items: int,
    max_buckets: int,
    cell_ceiling: int,
    bounded_cell_ceiling: int,
) -> tuple[list[int], Method]:
    """Positions (in score order) of the packing, and how it was found."""
    if not all_tokens or budget_tokens <= 0 or max_items <= 0:
        return [], "empty"
    fitting = [i for i, t in enumerate(all_tokens) if t <= budget_tokens]
    if not fitting:
        return [], "empty"
    # Everything that fits fits together, within max_items: that is the optimum.
    if len(fitting) <= max_items and sum(all_tokens[i] for i in fitting) <= budget_tokens:
        return fitting, "dp"
    tokens = [all_tokens[i] for i in fitting]
    scores = [all_scores[i] for i in fitting]

    # From here positions index into ``fitting`` (the candidates that fit at all).
    greedy = _greedy(tokens, budget_tokens, max_items, None)
    if len(greedy) == max_items and greedy[-1] == max_items - 1 and scores[max_items - 1] >= 0:
        # The max_items best scores fit together: no packing of at most
        # max_items can score more (the common case when the count binds).
        return [fitting[j] for j in greedy], "dp"
    greedy_score = math.fsum(scores[j] for j in greedy)
    dp_items = _undominated(tokens, max_items)
    if len(dp_items) > BOUND_REDUCTION_ABOVE:
        kept = _bound_reduction(
            [tokens[j] for j in dp_items],
            [scores[j] for j in dp_items],
            budget_tokens,
            max_items,
            greedy_score,
        )
        dp_items = [dp_items[k] for k in kept]
    n = len(dp_items)
    if n == 0:
        return [fitting[j] for j in greedy], "greedy"
    count_bound = min(max_items, n)
    costs = sorted(tokens[j] for j in dp_items)
    # The count can only bind if the count_bound + 1 cheapest items fit together.
    count_may_bind = n > count_bound and sum(costs[: count_bound + 1]) <= budget_tokens
    values = [scores[j] for j in dp_items]

    # First without the count dimension (finer buckets for the same cells): if that
    # optimum respects max_items it is also the optimum of the bounded problem.
    picked: list[int] | None = None
    unbounded: list[int] = []
    buckets = min(max_buckets, budget_tokens, cell_ceiling // n - 1)
    if buckets >= min(MIN_BUCKETS, budget_tokens):
        bucket = math.ceil(budget_tokens / buckets)
        weights = [math.ceil(tokens[j] / bucket) for j in dp_items]
        unbounded = _dp_unbounded_count(weights, values, budget_tokens // bucket)
        picked = unbounded if len(unbounded) <= count_bound else None
    if picked is None and count_may_bind:
        buckets = min(max_buckets, budget_tokens, bounded_cell_ceiling // (n * (count_bound + 1)) - 1)
        if buckets >= min(MIN_BUCKETS, budget_tokens):
            bucket = math.ceil(budget_tokens / buckets)
            weights = [math.ceil(tokens[j] / bucket) for j in dp_items]
            picked = _dp_bounded_count(weights, values, budget_tokens // bucket, count_bound)
        elif unbounded:
            # Too big for the count dimension: the best max_items of the 1-D
            # optimum, then refill and swaps below.
            picked = sorted(unbounded, key=lambda k: (-values[k], k))[:count_bound]
    if picked is None:
        return [fitting[j] for j in greedy], "greedy"
    chosen = {dp_items[k] for k in picked}

    # Refill the slack the bucket rounding left, best first, by exact cost.
    used = sum(tokens[j] for j in chosen)
    for j in range(len(fitting)):
        if len(chosen) >= max_items:
            break
        if j not in chosen and used + tokens[j] <= budget_tokens:
            chosen.add(j)
            used += tokens[j]
    # Improve by single swaps: a better-scored left-out item replaces the weakest
    # chosen one the exact costs allow (recovers most of what coarse buckets lose).
    # Candidates are in score order, so the scan stops at the weakest chosen score.
    weakest_first = sorted(chosen, key=lambda i: (scores[i], -i))
    for j in range(len(fitting)):
        if not weakest_first or scores[j] <= scores[weakest_first[0]]:
            break
        if j in chosen:
            continue
        need = used + tokens[j] - budget_tokens  # tokens the replaced item must free
        for position, i in enumerate(weakest_first):
            if scores[i] >= scores[j]:
                break
            if tokens[i] >= need:
                chosen.remove(i)
                chosen.add(j)
                used += tokens[j] - tokens[i]
                del weakest_first[position]
                weakest_first.append(j)
                weakest_first.sort(key=lambda k: (scores[k], -k))
                break
    # used > budget cannot happen (weights round up); never ship an overflow, and
    # never do worse than greedy.
    if used > budget_tokens or math.fsum(scores[j] for j in chosen) < greedy_score:
        return [fitting[j] for j in greedy], "dp"
    return [fitting[j] for j in chosen], "dp"
