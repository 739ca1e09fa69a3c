from __future__ import annotations

import uuid

import pytest
from ibex_context.profiles.loader import parse_profiles

from benchmarks.quality.budgets import parse_budget, parse_budgets, profiles_json


def test_budgets_are_read_from_the_command_line_form() -> None:
    assert [(b.max_memory_tokens, b.max_memories) for b in parse_budgets("1000,default,4000x100")] == [
        (1000, 20),
        (4000, 20),
        (4000, 100),
    ]
    with pytest.raises(ValueError):
        parse_budget("lots")


def test_the_profiles_file_is_valid_for_the_service_and_selects_by_agent() -> None:
    small, wide = parse_budget("1000"), parse_budget("4000x100")

    a1, a2, b1, warm = (str(uuid.UUID(int=n)) for n in range(1, 5))
    profiles = parse_profiles(profiles_json({small: [a1, a2], wide: [b1]}, warm))

    by_name = {b.profile.name: b for b in profiles.bindings}
    assert by_name["quality-bench-1000"].selector.agent_ids == (a1, a2)
    assert by_name["quality-bench-1000"].profile.budget.max_memory_tokens == 1000
    assert by_name["quality-bench-4000x100"].profile.budget.max_memories == 100
    assert by_name["quality-bench-warm-up"].selector.agent_ids == (warm,)
    assert by_name["quality-bench-warm-up"].profile.deadlines.assembly_ms == 45
