"""PostgreSQL + pgvector: the source of truth for memories, directives and feedback.

Every statement is scoped by ``org_id`` AND ``agent_id``. Connections come from an
asyncpg pool whose connections are set up once (``init``): a binary codec for
``vector`` that decodes straight to numpy, a JSON codec for ``jsonb`` (memory reads
select ``token_counts`` as text and parse it through ``TokenCountsDecoder``), and
session settings:

* ``hnsw.ef_search`` = max(settings.hnsw_ef_search, settings.cold_limit): HNSW
  returns at most ef_search rows, so a smaller value silently truncates the top K.
  A search asking for more, or of an agent larger than ``cold_large_agent_memories``
  (``stores.cold_plan.GraphSearchWidth``), sets its own with ``SET LOCAL`` for that one
  transaction.
* ``hnsw.iterative_scan = relaxed_order``: with the tenant filter applied after the
  index scan, the scan continues until LIMIT rows pass the filter. Rows may come
  back slightly out of order; they are re-sorted by distance here.
* ``plan_cache_mode = force_custom_plan``: asyncpg prepares statements and PG would
  switch to a generic plan after five runs. The vector search no longer depends on
  it: its two plans are SQL functions whose settings fix them (migration 0008) and
  the store chooses between them from the agent's size (``stores.cold_plan``,
  ADR-0009). The injection counters' statement sets a generic plan for its own
  transaction (``record_injection_counters``). Other statements keep custom plans
  (replanning costs ~0.3-0.5 ms of backend CPU, benchmarks/results/stores-after.md;
  for the two searches ~0.24 and ~0.31 ms, stores-cpu-2026-11-26.md).
* ``statement_timeout``: a server-side backstop. The request deadline is enforced
  by cancelling the awaiting task, which makes asyncpg send a cancel request, so
  the query stops on the server too (tested).
"""

from __future__ import annotations

import functools
import json
import re
import ssl as ssl_module
import struct
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Concatenate, ParamSpec, TypeVar

import asyncpg
import numpy as np
import numpy.typing as npt

from ibex_context.candidates import Candidates
from ibex_context.errors import InvalidRequest, StoreError, StoreUnavailable
from ibex_context.models import Directive, FloatVector, MemoryRecord, Source
from ibex_context.settings import Settings
from ibex_context.stores.base import FeedbackUpdate, Injection, PreparedMemory, StoreHealth, UpsertResult
from ibex_context.stores.cold_plan import AgentSizes, ColdMatches, ColdPlan, GraphSearchWidth, choose_plan
from ibex_context.stores.hot_score import hot_set_order_sql
from ibex_context.stores.upsert_plan import StoredMemory, plan_upsert

# Usefulness moves a fifth of the way towards the feedback's target each time: one
# signal cannot flip a memory, five consistent ones move it most of the way (1-0.8^5 = 67 %).
FEEDBACK_ALPHA = 0.2
FEEDBACK_TARGETS: Mapping[str, float] = {"positive": 1.0, "negative": 0.0, "neutral": 0.5}
# The classid of the per-agent advisory lock that serialises writers of one agent.
_WRITER_LOCK_CLASS = 0x49424558 & 0x7FFFFFFF


# The columns ``_record`` reads, from ``memories AS m`` LEFT JOIN ``memory_usage AS u``
# (a memory never injected has no usage row: count 0, no time). ``token_counts`` comes
# as text: ``TokenCountsDecoder`` parses each distinct value once instead of running
# the jsonb codec's json.loads on every row.
_MEMORY_COLUMNS = (
    "m.id, m.content, m.category, m.confidence, m.usefulness,"
    " coalesce(u.retrieval_count, 0) AS retrieval_count,"
    " extract(epoch FROM coalesce(m.occurred_at, m.created_at))::float8 AS occurred_at,"
    " extract(epoch FROM u.last_injected_at)::float8 AS last_injected_at,"
    " m.token_counts::text AS token_counts"
)
# What the searches read of each memory for ``Candidates`` (``_candidate_columns``),
# in this order: the id as text (no uuid object per row), times as epoch floats
# (NaN: never injected), ``token_counts`` as text (``TokenCountsDecoder``).
_CANDIDATE_COLUMNS = (
    "m.id::text, m.content, m.category, m.confidence, m.usefulness,"
    " coalesce(u.retrieval_count, 0) AS retrieval_count,"
    " extract(epoch FROM coalesce(m.occurred_at, m.created_at))::float8 AS occurred_at,"
    " coalesce(extract(epoch FROM u.last_injected_at)::float8, 'NaN') AS last_injected_at,"
    " m.token_counts::text AS token_counts"
)
# Their names in the rows (``_as_arrays`` aggregates each).
_CANDIDATE_NAMES = (
    "id",
    "content",
    "category",
    "confidence",
    "usefulness",
    "retrieval_count",
    "occurred_at",
    "last_injected_at",
    "token_counts",
)
# Scoped by the tenant on both sides ($1 = org_id, $2 = agent_id).
_USAGE_JOIN = "LEFT JOIN memory_usage AS u ON u.org_id = $1 AND u.agent_id = $2 AND u.memory_id = m.id"


