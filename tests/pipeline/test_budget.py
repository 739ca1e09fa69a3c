from __future__ import annotations

import pytest
from ibex_context.pipeline.budget import IS_CONSTRAINED_BELOW, compute_budget, with_directive
from ibex_context.profiles.model import BudgetLimits
from ibex_context.tokens.catalogue import resolve_model

# Above the bound a profile may set (1,000,000): built without validation, for the test only.
UNCAPPED = BudgetLimits.model_construct(max_memory_tokens=10**9)


def test_gpt_4o_reserves_4096_for_the_answer_and_2_percent_safety_when_exact() -> None:
    budget = compute_budget(
        resolve_model("gpt-4o", {}), messages_tokens=1000, directive_tokens=500, limits=UNCAPPED, exact=True
    )
    assert budget.context_window == 128_000
    assert budget.response_reserve == 4096  # 15 % = 19,200, clamped to 4096
    assert budget.safety_buffer == 2560  # 2 % of 128,000
    assert budget.memory_budget == 128_000 - 1000 - 500 - 4096 - 2560 == 119_844
    assert budget.exact and budget.approximation_reason == ""
    assert not budget.is_constrained


def test_gpt_35_turbo_reserve_is_15_percent_rounded_up() -> None:
    budget = compute_budget(
        resolve_model("gpt-3.5-turbo", {}), messages_tokens=0, directive_tokens=0, limits=UNCAPPED, exact=True
    )
    assert budget.response_reserve == 2458  # ceil(0.15 * 16,385)
    assert budget.safety_buffer == 328  # ceil(0.02 * 16,385)
    assert budget.memory_budget == 16_385 - 2458 - 328 == 13_599


def test_profile_cap_limits_memory_budget() -> None:
    budget = compute_budget(
        resolve_model("gpt-4o", {}), messages_tokens=0, directive_tokens=0, limits=BudgetLimits(), exact=True
    )
    assert budget.memory_budget == 4000
    assert budget.window_remaining == 128_000 - 4096 - 2560


def test_messages_filling_the_window_leave_no_memory_budget() -> None:
    budget = compute_budget(
        resolve_model("gpt-4o", {}),
        messages_tokens=127_000,
        directive_tokens=800,
        limits=UNCAPPED,
        exact=True,
    )
    assert budget.memory_budget == 0
    assert budget.window_remaining < 0
    assert budget.is_constrained


def test_unknown_model_is_approximate_with_a_10_percent_buffer() -> None:
    model = resolve_model("some-new-model", {})
    budget = compute_budget(model, messages_tokens=0, directive_tokens=0, limits=UNCAPPED, exact=True)
    assert not budget.exact
    assert budget.approximation_reason  # says why
    assert budget.safety_buffer == 820  # ceil(0.10 * 8192)
    assert budget.response_reserve == 1229  # ceil(0.15 * 8192)
    assert budget.memory_budget == 8192 - 1229 - 820


def test_claude_is_never_treated_as_exact_even_if_the_caller_says_so() -> None:
    budget = compute_budget(
        resolve_model("claude-sonnet-4", {}),
        messages_tokens=0,
        directive_tokens=0,
        limits=UNCAPPED,
        exact=True,
    )
    assert not budget.exact
    assert budget.safety_buffer == 20_000
    assert "cl100k_base" in budget.approximation_reason


def test_reserve_never_exceeds_the_models_max_output() -> None:
    model = resolve_model("gpt-4o", {})
    small = type(model)(name="tiny", context_window=100_000, max_output_tokens=300, encoding="o200k_base")
    budget = compute_budget(small, messages_tokens=0, directive_tokens=0, limits=UNCAPPED, exact=True)
    assert budget.response_reserve == 300


def test_reserve_has_a_floor_of_500() -> None:
    model = resolve_model("gpt-3.5-turbo-0613", {})  # 4096 window: 15 % = 615
    assert (
        compute_budget(
            model, messages_tokens=0, directive_tokens=0, limits=UNCAPPED, exact=True
        ).response_reserve
        == 615
    )
    # As catalogue entries are built (output may fill the window): without the profile rules.
    tiny = type(model).model_construct(
        name="t", context_window=2000, max_output_tokens=2000, encoding="cl100k_base"
    )
    assert (
        compute_budget(
            tiny, messages_tokens=0, directive_tokens=0, limits=UNCAPPED, exact=True
        ).response_reserve
        == 500
    )


def test_limits_override_reserve_and_safety_ratio() -> None:
    limits = BudgetLimits.model_construct(
        max_memory_tokens=10**9, response_reserve_tokens=1000, safety_buffer_ratio=0.05
    )
    budget = compute_budget(
        resolve_model("gpt-4o", {}), messages_tokens=0, directive_tokens=0, limits=limits, exact=True
    )
    assert (budget.response_reserve, budget.safety_buffer) == (1000, 6400)


def test_constrained_below_1000_tokens_of_window() -> None:
    model = resolve_model("gpt-4", {})  # 8192 window: reserve 1229, safety 164
    free = 8192 - 1229 - 164
    tight = compute_budget(model, messages_tokens=free - 999, directive_tokens=0, limits=UNCAPPED, exact=True)
    roomy = compute_budget(
        model, messages_tokens=free - 1000, directive_tokens=0, limits=UNCAPPED, exact=True
    )
    assert (tight.memory_budget, tight.is_constrained) == (999, True)
    assert (roomy.memory_budget, roomy.is_constrained) == (IS_CONSTRAINED_BELOW, False)


def test_a_small_profile_cap_alone_is_not_constrained() -> None:
    budget = compute_budget(
        resolve_model("gpt-4o", {}),
        messages_tokens=0,
        directive_tokens=0,
        limits=BudgetLimits(max_memory_tokens=500),
        exact=True,
    )
    assert budget.memory_budget == 500
    assert not budget.is_constrained


def test_negative_counts_are_rejected() -> None:
    with pytest.raises(ValueError, match="messages_tokens"):
        compute_budget(
            resolve_model("gpt-4o", {}), messages_tokens=-1, directive_tokens=0, limits=UNCAPPED, exact=True
        )


@pytest.mark.parametrize("exact", [True, False])
def test_with_directive_reserves_the_directive_in_the_budget_computed_without_it(exact: bool) -> None:
    model, limits = resolve_model("gpt-4o", {}), BudgetLimits(max_memory_tokens=4000)
    before = compute_budget(model, messages_tokens=1000, directive_tokens=0, limits=limits, exact=exact)
    after = with_directive(before, 300, limits)
    assert after == compute_budget(
        model, messages_tokens=1000, directive_tokens=300, limits=limits, exact=exact
    )
    assert after.window_remaining == before.window_remaining - 300
