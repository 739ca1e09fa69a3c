"""Session-wide real stores: ONE Redis and ONE PostgreSQL+pgvector per test session.

Both run in a temporary directory on free ports (Redis) / a Unix socket (PostgreSQL)
and are stopped at the end of the session. Tests do not truncate tables: each test
uses fresh random tenants (``org_id``, ``agent_id``, ``new_tenant``), so tests never
see each other's rows.

Fault tests: ``throwaway_redis`` is a private Redis per test that may be stopped and
restarted at will (``.stop()`` / ``.start()`` on the same port). Stopping the shared
``redis_server`` is possible too but must be undone before the test ends.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from ibex_context.devtools.embedded import PostgresProcess, RedisProcess, start_postgres, start_redis
from ibex_context.devtools.redis_ha import (
    RedisClusterProcesses,
    RedisSentinelSet,
    redis_cluster,
    redis_sentinel_set,
)
from ibex_context.devtools.replica import PostgresReplica, start_replica
from ibex_context.memory_api.writes import STORED_ENCODINGS
from ibex_context.server.heap import freeze_startup_heap
from ibex_context.stores.postgres.migrate import migrate
from ibex_context.tokens.encodings import EncodingRegistry

TEST_EMBEDDING_DIM = 384

# Services started inside the test process must not gc.freeze() it: that would pin
# the whole session's garbage. Servers run as subprocesses inherit this too; the
# freeze has its own test (tests/server/test_heap.py), which sets it back.
os.environ["IBEX_GC_FREEZE"] = "false"


@pytest.fixture(autouse=True, scope="module")
def _frozen_heap() -> None:
    """Each test module starts with the session's heap so far collected and frozen.

    Services started in this process answer within 45 ms, and a full collection of
    a test session's heap (kopf, locust, tiktoken and hundreds of tests' objects)
    takes 100-900 ms here: one landing inside a call fails a deadline assertion at
    random. Freezing after a collection pins only live objects and keeps later
    collections to what the module itself allocates, as the service does with its
    start-up heap.
    """
    freeze_startup_heap()


@pytest.fixture(scope="session")
def encodings() -> EncodingRegistry:
    """One preloaded registry for every service started in this process.

    A registry built per service costs ~0.7 s to load and, once the service is
    garbage, ~0.2 s of one garbage collection to free: a pause that lands inside
    whatever test runs next.
    """
    registry = EncodingRegistry()
    registry.preload(STORED_ENCODINGS)
    return registry


@dataclass(frozen=True, slots=True)
class Tenant:
    org_id: str
    agent_id: str


@pytest.fixture(scope="session")
def stores_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stores")


@pytest.fixture(scope="session")
def redis_server(stores_dir: Path) -> Iterator[RedisProcess]:
    """The session's Redis. A test that stops it must ``start()`` it again before returning."""
    server = start_redis(stores_dir / "redis")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisProcess) -> str:
    if not redis_server.running:
        redis_server.start()
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster_nodes(stores_dir: Path) -> Iterator[RedisClusterProcesses]:
    """A three-primary Redis Cluster of the session, started when first asked for. Tests
    may migrate slots (the map is theirs to read) but leave every node running."""
    with redis_cluster(stores_dir / "redis-cluster", primaries=3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def redis_sentinels(stores_dir: Path) -> Iterator[RedisSentinelSet]:
    """A Sentinel set of the session (primary, replica, three sentinels), started when
    first asked for. A test that fails over starts a set of its own."""
    with redis_sentinel_set(stores_dir / "redis-sentinel") as sentinels:
        yield sentinels


@pytest.fixture(scope="session")
def postgres_server(stores_dir: Path) -> Iterator[PostgresProcess]:
    server = start_postgres(stores_dir, remove_on_stop=True)
    yield server
    server.stop()


@pytest.fixture(scope="session")
async def postgres_dsn(postgres_server: PostgresProcess) -> AsyncIterator[str]:
    """DSN of the session's PostgreSQL, migrated with ``TEST_EMBEDDING_DIM`` (384)."""
    await migrate(postgres_server.dsn, TEST_EMBEDDING_DIM)
    yield postgres_server.dsn


@pytest.fixture(scope="session")
async def postgres_replica(
    postgres_server: PostgresProcess, postgres_dsn: str
) -> AsyncIterator[PostgresReplica]:
    """A streaming hot standby of the session's PostgreSQL (made after its migration).

    A test that stops it (``.stop()``) or pauses its replay (``pg_wal_replay_pause()``)
    must undo that before it returns."""
    replica = await asyncio.to_thread(start_replica, postgres_server)
    yield replica
    await asyncio.to_thread(replica.remove)


@pytest.fixture
async def empty_database_dsn(postgres_dsn: str) -> AsyncIterator[str]:
    """A new, unmigrated database of this test alone in the session's PostgreSQL;
    dropped afterwards."""
    admin = await asyncpg.connect(postgres_dsn)
    database = f"private_{uuid.uuid4().hex}"
    try:
        await admin.execute(f'CREATE DATABASE "{database}"')
        yield postgres_dsn.replace("/postgres?", f"/{database}?")
        await admin.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def private_postgres_dsn(empty_database_dsn: str) -> str:
    """A migrated database of this test alone: for tests that lock tables, which must
    not wait on (or block) any other test's session."""
    await migrate(empty_database_dsn, TEST_EMBEDDING_DIM)
    return empty_database_dsn


@pytest.fixture
def throwaway_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    """A Redis of this test only: stop and restart it freely (fault tests)."""
    server = start_redis(tmp_path / "redis")
    yield server
    server.stop()


@pytest.fixture
def org_id() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def agent_id() -> str:
    return str(uuid.uuid4())


@pytest.fixture
def tenant(org_id: str, agent_id: str) -> Tenant:
    return Tenant(org_id=org_id, agent_id=agent_id)


@pytest.fixture
def new_tenant() -> Callable[[], Tenant]:
    """Makes further fresh tenants: ``new_tenant()`` -> Tenant(org_id, agent_id)."""
    return lambda: Tenant(org_id=str(uuid.uuid4()), agent_id=str(uuid.uuid4()))
