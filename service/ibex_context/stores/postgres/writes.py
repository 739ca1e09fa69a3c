"""Writes of memories and directives: upsert, delete, set and clear, on the primary.

Writers of one agent are serialised by a transaction-scoped advisory lock
(``lock_agent``), so the upsert's read-decide-write cannot race another writer.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from typing import Any

import asyncpg

from ibex_context.errors import InvalidRequest
from ibex_context.stores.base import DirectiveState, PreparedMemory, UpsertResult
from ibex_context.stores.postgres.codecs import VectorParam, as_uuid
from ibex_context.stores.postgres.pool import store_errors
from ibex_context.stores.postgres.write_slots import WriteSlots
from ibex_context.stores.quotas import OrgQuotas, OrgUsage, check_org_usage
from ibex_context.stores.upsert_plan import StoredMemory, plan_upsert

# The classid of the per-agent advisory lock that serialises writers of one agent.
WRITER_LOCK_CLASS = 0x49424558 & 0x7FFFFFFF

_EXISTING_SQL = """
    SELECT id, content_hash, category, confidence, usefulness, metadata,
           extract(epoch FROM occurred_at)::float8 AS occurred_at,
           octet_length(content) AS content_bytes FROM memories
    WHERE org_id = $1 AND agent_id = $2
      AND (content_hash = ANY($3::bytea[]) OR id = ANY($4::uuid[]))
"""
# $3..$12: ``_columns``' arrays.
_UPDATE_SQL = """
    UPDATE memories AS m SET
        content = u.content, content_hash = u.content_hash, category = u.category,
        confidence = u.confidence, usefulness = u.usefulness, metadata = u.metadata,
        token_counts = u.token_counts, embedding = u.embedding,
        occurred_at = coalesce(to_timestamp(u.occurred_at), m.occurred_at), updated_at = now()
    FROM unnest($3::uuid[], $4::text[], $5::bytea[], $6::text[], $7::real[], $8::real[],
                $9::jsonb[], $10::jsonb[], $11::vector[], $12::float8[])
        AS u(id, content, content_hash, category, confidence, usefulness,
             metadata, token_counts, embedding, occurred_at)
    WHERE m.org_id = $1 AND m.agent_id = $2 AND m.id = u.id
"""
_INSERT_SQL = """
    INSERT INTO memories (org_id, agent_id, id, content, content_hash, category,
                          confidence, usefulness, metadata, token_counts, embedding,
                          occurred_at)
    SELECT $1, $2, u.id, u.content, u.content_hash, u.category, u.confidence,
           u.usefulness, u.metadata, u.token_counts, u.embedding,
           coalesce(to_timestamp(u.occurred_at), now())
    FROM unnest($3::uuid[], $4::text[], $5::bytea[], $6::text[], $7::real[], $8::real[],
                $9::jsonb[], $10::jsonb[], $11::vector[], $12::float8[])
        AS u(id, content, content_hash, category, confidence, usefulness,
             metadata, token_counts, embedding, occurred_at)
"""
_ORG_USAGE_SQL = "SELECT memories, content_bytes FROM org_usage WHERE org_id = $1"
_SET_DIRECTIVE_SQL = """
    INSERT INTO directives AS d (org_id, agent_id, content, token_counts)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT (org_id, agent_id) DO UPDATE
        SET content = EXCLUDED.content, token_counts = EXCLUDED.token_counts,
            version = greatest(d.version + 1, directive_clock_version()), updated_at = now()
        WHERE d.org_id = $1 AND d.agent_id = $2
          AND (d.content IS DISTINCT FROM EXCLUDED.content
               OR d.token_counts IS DISTINCT FROM EXCLUDED.token_counts)
    RETURNING version
"""


async def lock_agent(conn: asyncpg.Connection, org: uuid.UUID, agent: uuid.UUID) -> None:
    """Serialises writers of one agent until ``conn``'s transaction ends."""
    await conn.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2::uuid::text || $3::uuid::text))",
        WRITER_LOCK_CLASS,
        org,
        agent,
    )


