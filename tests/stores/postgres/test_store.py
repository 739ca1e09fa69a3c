"""The composed store's health, and its connections prepared before they serve
(``stores.postgres.store``)."""

from __future__ import annotations

from ibex_context.settings import Settings
from ibex_context.stores.postgres import PostgresMemoryStore
from ibex_context.stores.postgres.reads import DIRECTIVE_SQL, HOT_SET_SQL
from ibex_context.stores.postgres.searches import LEXICAL_ARRAYS_SQL, SEARCH_ARRAYS_SQL

REQUEST_PATH = {*SEARCH_ARRAYS_SQL.values(), LEXICAL_ARRAYS_SQL, DIRECTIVE_SQL, HOT_SET_SQL}


async def test_health_reports_ok(pg_store: PostgresMemoryStore) -> None:
    health = await pg_store.check_health()
    assert health.ok and health.extra["pool_size"] != ""


async def test_every_connection_has_the_request_path_prepared_before_it_serves_even_those_opened_later(
    redis_url: str, postgres_dsn: str
) -> None:
    # A new backend's first plan of a search costs more than a cold deadline (50-60 ms
    # measured): no request may be the one to pay it, on a connection opened at start,
    # or one opened later to grow the pool.
    settings = Settings(
        redis_url=redis_url, postgres_dsn=postgres_dsn, postgres_pool_min=1, postgres_pool_max=3
    )
    store = await PostgresMemoryStore.from_settings(settings)
    try:
        assert store.pool.get_size() == 1
        connections = [await store.pool.acquire() for _ in range(3)]
        try:
            assert store.pool.get_size() == 3
            for conn in connections:
                rows = await conn.fetch("SELECT statement FROM pg_prepared_statements")
                prepared = {row[0] for row in rows}
                assert prepared >= REQUEST_PATH, REQUEST_PATH - prepared
        finally:
            for conn in connections:
                await store.pool.release(conn)
    finally:
        await store.aclose()