# The nearest rows come from the plan's function (migration 0008: ``ibex_cold_exact``
# or ``ibex_cold_hnsw``, each with its plan fixed by its settings; ``stores.cold_plan``
# chooses), then each of those K rows looks up its counters by primary key. The
# lateral LIMIT 1 (memory_id is unique) keeps the planner from flattening it into a
# join it could plan as a hash join over the agent's whole usage table (a generic
# plan did, for the 100k-memory agent: 22 ms).
def _search_sql(plan: ColdPlan) -> str:
    return f"""
    SELECT {_CANDIDATE_COLUMNS}, m.distance
    FROM ibex_cold_{plan.value}($1, $2, $3, $4) AS m
    LEFT JOIN LATERAL (
        SELECT retrieval_count, last_injected_at FROM memory_usage
        WHERE org_id = $1 AND agent_id = $2 AND memory_id = m.id
        LIMIT 1
    ) AS u ON true
"""


# Public: benchmarks/cold_plans.py times exactly these statements (the rows; the store
# asks for them as arrays, ``_as_arrays``).
SEARCH_SQL: Mapping[ColdPlan, str] = {plan: _search_sql(plan) for plan in ColdPlan}


def _as_arrays(rows_sql: str, extra: Sequence[str]) -> str:
    """``rows_sql``'s rows as one row of arrays, one per column (NULLs when no row), in
    the rows' order (an aggregate over a sorted subquery keeps it).

    asyncpg builds a ``Record`` per row and its columns are read back one row at a
    time; arrays decode in C straight into lists, the columns ``Candidates`` wants. For
    50 rows of the vector search this cut the client's CPU per search by about a
    third, fetch included (benchmarks/results/columnar-2026-11-26.md).
    """
    columns = ", ".join(f"array_agg(r.{name})" for name in (*_CANDIDATE_NAMES, *extra))
    return f"SELECT {columns} FROM ({rows_sql}) AS r"


_SEARCH_ARRAYS_SQL: Mapping[ColdPlan, str] = {
    plan: _as_arrays(sql, ("distance",)) for plan, sql in SEARCH_SQL.items()
}
# Where the exact scan's cost reaches the HNSW graph's (ADR-0009); Settings overrides.
DEFAULT_EXACT_MAX_MEMORIES = 5_000
_AGENT_SIZE_SQL = "SELECT memories FROM memory_stats WHERE org_id = $1 AND agent_id = $2"


# Ranks the agent's memories on narrow rows (id + score), then reads content and
# vector for the winners only: sorting full rows copied every 1.5 kB vector into the
# top-N sort (100k-memory agent: 236 -> 154 ms of backend CPU per rebuild).
_HOT_SET_SQL = f"""
    SELECT {_MEMORY_COLUMNS}, m.embedding
    FROM (
        SELECT m.id, {hot_set_order_sql("$3::float8")} AS score
        FROM memories AS m {_USAGE_JOIN}
        WHERE m.org_id = $1 AND m.agent_id = $2
        ORDER BY score DESC, m.id
        LIMIT $4
    ) AS top
    JOIN memories AS m ON m.org_id = $1 AND m.agent_id = $2 AND m.id = top.id
    {_USAGE_JOIN}
    ORDER BY top.score DESC, m.id
"""


