"""Load N agents x M memories (across a few orgs) into PostgreSQL, fast, for load tests.

    python -m loadtest.seed --dsn "$IBEX_POSTGRES_DSN" --agents 100 --memories 1000 \
        --agents-file loadtest/out/agents.json [--embedder hashing|minilm] [--vectors embedder|shaped|random]

What it does, in order:

1. applies the migrations (``ibex_context.stores.postgres.migrate``) and, with ``--reset``
   (the default), empties ``memories``, ``directives``, ``memory_feedback``,
   ``memory_usage`` and the postings and stats, and turns this session's triggers
   off (``loadtest.bulkload``);
2. generates the memories in worker processes (``--jobs``), in slices of at most
   ``SLICE_MEMORIES`` of one agent (a 1M-memory agent keeps every core busy):
   plausible text of 50-400 tokens from ``loadtest.corpus`` with a fixed seed
   (category mix, confidence, usefulness, retrieval counts, ``created_at`` spread
   over a year), the token counts the service stores (``layout.stored_token_counts``,
   one tokenisation per encoding for a text already in range), sha256 content
   hashes (unique per org+agent), and embeddings from the configured embedder (the
   hashing embedder in one vectorised batch per slice), drawn from the model of
   MiniLM's vectors (``--vectors shaped``, ``loadtest.vectors``) or random unit vectors; each
   worker encodes its rows straight to binary COPY tuples (``loadtest.pgcopy``);
3. streams the tuples to ``COPY ... (FORMAT binary)`` in (org_id, agent_id) order: on
   an emptied table that lays every agent's rows out contiguously, which is what
   ``CLUSTER`` would do (grpc_stack digest §4: an unclustered 1k-row agent costs
   ~12.7 ms p99 per search instead of ~1.9 ms) without CLUSTER's cost;
   copies the directives and the usage counters;
4. every posting in one ``INSERT ... SELECT`` with the postings' index dropped and
   rebuilt by sorting, the per-agent stats in one ``GROUP BY`` (the same rows the
   triggers would write: ``tests/loadtest/test_bulkload.py``), then ANALYZE; then VACUUM
   of the postings and the memories (``_vacuum_postings`` says why once everything else
   has ended); then a graph of its own for every agent past the exact scan's limit, as
   the service builds it (``stores.postgres.graphs``; the partitions have no shared
   graph since migration 0021);
5. writes the agents file the locustfile reads: org/agent ids, memory counts and a
   few sample queries per agent derived from its own memories.

An agent of at most ``SLICE_MEMORIES`` memories gets the same texts, vectors and
counts as before slicing; a larger one's later slices draw from streams of their own.
Prints each phase's wall time and CPU seconds (the seeder's processes, and
PostgreSQL's when it runs on this machine): on a shared machine the CPU figures are
the ones to compare. Measured: benchmarks/results/large-agents-2026-12-06.md (1M memories). Redis is
not touched: the service fills its caches from PostgreSQL on a miss (start it after
seeding, or flush Redis).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np

if __package__ in (None, ""):  # run as ``python loadtest/seed.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ibex_context.memory_api.writes import STORED_ENCODINGS

from loadtest import bulkload, corpus, pgcopy, seed_worker
from loadtest import vectors as vectors_module
from loadtest.cpu_meter import PhaseClock, PhaseCost, postmaster_pid

_PARTS_SIZE_SQL = """
    SELECT coalesce(sum(CASE $2::text WHEN 'pg_table_size' THEN pg_table_size(inhrelid)
                                     ELSE pg_relation_size(inhrelid) END), 0)::float8
    FROM pg_inherits WHERE inhparent = $1::text::regclass
"""
# The agents' own graphs (``stores.postgres.graphs.graph_index_name``).
_OWN_GRAPHS_SIZE_SQL = """
    SELECT coalesce(sum(pg_relation_size(g.index_name::regclass)), 0)::float8
    FROM agent_graphs AS g WHERE g.ready
