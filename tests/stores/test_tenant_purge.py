"""The purge against the real stores, below gRPC: it resumes where a call ran out
of time, and its Redis tombstones refuse cache fills that read before it."""

from __future__ import annotations

import itertools
import uuid

import asyncpg
from ibex_context.memory_api.purge import TenantPurge
from ibex_context.stores.postgres import PostgresMemoryStore
from ibex_context.stores.postgres.graphs import graph_index_name
from ibex_context.stores.redis import PURGE_DIRECTIVE_VERSION, RedisContextCache
from ibex_context.stores.tenant_data import TenantData

from tests.conftest import Tenant
from tests.stores.helpers import MakeMemory


class SteppingClock:
    """Each reading is one second later: every deadline passes after one step."""

    def __init__(self) -> None:
        self._ticks = itertools.count()

    def __call__(self) -> float:
        return float(next(self._ticks))


async def test_a_purge_out_of_time_says_incomplete_and_the_next_call_resumes(
    pg_store: PostgresMemoryStore, redis_cache: RedisContextCache, make_memory: MakeMemory, tenant: Tenant
) -> None:
    await pg_store.upsert_memories(
        tenant.org_id, tenant.agent_id, [make_memory(f"fact number {i}") for i in range(7)]
    )
    await pg_store.set_directive(tenant.org_id, tenant.agent_id, "be kind", {})
    data = TenantData(pg_store.pool, purge_batch=3)
    purge = TenantPurge(data=data, cache=redis_cache, call_seconds=0.5, clock=SteppingClock())

    reports = []
    for _ in range(10):
        reports.append(await purge.purge_agent(tenant.org_id, tenant.agent_id))
        if reports[-1].complete:
            break

    # 3 + 3 per timed-out call, then the last batch (1 memory and the directive).
    assert [(r.memories_deleted, r.directives_deleted, r.complete) for r in reports] == [
        (3, 0, False),
        (3, 0, False),
        (1, 1, True),
    ]
    assert await data.count_agent_rows(tenant.org_id, tenant.agent_id) == 0


async def test_tombstones_refuse_cache_fills_that_read_before_the_purge(
    pg_store: PostgresMemoryStore, redis_cache: RedisContextCache, make_memory: MakeMemory, tenant: Tenant
) -> None:
    memory = make_memory("the vault code is 1234")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    state = await pg_store.set_directive_state(tenant.org_id, tenant.agent_id, "guard the vault", {})
    # A rebuild and a directive fill read PostgreSQL before the purge ...
    generation = await redis_cache.hot_set_generation(tenant.org_id, tenant.agent_id)
    stale = await pg_store.top_memories_for_hot_set(tenant.org_id, tenant.agent_id, 5)
    purge = TenantPurge(data=TenantData(pg_store.pool), cache=redis_cache, call_seconds=5.0)

    report = await purge.purge_agent(tenant.org_id, tenant.agent_id)

    # ... and write what they read after it: both are refused.
    assert report.complete
    assert not await redis_cache.replace_hot_set(
        tenant.org_id, tenant.agent_id, [(stale[0], 1.0)], generation
    )
    assert not await redis_cache.put_directive(tenant.org_id, tenant.agent_id, state)
    assert await redis_cache.get_hot_memories(tenant.org_id, tenant.agent_id, 5) is None
    cached = await redis_cache.get_directive_state(tenant.org_id, tenant.agent_id)
    assert cached is not None and cached.content is None and cached.version == PURGE_DIRECTIVE_VERSION


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
