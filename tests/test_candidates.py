"""Candidates: one call's retrieved memories as columns, and how the sources' are merged."""

from __future__ import annotations

import math

import numpy as np
from ibex_context.candidates import Candidates, concat, merge
from ibex_context.models import MemoryRecord, Source


def vector(*values: float) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def memory(id: str, **fields: object) -> MemoryRecord:
    values: dict[str, object] = {"content": f"content of {id}", "category": "factual"}
    values.update(fields)
    return MemoryRecord(id=id, **values)  # type: ignore[arg-type]


def of(*records: MemoryRecord, source: Source = Source.COLD) -> Candidates:
    return Candidates.from_records(list(records), source)


def test_records_become_columns_and_come_back_field_for_field() -> None:
    written = [
        memory(
            "a",
            confidence=0.9,
            usefulness=0.4,
            retrieval_count=3,
            occurred_at=1_700_000_000.5,
            last_injected_at=1_700_000_100.0,
            token_counts={"o200k_base": 5},
            similarity=0.7,
            lexical_score=2.5,
            source=Source.HOT_AND_COLD,
        ),
        memory("b", embedding=vector(1, 0, 0)),
    ]
    candidates = Candidates.from_records(written)
    assert len(candidates) == 2 and candidates.ids == ["a", "b"]
    # Unknown numbers are NaN in the columns, None on the record.
    assert math.isnan(candidates.similarity[1]) and math.isnan(candidates.confidence[1])
    assert candidates.vector_rows.tolist() == [-1, 0]
    first, second = candidates.records()
    assert first == written[0]
    assert second.embedding is not None and second.embedding.tolist() == [1, 0, 0]
    assert (second.similarity, second.lexical_score, second.confidence) == (None, None, None)


def test_a_source_marks_every_row_it_gives() -> None:
    hot = of(memory("a"), memory("b"), source=Source.HOT)
    assert [r.source for r in hot.records()] == [Source.HOT, Source.HOT]


def test_take_picks_rows_in_the_order_given_with_their_vectors() -> None:
    candidates = of(memory("a", embedding=vector(1, 0)), memory("b"), memory("c", embedding=vector(0, 1)))
    picked = candidates.take(np.array([2, 0]))
    assert picked.ids == ["c", "a"]
    assert [r.embedding.tolist() for r in picked.records() if r.embedding is not None] == [[0, 1], [1, 0]]


def test_a_vector_match_keeps_its_similarity_and_gets_the_lexical_score_of_the_same_memory() -> None:
    cold = of(memory("both", similarity=0.8), memory("vector only", similarity=0.6))
    lexical = of(
        memory("both", lexical_score=7.0, embedding=vector(1, 0)),
        memory("words only", lexical_score=3.0, embedding=vector(0, 1)),
    )
    merged = merge(cold, lexical, Candidates.empty())
    by_id = {r.id: r for r in merged.records()}
    assert merged.ids == ["both", "vector only", "words only"]
    assert (by_id["both"].similarity, by_id["both"].lexical_score) == (0.8, 7.0)
    assert by_id["both"].embedding is None  # its similarity is PostgreSQL's: no vector needed
    assert (by_id["vector only"].similarity, by_id["vector only"].lexical_score) == (0.6, None)
    # A lexical-only match keeps its vector, so its semantic half can be computed.
    assert by_id["words only"].embedding is not None and by_id["words only"].similarity is None


def test_the_first_lexical_row_of_a_memory_gives_its_score() -> None:
    cold = of(memory("m", similarity=0.5))
    lexical = of(memory("m", lexical_score=9.0), memory("m", lexical_score=1.0))
    [merged] = merge(cold, lexical, Candidates.empty()).records()
    assert merged.lexical_score == 9.0


def test_a_memory_also_in_the_hot_set_is_marked_as_from_both_and_keeps_the_searchs_row() -> None:
    cold = of(memory("a", similarity=0.9))
    lexical = of(memory("b", lexical_score=4.0, embedding=vector(0, 1)))
    hot = of(
        memory("a", embedding=vector(1, 0)),
        memory("b", embedding=vector(1, 1)),
        memory("h", embedding=vector(1, 0)),
        source=Source.HOT,
    )
    merged = merge(cold, lexical, hot)
    by_id = {r.id: r for r in merged.records()}
    assert merged.ids == ["a", "b", "h"]
    assert [by_id[i].source for i in ("a", "b", "h")] == [
        Source.HOT_AND_COLD,
        Source.HOT_AND_COLD,
        Source.HOT,
    ]
    assert by_id["a"].similarity == 0.9
    b_vector = by_id["b"].embedding
    assert b_vector is not None and b_vector.tolist() == [0, 1]  # the lexical row's own
    assert by_id["h"].embedding is not None


def test_merging_changes_none_of_its_inputs() -> None:
    cold = of(memory("m", similarity=0.5))
    lexical = of(memory("m", lexical_score=2.0))
    hot = of(memory("m"), source=Source.HOT)
    merge(cold, lexical, hot)
    assert math.isnan(cold.lexical_score[0]) and cold.sources.tolist() == [Source.COLD]
    assert hot.sources.tolist() == [Source.HOT]


def test_vectors_of_another_dimension_than_the_querys_are_dropped() -> None:
    lexical = of(memory("l", lexical_score=1.0, embedding=vector(1, 0, 0)))
    hot = of(memory("h", embedding=vector(1, 0)), source=Source.HOT)
    merged = merge(Candidates.empty(), lexical, hot, dim=2)
    assert merged.vector_rows.tolist() == [-1, 0]
    assert merged.vectors.shape == (1, 2)
    # Without a query, the first source's dimension is kept.
    assert merge(Candidates.empty(), lexical, hot).vector_rows.tolist() == [0, -1]


def test_nothing_from_any_source_merges_to_nothing() -> None:
    assert len(merge(Candidates.empty(), Candidates.empty(), Candidates.empty())) == 0


def test_concat_keeps_every_row_in_order() -> None:
    joined = concat(
        [of(memory("a", embedding=vector(1, 0))), of(memory("a"), memory("b", embedding=vector(0, 1)))]
    )
    assert joined.ids == ["a", "a", "b"]
    assert joined.vector_rows.tolist() == [0, -1, 1]


def test_from_records_keeps_the_most_common_dimension() -> None:
    mixed = of(
        memory("a", embedding=vector(1, 0)),
        memory("b", embedding=vector(1, 0, 0)),
        memory("c", embedding=vector(0, 1)),
    )
    assert mixed.vectors.shape == (2, 2)
    assert mixed.vector_rows.tolist() == [0, -1, 1]


def test_empty_candidates_have_every_column_empty() -> None:
    empty = Candidates.empty()
    assert len(empty) == 0 and empty.records() == []
    assert empty.similarity.shape == (0,) and empty.vector_rows.shape == (0,)