class MemoryWrites:
    """Upserts and deletes memories, sets and clears directives, through the primary's pool.

    ``slots``: how many of the pool's connections upserts and deletes may hold at once, the
    orgs taking turns for them (``write_slots``); the others stay for the calls' searches."""

    def __init__(
        self, pool: asyncpg.Pool, *, quotas: OrgQuotas | None = None, slots: WriteSlots | None = None
    ) -> None:
        self._pool = pool
        self._quotas = quotas or OrgQuotas()
        self._slots = slots

    @store_errors
    async def upsert_memories(
        self, org_id: str, agent_id: str, memories: Sequence[PreparedMemory]
    ) -> list[UpsertResult]:
        """Stores a batch; results in input order (see ``stores.upsert_plan`` for the rules)."""
        if not memories:
            return []
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        for n, memory in enumerate(memories):
            as_uuid(memory.id, f"memories[{n}].id")
        async with self._slot(org_id), self._pool.acquire() as conn, conn.transaction():
            await lock_agent(conn, org, agent)
            rows = await conn.fetch(
                _EXISTING_SQL,
                org,
                agent,
                [m.content_hash for m in memories],
                [uuid.UUID(m.id) for m in memories],
            )
            existing = [
                StoredMemory(
                    id=str(r["id"]),
                    content_hash=bytes(r["content_hash"]),
                    category=r["category"],
                    confidence=float(r["confidence"]),
                    usefulness=float(r["usefulness"]),
                    metadata=r["metadata"],
                    occurred_at=r["occurred_at"],
                )
                for r in rows
            ]
            plan = plan_upsert(existing, memories)
            stored_bytes = {str(r["id"]): int(r["content_bytes"]) for r in rows}
            if plan.updates:
                await conn.execute(_UPDATE_SQL, org, agent, *_columns(plan.updates))
            if plan.inserts:
                # Counters left by an earlier memory with the same id (an injection batch
                # that raced its delete) must not carry over to the new memory.
                await conn.execute(
                    "DELETE FROM memory_usage"
                    " WHERE org_id = $1 AND agent_id = $2 AND memory_id = ANY($3::uuid[])",
                    org,
                    agent,
                    [uuid.UUID(m.id) for m in plan.inserts],
                )
                await conn.execute(_INSERT_SQL, org, agent, *_columns(plan.inserts))
            # UTF-8 bytes, as octet_length counts them in org_usage.
            added_bytes = sum(len(m.content.encode()) for m in plan.inserts) + sum(
                len(m.content.encode()) - stored_bytes.get(m.id, 0) for m in plan.updates
            )
            if (self._quotas.memories and plan.inserts) or (self._quotas.content_bytes and added_bytes > 0):
                # After the statements: their triggers have counted them and hold the
                # org's row until commit. Refused, the whole batch rolls back.
                usage = await conn.fetchrow(_ORG_USAGE_SQL, org)
                if usage is not None:
                    check_org_usage(
                        self._quotas,
                        OrgUsage(int(usage[0]), int(usage[1])),
                        added_memories=len(plan.inserts),
                        added_bytes=added_bytes,
                    )
        return list(plan.results)

    @store_errors
    async def delete_memories(self, org_id: str, agent_id: str, ids: Sequence[str]) -> int:
        """Deletes the memories (with their feedback and counters); returns how many existed."""
        if not ids:
            return 0
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        targets = [as_uuid(i, f"ids[{n}]") for n, i in enumerate(ids)]
        async with self._slot(org_id), self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "DELETE FROM memory_feedback"
                " WHERE org_id = $1 AND agent_id = $2 AND memory_id = ANY($3::uuid[])",
                org,
                agent,
                targets,
            )
            await conn.execute(
                "DELETE FROM memory_usage"
                " WHERE org_id = $1 AND agent_id = $2 AND memory_id = ANY($3::uuid[])",
                org,
                agent,
                targets,
            )
            status: str = await conn.execute(
                "DELETE FROM memories WHERE org_id = $1 AND agent_id = $2 AND id = ANY($3::uuid[])",
                org,
                agent,
                targets,
            )
        return int(status.split()[-1])

    def _slot(self, org_id: str) -> AbstractAsyncContextManager[None]:
        return self._slots.slot(org_id) if self._slots is not None else nullcontext()

    @store_errors
    async def set_directive_state(
        self, org_id: str, agent_id: str, content: str, token_counts: Mapping[str, int]
    ) -> DirectiveState | None:
        """Stores the directive and returns its state; None when the stored one is identical
        (the caller reads it)."""
        if not content:
            raise InvalidRequest("content", "must not be empty")
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        row = await self._pool.fetchrow(_SET_DIRECTIVE_SQL, org, agent, content, dict(token_counts))
        if row is None:
            return None
        return DirectiveState(content=content, version=row["version"], token_counts=dict(token_counts))

    @store_errors
    async def clear_directive_version(self, org_id: str, agent_id: str) -> int | None:
        """Clears the directive and returns the version of the cleared state, or None."""
        version: int | None = await self._pool.fetchval(
            "UPDATE directives SET content = NULL, token_counts = '{}'::jsonb,"
            " version = greatest(version + 1, directive_clock_version()),"
            " updated_at = now() WHERE org_id = $1 AND agent_id = $2 AND content IS NOT NULL"
            " RETURNING version",
            as_uuid(org_id, "org_id"),
            as_uuid(agent_id, "agent_id"),
        )
        return version


def _columns(memories: Sequence[PreparedMemory]) -> list[list[Any]]:
    return [
        [uuid.UUID(m.id) for m in memories],
        [m.content for m in memories],
        [m.content_hash for m in memories],
        [m.category for m in memories],
        [m.confidence for m in memories],
        [m.usefulness for m in memories],
        [dict(m.metadata) for m in memories],
        [dict(m.token_counts) for m in memories],
        [VectorParam(m.embedding) for m in memories],
        [m.occurred_at for m in memories],
    ]
