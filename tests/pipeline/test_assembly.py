"""The call's one outcome (``pipeline/assembly.py``): what an answered call injected, how
far it got and when, read the same way by the wire and by observability; and a
request's rejection."""

from __future__ import annotations

import pytest
from ibex_context.models import MemoryRecord, ScoredMemory
from ibex_context.pipeline.assembly import Rejection
from ibex_context.pipeline.outcome import Outcome, Timings

from tests.pipeline.assemblies import a_budget, an_assembly


def test_what_was_injected_is_read_through_from_the_composition() -> None:
    memory = ScoredMemory(
        MemoryRecord(id="m1", content="The warehouse opens at six.", category="factual"),
        0.9,
        0.9,
        0.5,
        0.5,
        0.8,
        0.0,
    )
    assembly = an_assembly(composed={"memories": (memory,), "handles": (3,), "memory_tokens": 55})
    assert assembly.memories == (memory,) and assembly.handles == (3,)
    assert assembly.messages is assembly.composed.messages
    assert assembly.memories_injected == 1
    # gpt-4o's window leaves more than the profile's cap of 4,000 memory tokens.
    assert (assembly.memory_budget, assembly.encoding, assembly.exact_tokens) == (4000, "o200k_base", True)
    assert assembly.budget_utilisation == 55 / 4000
    assert assembly.duration_seconds == 0.012


def test_a_call_answered_before_its_model_was_resolved_names_no_encoding_and_uses_no_budget() -> None:
    # Shed, or out of time before the budget: no budget, nothing counted.
    assembly = an_assembly(composed={"budget": None})
    assert (assembly.encoding, assembly.exact_tokens, assembly.memory_budget) == ("", True, 0)
    assert assembly.budget_utilisation == 0.0


def test_budget_utilisation_never_exceeds_one() -> None:
    over = an_assembly(composed={"budget": a_budget(memory_budget=100), "memory_tokens": 250})
    assert over.budget_utilisation == 1.0


def test_the_assembly_cannot_be_changed_once_made() -> None:
    assembly = an_assembly(timings=Timings(0, 1, ()))
    with pytest.raises(AttributeError):
        assembly.outcome = Outcome.DEGRADED  # type: ignore[misc]
    with pytest.raises(AttributeError):
        assembly.composed.tokens_injected = 0  # type: ignore[misc]
    with pytest.raises(AttributeError):
        assembly.timings.finished_ns = 0  # type: ignore[misc]


def test_a_rejected_request_has_the_invalid_outcome_and_names_its_field() -> None:
    rejection = Rejection("req-1", "gpt-4o", "org_id")
    assert rejection.outcome is Outcome.INVALID and rejection.field == "org_id"
