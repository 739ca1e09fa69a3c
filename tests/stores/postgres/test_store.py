"""The composed store's health and warm-up (``stores.postgres.store``)."""

from __future__ import annotations

from ibex_context.stores.postgres import (
    PostgresMemoryStore,
)


async def test_health_reports_ok(pg_store: PostgresMemoryStore) -> None:
    health = await pg_store.check_health()
    assert health.ok and health.extra["pool_size"] != ""


async def test_warm_up_prepares_the_read_statements_without_touching_any_tenant(
    pg_store: PostgresMemoryStore,
) -> None:
    await pg_store.warm_up()
    assert (await pg_store.check_health()).ok
