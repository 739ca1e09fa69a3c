"""Large agents' own graphs (migrations 0013, 0019, ``stores.postgres.graphs``), on the real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import timedelta

import asyncpg
import numpy as np
import pytest
from ibex_context.errors import StoreError
from ibex_context.stores.base import PreparedMemory
from ibex_context.stores.cold_plan import ColdMatches, ColdPlan
from ibex_context.stores.postgres import PostgresMemoryStore, create_graph_pool, create_pool
from ibex_context.stores.postgres.codecs import init_connection
from ibex_context.stores.postgres.graphs import (
    DENSE_GRAPH,
    GRAPH_OPTIONS,
    REBUILD_PAUSE,
    REBUILD_REPLACED_SHARE,
    SPARSE_GRAPH,
    AgentGraphs,
    GraphBuildTiming,
    build_memory_mb,
    graph_index_name,
)
from ibex_context.stores.postgres.pool import GRAPH_BUILD_APPLICATION

from tests.conftest import TEST_EMBEDDING_DIM, Tenant
from tests.stores.helpers import EF_SEARCH, MakeMemory, near, tenant_in_the_partition_of, unit_vector

LIMIT = 20  # past it, an agent gets its own graph
REBUILD_SHARE = 0.1  # past it, a churned graph is rebuilt (off by default)


REQUEST_POOL = 3  # connections of the request pool in these tests


@pytest.fixture
async def graph_store(postgres_dsn: str) -> AsyncIterator[PostgresMemoryStore]:
    pool = await create_pool(postgres_dsn, min_size=1, max_size=REQUEST_POOL, ef_search=EF_SEARCH)
    store = PostgresMemoryStore(
        pool,
        ef_search=EF_SEARCH,
        exact_max_memories=LIMIT,
        agent_graphs=True,
        graph_pool=await create_graph_pool(postgres_dsn, ef_search=EF_SEARCH),
        graph_rebuild_replaced_share=REBUILD_SHARE,
    )
    yield store
    await store.aclose()


@pytest.fixture
async def conn(postgres_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(postgres_dsn)
    await init_connection(connection)  # vectors as numpy arrays
    yield connection
    await connection.close()


async def _graph(conn: asyncpg.Connection, org_id: str, agent_id: str) -> asyncpg.Record | None:
    """The agent's record in agent_graphs with its index's validity and definition."""
    return await conn.fetchrow(
        "SELECT g.ready, i.indisvalid AS valid, pg_get_indexdef(i.indexrelid) AS definition"
        " FROM agent_graphs AS g LEFT JOIN pg_class AS c ON c.relname = g.index_name"
        " LEFT JOIN pg_index AS i ON i.indexrelid = c.oid WHERE g.org_id = $1 AND g.agent_id = $2",
        uuid.UUID(org_id),
        uuid.UUID(agent_id),
    )


async def test_an_agent_that_grows_past_the_limit_gets_its_own_graph_and_searches_it_alone(
    graph_store: PostgresMemoryStore, conn: asyncpg.Connection, tenant: Tenant, make_memory: MakeMemory
) -> None:
    query = unit_vector(3)
    mine = [make_memory(f"mine {i}", embedding=near(query, 1.0, seed=i)) for i in range(LIMIT + 10)]
    await graph_store.upsert_memories(tenant.org_id, tenant.agent_id, mine[:LIMIT])
    await asyncio.wait_for(graph_store.promotions_idle(), 60)
    assert await _graph(conn, tenant.org_id, tenant.agent_id) is None  # at the limit: exact scan
    # A neighbour in the same partition whose vectors all lie nearer to the query.
    neighbour = await tenant_in_the_partition_of(conn, tenant.org_id, tenant.agent_id)
    await graph_store.upsert_memories(
        *neighbour, [make_memory(f"theirs {i}", embedding=near(query, 0.2, seed=900 + i)) for i in range(15)]
    )
    await graph_store.upsert_memories(tenant.org_id, tenant.agent_id, mine[LIMIT:])
    await asyncio.wait_for(graph_store.promotions_idle(), 60)

    graph = await _graph(conn, tenant.org_id, tenant.agent_id)
    assert graph is not None and graph["ready"] and graph["valid"]
    org, agent = uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id)
    assert graph_index_name(org, agent) in graph["definition"]
    assert f"'{tenant.agent_id}'::uuid" in graph["definition"]  # its predicate is the tenant
    found = await graph_store.search(tenant.org_id, tenant.agent_id, query, 10)
    exact = await conn.fetch(
        "SELECT id::text, distance FROM ibex_cold_exact($1, $2, $3, 10)", org, agent, query
    )
    assert isinstance(found, ColdMatches) and found.plan is ColdPlan.AGENT_HALFVEC
    assert found.ids == [r["id"] for r in exact] and all(c.startswith("mine") for c in found.contents)
    # Half precision orders the walk; the similarities are the stored vectors' own.
    exact_distances = [r["distance"] for r in exact]
    assert found.similarity.tolist() == pytest.approx([1.0 - d for d in exact_distances], abs=1e-9)
    # The graph holds the vectors in half precision, each linked to 48 neighbours.
    assert f"(embedding)::halfvec({TEST_EMBEDDING_DIM})" in graph["definition"]
    assert "halfvec_cosine_ops" in graph["definition"] and "m='48'" in graph["definition"]
    # The plan walks the agent's own index, not the partition's graph.
    async with conn.transaction():
        for setting in ("enable_seqscan", "enable_bitmapscan", "enable_sort"):
            await conn.execute(f"SET LOCAL {setting} = off")
        plan = "\n".join(
            r[0]
            for r in await conn.fetch(
                "EXPLAIN SELECT id FROM memories"
                f" WHERE org_id = '{org}'::uuid AND agent_id = '{agent}'::uuid"
                f" ORDER BY embedding::halfvec({TEST_EMBEDDING_DIM})"
                f" <=> $1::vector::halfvec({TEST_EMBEDDING_DIM}) LIMIT 10",
                query,
            )
        )
    assert graph_index_name(org, agent) in plan


async def test_a_graph_built_before_half_precision_is_still_searched_through_it(
    graph_store: PostgresMemoryStore, conn: asyncpg.Connection, tenant: Tenant, make_memory: MakeMemory
) -> None:
    """A graph of full-precision vectors (built before migration 0019) stays in use, through
    the function that walks it, until it is built again."""
    query = unit_vector(7)
    memories = [make_memory(f"old {i}", embedding=near(query, 1.0, seed=i)) for i in range(LIMIT + 5)]
    await PostgresMemoryStore(graph_store.pool, ef_search=EF_SEARCH).upsert_memories(
        tenant.org_id, tenant.agent_id, memories
    )
    org, agent = uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id)
    name = graph_index_name(org, agent)
    partition = await conn.fetchval(
        "SELECT tableoid::regclass::text FROM memories WHERE org_id = $1 AND agent_id = $2 LIMIT 1",
        org,
        agent,
    )
    # As stores.postgres.graphs built it before 0019, and recorded as such.
    await conn.execute(
        f"CREATE INDEX {name} ON {partition} USING hnsw (embedding vector_cosine_ops)"
        f" WITH ({GRAPH_OPTIONS}) WHERE org_id = '{org}'::uuid AND agent_id = '{agent}'::uuid"
    )
    await conn.execute(
        "INSERT INTO agent_graphs (org_id, agent_id, index_name, ready) VALUES ($1, $2, $3, true)",
        org,
        agent,
        name,
    )
    recorded = "SELECT halfvec FROM agent_graphs WHERE org_id = $1 AND agent_id = $2"
    assert await conn.fetchval(recorded, org, agent) is False

    found = await graph_store.search(tenant.org_id, tenant.agent_id, query, 10)
    exact = await conn.fetch("SELECT id::text FROM ibex_cold_exact($1, $2, $3, 10)", org, agent, query)
    assert isinstance(found, ColdMatches) and found.plan is ColdPlan.AGENT
    assert found.ids == [r["id"] for r in exact]


async def test_after_its_graph_is_built_here_the_agents_next_search_walks_it_at_once(
    graph_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    """The process that built the graph does not wait for the agent's cached state (60 s)
    to expire before its searches use it."""
    query = unit_vector(5)
    memories = [make_memory(f"grows {i}", embedding=near(query, 1.0, seed=i)) for i in range(LIMIT + 5)]
    await graph_store.upsert_memories(tenant.org_id, tenant.agent_id, memories[:LIMIT])
    before = await graph_store.search(tenant.org_id, tenant.agent_id, query, 5)
    assert isinstance(before, ColdMatches) and before.plan is ColdPlan.EXACT  # its size is now cached

    await graph_store.upsert_memories(tenant.org_id, tenant.agent_id, memories[LIMIT:])
    await asyncio.wait_for(graph_store.promotions_idle(), 60)
    after = await graph_store.search(tenant.org_id, tenant.agent_id, query, 5)
    assert isinstance(after, ColdMatches) and after.plan is ColdPlan.AGENT_HALFVEC


@pytest.mark.parametrize("workers", [0, 3])
async def test_a_graph_build_gets_parallel_workers_only_when_configured(
    postgres_dsn: str, workers: int
) -> None:
    """A build with PostgreSQL's default of 2 workers ran as three processes beside the
    request searches on the stores' core; the default now is one."""
    pool = await create_graph_pool(postgres_dsn, ef_search=EF_SEARCH, parallel_workers=workers)
    try:
        assert await pool.fetchval("SHOW max_parallel_maintenance_workers") == str(workers)
    finally:
        await pool.close()


