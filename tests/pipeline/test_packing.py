"""Packing takes memories in rank order, each one that still fits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ibex_context.pipeline.packing import Packed, pack_ranked


def pack(costs: list[int], budget: int, *, max_items: int) -> Packed:
    """Candidates 0, 1, 2, ... already in rank order, candidate ``i`` costing ``costs[i]``."""
    return pack_ranked(range(len(costs)), costs.__getitem__, budget, max_items=max_items)


@settings(max_examples=200, deadline=None)
@given(
    costs=st.lists(st.integers(0, 2000), max_size=60),
    budget=st.integers(-5, 6000),
    max_items=st.integers(0, 25),
)
def test_never_exceeds_the_budget_or_max_items_and_never_drops_a_better_memory_that_fit(
    costs: list[int], budget: int, max_items: int
) -> None:
    result = pack(costs, budget, max_items=max_items)
    assert result.costs == [costs[i] for i in result.chosen]
    assert result.total_tokens == sum(result.costs) <= max(budget, 0)
    assert len(result.chosen) <= max(max_items, 0)
    assert result.chosen == sorted(result.chosen)  # in rank order
    assert result.was_truncated == (len(result.chosen) < len(costs))
    # Walking the ranking: every memory left out came when max_items were already
    # taken or did not fit next to the better-ranked memories taken before it.
    used = taken = 0
    for i, cost in enumerate(costs):
        if i in result.chosen:
            used, taken = used + cost, taken + 1
        else:
            assert taken >= max_items or used + cost > budget, i


def test_one_relevant_long_memory_beats_several_short_off_topic_ones() -> None:
    # The knapsack of ADR-0002 took the three short ones (sum of scores 1.2 > 0.9).
    assert pack([90, 30, 30, 30], 100, max_items=10).chosen == [0]


def test_skips_what_does_not_fit_and_goes_on_down_the_ranking() -> None:
    result = pack([60, 50, 40], 100, max_items=10)
    assert result.chosen == [0, 2] and result.costs == [60, 40]
    assert result.total_tokens == 100 and result.was_truncated


def test_stops_at_max_items() -> None:
    result = pack([1, 1, 1], 100, max_items=2)
    assert result.chosen == [0, 1] and result.was_truncated


def test_rejects_negative_costs() -> None:
    with pytest.raises(ValueError, match="negative"):
        pack([-1], 10, max_items=1)


def test_walks_indices_in_the_order_given_and_costs_only_what_it_reaches() -> None:
    asked: list[int] = []

    def cost_of(i: int) -> int:
        asked.append(i)
        return {7: 60, 3: 50, 5: 30, 1: 10, 9: 10}[i]

    packed = pack_ranked([7, 3, 5, 1, 9], cost_of, 100, max_items=3)
    # 7 fits, 3 does not next to it, 5 fits, 1 fits: three taken, 9 never costed.
    assert packed.chosen == [7, 5, 1]
    assert packed.costs == [60, 30, 10]
    assert packed.total_tokens == 100
    assert packed.was_truncated
    assert asked == [7, 3, 5, 1]
