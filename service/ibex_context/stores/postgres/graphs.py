"""Large agents' own graphs: a partial HNSW index per agent on its partition (migration 0013),
of its vectors in half precision (0019).

An agent past the exact scan's limit (``cold_exact_max_memories``) is promoted: its
graph is built with ``CREATE INDEX CONCURRENTLY`` (writes and searches go on) and
recorded ready in ``agent_graphs``; its searches then walk only its own vectors
(``ibex_cold_agent_halfvec``; ``ibex_cold_agent`` for a graph built before 0019). Until
then it is searched exactly (the partitions' shared graphs are gone, migration 0021).
The store starts a promotion in the background when a write leaves the agent past the
limit (``PostgresMemoryStore.upsert_memories``: queued, one build at a time per process,
on the pool of ``pool.create_graph_pool``, never a request connection); ``promote_grown``
promotes every such agent, e.g. after a bulk load.

A build that dies (process killed, connection lost) leaves its claim unready and
possibly an invalid index: a claim older than ``stale_after`` is taken over, and the
leftover index dropped before building again.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import timedelta

import asyncpg

from ibex_context.stores.cold_plan import ColdPlan
from ibex_context.stores.postgres.codecs import as_uuid
from ibex_context.stores.postgres.migrate import recorded_embedding_dim
from ibex_context.stores.postgres.pool import store_errors

# The agents' own graphs' parameters before migration 0019 (and the partitions' graphs', 0010-0021).
GRAPH_OPTIONS = "m = 32, ef_construction = 128"
# An agent's own graph (migration 0019): its vectors in half precision, each linked to more
# neighbours. On 100k MiniLM memories of one agent, at ef_search 200: recall@50 0.978 mean /
# 0.90 p5 in 8.3 ms, against 0.943 / 0.72 in 7.0 ms for the previous graph (which needed
# ef_search 400, 13.7 ms, for 0.969 / 0.84); 164 MB against 212 MB (ADR-0015).
AGENT_GRAPH_OPTIONS = "m = 48, ef_construction = 256"

_CLAIM_SQL = """
    INSERT INTO agent_graphs AS g (org_id, agent_id, index_name) VALUES ($1, $2, $3)
    ON CONFLICT (org_id, agent_id) DO UPDATE SET requested_at = now()
        WHERE NOT g.ready AND g.requested_at < now() - $4::interval
    RETURNING true
"""
_READY_SQL = "UPDATE agent_graphs SET ready = true, halfvec = true WHERE org_id = $1 AND agent_id = $2"
_PARTITION_SQL = "SELECT tableoid::regclass::text FROM memories WHERE org_id = $1 AND agent_id = $2 LIMIT 1"
_GROWN_SQL = """
    SELECT s.org_id::text, s.agent_id::text FROM memory_stats AS s
    WHERE s.memories > $1
      AND NOT EXISTS (SELECT 1 FROM agent_graphs AS g WHERE g.org_id = s.org_id AND g.agent_id = s.agent_id)
    ORDER BY s.memories DESC
"""
# The agent's memory count and the plan that searches its own graph once that is ready
# (``ColdPlan.AGENT_HALFVEC`` or, built before migration 0019, ``ColdPlan.AGENT``), else NULL.
AGENT_STATE_SQL: str = f"""
    SELECT s.memories,
           (SELECT CASE WHEN g.halfvec THEN '{ColdPlan.AGENT_HALFVEC.value}' ELSE '{ColdPlan.AGENT.value}' END
            FROM agent_graphs AS g WHERE g.org_id = $1 AND g.agent_id = $2 AND g.ready)
    FROM memory_stats AS s WHERE s.org_id = $1 AND s.agent_id = $2
"""


def own_graph_plan(state: asyncpg.Record | None) -> ColdPlan | None:
    """The plan of the agent's own graph from its ``AGENT_STATE_SQL`` row (None: none ready)."""
    return ColdPlan(state[1]) if state is not None and state[1] is not None else None


