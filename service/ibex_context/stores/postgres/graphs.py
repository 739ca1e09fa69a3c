"""Large agents' own graphs: a partial HNSW index per agent on its partition (migration 0013),
of its vectors in half precision (0019), sparse while the agent is small and dense once it
has grown (0022).

An agent past the exact scan's limit (``cold_exact_max_memories``) is promoted: its
graph is built with ``CREATE INDEX CONCURRENTLY`` (writes and searches go on) and
recorded ready in ``agent_graphs``; its searches then walk only its own vectors
(``ibex_cold_agent_halfvec``; ``ibex_cold_agent`` for a graph built before 0019). Until
then it is searched exactly (the partitions' shared graphs are gone, migration 0021).
Promoted with at most ``sparse_max_memories`` memories, the graph is sparse
(``SPARSE_GRAPH``: a quarter of the dense graph's write cost, as much found at that size);
once the agent grows past it, the graph is rebuilt dense (``DENSE_GRAPH``) beside it and
the sparse one dropped, the agent's searches walking the sparse graph meanwhile.
The store starts a build in the background when a write leaves the agent past a limit
(``PostgresMemoryStore.upsert_memories``: queued, one build at a time per process,
on the pool of ``pool.create_graph_pool``, never a request connection); ``promote_grown``
builds every graph due, e.g. after a bulk load.

Where ``rebuild_replaced_share`` is set (0, off, by default), a graph whose agent has had
that share of its memories replaced (deleted, or re-embedded) since it was built is rebuilt
in place (``REINDEX_SQL``, migration 0024), at most a quarter of the time
(``REBUILD_PAUSE``): a vacuum would otherwise repair it around each dead vector, at 1.4-2.9
times the CPU, but throttled, where the rebuild takes a core while it runs
(large-agents-2026-12-06.md section 22). Deletes and updates then queue the agent's check as
creations do.

A build that dies (process killed, connection lost) leaves its claim unready and
possibly an invalid index: a claim older than ``stale_after`` is taken over, and the
leftover index dropped before building again.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from ibex_context.settings import Settings
from ibex_context.stores.cold_plan import ColdPlan
from ibex_context.stores.postgres.codecs import as_uuid
from ibex_context.stores.postgres.migrate import recorded_embedding_dim
from ibex_context.stores.postgres.pool import store_errors

# The agents' own graphs' parameters before migration 0019 (and the partitions' graphs', 0010-0021).
GRAPH_OPTIONS = "m = 32, ef_construction = 128"


@dataclass(frozen=True, slots=True)
class GraphBuild:
    """How an agent's own graph is built: the links of each vector (``m``), the width of the
    build's search for them (``ef_construction``), its index name's suffix (a rebuild
    makes the new graph beside the old), and what operators call it (a metric's label)."""

    links: int
    ef_construction: int
    suffix: str
    name: str

    @property
    def options(self) -> str:
        return f"m = {self.links}, ef_construction = {self.ef_construction}"


# The dense graph (migration 0019): its vectors in half precision, each linked to many
# neighbours. On 100k MiniLM memories of one agent, at ef_search 200: recall@50 0.978 mean /
# 0.90 p5 in 8.3 ms, against 0.943 / 0.72 in 7.0 ms for the previous graph (which needed
# ef_search 400, 13.7 ms, for 0.969 / 0.84); 164 MB against 212 MB (ADR-0015).
DENSE_GRAPH = GraphBuild(links=48, ef_construction=256, suffix="", name="dense")
# The sparse graph (0022), for an agent near the promotion size: at 10k real MiniLM
# memories, ef_search 200 gives recall@50 0.988 / 0.94 for 1.9 ms of backend CPU where the
# dense graph gives 0.995 / 0.96 at 100 for 2.1 ms; a memory's insertion 2.7-2.9 ms of CPU
# against 9.6-12.2, the build at 10k 2 s against 9-10 s. It keeps up to 12.5k memories and
# falls behind at 15k (0.948 / 0.56 against 0.986 / 0.92 on drawn vectors), and under heavy
# deletes: agents past ``sparse_max_memories`` (0, none, unless configured) get the dense
# one (large-agents-2026-12-06.md sections 14, 15).
SPARSE_GRAPH = GraphBuild(links=16, ef_construction=128, suffix="_s", name="sparse")
AGENT_GRAPH_OPTIONS = DENSE_GRAPH.options

# A churned graph's rebuild: a new graph built beside it from the live rows, swapped in
# under its name (``index``), the old one dropped; searches and writes go on.
REINDEX_SQL = "REINDEX INDEX CONCURRENTLY {index}"
# The share of an agent's memories replaced (deleted, or re-embedded by an update) since its
# graph was built past which the graph is rebuilt (``REINDEX_SQL``) rather than left to a
# vacuum to repair; 0 (the default): never.
REBUILD_REPLACED_SHARE: float = Settings.model_fields["cold_graph_rebuild_replaced_share"].default
# After a build of T seconds the agent's graph is rebuilt no sooner than REBUILD_PAUSE x T
# later: at most a quarter of the time. A rebuild runs at full speed where autovacuum's repair
# is throttled; at 100 writes a second into one 10k agent back-to-back rebuilds took its
# writers from 76-82 to 50 a second (large-agents-2026-12-06.md section 22).
REBUILD_PAUSE = 3.0


@dataclass(frozen=True, slots=True)
class GraphBuildTiming:
    """One build of an agent's own graph: which graph (``GraphBuild.name``), whether it
    was built (False: the statement failed), and its wall time in seconds. No tenant."""

    graph: str
    built: bool
    seconds: float


GraphBuildObserver = Callable[[GraphBuildTiming], None]


@dataclass(slots=True)
class _Outcome:
    """A build as ``AgentGraphs._maintenance`` sees it: whether its body built the graph, and
    its wall time once it is over."""

    built: bool = False
    seconds: float = 0.0


def graph_for(memories: int, sparse_max_memories: int) -> GraphBuild:
    """The graph an agent of ``memories`` memories gets."""
    return SPARSE_GRAPH if memories <= sparse_max_memories else DENSE_GRAPH


_CLAIM_SQL = """
    INSERT INTO agent_graphs AS g (org_id, agent_id, index_name) VALUES ($1, $2, $3)
    ON CONFLICT (org_id, agent_id) DO UPDATE
        SET requested_at = now(), index_name = EXCLUDED.index_name, replaced = 0
        WHERE NOT g.ready AND g.requested_at < now() - $4::interval
    RETURNING true
"""
_READY_SQL = """
    UPDATE agent_graphs SET ready = true, halfvec = true, links = $3, built_at = now(), build_seconds = $4
    WHERE org_id = $1 AND agent_id = $2
"""
# A rebuild (a sparse graph's dense one, or a churned graph's): claimed on its record (one
# process at a time, a stale claim taken over), returning the graph's name and the rows
# replaced so far, which the new graph no longer holds once it is built.
_REBUILD_CLAIM_SQL = """
    UPDATE agent_graphs SET rebuild_requested_at = now()
    WHERE org_id = $1 AND agent_id = $2 AND ready AND halfvec AND links < $3
      AND (rebuild_requested_at IS NULL OR rebuild_requested_at < now() - $4::interval)
    RETURNING index_name, replaced
"""
_REBUILT_SQL = """
    UPDATE agent_graphs
    SET links = $3, index_name = $4, rebuild_requested_at = NULL, replaced = greatest(replaced - $5, 0),
        built_at = now(), build_seconds = $6
    WHERE org_id = $1 AND agent_id = $2 RETURNING true
"""
# A churned graph's rebuild: due once more than $3 of the agent's memories were replaced,
# and $5 times its last build's seconds after that build.
_CHURNED = """
    g.ready AND $3::float8 > 0 AND g.replaced > $3::float8 * s.memories
    AND (g.built_at IS NULL OR g.built_at + make_interval(secs => $5 * g.build_seconds) < now())
"""
_RENEW_CLAIM_SQL = f"""
    UPDATE agent_graphs AS g SET rebuild_requested_at = now()
    FROM memory_stats AS s
    WHERE g.org_id = $1 AND g.agent_id = $2 AND s.org_id = g.org_id AND s.agent_id = g.agent_id
      AND {_CHURNED}
      AND (g.rebuild_requested_at IS NULL OR g.rebuild_requested_at < now() - $4::interval)
    RETURNING g.index_name, g.replaced, s.memories, g.links
"""
_RENEWED_SQL = """
    UPDATE agent_graphs
    SET rebuild_requested_at = NULL, replaced = greatest(replaced - $3, 0),
        built_at = now(), build_seconds = $4
    WHERE org_id = $1 AND agent_id = $2
"""
_REBUILD_RELEASE_SQL = (
    "UPDATE agent_graphs SET rebuild_requested_at = NULL WHERE org_id = $1 AND agent_id = $2"
)
_PARTITION_SQL = "SELECT tableoid::regclass::text FROM memories WHERE org_id = $1 AND agent_id = $2 LIMIT 1"
# Agents due a build: past the exact scan's limit without a graph ($1), past the sparse
# graph's limit ($2) on a sparse one ($4: the dense graph's links), or churned (``_CHURNED``).
_GROWN_SQL = f"""
    SELECT s.org_id::text, s.agent_id::text FROM memory_stats AS s
    LEFT JOIN agent_graphs AS g ON g.org_id = s.org_id AND g.agent_id = s.agent_id
    WHERE s.memories > $1
      AND (g.org_id IS NULL OR (g.ready AND g.halfvec AND g.links < $4 AND s.memories > $2)
           OR ({_CHURNED}))
    ORDER BY s.memories DESC
"""
# The agent's memory count and the plan that searches its own graph once that is ready
# (``ColdPlan.AGENT_HALFVEC`` dense, ``ColdPlan.AGENT_SPARSE`` sparse, or, built before
# migration 0019, ``ColdPlan.AGENT``), else NULL.
AGENT_STATE_SQL: str = f"""
    SELECT s.memories,
           (SELECT CASE WHEN NOT g.halfvec THEN '{ColdPlan.AGENT.value}'
                        WHEN g.links < {DENSE_GRAPH.links} THEN '{ColdPlan.AGENT_SPARSE.value}'
                        ELSE '{ColdPlan.AGENT_HALFVEC.value}' END
            FROM agent_graphs AS g WHERE g.org_id = $1 AND g.agent_id = $2 AND g.ready)
    FROM memory_stats AS s WHERE s.org_id = $1 AND s.agent_id = $2
"""


def own_graph_plan(state: asyncpg.Record | None) -> ColdPlan | None:
    """The plan of the agent's own graph from its ``AGENT_STATE_SQL`` row (None: none ready)."""
    return ColdPlan(state[1]) if state is not None and state[1] is not None else None


def graph_index_name(org: uuid.UUID, agent: uuid.UUID, build: GraphBuild = DENSE_GRAPH) -> str:
    """The agent's index name: a hash of the tenant, never its ids, and the graph's suffix."""
    return "memories_agent_" + hashlib.sha256(org.bytes + agent.bytes).hexdigest()[:16] + build.suffix


def rebuild_leftovers(index: str) -> tuple[str, str]:
    """What a ``REINDEX_SQL`` of ``index`` that died leaves beside it: the new graph (invalid,
    still written to) or, past the swap, the old one; PostgreSQL's names for them."""
    return f"{index}_ccnew", f"{index}_ccold"


def graph_index_names(org: uuid.UUID, agent: uuid.UUID) -> tuple[str, ...]:
    """Every name the agent's graph may have, leftovers of a rebuild included (a purge
    drops them all)."""
    names = [graph_index_name(org, agent, build) for build in (DENSE_GRAPH, SPARSE_GRAPH)]
    return tuple(n for name in names for n in (name, *rebuild_leftovers(name)))


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

    ``sparse_max_memories``: agents promoted with at most this many memories get the sparse
    graph, rebuilt dense once they grow past it (0: every graph dense). ``rebuild_replaced_share``:
    a graph is rebuilt once more than this share of its agent's memories were replaced since
    it was built (0: never). ``build_memory_mb``: the most memory one build may take
    (``build_memory_mb``). ``observe``: told each build's timing."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        min_memories: int,
        sparse_max_memories: int = 0,
        rebuild_replaced_share: float = REBUILD_REPLACED_SHARE,
        stale_after: timedelta = timedelta(hours=1),
        build_memory_mb: int = DEFAULT_BUILD_MEMORY_MB,
        observe: GraphBuildObserver | None = None,
    ) -> None:
        self._pool = pool
        self.min_memories = min_memories
        self.sparse_max_memories = sparse_max_memories
        self.rebuild_replaced_share = rebuild_replaced_share
        self._stale_after = stale_after
        self._build_memory_mb = build_memory_mb
        self._observe = observe

    @store_errors
    async def promote(self, org_id: str, agent_id: str) -> bool:
        """Builds the agent's own graph, sparse or dense by its size; False when it has one,
        another process is building it, or it has no memories."""
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        async with self._pool.acquire() as conn:
            memories = int(await conn.fetchval(AGENT_STATE_SQL, org, agent) or 0)
            build = graph_for(memories, self.sparse_max_memories)
            name = graph_index_name(org, agent, build)
            if not await conn.fetchval(_CLAIM_SQL, org, agent, name, self._stale_after):
                return False
            built = False
            try:
                # A claim taken over may have left an index under either name.
                seconds = await self._build(
                    conn, org, agent, build, memories, leftovers=graph_index_names(org, agent)
                )
                if seconds is not None:
                    await conn.execute(_READY_SQL, org, agent, build.links, seconds)
                    built = True
            finally:
                if not built:
                    await conn.execute(
                        "DELETE FROM agent_graphs WHERE org_id = $1 AND agent_id = $2", org, agent
                    )
        return built

    @store_errors
    async def densify(self, org_id: str, agent_id: str) -> bool:
        """Rebuilds the agent's sparse graph dense, beside it: its searches walk the sparse
        graph until the dense one is recorded. False when it has no sparse graph or another
        process is rebuilding it."""
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        async with self._pool.acquire() as conn:
            claim = await conn.fetchrow(_REBUILD_CLAIM_SQL, org, agent, DENSE_GRAPH.links, self._stale_after)
            if claim is None:
                return False
            sparse, replaced = claim
            name = graph_index_name(org, agent, DENSE_GRAPH)
            rebuilt = False
            try:
                memories = int(await conn.fetchval(AGENT_STATE_SQL, org, agent) or 0)
                seconds = await self._build(conn, org, agent, DENSE_GRAPH, memories, leftovers=(name,))
                if seconds is not None:
                    # The sparse graph goes before the record says dense: a crash between
                    # leaves a dense graph recorded sparse (rebuilt again), never a sparse
                    # graph that every write pays for and no record names.
                    await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {sparse}")
                    rebuilt = bool(
                        await conn.fetchval(
                            _REBUILT_SQL, org, agent, DENSE_GRAPH.links, name, replaced, seconds
                        )
                    )
                    if not rebuilt:  # the agent was purged meanwhile
                        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
            finally:
                if not rebuilt:
                    await conn.execute(_REBUILD_RELEASE_SQL, org, agent)
        return rebuilt

    @store_errors
    async def renew(self, org_id: str, agent_id: str) -> bool:
        """Rebuilds the agent's graph in place (``REINDEX_SQL``) once more than
        ``rebuild_replaced_share`` of its memories were replaced since it was built: the new
        graph holds only live rows. False when none is due or another process rebuilds it."""
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        async with self._pool.acquire() as conn:
            claim = await conn.fetchrow(
                _RENEW_CLAIM_SQL, org, agent, self.rebuild_replaced_share, self._stale_after, REBUILD_PAUSE
            )
            if claim is None:
                return False
            name, replaced, memories, links = claim
            graph = SPARSE_GRAPH if links == SPARSE_GRAPH.links else DENSE_GRAPH
            renewed = False
            try:
                async with self._maintenance(conn, graph, memories) as timing:
                    for leftover in rebuild_leftovers(name):
                        await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {leftover}")
                    await conn.execute(REINDEX_SQL.format(index=name))
                    timing.built = True
                await conn.execute(_RENEWED_SQL, org, agent, replaced, timing.seconds)
                renewed = True
            finally:
                if not renewed:
                    await conn.execute(_REBUILD_RELEASE_SQL, org, agent)
        return renewed

    @asynccontextmanager
    async def _maintenance(
        self, conn: asyncpg.Connection, graph: GraphBuild, memories: int
    ) -> AsyncIterator[_Outcome]:
        """Settings for a build of ``memories`` memories' graph on ``conn``, reset after it,
        and its timing told to ``observe`` (built once the body sets ``built``)."""
        # A build takes seconds to minutes: past the pool's statement timeout.
        await conn.execute("SET statement_timeout = 0")
        await conn.execute(
            f"SET maintenance_work_mem = '{build_memory_mb(memories, self._build_memory_mb)}MB'"
        )
        started, outcome = time.perf_counter(), _Outcome()
        try:
            yield outcome
        finally:
            outcome.seconds = time.perf_counter() - started
            if self._observe is not None:
                self._observe(GraphBuildTiming(graph.name, outcome.built, outcome.seconds))
            await conn.execute("RESET statement_timeout")
            await conn.execute("RESET maintenance_work_mem")

    async def _build(
        self,
        conn: asyncpg.Connection,
        org: uuid.UUID,
        agent: uuid.UUID,
        build: GraphBuild,
        memories: int,
        *,
        leftovers: tuple[str, ...],
    ) -> float | None:
        """Builds ``build``'s graph of the agent (its ``leftovers`` dropped first); its
        seconds, or None when it has no memories or the schema no recorded dimension."""
        partition = await conn.fetchval(_PARTITION_SQL, org, agent)
        dim = await recorded_embedding_dim(conn)
        if partition is None or dim is None:
            return None
        async with self._maintenance(conn, build, memories) as timing:
            for leftover in leftovers:
                await conn.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {leftover}")
            await conn.execute(
                f"CREATE INDEX CONCURRENTLY {graph_index_name(org, agent, build)} ON {partition}"
                f" USING hnsw ((embedding::halfvec({dim})) halfvec_cosine_ops)"
                f" WITH ({build.options})"
                f" WHERE org_id = '{org}'::uuid AND agent_id = '{agent}'::uuid"
            )
            timing.built = True
        return timing.seconds

    @store_errors
    async def build_due(self, org_id: str, agent_id: str) -> bool:
        """Builds what the agent's size calls for: its own graph past the exact scan's limit,
        the dense one past the sparse graph's, a new one once its graph is churned
        (``renew``); False when nothing was built."""
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        state = await self._pool.fetchrow(AGENT_STATE_SQL, org, agent)
        if state is None or state[0] <= self.min_memories:
            return False
        plan = own_graph_plan(state)
        if plan is None:
            return await self.promote(org_id, agent_id)
        if plan is ColdPlan.AGENT_SPARSE and state[0] > self.sparse_max_memories:
            return await self.densify(org_id, agent_id)
        return await self.renew(org_id, agent_id)

    @store_errors
    async def grown(self) -> list[tuple[str, str]]:
        """The (org_id, agent_id) of agents due a build (``build_due``), largest first."""
        rows = await self._pool.fetch(
            _GROWN_SQL,
            self.min_memories,
            self.sparse_max_memories,
            self.rebuild_replaced_share,
            DENSE_GRAPH.links,
            REBUILD_PAUSE,
        )
        return [(r[0], r[1]) for r in rows]

    async def promote_grown(self) -> int:
        """Builds every graph due, one after another; returns how many were built."""
        return sum([await self.build_due(org, agent) for org, agent in await self.grown()])
