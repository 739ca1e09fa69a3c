"""The request path's two searches of an agent's cold memories: by meaning (vector) and
by words (BM25), each one call of a SQL function that returns its rows as one row of
arrays (migration 0015: the statement is planned once per connection, not per call).

``MemorySearches`` reads through the pool it is given: the seam where searches may go
to another server than the writes.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import asyncpg
import numpy as np

from ibex_context.candidates import Candidates
from ibex_context.models import FloatVector
from ibex_context.stores.cold_plan import AgentSizes, ColdMatches, ColdPlan, GraphSearchWidth, choose_plan
from ibex_context.stores.postgres.codecs import TokenCountsDecoder, as_uuid, decode_vectors
from ibex_context.stores.postgres.graphs import AGENT_STATE_SQL, own_graph_plan
from ibex_context.stores.postgres.pool import store_errors
from ibex_context.stores.postgres.rows import CANDIDATE_COLUMNS, candidate_columns


# The nearest rows come from the plan's function (``ibex_cold_exact``, migration 0008,
# its plan fixed by its settings; ``ibex_cold_agent_halfvec``, 0019, or
# ``ibex_cold_agent``, 0013, the agent's own graph, dense or sparse; ``stores.cold_plan``
# chooses),
# then each of those K rows looks up its counters by primary key. The
# lateral LIMIT 1 (memory_id is unique) keeps the planner from flattening it into a
# join it could plan as a hash join over the agent's whole usage table (a generic
# plan did, for the 100k-memory agent: 22 ms).
def _search_sql(plan: ColdPlan) -> str:
    return f"""
    SELECT {CANDIDATE_COLUMNS}, m.distance
    FROM ibex_cold_{plan.function}($1, $2, $3, $4) AS m
    LEFT JOIN LATERAL (
        SELECT retrieval_count, last_injected_at FROM memory_usage
        WHERE org_id = $1 AND agent_id = $2 AND memory_id = m.id
        LIMIT 1
    ) AS u ON true
"""


# Public: benchmarks/cold_plans.py times exactly these statements (the rows).
SEARCH_SQL: Mapping[ColdPlan, str] = {plan: _search_sql(plan) for plan in ColdPlan}


def _function_call(plan: ColdPlan, suffix: str) -> str:
    """The bare call of the plan's function: (org, agent, query, limit), and for a plan
    that walks a graph its width, ``hnsw.ef_search`` (migration 0020: the function sets
    it for the search alone, no transaction or session setting around it)."""
    width = ", $5" if plan.walks_graph else ""
    return f"SELECT * FROM ibex_cold_{plan.function}_{suffix}($1, $2, $3, $4{width})"


# What the store runs: ``ibex_cold_<plan>_arrays`` (migration 0015) is ``SEARCH_SQL``
# aggregated by ``rows.as_arrays`` with ``distance`` (tested equal), in a SQL function
# whose settings keep its plan generic. The pool's ``force_custom_plan`` then replans only
# this bare call (the rows' plan cannot depend on the agent: the plan's function fixes the
# ranking, every other read is a primary-key probe): 90 us less backend CPU a search.
SEARCH_ARRAYS_SQL: Mapping[ColdPlan, str] = {plan: _function_call(plan, "arrays") for plan in ColdPlan}
# The same searches with the winners' vectors (migration 0018), for a call that scores
# them with a query vector other than the one it searched with (the static table's first
# stage, ``pipeline.retrieval``).
SEARCH_WITH_VECTORS_SQL: Mapping[ColdPlan, str] = {
    plan: _function_call(plan, "arrays_with_vectors") for plan in ColdPlan
}
# Where the exact scan's cost reaches an HNSW graph's (ADR-0009): agents past it get a
# graph of their own (``stores.postgres.graphs``); Settings overrides.
DEFAULT_EXACT_MAX_MEMORIES = 5_000
# The agent's memory count and whether it has a graph of its own.
AGENT_SIZE_SQL = AGENT_STATE_SQL


# The lexical search's rows (``ibex_bm25_arrays`` aggregates them): ``ibex_bm25``
# (migrations 0005, 0009, 0012) ranks the agent's memories that hold any of the
# query's lexemes by BM25 from the agent's postings
# (``memory_terms``), then the winners' rows are read by primary key, one LATERAL
# look-up each (the planner cannot estimate the function; it had joined winners by
# scanning the agent's rows once per winner). Rows come with their embedding, in
# pgvector's binary form (``vector_send``): one buffer for all of them becomes the
# vector matrix (``decode_vectors``); scoring computes their semantic relevance from
# it as for hot memories.
LEXICAL_SQL = f"""
    SELECT {CANDIDATE_COLUMNS}, top.bm25, vector_send(m.embedding) AS embedding
    FROM ibex_bm25($1, $2, $3, $4) AS top
    CROSS JOIN LATERAL (
        SELECT id, content, category, confidence, usefulness, occurred_at, created_at, token_counts, embedding
        FROM memories WHERE org_id = $1 AND agent_id = $2 AND id = top.memory_id
        LIMIT 1
    ) AS m
    LEFT JOIN LATERAL (
        SELECT retrieval_count, last_injected_at FROM memory_usage
        WHERE org_id = $1 AND agent_id = $2 AND memory_id = m.id
        LIMIT 1
    ) AS u ON true
    ORDER BY top.bm25 DESC, m.id
