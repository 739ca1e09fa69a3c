"""The plan choice and the cache of agents' sizes it reads: pure, no store."""

from __future__ import annotations

from ibex_context.candidates import Candidates
from ibex_context.models import MemoryRecord
from ibex_context.settings import Settings
from ibex_context.stores.cold_plan import AgentSizes, ColdMatches, ColdPlan, GraphSearchWidth, choose_plan


def test_an_agent_without_a_ready_graph_of_its_own_is_searched_exactly() -> None:
    # No shared graph waits between the exact scan and an agent's own (migration 0021).
    assert choose_plan(None) is ColdPlan.EXACT


def test_an_agent_with_a_graph_of_its_own_is_searched_through_it() -> None:
    assert choose_plan(ColdPlan.AGENT_HALFVEC) is ColdPlan.AGENT_HALFVEC
    assert choose_plan(ColdPlan.AGENT_SPARSE) is ColdPlan.AGENT_SPARSE
    # A graph built before migration 0019 (full precision) keeps its own function.
    assert choose_plan(ColdPlan.AGENT) is ColdPlan.AGENT


def test_an_agents_own_graph_is_cached_with_its_size() -> None:
    now = [100.0]
    sizes = AgentSizes(ttl=60, clock=lambda: now[0])
    sizes.put(("org", "big"), 9_000, own_graph=ColdPlan.AGENT_HALFVEC)
    sizes.put(("org", "old"), 9_000, own_graph=ColdPlan.AGENT)
    sizes.put(("org", "small"), 10)
    assert sizes.own_graph(("org", "big")) is ColdPlan.AGENT_HALFVEC
    assert sizes.own_graph(("org", "old")) is ColdPlan.AGENT
    assert sizes.own_graph(("org", "small")) is None
    assert sizes.own_graph(("org", "unknown")) is None
    now[0] += 60
    assert sizes.own_graph(("org", "big")) is None  # expired: read again with the size


def test_a_forgotten_agent_is_read_again() -> None:
    sizes = AgentSizes(ttl=60)
    sizes.put(("org", "grown"), 5_001, own_graph=ColdPlan.AGENT_HALFVEC)
    sizes.forget(("org", "grown"))
    sizes.forget(("org", "never cached"))
    assert sizes.get(("org", "grown")) is None and sizes.own_graph(("org", "grown")) is None


def test_agents_above_the_large_size_get_the_wider_graph_search() -> None:
    width = GraphSearchWidth(ef_search=200, large_agent_ef_search=400, large_agent_memories=50_000)
    assert width.for_agent(10_000, 50) == 200
    assert width.for_agent(50_000, 50) == 200
    assert width.for_agent(50_001, 50) == 400


def test_an_own_graph_in_half_precision_gets_its_own_widths() -> None:
    width = GraphSearchWidth(
        ef_search=200,
        large_agent_ef_search=400,
        large_agent_memories=50_000,
        own_graph_ef_search=100,
        own_graph_large_agent_ef_search=200,
    )
    assert width.for_agent(10_000, 50, ColdPlan.AGENT_HALFVEC) == 100
    assert width.for_agent(100_000, 50, ColdPlan.AGENT_HALFVEC) == 200
    assert width.for_agent(100_000, 300, ColdPlan.AGENT_HALFVEC) == 300  # never below the limit
    # A full-precision own graph keeps the general widths.
    assert width.for_agent(10_000, 50, ColdPlan.AGENT) == 200
    assert width.for_agent(100_000, 50, ColdPlan.AGENT) == 400
    # Without own-graph widths, every graph gets the general ones.
    plain = GraphSearchWidth(ef_search=200, large_agent_ef_search=400, large_agent_memories=50_000)
    assert plain.for_agent(100_000, 50, ColdPlan.AGENT_HALFVEC) == 400


def test_the_graph_search_keeps_at_least_the_rows_asked_for_and_at_most_pgvectors_limit() -> None:
    width = GraphSearchWidth(ef_search=200, large_agent_ef_search=400, large_agent_memories=50_000)
    assert width.for_agent(10_000, 300) == 300
    assert width.for_agent(100_000, 600) == 600
    assert width.for_agent(100_000, 5_000) == 1000


def test_matches_are_candidates_that_name_their_plan() -> None:
    found = Candidates.from_records([MemoryRecord("m", "c", "factual", similarity=0.9)])
    matches = ColdMatches.of(found, ColdPlan.AGENT_HALFVEC)
    assert isinstance(matches, Candidates) and matches.ids == ["m"]
    assert matches.plan is ColdPlan.AGENT_HALFVEC


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


def test_every_plan_but_the_exact_scan_walks_a_graph_and_takes_a_width() -> None:
    assert [plan for plan in ColdPlan if not plan.walks_graph] == [ColdPlan.EXACT]


def test_a_sparse_graph_is_searched_by_the_dense_graphs_function_at_its_own_width() -> None:
    assert ColdPlan.AGENT_SPARSE.function == ColdPlan.AGENT_HALFVEC.function == "agent_halfvec"
    assert [plan.function for plan in (ColdPlan.EXACT, ColdPlan.AGENT)] == ["exact", "agent"]
    width = GraphSearchWidth(
        ef_search=200,
        large_agent_ef_search=400,
        large_agent_memories=50_000,
        own_graph_ef_search=100,
        own_graph_large_agent_ef_search=200,
        sparse_graph_ef_search=250,
    )
    assert width.for_agent(10_000, 50, ColdPlan.AGENT_SPARSE) == 250
    assert width.for_agent(60_000, 50, ColdPlan.AGENT_SPARSE) == 250  # awaiting its dense rebuild
    assert width.for_agent(10_000, 300, ColdPlan.AGENT_SPARSE) == 300  # never below the limit
    assert width.for_agent(10_000, 50, ColdPlan.AGENT_HALFVEC) == 100
    # Without a sparse width, a sparse graph is searched as a dense one.
    dense_only = GraphSearchWidth(
        200, 400, 50_000, own_graph_ef_search=100, own_graph_large_agent_ef_search=200
    )
    assert dense_only.for_agent(10_000, 50, ColdPlan.AGENT_SPARSE) == 100


def test_the_widths_come_from_the_settings() -> None:
    width = GraphSearchWidth.from_settings(Settings.model_construct(hnsw_ef_search_sparse_graph=250))
    assert width.for_agent(10_000, 50, ColdPlan.AGENT_SPARSE) == 250
    assert (
        width.for_agent(10_000, 50, ColdPlan.AGENT_HALFVEC)
        == Settings.model_fields["hnsw_ef_search_own_graph"].default
    )
    large = Settings.model_fields["cold_large_agent_memories"].default + 1
    assert (
        width.for_agent(large, 50, ColdPlan.AGENT_HALFVEC)
        == Settings.model_fields["hnsw_ef_search_own_graph_large_agents"].default
    )
