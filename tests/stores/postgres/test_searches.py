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


async def test_the_hnsw_plan_fills_the_limit_for_a_small_tenant_sharing_a_large_ones_partition(
    postgres_dsn: str, pg_store: PostgresMemoryStore, make_memory: MakeMemory
) -> None:
    """The partition's graph holds both tenants' vectors; iterative scan keeps going until
    LIMIT rows pass the tenant filter, and only the asking tenant's rows come back."""
    big = (str(uuid.uuid4()), str(uuid.uuid4()))
    query = unit_vector(7)
    await pg_store.upsert_memories(
        *big, [make_memory(f"big {i}", embedding=near(query, 0.3, seed=i)) for i in range(400)]
    )
    conn = await asyncpg.connect(postgres_dsn)
    try:
        small = await tenant_in_the_partition_of(conn, *big)
    finally:
        await conn.close()
    await pg_store.upsert_memories(
        *small, [make_memory(f"small {i}", embedding=near(query, 1.5, seed=5000 + i)) for i in range(30)]
    )
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=20)
    try:
        # Every agent with more than 0 memories takes the graph.
        store = PostgresMemoryStore(pool, ef_search=20, exact_max_memories=0)
        found = await store.search(*small, query, 25)
        exact = await PostgresMemoryStore(pool, ef_search=20).search(*small, query, 25)
    finally:
        await pool.close()
    assert isinstance(found, ColdMatches) and found.plan is ColdPlan.HNSW
    assert isinstance(exact, ColdMatches) and exact.plan is ColdPlan.EXACT
    assert len(found) == 25
    assert all(content.startswith("small") for content in found.contents)
    # 25 of 30 from a graph of 430 vectors: the approximate answer is the exact one here.
    assert found.ids == exact.ids


async def test_the_plan_follows_the_agents_memory_count(
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
            [make_memory(f"m {i}", embedding=unit_vector(20 + i)) for i in range(3)],
        )
        first = await store.search(tenant.org_id, tenant.agent_id, query, 10)
        assert isinstance(first, ColdMatches) and first.plan is ColdPlan.EXACT and len(first) == 3
        await store.upsert_memories(
            tenant.org_id,
            tenant.agent_id,
            [make_memory(f"n {i}", embedding=unit_vector(40 + i)) for i in range(2)],
        )
        # The count of 3 is cached: still exact (it finds the new memories all the same).
        cached = await store.search(tenant.org_id, tenant.agent_id, query, 10)
        assert isinstance(cached, ColdMatches) and cached.plan is ColdPlan.EXACT and len(cached) == 5
        now[0] += 61
        grown = await store.search(tenant.org_id, tenant.agent_id, query, 10)
        assert isinstance(grown, ColdMatches) and grown.plan is ColdPlan.HNSW
        assert grown.ids == cached.ids
    finally:
        await store.aclose()


async def test_a_large_agents_graph_search_runs_wider_and_finds_the_exact_answer(
    postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    """Above ``large_agent_memories`` the search sets its own ef_search for its
    transaction; the connection's setting is untouched afterwards."""
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=EF_SEARCH)
    width = GraphSearchWidth(
        ef_search=EF_SEARCH, large_agent_ef_search=EF_SEARCH + 36, large_agent_memories=4
    )
    store = PostgresMemoryStore(pool, ef_search=EF_SEARCH, exact_max_memories=0, graph_width=width)
    try:
        query = unit_vector(5)
        await store.upsert_memories(
            tenant.org_id,
            tenant.agent_id,
            [make_memory(f"w {i}", embedding=near(query, 0.2 * (i + 1), seed=900 + i)) for i in range(6)],
        )
        found = await store.search(tenant.org_id, tenant.agent_id, query, 5)
        exact = await PostgresMemoryStore(pool, ef_search=EF_SEARCH).search(
            tenant.org_id, tenant.agent_id, query, 5
        )
        assert isinstance(found, ColdMatches) and found.plan is ColdPlan.HNSW
        assert isinstance(exact, ColdMatches) and exact.plan is ColdPlan.EXACT
        assert list(found.contents) == list(exact.contents) == [f"w {i}" for i in range(5)]
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
