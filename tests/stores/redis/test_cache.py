"""RedisContextCache against the session's real Redis."""

from __future__ import annotations

import struct
import uuid

import pytest
import redis.asyncio as aioredis
from ibex_context.models import MemoryRecord
from ibex_context.stores.base import DirectiveState, MemoryCounters
from ibex_context.stores.hot_score import frequency_weight
from ibex_context.stores.redis import cache as redis_module
from ibex_context.stores.redis.cache import (
    RedisContextCache,
    create_redis_client,
    directive_key,
    hot_data_key,
    hot_set_key,
)
from ibex_context.stores.redis.wire import PipelinedRedis

from tests.conftest import Tenant
from tests.stores.helpers import records, unit_vector


def record(n: int) -> MemoryRecord:
    return MemoryRecord(
        id=str(uuid.UUID(int=n)), content=f"memory {n}", category="factual", embedding=unit_vector(n)
    )


def format_2_record(record: MemoryRecord) -> bytes:
    """A record as the previous version (format 2) wrote it."""
    ident, category, content = (value.encode() for value in (record.id, record.category, record.content))
    counts = b"{}"
    nan = float("nan")
    header = struct.pack(
        "<BIddddHHIH", 2, 0, nan, nan, nan, nan, len(ident), len(category), len(content), len(counts)
    )
    vector = b"" if record.embedding is None else record.embedding.astype("<f4").tobytes()
    return header + ident + category + content + counts + vector


def test_keys_are_hash_tagged_by_org_so_one_agent_lives_in_one_slot() -> None:
    assert directive_key("o1", "a1") == "{o1}:directive:a1"
    assert hot_set_key("o1", "a1") == "{o1}:hot_memories:a1"
    assert hot_data_key("o1", "a1") == "{o1}:hot_memory_data:a1"


