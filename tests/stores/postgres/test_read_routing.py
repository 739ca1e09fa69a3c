"""Searches on a real streaming replica (started by the tests), writes on the primary,
and read-your-writes: a memory written is found by the next search whatever the
replica's lag."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import asyncpg
import pytest
from ibex_context.devtools.embedded import RedisProcess
from ibex_context.devtools.replica import PostgresReplica
from ibex_context.stores.postgres import PostgresMemoryStore, create_pool
from ibex_context.stores.postgres.read_routing import (
    BEHIND_WRITE,
    MARK_UNKNOWN,
    NO_REPLICA,
    REPLICA,
    REPLICA_FAILED,
    ReadRouting,
    parse_lsn,
)
from ibex_context.stores.redis.cache import RedisContextCache, create_redis_client
from ibex_context.stores.redis.wire import PipelinedRedis
from ibex_context.stores.redis.write_marks import WriteMarks, write_mark_key
from ibex_context.stores.repository import ContextRepository

from tests.conftest import Tenant
from tests.stores.helpers import EF_SEARCH, MakeMemory, records

# Bounded waits for replication, which needs no more than milliseconds here.
CATCH_UP_SECONDS = 20.0


@dataclass
class Routes:
    seen: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, target: str, reason: str) -> None:
        self.seen.append((target, reason))

    @property
    def last(self) -> tuple[str, str]:
        return self.seen[-1]


def marks_on(redis_url: str, ttl_seconds: float = 30.0) -> WriteMarks:
    return WriteMarks(
        create_redis_client(redis_url, max_connections=2),
        PipelinedRedis.from_url(redis_url),
        ttl_seconds=ttl_seconds,
    )


def routing_of(
    store: PostgresMemoryStore,
    primary_dsn: str,
    replica_dsn: str,
    marks: WriteMarks,
    routes: Routes,
    *,
    max_lag_seconds: float = 30.0,
) -> ReadRouting:
    return ReadRouting(
        store.pool,
        primary_dsn,
        [replica_dsn],
        marks,
        functools.partial(store.open_read_pool, min_size=1, max_size=2),
        poll_seconds=0.05,
        max_lag_seconds=max_lag_seconds,
        record_route=routes,
    )


async def caught_up(routing: ReadRouting, primary: asyncpg.Pool) -> None:
    """Polls until the replica has replayed everything the primary has written so far."""
    target = parse_lsn(await primary.fetchval("SELECT pg_current_wal_insert_lsn()::text"))
    async with asyncio.timeout(CATCH_UP_SECONDS):
        while True:
            await routing.poll()
            (status,) = routing.statuses()
            if status.up and status.replayed_lsn >= target:
                return
            await asyncio.sleep(0.02)


@pytest.fixture
async def routes() -> Routes:
    return Routes()


@pytest.fixture
async def routed(
    pg_store: PostgresMemoryStore,
    postgres_dsn: str,
    postgres_replica: PostgresReplica,
    redis_cache: RedisContextCache,
    redis_url: str,
    routes: Routes,
) -> AsyncIterator[tuple[ContextRepository, ReadRouting]]:
    """The session's store behind a repository whose searches are routed to the replica."""
    routing = routing_of(pg_store, postgres_dsn, postgres_replica.dsn, marks_on(redis_url), routes)
    repository = ContextRepository(pg_store, redis_cache, read_routing=routing)
    await caught_up(routing, pg_store.pool)
    yield repository, routing
    await repository.aclose()
    await routing.aclose()


@pytest.fixture
async def paused_replica(postgres_replica: PostgresReplica) -> AsyncIterator[PostgresReplica]:
    """The replica with its replay paused (it still receives WAL); resumed afterwards."""
    conn = await asyncpg.connect(postgres_replica.dsn)
    try:
        await conn.execute("SELECT pg_wal_replay_pause()")
        yield postgres_replica
    finally:
        await conn.execute("SELECT pg_wal_replay_resume()")
        await conn.close()