def test_a_build_asks_for_the_memory_its_agents_graph_needs_within_the_cap() -> None:
    # PostgreSQL's default 64 MB at least; ~4 kB a memory; never past the cap.
    assert build_memory_mb(5_000, 1024) == 64
    assert build_memory_mb(100_000, 1024) == 391
    assert build_memory_mb(1_000_000, 1024) == 1024
    assert build_memory_mb(1_000_000, 8192) == 3907


async def test_a_build_runs_with_its_memory_and_leaves_the_connections_setting_as_it_was(
    postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    """pgvector finishes a graph on disk, many times slower, once it outgrows
    maintenance_work_mem (PostgreSQL's default 64 MB: a 100k-memory agent's graph took ~4x as
    long): each build sets its own for its statement and resets it after."""
    statements: list[str] = []
    pool = await asyncpg.create_pool(
        postgres_dsn,
        min_size=1,
        max_size=1,
        init=lambda connection: _log_queries(connection, statements),
    )
    try:
        plain = PostgresMemoryStore(
            await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=EF_SEARCH), ef_search=EF_SEARCH
        )
        try:
            await plain.upsert_memories(
                tenant.org_id,
                tenant.agent_id,
                [make_memory(f"m {i}", embedding=unit_vector(i)) for i in range(LIMIT + 3)],
            )
        finally:
            await plain.aclose()
        graphs = AgentGraphs(pool, min_memories=LIMIT, build_memory_mb=96)
        assert await graphs.promote(tenant.org_id, tenant.agent_id)
        sets = [q for q in statements if "maintenance_work_mem" in q]
        build = next(i for i, q in enumerate(statements) if q.startswith("CREATE INDEX CONCURRENTLY"))
        assert sets == ["SET maintenance_work_mem = '64MB'", "RESET maintenance_work_mem"]
        assert statements.index(sets[0]) < build < statements.index(sets[1])
        assert await pool.fetchval("SHOW maintenance_work_mem") == "64MB"
    finally:
        await pool.close()


