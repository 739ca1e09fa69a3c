"""Pooled connections, their settings and errors (``stores.postgres.pool``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ibex_context.errors import StoreError, StoreUnavailable
from ibex_context.stores.postgres import (
    PostgresMemoryStore,
    create_pool,
    unverified_tls_warning,
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


def test_a_tcp_connection_without_a_ca_is_reported_unverified_without_echoing_the_dsn() -> None:
    dsn = "postgresql://ibex:s3cret@db.internal:5432/ibex"
    warning = unverified_tls_warning(dsn, None, environ={})
    assert warning is not None
    assert "sslmode=prefer" in warning and "IBEX_POSTGRES_CA_FILE" in warning
    assert "s3cret" not in warning and "db.internal" not in warning
    assert "sslmode=require" in (unverified_tls_warning(dsn + "?sslmode=require", None, environ={}) or "")
    assert "host name not checked" in (
        unverified_tls_warning("host=db.internal sslmode=verify-ca", None, environ={}) or ""
    )
    assert "sslmode=disable" in (unverified_tls_warning(dsn, None, environ={"PGSSLMODE": "disable"}) or "")


def test_a_ca_file_a_verify_full_dsn_or_a_unix_socket_needs_no_warning(tmp_path: Path) -> None:
    dsn = "postgresql://ibex@db.internal:5432/ibex"
    assert unverified_tls_warning(dsn, tmp_path / "ca.crt", environ={}) is None
    assert unverified_tls_warning(dsn + "?sslmode=verify-full", None, environ={}) is None
    assert unverified_tls_warning("host=db.internal sslmode=verify-full", None, environ={}) is None
    assert unverified_tls_warning("postgresql://postgres@/postgres?host=/tmp/pg", None, environ={}) is None
    assert unverified_tls_warning("host=/var/run/postgresql dbname=ibex", None, environ={}) is None
