"""The hot set's read (``stores.postgres.reads``) on the real PostgreSQL."""

from __future__ import annotations

import time

from ibex_context.stores.hot_score import hot_set_score
from ibex_context.stores.postgres import (
    PostgresMemoryStore,
)

from tests.conftest import Tenant
from tests.stores.helpers import MakeMemory


async def test_top_memories_for_the_hot_set_follow_the_write_time_score(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    batch = [
        make_memory(f"scored {i}", category=cat, confidence=c, usefulness=u)
        for i, (cat, c, u) in enumerate(
            [("factual", 0.9, 0.9), ("episodic", 0.2, 0.1), ("preference", 0.5, 0.5), ("factual", 0.7, 0.2)]
        )
    ]
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, batch)
    top = await pg_store.top_memories_for_hot_set(tenant.org_id, tenant.agent_id, 3)
    assert len(top) == 3 and all(m.embedding is not None and m.embedding.shape == (384,) for m in top)
    now = time.time()
    stored = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [m.id for m in batch])
    expected = sorted(stored, key=lambda m: -hot_set_score(m, now))[:3]
    assert [m.id for m in top] == [m.id for m in expected]