async def _log_queries(connection: asyncpg.Connection, statements: list[str]) -> None:
    connection.add_query_logger(lambda record: statements.append(record.query))


async def test_a_promotion_is_claimed_once_and_a_stale_claim_is_taken_over(
    graph_store: PostgresMemoryStore, conn: asyncpg.Connection, tenant: Tenant, make_memory: MakeMemory
) -> None:
    org, agent = uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id)
    await PostgresMemoryStore(graph_store.pool, ef_search=EF_SEARCH).upsert_memories(
        tenant.org_id, tenant.agent_id, [make_memory(f"m {i}", embedding=unit_vector(i)) for i in range(5)]
    )
    # Another process's build, started a minute ago: not ours to take.
    await conn.execute(
        "INSERT INTO agent_graphs (org_id, agent_id, index_name, requested_at)"
        " VALUES ($1, $2, $3, now() - interval '1 minute')",
        org,
        agent,
        graph_index_name(org, agent),
    )
    assert not await graph_store.graphs.promote(tenant.org_id, tenant.agent_id)
    # Two hours old and still not ready: that build died. It is taken over and finished.
    await conn.execute(
        "UPDATE agent_graphs SET requested_at = now() - interval '2 hours'"
        " WHERE org_id = $1 AND agent_id = $2",
        org,
        agent,
    )
    assert await graph_store.graphs.promote(tenant.org_id, tenant.agent_id)
    graph = await _graph(conn, tenant.org_id, tenant.agent_id)
    assert graph is not None and graph["ready"] and graph["valid"]
    assert not await graph_store.graphs.promote(tenant.org_id, tenant.agent_id)  # built already


async def test_agents_written_before_are_promoted_largest_first_and_empty_ones_never(
    graph_store: PostgresMemoryStore,
    conn: asyncpg.Connection,
    new_tenant: Callable[[], Tenant],
    make_memory: MakeMemory,
) -> None:
    """A populated database (agents grown while nothing promoted them): ``promote_grown``
    builds a graph for each agent past the limit."""
    plain = PostgresMemoryStore(graph_store.pool, ef_search=EF_SEARCH)
    tenants = [new_tenant() for _ in range(3)]
    for n, size in enumerate((LIMIT + 5, LIMIT + 9, LIMIT)):
        memories = [make_memory(f"t{n} {i}", embedding=unit_vector(100 * n + i)) for i in range(size)]
        await plain.upsert_memories(tenants[n].org_id, tenants[n].agent_id, memories)
    grown = await graph_store.graphs.grown()
    mine = [(t.org_id, t.agent_id) for t in tenants]
    assert [g for g in grown if g in mine] == [mine[1], mine[0]]
    for org_id, agent_id in grown:
        if (org_id, agent_id) in mine:
            assert await graph_store.graphs.promote(org_id, agent_id)
    assert [(await _graph(conn, *t)) is not None for t in mine] == [True, True, False]
    assert not await graph_store.graphs.promote(str(uuid.uuid4()), str(uuid.uuid4()))  # no memories
    assert await conn.fetchval("SELECT count(*) FROM agent_graphs WHERE NOT ready") == 0


async def test_graph_builds_run_one_at_a_time_on_their_own_connection_never_a_request_one(
    graph_store: PostgresMemoryStore,
    conn: asyncpg.Connection,
    new_tenant: Callable[[], Tenant],
    make_memory: MakeMemory,
) -> None:
    """The attack of issue 39: writes into many new agents, each past the limit. Their
    builds used to run at once on the request pool's connections (no cap, no statement
    timeout) until none was left for any tenant's writes and searches."""
    agents = [new_tenant() for _ in range(12)]
    await asyncio.gather(
        *(
            graph_store.upsert_memories(
                t.org_id,
                t.agent_id,
                [make_memory(f"{n} {i}", embedding=unit_vector(i)) for i in range(LIMIT + 5)],
            )
            for n, t in enumerate(agents)
        )
    )
    pool = graph_store.pool
    least_free, most_builds, samples = REQUEST_POOL, 0, 0
    quiet = new_tenant()
    promotions = asyncio.ensure_future(graph_store.promotions_idle())
    while not promotions.done():
        # Sampled while no request runs: every request connection must be free.
        least_free = min(least_free, REQUEST_POOL - pool.get_size() + pool.get_idle_size())
        builds = await conn.fetch(
            "SELECT application_name FROM pg_stat_activity"
            " WHERE query ILIKE 'CREATE INDEX CONCURRENTLY%' AND state = 'active'"
        )
        most_builds = max(most_builds, len(builds))
        assert {b["application_name"] for b in builds} <= {GRAPH_BUILD_APPLICATION}
        # And another tenant's writes and searches go on meanwhile.
        await asyncio.wait_for(
            graph_store.upsert_memories(quiet.org_id, quiet.agent_id, [make_memory(f"quiet {samples}")]), 10
        )
        await asyncio.wait_for(graph_store.search(quiet.org_id, quiet.agent_id, unit_vector(1), 5), 10)
        samples += 1
        await asyncio.sleep(0.005)
    await asyncio.wait_for(promotions, 120)

    assert least_free == REQUEST_POOL and most_builds <= 1 and samples > 0
    built = [await _graph(conn, t.org_id, t.agent_id) for t in agents]
    assert all(g is not None and g["ready"] and g["valid"] for g in built)


