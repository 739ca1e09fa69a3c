from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ibex_context.models import MemoryRecord, ScoredMemory
from ibex_context.pipeline.packing import pack, pack_greedy


def item(id: str, tokens: int, score: float) -> ScoredMemory:
    return ScoredMemory(
        memory=MemoryRecord(id=id, content="", category="factual"),
        score=score,
        relevance=0.0,
        recency=0.0,
        usefulness=0.0,
        confidence=0.0,
        frequency=0.0,
        tokens=tokens,
    )


def oracle(candidates: list[ScoredMemory], budget: int, max_items: int) -> float:
    best = 0.0
    for size in range(min(max_items, len(candidates)) + 1):
        for combo in itertools.combinations(candidates, size):
            if sum(c.tokens for c in combo) <= budget:
                best = max(best, math.fsum(c.score for c in combo))
    return best


items_strategy = st.lists(
    st.tuples(st.integers(0, 2000), st.floats(0, 1, allow_nan=False)), min_size=0, max_size=60
)


@settings(max_examples=150, deadline=None)
@given(items=items_strategy, budget=st.integers(-5, 6000), max_items=st.integers(0, 25))
def test_never_exceeds_the_budget_or_max_items(
    items: list[tuple[int, float]], budget: int, max_items: int
) -> None:
    candidates = [item(f"m{i:02d}", t, s) for i, (t, s) in enumerate(items)]
    result = pack(candidates, budget, max_items=max_items)
    assert result.total_tokens == sum(c.tokens for c in result.selected)
    assert result.total_tokens <= max(budget, 0)
    assert len(result.selected) <= max(max_items, 0)
    assert result.skipped == len(candidates) - len(result.selected)
    assert result.was_truncated == (result.skipped > 0)
    greedy = pack_greedy(candidates, budget, max_items=max_items, max_consecutive_skips=None)
    assert result.total_score >= greedy.total_score - 1e-9


def test_equals_the_brute_force_oracle_on_small_random_cases() -> None:
    rng = random.Random(7)
    for _ in range(250):
        n = rng.randint(1, 12)
        candidates = [item(f"m{i:02d}", rng.randint(1, 120), rng.random()) for i in range(n)]
        budget = rng.randint(1, 250)  # small enough for one-token buckets: exact
        max_items = rng.randint(1, 8)
        result = pack(candidates, budget, max_items=max_items)
        assert result.total_score == pytest.approx(oracle(candidates, budget, max_items), abs=1e-9)


def test_beats_greedy_where_greedy_strands_budget() -> None:
    # Greedy takes the 0.9 item (600 tokens) and strands 400; two 0.5 items fill 1000 exactly.
    candidates = [item("big", 600, 0.9), item("a", 500, 0.5), item("b", 500, 0.5)]
    result = pack(candidates, 1000, max_items=5)
    assert [c.memory.id for c in result.selected] == ["a", "b"]
    assert result.total_score == pytest.approx(1.0)
    assert pack_greedy(candidates, 1000, max_items=5).total_score == pytest.approx(0.9)


def test_selection_is_in_score_order() -> None:
    candidates = [item("c", 10, 0.2), item("a", 10, 0.9), item("b", 10, 0.5)]
    assert [c.memory.id for c in pack(candidates, 100, max_items=5).selected] == ["a", "b", "c"]


def test_respects_max_items_when_the_count_binds() -> None:
    candidates = [item(f"m{i}", 10, 1.0 - i / 100) for i in range(30)]
    result = pack(candidates, 10_000, max_items=4)
    assert [c.memory.id for c in result.selected] == ["m0", "m1", "m2", "m3"]
    assert result.was_truncated and result.skipped == 26


def test_a_single_oversize_item_is_skipped_while_smaller_ones_are_packed() -> None:
    candidates = [item("huge", 5000, 1.0), item("s1", 100, 0.4), item("s2", 100, 0.3)]
    result = pack(candidates, 1000, max_items=5)
    assert [c.memory.id for c in result.selected] == ["s1", "s2"]
    assert result.was_truncated and result.skipped == 1