"""
MEMORY_COLUMNS: tuple[str, ...] = (
    "org_id",
    "agent_id",
    "id",
    "content",
    "content_hash",
    "category",
    "confidence",
    "usefulness",
    "retrieval_count",
    "last_retrieved_at",
    "last_injected_at",
    "created_at",
    "updated_at",
    "metadata",
    "token_counts",
    "embedding",
)


@dataclass(frozen=True, slots=True)
class SeedPlan:
    agents: int
    memories: int
    orgs: int = 4
    large_agents: int = 0
    large_memories: int = 0
    seed: int = 20261122
    dim: int = 384
    embedder: str = "hashing"
    # "embedder": the embedder's vectors of each text; "shaped": drawn from the model of
    # MiniLM's (loadtest.vectors); "random": random unit vectors.
    vectors: str = "embedder"
    queries_per_agent: int = 8

    def memories_of(self, index: int) -> int:
        return self.large_memories if index < self.large_agents else self.memories

    @property
    def total_memories(self) -> int:
        return sum(self.memories_of(i) for i in range(self.agents))


@dataclass(frozen=True, slots=True)
class AgentPlan:
    index: int
    org_id: str
    agent_id: str
    memories: int


@dataclass(frozen=True, slots=True)
class SlicePlan:
    """Up to ``SLICE_MEMORIES`` of one agent's memories: the unit of work of a worker
    process, so that one large agent keeps every core busy and bounds the memory in
    flight. Slice 0 draws from the agent's own random stream (an agent of at most
    ``SLICE_MEMORIES`` memories is generated exactly as when agents were not sliced)
    and also makes the directive; slice k > 0 draws from a stream of its own."""

    agent: AgentPlan
    index: int
    memories: int


@dataclass(slots=True)
class SliceData:
    plan: SlicePlan
    rows: list[bytes]  # binary COPY tuples (MEMORY_COLUMNS)
    hashes: list[bytes]  # each row's content hash, to drop a text another slice also drew
    tokens: list[int]  # each row's cl100k count
    queries: list[str]  # sample queries from this slice's memories
    directive: str = ""  # slice 0 only
    directive_tokens: dict[str, int] = field(default_factory=dict)


# Memories per slice: ~12 MB of COPY data, ~2 s of a worker's CPU.
SLICE_MEMORIES = 5_000


def plan_slices(agents: Sequence[AgentPlan], size: int = SLICE_MEMORIES) -> list[SlicePlan]:
    """Every agent's slices, in agent order (the COPY order)."""
    return [
        SlicePlan(agent=agent, index=i, memories=min(size, agent.memories - i * size))
        for agent in agents
        for i in range(max(1, -(-agent.memories // size)))
    ]


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def plan_agents(plan: SeedPlan) -> list[AgentPlan]:
    """Every agent's ids and size, in (org_id, agent_id) order: the physical order on disk."""
    rng = random.Random(plan.seed)
    orgs = [_uuid(rng) for _ in range(max(1, min(plan.orgs, plan.agents)))]
    agents = [
        AgentPlan(index=i, org_id=orgs[i % len(orgs)], agent_id=_uuid(rng), memories=plan.memories_of(i))
        for i in range(plan.agents)
    ]
    # uuid's text order is its byte order, which is how PostgreSQL sorts uuid columns.
    return sorted(agents, key=lambda a: (a.org_id, a.agent_id))


def _init_worker(embedder: str, dim: int, vectors: str, shape: str | None = None) -> None:
    seed_worker.ensure_worker_tokenizers()
    seed_worker.WORKER["embedder"] = (
        seed_worker.build_embedder(embedder, dim) if vectors == "embedder" else None
    )
    seed_worker.WORKER["shape"] = vectors_module.VectorShape.load(Path(shape)) if shape else None


def slice_random(piece: SlicePlan, plan: SeedPlan) -> random.Random:
    stream = f"{plan.seed}:{piece.agent.agent_id}"
    return random.Random(stream if piece.index == 0 else f"{stream}:{piece.index}")


def generate_slice(piece: SlicePlan, plan: SeedPlan, now: float) -> SliceData:
    """One slice's rows as binary COPY tuples, its sample queries and (slice 0) the
    agent's directive (runs in a worker process)."""
    count = seed_worker.WORKER["count"]
    agent = piece.agent
    rng = slice_random(piece, plan)
    org, agent_uuid = uuid.UUID(agent.org_id), uuid.UUID(agent.agent_id)
    specs, texts, token_counts, hashes = seed_worker.memory_texts(rng, piece.memories)
    vectors = pgcopy.vector_values(
        seed_worker.embed(texts, plan.dim, np.random.default_rng(rng.getrandbits(64)))
    )
    base = datetime.fromtimestamp(now, UTC)
    org_bytes, agent_bytes = pgcopy.uuid_value(org), pgcopy.uuid_value(agent_uuid)
    metadata = pgcopy.jsonb_value(json.dumps({"source": "loadtest-seed"}))
    rows: list[bytes] = []
    for spec, text, counts, digest, vector in zip(specs, texts, token_counts, hashes, vectors, strict=True):
        created = pgcopy.timestamptz_value(base - timedelta(seconds=spec.age_seconds))
        injected = (
            None
            if spec.last_injected_ago_seconds is None
            else pgcopy.timestamptz_value(base - timedelta(seconds=spec.last_injected_ago_seconds))
        )
        # In MEMORY_COLUMNS order.
        rows.append(
            pgcopy.row(
                (
                    org_bytes,
                    agent_bytes,
                    pgcopy.uuid_value(uuid.UUID(int=rng.getrandbits(128), version=4)),
                    pgcopy.text_value(text),
                    digest,
                    pgcopy.text_value(spec.category),
                    pgcopy.real_value(spec.confidence),
                    pgcopy.real_value(spec.usefulness),
                    pgcopy.integer_value(spec.retrieval_count),
                    injected,
                    injected,
                    created,
                    created,
                    metadata,
                    pgcopy.jsonb_value(json.dumps(counts)),
                    vector,
                )
            )
        )
    directive = corpus.directive_text(rng) if piece.index == 0 else ""
    queries = [
        corpus.query_from_memory(rng, t) for t in rng.sample(texts, min(plan.queries_per_agent, len(texts)))
    ]
    return SliceData(
        plan=piece,
        rows=rows,
        hashes=hashes,
        tokens=[c["cl100k_base"] for c in token_counts],
        queries=queries,
        directive=directive,
        directive_tokens={name: count(name, directive) for name in STORED_ENCODINGS} if directive else {},
    )


# --------------------------------------------------------------------------- database


def _ordered_results(
    pool: ProcessPoolExecutor, slices: Sequence[SlicePlan], plan: SeedPlan, now: float, window: int
) -> Iterator[Future[SliceData]]:
    """Futures in slice order, at most ``window`` running ahead (bounded memory)."""
    pending: list[Future[SliceData]] = []
    it = iter(slices)
    for piece in it:
        pending.append(pool.submit(generate_slice, piece, plan, now))
        if len(pending) >= window:
            break
    for piece in it:
        yield pending.pop(0)
        pending.append(pool.submit(generate_slice, piece, plan, now))
    yield from pending


# Rows per COPY statement: each is fed from the workers as they finish agents, so the
# statements only bound how much one carries (and space the progress lines).
COPY_CHUNK_ROWS = 50_000
# The postings' index build (the agents' own graphs size theirs: ``graphs.build_memory_mb``).
MAINTENANCE_WORK_MEM_MB = 1024


@dataclass(slots=True)
class SeedReport:
    agents: int = 0
    memories: int = 0
    postings: int = 0
    total_seconds: float = 0.0
    heap_mb: float = 0.0
    index_mb: float = 0.0
    tokens_p50: int = 0
    tokens_min: int = 0
    tokens_max: int = 0
    triggers_off: bool = False
    agent_graphs: int = 0
    phases: list[PhaseCost] = field(default_factory=list)

    def lines(self) -> list[str]:
        lines = [
            f"seeded {self.agents} agents, {self.memories:,} memories, {self.postings:,} postings "
            f"(cl100k tokens min/p50/max {self.tokens_min}/{self.tokens_p50}/{self.tokens_max}; "
            + ("postings built after the COPY)" if self.triggers_off else "postings by the triggers)"),
        ]
        for phase in self.phases:
            server = "-" if phase.server_cpu_seconds is None else f"{phase.server_cpu_seconds:.1f}"
            lines.append(
                f"  {phase.name}: {phase.wall_seconds:.1f} s wall; CPU s: "
                f"seeder {phase.own_cpu_seconds:.1f}, PostgreSQL {server}"
            )
        lines += [
            f"  total {self.total_seconds:.1f} s",
            f"  heap {self.heap_mb:.0f} MB, agents' own graphs {self.index_mb:.0f} MB",
        ]
        if self.agent_graphs:
            lines.append(f"  {self.agent_graphs} agents' own graphs")
        return lines


@dataclass(slots=True)
class _AgentLoad:
    """An agent whose slices are arriving."""

    seen: set[bytes] = field(default_factory=set)
    memories: int = 0
    queries: list[str] = field(default_factory=list)
    slices: int = 0


@dataclass(slots=True)
class _Loaded:
    """What the COPY phase collects besides the rows themselves."""

    seed: int
    queries_per_agent: int
    memories: int = 0
    entries: list[dict[str, Any]] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    directives: list[tuple[Any, ...]] = field(default_factory=list)
    _agent: _AgentLoad = field(default_factory=_AgentLoad)

    def add(self, data: SliceData, last: bool) -> bytes:
        """Takes a slice (``last``: its agent's last); returns its rows to COPY."""
        agent, current = data.plan.agent, self._agent
        if data.plan.index == 0:
            current = self._agent = _AgentLoad()
            org, agent_uuid = uuid.UUID(agent.org_id), uuid.UUID(agent.agent_id)
            self.directives.append((org, agent_uuid, data.directive, 1, json.dumps(data.directive_tokens)))
        # Slices draw independently: a text one of them drew already is left out
        # (the schema allows one row per content per agent; none in practice).
        rows: list[bytes] = []
        for row, digest, tokens in zip(data.rows, data.hashes, data.tokens, strict=True):
            if digest not in current.seen:
                current.seen.add(digest)
                rows.append(row)
                self.tokens.append(tokens)
        current.memories += len(rows)
        current.queries.extend(data.queries)
        current.slices += 1
        self.memories += len(rows)
        if last:
            queries = current.queries
            if current.slices > 1:  # a sample of every slice's, so from all the agent's memories
                picker = random.Random(f"{self.seed}:{agent.agent_id}:queries")
                queries = picker.sample(queries, min(self.queries_per_agent, len(queries)))
            self.entries.append(
                {
                    "org_id": agent.org_id,
                    "agent_id": agent.agent_id,
                    "memories": current.memories,
                    "queries": queries,
                }
            )
        return b"".join(rows)


async def _copy_memories(
    conn: asyncpg.Connection,
    results: Iterator[Future[SliceData]],
    slices: Sequence[SlicePlan],
    loaded: _Loaded,
    log: Any,
) -> None:
    """Streams the workers' COPY data to PostgreSQL as they finish, in slice order."""
    t0 = time.perf_counter()
    total_agents = sum(1 for piece in slices if piece.index == 0)
    exhausted = False
    position = 0

    async def chunk() -> AsyncIterator[bytes]:
        nonlocal exhausted, position
        yield pgcopy.HEADER
        rows = 0
        for future in results:
            data = await asyncio.wrap_future(future)
            position += 1
            last = position == len(slices) or slices[position].index == 0
            yield loaded.add(data, last)
            rows += data.plan.memories
            if rows >= COPY_CHUNK_ROWS:
                break
        else:
            exhausted = True
        yield pgcopy.TRAILER

    while not exhausted:
        await conn.copy_to_table("memories", source=chunk(), columns=MEMORY_COLUMNS, format="binary")
        elapsed = time.perf_counter() - t0
        log(
            f"  {len(loaded.entries)}/{total_agents} agents, {loaded.memories:,} memories, "
            f"{loaded.memories / elapsed:,.0f}/s"
        )


async def _build_postings(conn: asyncpg.Connection) -> int:
    count = await bulkload.build_postings_and_stats(conn, maintenance_work_mem=f"{MAINTENANCE_WORK_MEM_MB}MB")
    await conn.execute("ANALYZE memory_stats")
    return count


async def _server_pid(conn: asyncpg.Connection) -> int | None:
    """The server's pid when it runs on this machine and the role may see where."""
    try:
        data_directory = await conn.fetchval("SHOW data_directory")
    except asyncpg.PostgresError:
        return None
    return postmaster_pid(str(data_directory))


async def seed(
    dsn: str,
    plan: SeedPlan,
    agents_file: Path,
    *,
    jobs: int,
    reset: bool,
    embedding_storage: str = "schema",
    slice_memories: int = SLICE_MEMORIES,
    shape: Path | None = None,
    log: Any = print,
) -> SeedReport:
    """Seeds the plan. ``shape``: the model the ``shaped`` vectors are drawn from (default: the one fitted
    to MiniLM's, ``loadtest.vectors.fitted_shape``)."""
    from ibex_context.stores.postgres.migrate import migrate

    started = time.perf_counter()
    await migrate(dsn, plan.dim)
    conn = await asyncpg.connect(dsn)
    report = SeedReport(agents=plan.agents)
    clock = PhaseClock(await _server_pid(conn))
    try:
        if reset:
            # The agents' own graphs go too: TRUNCATE would keep each one's index, empty,
            # and the COPY would insert every row into it one by one (100k rows: 20 min of
            # PostgreSQL's CPU, for a graph built otherwise than the service builds it).
            for name in await _own_graph_indexes(conn):
                await conn.execute(f"DROP INDEX IF EXISTS {name}")
            await conn.execute(
                "TRUNCATE memories, directives, memory_feedback, memory_usage, memory_terms, memory_stats,"
                " memory_lexicon, org_usage, agent_graphs"
            )
            # Emptied tables: the postings and stats are derived once after the COPY
            # (loadtest.bulkload), not by the triggers statement by statement.
            report.triggers_off = await bulkload.triggers_off(conn)
            if not report.triggers_off:
                log("seed: this role may not turn triggers off: they keep the postings (slower)")
        else:
            log("seed: --no-reset: rows are appended, agents' rows are not guaranteed to be contiguous")
        if embedding_storage == "plain":
            # An experiment, not the migrated schema: see loadtest/pgcheck.py.
            await conn.execute("ALTER TABLE memories ALTER COLUMN embedding SET STORAGE PLAIN")
            log("seed: EXPERIMENT: memories.embedding set to STORAGE PLAIN")
        agents = plan_agents(plan)
        now = time.time()
        # The model of MiniLM's vectors, fitted on first use (its reference embedded once, cached).
        if plan.vectors == "shaped" and shape is None:
            shape = vectors_module.fitted_shape(jobs=jobs)
        with clock.phase("generate, embed, count tokens, COPY memories"):
            with ProcessPoolExecutor(
                max_workers=jobs,
                initializer=_init_worker,
                initargs=(plan.embedder, plan.dim, plan.vectors, str(shape) if shape else None),
            ) as pool:
                slices = plan_slices(agents, slice_memories)
                results = _ordered_results(pool, slices, plan, now, window=2 * jobs)
                loaded = _Loaded(seed=plan.seed, queries_per_agent=plan.queries_per_agent)
                await _copy_memories(conn, results, slices, loaded, log)
            report.memories = loaded.memories
            if report.triggers_off:
                await bulkload.triggers_on(conn)
            await conn.copy_records_to_table(
                "directives",
                records=loaded.directives,
                columns=("org_id", "agent_id", "content", "version", "token_counts"),
            )
            # Usage counters live in memory_usage (migration 0003): copy the seeded ones there.
            await conn.execute(
                """
                INSERT INTO memory_usage (org_id, agent_id, memory_id, retrieval_count, last_retrieved_at,
                                          last_injected_at)
                SELECT org_id, agent_id, id, retrieval_count, last_retrieved_at, last_injected_at
                FROM memories WHERE retrieval_count > 0
                ON CONFLICT (org_id, agent_id, memory_id) DO NOTHING
                """
            )
            await conn.execute("ANALYZE memory_usage")
            await conn.execute("ANALYZE directives")
        with clock.phase("postings + stats, their index, ANALYZE memories"):
            report.postings = await (_build_postings(conn) if report.triggers_off else _count_postings(conn))
            await conn.execute("ANALYZE memories")
        with clock.phase("VACUUM postings and memories"):
            await _vacuum_postings(conn)
        if max(plan.memories, plan.large_memories) > _exact_max_memories():
            with clock.phase("agents' own graphs"):
                report.agent_graphs = await _agent_graphs(dsn)
        # Partitioned (0008): the sizes are the partitions' sums.
        report.heap_mb = (await conn.fetchval(_PARTS_SIZE_SQL, "memories", "pg_table_size")) / 1e6
        report.index_mb = (await conn.fetchval(_OWN_GRAPHS_SIZE_SQL)) / 1e6
    finally:
        await conn.close()

    loaded.tokens.sort()
    if loaded.tokens:
        report.tokens_min, report.tokens_p50, report.tokens_max = (
            loaded.tokens[0],
            loaded.tokens[len(loaded.tokens) // 2],
            loaded.tokens[-1],
        )
    report.phases = clock.phases
    report.total_seconds = time.perf_counter() - started
    write_agents_file(agents_file, plan, loaded.entries)
    return report


def _exact_max_memories() -> int:
    """Past this an agent gets a graph of its own: the service's setting (``IBEX_*``)."""
    from ibex_context.settings import Settings

    return Settings().cold_exact_max_memories


async def _own_graph_indexes(conn: asyncpg.Connection) -> list[str]:
    """Every index the agents' own graphs may have, leftovers of a rebuild included."""
    from ibex_context.stores.postgres.graphs import graph_index_names

    rows = await conn.fetch("SELECT org_id, agent_id FROM agent_graphs")
    return [name for row in rows for name in graph_index_names(row["org_id"], row["agent_id"])]


async def _agent_graphs(dsn: str) -> int:
    """Builds a graph of its own for every agent past the exact scan's limit, as a running
    service with the same settings (``IBEX_*``) does when its writes take an agent past it
    (migrations 0013, 0022: sparse up to ``cold_sparse_graph_max_memories``, dense beyond;
    each build's memory up to ``graph_build_memory_mb``, which a 1M-memory agent's graph
    outgrows at the default): a bulk load writes no memory through the service."""
    from ibex_context.settings import Settings
    from ibex_context.stores.postgres import create_pool
    from ibex_context.stores.postgres.graphs import AgentGraphs

    settings = Settings()
    pool = await create_pool(dsn, min_size=1, max_size=1, ef_search=64)
    try:
        graphs = AgentGraphs(
            pool,
            min_memories=settings.cold_exact_max_memories,
            sparse_max_memories=settings.cold_sparse_graph_max_memories,
            rebuild_replaced_share=settings.cold_graph_rebuild_replaced_share,
            build_memory_mb=settings.graph_build_memory_mb,
        )
        return await graphs.promote_grown()
    finally:
        await pool.close()


async def _count_postings(conn: asyncpg.Connection) -> int:
    """The triggers wrote the postings: count them."""
    return int(await conn.fetchval("SELECT count(*) FROM memory_terms"))


async def _vacuum_postings(conn: asyncpg.Connection) -> None:
    """Marks the postings' pages all-visible, so the lexical search reads the index alone.

    A running installation's postings are vacuumed by autovacuum (migration 0005 tunes
    it); a bulk load is vacuumed here, and only once every other transaction of the seed
    has ended: a VACUUM run while another transaction is still open (a graph build's, when
    the partitions' graphs were built beside the postings) cannot mark rows inserted after
    that transaction began as visible to all, and an insert-only table is not vacuumed
    again. That left a seeded 1,000 x 1k data set's postings unmarked: one
    heap fetch per posting, 1,860 buffers and 12-15 ms per search instead of ~2.5 ms.
    """
    await conn.execute("VACUUM (ANALYZE) memory_terms")
    # The memories too: left to autovacuum, a freshly loaded data set may still be vacuumed
    # when the first run starts it; vacuumed here, every run starts from the same all-visible
    # heap (1.5 s for 1M memories that autovacuum had just done, 2026-12-06).
    await conn.execute("VACUUM memories")


def write_agents_file(path: Path, plan: SeedPlan, agents: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"plan": asdict(plan), "created_at": datetime.now(UTC).isoformat(), "agents": agents}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", default=os.environ.get("IBEX_POSTGRES_DSN"), help="default: $IBEX_POSTGRES_DSN")
    p.add_argument("--agents", type=int, default=5)
    p.add_argument("--memories", type=int, default=200, help="memories per agent")
    p.add_argument("--orgs", type=int, default=4)
    p.add_argument(
        "--large-agents", type=int, default=0, help="agents with --large-memories memories instead"
    )
    p.add_argument("--large-memories", type=int, default=0)
    p.add_argument("--seed", type=int, default=20261122)
    p.add_argument("--dim", type=int, default=int(os.environ.get("IBEX_EMBEDDING_DIM", "384")))
    p.add_argument(
        "--embedder", choices=("hashing", "minilm"), default=os.environ.get("IBEX_EMBEDDER", "hashing")
    )
    p.add_argument("--vectors", choices=vectors_module.VECTORS, default="embedder")
    p.add_argument("--queries-per-agent", type=int, default=8)
    p.add_argument("--agents-file", type=Path, default=Path("loadtest/out/agents.json"))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="generator processes")
    p.add_argument("--no-reset", dest="reset", action="store_false", help="append instead of emptying tables")
    p.add_argument(
        "--embedding-storage",
        choices=("schema", "plain"),
        default="schema",
        help="plain: EXPERIMENT, embedding column STORAGE PLAIN (inline, not TOASTed) before loading",
    )
    args = p.parse_args(argv)
    if not args.dsn:
        p.error("--dsn (or IBEX_POSTGRES_DSN) is required")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    plan = SeedPlan(
        agents=args.agents,
        memories=args.memories,
        orgs=args.orgs,
        large_agents=args.large_agents,
        large_memories=args.large_memories,
        seed=args.seed,
        dim=args.dim,
        embedder=args.embedder,
        vectors=args.vectors,
        queries_per_agent=args.queries_per_agent,
    )
    print(
        f"seeding {plan.agents} agents ({plan.total_memories:,} memories, vectors={plan.vectors}, "
        f"embedder={plan.embedder}, jobs={args.jobs})",
        flush=True,
    )
    report = asyncio.run(
        seed(
            args.dsn,
            plan,
            args.agents_file,
            jobs=args.jobs,
            reset=args.reset,
            embedding_storage=args.embedding_storage,
        )
    )
    for line in report.lines():
        print(line)
    print(f"agents file: {args.agents_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