def test_background_builds_need_a_pool_of_their_own(graph_store: PostgresMemoryStore) -> None:
    with pytest.raises(ValueError, match="graph_pool"):
        PostgresMemoryStore(graph_store.pool, ef_search=EF_SEARCH, agent_graphs=True)


async def _write_unpromoted(
    pool: asyncpg.Pool, agents: Sequence[tuple[Tenant, int]], make_memory: MakeMemory
) -> None:
    """Writes each agent's memories (as many as given) through a store that builds no graphs."""
    plain = PostgresMemoryStore(pool, ef_search=EF_SEARCH, exact_max_memories=LIMIT)
    for n, (tenant, size) in enumerate(agents):
        memories = [make_memory(f"t{n} {i}", embedding=unit_vector(100 * n + i)) for i in range(size)]
        await plain.upsert_memories(tenant.org_id, tenant.agent_id, memories)


async def _graph_building_store(pool: asyncpg.Pool, dsn: str) -> PostgresMemoryStore:
    return PostgresMemoryStore(
        pool,
        ef_search=EF_SEARCH,
        exact_max_memories=LIMIT,
        agent_graphs=True,
        graph_pool=await create_graph_pool(dsn, ef_search=EF_SEARCH),
    )


async def test_at_start_the_agents_grown_without_a_graph_are_queued_and_built(
    private_postgres_dsn: str, new_tenant: Callable[[], Tenant], make_memory: MakeMemory
) -> None:
    """Agents past the limit without a graph (written while nothing promoted them: a build
    that died, a database from a build that had none) would be searched exactly until
    their next write: ``queue_grown`` queues their builds at start, largest first; an
    agent at the limit and one with a graph already are left alone."""
    pool = await create_pool(private_postgres_dsn, min_size=1, max_size=2, ef_search=EF_SEARCH)
    tenants = [new_tenant() for _ in range(3)]
    await _write_unpromoted(pool, [*zip(tenants, (LIMIT + 5, LIMIT, LIMIT + 9), strict=True)], make_memory)
    plain = PostgresMemoryStore(pool, ef_search=EF_SEARCH, exact_max_memories=LIMIT)
    assert await plain.queue_grown() == 0  # this store builds no graphs
    store = await _graph_building_store(pool, private_postgres_dsn)
    conn = await asyncpg.connect(private_postgres_dsn)
    try:
        assert await store.graphs.promote(tenants[2].org_id, tenants[2].agent_id)  # one built already
        assert await store.queue_grown() == 1
        await asyncio.wait_for(store.promotions_idle(), 60)
        built = [(await _graph(conn, t.org_id, t.agent_id)) for t in tenants]
        assert [g is not None and g["ready"] and g["valid"] for g in built] == [True, False, True]
        assert await store.queue_grown() == 0
        found = await store.search(tenants[0].org_id, tenants[0].agent_id, unit_vector(3), 5)
        assert isinstance(found, ColdMatches) and found.plan is ColdPlan.AGENT_HALFVEC
    finally:
        await conn.close()
        await store.aclose()


async def test_one_orgs_many_grown_agents_do_not_hold_another_orgs_build_behind_theirs(
    private_postgres_dsn: str, new_tenant: Callable[[], Tenant], make_memory: MakeMemory
) -> None:
    """Builds run one at a time, each seconds to a minute at scale, and an agent waiting
    for its graph is searched exactly. Taken largest first (or in the order queued), one
    org's bulk import of large agents held every other org's agent behind all of them;
    the orgs now take turns, each org's largest first."""
    pool = await create_pool(private_postgres_dsn, min_size=1, max_size=2, ef_search=EF_SEARCH)
    flooding_org = new_tenant().org_id
    flood = [Tenant(flooding_org, new_tenant().agent_id) for _ in range(4)]
    quiet = new_tenant()
    sizes = [*zip(flood, (LIMIT + 9, LIMIT + 8, LIMIT + 7, LIMIT + 6), strict=True), (quiet, LIMIT + 1)]
    await _write_unpromoted(pool, sizes, make_memory)
    store = await _graph_building_store(pool, private_postgres_dsn)
    conn = await asyncpg.connect(private_postgres_dsn)
    try:
        assert await store.queue_grown() == 5
        await asyncio.wait_for(store.promotions_idle(), 60)
        built = await conn.fetch(
            "SELECT org_id::text, agent_id::text FROM agent_graphs WHERE ready ORDER BY requested_at"
        )
        expected = [flood[0], quiet, *flood[1:]]
        assert [(r["org_id"], r["agent_id"]) for r in built] == [(t.org_id, t.agent_id) for t in expected]
    finally:
        await conn.close()
        await store.aclose()