def graph_index_name(org: uuid.UUID, agent: uuid.UUID) -> str:
    """The agent's index name: a hash of the tenant, never its ids."""
    return "memories_agent_" + hashlib.sha256(org.bytes + agent.bytes).hexdigest()[:16]


# What a build asks for per memory of the agent (maintenance_work_mem): pgvector holds the
# graph in memory while it fits, ~2.5 kB an element at 384 dimensions in half precision with
# m 48 (the vector, 96 neighbours on the lowest layer), with a margin.
BUILD_BYTES_PER_MEMORY = 4096
# PostgreSQL's smallest useful maintenance_work_mem for a build (and its default).
MIN_BUILD_MEMORY_MB = 64
DEFAULT_BUILD_MEMORY_MB = 1024


def build_memory_mb(memories: int, cap_mb: int) -> int:
    """maintenance_work_mem for a build of ``memories`` memories' graph: enough to hold it
    (past that pgvector finishes the graph on disk, many times slower), at most ``cap_mb``."""
    need = -(-memories * BUILD_BYTES_PER_MEMORY // 2**20)
    return max(MIN_BUILD_MEMORY_MB, min(cap_mb, need))


class AgentGraphs:
    """Builds and records large agents' own graphs, through the primary's pool.

    ``build_memory_mb``: the most memory one build may take (``build_memory_mb``)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        min_memories: int,
        stale_after: timedelta = timedelta(hours=1),
        build_memory_mb: int = DEFAULT_BUILD_MEMORY_MB,
    ) -> None:
        self._pool = pool
        self.min_memories = min_memories
        self._stale_after = stale_after
        self._build_memory_mb = build_memory_mb

    @store_errors
    async def promote(self, org_id: str, agent_id: str) -> bool:
        """Builds the agent's own graph; False when it has one, another process is
        building it, or it has no memories."""
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        name = graph_index_name(org, agent)
        async with self._pool.acquire() as conn:
            if not await conn.fetchval(_CLAIM_SQL, org, agent, name, self._stale_after):
                return False
            built = False
            try:
                partition = await conn.fetchval(_PARTITION_SQL, org, agent)
                dim = await recorded_embedding_dim(conn)
                if partition is not None and dim is not None:
                    # A build takes seconds to minutes: past the pool's statement timeout.
                    await conn.execute("SET statement_timeout = 0")
                    # The agent's size from the state query the searches read.
                    memories = await conn.fetchval(AGENT_STATE_SQL, org, agent) or 0
                    memory_mb = build_memory_mb(int(memories), self._build_memory_mb)
                    await conn.execute(f"SET maintenance_work_mem = '{memory_mb}MB'")
                    try:
                        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
                        await conn.execute(
                            f"CREATE INDEX CONCURRENTLY {name} ON {partition}"
                            f" USING hnsw ((embedding::halfvec({dim})) halfvec_cosine_ops)"
                            f" WITH ({AGENT_GRAPH_OPTIONS})"
                            f" WHERE org_id = '{org}'::uuid AND agent_id = '{agent}'::uuid"
                        )
                    finally:
                        await conn.execute("RESET statement_timeout")
                        await conn.execute("RESET maintenance_work_mem")
                    await conn.execute(_READY_SQL, org, agent)
                    built = True
            finally:
                if not built:
                    await conn.execute(
                        "DELETE FROM agent_graphs WHERE org_id = $1 AND agent_id = $2", org, agent
                    )
        return built

    @store_errors
    async def grown(self) -> list[tuple[str, str]]:
        """The (org_id, agent_id) of agents past the limit without a graph, largest first."""
        rows = await self._pool.fetch(_GROWN_SQL, self.min_memories)
        return [(r[0], r[1]) for r in rows]

    async def promote_grown(self) -> int:
        """Promotes every agent past the limit, one after another; returns how many were built."""
        return sum([await self.promote(org, agent) for org, agent in await self.grown()])
