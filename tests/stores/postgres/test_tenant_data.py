"""TenantData against the real PostgreSQL: what purging an agent's rows removes."""

from __future__ import annotations

import uuid

import asyncpg
from ibex_context.stores.postgres import PostgresMemoryStore
from ibex_context.stores.postgres.graphs import DENSE_GRAPH, SPARSE_GRAPH, AgentGraphs, graph_index_name
from ibex_context.stores.postgres.tenant_data import TenantData

from tests.conftest import TEST_EMBEDDING_DIM, Tenant
from tests.stores.helpers import MakeMemory


async def test_a_purge_leaves_no_word_of_the_agent_and_drops_its_own_graph(
    pg_store: PostgresMemoryStore, postgres_dsn: str, make_memory: MakeMemory, tenant: Tenant
) -> None:
    org, agent = uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id)
    await pg_store.upsert_memories(
        tenant.org_id, tenant.agent_id, [make_memory(f"a zeppelin over harbour {i}") for i in range(4)]
    )
    assert await pg_store.graphs.promote(tenant.org_id, tenant.agent_id)
    name = graph_index_name(org, agent)
    data = TenantData(pg_store.pool, purge_batch=10)
    outcome = await data.purge_agent(tenant.org_id, tenant.agent_id, out_of_time=lambda: False)
    assert outcome.complete and outcome.memories_deleted == 4
    conn = await asyncpg.connect(postgres_dsn)
    try:
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM memory_lexicon WHERE org_id = $1 AND agent_id = $2", org, agent
            )
            == 0
        )
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM agent_graphs WHERE org_id = $1 AND agent_id = $2", org, agent
            )
            == 0
        )
        assert await conn.fetchval("SELECT to_regclass($1) IS NULL", name)
    finally:
        await conn.close()


async def test_a_purge_during_a_dense_rebuild_drops_both_of_the_agents_graphs(
    pg_store: PostgresMemoryStore, postgres_dsn: str, make_memory: MakeMemory, tenant: Tenant
) -> None:
    """The record names the sparse graph while its dense one is being built beside it."""
    org, agent = uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id)
    await pg_store.upsert_memories(
        tenant.org_id, tenant.agent_id, [make_memory(f"a lighthouse by the quay {i}") for i in range(4)]
    )
    sparse_graphs = AgentGraphs(pg_store.pool, min_memories=0, sparse_max_memories=100)
    assert await sparse_graphs.promote(tenant.org_id, tenant.agent_id)
    names = [graph_index_name(org, agent, build) for build in (SPARSE_GRAPH, DENSE_GRAPH)]
    conn = await asyncpg.connect(postgres_dsn)
    try:
        partition = await conn.fetchval(
            "SELECT tableoid::regclass::text FROM memories WHERE org_id = $1 AND agent_id = $2 LIMIT 1",
            org,
            agent,
        )
        await conn.execute(  # the rebuild's graph, not yet recorded
            f"CREATE INDEX {names[1]} ON {partition}"
            f" USING hnsw ((embedding::halfvec({TEST_EMBEDDING_DIM})) halfvec_cosine_ops)"
            f" WHERE org_id = '{org}'::uuid AND agent_id = '{agent}'::uuid"
        )
        outcome = await TenantData(pg_store.pool, purge_batch=10).purge_agent(
            tenant.org_id, tenant.agent_id, out_of_time=lambda: False
        )
        assert outcome.complete
        assert [await conn.fetchval("SELECT to_regclass($1) IS NULL", name) for name in names] == [True, True]
    finally:
        await conn.close()
