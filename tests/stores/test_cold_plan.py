"""The plan choice and the cache of agents' sizes it reads: pure, no store."""

from __future__ import annotations

import numpy as np
from ibex_context.candidates import Candidates
from ibex_context.models import MemoryRecord
from ibex_context.settings import Settings
from ibex_context.stores.cold_plan import (
    WALK_MISS_MARGIN,
    AgentSizes,
    ColdMatches,
    ColdPlan,
    GraphSearchWidth,
    choose_plan,
    nearer_than_walk,
    walk_missed,
)


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
    rewalking = GraphSearchWidth.from_settings(Settings.model_construct(hnsw_ef_search_rewalk=600))
    assert rewalking.for_agent(large, 50, ColdPlan.AGENT_HALFVEC, rewalk=True) == 600


def test_a_repeated_walk_is_never_narrower_than_the_first_and_at_most_pgvectors_limit() -> None:
    width = GraphSearchWidth(
        ef_search=200,
        large_agent_ef_search=400,
        large_agent_memories=50_000,
        own_graph_ef_search=100,
        own_graph_large_agent_ef_search=200,
        rewalk_ef_search=300,
    )
    assert width.for_agent(100_000, 50, ColdPlan.AGENT_HALFVEC) == 200
    assert width.for_agent(100_000, 50, ColdPlan.AGENT_HALFVEC, rewalk=True) == 300
    assert width.for_agent(100_000, 50, ColdPlan.AGENT, rewalk=True) == 400  # the first is wider
    assert width.for_agent(100_000, 5_000, ColdPlan.AGENT_HALFVEC, rewalk=True) == 1000
    unset = GraphSearchWidth(ef_search=200, large_agent_ef_search=400, large_agent_memories=50_000)
    assert unset.for_agent(100_000, 50, rewalk=True) == unset.for_agent(100_000, 50)


def _unit(*values: float) -> np.ndarray:
    vector = np.array(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


QUESTION = _unit(1, 0, 0)


def _walked(similarities: dict[str, float]) -> ColdMatches:
    found = Candidates.from_records(
        [MemoryRecord(i, i, "factual", similarity=s) for i, s in similarities.items()]
    )
    return ColdMatches.of(found, ColdPlan.AGENT_HALFVEC)


def _lexical(vectors: dict[str, np.ndarray]) -> Candidates:
    return Candidates.from_records([MemoryRecord(i, i, "factual", embedding=v) for i, v in vectors.items()])


def test_a_walk_missed_when_the_words_found_a_memory_nearer_than_one_it_returned() -> None:
    nearer = _unit(0.7, 0.714, 0)  # cosine 0.70 to the question
    # Nearer than everything the walk returned: it ended in the wrong neighbourhood.
    assert walk_missed(
        _walked({"a": 0.55, "b": 0.52}), _lexical({"far": _unit(0, 1, 0), "x": nearer}), QUESTION
    )
    # Nearer than its farthest only: its answer is not the nearest memories either.
    assert walk_missed(_walked({"a": 0.80, "b": 0.52}), _lexical({"x": nearer}), QUESTION)


def test_a_walk_did_not_miss_when_the_words_found_nothing_nearer_than_its_farthest() -> None:
    walked = _walked({"a": 0.80, "b": 0.72})
    assert not walk_missed(walked, _lexical({"x": _unit(0.7, 0.714, 0)}), QUESTION)


def test_a_memory_the_walk_found_itself_does_not_count_as_a_miss() -> None:
    # "a" is nearer by its full-precision vector than by the graph's half-precision one.
    walked = _walked({"a": 0.69, "b": 0.52})
    assert not walk_missed(walked, _lexical({"a": _unit(0.7, 0.714, 0)}), QUESTION)


def test_nearer_by_less_than_the_rounding_of_half_precision_is_not_a_miss() -> None:
    best = 0.7
    just = _unit(best, np.sqrt(1 - best**2), 0)
    assert not nearer_than_walk(["a"], best - WALK_MISS_MARGIN / 2, ["x"], just[None, :], QUESTION)
    assert nearer_than_walk(["a"], best - 2 * WALK_MISS_MARGIN, ["x"], just[None, :], QUESTION)


def test_no_lexical_matches_or_vectors_of_another_model_never_make_a_miss() -> None:
    walked = _walked({"a": 0.1})
    assert not walk_missed(walked, Candidates.empty(), QUESTION)
    assert not walk_missed(_walked({}), _lexical({"x": QUESTION}), QUESTION)
    other_model = Candidates.from_records([MemoryRecord("x", "x", "factual", embedding=_unit(1, 0, 0, 0))])
    assert not walk_missed(walked, other_model, QUESTION)
    without_vector = Candidates.from_records([MemoryRecord("x", "x", "factual")])
    assert not walk_missed(walked, without_vector, QUESTION)


def test_matches_say_whether_their_walk_was_repeated() -> None:
    walked = _walked({"a": 0.5})
    assert not walked.rewalked
    again = ColdMatches.of(walked, ColdPlan.AGENT_HALFVEC, rewalked=True)
    assert again.rewalked and again.plan is ColdPlan.AGENT_HALFVEC and list(again.ids) == ["a"]
