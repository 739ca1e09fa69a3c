"""TenantPurge against the real stores, below gRPC: PostgreSQL first, then Redis; a call
that runs out of time says so and the next one resumes; Redis tombstones refuse the
cache fills of readers that read before the purge."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence

import pytest
import redis.asyncio as aioredis
from ibex_context.errors import CacheError, StoreUnavailable
from ibex_context.memory_api.purge import TenantPurge
from ibex_context.stores.postgres import PostgresMemoryStore
from ibex_context.stores.postgres.tenant_data import TenantData
from ibex_context.stores.redis import RedisContextCache

from tests.conftest import Tenant
from tests.memory_api.clock import FakeClock
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
    assert cached is not None and cached.content is None and cached.version > state.version


async def test_a_directive_set_after_a_purge_is_cached_and_served_at_once(
    pg_store: PostgresMemoryStore, redis_cache: RedisContextCache, tenant: Tenant
) -> None:
    before = await pg_store.set_directive_state(tenant.org_id, tenant.agent_id, "the purged one", {})
    purge = TenantPurge(data=TenantData(pg_store.pool), cache=redis_cache, call_seconds=5.0)
    assert (await purge.purge_agent(tenant.org_id, tenant.agent_id)).complete

    after = await pg_store.set_directive_state(tenant.org_id, tenant.agent_id, "the new one", {})

    # Versions keep growing across the purge (migration 0014): the new one passes the
    # tombstone, a fill of the purged one still does not.
    assert after is not None and before is not None and after.version > before.version
    assert await redis_cache.put_directive(tenant.org_id, tenant.agent_id, after)
    assert not await redis_cache.put_directive(tenant.org_id, tenant.agent_id, before)
    cached = await redis_cache.get_directive_state(tenant.org_id, tenant.agent_id)
    assert cached is not None and cached.content == "the new one"


async def test_purge_org_stops_between_agents_when_out_of_time_and_the_next_call_finishes(
    pg_store: PostgresMemoryStore, redis_cache: RedisContextCache, make_memory: MakeMemory, redis_url: str
) -> None:
    org = str(uuid.uuid4())
    agents = sorted(str(uuid.uuid4()) for _ in range(3))
    for agent in agents:
        await pg_store.upsert_memories(org, agent, [make_memory(f"fact of {agent}")])
    clock = FakeClock()
    told: list[tuple[str, str]] = []

    async def purged(org_id: str, agent_id: str) -> None:
        if (org_id, agent_id) not in told:
            clock.now += 10.0  # an agent with rows takes the whole call's time; a purged one none
        told.append((org_id, agent_id))

    purge = TenantPurge(
        data=TenantData(pg_store.pool),
        cache=redis_cache,
        call_seconds=5.0,
        clock=clock,
        purged=purged,
    )
    raw = aioredis.Redis.from_url(redis_url)
    try:
        await raw.set(f"{{{org}}}:org_summary", b"derived")  # an org-wide key of no agent

        first = await purge.purge_org(org)

        # One agent per call: it is finished (rows, keys, replicas told) before the time check.
        assert (first.agents_purged, first.memories_deleted, first.complete) == (1, 1, False)
        assert told == [(org, agents[0])]
        assert await raw.exists(f"{{{org}}}:org_summary")  # the org's own keys wait for the end

        reports = [first]
        while not reports[-1].complete:
            reports.append(await purge.purge_org(org))
            assert len(reports) <= 4

        # A later call runs again over the agents already purged (their tombstones name
        # them), finds nothing and goes on: one new agent per call.
        assert [(r.memories_deleted, r.complete) for r in reports] == [(1, False), (1, False), (1, True)]
        assert list(dict.fromkeys(agent for _, agent in told)) == agents
        assert not await raw.exists(f"{{{org}}}:org_summary")
        assert reports[-1].cache_keys_deleted >= 1
    finally:
        await raw.aclose()


async def test_an_agent_known_only_to_the_cache_is_purged_with_its_org(
    pg_store: PostgresMemoryStore, redis_cache: RedisContextCache, redis_url: str, tenant: Tenant
) -> None:
    raw = aioredis.Redis.from_url(redis_url)
    try:
        await raw.set(f"{{{tenant.org_id}}}:directive:{tenant.agent_id}", b"left by an older version")
        purge = TenantPurge(data=TenantData(pg_store.pool), cache=redis_cache, call_seconds=5.0)

        report = await purge.purge_org(tenant.org_id)

        assert report.complete and report.agents_purged == 1 and report.memories_deleted == 0
        assert report.cache_keys_deleted == 1
        cached = await redis_cache.get_directive_state(tenant.org_id, tenant.agent_id)
        assert cached is not None and cached.content is None and cached.version > 0
    finally:
        await raw.aclose()


class _NoRows:
    async def agents_of_org(self, org_id: str) -> list[str]:
        return []

    async def purge_agent(self, org_id: str, agent_id: str, *, out_of_time: object) -> object:
        raise AssertionError("no agent to purge")

    async def count_agent_rows(self, org_id: str, agent_id: str) -> int:
        return 0


class _DownCache:
    async def agents_with_keys(self, org_id: str) -> set[str]:
        raise CacheError("ConnectionRefusedError")

    async def purge_org_keys(self, org_id: str, purged_agents: Sequence[str]) -> int:
        raise AssertionError("not reached")

    async def purge_agent(self, org_id: str, agent_id: str, directive_tombstone_version: int) -> int:
        raise AssertionError("not reached")


async def test_a_cache_error_fails_the_purge_as_unavailable() -> None:
    purge = TenantPurge(data=_NoRows(), cache=_DownCache(), call_seconds=5.0)  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable, match="redis: ConnectionRefusedError"):
        await purge.purge_org("0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01")
