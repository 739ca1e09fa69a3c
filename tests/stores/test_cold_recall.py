"""The cold search's recall against exact search, through the plan the store chooses
(issue 13: recall@50 >= 0.95 for every data shape).

A small synthetic set in the shape of the load test's (templated memories of one agent,
hashing-embedder vectors, questions quoting a span of a memory), so it runs in CI in
seconds. At this size a graph walk still reaches most of the agent's vectors, so the
test pins the contract (each plan the store chooses, with the service's default widths,
meets the bound; the agent's own graph fills the limit with its rows), not the graph's
parameters: the shapes where graphs missed it (10k-100k memories per agent) are
measured by ``benchmarks.cold_plans`` (ADR-0009, ADR-0015).
"""

from __future__ import annotations

import random
import statistics
import uuid

import numpy as np
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.settings import Settings
from ibex_context.stores.cold_plan import ColdMatches, ColdPlan, GraphSearchWidth
from ibex_context.stores.postgres import PostgresMemoryStore, create_pool

from benchmarks.cold_plans import recall
from loadtest import corpus
from tests.stores.helpers import DIM, MakeMemory

LIMIT = 50
QUESTIONS = 30


def _texts(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct memories (the store keeps one row per text)."""
    texts: dict[str, None] = {}
    while len(texts) < count:
        texts[corpus.memory_spec(rng).content] = None
    return list(texts)


async def test_both_plans_the_store_chooses_find_the_exact_nearest_50(
    postgres_dsn: str, make_memory: MakeMemory
) -> None:
    rng = random.Random(20261126)
    embedder = HashingEmbedder(DIM)
    # The service's own widths; agents above 300 memories are promoted to a graph of their
    # own, the others searched exactly.
    width = GraphSearchWidth.from_settings(Settings.model_construct())
    ef_search = width.ef_search
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=ef_search)
    store = PostgresMemoryStore(pool, ef_search=ef_search, exact_max_memories=300, graph_width=width)
    try:
        for size, plan in ((600, ColdPlan.AGENT_HALFVEC), (200, ColdPlan.EXACT)):
            org, agent = str(uuid.uuid4()), str(uuid.uuid4())
            texts = _texts(rng, size)
            await store.upsert_memories(org, agent, [make_memory(text) for text in texts])
            if size > store.graphs.min_memories:
                assert await store.graphs.promote(org, agent)
            vectors = np.stack([embedder.embed_one(text) for text in texts])
            recalls = []
            for _ in range(QUESTIONS):
                query = embedder.embed_one(corpus.query_from_memory(rng, rng.choice(texts)))
                exact = sorted((1.0 - vectors @ query).tolist())[:LIMIT]
                found = await store.search(org, agent, query, LIMIT)
                assert isinstance(found, ColdMatches) and found.plan is plan
                assert len(found) == LIMIT
                recalls.append(recall(exact, (1.0 - found.similarity).tolist()))
            assert statistics.mean(recalls) >= 0.95, (plan, statistics.mean(recalls))
            assert min(recalls) >= 0.8, (plan, min(recalls))
    finally:
        await store.aclose()
