"""The plan choice and the cache of agents' sizes it reads: pure, no store."""

from __future__ import annotations

from ibex_context.stores.cold_plan import AgentSizes, ColdMatches, ColdPlan, choose_plan


def test_agents_up_to_the_limit_are_searched_exactly_and_larger_ones_through_the_graph() -> None:
    assert choose_plan(0, 5_000) is ColdPlan.EXACT
    assert choose_plan(5_000, 5_000) is ColdPlan.EXACT
    assert choose_plan(5_001, 5_000) is ColdPlan.HNSW
    assert choose_plan(1, 0) is ColdPlan.HNSW


def test_matches_are_a_list_of_records_that_names_its_plan() -> None:
    matches = ColdMatches([], ColdPlan.EXACT)
    assert matches == [] and isinstance(matches, list)
    assert matches.plan is ColdPlan.EXACT


def test_a_cached_size_expires_after_its_ttl() -> None:
    now = [100.0]
    sizes = AgentSizes(ttl=60, clock=lambda: now[0])
    sizes.put(("org", "agent"), 42)
    now[0] += 59.9
    assert sizes.get(("org", "agent")) == 42
    now[0] += 0.1
    assert sizes.get(("org", "agent")) is None


def test_the_least_recently_used_agent_leaves_a_full_cache_first() -> None:
    sizes = AgentSizes(capacity=2)
    sizes.put(("o", "a"), 1)
    sizes.put(("o", "b"), 2)
    assert sizes.get(("o", "a")) == 1  # a is now the most recent
    sizes.put(("o", "c"), 3)
    assert sizes.get(("o", "b")) is None
    assert (sizes.get(("o", "a")), sizes.get(("o", "c"))) == (1, 3)
