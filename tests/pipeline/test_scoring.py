from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from ibex_context.candidates import Candidates
from ibex_context.models import MemoryRecord, ScoredMemory
from ibex_context.pipeline.scoring import score_candidates
from ibex_context.profiles.model import Scoring, ScoringWeights
from pydantic import ValidationError

NOW = 1_800_000_000.0
DAY = 86_400.0


def memory(id: str = "m", **fields: object) -> MemoryRecord:
    values: dict[str, object] = {"content": "c", "category": "factual", "similarity": 0.5, "occurred_at": NOW}
    values.update(fields)
    return MemoryRecord(id=id, **values)  # type: ignore[arg-type]


def scored_of(records: list[MemoryRecord], *args: object, **kwargs: object) -> list[ScoredMemory]:
    """``score_candidates`` over the columns of ``records`` (as a store would give them)."""
    return score_candidates(Candidates.from_records(records), *args, **kwargs)  # type: ignore[arg-type]


def test_relevance_decides_and_the_other_signals_only_scale_it() -> None:
    # Both a year old (factual half-life 180 d: recency 0.5 ** (365 / 180) = 0.2453).
    strong_elsewhere = memory(
        "a", similarity=0.35, usefulness=1.0, confidence=1.0, retrieval_count=50, occurred_at=NOW - 365 * DAY
    )
    more_relevant = memory(
        "b", similarity=0.95, usefulness=0.0, confidence=0.1, retrieval_count=0, occurred_at=NOW - 365 * DAY
    )
    scored = scored_of([strong_elsewhere, more_relevant], None, Scoring(), NOW)
    recency = 0.5 ** (365 / 180)
    # Default weights 0.80 / 0.08 / 0.08 / 0.04 / 0 (sum 1): relevance x adjustment.
    assert [s.memory.id for s in scored] == ["b", "a"]
    assert scored[0].score == pytest.approx(0.95 * (0.80 + 0.08 * recency + 0.0 + 0.04 * 0.1))
    assert scored[1].score == pytest.approx(0.35 * (0.80 + 0.08 * recency + 0.08 + 0.04))


def test_no_adjustment_lifts_a_memory_by_more_than_the_share_of_the_other_weights() -> None:
    best_otherwise = memory("a", similarity=0.5, usefulness=1.0, confidence=1.0, retrieval_count=50)
    worst_otherwise = memory(
        "b", similarity=0.5, usefulness=0.0, confidence=0.0, occurred_at=NOW - 10_000 * DAY
    )
    everything = Scoring(
        weights=ScoringWeights(relevance=0.8, recency=0.05, usefulness=0.05, confidence=0.05, frequency=0.05)
    )
    high, low = scored_of([best_otherwise, worst_otherwise], None, everything, NOW)
    assert high.score == pytest.approx(0.5)
    assert low.score == pytest.approx(0.5 * 0.8, rel=1e-3)


def test_relevance_blends_semantic_and_saturated_lexical_when_the_lexical_search_ran() -> None:
    both = memory("both", similarity=0.6, lexical_score=10.0)  # lexical 10 / (10 + 10) = 0.5
    semantic_only = memory("sem", similarity=0.6)  # not returned by the lexical search: 0
    scored = {
        s.memory.id: s for s in scored_of([both, semantic_only], None, Scoring(), NOW, lexical_searched=True)
    }
    assert (scored["both"].semantic, scored["both"].lexical) == (pytest.approx(0.6), pytest.approx(0.5))
    assert scored["both"].relevance == pytest.approx(0.5 * 0.6 + 0.5 * 0.5)
    assert scored["sem"].relevance == pytest.approx(0.5 * 0.6)


def test_without_a_lexical_search_relevance_is_the_semantic_half_alone() -> None:
    (scored,) = scored_of([memory(similarity=0.6, lexical_score=None)], None, Scoring(), NOW)
    assert scored.relevance == pytest.approx(0.6) and scored.lexical == 0.0


def test_without_a_query_embedding_lexical_matches_rank_above_the_unfloored_hot_memories() -> None:
    lexical_match = memory("lex", similarity=None, lexical_score=30.0, embedding=np.ones(3, dtype=np.float32))
    hot = memory("hot", similarity=None, embedding=np.ones(3, dtype=np.float32))
    scored = scored_of([hot, lexical_match], None, Scoring(), NOW, lexical_searched=True)
    assert [s.memory.id for s in scored] == ["lex", "hot"]
    assert scored[0].relevance == pytest.approx(0.5 * 0.5 + 0.5 * 30 / 40)
    assert scored[1].relevance == pytest.approx(0.5 * 0.5)  # below the floor, kept: unknown


def test_lexical_weight_moves_the_blend() -> None:
    record = memory(similarity=0.2, lexical_score=90.0)  # lexical 0.9
    (scored,) = scored_of([record], None, Scoring(lexical_weight=1.0), NOW, lexical_searched=True)
    assert scored.relevance == pytest.approx(0.9)


@pytest.mark.parametrize(
    ("category", "half_life"),
    [("factual", 180), ("procedural", 120), ("preference", 45), ("behavioral", 30), ("episodic", 14)],
)
def test_recency_halves_at_the_category_half_life(category: str, half_life: float) -> None:
    record = memory(category=category, occurred_at=NOW - half_life * DAY)
    (scored,) = scored_of([record], None, Scoring(), NOW)
    assert scored.recency == pytest.approx(0.5)


def test_unknown_category_uses_a_14_day_half_life() -> None:
    (scored,) = scored_of([memory(category="gossip", occurred_at=NOW - 14 * DAY)], None, Scoring(), NOW)
    assert scored.recency == pytest.approx(0.5)