async def test_each_build_reports_its_graph_and_wall_time_and_a_killed_one_reports_failed(
    private_postgres_dsn: str, new_tenant: Callable[[], Tenant], make_memory: MakeMemory
) -> None:
    """What ``ibex_context_graph_build_seconds`` is made of: a build that ends and one whose
    backend dies while it waits for the partition (another transaction holds it; a
    database of its own, so no other test's statement waits on that lock)."""
    timings: list[GraphBuildTiming] = []
    pool = await create_pool(private_postgres_dsn, min_size=1, max_size=2, ef_search=EF_SEARCH)
    graph_pool = await create_graph_pool(private_postgres_dsn, ef_search=EF_SEARCH)
    conn = await asyncpg.connect(private_postgres_dsn)
    graphs = AgentGraphs(graph_pool, min_memories=LIMIT, observe=timings.append)
    built, killed = new_tenant(), new_tenant()
    await _write_unpromoted(pool, [(built, LIMIT + 5), (killed, LIMIT + 5)], make_memory)
    try:
        assert await graphs.promote(built.org_id, built.agent_id)
        assert [(t.graph, t.built) for t in timings] == [("dense", True)] and timings[0].seconds > 0

        partition = await conn.fetchval(
            "SELECT tableoid::regclass::text FROM memories WHERE org_id = $1 AND agent_id = $2 LIMIT 1",
            uuid.UUID(killed.org_id),
            uuid.UUID(killed.agent_id),
        )
        holder = await asyncpg.connect(private_postgres_dsn)
        try:
            async with holder.transaction():
                await holder.execute(f"LOCK TABLE {partition} IN SHARE MODE")
                build = asyncio.ensure_future(graphs.promote(killed.org_id, killed.agent_id))
                waiting = None
                for _ in range(200):  # at most 10 s
                    waiting = await conn.fetchval(
                        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                        " AND query LIKE 'CREATE INDEX CONCURRENTLY % ON ' || $1 || ' %'"
                        " AND datname = current_database()",
                        partition,
                    )
                    if waiting is not None:
                        break
                    await asyncio.sleep(0.05)
                assert waiting is not None
                await conn.execute("SELECT pg_terminate_backend($1)", waiting)
                with pytest.raises(StoreError):
                    await asyncio.wait_for(build, 10)
        finally:
            await holder.close()
        assert [(t.graph, t.built) for t in timings] == [("dense", True), ("dense", False)]
    finally:
        await conn.close()
        await graph_pool.close()
        await pool.close()


SPARSE_MAX = LIMIT + 20  # promoted with at most this many memories: a sparse graph


@pytest.fixture
async def sparse_store(postgres_dsn: str) -> AsyncIterator[PostgresMemoryStore]:
    pool = await create_pool(postgres_dsn, min_size=1, max_size=REQUEST_POOL, ef_search=EF_SEARCH)
    store = PostgresMemoryStore(
        pool,
        ef_search=EF_SEARCH,
        exact_max_memories=LIMIT,
        sparse_graph_max_memories=SPARSE_MAX,
        agent_graphs=True,
        graph_pool=await create_graph_pool(postgres_dsn, ef_search=EF_SEARCH),
    )
    yield store
    await store.aclose()


async def _links(conn: asyncpg.Connection, org_id: str, agent_id: str) -> tuple[int, str] | None:
    row = await conn.fetchrow(
        "SELECT links, index_name FROM agent_graphs WHERE org_id = $1 AND agent_id = $2 AND ready",
        uuid.UUID(org_id),
        uuid.UUID(agent_id),
    )
    return None if row is None else (row["links"], row["index_name"])


async def _exact_similarities(
    conn: asyncpg.Connection, tenant: Tenant, query: np.ndarray, limit: int
) -> list[float]:
    rows = await conn.fetch(
        "SELECT distance FROM ibex_cold_exact($1, $2, $3, $4)",
        uuid.UUID(tenant.org_id),
        uuid.UUID(tenant.agent_id),
        query,
        limit,
    )
    return [1.0 - r["distance"] for r in rows]


def _as_found(found: ColdMatches) -> object:
    """The similarities found, to compare with the exact answer's: the graph orders its walk
    by half-precision distances, so of two memories almost as near it may rank either
    first; what it finds is as near."""
    return pytest.approx(found.similarity.tolist(), abs=2e-3)


async def test_a_small_agent_gets_a_sparse_graph_rebuilt_dense_once_it_grows_past_the_limit(
    sparse_store: PostgresMemoryStore, conn: asyncpg.Connection, tenant: Tenant, make_memory: MakeMemory
) -> None:
    query = unit_vector(4)
    memories = [
        make_memory(f"grow {i}", embedding=near(query, 1.0, seed=300 + i)) for i in range(SPARSE_MAX + 5)
    ]
    await sparse_store.upsert_memories(tenant.org_id, tenant.agent_id, memories[: LIMIT + 5])
    await asyncio.wait_for(sparse_store.promotions_idle(), 60)
    org, agent = uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id)
    sparse_name, dense_name = (graph_index_name(org, agent, b) for b in (SPARSE_GRAPH, DENSE_GRAPH))
    assert await _links(conn, tenant.org_id, tenant.agent_id) == (16, sparse_name)
    graph = await _graph(conn, tenant.org_id, tenant.agent_id)
    assert (
        graph is not None
        and "m='16'" in graph["definition"]
        and "ef_construction='128'" in graph["definition"]
    )
    found = await sparse_store.search(tenant.org_id, tenant.agent_id, query, 10)
    assert isinstance(found, ColdMatches) and found.plan is ColdPlan.AGENT_SPARSE
    assert await _exact_similarities(conn, tenant, query, 10) == _as_found(found)

    # Past the sparse graph's limit: the next write queues its dense rebuild.
    await sparse_store.upsert_memories(tenant.org_id, tenant.agent_id, memories[LIMIT + 5 :])
    await asyncio.wait_for(sparse_store.promotions_idle(), 60)
    assert await _links(conn, tenant.org_id, tenant.agent_id) == (48, dense_name)
    graph = await _graph(conn, tenant.org_id, tenant.agent_id)
    assert graph is not None and graph["valid"] and "m='48'" in graph["definition"]
    assert await conn.fetchval("SELECT to_regclass($1) IS NULL", sparse_name)  # dropped
    assert (
        await conn.fetchval("SELECT rebuild_requested_at FROM agent_graphs WHERE index_name = $1", dense_name)
        is None
    )
    # This process forgot the agent's state: its next search walks the dense graph.
    found = await sparse_store.search(tenant.org_id, tenant.agent_id, query, 10)
    assert isinstance(found, ColdMatches) and found.plan is ColdPlan.AGENT_HALFVEC
    assert await _exact_similarities(conn, tenant, query, 10) == _as_found(found)
    assert not await sparse_store.graphs.build_due(tenant.org_id, tenant.agent_id)  # nothing left to build


