"""PostgreSQL + pgvector: the source of truth for memories, directives and feedback.

``PostgresMemoryStore`` is the one object the service holds: it composes the stages,
each a narrow class over the pool it is given (``searches``, ``reads``, ``writes``,
``feedback``, ``counters``), and implements ``ColdMemorySearch``, ``MemoryWriter``,
``InjectionRecorder`` and ``HealthProbe``. Every statement is scoped by ``org_id``
AND ``agent_id``. Pool set-up and session settings: ``pool``; wire formats: ``codecs``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module
from collections.abc import Mapping, Sequence

import asyncpg
import numpy as np

from ibex_context.candidates import Candidates
from ibex_context.errors import StoreError, StoreUnavailable
from ibex_context.models import Directive, FloatVector, MemoryRecord
from ibex_context.settings import Settings
from ibex_context.stores.base import (
    DirectiveState,
    FeedbackUpdate,
    InjectionRecord,
    MemoryCounters,
    PreparedMemory,
    StoreHealth,
    UpsertResult,
)
from ibex_context.stores.cold_plan import AgentSizes, GraphSearchWidth
from ibex_context.stores.postgres.build_queue import GraphBuildQueue
from ibex_context.stores.postgres.codecs import TokenCountsDecoder
from ibex_context.stores.postgres.counters import InjectionCounters
from ibex_context.stores.postgres.feedback import FeedbackLog
from ibex_context.stores.postgres.graphs import (
    DEFAULT_BUILD_MEMORY_MB,
    REBUILD_REPLACED_SHARE,
    AgentGraphs,
    GraphBuildObserver,
)
from ibex_context.stores.postgres.pool import create_graph_pool, create_pool, postgres_tls
from ibex_context.stores.postgres.reads import MemoryReads
from ibex_context.stores.postgres.searches import DEFAULT_EXACT_MAX_MEMORIES, MemorySearches
from ibex_context.stores.postgres.write_slots import WriteSlots
from ibex_context.stores.postgres.writes import MemoryWrites
from ibex_context.stores.quotas import OrgQuotas

log = logging.getLogger(__name__)


# Agents waiting for their size check: past it, an org's burst of writes into new agents
# queues nothing more of it (each agent's next write queues it again), while another
# org's agents still take a place (``build_queue``).
MAX_QUEUED_PROMOTIONS = 10_000

EMBEDDING_DIM_SQL = "SELECT value FROM ibex_meta WHERE key = 'embedding_dim'"


async def prepare_request_path(conn: asyncpg.Connection) -> None:
    """Runs every statement of the request path once on a new pooled connection, for a
    tenant that does not exist: asyncpg keeps each prepared, and the backend has planned
    it. A backend's first plan of a search opens every partition of ``memories`` and
    their indexes (0008: 64 of each): 50-60 ms measured for the exact search on a new
    connection, which a request's cold deadline cannot absorb; 1 ms after."""
    probe = np.zeros(int(await conn.fetchval(EMBEDDING_DIM_SQL)), dtype=np.float32)
    await MemorySearches.prepare(conn, probe)
    await MemoryReads.prepare(conn)