# The lexical search: ``ibex_bm25`` (migration 0005) ranks the agent's memories that
# hold any of the query's lexemes by BM25 from the agent's postings (``memory_terms``:
# only the query's lexemes are read, by index-only range scans), then the winners'
# rows are read by primary key, one LATERAL look-up each (the planner cannot estimate
# the function; it had joined winners by scanning the agent's rows once per winner).
# Rows come with their embedding, in pgvector's binary form (``vector_send``): one
# buffer for all of them becomes the vector matrix (``decode_vectors``); scoring
# computes their semantic relevance from it as for hot memories.
_LEXICAL_SQL = f"""
    SELECT {_CANDIDATE_COLUMNS}, top.bm25, vector_send(m.embedding) AS embedding
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
_LEXICAL_ARRAYS_SQL = _as_arrays(_LEXICAL_SQL, ("bm25", "embedding"))


# ``record_injection_counters``' one statement (see there).
_RECORD_INJECTIONS_SQL = """
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


class _VectorParam:
    """Wraps a vector inside a ``vector[]`` parameter: asyncpg would iterate a bare
    numpy array as a nested array dimension."""

    __slots__ = ("array",)

    def __init__(self, array: FloatVector) -> None:
        self.array = array


_Self = TypeVar("_Self")
_P = ParamSpec("_P")
_R = TypeVar("_R")

_DIRECTIVE_SQL = "SELECT content, version, token_counts FROM directives WHERE org_id = $1 AND agent_id = $2"


def _encode_vector(value: Any) -> bytes:
    if isinstance(value, _VectorParam):
        value = value.array
    array = np.asarray(value, dtype=">f4")
    if array.ndim != 1:
        raise ValueError("a vector must be one-dimensional")
    return struct.pack(">HH", array.shape[0], 0) + array.tobytes()


def _decode_vector(data: bytes) -> FloatVector:
    (dim,) = struct.unpack_from(">H", data)
    return np.frombuffer(data, dtype=">f4", count=dim, offset=4).astype(np.float32)


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec(
        "vector", schema="public", encoder=_encode_vector, decoder=_decode_vector, format="binary"
    )
    await conn.set_type_codec("jsonb", schema="pg_catalog", encoder=json.dumps, decoder=json.loads)


