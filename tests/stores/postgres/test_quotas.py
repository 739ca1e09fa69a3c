"""Per-org quotas on the real PostgreSQL (``stores.quotas``, migration 0016): the
usage counters follow every write, and an upsert past a limit is refused whole."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

import asyncpg
import pytest
from ibex_context.errors import LimitExceeded
from ibex_context.stores.postgres import PostgresMemoryStore
from ibex_context.stores.quotas import OrgQuotas

from tests.conftest import Tenant
from tests.stores.helpers import EF_SEARCH, MakeMemory


def _store(pg_store: PostgresMemoryStore, quotas: OrgQuotas) -> PostgresMemoryStore:
    """A store over the session's pool with these quotas (never closed here: the pool is shared)."""
    return PostgresMemoryStore(pg_store.pool, ef_search=EF_SEARCH, quotas=quotas)


@pytest.fixture
async def conn(postgres_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(postgres_dsn)
    yield connection
    await connection.close()


async def _usage(conn: asyncpg.Connection, org_id: str) -> tuple[int, int]:
    row = await conn.fetchrow(
        "SELECT memories, content_bytes FROM org_usage WHERE org_id = $1", uuid.UUID(org_id)
    )
    return (0, 0) if row is None else (row[0], row[1])


async def _counted(conn: asyncpg.Connection, org_id: str) -> tuple[int, int]:
    row = await conn.fetchrow(
        "SELECT count(*), coalesce(sum(octet_length(content)), 0) FROM memories WHERE org_id = $1",
        uuid.UUID(org_id),
    )
    assert row is not None
    return (row[0], row[1])


async def test_the_orgs_usage_follows_every_write_of_every_agent(
    pg_store: PostgresMemoryStore,
    conn: asyncpg.Connection,
    new_tenant: Callable[[], Tenant],
    make_memory: MakeMemory,
) -> None:
    first = new_tenant()
    second = Tenant(first.org_id, str(uuid.uuid4()))
    mine = [make_memory(f"fact {i} é") for i in range(3)]  # two bytes for é
    await pg_store.upsert_memories(first.org_id, first.agent_id, mine)
    await pg_store.upsert_memories(second.org_id, second.agent_id, [make_memory("x"), make_memory("yy")])
    assert await _usage(conn, first.org_id) == await _counted(conn, first.org_id) == (5, 3 * 9 + 3)

    longer = make_memory("a much longer text than before", id=mine[0].id)
    await pg_store.upsert_memories(first.org_id, first.agent_id, [longer])
    await pg_store.record_feedback(first.org_id, first.agent_id, None, [(mine[1].id, "positive")])
    await pg_store.delete_memories(second.org_id, second.agent_id, [])
    assert await pg_store.delete_memories(first.org_id, first.agent_id, [mine[2].id]) == 1
    assert await _usage(conn, first.org_id) == await _counted(conn, first.org_id) == (4, 30 + 9 + 3)


async def test_an_upsert_past_the_orgs_memories_is_refused_whole_but_updates_still_pass(
    pg_store: PostgresMemoryStore,
    conn: asyncpg.Connection,
    new_tenant: Callable[[], Tenant],
    make_memory: MakeMemory,
) -> None:
    store = _store(pg_store, OrgQuotas(memories=5))
    first = new_tenant()
    second = Tenant(first.org_id, str(uuid.uuid4()))
    kept = [make_memory(f"kept {i}") for i in range(3)]
    await store.upsert_memories(first.org_id, first.agent_id, kept)

    with pytest.raises(LimitExceeded) as refused:
        await store.upsert_memories(
            second.org_id, second.agent_id, [make_memory(f"more {i}") for i in range(3)]
        )
    assert refused.value.limit == "max_org_memories" and "at most 5" in str(refused.value)
    assert await store.count_memories(second.org_id, second.agent_id) == 0  # nothing of the batch stayed
    assert await _usage(conn, first.org_id) == await _counted(conn, first.org_id)

    await store.upsert_memories(second.org_id, second.agent_id, [make_memory("fifth"), make_memory("fourth")])
    # At the limit: a changed text of a stored memory adds nothing and passes.
    await store.upsert_memories(first.org_id, first.agent_id, [make_memory("kept, corrected", id=kept[0].id)])
    assert (await _usage(conn, first.org_id))[0] == 5
    # Another org is not counted against this one.
    other = new_tenant()
    await store.upsert_memories(other.org_id, other.agent_id, [make_memory(f"theirs {i}") for i in range(5)])


async def test_an_upsert_past_the_orgs_bytes_is_refused_and_a_shrinking_update_passes(
    pg_store: PostgresMemoryStore, conn: asyncpg.Connection, tenant: Tenant, make_memory: MakeMemory
) -> None:
    store = _store(pg_store, OrgQuotas(content_bytes=100))
    big = make_memory("b" * 60)
    await store.upsert_memories(tenant.org_id, tenant.agent_id, [big])
    with pytest.raises(LimitExceeded) as refused:
        await store.upsert_memories(tenant.org_id, tenant.agent_id, [make_memory("c" * 50)])
    assert refused.value.limit == "max_org_content_bytes"
    with pytest.raises(LimitExceeded):  # growing a stored memory past it too
        await store.upsert_memories(tenant.org_id, tenant.agent_id, [make_memory("b" * 120, id=big.id)])
    await store.upsert_memories(tenant.org_id, tenant.agent_id, [make_memory("b" * 10, id=big.id)])
    await store.upsert_memories(tenant.org_id, tenant.agent_id, [make_memory("c" * 50)])
    assert await _usage(conn, tenant.org_id) == (2, 60)


async def test_concurrent_writers_of_one_org_cannot_overshoot_its_limit(
    pg_store: PostgresMemoryStore,
    conn: asyncpg.Connection,
    new_tenant: Callable[[], Tenant],
    make_memory: MakeMemory,
) -> None:
    store = _store(pg_store, OrgQuotas(memories=4))
    org_id = new_tenant().org_id
    outcomes = await asyncio.gather(
        *(store.upsert_memories(org_id, str(uuid.uuid4()), [make_memory(f"racer {i}")]) for i in range(10)),
        return_exceptions=True,
    )
    assert sum(not isinstance(o, BaseException) for o in outcomes) == 4
    assert all(isinstance(o, LimitExceeded) for o in outcomes if isinstance(o, BaseException))
    assert await _usage(conn, org_id) == await _counted(conn, org_id) == (4, 4 * len("racer 0"))
