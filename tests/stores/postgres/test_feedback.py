"""Feedback on memories (``stores.postgres.feedback``) on the real PostgreSQL."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from ibex_context.errors import InvalidRequest
from ibex_context.stores.postgres import (
    FEEDBACK_ALPHA,
    PostgresMemoryStore,
)

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
