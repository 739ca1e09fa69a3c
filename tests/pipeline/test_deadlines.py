"""The deadline policy (ADR-0007): a call's budget, when retrieval ends, each source's deadline."""

from __future__ import annotations

import math

import pytest
from ibex_context.pipeline.deadlines import CallDeadlines, DeadlinePolicy
from ibex_context.profiles.model import Deadlines

# The defaults: assembly 40 ms, directive 10, hot 15, cold 35.
PROFILE = Deadlines()
POLICY = DeadlinePolicy(safety_margin=0.003, compute_reserve=0.003)


def test_without_a_caller_deadline_the_budget_is_the_profiles() -> None:
    deadlines = POLICY.for_call(PROFILE, caller_remaining=None)
    assert deadlines == CallDeadlines(
        budget=0.040, compute_reserve=0.003, directive=0.010, hot=0.015, cold=0.035
    )


def test_a_caller_deadline_shorter_than_the_profiles_cuts_the_budget_by_the_safety_margin() -> None:
    assert POLICY.for_call(PROFILE, caller_remaining=0.030).budget == pytest.approx(0.027)
    # A caller with more time than the profile allows does not lengthen the call.
    assert POLICY.for_call(PROFILE, caller_remaining=5.0).budget == pytest.approx(0.040)
    # The margin is the policy's: a wider one leaves the call less.
    wide = DeadlinePolicy(safety_margin=0.015)
    assert wide.for_call(PROFILE, caller_remaining=0.030).budget == pytest.approx(0.015)


@pytest.mark.parametrize("remaining", [0.003, 0.001, -0.5, -math.inf])
def test_a_caller_with_no_time_past_the_margin_gets_no_budget(remaining: float) -> None:
    assert POLICY.for_call(PROFILE, caller_remaining=remaining).budget == 0.0


def test_a_budget_that_is_not_a_finite_number_means_no_time_at_all() -> None:
    assert POLICY.within(math.inf, PROFILE).budget == 0.0
    assert POLICY.within(math.nan, PROFILE).budget == 0.0


def test_the_source_timeouts_are_the_profiles_whatever_the_budget() -> None:
    spread = Deadlines.model_construct(assembly_ms=900, directive_ms=50, hot_ms=60, cold_ms=400)
    deadlines = POLICY.within(2.0, spread)
    assert (deadlines.budget, deadlines.directive, deadlines.hot, deadlines.cold) == (2.0, 0.05, 0.06, 0.4)


def test_retrieval_ends_the_compute_reserve_before_the_budget_and_each_source_at_its_own_timeout() -> None:
    deadlines = POLICY.for_call(PROFILE, caller_remaining=None)
    # The call started at 100 s; retrieval starts 1 ms later.
    at = deadlines.retrieval(started_at=100.0, now=100.001)
    assert at.ends_at == pytest.approx(100.037)
    assert at.directive == pytest.approx(100.011)
    assert at.hot == pytest.approx(100.016)
    assert at.cold == pytest.approx(100.036)


def test_the_calls_end_caps_every_source() -> None:
    # 20 ms left to the caller: budget 17 ms, retrieval ends at 14 ms.
    deadlines = POLICY.for_call(PROFILE, caller_remaining=0.020)
    at = deadlines.retrieval(started_at=100.0, now=100.001)
    assert at.ends_at == pytest.approx(100.014)
    assert at.directive == pytest.approx(100.011)  # its own 10 ms still comes first
    assert at.hot == pytest.approx(100.014)
    assert at.cold == pytest.approx(100.014)