def test_lsn_text_reads_as_its_64_bit_position() -> None:
    assert parse_lsn("0/0") == 0
    assert parse_lsn("0/3018AD0") == 0x3018AD0
    assert parse_lsn("16/B374D848") == (0x16 << 32) | 0xB374D848


def test_a_mark_outlives_the_lag_a_replica_may_take_reads_at() -> None:
    assert ReadRouting.mark_ttl_seconds(5.0, 0.2) > 5.0 + 2 * 0.2


async def test_a_write_mark_keeps_the_larger_position_and_is_keyed_by_the_org(
    redis_url: str, tenant: Tenant
) -> None:
    marks = marks_on(redis_url)
    other = marks_on(redis_url)  # another process: sees the mark only through Redis
    try:
        assert await other.get(tenant.org_id, tenant.agent_id) == 0
        await marks.put(tenant.org_id, tenant.agent_id, 200)
        await marks.put(tenant.org_id, tenant.agent_id, 100)  # a slower writer finishing late
        assert await other.get(tenant.org_id, tenant.agent_id) == 200
        assert await other.get(tenant.org_id, str(uuid.uuid4())) == 0
        assert write_mark_key(tenant.org_id, tenant.agent_id).startswith(f"{{{tenant.org_id}}}:")
    finally:
        await marks.aclose()
        await other.aclose()


async def test_searches_read_from_the_replica_once_it_holds_the_agents_writes(
    routed: tuple[ContextRepository, ReadRouting], routes: Routes, tenant: Tenant, make_memory: MakeMemory
) -> None:
    repository, routing = routed
    memory = make_memory("Caroline adopted a greyhound called Biscuit")
    await repository.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    await caught_up(routing, repository._postgres.pool)

    found = await repository.search_lexical(tenant.org_id, tenant.agent_id, "greyhound Biscuit", 5)
    assert [r.id for r in records(found)] == [memory.id]
    assert routes.last == ("replica", REPLICA)
    found = await repository.search(tenant.org_id, tenant.agent_id, memory.embedding, 5)
    assert [r.id for r in records(found)] == [memory.id]
    assert routes.last == ("replica", REPLICA)


async def test_a_memory_written_is_found_by_the_next_search_while_the_replica_is_behind(
    routed: tuple[ContextRepository, ReadRouting],
    paused_replica: PostgresReplica,
    routes: Routes,
    tenant: Tenant,
    new_tenant: Callable[[], Tenant],
    make_memory: MakeMemory,
) -> None:
    repository, routing = routed
    bystander = new_tenant()
    await routing.poll()
    memory = make_memory("Melanie signed up for a pottery class on Thursdays")
    await repository.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    await routing.poll()  # the replica answers, within the lag bound, but has not replayed the write

    found = await repository.search_lexical(tenant.org_id, tenant.agent_id, "pottery class", 5)
    assert [r.id for r in records(found)] == [memory.id]
    assert routes.last == ("primary", BEHIND_WRITE)
    found = await repository.search(tenant.org_id, tenant.agent_id, memory.embedding, 5)
    assert [r.id for r in records(found)] == [memory.id]
    assert routes.last == ("primary", BEHIND_WRITE)
    # The replica really misses the write: only the mark kept the search off it.
    replica = await asyncpg.connect(paused_replica.dsn)
    try:
        assert (
            await replica.fetchval("SELECT count(*) FROM memories WHERE id = $1", uuid.UUID(memory.id)) == 0
        )
    finally:
        await replica.close()
    # An agent that wrote nothing keeps reading from the replica meanwhile.
    await repository.search_lexical(bystander.org_id, bystander.agent_id, "pottery class", 5)
    assert routes.last == ("replica", REPLICA)