class PostgresMemoryStore:
    """Memories, directives, feedback and injection counters in PostgreSQL.

    Injection counters live in ``memory_usage`` (migration 0003), LEFT JOINed by every
    memory read; recording injections never rewrites a ``memories`` row.
    ``ef_search``: the pool's session setting (see ``create_pool``), given to the pools
    this store opens (a read replica's); graph searches pass their own width
    (``graph_width``).
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        ef_search: int,
        exact_max_memories: int = DEFAULT_EXACT_MAX_MEMORIES,
        agent_sizes: AgentSizes | None = None,
        graph_width: GraphSearchWidth | None = None,
        agent_graphs: bool = False,
        graph_pool: asyncpg.Pool | None = None,
        graph_build_memory_mb: int = DEFAULT_BUILD_MEMORY_MB,
        sparse_graph_max_memories: int = 0,
        graph_rebuild_replaced_share: float = REBUILD_REPLACED_SHARE,
        quotas: OrgQuotas | None = None,
        ssl: ssl_module.SSLContext | None = None,
        observe_graph_build: GraphBuildObserver | None = None,
        write_connections: int | None = None,
    ) -> None:
        """``write_connections``: the most of ``pool``'s connections upserts and deletes hold
        at once, orgs taking turns (``write_slots``); None: no bound (tests, tools)."""
        if agent_graphs and graph_pool is None:
            raise ValueError("agent_graphs needs a graph_pool: graphs are never built on the request pool")
        self._pool = pool
        self._graph_pool = graph_pool
        self._ssl = ssl  # a read replica's pool verifies against the same CA
        self._ef_search = ef_search
        self._agent_graphs = agent_graphs
        self._rebuild_churned = graph_rebuild_replaced_share > 0
        token_counts = TokenCountsDecoder()
        self.searches = MemorySearches(
            pool,
            ef_search=ef_search,
            agent_sizes=agent_sizes,
            graph_width=graph_width,
            token_counts=token_counts,
        )
        self.reads = MemoryReads(pool, token_counts=token_counts)
        self.writes = MemoryWrites(
            pool, quotas=quotas, slots=WriteSlots(write_connections) if write_connections else None
        )
        self.feedback = FeedbackLog(pool)
        self.counters = InjectionCounters(pool)
        # An agent past the exact scan's limit gets a graph of its own (when
        # ``agent_graphs``: queued by its writes and by ``queue_grown`` at start;
        # ``graphs.promote_grown`` otherwise).
        # Builds run on ``graph_pool`` (one connection: one build at a time per
        # process), never on a request connection: a build holds its connection for
        # seconds to minutes, and 16 of them had filled the request pool.
        self.graphs = AgentGraphs(
            graph_pool or pool,
            min_memories=exact_max_memories,
            sparse_max_memories=sparse_graph_max_memories,
            rebuild_replaced_share=graph_rebuild_replaced_share,
            build_memory_mb=graph_build_memory_mb,
            observe=observe_graph_build,
        )
        # Agents whose size is to be checked (and graph built), org by org; one task works
        # through them.
        self._promotions = GraphBuildQueue(MAX_QUEUED_PROMOTIONS)
        self._promoter: asyncio.Task[None] | None = None

    @classmethod
    async def from_settings(
        cls, settings: Settings, *, observe_graph_build: GraphBuildObserver | None = None
    ) -> PostgresMemoryStore:
        ef_search = min(1000, max(settings.hnsw_ef_search, settings.cold_limit))
        tls = postgres_tls(settings.postgres_ca_file)
        pool = await create_pool(
            settings.postgres_dsn,
            min_size=settings.postgres_pool_min,
            max_size=settings.postgres_pool_max,
            ef_search=ef_search,
            ssl=tls,
            prepare=prepare_request_path,
        )
        graph_pool = None
        if settings.cold_agent_graphs:
            graph_pool = await create_graph_pool(
                settings.postgres_dsn,
                ef_search=ef_search,
                parallel_workers=settings.graph_build_parallel_workers,
                ssl=tls,
            )
        return cls(
            pool,
            graph_pool=graph_pool,
            quotas=OrgQuotas(
                memories=settings.max_org_memories, content_bytes=settings.max_org_content_bytes
            ),
            ssl=tls,
            ef_search=ef_search,
            exact_max_memories=settings.cold_exact_max_memories,
            agent_graphs=settings.cold_agent_graphs,
            graph_build_memory_mb=settings.graph_build_memory_mb,
            sparse_graph_max_memories=settings.cold_sparse_graph_max_memories,
            graph_rebuild_replaced_share=settings.cold_graph_rebuild_replaced_share,
            graph_width=GraphSearchWidth.from_settings(settings),
            observe_graph_build=observe_graph_build,
            write_connections=max(
                1, min(settings.postgres_write_connections, settings.postgres_pool_max - 1)
            ),
        )

    async def aclose(self) -> None:
        self._promotions.clear()
        if self._promoter is not None:
            self._promoter.cancel()
            await asyncio.gather(self._promoter, return_exceptions=True)
        if self._graph_pool is not None:
            await self._graph_pool.close()
        await self._pool.close()

    @property
    def graph_builds_queued(self) -> int:
        """Agents waiting in this process's queue for their size check and graph build."""
        return len(self._promotions)

    @property
    def pool(self) -> asyncpg.Pool:
        """The pool, for the memory API's statements (``stores.postgres.tenant_data``)."""
        return self._pool

    async def open_read_pool(self, dsn: str, *, min_size: int, max_size: int) -> asyncpg.Pool:
        """A pool on a read replica of this store's database with this store's session
        settings and prepared connections (the searches' ``on=``)."""
        try:
            return await create_pool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                ef_search=self._ef_search,
                ssl=self._ssl,
                prepare=prepare_request_path,
            )
        except asyncpg.InterfaceError as exc:
            raise StoreUnavailable(f"postgres replica: {type(exc).__name__}") from None

    # ---------------------------------------------------------------- reads

    async def search(
        self,
        org_id: str,
        agent_id: str,
        embedding: FloatVector,
        limit: int,
        *,
        with_vectors: bool = False,
        wider: bool = False,
        on: asyncpg.Pool | None = None,
    ) -> Candidates:
        """``on``: a pool from ``open_read_pool``; default the primary's."""
        return await self.searches.search(
            org_id, agent_id, embedding, limit, with_vectors=with_vectors, wider=wider, on=on
        )

    async def search_lexical(
        self, org_id: str, agent_id: str, query: str, limit: int, *, on: asyncpg.Pool | None = None
    ) -> Candidates:
        return await self.searches.search_lexical(org_id, agent_id, query, limit, on=on)

    async def get_directive(self, org_id: str, agent_id: str) -> Directive | None:
        return (await self.reads.get_directive_state(org_id, agent_id)).to_directive()

    async def get_directive_state(self, org_id: str, agent_id: str) -> DirectiveState:
        return await self.reads.get_directive_state(org_id, agent_id)

    async def fetch_memories(self, org_id: str, agent_id: str, ids: Sequence[str]) -> list[MemoryRecord]:
        return await self.reads.fetch_memories(org_id, agent_id, ids)

    async def top_memories_for_hot_set(self, org_id: str, agent_id: str, limit: int) -> list[MemoryRecord]:
        return await self.reads.top_memories_for_hot_set(org_id, agent_id, limit)

    async def count_memories(self, org_id: str, agent_id: str) -> int:
        return await self.reads.count_memories(org_id, agent_id)

    # ---------------------------------------------------------------- writes

    async def upsert_memories(
        self, org_id: str, agent_id: str, memories: Sequence[PreparedMemory]
    ) -> list[UpsertResult]:
        results = await self.writes.upsert_memories(org_id, agent_id, memories)
        # Created: the agent grew. Updated: its text, so its vector, may have been replaced.
        queued_by = ("created", "updated") if self._rebuild_churned else ("created",)
        if self._agent_graphs and any(r.outcome in queued_by for r in results):
            self._queue_promotion(org_id, agent_id)
        return results

    def _queue_promotion(self, org_id: str, agent_id: str) -> bool:
        """Queues the agent for a check and, past a limit, a graph of its own, its dense
        rebuild or a churned graph's rebuild (built in the background, one at a time;
        ``graphs.AgentGraphs.build_due``).
        The write has committed and waits for none of it. False: not queued (queued
        already, or its org's flood of new agents filled the queue)."""
        if not self._promotions.add(org_id, agent_id):
            return False
        if self._promoter is None or self._promoter.done():
            self._promoter = asyncio.get_running_loop().create_task(
                self._promote_queued(), name="ibex-graphs"
            )
        return True

    async def _promote_queued(self) -> None:
        # Out of the queue before its check: a write meanwhile queues it again.
        while (key := self._promotions.pop()) is not None:
            try:
                await self._promote_if_grown(*key)
            except (StoreError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                # No tenant ids in logs: the error class only (store_errors keeps no message).
                log.warning("an agent's own graph could not be built: %s", type(exc).__name__)

    async def _promote_if_grown(self, org_id: str, agent_id: str) -> None:
        if await self.graphs.build_due(org_id, agent_id):
            # This process's searches walk the new graph from their next call, not once the
            # agent's cached state has expired (other processes: within its ttl).
            self.searches.forget_agent(org_id, agent_id)

    async def queue_grown(self) -> int:
        """Queues the build of every agent due one (``graphs.AgentGraphs.grown``), each
        org's largest first, orgs taking turns (``build_queue``), as many as the queue
        takes: an agent past the limit without a graph is searched exactly until its graph
        is ready (migration 0021), and its next write may be far off. There is one after a
        migration from a build that had none, a build that died with no write since, a
        restored database. Returns how many of them are queued."""
        if not self._agent_graphs:
            return 0
        grown = await self.graphs.grown()
        for org_id, agent_id in grown:
            self._queue_promotion(org_id, agent_id)
        return sum(key in self._promotions for key in grown)

    async def promotions_idle(self) -> None:
        """Waits until the queued graph builds are done (tests, shutdown)."""
        while self._promoter is not None and not self._promoter.done():
            await asyncio.gather(asyncio.shield(self._promoter), return_exceptions=True)

    async def delete_memories(self, org_id: str, agent_id: str, ids: Sequence[str]) -> int:
        deleted = await self.writes.delete_memories(org_id, agent_id, ids)
        if self._agent_graphs and self._rebuild_churned and deleted:
            self._queue_promotion(org_id, agent_id)  # its graph may be due a rebuild
        return deleted

    async def set_directive(
        self, org_id: str, agent_id: str, content: str, token_counts: Mapping[str, int]
    ) -> int:
        """Stores the directive; returns its version (unchanged when the content is identical)."""
        return (await self.set_directive_state(org_id, agent_id, content, token_counts)).version

    async def set_directive_state(
        self, org_id: str, agent_id: str, content: str, token_counts: Mapping[str, int]
    ) -> DirectiveState:
        state = await self.writes.set_directive_state(org_id, agent_id, content, token_counts)
        if state is None:  # identical to what is stored
            return await self.get_directive_state(org_id, agent_id)
        return state

    async def clear_directive(self, org_id: str, agent_id: str) -> bool:
        """Removes the directive; False when there was none."""
        return await self.writes.clear_directive_version(org_id, agent_id) is not None

    async def clear_directive_version(self, org_id: str, agent_id: str) -> int | None:
        return await self.writes.clear_directive_version(org_id, agent_id)

    async def record_feedback(
        self, org_id: str, agent_id: str, session_id: str | None, feedback: Sequence[tuple[str, str]]
    ) -> list[FeedbackUpdate]:
        return await self.feedback.record_feedback(org_id, agent_id, session_id, feedback)

    async def record_injections(self, injections: Sequence[InjectionRecord]) -> None:
        await self.counters.record(injections)

    async def record_injection_counters(self, injections: Sequence[InjectionRecord]) -> list[MemoryCounters]:
        return await self.counters.record(injections)

    # ---------------------------------------------------------------- health

    async def check_health(self) -> StoreHealth:
        extra = {"pool_size": str(self._pool.get_size()), "pool_idle": str(self._pool.get_idle_size())}
        try:
            await self._pool.fetchval("SELECT 1", timeout=2.0)
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            return StoreHealth(ok=False, detail=f"postgres: {type(exc).__name__}", extra=extra)
        return StoreHealth(ok=True, detail="postgres: ok", extra=extra)
