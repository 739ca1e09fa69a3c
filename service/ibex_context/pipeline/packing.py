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

from collections.abc import Callable, Sequence
from dataclasses import dataclass


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
