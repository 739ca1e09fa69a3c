"""The work after the response (``pipeline/post_response.py``): injections are counted in
PostgreSQL in batches, off the request path; a full queue drops and counts instead of
making a call wait; a failed batch is counted, never raised; shutdown flushes what is
queued."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from ibex_context.pipeline.post_response import InjectionQueue, QueueHooks
from ibex_context.stores.base import InjectionRecord
from ibex_context.stores.postgres import PostgresMemoryStore, create_pool
from ibex_context.stores.postgres.tenant_data import TenantData

from tests.conftest import Tenant
from tests.stores.helpers import EF_SEARCH, MakeMemory


class BatchesSeen(PostgresMemoryStore):
    """The real store, remembering the size of each batch it was asked to record."""

    def __init__(self, store: PostgresMemoryStore) -> None:
        super().__init__(store.pool, ef_search=EF_SEARCH)
        self.batches: list[int] = []

    async def record_injections(self, injections: Sequence[InjectionRecord]) -> None:
        self.batches.append(len(injections))
        await super().record_injections(injections)


class Counts:
    def __init__(self) -> None:
        self.dropped = 0
        self.failed = 0
        self.depths: list[int] = []

    def hooks(self) -> QueueHooks:
        return QueueHooks(depth=self.depths.append, dropped=self._drop, failed=self._fail)

    def _drop(self, n: int) -> None:
        self.dropped += n

    def _fail(self, n: int) -> None:
        self.failed += n


async def _counts(pg_store: PostgresMemoryStore, tenant: Tenant, ids: list[str]) -> list[int]:
    rows = await TenantData(pg_store.pool).get_memories(tenant.org_id, tenant.agent_id, ids)
    return [r.retrieval_count for r in rows]


async def _stored(
    pg_store: PostgresMemoryStore, make_memory: MakeMemory, tenant: Tenant, n: int
) -> list[str]:
    memories = [make_memory(f"post-response fact {i}") for i in range(n)]
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, memories)
    return [m.id for m in memories]


async def test_injections_are_counted_in_batches_after_the_response(
    pg_store: PostgresMemoryStore, make_memory: MakeMemory, tenant: Tenant
) -> None:
    ids = await _stored(pg_store, make_memory, tenant, 5)
    recorder = BatchesSeen(pg_store)
    queue = InjectionQueue(recorder, max_size=100, batch_size=4, flush_interval=0.05)
    queue.start()
    try:
        queue.submit(tenant.org_id, tenant.agent_id, ids)
        queue.submit(tenant.org_id, tenant.agent_id, ids[:1])
        for _ in range(200):
            if sum(recorder.batches) == 6:
                break
            await asyncio.sleep(0.01)
    finally:
        await queue.drain(timeout=5.0)

    assert sum(recorder.batches) == 6 and max(recorder.batches) <= 4
    assert await _counts(pg_store, tenant, ids) == [2, 1, 1, 1, 1]


async def test_a_full_queue_drops_and_counts_without_waiting(
    pg_store: PostgresMemoryStore, make_memory: MakeMemory, tenant: Tenant
) -> None:
    ids = await _stored(pg_store, make_memory, tenant, 5)
    counts = Counts()
    queue = InjectionQueue(pg_store, max_size=3, batch_size=10, flush_interval=0.05, hooks=counts.hooks())

    queue.submit(tenant.org_id, tenant.agent_id, ids)  # not started: nothing drains it

    assert (counts.dropped, queue.depth, counts.depths[-1]) == (2, 3, 3)
    await queue.drain(timeout=5.0)
    assert await _counts(pg_store, tenant, ids) == [1, 1, 1, 0, 0]


async def test_a_failed_batch_is_counted_and_logged_not_raised(
    postgres_dsn: str, tenant: Tenant, caplog: pytest.LogCaptureFixture
) -> None:
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=EF_SEARCH)
    await pool.close()  # every statement now fails
    counts = Counts()
    queue = InjectionQueue(
        PostgresMemoryStore(pool, ef_search=EF_SEARCH),
        max_size=10,
        batch_size=10,
        flush_interval=0.01,
        hooks=counts.hooks(),
    )
    queue.start()
    try:
        queue.submit(tenant.org_id, tenant.agent_id, ["6f1c2a54-0000-4000-8000-000000000001"] * 2)
        for _ in range(200):
            if counts.failed:
                break
            await asyncio.sleep(0.01)
        assert counts.failed == 2
        assert "recording 2 injections failed" in caplog.text
        queue.submit(tenant.org_id, tenant.agent_id, ["6f1c2a54-0000-4000-8000-000000000002"])
        for _ in range(200):
            if counts.failed == 3:
                break
            await asyncio.sleep(0.01)
        assert counts.failed == 3  # the queue kept running
    finally:
        await queue.drain(timeout=1.0)


class SlowRecorder(BatchesSeen):
    """The real store, each batch held up until ``release`` is set."""

    def __init__(self, store: PostgresMemoryStore) -> None:
        super().__init__(store)
        self.writing = asyncio.Event()
        self.release = asyncio.Event()

    async def record_injections(self, injections: Sequence[InjectionRecord]) -> None:
        self.writing.set()
        await asyncio.wait_for(self.release.wait(), 5.0)
        await super().record_injections(injections)


async def test_shutdown_waits_for_the_batch_being_written_instead_of_losing_it(
    pg_store: PostgresMemoryStore, make_memory: MakeMemory, tenant: Tenant
) -> None:
    ids = await _stored(pg_store, make_memory, tenant, 3)
    recorder = SlowRecorder(pg_store)
    queue = InjectionQueue(recorder, max_size=100, batch_size=10, flush_interval=0.01)
    queue.start()
    queue.submit(tenant.org_id, tenant.agent_id, ids)
    await asyncio.wait_for(recorder.writing.wait(), 5.0)  # the batch left the queue

    drained = asyncio.ensure_future(queue.drain(timeout=5.0))
    await asyncio.sleep(0.05)
    recorder.release.set()
    await asyncio.wait_for(drained, 10.0)

    assert await _counts(pg_store, tenant, ids) == [1, 1, 1]
