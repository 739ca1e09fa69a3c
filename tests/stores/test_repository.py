"""ContextRepository: PostgreSQL behind the Redis cache, with the consistency it promises."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import pytest
import redis.asyncio as aioredis
from ibex_context.devtools.embedded import RedisProcess
from ibex_context.errors import StoreUnavailable
from ibex_context.stores.base import InjectionRecord
from ibex_context.stores.postgres import PostgresMemoryStore
from ibex_context.stores.redis.cache import (
    RedisContextCache,
    create_redis_client,
    directive_key,
    hot_data_key,
    hot_set_key,
)
from ibex_context.stores.redis.hot_record import FORMAT_VERSION
from ibex_context.stores.redis.wire import PipelinedRedis
from ibex_context.stores.repository import ContextRepository

from tests.conftest import Tenant
from tests.stores.helpers import MakeMemory, records


async def _wait_for(predicate: Callable[[], Awaitable[bool]], within_seconds: float = 5.0) -> bool:
    for _ in range(int(within_seconds / 0.02)):
        if await predicate():
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_directive_miss_reads_postgres_and_fills_the_cache(
    repository: ContextRepository, pg_store: PostgresMemoryStore, redis_url: str, tenant: Tenant
) -> None:
    version = await pg_store.set_directive(
        tenant.org_id, tenant.agent_id, "Answer in French.", {"o200k_base": 4}
    )
    directive = await repository.get_directive(tenant.org_id, tenant.agent_id)
    assert directive is not None and directive.content == "Answer in French." and directive.version == version
    assert directive.token_counts == {"o200k_base": 4}
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert (await client.get(directive_key(tenant.org_id, tenant.agent_id))).startswith(b"%d|" % version)
    finally:
        await client.aclose()


async def test_a_cleared_directive_is_cached_so_postgres_is_not_asked_again(
    repository: ContextRepository, postgres_dsn: str, tenant: Tenant
) -> None:
    await repository.set_directive(tenant.org_id, tenant.agent_id, "Be terse.", {})
    await repository.clear_directive(tenant.org_id, tenant.agent_id)
    assert await repository.get_directive(tenant.org_id, tenant.agent_id) is None
    # Written behind the repository's back: the negative entry keeps answering until it expires
    # (the write side always goes through the repository, which writes the cache through).
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute(
            "UPDATE directives SET content = 'sneaky' WHERE org_id = $1 AND agent_id = $2",
            uuid.UUID(tenant.org_id),
            uuid.UUID(tenant.agent_id),
        )
    finally:
        await conn.close()
    assert await repository.get_directive(tenant.org_id, tenant.agent_id) is None


async def test_unknown_agents_leave_no_key_in_redis(
    repository: ContextRepository, redis_url: str, new_tenant: Callable[[], Tenant]
) -> None:
    # A caller cycling random ids: each pair cost a negative directive entry and an
    # empty hot-set marker (TTL 300 s / 3600 s) and so filled Redis.
    strangers = [new_tenant() for _ in range(20)]
    for stranger in strangers:
        assert await repository.get_directive(stranger.org_id, stranger.agent_id) is None
        assert records(await repository.get_hot_memories(stranger.org_id, stranger.agent_id, 10)) == []
        # The rebuild the miss scheduled (or a fresh one once it is done) has run.
        assert await repository.schedule_hot_set_rebuild(stranger.org_id, stranger.agent_id)
    client = aioredis.Redis.from_url(redis_url)
    try:
        left = [key for s in strangers for key in await client.keys(f"{{{s.org_id}}}:*")]
    finally:
        await client.aclose()
    assert left == []


async def test_an_agent_that_never_had_a_directive_sees_one_written_behind_the_cache(
    repository: ContextRepository, postgres_dsn: str, tenant: Tenant
) -> None:
    assert await repository.get_directive(tenant.org_id, tenant.agent_id) is None
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await conn.execute(
            "INSERT INTO directives (org_id, agent_id, content) VALUES ($1, $2, 'new')",
            uuid.UUID(tenant.org_id),
            uuid.UUID(tenant.agent_id),
        )
    finally:
        await conn.close()
    directive = await repository.get_directive(tenant.org_id, tenant.agent_id)
    assert directive is not None and directive.content == "new"


async def test_setting_and_clearing_a_directive_writes_the_cache_through(
    repository: ContextRepository, tenant: Tenant
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    assert await repository.get_directive(org, agent) is None
    terse = await repository.set_directive(org, agent, "Be terse.", {})
    directive = await repository.get_directive(org, agent)
    assert directive is not None and (directive.content, directive.version) == ("Be terse.", terse)
    verbose = await repository.set_directive(org, agent, "Be verbose.", {})
    assert verbose > terse
    directive = await repository.get_directive(org, agent)
    assert directive is not None and (directive.content, directive.version) == ("Be verbose.", verbose)
    assert await repository.clear_directive(org, agent) is True
    assert await repository.get_directive(org, agent) is None


async def test_a_failed_cache_write_deletes_the_entry_so_it_cannot_go_stale(
    repository: ContextRepository, redis_url: str, tenant: Tenant
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    old = await repository.set_directive(org, agent, "old", {})
    client = aioredis.Redis.from_url(redis_url)
    try:
        # Redis refuses writes when out of memory but still accepts DEL.
        await client.config_set("maxmemory-policy", "noeviction")
        await client.config_set("maxmemory", "1")
        try:
            assert await repository.set_directive(org, agent, "new", {}) > old
            assert await client.get(directive_key(org, agent)) is None
        finally:
            await client.config_set("maxmemory", "0")
    finally:
        await client.aclose()
    directive = await repository.get_directive(org, agent)
    assert directive is not None and directive.content == "new"


async def test_a_missing_hot_set_answers_empty_at_once_and_is_rebuilt_in_the_background(
    repository: ContextRepository, tenant: Tenant, make_memory: MakeMemory
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    await repository._postgres.upsert_memories(  # written before any hot set exists
        org,
        agent,
        [make_memory(f"fact {i}", confidence=0.1 + 0.1 * i) for i in range(8)],
    )
    assert records(await repository.get_hot_memories(org, agent, 3)) == []
    # Concurrent misses share one rebuild.
    first = repository.schedule_hot_set_rebuild(org, agent)
    assert repository.schedule_hot_set_rebuild(org, agent) is first
    assert await first is True
    hot = records(await repository.get_hot_memories(org, agent, 3))
    assert [m.content for m in hot] == ["fact 7", "fact 6", "fact 5"]  # highest confidence first


async def test_writes_keep_the_hot_set_current(
    repository: ContextRepository, redis_cache: RedisContextCache, tenant: Tenant, make_memory: MakeMemory
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    await repository.upsert_memories(org, agent, [make_memory(f"fact {i}", confidence=0.5) for i in range(3)])
    assert await repository.rebuild_hot_set(org, agent)
    star = make_memory("the best fact", confidence=1.0, usefulness=1.0)
    await repository.upsert_memories(org, agent, [star])
    hot = records(await repository.get_hot_memories(org, agent, 10))
    assert hot[0].id == star.id and len(hot) == 4
    await repository.delete_memories(org, agent, [star.id])
    hot = records(await repository.get_hot_memories(org, agent, 10))
    assert star.id not in [m.id for m in hot] and len(hot) == 3


async def test_the_hot_set_keeps_only_the_best_n_after_many_writes(
    repository: ContextRepository, tenant: Tenant, make_memory: MakeMemory
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    assert await repository.rebuild_hot_set(org, agent)  # an empty, built hot set
    batch = [make_memory(f"fact {i}", confidence=i / 10) for i in range(1, 9)]
    await repository.upsert_memories(org, agent, batch)
    hot = records(await repository.get_hot_memories(org, agent, 50))
    assert [m.content for m in hot] == [f"fact {i}" for i in range(8, 3, -1)]  # size 5


async def test_deleting_a_hot_member_refills_the_hot_set_from_postgres(
    repository: ContextRepository, tenant: Tenant, make_memory: MakeMemory
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    batch = [make_memory(f"fact {i}", confidence=i / 10) for i in range(1, 8)]
    await repository.upsert_memories(org, agent, batch)
    assert await repository.rebuild_hot_set(org, agent)
    await repository.delete_memories(org, agent, [batch[-1].id])

    async def refilled() -> bool:
        hot = records(await repository.get_hot_memories(org, agent, 50))
        return [m.content for m in hot] == [f"fact {i}" for i in range(6, 1, -1)]

    assert await _wait_for(refilled)


async def test_injections_are_counted_but_do_not_raise_the_hot_set_scores(
    repository: ContextRepository, redis_url: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    memory = make_memory("often injected")
    await repository.upsert_memories(org, agent, [memory])
    assert await repository.rebuild_hot_set(org, agent)
    client = aioredis.Redis.from_url(redis_url)
    try:
        before = await client.zscore(hot_set_key(org, agent), memory.id)
        await repository.record_injections(
            [InjectionRecord(org, agent, memory.id, 1e9 + i) for i in range(10)]
        )
        after = await client.zscore(hot_set_key(org, agent), memory.id)
    finally:
        await client.aclose()
    # Frequency's default weight is 0 (ADR-0008): being injected must not keep a memory
    # in the hot set, which would get it injected again.
    assert before is not None and after == before
    [hot] = records(await repository.get_hot_memories(org, agent, 5))
    assert hot.retrieval_count == 10


async def test_redis_down_writes_still_land_in_postgres_and_the_cache_is_invalidated_later(
    throwaway_redis: RedisProcess, pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    cache = RedisContextCache(
        create_redis_client(throwaway_redis.url, max_connections=4),
        PipelinedRedis.from_url(throwaway_redis.url),
        directive_ttl_seconds=60,
        hot_set_size=5,
        hot_set_ttl_seconds=60,
    )
    repository = ContextRepository(pg_store, cache, invalidation_retry_seconds=0.05)
    try:
        throwaway_redis.stop()
        memory = make_memory("written while redis was down")
        [result] = await repository.upsert_memories(org, agent, [memory])
        assert result.outcome == "created"
        assert await repository.set_directive(org, agent, "still works", {}) > 0
        assert [m.id for m in await pg_store.fetch_memories(org, agent, [memory.id])] == [memory.id]
        assert (await pg_store.get_directive(org, agent)) is not None
        # The directive is still served, from PostgreSQL; the hot set reports its store down,
        # quickly (no retry backoff), so the assembly can say why it degraded.
        started = time.monotonic()
        directive = await repository.get_directive(org, agent)
        assert directive is not None and directive.content == "still works"
        with pytest.raises(StoreUnavailable, match="redis"):
            records(await repository.get_hot_memories(org, agent, 5))
        assert time.monotonic() - started < 0.5
        assert repository.pending_invalidations == 2
        # Injections are counted in PostgreSQL; the hot set they would patch is
        # marked for invalidation (the directive's and this agent's are pending already).
        await repository.record_injections([InjectionRecord(org, agent, memory.id, 1e9)])
        [counted] = await pg_store.fetch_memories(org, agent, [memory.id])
        assert counted.retrieval_count == 1
        assert repository.pending_invalidations == 2
        assert (await repository.check_health()).extra["redis"] == "down"
        throwaway_redis.start()

        async def drained() -> bool:
            return repository.pending_invalidations == 0

        assert await _wait_for(drained)
        # The reads reconnect: the restarted (empty) Redis has no hot set, so the
        # read schedules its rebuild, after which the memory is read from Redis.
        assert records(await repository.get_hot_memories(org, agent, 5)) == []
        assert await repository.schedule_hot_set_rebuild(org, agent)
        assert [m.id for m in records(await repository.get_hot_memories(org, agent, 5))] == [memory.id]
    finally:
        await repository.aclose()
        await cache.aclose()


async def test_the_first_write_builds_the_hot_set_so_reads_see_it(
    repository: ContextRepository, tenant: Tenant, make_memory: MakeMemory
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    memory = make_memory("written first")
    await repository.upsert_memories(org, agent, [memory])
    assert [m.id for m in records(await repository.get_hot_memories(org, agent, 5))] == [memory.id]


async def test_a_hot_set_left_by_an_older_version_is_rebuilt_in_the_current_format(
    repository: ContextRepository, redis_url: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    batch = [make_memory(f"fact {i}", confidence=i / 10) for i in range(1, 4)]
    await repository.upsert_memories(org, agent, batch)
    client = aioredis.Redis.from_url(redis_url)
    try:
        # One member as the previous version (format 2) stored it: a version byte of 2.
        data = await client.hget(hot_data_key(org, agent), batch[0].id)
        await client.hset(hot_data_key(org, agent), batch[0].id, b"\x02" + data[1:])
        assert records(await repository.get_hot_memories(org, agent, 5)) == []  # read as missing
        assert await repository.schedule_hot_set_rebuild(org, agent)  # the rebuild that scheduled
        hot = records(await repository.get_hot_memories(org, agent, 5))
        assert [m.content for m in hot] == ["fact 3", "fact 2", "fact 1"]
        stored = await client.hvals(hot_data_key(org, agent))
        assert sorted(value[0] for value in stored if value != b"1") == [FORMAT_VERSION] * 3
    finally:
        await client.aclose()