async def test_a_memory_deleted_is_gone_from_the_next_search_while_the_replica_is_behind(
    routed: tuple[ContextRepository, ReadRouting],
    postgres_replica: PostgresReplica,
    routes: Routes,
    tenant: Tenant,
    make_memory: MakeMemory,
) -> None:
    repository, routing = routed
    memory = make_memory("Jon opened a dance studio downtown")
    await repository.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    await caught_up(routing, repository._postgres.pool)
    conn = await asyncpg.connect(postgres_replica.dsn)
    try:
        await conn.execute("SELECT pg_wal_replay_pause()")
        await repository.delete_memories(tenant.org_id, tenant.agent_id, [memory.id])
        await routing.poll()
        assert (
            records(await repository.search_lexical(tenant.org_id, tenant.agent_id, "dance studio", 5)) == []
        )
        assert routes.last == ("primary", BEHIND_WRITE)
    finally:
        await conn.execute("SELECT pg_wal_replay_resume()")
        await conn.close()


async def test_a_replica_further_behind_than_the_bound_takes_no_reads(
    pg_store: PostgresMemoryStore,
    postgres_dsn: str,
    paused_replica: PostgresReplica,
    redis_url: str,
    routes: Routes,
    tenant: Tenant,
    make_memory: MakeMemory,
) -> None:
    marks = marks_on(redis_url)
    routing = routing_of(pg_store, postgres_dsn, paused_replica.dsn, marks, routes, max_lag_seconds=0.2)
    try:
        await routing.poll()
        # The primary moves on (any tenant's write) while the replica replays nothing.
        await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [make_memory("the primary moves on")])
        async with asyncio.timeout(CATCH_UP_SECONDS):
            while True:
                await routing.poll()
                if not routing.statuses()[0].up:
                    break
                await asyncio.sleep(0.05)
        (status,) = routing.statuses()
        assert status.lag_seconds > 0.2
        assert status.lag_bytes > 0
        pool, replica = await routing.pool_for(str(uuid.uuid4()), str(uuid.uuid4()))
        assert (pool, replica) == (pg_store.pool, None)
        assert routes.last == ("primary", NO_REPLICA)
        assert not (await routing.check_health()).ok
    finally:
        await routing.aclose()


async def test_a_stopped_replica_sends_the_searches_to_the_primary(
    routed: tuple[ContextRepository, ReadRouting],
    postgres_replica: PostgresReplica,
    routes: Routes,
    tenant: Tenant,
    make_memory: MakeMemory,
) -> None:
    repository, routing = routed
    memory = make_memory("Gina lost her job at the bakery")
    await repository.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    await caught_up(routing, repository._postgres.pool)
    await asyncio.to_thread(postgres_replica.stop)
    try:
        # Before any poll notices: the search fails on the replica and is repeated on the primary.
        found = await repository.search_lexical(tenant.org_id, tenant.agent_id, "bakery job", 5)
        assert [r.id for r in records(found)] == [memory.id]
        assert routes.last == ("primary", REPLICA_FAILED)
        await routing.poll()
        assert not routing.statuses()[0].up
        found = await repository.search(tenant.org_id, tenant.agent_id, memory.embedding, 5)
        assert [r.id for r in records(found)] == [memory.id]
        assert routes.last == ("primary", NO_REPLICA)
    finally:
        await asyncio.to_thread(postgres_replica.start)
    await caught_up(routing, repository._postgres.pool)
    await repository.search_lexical(tenant.org_id, tenant.agent_id, "bakery job", 5)
    assert routes.last == ("replica", REPLICA)


async def test_an_unreadable_write_mark_sends_the_searches_to_the_primary(
    pg_store: PostgresMemoryStore,
    postgres_dsn: str,
    postgres_replica: PostgresReplica,
    throwaway_redis: RedisProcess,
    routes: Routes,
) -> None:
    routing = routing_of(pg_store, postgres_dsn, postgres_replica.dsn, marks_on(throwaway_redis.url), routes)
    try:
        await caught_up(routing, pg_store.pool)
        throwaway_redis.stop()
        pool, replica = await routing.pool_for(str(uuid.uuid4()), str(uuid.uuid4()))
        assert (pool, replica) == (pg_store.pool, None)
        assert routes.last == ("primary", MARK_UNKNOWN)
    finally:
        await routing.aclose()