# Lowercase hyphenated UUID text, as str(uuid.UUID) writes it (a regex match is
# several times cheaper than parsing).
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def as_uuid(value: str, field: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        raise InvalidRequest(field, "must be a UUID") from None


def _candidate_columns(
    row: asyncpg.Record, token_counts: TokenCountsDecoder
) -> tuple[list[list[Any]], Candidates]:
    """``_as_arrays``'s one row as ``Candidates`` (as from the vector search: no
    similarity, no BM25, no vectors yet), and the arrays of its further columns."""
    ids, contents, categories, confidence, usefulness, counts, occurred, injected, texts, *more = row
    n = len(ids)
    return more, Candidates(
        ids,
        contents,
        categories,
        np.array(confidence, dtype=np.float64),
        np.array(usefulness, dtype=np.float64),
        np.array(counts, dtype=np.float64),
        np.array(occurred, dtype=np.float64),
        np.array(injected, dtype=np.float64),
        list(map(token_counts, texts)),
        np.full(n, np.nan),
        np.full(n, np.nan),
        # A plain int: np.full with an IntEnum fill costs ~5x more.
        np.full(n, int(Source.COLD), dtype=np.int8),
        _NO_VECTORS,
        np.full(n, -1, dtype=np.intp),
    )


_NO_VECTORS = np.zeros((0, 0), dtype=np.float32)
# pgvector's binary vector: uint16 dimensions, uint16 unused, then big-endian float32s.
_VECTOR_HEADER_BYTES = 4


def decode_vectors(values: Sequence[bytes | None]) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.intp]]:
    """Vectors in ``vector_send`` form as one matrix and each value's row of it (-1: none);
    all of one length (one deployment writes one dimension) are decoded in one go."""
    lengths = [len(v) if v is not None else -1 for v in values]
    length = max(dict.fromkeys(lengths), key=lengths.count)
    if length < 0:
        return _NO_VECTORS, np.full(len(values), -1, dtype=np.intp)
    alike = [i for i, n in enumerate(lengths) if n == length]
    present = [v for v in values if v is not None and len(v) == length]
    buffer = b"".join(present)
    words = np.frombuffer(buffer, dtype=">f4").reshape(len(alike), length // 4)
    rows = np.full(len(values), -1, dtype=np.intp)
    rows[alike] = np.arange(len(alike))
    return words[:, _VECTOR_HEADER_BYTES // 4 :].astype(np.float32), rows


def _epoch(value: float | None) -> float | None:
    return None if value is None else float(value)


class TokenCountsDecoder:
    """Parses ``token_counts`` JSON text, each distinct text once.

    Rows repeat the same few small objects (two encodings, counts in the low
    hundreds), so a bounded memo turns ~50 ``json.loads`` per search into dictionary
    look-ups. Equal texts share one read-only mapping: nothing is copied per row.
    """

    __slots__ = ("_limit", "_parsed")

    def __init__(self, limit: int = 8192) -> None:
        self._limit = limit
        self._parsed: dict[str, Mapping[str, int]] = {}

    def __call__(self, text: str) -> Mapping[str, int]:
        counts = self._parsed.get(text)
        if counts is None:
            if len(self._parsed) >= self._limit:
                self._parsed.clear()
            counts = self._parsed[text] = MappingProxyType(json.loads(text))
        return counts


def _record(
    row: asyncpg.Record, token_counts: TokenCountsDecoder, *, with_embedding: bool = False
) -> MemoryRecord:
    distance = row.get("distance")
    return MemoryRecord(
        id=str(row["id"]),
        content=row["content"],
        category=row["category"],
        confidence=float(row["confidence"]),
        usefulness=float(row["usefulness"]),
        retrieval_count=int(row["retrieval_count"]),
        occurred_at=_epoch(row["occurred_at"]),
        last_injected_at=_epoch(row["last_injected_at"]),
        token_counts=token_counts(row["token_counts"]),
        embedding=row["embedding"] if with_embedding else None,
        similarity=None if distance is None else 1.0 - float(distance),
        source=Source.COLD,
    )


def _store_errors(
    method: Callable[Concatenate[_Self, _P], Awaitable[_R]],
) -> Callable[Concatenate[_Self, _P], Awaitable[_R]]:
    """Turns driver errors into StoreError / StoreUnavailable without their messages.

    asyncpg messages can quote query arguments (memory content); these errors reach
    logs, so only the error class and SQLSTATE are kept, and the chain is cut.
    Cancellation passes through untouched.
    """

    @functools.wraps(method)
    async def wrapper(self: _Self, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await method(self, *args, **kwargs)
        except (OSError, asyncpg.InterfaceError, asyncpg.exceptions.PostgresConnectionError) as exc:
            raise StoreUnavailable(f"postgres: {type(exc).__name__}") from None
        except asyncpg.PostgresError as exc:
            raise StoreError(f"postgres: {type(exc).__name__} (SQLSTATE {exc.sqlstate})") from None

    return wrapper


@dataclass(frozen=True, slots=True)
class DirectiveState:
    """The directive row as the cache stores it: ``content`` None when there is none.

    ``version`` only grows (a cleared directive keeps its row), so a cache write of
    an older state can be refused; 0 means the agent never had a directive.
    """

    content: str | None
    version: int
    token_counts: Mapping[str, int]

    def to_directive(self) -> Directive | None:
        if self.content is None:
            return None
        return Directive(content=self.content, version=self.version, token_counts=self.token_counts)


# Not frozen: a frozen dataclass's __init__ costs ~6x more (object.__setattr__ per
# field) and one is built per injected memory; treat instances as values all the same.
@dataclass(slots=True)
class MemoryCounters:
    """A memory's injection counters after a recorded batch (``memory_usage``)."""

    org_id: str
    agent_id: str
    memory_id: str
    retrieval_count: int
    last_injected_at: float | None


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool reset on release, after asyncpg's own rollback of an open transaction.

    asyncpg's default reset sends ``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
    RESET ALL`` on every release: one more round trip per query on the hot path.
    This store leaves no session state behind: settings are per connection (set at
    connect) or ``SET LOCAL``, advisory locks are transaction-scoped, and it opens
    no cursors outside transactions and listens to nothing.
    """


def postgres_tls(ca_file: Path | None) -> ssl_module.SSLContext | None:
    """libpq's ``sslmode=verify-full`` with ``sslrootcert=ca_file``: TLS required, the server's
    certificate verified against ``ca_file`` and its host name checked. None: the DSN decides."""
    if ca_file is None:
        return None
    return ssl_module.create_default_context(cafile=ca_file)


async def create_pool(
    dsn: str,
    *,
    min_size: int,
    max_size: int,
    ef_search: int,
    statement_timeout_ms: int = 30_000,
    server_settings: Mapping[str, str] | None = None,
    ssl: ssl_module.SSLContext | None = None,
) -> asyncpg.Pool:
    """An asyncpg pool whose connections are ready for ``PostgresMemoryStore``.

    ``server_settings`` adds or overrides session settings (e.g. ``work_mem``).
    """
    try:
        pool: asyncpg.Pool = await asyncpg.create_pool(
            dsn,
            **({"ssl": ssl} if ssl is not None else {}),
            min_size=min(min_size, max_size),
            max_size=max_size,
            init=_init_connection,
            reset=_keep_session,
            server_settings={
                "application_name": "ibex-context",
                "hnsw.ef_search": str(ef_search),
                "hnsw.iterative_scan": "relaxed_order",
                # Every statement is one tenant's: parallel workers only compete with the
                # other calls for the stores' cores (the first 50 RPS run after the
                # partitioned layout spent 0.8 backends on parallel workers of the exact
                # scan and answered 2 % of calls in full).
                "max_parallel_workers_per_gather": "0",
                "plan_cache_mode": "force_custom_plan",
                "statement_timeout": str(statement_timeout_ms),
                **(server_settings or {}),
            },
        )
    except (OSError, asyncpg.PostgresError) as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL: {type(exc).__name__}") from exc
    return pool


class PostgresMemoryStore:
    """Memories, directives, feedback and injection counters in PostgreSQL.

    Injection counters live in ``memory_usage`` (migration 0003), LEFT JOINed by every
    memory read; recording injections never rewrites a ``memories`` row.

    Implements ``ColdMemorySearch``, ``MemoryWriter``, ``InjectionRecorder`` and
    ``HealthProbe``. ``ef_search`` must equal the pool's session setting (see
    ``create_pool``); searches with a larger limit raise it per transaction.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        ef_search: int,
        exact_max_memories: int = DEFAULT_EXACT_MAX_MEMORIES,
        agent_sizes: AgentSizes | None = None,
        graph_width: GraphSearchWidth | None = None,
    ) -> None:
        self._pool = pool
        self._ef_search = ef_search
        # Without one, every agent's graph search keeps the session's ef_search.
        self._graph_width = graph_width or GraphSearchWidth(ef_search, ef_search, 0)
        self._exact_max_memories = exact_max_memories
        self._agent_sizes = agent_sizes if agent_sizes is not None else AgentSizes()
        self._token_counts = TokenCountsDecoder()

    @classmethod
    async def from_settings(cls, settings: Settings) -> PostgresMemoryStore:
        ef_search = min(1000, max(settings.hnsw_ef_search, settings.cold_limit))
        pool = await create_pool(
            settings.postgres_dsn,
            min_size=settings.postgres_pool_min,
            max_size=settings.postgres_pool_max,
            ef_search=ef_search,
            ssl=postgres_tls(settings.postgres_ca_file),
        )
        return cls(
            pool,
            ef_search=ef_search,
            exact_max_memories=settings.cold_exact_max_memories,
            graph_width=GraphSearchWidth(
                ef_search=settings.hnsw_ef_search,
                large_agent_ef_search=settings.hnsw_ef_search_large_agents,
                large_agent_memories=settings.cold_large_agent_memories,
            ),
        )

    async def aclose(self) -> None:
        await self._pool.close()

    @property
    def pool(self) -> asyncpg.Pool:
        """The pool, for the memory API's statements (``stores.tenant_data``)."""
        return self._pool

    @_store_errors
    async def warm_up(self) -> None:
        """Runs the read statements once on every idle pooled connection for a tenant that
        does not exist: asyncpg then has them prepared per connection, so the first
        requests pay no parse round trip."""
        nobody = uuid.UUID(int=0)
        dim = int(await self._pool.fetchval("SELECT value FROM ibex_meta WHERE key = 'embedding_dim'"))
        probe = np.zeros(dim, dtype=np.float32)
        connections = [await self._pool.acquire() for _ in range(self._pool.get_idle_size())]
        try:
            for conn in connections:
                for statement in _SEARCH_ARRAYS_SQL.values():
                    await conn.fetch(statement, nobody, nobody, probe, 1)
                await conn.fetchval(_AGENT_SIZE_SQL, nobody, nobody)
                await conn.fetch(_LEXICAL_ARRAYS_SQL, nobody, nobody, "warm up", 1)
                await conn.fetchrow(_DIRECTIVE_SQL, nobody, nobody)
        finally:
            for conn in connections:
                await self._pool.release(conn)

    # ---------------------------------------------------------------- reads

    @_store_errors
    async def search(self, org_id: str, agent_id: str, embedding: FloatVector, limit: int) -> Candidates:
        """The ``limit`` memories nearest to ``embedding`` by cosine, nearest first, with
        their ``similarity``: a ``ColdMatches`` that names the plan chosen for the
        agent's size (``stores.cold_plan``)."""
        if limit <= 0:
            return ColdMatches.of(Candidates.empty(), ColdPlan.EXACT)
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        async with self._pool.acquire() as conn:
            size = await self._agent_size(conn, org, agent)
            plan = choose_plan(size, self._exact_max_memories)
            statement = _SEARCH_ARRAYS_SQL[plan]
            ef_search = self._graph_width.for_agent(size, limit)
            if plan is ColdPlan.HNSW and ef_search != self._ef_search:
                # A large agent, or more rows than the session's ef_search: for this search only.
                async with conn.transaction():
                    await conn.execute(f"SET LOCAL hnsw.ef_search = {int(ef_search)}")
                    row = await conn.fetchrow(statement, org, agent, embedding, limit)
            else:
                row = await conn.fetchrow(statement, org, agent, embedding, limit)
        if row is None or row[0] is None:  # no rows: every aggregate is NULL
            return ColdMatches.of(Candidates.empty(), plan)
        (distances,), found = _candidate_columns(row, self._token_counts)
        similarity = found.similarity = 1.0 - np.array(distances, dtype=np.float64)
        if (np.diff(similarity) > 0).any():
            # relaxed_order iterative scans may return rows slightly out of order.
            found = found.take(np.argsort(-similarity, kind="stable"))
        return ColdMatches.of(found, plan)

    async def _agent_size(self, conn: asyncpg.Connection, org: uuid.UUID, agent: uuid.UUID) -> int:
        """The agent's memory count (``memory_stats``), cached for a while."""
        key = (org, agent)
        size = self._agent_sizes.get(key)
        if size is None:
            size = int(await conn.fetchval(_AGENT_SIZE_SQL, org, agent) or 0)
            self._agent_sizes.put(key, size)
        return size

    @_store_errors
    async def search_lexical(self, org_id: str, agent_id: str, query: str, limit: int) -> Candidates:
        """The ``limit`` memories best matching ``query``'s words by BM25, best first,
        with ``lexical_score`` (the BM25 score) and their vectors."""
        if limit <= 0 or not query.strip():
            return Candidates.empty()
        row = await self._pool.fetchrow(
            _LEXICAL_ARRAYS_SQL, as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id"), query, limit
        )
        if row is None or row[0] is None:  # no rows: every aggregate is NULL
            return Candidates.empty()
        (bm25, embeddings), found = _candidate_columns(row, self._token_counts)
        found.lexical_score = np.array(bm25, dtype=np.float64)
        found.vectors, found.vector_rows = decode_vectors(embeddings)
        return found

    async def get_directive(self, org_id: str, agent_id: str) -> Directive | None:
        return (await self.get_directive_state(org_id, agent_id)).to_directive()

    @_store_errors
    async def get_directive_state(self, org_id: str, agent_id: str) -> DirectiveState:
        row = await self._pool.fetchrow(
            _DIRECTIVE_SQL,
            as_uuid(org_id, "org_id"),
            as_uuid(agent_id, "agent_id"),
        )
        if row is None:
            return DirectiveState(content=None, version=0, token_counts={})
        return DirectiveState(
            content=row["content"], version=row["version"], token_counts=row["token_counts"]
        )

    @_store_errors
    async def fetch_memories(self, org_id: str, agent_id: str, ids: Sequence[str]) -> list[MemoryRecord]:
        """The stored memories among ``ids``, with embeddings (unknown ids are left out)."""
        if not ids:
            return []
        rows = await self._pool.fetch(
            f"SELECT {_MEMORY_COLUMNS}, m.embedding FROM memories AS m {_USAGE_JOIN}"
            " WHERE m.org_id = $1 AND m.agent_id = $2 AND m.id = ANY($3::uuid[])",
            as_uuid(org_id, "org_id"),
            as_uuid(agent_id, "agent_id"),
            [as_uuid(i, f"ids[{n}]") for n, i in enumerate(ids)],
        )
        return [_record(row, self._token_counts, with_embedding=True) for row in rows]

    @_store_errors
    async def top_memories_for_hot_set(self, org_id: str, agent_id: str, limit: int) -> list[MemoryRecord]:
        """The agent's ``limit`` best memories by the write-time score (``stores.hot_score``)."""
        if limit <= 0:
            return []
        rows = await self._pool.fetch(
            _HOT_SET_SQL,
            as_uuid(org_id, "org_id"),
            as_uuid(agent_id, "agent_id"),
            time.time(),
            limit,
        )
        return [_record(row, self._token_counts, with_embedding=True) for row in rows]

    @_store_errors
    async def count_memories(self, org_id: str, agent_id: str) -> int:
        count: int = await self._pool.fetchval(
            "SELECT count(*) FROM memories WHERE org_id = $1 AND agent_id = $2",
            as_uuid(org_id, "org_id"),
            as_uuid(agent_id, "agent_id"),
        )
        return count

    # ---------------------------------------------------------------- writes

    @_store_errors
    async def upsert_memories(
        self, org_id: str, agent_id: str, memories: Sequence[PreparedMemory]
    ) -> list[UpsertResult]:
        """Stores a batch; results in input order (see ``stores.upsert_plan`` for the rules)."""
        if not memories:
            return []
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        for n, memory in enumerate(memories):
            as_uuid(memory.id, f"memories[{n}].id")
        async with self._pool.acquire() as conn, conn.transaction():
            await self._lock_agent(conn, org, agent)
            rows = await conn.fetch(
                "SELECT id, content_hash, category, confidence, usefulness, metadata,"
                " extract(epoch FROM occurred_at)::float8 AS occurred_at FROM memories"
                " WHERE org_id = $1 AND agent_id = $2"
                " AND (content_hash = ANY($3::bytea[]) OR id = ANY($4::uuid[]))",
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
            if plan.updates:
                await conn.execute(
                    """
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
                    """,
                    org,
                    agent,
                    *_columns(plan.updates),
                )
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
                await conn.execute(
                    """
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
                    """,
                    org,
                    agent,
                    *_columns(plan.inserts),
                )
        return list(plan.results)

    @_store_errors
    async def delete_memories(self, org_id: str, agent_id: str, ids: Sequence[str]) -> int:
        """Deletes the memories (with their feedback and counters); returns how many existed."""
        if not ids:
            return 0
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        targets = [as_uuid(i, f"ids[{n}]") for n, i in enumerate(ids)]
        async with self._pool.acquire() as conn, conn.transaction():
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

    async def set_directive(
        self, org_id: str, agent_id: str, content: str, token_counts: Mapping[str, int]
    ) -> int:
        """Stores the directive; returns its version (unchanged when the content is identical)."""
        return (await self.set_directive_state(org_id, agent_id, content, token_counts)).version

    @_store_errors
    async def set_directive_state(
        self, org_id: str, agent_id: str, content: str, token_counts: Mapping[str, int]
    ) -> DirectiveState:
        if not content:
            raise InvalidRequest("content", "must not be empty")
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        row = await self._pool.fetchrow(
            """
            INSERT INTO directives AS d (org_id, agent_id, content, token_counts)
            VALUES ($1, $2, $3, $4)
            ON CONFLICT (org_id, agent_id) DO UPDATE
                SET content = EXCLUDED.content, token_counts = EXCLUDED.token_counts,
                    version = d.version + 1, updated_at = now()
                WHERE d.org_id = $1 AND d.agent_id = $2
                  AND (d.content IS DISTINCT FROM EXCLUDED.content
                       OR d.token_counts IS DISTINCT FROM EXCLUDED.token_counts)
            RETURNING version
            """,
            org,
            agent,
            content,
            dict(token_counts),
        )
        if row is None:  # identical to what is stored
            return await self.get_directive_state(org_id, agent_id)
        return DirectiveState(content=content, version=row["version"], token_counts=dict(token_counts))

    async def clear_directive(self, org_id: str, agent_id: str) -> bool:
        """Removes the directive; False when there was none."""
        return await self.clear_directive_version(org_id, agent_id) is not None

    @_store_errors
    async def clear_directive_version(self, org_id: str, agent_id: str) -> int | None:
        """Clears the directive and returns the version of the cleared state, or None."""
        version: int | None = await self._pool.fetchval(
            "UPDATE directives SET content = NULL, token_counts = '{}'::jsonb, version = version + 1,"
            " updated_at = now() WHERE org_id = $1 AND agent_id = $2 AND content IS NOT NULL"
            " RETURNING version",
            as_uuid(org_id, "org_id"),
            as_uuid(agent_id, "agent_id"),
        )
        return version

    @_store_errors
    async def record_feedback(
        self, org_id: str, agent_id: str, session_id: str | None, feedback: Sequence[tuple[str, str]]
    ) -> list[FeedbackUpdate]:
        """Moves each memory's usefulness towards 1 / 0 / 0.5 (EMA, alpha ``FEEDBACK_ALPHA``).

        Applied in order, so repeated feedback on one memory compounds. Unknown
        memory ids are skipped (they may have been deleted meanwhile).
        """
        if not feedback:
            return []
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        session = as_uuid(session_id, "session_id") if session_id else None
        args = []
        for n, (memory_id, kind) in enumerate(feedback):
            if kind not in FEEDBACK_TARGETS:
                raise InvalidRequest(f"feedback[{n}].kind", f"must be one of {sorted(FEEDBACK_TARGETS)}")
            args.append((org, agent, as_uuid(memory_id, f"feedback[{n}].memory_id"), session, kind))
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetchmany(
                f"""
                WITH previous AS (
                    SELECT usefulness FROM memories
                    WHERE org_id = $1 AND agent_id = $2 AND id = $3 FOR UPDATE
                ), updated AS (
                    UPDATE memories AS m
                    SET usefulness = (1 - {FEEDBACK_ALPHA}) * p.usefulness + {FEEDBACK_ALPHA} * (
                        CASE $5::text WHEN 'positive' THEN 1.0 WHEN 'negative' THEN 0.0 ELSE 0.5 END),
                        updated_at = now()
                    FROM previous AS p
                    WHERE m.org_id = $1 AND m.agent_id = $2 AND m.id = $3
                    RETURNING p.usefulness AS previous, m.usefulness AS updated
                ), logged AS (
                    INSERT INTO memory_feedback
                        (org_id, agent_id, memory_id, session_id, feedback, previous, updated)
                    SELECT $1, $2, $3, $4, $5, previous, updated FROM updated
                )
                SELECT $3::uuid AS id, previous, updated FROM updated
                """,
                args,
            )
        return [
            FeedbackUpdate(
                memory_id=str(r["id"]),
                previous_usefulness=float(r["previous"]),
                new_usefulness=float(r["updated"]),
            )
            for r in rows
        ]

    async def record_injections(self, injections: Sequence[Injection]) -> None:
        await self.record_injection_counters(injections)

    @_store_errors
    async def record_injection_counters(self, injections: Sequence[Injection]) -> list[MemoryCounters]:
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
        # benchmarks.bookkeeping). Each distinct id is checked once.
        orgs = [item.org_id for item in injections]
        agents = [item.agent_id for item in injections]
        memories = [item.memory_id for item in injections]
        for field, values in (("org_id", orgs), ("agent_id", agents), ("memory_id", memories)):
            for value in set(values):
                if _CANONICAL_UUID.fullmatch(value) is None:
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
                _RECORD_INJECTIONS_SQL, orgs, agents, memories, [item.at for item in injections]
            )
        # Ids come back as text and rows are unpacked by position: no uuid.UUID built
        # and turned back into text per row.
        return [
            MemoryCounters(org, agent, memory, count, _epoch(at)) for org, agent, memory, count, at in rows
        ]

    @staticmethod
    async def _lock_agent(conn: asyncpg.Connection, org: uuid.UUID, agent: uuid.UUID) -> None:
        """Serialises writers of one agent so read-decide-write upserts cannot race."""
        await conn.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2::uuid::text || $3::uuid::text))",
            _WRITER_LOCK_CLASS,
            org,
            agent,
        )

    # ---------------------------------------------------------------- health

    async def check_health(self) -> StoreHealth:
        extra = {"pool_size": str(self._pool.get_size()), "pool_idle": str(self._pool.get_idle_size())}
        try:
            await self._pool.fetchval("SELECT 1", timeout=2.0)
        except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
            return StoreHealth(ok=False, detail=f"postgres: {type(exc).__name__}", extra=extra)
        return StoreHealth(ok=True, detail="postgres: ok", extra=extra)


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
        [_VectorParam(m.embedding) for m in memories],
        [m.occurred_at for m in memories],
    ]
