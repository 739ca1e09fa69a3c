"""The write-time hot-set score: the request-time composite with relevance fixed at 1."""

from __future__ import annotations

import pytest
from ibex_context.models import MemoryRecord
from ibex_context.profiles.model import ScoringWeights
from ibex_context.stores.hot_score import hot_set_score

NOW = 1_800_000_000.0
DAY = 86_400.0


def memory(**fields: object) -> MemoryRecord:
    base: dict[str, object] = {"id": "m", "content": "c", "category": "factual", "occurred_at": NOW}
    base.update(fields)
    return MemoryRecord(**base)  # type: ignore[arg-type]


def test_a_brand_new_perfect_memory_scores_one() -> None:
    perfect = memory(confidence=1.0, usefulness=1.0, retrieval_count=50)
    assert hot_set_score(perfect, NOW) == pytest.approx(1.0)


def test_recency_halves_after_the_category_half_life() -> None:
    fresh = hot_set_score(memory(category="episodic", confidence=0, usefulness=0), NOW)
    old = hot_set_score(
        memory(category="episodic", confidence=0, usefulness=0, occurred_at=NOW - 14 * DAY), NOW
    )
    assert fresh - old == pytest.approx(ScoringWeights().recency * 0.5)


def test_use_and_confidence_raise_the_score_and_injections_do_not_by_default() -> None:
    plain = hot_set_score(memory(), NOW)
    assert hot_set_score(memory(usefulness=0.9), NOW) > plain
    assert hot_set_score(memory(confidence=0.95), NOW) > plain
    assert hot_set_score(memory(retrieval_count=10), NOW) == plain


def test_a_profile_that_weights_frequency_counts_injections_up_to_the_cap() -> None:
    weights = ScoringWeights(frequency=0.05)
    plain = hot_set_score(memory(), NOW, weights=weights)
    assert hot_set_score(memory(retrieval_count=10), NOW, weights=weights) > plain
    assert hot_set_score(memory(retrieval_count=50), NOW, weights=weights) == hot_set_score(
        memory(retrieval_count=500), NOW, weights=weights
    )
