"""The upsert rules, decided without a database."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from ibex_context.errors import InvalidRequest
from ibex_context.stores.base import PreparedMemory
from ibex_context.stores.upsert_plan import StoredMemory, plan_upsert


def memory(id: str, content: str, *, confidence: float = 0.8, category: str = "factual") -> PreparedMemory:
    return PreparedMemory(
        id=id,
        content=content,
        content_hash=hashlib.sha256(content.encode()).digest(),
        category=category,
        confidence=confidence,
        usefulness=0.5,
        metadata={},
        token_counts={},
        embedding=np.zeros(4, dtype=np.float32),
    )


def stored(m: PreparedMemory) -> StoredMemory:
    return StoredMemory(m.id, m.content_hash, m.category, m.confidence, m.usefulness, m.metadata)


def test_content_identity_wins_over_a_new_id() -> None:
    existing = memory("a", "same text")
    plan = plan_upsert([stored(existing)], [memory("b", "same text")])
    assert [(r.id, r.outcome) for r in plan.results] == [("a", "unchanged")]
    assert plan.inserts == () and plan.updates == ()


def test_confidence_is_compared_as_stored_float32() -> None:
    existing = stored(memory("a", "t", confidence=0.8))
    as_read_back = StoredMemory("a", existing.content_hash, "factual", float(np.float32(0.8)), 0.5, {})
    plan = plan_upsert([as_read_back], [memory("b", "t", confidence=0.8)])
    assert plan.results[0].outcome == "unchanged"
    assert existing.confidence != as_read_back.confidence


def test_a_changed_field_updates_the_existing_row() -> None:
    plan = plan_upsert([stored(memory("a", "t"))], [memory("b", "t", category="preference")])
    assert [(r.id, r.outcome) for r in plan.results] == [("a", "updated")]
    assert [(m.id, m.category) for m in plan.updates] == [("a", "preference")]


def test_an_insert_changed_later_in_the_batch_stays_one_insert() -> None:
    plan = plan_upsert([], [memory("a", "t"), memory("b", "t", confidence=0.3)])
    assert [(r.id, r.outcome) for r in plan.results] == [("a", "created"), ("a", "updated")]
    assert [(m.id, m.confidence) for m in plan.inserts] == [("a", 0.3)]
    assert plan.updates == ()


def test_moving_an_id_to_new_text_frees_the_old_text() -> None:
    plan = plan_upsert([stored(memory("a", "old"))], [memory("a", "new"), memory("c", "old")])
    assert [(r.id, r.outcome) for r in plan.results] == [("a", "updated"), ("c", "created")]


def test_an_id_given_the_text_of_another_stored_memory_refuses_the_batch_naming_both() -> None:
    x, y = memory("x", "text of x"), memory("y", "text of y")
    with pytest.raises(InvalidRequest) as refused:
        plan_upsert([stored(x), stored(y)], [memory("n", "new"), memory("y", "text of x")])
    assert refused.value.field == "memories[1].id"
    assert "memory y cannot take the text of memory x" in str(refused.value)


def test_an_id_taking_a_text_freed_earlier_in_the_batch_is_no_conflict() -> None:
    x, y = memory("x", "text of x"), memory("y", "text of y")
    plan = plan_upsert([stored(x), stored(y)], [memory("x", "x rewritten"), memory("y", "text of x")])
    assert [(r.id, r.outcome) for r in plan.results] == [("x", "updated"), ("y", "updated")]
