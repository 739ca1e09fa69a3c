"""Purging an agent and an org over real gRPC: afterwards nothing of the tenant is
left in PostgreSQL or Redis (both scanned), other tenants are untouched, and writes
racing the purge leave no memory from before it."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator

import asyncpg
import grpc
import pytest
import redis.asyncio as aioredis
from ibex_context.devtools.embedded import RedisProcess
from ibex_context.stores.redis.cache import PURGE_TOMBSTONE_SECONDS
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

from tests.conftest import Tenant

from .conftest import StartService, request, user

Stub = context_pb2_grpc.MemoryServiceStub
TABLES = ("memories", "directives", "memory_usage", "memory_feedback")
BOUND_SECONDS = 20.0


@pytest.fixture
async def pg(postgres_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(postgres_dsn)
    yield conn
    await conn.close()


@pytest.fixture
async def cache(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def _rows(pg: asyncpg.Connection, org_id: str, agent_id: str | None = None) -> dict[str, int]:
    """Rows of the tenant in every tenant table (scanned by org, and agent if given)."""
    counts = {}
    for table in TABLES:
        if agent_id is None:
            sql, args = f"SELECT count(*) FROM {table} WHERE org_id = $1", [uuid.UUID(org_id)]
        else:
            sql = f"SELECT count(*) FROM {table} WHERE org_id = $1 AND agent_id = $2"
            args = [uuid.UUID(org_id), uuid.UUID(agent_id)]
        counts[table] = int(await pg.fetchval(sql, *args))
    return counts


async def _keys(cache: aioredis.Redis, pattern: str) -> dict[str, bytes]:
    """Every key matching ``pattern`` with a dump of its value (type-agnostic)."""
    found = {}
    async for key in cache.scan_iter(match=pattern, count=1000):
        found[key.decode()] = await cache.dump(key) or b""
    return found


async def _assert_only_tombstones(cache: aioredis.Redis, pattern: str) -> None:
    """What a purge may leave for a minute: a directive entry "no directive" at the
    tombstone version and a bare generation counter, both expiring; nothing else."""
    for key in await _keys(cache, pattern):
        ttl = await cache.ttl(key)
        assert 0 < ttl <= PURGE_TOMBSTONE_SECONDS, key
        value = await cache.get(key)
        if ":directive:" in key:
            assert value is not None and re.fullmatch(rb"\d+\|-", value), (key, value)
        else:
            assert ":hot_gen:" in key and value is not None and value.isdigit(), key


async def _populate(
    memories: Stub,
    assembly: context_pb2_grpc.ContextAssemblyServiceStub,
    pg: asyncpg.Connection,
    tenant: Tenant,
) -> list[str]:
    """Memories, a directive, feedback, injection counters and a hot set in Redis."""
    reply = await memories.UpsertMemories(
        pb.UpsertMemoriesRequest(
            org_id=tenant.org_id,
            agent_id=tenant.agent_id,
            memories=[
                pb.MemoryInput(content=f"purge test fact {i} about lighthouses", category="factual")
                for i in range(6)
            ],
        )
    )
    ids = [r.id for r in reply.results]
    await memories.SetDirective(
        pb.SetDirectiveRequest(org_id=tenant.org_id, agent_id=tenant.agent_id, content="Answer as a keeper.")
    )
    await memories.RecordFeedback(
        pb.RecordFeedbackRequest(
            org_id=tenant.org_id,
            agent_id=tenant.agent_id,
            feedback=[pb.MemoryFeedback(memory_id=ids[0], feedback=pb.FEEDBACK_POSITIVE)],
        )
    )
    response = await assembly.AssembleContext(
        request(tenant.org_id, tenant.agent_id, user("tell me about lighthouses"))
    )
    assert response.metadata.memories_injected > 0
    # Injections are recorded after the response, within a flush interval.
    for _ in range(int(BOUND_SECONDS / 0.05)):
        if (await _rows(pg, tenant.org_id, tenant.agent_id))["memory_usage"]:
            break
        await asyncio.sleep(0.05)
    counts = await _rows(pg, tenant.org_id, tenant.agent_id)
    assert all(counts.values()), counts
    return ids


async def test_purge_agent_leaves_nothing_of_it_and_spares_the_others(
    memories: Stub,
    assembly: context_pb2_grpc.ContextAssemblyServiceStub,
    pg: asyncpg.Connection,
    cache: aioredis.Redis,
    tenant: Tenant,
) -> None:
    sibling = Tenant(tenant.org_id, str(uuid.uuid4()))
    same_agent_elsewhere = Tenant(str(uuid.uuid4()), tenant.agent_id)
    await _populate(memories, assembly, pg, tenant)
    for other in (sibling, same_agent_elsewhere):
        await _populate(memories, assembly, pg, other)
    others_before = {
        t: (await _rows(pg, t.org_id, t.agent_id), await _keys(cache, f"{{{t.org_id}}}:*:{t.agent_id}"))
        for t in (sibling, same_agent_elsewhere)
    }
    assert await _keys(cache, f"{{{tenant.org_id}}}:hot_memory_data:{tenant.agent_id}")

    reply = await memories.PurgeAgent(pb.PurgeAgentRequest(org_id=tenant.org_id, agent_id=tenant.agent_id))

    assert reply.complete and reply.memories_deleted == 6 and reply.directives_deleted == 1
    assert reply.agents_purged == 1 and reply.cache_keys_deleted >= 3
    assert await _rows(pg, tenant.org_id, tenant.agent_id) == dict.fromkeys(TABLES, 0)
    await _assert_only_tombstones(cache, f"{{{tenant.org_id}}}:*:{tenant.agent_id}")
    for other, (rows, keys) in others_before.items():
        assert await _rows(pg, other.org_id, other.agent_id) == rows
        assert await _keys(cache, f"{{{other.org_id}}}:*:{other.agent_id}") == keys
    # Served as an agent without anything, and purging again is a no-op.
    after = await assembly.AssembleContext(request(tenant.org_id, tenant.agent_id, user("lighthouses")))
    assert after.metadata.memories_injected == 0 and not after.metadata.directive_injected
    again = await memories.PurgeAgent(pb.PurgeAgentRequest(org_id=tenant.org_id, agent_id=tenant.agent_id))
    assert again.complete and again.memories_deleted == 0 and again.directives_deleted == 0


async def test_purge_org_leaves_nothing_of_any_of_its_agents(
    memories: Stub,
    assembly: context_pb2_grpc.ContextAssemblyServiceStub,
    pg: asyncpg.Connection,
    cache: aioredis.Redis,
    tenant: Tenant,
) -> None:
    sibling = Tenant(tenant.org_id, str(uuid.uuid4()))
    only_read = Tenant(tenant.org_id, str(uuid.uuid4()))
    bystander = Tenant(str(uuid.uuid4()), tenant.agent_id)
    for t in (tenant, sibling, bystander):
        await _populate(memories, assembly, pg, t)
    # An agent with cache entries and no rows (the service no longer caches unknown
    # agents, issue 18, but an older version did): assembling leaves nothing, and a
    # key left behind is found by the org scan.
    await assembly.AssembleContext(request(only_read.org_id, only_read.agent_id, user("hello")))
    assert not await _keys(cache, f"{{{only_read.org_id}}}:*:{only_read.agent_id}")
    await cache.set(f"{{{only_read.org_id}}}:directive:{only_read.agent_id}", b"left by an older version")
    # An org-wide key of a kind the service may add later: "any derived key" goes too.
    await cache.set(f"{{{tenant.org_id}}}:org_summary", b"derived")
    bystander_rows = await _rows(pg, bystander.org_id)
    bystander_keys = await _keys(cache, f"{{{bystander.org_id}}}:*")

    reply = await memories.PurgeOrg(pb.PurgeOrgRequest(org_id=tenant.org_id))

    assert reply.complete and reply.memories_deleted == 12 and reply.directives_deleted == 2
    assert reply.agents_purged == 3
    assert await _rows(pg, tenant.org_id) == dict.fromkeys(TABLES, 0)
    await _assert_only_tombstones(cache, f"{{{tenant.org_id}}}:*")
    assert await _rows(pg, bystander.org_id) == bystander_rows
    assert await _keys(cache, f"{{{bystander.org_id}}}:*") == bystander_keys


async def test_writes_racing_a_purge_leave_no_memory_from_before_it(
    memories: Stub, pg: asyncpg.Connection, cache: aioredis.Redis, tenant: Tenant
) -> None:
    # More than one purge batch (2000 rows), so the purge interleaves with the writer.
    before: set[str] = set()
    for start in range(0, 2100, 700):
        reply = await memories.UpsertMemories(
            pb.UpsertMemoriesRequest(
                org_id=tenant.org_id,
                agent_id=tenant.agent_id,
                memories=[
                    pb.MemoryInput(content=f"early memory {i}", category="episodic")
                    for i in range(start, start + 700)
                ],
            )
        )
        before |= {r.id for r in reply.results}
    stop = asyncio.Event()
    during: set[str] = set()

    async def writer() -> None:
        n = 0
        while not stop.is_set():
            reply = await memories.UpsertMemories(
                pb.UpsertMemoriesRequest(
                    org_id=tenant.org_id,
                    agent_id=tenant.agent_id,
                    memories=[
                        pb.MemoryInput(content=f"racing memory {n}-{k}", category="factual") for k in range(5)
                    ],
                )
            )
            during.update(r.id for r in reply.results)
            n += 1

    task = asyncio.create_task(writer())
    try:
        await asyncio.sleep(0.05)
        async with asyncio.timeout(BOUND_SECONDS * 3):
            for _ in range(20):
                reply = await memories.PurgeAgent(
                    pb.PurgeAgentRequest(org_id=tenant.org_id, agent_id=tenant.agent_id)
                )
                if reply.complete:
                    break
            assert reply.complete
    finally:
        stop.set()
        await asyncio.wait_for(task, BOUND_SECONDS)

    stored = {
        str(r["id"])
        for r in await pg.fetch(
            "SELECT id FROM memories WHERE org_id = $1 AND agent_id = $2",
            uuid.UUID(tenant.org_id),
            uuid.UUID(tenant.agent_id),
        )
    }
    assert not stored & before
    assert stored <= during  # survivors are writes that ran with or after the purge
    # The cache never holds a memory PostgreSQL does not.
    members = {
        m.decode() for m in await cache.zrange(f"{{{tenant.org_id}}}:hot_memories:{tenant.agent_id}", 0, -1)
    }
    assert members <= stored


async def test_a_purge_with_redis_down_fails_unavailable_and_a_retry_finishes_it(
    start_service: StartService, throwaway_redis: RedisProcess, pg: asyncpg.Connection, tenant: Tenant
) -> None:
    service = await start_service(redis_url=throwaway_redis.url)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        stub = Stub(channel)
        await stub.UpsertMemories(
            pb.UpsertMemoriesRequest(
                org_id=tenant.org_id,
                agent_id=tenant.agent_id,
                memories=[pb.MemoryInput(content=f"fault fact {i}", category="factual") for i in range(4)],
            )
        )
        throwaway_redis.stop()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.PurgeAgent(pb.PurgeAgentRequest(org_id=tenant.org_id, agent_id=tenant.agent_id))
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        # PostgreSQL, the truth, was purged first; Redis is what the retry is for.
        assert await _rows(pg, tenant.org_id, tenant.agent_id) == dict.fromkeys(TABLES, 0)

        throwaway_redis.start()
        reply = await stub.PurgeAgent(pb.PurgeAgentRequest(org_id=tenant.org_id, agent_id=tenant.agent_id))

    assert reply.complete and reply.memories_deleted == 0
    restarted = aioredis.Redis.from_url(throwaway_redis.url)
    try:
        await _assert_only_tombstones(restarted, f"{{{tenant.org_id}}}:*")
        assert await _keys(restarted, f"{{{tenant.org_id}}}:*")  # the tombstones were written
    finally:
        await restarted.aclose()


async def test_a_directive_set_right_after_a_purge_is_injected_on_the_next_call(
    memories: Stub, assembly: context_pb2_grpc.ContextAssemblyServiceStub, tenant: Tenant
) -> None:
    await memories.SetDirective(
        pb.SetDirectiveRequest(org_id=tenant.org_id, agent_id=tenant.agent_id, content="Old directive.")
    )
    first = await assembly.AssembleContext(request(tenant.org_id, tenant.agent_id, user("hello")))
    assert first.metadata.directive_injected  # cached in Redis
    await memories.PurgeOrg(pb.PurgeOrgRequest(org_id=tenant.org_id))

    await memories.SetDirective(
        pb.SetDirectiveRequest(org_id=tenant.org_id, agent_id=tenant.agent_id, content="New directive.")
    )

    for _ in range(2):  # the write-through, then the cache it left
        reply = await assembly.AssembleContext(request(tenant.org_id, tenant.agent_id, user("hello")))
        assert reply.metadata.directive_injected, list(reply.metadata.degradation_reasons)
        assert "New directive." in reply.messages[0].content
        assert "Old directive." not in reply.messages[0].content