async def _table_scans(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        scans: int = await conn.fetchval(
            "SELECT coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)), 0)::int"
            " FROM pg_stat_user_tables"
        )
        return scans
    finally:
        await conn.close()


async def _no_backends_on(dsn: str, database: str) -> None:
    """Waits until no session is left on ``database`` (a backend's statistics are
    flushed when it exits)."""
    conn = await asyncpg.connect(dsn)
    try:
        async with asyncio.timeout(CATCH_UP_SECONDS):  # polled: no event tells a backend's exit
            while True:
                left = await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                    database,
                )
                if not left:
                    return
                await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def test_the_searches_load_moves_to_the_replica(
    private_postgres_dsn: str,
    postgres_replica: PostgresReplica,
    redis_url: str,
    routes: Routes,
    tenant: Tenant,
    make_memory: MakeMemory,
) -> None:
    """Counted by the table scans each server records for a database of this test
    alone; a backend's counts are complete once it has exited, so every phase closes
    its pool and waits for that."""
    database = urlsplit(private_postgres_dsn).path.lstrip("/")
    replica_dsn = postgres_replica.dsn.replace("/postgres?", f"/{database}?")
    searches = 20
    memories = [
        make_memory(f"note {n} about the garden" + (" and the roses" if n % 5 == 0 else ""))
        for n in range(30)
    ]

    async def phase(work: Callable[[PostgresMemoryStore], Awaitable[None]]) -> tuple[int, int]:
        pool = await create_pool(private_postgres_dsn, min_size=1, max_size=2, ef_search=EF_SEARCH)
        store = PostgresMemoryStore(pool, ef_search=EF_SEARCH)
        try:
            await work(store)
        finally:
            await store.aclose()
        await _no_backends_on(private_postgres_dsn, database)
        await _no_backends_on(postgres_replica.dsn, database)
        return await _table_scans(private_postgres_dsn), await _table_scans(replica_dsn)

    async def write(store: PostgresMemoryStore) -> None:
        await store.upsert_memories(tenant.org_id, tenant.agent_id, memories)
        routing = routing_of(store, private_postgres_dsn, replica_dsn, marks_on(redis_url), routes)
        try:
            await caught_up(routing, store.pool)
        finally:
            await routing.aclose()

    async def on_the_primary(store: PostgresMemoryStore) -> None:
        for _ in range(searches):
            assert records(await store.search_lexical(tenant.org_id, tenant.agent_id, "roses", 10))

    async def routed(store: PostgresMemoryStore) -> None:
        routing = routing_of(store, private_postgres_dsn, replica_dsn, marks_on(redis_url), routes)
        try:
            await caught_up(routing, store.pool)
            for _ in range(searches):
                pool, replica = await routing.pool_for(tenant.org_id, tenant.agent_id)
                assert replica is not None
                assert records(
                    await store.search_lexical(tenant.org_id, tenant.agent_id, "roses", 10, on=pool)
                )
                assert records(
                    await store.search(tenant.org_id, tenant.agent_id, memories[0].embedding, 10, on=pool)
                )
        finally:
            await routing.aclose()

    primary_0, replica_0 = await phase(write)
    primary_1, replica_1 = await phase(on_the_primary)
    primary_2, replica_2 = await phase(routed)
    searches_cost = primary_1 - primary_0  # the lexical searches' scans, measured on the primary
    assert searches_cost >= searches
    assert replica_1 == replica_0
    assert replica_2 - replica_1 >= searches_cost
    assert primary_2 - primary_1 <= searches_cost // 10, (primary_2 - primary_1, searches_cost)
