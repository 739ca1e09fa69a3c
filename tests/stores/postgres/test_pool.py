"""Pooled connections, their settings and errors (``stores.postgres.pool``)."""

from __future__ import annotations

import pytest
from ibex_context.errors import StoreError, StoreUnavailable
from ibex_context.stores.postgres import (
    PostgresMemoryStore,
    create_pool,
)

from tests.conftest import Tenant
from tests.stores.helpers import MakeMemory, unit_vector


async def test_pooled_connections_carry_the_search_settings(postgres_dsn: str) -> None:
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=77)
    try:
        async with pool.acquire() as conn:
            await conn.execute("SELECT '[1,2]'::vector")  # loads pgvector, which applies its settings
            assert await conn.fetchval("SHOW hnsw.ef_search") == "77"
            assert await conn.fetchval("SHOW hnsw.iterative_scan") == "relaxed_order"
            assert await conn.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
    finally:
        await pool.close()


async def test_driver_errors_become_store_errors_that_do_not_quote_the_data(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    secret = "my secret memory text"
    wrong_dim = make_memory(secret, embedding=unit_vector(1)[:10])
    with pytest.raises(StoreError) as raised:
        await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [wrong_dim])
    assert secret not in str(raised.value) and raised.value.__cause__ is None
    assert "SQLSTATE" in str(raised.value)


async def test_a_closed_pool_is_store_unavailable(postgres_dsn: str, tenant: Tenant) -> None:
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=64)
    store = PostgresMemoryStore(pool, ef_search=64)
    await store.aclose()
    with pytest.raises(StoreUnavailable):
        await store.get_directive(tenant.org_id, tenant.agent_id)


async def test_a_pooled_connection_comes_back_without_an_open_transaction_or_local_setting(
    postgres_dsn: str,
) -> None:
    # The pool skips asyncpg's RESET ALL round trip on release; what a call may leave
    # behind (an unfinished transaction with a SET LOCAL) must still not leak.
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=40)
    try:
        async with pool.acquire() as conn:
            transaction = conn.transaction()
            await transaction.start()
            await conn.execute("SET LOCAL hnsw.ef_search = 999")
        async with pool.acquire() as conn:
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SHOW hnsw.ef_search") == "40"
    finally:
        await pool.close()
