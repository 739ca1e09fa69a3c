"""The vector search and its plans (``stores.postgres.searches``) on the real PostgreSQL + pgvector."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import numpy as np
import pytest
from ibex_context.stores.cold_plan import AgentSizes, ColdMatches, ColdPlan, GraphSearchWidth
from ibex_context.stores.postgres import (
    PostgresMemoryStore,
    create_pool,
)

from tests.conftest import Tenant
from tests.postgres_locks import memories_locked
from tests.stores.helpers import (
    EF_SEARCH,
    MakeMemory,
    at_similarity,
    near,
    records,
    tenant_in_the_partition_of,
    unit_vector,
)


async def test_cold_search_returns_the_top_k_nearest_first_even_above_ef_search(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    query = unit_vector(1)
    # 60 memories at increasing distance from the query; ask for 50 (ef_search is 64 here,
    # and a limit above it must still be filled: asked 80 -> all 60).
    batch = [
        make_memory(f"memory {i}", embedding=at_similarity(query, 0.95 - 0.01 * i, seed=100 + i))
        for i in range(60)
    ]
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, batch)
    found = records(await pg_store.search(tenant.org_id, tenant.agent_id, query, 50))
    assert len(found) == 50
    assert [m.id for m in found] == [m.id for m in batch[:50]]
    similarities = [m.similarity for m in found]
    assert similarities == sorted(similarities, reverse=True)
    assert found[0].similarity == pytest.approx(0.95, abs=1e-5)
    assert found[0].token_counts == {"o200k_base": 2}
    assert found[0].occurred_at is not None and abs(found[0].occurred_at - time.time()) < 60
    assert len(records(await pg_store.search(tenant.org_id, tenant.agent_id, query, 80))) == 60


async def test_a_search_with_vectors_gives_each_winner_its_stored_vector_and_the_same_answer(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    query = unit_vector(2)
    batch = [
        make_memory(f"memory {i}", embedding=at_similarity(query, 0.9 - 0.02 * i, seed=200 + i))
        for i in range(12)
    ]
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, batch)
    plain = await pg_store.search(tenant.org_id, tenant.agent_id, query, 8)
    found = await pg_store.search(tenant.org_id, tenant.agent_id, query, 8, with_vectors=True)
    assert list(found.ids) == list(plain.ids) and (found.similarity == plain.similarity).all()
    assert plain.vectors.shape[0] == 0, "without the flag no vector travels"
    stored = {m.id: m.embedding for m in batch}
    for i, memory_id in enumerate(found.ids):
        vector = found.embedding(i)
        assert vector is not None and np.array_equal(vector, np.asarray(stored[memory_id], dtype=np.float32))


async def test_an_agent_past_the_exact_limit_is_searched_exactly_until_its_own_graph_is_ready(
    postgres_dsn: str, make_memory: MakeMemory
) -> None:
    """No shared graph serves it meanwhile (migration 0021): the exact scan, whatever
    its size, and nothing of another tenant of its partition."""
    big = (str(uuid.uuid4()), str(uuid.uuid4()))
    query = unit_vector(7)
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=20)
    # Every agent with more than 0 memories is past the limit.
    store = PostgresMemoryStore(pool, ef_search=20, exact_max_memories=0)
    try:
        await store.upsert_memories(
            *big, [make_memory(f"big {i}", embedding=near(query, 0.3, seed=i)) for i in range(400)]
        )
        async with pool.acquire() as conn:
            small = await tenant_in_the_partition_of(conn, *big)
        await store.upsert_memories(
            *small, [make_memory(f"small {i}", embedding=near(query, 1.5, seed=5000 + i)) for i in range(30)]
        )
        found = await store.search(*small, query, 25)
    finally:
        await store.aclose()
    assert isinstance(found, ColdMatches) and found.plan is ColdPlan.EXACT
    assert len(found) == 25
    assert all(content.startswith("small") for content in found.contents)
    assert list(found.similarity) == sorted(found.similarity, reverse=True)


async def test_the_plan_follows_the_agents_own_graph_once_it_is_ready(
    postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=EF_SEARCH)
    now = [0.0]
    sizes = AgentSizes(ttl=60, clock=lambda: now[0])
    store = PostgresMemoryStore(pool, ef_search=EF_SEARCH, exact_max_memories=3, agent_sizes=sizes)
    try:
        query = unit_vector(11)
        await store.upsert_memories(
            tenant.org_id,
            tenant.agent_id,
            [make_memory(f"m {i}", embedding=unit_vector(20 + i)) for i in range(5)],
        )
        first = await store.search(tenant.org_id, tenant.agent_id, query, 10)
        assert isinstance(first, ColdMatches) and first.plan is ColdPlan.EXACT and len(first) == 5
        assert await store.graphs.promote(tenant.org_id, tenant.agent_id)
        # The state read before the build is cached: still exact.
        cached = await store.search(tenant.org_id, tenant.agent_id, query, 10)
        assert isinstance(cached, ColdMatches) and cached.plan is ColdPlan.EXACT
        now[0] += 61
        own = await store.search(tenant.org_id, tenant.agent_id, query, 10)
        assert isinstance(own, ColdMatches) and own.plan is ColdPlan.AGENT_HALFVEC
        assert set(own.ids) == set(first.ids)
    finally:
        await store.aclose()


async def test_a_large_agents_graph_search_and_a_repeated_walk_run_wider_and_find_the_exact_answer(
    postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    """Above ``large_agent_memories`` the search passes its own graph the larger width;
    the connection's setting is untouched afterwards."""
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=EF_SEARCH)
    width = GraphSearchWidth(
        ef_search=EF_SEARCH,
        large_agent_ef_search=EF_SEARCH,
        large_agent_memories=4,
        own_graph_ef_search=EF_SEARCH,
        own_graph_large_agent_ef_search=EF_SEARCH + 36,
        rewalk_ef_search=EF_SEARCH + 136,
    )
    store = PostgresMemoryStore(pool, ef_search=EF_SEARCH, exact_max_memories=0, graph_width=width)
    try:
        query = unit_vector(5)
        await store.upsert_memories(
            tenant.org_id,
            tenant.agent_id,
            [make_memory(f"w {i}", embedding=near(query, 0.2 * (i + 1), seed=900 + i)) for i in range(6)],
        )
        exact = await store.search(tenant.org_id, tenant.agent_id, query, 5)
        assert await store.graphs.promote(tenant.org_id, tenant.agent_id)
        store.searches.forget_agent(tenant.org_id, tenant.agent_id)
        found = await store.search(tenant.org_id, tenant.agent_id, query, 5)
        assert isinstance(found, ColdMatches) and found.plan is ColdPlan.AGENT_HALFVEC
        assert isinstance(exact, ColdMatches) and exact.plan is ColdPlan.EXACT
        assert list(found.contents) == list(exact.contents) == [f"w {i}" for i in range(5)]
        # A repeated walk, wider still, through the same graph.
        again = await store.search(tenant.org_id, tenant.agent_id, query, 5, wider=True)
        assert isinstance(again, ColdMatches) and again.plan is ColdPlan.AGENT_HALFVEC
        assert list(again.contents) == list(exact.contents)
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW hnsw.ef_search") == str(EF_SEARCH)
    finally:
        await store.aclose()


