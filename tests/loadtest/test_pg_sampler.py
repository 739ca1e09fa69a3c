"""The load test's pg_stat_activity sampler names its own backend, so a run can leave that
backend's CPU out of the stores' figure (it is the load test's work, not the service's)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import asyncpg

from loadtest.datastores import PgActivitySampler


def _within(seconds: float, condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


async def test_the_sampler_reports_its_own_backend_and_that_backends_cpu(postgres_dsn: str) -> None:
    sampler = PgActivitySampler(postgres_dsn, interval=0.001)
    sampler.start()
    try:
        # The sampler counts in its own thread: wait for it there, bounded.
        assert await asyncio.to_thread(_within, 30.0, lambda: sampler.samples >= 200)
        conn = await asyncpg.connect(postgres_dsn)
        try:
            query = await conn.fetchval(
                "SELECT query FROM pg_stat_activity WHERE pid = $1", sampler.backend_pid
            )
        finally:
            await conn.close()
        assert query is not None and "FROM pg_stat_activity" in query
        # 200 queries and a connection's start cost the backend more than nothing.
        assert sampler.backend_cpu_seconds() > 0.0
    finally:
        await asyncio.to_thread(sampler.stop)
