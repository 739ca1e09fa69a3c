"""Versioned migrations: ordered, recorded, idempotent, safe to run concurrently."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest
from ibex_context.errors import ConfigurationError
from ibex_context.stores.migrate import apply_migrations, load_migrations, migrate, render


async def test_the_session_database_has_every_migration_recorded_and_its_dim(postgres_dsn: str) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        versions = await conn.fetch("SELECT version, name FROM schema_migrations ORDER BY version")
        dim = await conn.fetchval("SELECT value FROM ibex_meta WHERE key = 'embedding_dim'")
    finally:
        await conn.close()
    assert [r["name"] for r in versions] == [m.name for m in load_migrations()]
    assert [r["version"] for r in versions] == sorted(r["version"] for r in versions)
    assert dim == "384"


def test_the_dimension_is_substituted_without_touching_other_braces() -> None:
    assert render("vector({embedding_dim}) DEFAULT '{}'::jsonb", 384) == "vector(384) DEFAULT '{}'::jsonb"


def test_a_badly_named_migration_file_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "1_oops.sql").write_text("SELECT 1")
    with pytest.raises(ConfigurationError, match="NNNN_name"):
        load_migrations(tmp_path)


async def test_migrating_twice_applies_nothing_the_second_time(postgres_dsn: str) -> None:
    assert await migrate(postgres_dsn, 384) == []


async def test_migrating_with_another_embedding_dim_is_a_configuration_error(postgres_dsn: str) -> None:
    with pytest.raises(ConfigurationError, match="embedding_dim"):
        await migrate(postgres_dsn, 1024)


async def test_concurrent_migrators_apply_each_migration_once(empty_database_dsn: str) -> None:
    dsn = empty_database_dsn
    results = await asyncio.gather(*(migrate(dsn, 384) for _ in range(4)))
    applied = [name for result in results for name in result]
    assert sorted(applied) == sorted(m.name for m in load_migrations())
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == len(load_migrations())
        assert await apply_migrations(conn, 384) == []
    finally:
        await conn.close()


async def test_the_usage_migration_carries_existing_counters_over(empty_database_dsn: str) -> None:
    conn = await asyncpg.connect(empty_database_dsn)
    try:
        migrations = load_migrations()
        before_usage = [m for m in migrations if m.version < 3]
        assert await apply_migrations(conn, 8, before_usage) == [m.name for m in before_usage]
        await conn.execute(
            "INSERT INTO memories (org_id, agent_id, id, content, content_hash, category, retrieval_count,"
            " last_injected_at, embedding) VALUES"
            " (gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'used', 'a', 'factual', 5, now(),"
            "  '[1,0,0,0,0,0,0,0]'),"
            " (gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'unused', 'b', 'factual', 0, NULL,"
            "  '[0,1,0,0,0,0,0,0]')"
        )
        assert await apply_migrations(conn, 8) == [m.name for m in migrations if m.version >= 3]
        usage = await conn.fetch(
            "SELECT u.retrieval_count, u.last_injected_at IS NOT NULL AS injected FROM memory_usage AS u"
            " JOIN memories AS m ON m.org_id = u.org_id AND m.agent_id = u.agent_id AND m.id = u.memory_id"
        )
        assert [(r["retrieval_count"], r["injected"]) for r in usage] == [(5, True)]
    finally:
        await conn.close()