async def test_cancelling_a_blocked_search_cancels_the_query_on_the_server(
    private_postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    pool = await create_pool(private_postgres_dsn, min_size=1, max_size=2, ef_search=EF_SEARCH)
    store = PostgresMemoryStore(pool, ef_search=EF_SEARCH)
    observer = await asyncpg.connect(private_postgres_dsn)
    # pg_stat_activity spans the cluster: count only this test's database, since another
    # test's search can still be running in its own (a backend finishes a query whose
    # client has gone before it notices).
    waiting_sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'ibex-context' AND state = 'active' AND query LIKE '%ibex_cold_%'"
    )

    async def searches_waiting(expected: int) -> int:
        count = -1
        for _ in range(250):
            count = await observer.fetchval(waiting_sql)
            if count == expected:
                break
            await asyncio.sleep(0.02)
        return int(count)

    try:
        await store.upsert_memories(tenant.org_id, tenant.agent_id, [make_memory("blocked")])
        async with memories_locked(private_postgres_dsn):
            # The search waits on this lock just as it would on a slow scan.
            search = asyncio.create_task(store.search(tenant.org_id, tenant.agent_id, unit_vector(3), 5))
            assert await searches_waiting(1) == 1
            search.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(search, timeout=10)
            # Still holding the lock: only a server-side cancel can have ended the query.
            assert await searches_waiting(0) == 0
        # The pool is healthy afterwards.
        assert len(records(await store.search(tenant.org_id, tenant.agent_id, unit_vector(3), 5))) == 1
    finally:
        await observer.close()
        await store.aclose()