async def test_an_agent_promoted_past_the_sparse_limit_gets_the_dense_graph_at_once(
    sparse_store: PostgresMemoryStore, conn: asyncpg.Connection, tenant: Tenant, make_memory: MakeMemory
) -> None:
    plain = PostgresMemoryStore(sparse_store.pool, ef_search=EF_SEARCH)
    memories = [make_memory(f"bulk {i}", embedding=unit_vector(400 + i)) for i in range(SPARSE_MAX + 3)]
    await plain.upsert_memories(tenant.org_id, tenant.agent_id, memories)
    assert await sparse_store.graphs.build_due(tenant.org_id, tenant.agent_id)
    org, agent = uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id)
    assert await _links(conn, tenant.org_id, tenant.agent_id) == (
        48,
        graph_index_name(org, agent, DENSE_GRAPH),
    )


async def test_a_rebuild_is_claimed_once_and_a_stale_claim_is_taken_over(
    sparse_store: PostgresMemoryStore, conn: asyncpg.Connection, tenant: Tenant, make_memory: MakeMemory
) -> None:
    plain = PostgresMemoryStore(sparse_store.pool, ef_search=EF_SEARCH)
    memories = [make_memory(f"claim {i}", embedding=unit_vector(500 + i)) for i in range(LIMIT + 3)]
    await plain.upsert_memories(tenant.org_id, tenant.agent_id, memories)
    assert await sparse_store.graphs.promote(tenant.org_id, tenant.agent_id)
    key = (uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id))
    claim = (
        "UPDATE agent_graphs SET rebuild_requested_at = now() - $3::interval"
        " WHERE org_id = $1 AND agent_id = $2"
    )
    await conn.execute(claim, *key, timedelta(minutes=5))  # another process rebuilding it
    assert not await sparse_store.graphs.densify(tenant.org_id, tenant.agent_id)
    assert (await _links(conn, tenant.org_id, tenant.agent_id) or (0,))[0] == 16
    await conn.execute(claim, *key, timedelta(hours=2))  # that process died
    assert await sparse_store.graphs.densify(tenant.org_id, tenant.agent_id)
    assert (await _links(conn, tenant.org_id, tenant.agent_id) or (0,))[0] == 48
    assert not await sparse_store.graphs.densify(tenant.org_id, tenant.agent_id)  # dense already


async def test_agents_due_a_build_are_those_past_a_limit_without_the_graph_it_calls_for(
    sparse_store: PostgresMemoryStore,
    conn: asyncpg.Connection,
    new_tenant: Callable[[], Tenant],
    make_memory: MakeMemory,
) -> None:
    """Without a graph past the exact scan's limit; on a sparse graph past the sparse
    graph's; a dense graph or a sparse one within its limit is due nothing."""
    plain = PostgresMemoryStore(sparse_store.pool, ef_search=EF_SEARCH)
    tenants = [new_tenant() for _ in range(4)]
    sizes = (LIMIT + 2, LIMIT + 4, SPARSE_MAX + 6, SPARSE_MAX + 8)
    for n, (t, size) in enumerate(zip(tenants, sizes, strict=True)):
        memories = [make_memory(f"due{n} {i}", embedding=unit_vector(600 + 50 * n + i)) for i in range(size)]
        await plain.upsert_memories(t.org_id, t.agent_id, memories[: min(size, LIMIT + 4)])
    # Sparse graphs for the last three, then two grow past the sparse limit.
    for t in tenants[1:]:
        assert await sparse_store.graphs.promote(t.org_id, t.agent_id)
    for n, t in enumerate(tenants[2:], start=2):
        rest = [
            make_memory(f"due{n} more {i}", embedding=unit_vector(900 + 50 * n + i))
            for i in range(sizes[n] - LIMIT - 4)
        ]
        await plain.upsert_memories(t.org_id, t.agent_id, rest)
    assert await sparse_store.graphs.densify(tenants[3].org_id, tenants[3].agent_id)
    due = await sparse_store.graphs.grown()
    mine = [(t.org_id, t.agent_id) for t in tenants]
    assert [d for d in due if d in mine] == [mine[2], mine[0]]  # largest first


# ------------------------------------------------------------------ a churned graph's rebuild


async def _replaced(conn: asyncpg.Connection, tenant: Tenant) -> int | None:
    """The agent's rows replaced since its graph was built (migration 0024)."""
    return await conn.fetchval(
        "SELECT replaced FROM agent_graphs WHERE org_id = $1 AND agent_id = $2",
        uuid.UUID(tenant.org_id),
        uuid.UUID(tenant.agent_id),
    )


async def _last_built_long_ago(conn: asyncpg.Connection, tenant: Tenant) -> None:
    """The pause after the agent's last build (``REBUILD_PAUSE`` x its seconds) is over."""
    await conn.execute(
        "UPDATE agent_graphs SET built_at = now() - interval '1 hour' WHERE org_id = $1 AND agent_id = $2",
        uuid.UUID(tenant.org_id),
        uuid.UUID(tenant.agent_id),
    )


