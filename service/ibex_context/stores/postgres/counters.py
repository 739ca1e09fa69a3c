"""Injection counters (``memory_usage``): how often and when each memory was injected."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from ibex_context.stores.base import InjectionRecord, MemoryCounters
from ibex_context.stores.postgres.codecs import CANONICAL_UUID, as_uuid, epoch
from ibex_context.stores.postgres.pool import store_errors

# ``InjectionCounters.record``'s one statement (see there).
RECORD_INJECTIONS_SQL = """
    INSERT INTO memory_usage AS u
        (org_id, agent_id, memory_id, retrieval_count, last_retrieved_at, last_injected_at)
    SELECT b.org_id, b.agent_id, b.memory_id, b.n, to_timestamp(b.at), to_timestamp(b.at)
    FROM (
        SELECT i.org_id, i.agent_id, i.memory_id, count(*)::int AS n, max(i.at) AS at
        FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::float8[])
            AS i(org_id, agent_id, memory_id, at)
        GROUP BY i.org_id, i.agent_id, i.memory_id
    ) AS b
    -- LATERAL, not EXISTS: a semi-join of a batch of many tenants against the
    -- partitioned table is planned as a hash join over every partition (162 ms
    -- for 200 injections over 100k memories); a lateral probe per injection is
    -- pruned to its tenant's partition at run time (1.6 ms).
    CROSS JOIN LATERAL (
        SELECT 1 FROM memories AS m
        WHERE m.org_id = b.org_id AND m.agent_id = b.agent_id AND m.id = b.memory_id
        LIMIT 1
    ) AS present
    ORDER BY b.org_id, b.agent_id, b.memory_id
    ON CONFLICT (org_id, agent_id, memory_id) DO UPDATE SET
        retrieval_count = u.retrieval_count + EXCLUDED.retrieval_count,
        last_retrieved_at = greatest(u.last_retrieved_at, EXCLUDED.last_retrieved_at),
        last_injected_at = greatest(u.last_injected_at, EXCLUDED.last_injected_at)
    RETURNING u.org_id::text, u.agent_id::text, u.memory_id::text, u.retrieval_count,
              extract(epoch FROM u.last_injected_at)::float8 AS last_injected_at
"""


class InjectionCounters:
    """Records injections through the primary's pool; never rewrites a memory row."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @store_errors
    async def record(self, injections: Sequence[InjectionRecord]) -> list[MemoryCounters]:
        """Counts injections in one statement; returns the memories' new counters.

        One ``INSERT … ON CONFLICT DO UPDATE`` into the narrow ``memory_usage`` table:
        no memory row is rewritten and no vector is read or returned. Repeated
        injections of one memory in the batch add up; ``last_*_at`` never moves
        backwards. Memories that no longer exist are skipped. Rows are inserted in
        key order (ORDER BY), so concurrent batches lock them in the same order and
        cannot deadlock.
        """
        if not injections:
            return []
        # The batch goes as it is, one array per field: PostgreSQL groups repeated
        # injections and sorts the keys. Building, grouping and sorting key tuples in
        # Python made the batch's first loop step ~1 ms for 200 injections (now ~0.6 ms,
        # benchmarks/results/bookkeeping-2026-11-26.md). Each distinct id is checked once.
        orgs = [item.org_id for item in injections]
        agents = [item.agent_id for item in injections]
        memories = [item.memory_id for item in injections]
        for field, values in (("org_id", orgs), ("agent_id", agents), ("memory_id", memories)):
            for value in set(values):
                if CANONICAL_UUID.fullmatch(value) is None:
                    as_uuid(value, f"injections[{values.index(value)}].{field}")
        async with self._pool.acquire() as conn, conn.transaction():
            # One generic plan, kept by the prepared statement: the session's
            # force_custom_plan would replan the probe of every one of memories' 64
            # partitions on each batch, and a custom plan gains nothing here (org and
            # agent come from the arrays; the probe is pruned at run time either way).
            # 200 injections: ~9.5 -> ~5.6 ms of backend CPU, this transaction's
            # statements included (benchmarks/results/stores-cpu-2026-11-26.md).
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            rows = await conn.fetch(
                RECORD_INJECTIONS_SQL, orgs, agents, memories, [item.at for item in injections]
            )
        # Ids come back as text and rows are unpacked by position: no uuid.UUID built
        # and turned back into text per row.
        return [
            MemoryCounters(org, agent, memory, count, epoch(at)) for org, agent, memory, count, at in rows
        ]