def test_unknown_age_is_neutral() -> None:
    (scored,) = scored_of([memory(occurred_at=None)], None, Scoring(), NOW)
    assert scored.recency == 0.5


def test_future_creation_time_counts_as_new() -> None:
    (scored,) = scored_of([memory(occurred_at=NOW + DAY)], None, Scoring(), NOW)
    assert scored.recency == 1.0


def test_frequency_caps_at_50_retrievals() -> None:
    scored = scored_of(
        [memory("a", retrieval_count=25), memory("b", retrieval_count=50), memory("c", retrieval_count=5000)],
        None,
        Scoring(),
        NOW,
    )
    by_id = {s.memory.id: s.frequency for s in scored}
    assert by_id == {"a": 0.5, "b": 1.0, "c": 1.0}


def test_missing_usefulness_and_confidence_take_their_defaults() -> None:
    (scored,) = scored_of([memory(usefulness=None, confidence=None)], None, Scoring(), NOW)
    assert (scored.usefulness, scored.confidence) == (0.5, 0.8)


def test_scores_are_sorted_descending_with_ties_broken_by_id() -> None:
    records = [memory(f"m{i}", similarity=s) for i, s in enumerate([0.3, 0.9, 0.6, 0.9, 0.2])]
    scored = scored_of(records, None, Scoring(), NOW)
    assert [s.memory.id for s in scored] == ["m1", "m3", "m2", "m0", "m4"]
    assert all(a.score >= b.score for a, b in itertools.pairwise(scored))


def test_a_word_shared_with_the_query_keeps_a_memory_below_the_semantic_floor() -> None:
    weak_but_matching = memory("w", similarity=0.12, lexical_score=1.0)
    off_topic = memory("o", similarity=0.12)
    scored = scored_of([weak_but_matching, off_topic], None, Scoring(), NOW, lexical_searched=True)
    assert [s.memory.id for s in scored] == ["w"]


def test_relevance_below_the_floor_is_dropped() -> None:
    scored = scored_of([memory("low", similarity=0.149), memory("ok", similarity=0.15)], None, Scoring(), NOW)
    assert [s.memory.id for s in scored] == ["ok"]


def test_hot_memories_get_a_real_cosine_relevance() -> None:
    query = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    aligned = memory("aligned", similarity=None, embedding=np.array([2.0, 0.0, 0.0], dtype=np.float32))
    diagonal = memory("diag", similarity=None, embedding=np.array([1.0, 1.0, 0.0], dtype=np.float32))
    opposite = memory("opp", similarity=None, embedding=np.array([-1.0, 0.0, 0.0], dtype=np.float32))
    scored = {s.memory.id: s for s in scored_of([aligned, diagonal, opposite], query, Scoring(), NOW)}
    assert scored["aligned"].relevance == pytest.approx(1.0)
    assert scored["diag"].relevance == pytest.approx(1 / math.sqrt(2))
    assert "opp" not in scored  # cosine -1 -> relevance 0, below the floor


def test_without_a_query_embedding_relevance_is_neutral_and_not_floored() -> None:
    hot = memory("hot", similarity=None, embedding=np.ones(3, dtype=np.float32))
    (scored,) = scored_of([hot], None, Scoring(), NOW)
    assert scored.relevance == 0.5


def test_embedding_of_another_dimension_is_treated_as_unknown() -> None:
    hot = memory("hot", similarity=None, embedding=np.ones(4, dtype=np.float32))
    (scored,) = scored_of([hot], np.ones(3, dtype=np.float32), Scoring(), NOW)
    assert scored.relevance == 0.5


def test_weights_are_normalised_by_their_sum() -> None:
    default = ScoringWeights(frequency=0.05)
    halved = Scoring(weights=ScoringWeights(**{k: v / 2 for k, v in default.model_dump().items()}))
    record = memory(similarity=0.7, usefulness=0.3, confidence=0.6, retrieval_count=10)
    (a,) = scored_of([record], None, Scoring(weights=default), NOW)
    (b,) = scored_of([record], None, halved, NOW)
    assert a.score == pytest.approx(b.score)


def test_every_component_is_kept_and_tokens_left_zero() -> None:
    (scored,) = scored_of([memory(similarity=0.6, usefulness=0.7, confidence=0.9)], None, Scoring(), NOW)
    expected = 0.6 * (0.80 + 0.08 * 1.0 + 0.08 * 0.7 + 0.04 * 0.9)
    assert scored.score == pytest.approx(expected)
    assert (scored.relevance, scored.recency, scored.usefulness, scored.confidence) == (0.6, 1.0, 0.7, 0.9)
    assert scored.tokens == 0


def test_no_candidates_give_no_scores() -> None:
    assert scored_of([], None, Scoring(), NOW) == []


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: ScoringWeights(relevance=0, recency=0, usefulness=0, confidence=0, frequency=0), "weights"),
        (lambda: ScoringWeights(relevance=-0.1), "relevance"),
        (lambda: ScoringWeights(recency=math.nan), "recency"),
        (lambda: Scoring(half_lives_days={"factual": 0.0}), "half_lives_days.factual"),
        (lambda: Scoring(relevance_floor=1.0), "relevance_floor"),
        (lambda: Scoring(lexical_weight=1.5), "lexical_weight"),
    ],
)
def test_invalid_scoring_cannot_be_built_so_scoring_never_rechecks_it(build: object, field: str) -> None:
    # Validated once, where the values are made (the profile's load); score_candidates trusts them.
    with pytest.raises(ValidationError) as caught:
        build()  # type: ignore[operator]
    assert field in {".".join(map(str, e["loc"])) or "weights" for e in caught.value.errors()}
