"""The tests' streaming replica: a hot standby that replays the primary's writes and
can be stopped and started again."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
from ibex_context.devtools.embedded import PostgresProcess
from ibex_context.devtools.replica import PostgresReplica


async def _replayed(replica: PostgresReplica, table: str) -> int:
    conn = await asyncpg.connect(replica.dsn)
    try:
        async with asyncio.timeout(20):  # polled: the standby signals nothing
            while True:
                if await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table):
                    break
                await asyncio.sleep(0.02)
        count: int = await conn.fetchval(f'SELECT count(*) FROM "{table}"')
        return count
    finally:
        await conn.close()


async def test_the_replica_is_a_read_only_standby_replaying_the_primarys_writes(
    postgres_server: PostgresProcess, postgres_replica: PostgresReplica
) -> None:
    table = f"replica_probe_{uuid.uuid4().hex}"
    primary = await asyncpg.connect(postgres_server.dsn)
    try:
        await primary.execute(f'CREATE TABLE "{table}" AS SELECT generate_series(1, 3) AS n')
        assert await _replayed(postgres_replica, table) == 3
        standby = await asyncpg.connect(postgres_replica.dsn)
        try:
            assert await standby.fetchval("SELECT pg_is_in_recovery()")
            assert await standby.fetchval("SELECT pg_last_wal_replay_lsn() IS NOT NULL")
        finally:
            await standby.close()
    finally:
        await primary.execute(f'DROP TABLE "{table}"')
        await primary.close()


async def test_a_stopped_replica_refuses_connections_and_catches_up_when_started(
    postgres_server: PostgresProcess, postgres_replica: PostgresReplica
) -> None:
    table = f"replica_probe_{uuid.uuid4().hex}"
    await asyncio.to_thread(postgres_replica.stop)
    primary = await asyncpg.connect(postgres_server.dsn)
    try:
        try:
            refused = False
            try:
                await asyncpg.connect(postgres_replica.dsn, timeout=5)
            except (OSError, asyncpg.PostgresError):
                refused = True
            assert refused
            await primary.execute(f'CREATE TABLE "{table}" AS SELECT 1 AS n')  # written while it is down
        finally:
            await asyncio.to_thread(postgres_replica.start)
        assert postgres_replica.running
        assert await _replayed(postgres_replica, table) == 1
    finally:
        await primary.execute(f'DROP TABLE "{table}"')
        await primary.close()
