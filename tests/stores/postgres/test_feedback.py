"""Feedback on memories (``stores.postgres.feedback``) on the real PostgreSQL."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from ibex_context.errors import InvalidRequest
from ibex_context.stores.postgres import (
    FEEDBACK_ALPHA,
    FEEDBACK_TARGETS,
    PostgresMemoryStore,
)
from ibex_context.stores.postgres.feedback import FEEDBACK_LOG_PER_MEMORY

from tests.conftest import Tenant
from tests.stores.helpers import MakeMemory


async def test_feedback_moves_usefulness_by_an_ema_and_is_logged(
    postgres_dsn: str, pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    memory = make_memory("useful fact", usefulness=0.5)
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    updates = await pg_store.record_feedback(
        tenant.org_id,
        tenant.agent_id,
        str(uuid.uuid4()),
        [(memory.id, "positive"), (memory.id, "positive"), (str(uuid.uuid4()), "negative")],
    )
    first = 0.5 + FEEDBACK_ALPHA * (1 - 0.5)
    second = first + FEEDBACK_ALPHA * (1 - first)
    assert [(u.memory_id, u.previous_usefulness) for u in updates] == [
        (memory.id, 0.5),
        (memory.id, pytest.approx(first)),
    ]
    assert updates[1].new_usefulness == pytest.approx(second, abs=1e-6)
    conn = await asyncpg.connect(postgres_dsn)
    try:
        logged = await conn.fetchval(
            "SELECT count(*) FROM memory_feedback WHERE org_id = $1 AND agent_id = $2",
            uuid.UUID(tenant.org_id),
            uuid.UUID(tenant.agent_id),
        )
    finally:
        await conn.close()
    assert logged == 2
    with pytest.raises(InvalidRequest, match=r"feedback\[0\].kind"):
        await pg_store.record_feedback(tenant.org_id, tenant.agent_id, None, [(memory.id, "great")])


async def test_a_batch_compounds_each_memorys_feedback_in_request_order(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    """One statement for the batch: interleaved feedback on several memories moves
    each as the items applied one after another would."""
    low, high = make_memory("low", usefulness=0.1), make_memory("high", usefulness=0.9)
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [low, high])
    kinds = ["positive", "negative", "neutral", "positive", "positive", "negative", "neutral"]
    items = [(low.id if n % 2 == 0 else high.id, kind) for n, kind in enumerate(kinds)]

    updates = await pg_store.record_feedback(tenant.org_id, tenant.agent_id, None, items)

    expected, value = [], {low.id: 0.1, high.id: 0.9}
    for memory_id, kind in items:
        before = value[memory_id]
        value[memory_id] = before + FEEDBACK_ALPHA * (FEEDBACK_TARGETS[kind] - before)
        expected.append((memory_id, before, value[memory_id]))
    assert [(u.memory_id, u.previous_usefulness, u.new_usefulness) for u in updates] == [
        (m, pytest.approx(b, abs=1e-6), pytest.approx(a, abs=1e-6)) for m, b, a in expected
    ]
    stored = {
        r.id: r.usefulness
        for r in await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [low.id, high.id])
    }
    assert stored == {
        low.id: pytest.approx(value[low.id], abs=1e-6),
        high.id: pytest.approx(value[high.id], abs=1e-6),
    }


async def test_the_feedback_log_keeps_each_memorys_newest_rows(
    postgres_dsn: str, pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    """``memory_feedback`` used to grow by a row per item forever (issue 39)."""
    memory, other = make_memory("rated often"), make_memory("rated once")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory, other])
    await pg_store.record_feedback(tenant.org_id, tenant.agent_id, None, [(other.id, "positive")])
    for _ in range(3):
        await pg_store.record_feedback(tenant.org_id, tenant.agent_id, None, [(memory.id, "negative")] * 60)
    conn = await asyncpg.connect(postgres_dsn)
    try:
        logged = dict(
            await conn.fetch(
                "SELECT memory_id::text, count(*) FROM memory_feedback"
                " WHERE org_id = $1 AND agent_id = $2 GROUP BY memory_id",
                uuid.UUID(tenant.org_id),
                uuid.UUID(tenant.agent_id),
            )
        )
    finally:
        await conn.close()
    assert logged == {memory.id: FEEDBACK_LOG_PER_MEMORY, other.id: 1}
