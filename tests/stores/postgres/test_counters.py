"""Injection counters (``stores.postgres.counters``) on the real PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import Callable

import asyncpg
import pytest
from ibex_context.errors import InvalidRequest
from ibex_context.stores.base import InjectionRecord
from ibex_context.stores.postgres import (
    PostgresMemoryStore,
)

from tests.conftest import Tenant
from tests.stores.helpers import MakeMemory, records


async def _memory_row_version(postgres_dsn: str, tenant: Tenant, memory_id: str) -> str:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        ctid: str = await conn.fetchval(
            "SELECT ctid::text || '/' || xmin::text FROM memories"
            " WHERE org_id = $1 AND agent_id = $2 AND id = $3",
            uuid.UUID(tenant.org_id),
            uuid.UUID(tenant.agent_id),
            uuid.UUID(memory_id),
        )
    finally:
        await conn.close()
    return ctid


async def test_injections_are_counted_in_one_batch(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    a, b = make_memory("injected twice"), make_memory("injected once")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [a, b])
    at = time.time()
    await pg_store.record_injections(
        [
            InjectionRecord(tenant.org_id, tenant.agent_id, a.id, at - 5),
            InjectionRecord(tenant.org_id, tenant.agent_id, a.id, at),
            InjectionRecord(tenant.org_id, tenant.agent_id, b.id, at),
        ]
    )
    stored = {m.id: m for m in await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [a.id, b.id])}
    assert stored[a.id].retrieval_count == 2 and stored[b.id].retrieval_count == 1
    assert stored[a.id].last_injected_at == pytest.approx(at, abs=1e-3)


async def test_concurrent_injection_batches_over_the_same_rows_all_count(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    batch = [make_memory(f"contended {i}") for i in range(20)]
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, batch)
    at = time.time()
    forward = [InjectionRecord(tenant.org_id, tenant.agent_id, m.id, at) for m in batch]
    backward = list(reversed(forward))
    await asyncio.gather(*(pg_store.record_injections(forward if i % 2 else backward) for i in range(8)))
    stored = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [m.id for m in batch])
    assert sorted(m.retrieval_count for m in stored) == [8] * 20


async def test_injections_never_rewrite_the_memory_row(
    pg_store: PostgresMemoryStore, postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    memory = make_memory("counted elsewhere")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    before = await _memory_row_version(postgres_dsn, tenant, memory.id)
    at = time.time()
    counters = await pg_store.record_injection_counters(
        [InjectionRecord(tenant.org_id, tenant.agent_id, memory.id, at) for _ in range(3)]
    )
    await pg_store.record_injections([InjectionRecord(tenant.org_id, tenant.agent_id, memory.id, at + 1)])
    assert [(c.memory_id, c.retrieval_count) for c in counters] == [(memory.id, 3)]
    assert counters[0].last_injected_at == pytest.approx(at, abs=1e-3)
    assert await _memory_row_version(postgres_dsn, tenant, memory.id) == before
    [stored] = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [memory.id])
    assert stored.retrieval_count == 4
    [found] = records(await pg_store.search(tenant.org_id, tenant.agent_id, memory.embedding, 5))
    assert (found.retrieval_count, found.last_injected_at) == (4, pytest.approx(at + 1, abs=1e-3))


async def test_injections_of_unknown_or_other_tenants_memories_are_skipped(
    pg_store: PostgresMemoryStore, tenant: Tenant, new_tenant: Callable[[], Tenant], make_memory: MakeMemory
) -> None:
    memory = make_memory("belongs to the first tenant")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    other = new_tenant()
    counters = await pg_store.record_injection_counters(
        [
            InjectionRecord(other.org_id, other.agent_id, memory.id, time.time()),
            InjectionRecord(tenant.org_id, tenant.agent_id, str(uuid.uuid4()), time.time()),
        ]
    )
    assert counters == []
    [stored] = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [memory.id])
    assert stored.retrieval_count == 0


async def test_a_batch_counts_each_memory_once_whatever_the_spelling_of_its_id(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    """Repeats add up across spellings (PostgreSQL groups by the uuid), the last time
    wins, and the counters come back keyed by canonical text, as the hot set keys them."""
    memory = make_memory("spelt twice")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    shouted = memory.id.upper()
    counters = await pg_store.record_injection_counters(
        [
            InjectionRecord(tenant.org_id, tenant.agent_id, memory.id, 1_700_000_000.0),
            InjectionRecord(tenant.org_id.upper(), tenant.agent_id, shouted, 1_700_000_005.0),
        ]
    )
    assert [(c.org_id, c.memory_id, c.retrieval_count, c.last_injected_at) for c in counters] == [
        (tenant.org_id, memory.id, 2, 1_700_000_005.0)
    ]


async def test_an_injection_whose_id_is_not_a_uuid_is_refused_naming_it(
    pg_store: PostgresMemoryStore, tenant: Tenant
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        await pg_store.record_injection_counters(
            [
                InjectionRecord(tenant.org_id, tenant.agent_id, str(uuid.uuid4()), 1.0),
                InjectionRecord(tenant.org_id, tenant.agent_id, "not-a-uuid", 1.0),
            ]
        )
    assert refused.value.field == "injections[1].memory_id"


async def test_deleting_a_memory_deletes_its_counters_and_a_reused_id_starts_from_zero(
    pg_store: PostgresMemoryStore, postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    memory = make_memory("short-lived")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    await pg_store.record_injections(
        [InjectionRecord(tenant.org_id, tenant.agent_id, memory.id, time.time())]
    )
    assert await pg_store.delete_memories(tenant.org_id, tenant.agent_id, [memory.id]) == 1
    conn = await asyncpg.connect(postgres_dsn)
    try:
        left = await conn.fetchval(
            "SELECT count(*) FROM memory_usage WHERE org_id = $1 AND agent_id = $2",
            uuid.UUID(tenant.org_id),
            uuid.UUID(tenant.agent_id),
        )
        # A stale counter row (an injection batch that raced the delete) for the same id:
        await conn.execute(
            "INSERT INTO memory_usage (org_id, agent_id, memory_id, retrieval_count) VALUES ($1, $2, $3, 7)",
            uuid.UUID(tenant.org_id),
            uuid.UUID(tenant.agent_id),
            uuid.UUID(memory.id),
        )
    finally:
        await conn.close()
    assert left == 0
    reborn = dataclasses.replace(make_memory("a new text under the old id"), id=memory.id)
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [reborn])
    [stored] = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [memory.id])
    assert (stored.content, stored.retrieval_count) == ("a new text under the old id", 0)