async def test_a_newer_directive_version_replaces_an_older_one_never_the_reverse(
    redis_cache: RedisContextCache, tenant: Tenant
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    assert await redis_cache.get_directive_state(org, agent) is None
    assert await redis_cache.put_directive(org, agent, DirectiveState("v2", 2, {"o200k_base": 1}))
    assert not await redis_cache.put_directive(org, agent, DirectiveState("v1", 1, {}))
    cached = await redis_cache.get_directive_state(org, agent)
    assert cached == DirectiveState("v2", 2, {"o200k_base": 1})
    assert await redis_cache.put_directive(org, agent, DirectiveState(None, 3, {}))
    negative = await redis_cache.get_directive_state(org, agent)
    assert negative is not None and negative.content is None and negative.to_directive() is None


async def test_a_hot_set_rebuilt_with_no_memories_writes_no_key(
    redis_cache: RedisContextCache, tenant: Tenant
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    assert await redis_cache.get_hot_memories(org, agent, 20) is None
    assert await redis_cache.replace_hot_set(org, agent, [], expected_generation=0)
    assert await redis_cache.get_hot_memories(org, agent, 20) is None  # still missing: no marker
    assert await redis_cache.hot_set_ttl(org, agent) == -2


async def test_a_hot_set_whose_last_member_is_removed_stays_built_and_empty(
    redis_cache: RedisContextCache, tenant: Tenant
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    assert await redis_cache.replace_hot_set(org, agent, [(record(1), 0.1)], expected_generation=0)
    await redis_cache.remove_hot_memories(org, agent, [record(1).id])
    assert records(await redis_cache.get_hot_memories(org, agent, 20)) == []


async def test_the_hot_set_reads_the_best_first_in_one_call_and_trims_to_its_size(
    redis_cache: RedisContextCache, tenant: Tenant, redis_url: str
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    scored = [(record(i), i / 10) for i in range(1, 5)]  # scores 0.1 .. 0.4
    assert await redis_cache.replace_hot_set(org, agent, scored, expected_generation=0)
    top = records(await redis_cache.get_hot_memories(org, agent, 3))
    assert top is not None and [r.content for r in top] == ["memory 4", "memory 3", "memory 2"]
    assert top[0].embedding is not None and top[0].embedding.shape == (384,)
    # Size is 5: adding three more keeps the five best and drops the others' data too.
    assert await redis_cache.add_hot_memories(org, agent, [(record(i), i / 10) for i in range(5, 8)])
    everything = records(await redis_cache.get_hot_memories(org, agent, 50))
    assert everything is not None and [r.content for r in everything] == [
        f"memory {i}" for i in range(7, 2, -1)
    ]
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await client.hlen(hot_data_key(org, agent)) == 5 + 1  # members + the built marker
        assert await client.ttl(hot_set_key(org, agent)) > 0
    finally:
        await client.aclose()


async def test_a_rebuild_that_raced_a_write_is_not_installed(
    redis_cache: RedisContextCache, tenant: Tenant
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    generation = await redis_cache.hot_set_generation(org, agent)
    # A write lands while the rebuild is reading PostgreSQL: the hot set is missing, so it
    # is not created partially, but the generation moves on.
    assert not await redis_cache.add_hot_memories(org, agent, [(record(1), 0.5)])
    assert not await redis_cache.replace_hot_set(org, agent, [(record(2), 0.4)], generation)
    assert await redis_cache.get_hot_memories(org, agent, 5) is None
    assert await redis_cache.replace_hot_set(org, agent, [(record(1), 0.5)], generation + 1)


async def test_removing_members_removes_their_data(redis_cache: RedisContextCache, tenant: Tenant) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    await redis_cache.replace_hot_set(org, agent, [(record(1), 0.5), (record(2), 0.4)], 0)
    assert await redis_cache.remove_hot_memories(org, agent, [record(1).id, str(uuid.uuid4())]) == 1
    remaining = records(await redis_cache.get_hot_memories(org, agent, 5))
    assert remaining is not None and [r.id for r in remaining] == [record(2).id]


async def test_another_org_with_the_same_agent_id_sees_no_hot_set(
    redis_cache: RedisContextCache, tenant: Tenant
) -> None:
    await redis_cache.replace_hot_set(tenant.org_id, tenant.agent_id, [(record(1), 0.5)], 0)
    assert await redis_cache.get_hot_memories(str(uuid.uuid4()), tenant.agent_id, 5) is None


async def test_health_is_ok_while_redis_answers(redis_cache: RedisContextCache) -> None:
    assert (await redis_cache.check_health()).ok


async def test_warm_up_loads_every_script(redis_cache: RedisContextCache, redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.script_flush()
        await redis_cache.warm_up(connections=2)
        from ibex_context.stores.redis import cache as module

        scripts = [
            module._READ_HOT,
            module._REPLACE_HOT,
            module._ADD_HOT,
            module._REMOVE_HOT,
            module._PUT_DIRECTIVE,
        ]
        shas = [redis_cache._client.register_script(s).sha for s in scripts]
        assert await client.script_exists(*shas) == [True] * len(scripts)
    finally:
        await client.aclose()


async def test_patching_counters_moves_only_the_frequency_term_of_members_already_there(
    redis_cache: RedisContextCache, tenant: Tenant, redis_url: str
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    await redis_cache.replace_hot_set(org, agent, [(record(1), 0.5), (record(2), 0.4)], 0)
    generation = await redis_cache.hot_set_generation(org, agent)
    absent = str(uuid.UUID(int=99))
    patched = await redis_cache.patch_hot_counters(
        org,
        agent,
        [
            MemoryCounters(org, agent, record(2).id, 60, 1_700_000_000.5),  # past the cap
            MemoryCounters(org, agent, absent, 3, 1_700_000_000.5),
        ],
    )
    assert patched == 1
    weight = frequency_weight()
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await client.zscore(hot_set_key(org, agent), record(2).id) == pytest.approx(0.4 + weight)
        assert await client.zscore(hot_set_key(org, agent), record(1).id) == pytest.approx(0.5)
        assert await client.zscore(hot_set_key(org, agent), absent) is None  # never added
    finally:
        await client.aclose()
    hot = records(await redis_cache.get_hot_memories(org, agent, 5))
    assert hot is not None
    by_id = {r.id: r for r in hot}
    assert (by_id[record(2).id].retrieval_count, by_id[record(2).id].last_injected_at) == (
        60,
        1_700_000_000.5,
    )
    assert by_id[record(2).id].content == "memory 2" and by_id[record(2).id].embedding is not None
    assert by_id[record(1).id].retrieval_count == 0
    # The generation moved, so a rebuild that read PostgreSQL before these counters cannot land.
    assert await redis_cache.hot_set_generation(org, agent) == generation + 1
    # The last injection time never moves backwards; the score follows the count only.
    await redis_cache.patch_hot_counters(org, agent, [MemoryCounters(org, agent, record(2).id, 61, 5.0)])
    [again] = [r for r in records(await redis_cache.get_hot_memories(org, agent, 5)) if r.id == record(2).id]
    assert (again.retrieval_count, again.last_injected_at) == (61, 1_700_000_000.5)


async def test_a_batch_of_patches_travels_as_one_argument_and_each_lands(
    redis_url: str, tenant: Tenant
) -> None:
    """200 members patched in one script call: the packed form carries every patch."""
    cache = RedisContextCache(
        create_redis_client(redis_url, max_connections=2),
        PipelinedRedis.from_url(redis_url),
        directive_ttl_seconds=300,
        hot_set_size=200,
        hot_set_ttl_seconds=600,
    )
    org, agent = tenant.org_id, tenant.agent_id
    members = [record(n) for n in range(200)]
    counters = [MemoryCounters(org, agent, m.id, n + 1, 1_700_000_000.0 + n) for n, m in enumerate(members)]
    try:
        await cache.replace_hot_set(org, agent, [(m, 0.5) for m in members], 0)
        assert len(redis_module._patch_args(counters)) == 3  # TTL, weight, the patches
        assert await cache.patch_hot_counters(org, agent, counters) == 200
        hot = {r.id: r for r in records(await cache.get_hot_memories(org, agent, 200))}
    finally:
        await cache.aclose()
    assert [(hot[m.id].retrieval_count, hot[m.id].last_injected_at) for m in members] == [
        (n + 1, 1_700_000_000.0 + n) for n in range(200)
    ]


def test_a_memory_id_that_is_not_canonical_uuid_text_is_refused_not_cut() -> None:
    with pytest.raises(ValueError, match="canonical UUID"):
        redis_module._patch_args([MemoryCounters("o", "a", "{" + str(uuid.UUID(int=1)) + "}", 1, 1.0)])


async def test_patching_a_missing_hot_set_changes_nothing(
    redis_cache: RedisContextCache, tenant: Tenant
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    counters = [MemoryCounters(org, agent, record(1).id, 1, 1.0)]
    assert await redis_cache.patch_hot_counters(org, agent, counters) == 0
    assert await redis_cache.get_hot_memories(org, agent, 5) is None
    assert await redis_cache.hot_set_generation(org, agent) == 0


async def test_patching_several_agents_in_one_round_trip_patches_each_on_its_own(
    redis_cache: RedisContextCache, tenant: Tenant
) -> None:
    org, agent = tenant.org_id, tenant.agent_id
    other = str(uuid.uuid4())  # an agent without a hot set
    await redis_cache.replace_hot_set(org, agent, [(record(1), 0.5), (record(2), 0.4)], 0)
    outcomes = await redis_cache.patch_hot_counters_of_agents(
        {
            (org, agent): [MemoryCounters(org, agent, record(1).id, 7, 2.0)],
            (org, other): [MemoryCounters(org, other, record(1).id, 9, 2.0)],
            (org, str(uuid.uuid4())): [],  # nothing to patch: not sent
        }
    )
    assert outcomes == {(org, agent): 1, (org, other): 0}
    hot = {r.id: r for r in records(await redis_cache.get_hot_memories(org, agent, 5))}
    assert hot[record(1).id].retrieval_count == 7 and hot[record(2).id].retrieval_count == 0
    assert await redis_cache.get_hot_memories(org, other, 5) is None


async def test_a_hot_set_holding_a_record_of_an_older_format_reads_as_missing_and_is_not_patched(
    redis_cache: RedisContextCache, tenant: Tenant, redis_url: str
) -> None:
    # Left by the previous version: the read answers "missing", so the repository rebuilds it.
    org, agent = tenant.org_id, tenant.agent_id
    await redis_cache.replace_hot_set(org, agent, [(record(1), 0.5), (record(2), 0.4)], 0)
    old = format_2_record(record(3))
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.zadd(hot_set_key(org, agent), {record(3).id: 0.3})
        await client.hset(hot_data_key(org, agent), record(3).id, old)
        # Above the limit it is not read, so the best two still serve.
        top = records(await redis_cache.get_hot_memories(org, agent, 2))
        assert top is not None and [r.id for r in top] == [record(1).id, record(2).id]
        assert await redis_cache.get_hot_memories(org, agent, 3) is None
        counters = [MemoryCounters(org, agent, record(3).id, 5, 1_700_000_000.0)]
        assert await redis_cache.patch_hot_counters(org, agent, counters) == 0
        assert await client.hget(hot_data_key(org, agent), record(3).id) == old
    finally:
        await client.aclose()
    # A rebuild replaces the whole set in the current format.
    generation = await redis_cache.hot_set_generation(org, agent)
    assert await redis_cache.replace_hot_set(org, agent, [(record(3), 0.3)], generation)
    rebuilt = records(await redis_cache.get_hot_memories(org, agent, 3))
    assert rebuilt is not None and [r.content for r in rebuilt] == ["memory 3"]
