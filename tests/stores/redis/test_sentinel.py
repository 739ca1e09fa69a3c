"""The cache behind a real Redis Sentinel set (a primary, a replica, three sentinels):
both clients find the primary through the sentinels, and follow a failover."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from ibex_context.devtools.redis_ha import SENTINEL_MASTER, RedisSentinelSet, redis_sentinel_set
from ibex_context.errors import CacheError
from ibex_context.models import MemoryRecord
from ibex_context.settings import Settings
from ibex_context.stores.base import DirectiveState
from ibex_context.stores.postgres import PostgresMemoryStore
from ibex_context.stores.redis.cache import RedisContextCache, directive_key, hot_data_key
from ibex_context.stores.redis.sentinel import SentinelLocator
from ibex_context.stores.redis.topology import RedisTopology
from ibex_context.stores.redis.wire import PipelinedRedis, RedisEndpoint
from ibex_context.stores.repository import ContextRepository
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from tests.stores.helpers import records, unit_vector

# Every wait below ends by this, however loaded the machine; none is a timing assertion.
PATIENCE_SECONDS = 60.0


def record(n: int) -> MemoryRecord:
    return MemoryRecord(
        id=str(uuid.UUID(int=n)), content=f"memory {n}", category="factual", embedding=unit_vector(n)
    )


def sentinel_settings(sentinels: RedisSentinelSet, master: str = SENTINEL_MASTER) -> Settings:
    # The URL's host is a port nothing listens on: only its scheme and db are used.
    return Settings(
        redis_url="redis://127.0.0.1:1/0", redis_sentinels=sentinels.sentinels, redis_sentinel_master=master
    )


@pytest.fixture
async def sentinel_cache(redis_sentinels: RedisSentinelSet) -> AsyncIterator[RedisContextCache]:
    cache = RedisContextCache.from_settings(sentinel_settings(redis_sentinels))
    await cache.warm_up()
    yield cache
    await cache.aclose()


async def test_the_cache_works_end_to_end_on_the_primary_the_sentinels_name(
    sentinel_cache: RedisContextCache, redis_sentinels: RedisSentinelSet
) -> None:
    org, agent = str(uuid.uuid4()), str(uuid.uuid4())
    assert await sentinel_cache.put_directive(org, agent, DirectiveState("be brief", 1, {"o200k_base": 2}))
    assert await sentinel_cache.replace_hot_set(org, agent, [(record(1), 0.9)], expected_generation=0)

    assert await sentinel_cache.get_directive_state(org, agent) == DirectiveState(
        "be brief", 1, {"o200k_base": 2}
    )
    assert [r.id for r in records(await sentinel_cache.get_hot_memories(org, agent, 5))] == [record(1).id]
    async with aioredis.Redis(port=redis_sentinels.primary_port()) as primary:
        assert await primary.exists(directive_key(org, agent), hot_data_key(org, agent)) == 2


async def test_credentials_reach_the_data_nodes_and_the_sentinels_password_the_sentinels(
    tmp_path: Path,
) -> None:
    """Passwords everywhere, as production runs it: the URL's for the primary (both
    clients), IBEX_REDIS_SENTINEL_PASSWORD for the sentinels (both clients)."""
    passwords = {"password": "data-pw", "sentinel_password": "sentinel-pw"}
    with redis_sentinel_set(tmp_path / "auth", **passwords) as sentinels:
        settings = Settings(
            redis_url="redis://:data-pw@127.0.0.1:1/0",
            redis_sentinels=sentinels.sentinels,
            redis_sentinel_master=SENTINEL_MASTER,
            redis_sentinel_password="sentinel-pw",
        )
        cache = RedisContextCache.from_settings(settings)
        try:
            await cache.warm_up()
            org, agent = str(uuid.uuid4()), str(uuid.uuid4())
            assert await cache.put_directive(org, agent, DirectiveState("be brief", 1, {}))
            assert await cache.get_directive_state(org, agent) == DirectiveState("be brief", 1, {})
        finally:
            await cache.aclose()

        wrong = RedisTopology.from_settings(settings.model_copy(update={"redis_sentinel_password": "nope"}))
        reads = wrong.create_reads()
        try:
            with pytest.raises(RedisConnectionError, match="no sentinel named the primary"):
                await reads.get("{o}:directive:a")
        finally:
            await reads.aclose()


async def test_a_master_name_no_sentinel_knows_fails_reads_as_a_connection_error(
    redis_sentinels: RedisSentinelSet,
) -> None:
    """A RedisError: the repository serves the call from PostgreSQL instead."""
    reads = RedisTopology.from_settings(sentinel_settings(redis_sentinels, master="nobody")).create_reads()
    try:
        with pytest.raises(RedisConnectionError, match="no sentinel named the primary"):
            await reads.get("{o}:directive:a")
    finally:
        await reads.aclose()


async def test_sentinels_that_refuse_or_hang_are_passed_over(redis_sentinels: RedisSentinelSet) -> None:
    """One refuses connections, one accepts and never answers (bounded by the ask timeout):
    the read still finds the primary through the one that answers."""
    with socket.socket() as refusing, socket.socket() as hanging:
        refusing.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        hanging.bind(("127.0.0.1", 0))
        hanging.listen()  # accepted by the kernel, never read
        sentinels = [
            ("127.0.0.1", refusing.getsockname()[1]),
            ("127.0.0.1", hanging.getsockname()[1]),
            ("127.0.0.1", int(redis_sentinels.sentinels[0].rpartition(":")[2])),
        ]
        endpoint = RedisEndpoint.from_url("redis://127.0.0.1:1/0")
        # Bounds generous enough for a loaded machine: the hanging one costs ask_timeout.
        locate = SentinelLocator(
            sentinels, SENTINEL_MASTER, primary_endpoint=endpoint, sentinel_endpoint=endpoint, ask_timeout=5.0
        )
        reads = PipelinedRedis(endpoint, locate=locate, connect_timeout=PATIENCE_SECONDS)
        try:
            key = directive_key(str(uuid.uuid4()), "a")
            async with aioredis.Redis(port=redis_sentinels.primary_port()) as primary:
                await primary.set(key, "1|-")
            assert await asyncio.wait_for(reads.get(key), PATIENCE_SECONDS) == b"1|-"
        finally:
            await reads.aclose()


async def calls_until(
    repository: ContextRepository, cache: RedisContextCache, org: str, agent: str, done: asyncio.Future[int]
) -> int:
    """Until ``done``: the repository's directive read (what every AssembleContext call
    makes) answers the directive each time, from Redis or PostgreSQL; and the cache's own
    writes and reads (of another agent) answer or raise a CacheError of a RedisError (what
    the repository turns into a degraded call), never anything else, never past a bound.
    Returns how many cache calls raised."""
    scratch = str(uuid.uuid4())
    failed, version = 0, 10
    while not done.done():
        directive = await asyncio.wait_for(repository.get_directive(org, agent), PATIENCE_SECONDS)
        assert directive is not None and directive.content == "before"
        version += 1
        for call in (
            cache.put_directive(org, scratch, DirectiveState("during", version, {})),
            cache.get_directive_state(org, scratch),
        ):
            try:
                await asyncio.wait_for(call, PATIENCE_SECONDS)
            except CacheError as exc:
                assert isinstance(exc.__cause__, RedisError)
                failed += 1
        await asyncio.sleep(0.05)
    return failed


async def eventually(check: object, what: str) -> None:
    deadline = time.monotonic() + PATIENCE_SECONDS
    while time.monotonic() < deadline:
        try:
            if await check():  # type: ignore[operator]
                return
        except CacheError:
            pass
        await asyncio.sleep(0.1)
    pytest.fail(f"{what} within {PATIENCE_SECONDS} s")


async def test_after_a_failover_reads_and_writes_go_to_the_new_primary(
    tmp_path: Path, pg_store: PostgresMemoryStore
) -> None:
    with redis_sentinel_set(tmp_path / "sentinel") as sentinels:
        cache = RedisContextCache.from_settings(sentinel_settings(sentinels))
        repository = ContextRepository(pg_store, cache, invalidation_retry_seconds=0.05)
        try:
            await cache.warm_up()
            org, agent = str(uuid.uuid4()), str(uuid.uuid4())
            await repository.set_directive(org, agent, "before", {"o200k_base": 1})
            # Above the cached one's (directive versions are the write's clock time, migration 0017).
            after_version = (await pg_store.get_directive_state(org, agent)).version + 1000
            old_port = sentinels.primary_port()

            failover = asyncio.ensure_future(asyncio.to_thread(sentinels.failover, PATIENCE_SECONDS))
            await calls_until(repository, cache, org, agent, failover)
            new_port = await failover
            assert new_port != old_port

            # The old primary gone for good: whatever answers now is the new one.
            next(server for server in sentinels.servers if server.port == old_port).stop()

            async def written_and_read_back() -> bool:
                await cache.put_directive(org, agent, DirectiveState("after", after_version, {}))
                state = await cache.get_directive_state(org, agent)
                return state is not None and state.content == "after"

            await eventually(written_and_read_back, "the new primary did not take writes and reads")
            async with aioredis.Redis(port=new_port) as primary:
                assert (await primary.get(directive_key(org, agent))).startswith(f"{after_version}|".encode())
        finally:
            await repository.aclose()
            await cache.aclose()