def test_empty_input_packs_nothing() -> None:
    result = pack([], 1000, max_items=5)
    assert (result.selected, result.method, result.was_truncated, result.skipped) == ((), "empty", False, 0)


@pytest.mark.parametrize("budget", [0, -10])
def test_zero_budget_packs_nothing_and_reports_truncation(budget: int) -> None:
    result = pack([item("a", 1, 0.5)], budget, max_items=5)
    assert (result.selected, result.method, result.was_truncated, result.skipped) == ((), "empty", True, 1)


def test_zero_max_items_packs_nothing() -> None:
    assert pack([item("a", 1, 0.5)], 100, max_items=0).method == "empty"


def test_all_fitting_needs_no_truncation() -> None:
    result = pack([item("a", 10, 0.5), item("b", 20, 0.4)], 100, max_items=5)
    assert result.total_tokens == 30 and not result.was_truncated and result.method == "dp"


def test_falls_back_to_greedy_above_the_cell_ceiling() -> None:
    rng = random.Random(3)
    candidates = [item(f"m{i:03d}", rng.randint(10, 300), rng.random()) for i in range(200)]
    # A budget the 20 best do not fit in (when they do, that is the optimum and
    # no DP runs, see the next test).
    assert sum(c.tokens for c in sorted(candidates, key=lambda c: -c.score)[:20]) > 1500
    result = pack(candidates, 1500, max_items=20, cell_ceiling=1000)
    assert result.method == "greedy"
    assert result.total_tokens <= 1500 and len(result.selected) <= 20
    assert pack(candidates, 1500, max_items=20).method == "dp"


def test_when_the_best_max_items_fit_together_they_are_the_packing() -> None:
    rng = random.Random(4)
    candidates = [item(f"m{i:03d}", rng.randint(10, 300), rng.random()) for i in range(200)]
    best = sorted(candidates, key=lambda c: (-c.score, c.memory.id))[:20]
    budget = sum(c.tokens for c in best)
    result = pack(candidates, budget, max_items=20)
    assert [c.memory.id for c in result.selected] == [c.memory.id for c in best]
    assert result.total_tokens == budget and result.was_truncated


def test_bucketed_dp_never_overflows_with_coarse_buckets() -> None:
    rng = random.Random(11)
    for _ in range(100):
        candidates = [item(f"m{i:02d}", rng.randint(1, 900), rng.random()) for i in range(40)]
        budget = rng.randint(500, 20_000)
        result = pack(candidates, budget, max_items=rng.randint(1, 30), max_buckets=64)
        assert result.total_tokens <= budget


def test_greedy_reference_stops_after_three_consecutive_misses() -> None:
    candidates = [
        item("a", 90, 0.9),
        *(item(f"x{i}", 50, 0.8 - i / 100) for i in range(3)),
        item("z", 5, 0.1),
    ]
    stopped = pack_greedy(candidates, 100, max_items=10, max_consecutive_skips=3)
    scanned = pack_greedy(candidates, 100, max_items=10, max_consecutive_skips=None)
    assert [c.memory.id for c in stopped.selected] == ["a"]
    assert [c.memory.id for c in scanned.selected] == ["a", "z"]


def test_negative_costs_are_rejected() -> None:
    with pytest.raises(ValueError, match="negative"):
        pack([item("a", -1, 0.5)], 100, max_items=5)


def test_identical_inputs_pack_identically_whatever_their_order() -> None:
    rng = random.Random(5)
    candidates = [item(f"m{i:02d}", rng.randint(10, 400), round(rng.random(), 2)) for i in range(40)]
    shuffled = candidates[:]
    rng.shuffle(shuffled)
    assert pack(candidates, 3000, max_items=10) == pack(shuffled, 3000, max_items=10)