async def _filenode(conn: asyncpg.Connection, index: str) -> int:
    """The storage of the graph under ``index``: a rebuild writes a new one."""
    return int(await conn.fetchval("SELECT pg_relation_filenode($1::regclass)", index))


async def _promoted(
    store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory, query: np.ndarray, size: int
) -> list[PreparedMemory]:
    memories = [make_memory(f"churn {i}", embedding=near(query, 1.0, seed=700 + i)) for i in range(size)]
    await store.upsert_memories(tenant.org_id, tenant.agent_id, memories)
    await asyncio.wait_for(store.promotions_idle(), 60)
    return memories


async def test_a_graph_is_rebuilt_in_place_once_more_than_a_tenth_of_its_agents_memories_were_replaced(
    graph_store: PostgresMemoryStore, conn: asyncpg.Connection, tenant: Tenant, make_memory: MakeMemory
) -> None:
    query = unit_vector(5)
    memories = await _promoted(graph_store, tenant, make_memory, query, LIMIT + 10)
    name = graph_index_name(uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id))
    built = await _filenode(conn, name)
    assert await _replaced(conn, tenant) == 0

    await graph_store.delete_memories(tenant.org_id, tenant.agent_id, [memories[0].id])
    # Re-embedded: a new text under the same id.
    await graph_store.upsert_memories(
        tenant.org_id,
        tenant.agent_id,
        [make_memory("churn rewritten", id=memories[1].id, embedding=near(query, 1.0, seed=799))],
    )
    # Feedback and metadata leave the vector, and the graph, as they were.
    await conn.execute(
        "UPDATE memories SET usefulness = 0.9 WHERE org_id = $1 AND agent_id = $2",
        uuid.UUID(tenant.org_id),
        uuid.UUID(tenant.agent_id),
    )
    await asyncio.wait_for(graph_store.promotions_idle(), 60)
    assert await _replaced(conn, tenant) == 2  # of 29: not yet a tenth
    assert await _filenode(conn, name) == built

    await _last_built_long_ago(conn, tenant)
    await graph_store.delete_memories(tenant.org_id, tenant.agent_id, [m.id for m in memories[2:4]])
    await asyncio.wait_for(graph_store.promotions_idle(), 60)
    assert await _filenode(conn, name) != built  # a new graph under the same name
    assert await _replaced(conn, tenant) == 0
    graph = await _graph(conn, tenant.org_id, tenant.agent_id)
    assert graph is not None and graph["ready"] and graph["valid"] and "m='48'" in graph["definition"]
    assert f"'{tenant.agent_id}'::uuid" in graph["definition"]
    assert not await conn.fetchval(
        "SELECT count(*) FROM pg_class WHERE relname LIKE $1", f"{name}\\_cc%"
    )  # the old graph dropped
    found = await graph_store.search(tenant.org_id, tenant.agent_id, query, 10)
    assert isinstance(found, ColdMatches) and found.plan is ColdPlan.AGENT_HALFVEC
    assert await _exact_similarities(conn, tenant, query, 10) == _as_found(found)
    assert not await graph_store.graphs.build_due(tenant.org_id, tenant.agent_id)  # nothing due


async def test_only_the_agents_own_deletes_count_toward_its_graphs_rebuild(
    graph_store: PostgresMemoryStore, conn: asyncpg.Connection, tenant: Tenant, make_memory: MakeMemory
) -> None:
    await _promoted(graph_store, tenant, make_memory, unit_vector(6), LIMIT + 10)
    neighbour = await tenant_in_the_partition_of(conn, tenant.org_id, tenant.agent_id)
    theirs = [make_memory(f"theirs {i}", embedding=unit_vector(800 + i)) for i in range(10)]
    await graph_store.upsert_memories(*neighbour, theirs)
    await graph_store.delete_memories(*neighbour, [m.id for m in theirs])
    assert await _replaced(conn, tenant) == 0
    # The small neighbour has no graph, so nothing counts its deletes.
    assert not await conn.fetchval(
        "SELECT count(*) FROM agent_graphs WHERE org_id = $1 AND agent_id = $2",
        *(uuid.UUID(x) for x in neighbour),
    )


async def test_a_rebuild_is_claimed_once_and_what_a_dead_one_left_is_dropped_first(
    graph_store: PostgresMemoryStore, conn: asyncpg.Connection, tenant: Tenant, make_memory: MakeMemory
) -> None:
    await _promoted(graph_store, tenant, make_memory, unit_vector(7), LIMIT + 10)
    key = (uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id))
    name = graph_index_name(*key)
    assert not await graph_store.graphs.renew(tenant.org_id, tenant.agent_id)  # nothing replaced
    await conn.execute("UPDATE agent_graphs SET replaced = 10 WHERE org_id = $1 AND agent_id = $2", *key)
    await _last_built_long_ago(conn, tenant)
    claim = (
        "UPDATE agent_graphs SET rebuild_requested_at = now() - $3::interval"
        " WHERE org_id = $1 AND agent_id = $2"
    )
    await conn.execute(claim, *key, timedelta(minutes=5))  # another process rebuilding it
    assert not await graph_store.graphs.renew(tenant.org_id, tenant.agent_id)
    # That process died inside its REINDEX, leaving its new graph, invalid, beside the old.
    partition = await conn.fetchval(
        "SELECT tableoid::regclass::text FROM memories WHERE org_id = $1 AND agent_id = $2 LIMIT 1", *key
    )
    await conn.execute(f"CREATE INDEX {name}_ccnew ON {partition} (id) WHERE agent_id = '{key[1]}'::uuid")
    await conn.execute(claim, *key, timedelta(hours=2))
    assert await graph_store.graphs.renew(tenant.org_id, tenant.agent_id)
    assert await conn.fetchval("SELECT to_regclass($1) IS NULL", f"{name}_ccnew")
    assert await _replaced(conn, tenant) == 0
    assert await conn.fetchval(
        "SELECT rebuild_requested_at IS NULL FROM agent_graphs WHERE org_id = $1 AND agent_id = $2", *key
    )