"""
# What the store runs: ``ibex_bm25_arrays`` (migration 0015), ``LEXICAL_SQL`` aggregated
# by ``rows.as_arrays`` with ``bm25`` and ``embedding`` (tested equal), planned once per
# connection as the vector search's: 140 us less backend CPU a search.
LEXICAL_ARRAYS_SQL = "SELECT * FROM ibex_bm25_arrays($1, $2, $3, $4)"


class MemorySearches:
    """The vector and the lexical search of one agent's memories (``ColdMemorySearch``).

    Each graph search passes its width (``hnsw.ef_search``) from ``graph_width`` for the
    agent's size and plan, never below its limit; without ``graph_width`` every graph
    search keeps ``ef_search``. The connections' session setting plays no part.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        ef_search: int,
        agent_sizes: AgentSizes | None = None,
        graph_width: GraphSearchWidth | None = None,
        token_counts: TokenCountsDecoder | None = None,
    ) -> None:
        self._pool = pool
        self._graph_width = graph_width or GraphSearchWidth(ef_search, ef_search, 0)
        self._agent_sizes = agent_sizes if agent_sizes is not None else AgentSizes()
        self._token_counts = token_counts or TokenCountsDecoder()

    @staticmethod
    async def prepare(conn: asyncpg.Connection, probe: FloatVector) -> None:
        """Runs the searches' statements on ``conn`` for a tenant that does not exist."""
        nobody = uuid.UUID(int=0)
        for plan in ColdPlan:
            width = (1,) if plan.walks_graph else ()
            for statements in (SEARCH_ARRAYS_SQL, SEARCH_WITH_VECTORS_SQL):
                await conn.fetch(statements[plan], nobody, nobody, probe, 1, *width)
        await conn.fetchrow(AGENT_SIZE_SQL, nobody, nobody)
        await conn.fetch(LEXICAL_ARRAYS_SQL, nobody, nobody, "warm up", 1)

    @store_errors
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
        """The ``limit`` memories nearest to ``embedding`` by cosine, nearest first, with
        their ``similarity`` (and their vectors, ``with_vectors``): a ``ColdMatches`` that
        names the plan chosen for the agent (``stores.cold_plan``: its own graph once ready,
        else the exact scan). ``wider``: a graph walk at the width of a repeated walk
        (``GraphSearchWidth.rewalk_ef_search``). ``on``: a read replica's pool with the same
        session settings (``stores.postgres.read_routing``); default this store's pool."""
        if limit <= 0:
            return ColdMatches.of(Candidates.empty(), ColdPlan.EXACT)
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        async with (on or self._pool).acquire() as conn:
            size = await self._agent_size(conn, org, agent)
            plan = choose_plan(self._agent_sizes.own_graph((org, agent)))
            statement = (SEARCH_WITH_VECTORS_SQL if with_vectors else SEARCH_ARRAYS_SQL)[plan]
            width = self._graph_width.for_agent(size, limit, plan, rewalk=wider)
            widths = (width,) if plan.walks_graph else ()
            row = await conn.fetchrow(statement, org, agent, embedding, limit, *widths)
        if row is None or row[0] is None:  # no rows: every aggregate is NULL
            return ColdMatches.of(Candidates.empty(), plan)
        (distances, *embeddings), found = candidate_columns(row, self._token_counts)
        similarity = found.similarity = 1.0 - np.array(distances, dtype=np.float64)
        if embeddings:
            found.vectors, found.vector_rows = decode_vectors(embeddings[0])
        if (np.diff(similarity) > 0).any():
            # relaxed_order iterative scans may return rows slightly out of order.
            found = found.take(np.argsort(-similarity, kind="stable"))
        return ColdMatches.of(found, plan)

    def forget_agent(self, org_id: str, agent_id: str) -> None:
        """Drops the agent's cached size and graph state: its next search reads them again
        (after its own graph was built here)."""
        self._agent_sizes.forget((as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")))

    async def _agent_size(self, conn: asyncpg.Connection, org: uuid.UUID, agent: uuid.UUID) -> int:
        """The agent's memory count (``memory_stats``), cached for a while with whether it
        has a graph of its own."""
        key = (org, agent)
        size = self._agent_sizes.get(key)
        if size is None:
            row = await conn.fetchrow(AGENT_SIZE_SQL, org, agent)
            size = int(row[0]) if row is not None else 0
            self._agent_sizes.put(key, size, own_graph=own_graph_plan(row))
        return size

    @store_errors
    async def search_lexical(
        self, org_id: str, agent_id: str, query: str, limit: int, *, on: asyncpg.Pool | None = None
    ) -> Candidates:
        """The ``limit`` memories best matching ``query``'s words by BM25, best first,
        with ``lexical_score`` (the BM25 score) and their vectors. ``on``: as ``search``."""
        if limit <= 0 or not query.strip():
            return Candidates.empty()
        row = await (on or self._pool).fetchrow(
            LEXICAL_ARRAYS_SQL, as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id"), query, limit
        )
        if row is None or row[0] is None:  # no rows: every aggregate is NULL
            return Candidates.empty()
        (bm25, embeddings), found = candidate_columns(row, self._token_counts)
        found.lexical_score = np.array(bm25, dtype=np.float64)
        found.vectors, found.vector_rows = decode_vectors(embeddings)
        return found
