"""Packing takes memories in rank order, each one that still fits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ibex_context.models import MemoryRecord, ScoredMemory
from ibex_context.pipeline.packing import PackResult, pack_costed, pack_in_rank_order


def item(id: str, tokens: int, score: float) -> ScoredMemory:
    return ScoredMemory(
        memory=MemoryRecord(id=id, content="", category="factual"),
        score=score,
        relevance=score,
        recency=0.0,
        usefulness=0.0,
        confidence=0.0,
        frequency=0.0,
        tokens=tokens,
    )


def pack(candidates: list[ScoredMemory], budget: int, *, max_items: int) -> PackResult:
    """Each candidate costing its ``tokens``: the tests state costs on the items."""
    return pack_costed(candidates, [c.tokens for c in candidates], budget, max_items=max_items)


items_strategy = st.lists(
    st.tuples(st.integers(0, 2000), st.floats(0, 1, allow_nan=False)), min_size=0, max_size=60
)


@settings(max_examples=200, deadline=None)
@given(items=items_strategy, budget=st.integers(-5, 6000), max_items=st.integers(0, 25))
def test_never_exceeds_the_budget_or_max_items_and_never_drops_a_better_memory_that_fit(
    items: list[tuple[int, float]], budget: int, max_items: int
) -> None:
    candidates = [item(f"m{i:02d}", t, s) for i, (t, s) in enumerate(items)]
    result = pack(candidates, budget, max_items=max_items)
    assert result.total_tokens == sum(c.tokens for c in result.selected)
    assert result.total_tokens <= max(budget, 0)
    assert len(result.selected) <= max(max_items, 0)
    assert result.skipped == len(candidates) - len(result.selected)
    assert result.was_truncated == (result.skipped > 0)
    # Walking the ranking: every memory left out came when max_items were already
    # taken or did not fit next to the better-ranked memories taken before it.
    chosen = {c.memory.id for c in result.selected}
    used = taken = 0
    for candidate in sorted(candidates, key=lambda c: (-c.score, c.memory.id)):
        if candidate.memory.id in chosen:
            used, taken = used + candidate.tokens, taken + 1
        else:
            assert taken >= max_items or used + candidate.tokens > budget, candidate.memory.id


def test_one_relevant_long_memory_beats_several_short_off_topic_ones() -> None:
    # The knapsack of ADR-0002 took the three short ones (sum 1.2 > 0.9).
    relevant = item("relevant", 90, 0.9)
    filler = [item(f"short-{i}", 30, 0.4) for i in range(3)]
    result = pack([*filler, relevant], 100, max_items=10)
    assert [c.memory.id for c in result.selected] == ["relevant"]


def test_skips_what_does_not_fit_and_goes_on_down_the_ranking() -> None:
    result = pack([item("a", 60, 0.9), item("b", 50, 0.8), item("c", 40, 0.7)], 100, max_items=10)
    assert [c.memory.id for c in result.selected] == ["a", "c"]
    assert result.total_tokens == 100 and result.skipped == 1 and result.was_truncated


def test_stops_at_max_items_in_rank_order_ties_broken_by_id() -> None:
    result = pack([item("b", 1, 0.5), item("a", 1, 0.5), item("c", 1, 0.9)], 100, max_items=2)
    assert [c.memory.id for c in result.selected] == ["c", "a"]


def test_costs_given_apart_are_set_on_the_selected_memories_only() -> None:
    candidates = [item("a", 0, 0.9), item("b", 0, 0.8)]
    result = pack_costed(candidates, [70, 50], 100, max_items=10)
    assert [(c.memory.id, c.tokens) for c in result.selected] == [("a", 70)]
    assert candidates[1].tokens == 0


def test_rejects_negative_costs_and_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="negative"):
        pack([item("a", -1, 0.5)], 10, max_items=1)
    with pytest.raises(ValueError, match="length"):
        pack_costed([item("a", 1, 0.5)], [], 10, max_items=1)


def test_only_the_candidates_the_walk_reaches_are_costed() -> None:
    candidates = [item(f"m{i}", 0, 1.0 - i / 100) for i in range(50)]
    asked: list[int] = []

    def cost_of(i: int) -> int:
        asked.append(i)
        return 10

    result = pack_in_rank_order(candidates, cost_of, 1000, max_items=3)
    assert [c.memory.id for c in result.selected] == ["m0", "m1", "m2"]
    assert asked == [0, 1, 2]


def test_pack_ranked_walks_indices_in_the_order_given_and_costs_only_what_it_reaches() -> None:
    from ibex_context.pipeline.packing import pack_ranked

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