async def test_rows_replaced_while_a_graph_is_rebuilt_count_toward_its_next_rebuild(
    graph_store: PostgresMemoryStore,
    conn: asyncpg.Connection,
    postgres_dsn: str,
    tenant: Tenant,
    make_memory: MakeMemory,
) -> None:
    memories = await _promoted(graph_store, tenant, make_memory, unit_vector(8), LIMIT + 10)
    key = (uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id))
    await conn.execute("UPDATE agent_graphs SET replaced = 10 WHERE org_id = $1 AND agent_id = $2", *key)
    await _last_built_long_ago(conn, tenant)
    partition = await conn.fetchval(
        "SELECT tableoid::regclass::text FROM memories WHERE org_id = $1 AND agent_id = $2 LIMIT 1", *key
    )
    # A writer's open transaction on the partition holds the REINDEX at its first wait.
    writer = await asyncpg.connect(postgres_dsn)
    try:
        async with writer.transaction():
            await writer.execute(f"LOCK TABLE {partition} IN ROW EXCLUSIVE MODE")
            renewing = asyncio.ensure_future(graph_store.graphs.renew(tenant.org_id, tenant.agent_id))
            waiting = None
            for _ in range(200):  # at most 10 s
                waiting = await conn.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE 'REINDEX INDEX CONCURRENTLY %' AND datname = current_database()"
                )
                if waiting is not None:
                    break
                await asyncio.sleep(0.05)
            assert waiting is not None
            await graph_store.delete_memories(tenant.org_id, tenant.agent_id, [m.id for m in memories[:2]])
        assert await asyncio.wait_for(renewing, 30)
        await asyncio.wait_for(graph_store.promotions_idle(), 60)
    finally:
        await writer.close()
    assert await _replaced(conn, tenant) == 2  # the ten before the claim are gone from the graph


async def test_at_start_an_agent_whose_graph_is_churned_is_due_its_rebuild(
    graph_store: PostgresMemoryStore, conn: asyncpg.Connection, tenant: Tenant, make_memory: MakeMemory
) -> None:
    await _promoted(graph_store, tenant, make_memory, unit_vector(10), LIMIT + 10)
    mine = (tenant.org_id, tenant.agent_id)
    assert mine not in await graph_store.graphs.grown()
    key = (uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id))
    await conn.execute("UPDATE agent_graphs SET replaced = 4 WHERE org_id = $1 AND agent_id = $2", *key)
    assert mine not in await graph_store.graphs.grown()  # built a moment ago: it waits
    await _last_built_long_ago(conn, tenant)
    assert mine in await graph_store.graphs.grown()
    assert await graph_store.queue_grown() >= 1
    await asyncio.wait_for(graph_store.promotions_idle(), 60)
    assert await _replaced(conn, tenant) == 0


async def test_a_graph_is_rebuilt_at_most_a_quarter_of_the_time(
    graph_store: PostgresMemoryStore, conn: asyncpg.Connection, tenant: Tenant, make_memory: MakeMemory
) -> None:
    """After a build of T seconds, the next rebuild waits REBUILD_PAUSE x T (3: a quarter of
    the time rebuilding at most), however many rows were replaced meanwhile."""
    await _promoted(graph_store, tenant, make_memory, unit_vector(13), LIMIT + 10)
    key = (uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id))
    record = "SELECT built_at, build_seconds FROM agent_graphs WHERE org_id = $1 AND agent_id = $2"
    promoted = await conn.fetchrow(record, *key)
    assert promoted["built_at"] is not None and promoted["build_seconds"] > 0
    assert REBUILD_PAUSE == 3.0
    pause = (
        "UPDATE agent_graphs SET replaced = 10, build_seconds = 60, built_at = now() - $3::interval"
        " WHERE org_id = $1 AND agent_id = $2"
    )
    await conn.execute(pause, *key, timedelta(seconds=170))  # 3 x 60 s not yet over
    assert not await graph_store.graphs.renew(tenant.org_id, tenant.agent_id)
    await conn.execute(pause, *key, timedelta(seconds=190))
    assert await graph_store.graphs.renew(tenant.org_id, tenant.agent_id)
    renewed = await conn.fetchrow(record, *key)
    assert renewed["built_at"] > promoted["built_at"] and 0 < renewed["build_seconds"] < 60


async def test_by_default_a_churned_graph_is_left_to_autovacuum(
    sparse_store: PostgresMemoryStore, conn: asyncpg.Connection, tenant: Tenant, make_memory: MakeMemory
) -> None:
    """``cold_graph_rebuild_replaced_share`` 0: deletes queue nothing, and no graph is due a
    rebuild however much of it was replaced."""
    assert REBUILD_REPLACED_SHARE == 0
    memories = await _promoted(sparse_store, tenant, make_memory, unit_vector(14), LIMIT + 10)
    await _last_built_long_ago(conn, tenant)
    await sparse_store.delete_memories(tenant.org_id, tenant.agent_id, [m.id for m in memories[:10]])
    assert sparse_store.graph_builds_queued == 0
    assert await _replaced(conn, tenant) == 10  # counted all the same
    assert not await sparse_store.graphs.build_due(tenant.org_id, tenant.agent_id)
    assert (tenant.org_id, tenant.agent_id) not in await sparse_store.graphs.grown()
