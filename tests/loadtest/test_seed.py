"""The seed plan and corpus: deterministic, tenant-ordered, within the token range."""

from __future__ import annotations

import itertools
import random

from loadtest import corpus, seed


def test_agents_come_in_org_then_agent_order_across_the_requested_orgs() -> None:
    agents = seed.plan_agents(seed.SeedPlan(agents=12, memories=10, orgs=3))
    keys = [(a.org_id, a.agent_id) for a in agents]
    assert keys == sorted(keys)
    assert len({a.org_id for a in agents}) == 3
    assert len({a.agent_id for a in agents}) == 12


def test_the_same_seed_gives_the_same_agents_and_another_seed_others() -> None:
    plan = seed.SeedPlan(agents=5, memories=10)
    assert seed.plan_agents(plan) == seed.plan_agents(plan)
    other = seed.plan_agents(seed.SeedPlan(agents=5, memories=10, seed=plan.seed + 1))
    assert {a.agent_id for a in other}.isdisjoint({a.agent_id for a in seed.plan_agents(plan)})


def test_large_agents_get_the_large_memory_count() -> None:
    plan = seed.SeedPlan(agents=4, memories=10, large_agents=1, large_memories=500)
    assert sorted(a.memories for a in seed.plan_agents(plan)) == [10, 10, 10, 500]
    assert plan.total_memories == 530


def test_memory_specs_mix_categories_and_stay_within_their_ranges() -> None:
    rng = random.Random(3)
    specs = [corpus.memory_spec(rng) for _ in range(500)]
    assert {s.category for s in specs} == set(corpus.CATEGORIES)
    assert all(0 <= s.confidence <= 1 and 0 <= s.usefulness <= 1 for s in specs)
    assert all(0 <= s.age_seconds <= corpus.YEAR_SECONDS for s in specs)
    assert all(
        s.last_injected_ago_seconds is None or s.last_injected_ago_seconds <= s.age_seconds for s in specs
    )
    assert len({s.content for s in specs}) == len(specs)


def test_a_sample_query_reuses_words_of_its_memory() -> None:
    rng = random.Random(5)
    memory = corpus.memory_text(rng, "factual", 120)
    query = corpus.query_from_memory(rng, memory)
    overlap = set(query.lower().strip("?").split()) & set(memory.lower().split())
    assert len(overlap) >= 4


def test_a_conversation_alternates_roles_and_ends_with_the_users_message() -> None:
    messages = corpus.conversation(random.Random(2), 7, "last question")
    assert len(messages) == 7
    assert messages[-1] == ("user", "last question")
    roles = [role for role, _ in messages]
    assert all(a != b for a, b in itertools.pairwise(roles))
