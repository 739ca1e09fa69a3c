"""The search statements as SQL functions planned once per connection (migration 0015):
the same answers as the statements they replaced, and the plans the service chose."""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest
from ibex_context.stores.cold_plan import ColdPlan
from ibex_context.stores.postgres import PostgresMemoryStore, create_graph_pool, create_pool
from ibex_context.stores.postgres.graphs import graph_index_name
from ibex_context.stores.postgres.rows import as_arrays
from ibex_context.stores.postgres.searches import (
    LEXICAL_ARRAYS_SQL,
    LEXICAL_SQL,
    SEARCH_ARRAYS_SQL,
    SEARCH_SQL,
    SEARCH_WITH_VECTORS_SQL,
)
from ibex_context.stores.postgres.store import prepare_request_path

from tests.conftest import Tenant
from tests.stores.helpers import EF_SEARCH, MakeMemory, near, unit_vector

LIMIT = 20  # past it, an agent takes a graph


@pytest.fixture
async def one_connection(postgres_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection as the service's pool makes them: the request path's statements run
    first for a tenant that does not exist, so the functions' generic plans are made then."""
    pool = await create_pool(
        postgres_dsn, min_size=1, max_size=1, ef_search=EF_SEARCH, prepare=prepare_request_path
    )
    try:
        async with pool.acquire() as conn:
            yield conn
    finally:
        await pool.close()


async def _seed(store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory, count: int) -> None:
    """``count`` memories, two of each text's neighbours at the same distance (ties), some
    injected (a usage row with a count and a time), some with an ``occurred_at``."""
    query = unit_vector(3)
    memories = [
        make_memory(
            f"travel note {i // 2} about Berlin trains and seats, copy {i}",
            embedding=near(query, 0.1 * (1 + i // 2), seed=i // 2),
            occurred_at=1_700_000_000.0 + i if i % 3 == 0 else None,
        )
        for i in range(count)
    ]
    await store.upsert_memories(tenant.org_id, tenant.agent_id, memories)
    await store.pool.execute(
        "INSERT INTO memory_usage (org_id, agent_id, memory_id, retrieval_count, last_injected_at)"
        " SELECT $1, $2, id, 7, now() FROM memories WHERE org_id = $1 AND agent_id = $2 LIMIT $3",
        uuid.UUID(tenant.org_id),
        uuid.UUID(tenant.agent_id),
        count // 3,
    )


def _width(plan: ColdPlan) -> tuple[int, ...]:
    """The width argument a plan's function takes (migration 0020): the session's, so
    the functions and the row statements they replaced walk alike."""
    return (EF_SEARCH,) if plan.walks_graph else ()


def _same(left: Sequence[Any] | None, right: Sequence[Any] | None) -> bool:
    """Arrays equal element by element (NaN, the never-injected time, equals NaN)."""
    if left is None or right is None:
        return left is right
    return len(left) == len(right) and all(
        a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))
        for a, b in zip(left, right, strict=True)
    )


async def test_each_function_returns_what_the_statement_it_replaced_returned(
    pg_store: PostgresMemoryStore,
    one_connection: asyncpg.Connection,
    tenant: Tenant,
    new_tenant: Any,
    make_memory: MakeMemory,
) -> None:
    await _seed(pg_store, tenant, make_memory, 60)
    # A graph of its own, so each plan's function has an index to walk.
    assert await pg_store.graphs.promote(tenant.org_id, tenant.agent_id)
    org, agent = uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id)
    query = unit_vector(3)
    nobody = new_tenant()
    cases: list[tuple[str, str, tuple[Any, ...]]] = []
    for who in ((org, agent), (uuid.UUID(nobody.org_id), uuid.UUID(nobody.agent_id))):
        for limit in (1, 7, 50, 80):
            for plan in ColdPlan:
                cases.append(
                    (
                        SEARCH_ARRAYS_SQL[plan],
                        as_arrays(SEARCH_SQL[plan], ("distance",)),
                        (*who, query, limit, *_width(plan)),
                    )
                )
            for words in ("Berlin trains", "seats copy 3", "nothing matches zebra"):
                cases.append(
                    (LEXICAL_ARRAYS_SQL, as_arrays(LEXICAL_SQL, ("bm25", "embedding")), (*who, words, limit))
                )
    for function, statement, args in cases:
        new = await one_connection.fetchrow(function, *args)
        old = await one_connection.fetchrow(statement, *args[:4])
        assert new is not None and old is not None
        assert len(new) == len(old), function
        assert all(_same(a, b) for a, b in zip(new, old, strict=True)), (function, args[2:])
        if args[0] == org and (function != LEXICAL_ARRAYS_SQL or args[2] == "Berlin trains"):
            assert new[0] is not None and len(new[0]) == min(args[3], 60), (function, args[2:])


async def test_with_vectors_each_plan_returns_its_arrays_and_each_winners_stored_vector_in_order(
    pg_store: PostgresMemoryStore,
    one_connection: asyncpg.Connection,
    tenant: Tenant,
    new_tenant: Any,
    make_memory: MakeMemory,
) -> None:
    await _seed(pg_store, tenant, make_memory, 30)
    assert await pg_store.graphs.promote(tenant.org_id, tenant.agent_id)
    org, agent = uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id)
    query = unit_vector(3)
    for plan in ColdPlan:
        for limit in (1, 7, 50):
            plain = await one_connection.fetchrow(
                SEARCH_ARRAYS_SQL[plan], org, agent, query, limit, *_width(plan)
            )
            with_vectors = await one_connection.fetchrow(
                SEARCH_WITH_VECTORS_SQL[plan], org, agent, query, limit, *_width(plan)
            )
            assert plain is not None and with_vectors is not None
            assert all(_same(a, b) for a, b in zip(with_vectors[:-1], plain, strict=True)), (plan, limit)
            stored = {
                str(r["id"]): r["v"]
                for r in await one_connection.fetch(
                    "SELECT id, vector_send(embedding) AS v FROM memories"
                    " WHERE org_id = $1 AND agent_id = $2",
                    org,
                    agent,
                )
            }
            assert with_vectors[-1] == [stored[i] for i in with_vectors[0]], (plan, limit)
    nobody = new_tenant()
    empty = await one_connection.fetchrow(
        SEARCH_WITH_VECTORS_SQL[ColdPlan.EXACT],
        uuid.UUID(nobody.org_id),
        uuid.UUID(nobody.agent_id),
        query,
        5,
    )
    assert empty is not None and empty[0] is None and empty[-1] is None


async def _index_scans(conn: asyncpg.Connection, indexes: Sequence[str]) -> dict[str, int]:
    """How often each index has been scanned by this backend since its counts were last
    reported (a backend reports them when idle outside a transaction: read the
    difference across statements inside one transaction)."""
    return {
        name: int(await conn.fetchval("SELECT pg_stat_get_xact_numscans($1::regclass)", name))
        for name in indexes
    }


async def _partition_graphs(conn: asyncpg.Connection, org: uuid.UUID, agent: uuid.UUID) -> list[str]:
    """The HNSW graphs of the agent's partition: partial ones (an agent's own) and whole."""
    rows = await conn.fetch(
        "SELECT c.relname, i.indpred IS NOT NULL AS partial"
        " FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid JOIN pg_am AS a ON a.oid = c.relam"
        " WHERE a.amname = 'hnsw'"
        " AND i.indrelid = (SELECT tableoid FROM memories WHERE org_id = $1 AND agent_id = $2 LIMIT 1)",
        org,
        agent,
    )
    return [f"{r['relname']}{' (partial)' if r['partial'] else ''}" for r in rows]


async def _seed_with_own_graph(postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory) -> None:
    """``LIMIT + 10`` memories of ``tenant``'s agent, which the writes give a graph of its own."""
    pool = await create_pool(postgres_dsn, min_size=1, max_size=2, ef_search=EF_SEARCH)
    store = PostgresMemoryStore(
        pool,
        ef_search=EF_SEARCH,
        exact_max_memories=LIMIT,
        agent_graphs=True,
        graph_pool=await create_graph_pool(postgres_dsn, ef_search=EF_SEARCH),
    )
    try:
        await _seed(store, tenant, make_memory, LIMIT + 10)
        await store.promotions_idle()
        assert await store.graphs.promote(tenant.org_id, tenant.agent_id) is False  # built by the write
    finally:
        await store.aclose()


async def test_each_plans_function_walks_that_plans_index_though_planned_first_for_nobody(
    postgres_dsn: str,
    one_connection: asyncpg.Connection,
    tenant: Tenant,
    make_memory: MakeMemory,
) -> None:
    """A generic plan made on the connection's first call (a tenant with no rows) serves
    every agent: the exact scan reads the agent's rows by its key and walks no graph, the
    agent's own plan its own graph; its partition has no graph over every tenant (0021)."""
    await _seed_with_own_graph(postgres_dsn, tenant, make_memory)
    org, agent = uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id)
    own = graph_index_name(org, agent)
    # Other agents of the session's database may have theirs in the same partition.
    graphs = await _partition_graphs(one_connection, org, agent)
    assert f"{own} (partial)" in graphs and all(g.endswith(" (partial)") for g in graphs), graphs
    expected = {ColdPlan.EXACT: {own: 0}, ColdPlan.AGENT_HALFVEC: {own: 1}}
    for plan, scans in expected.items():
        async with one_connection.transaction():
            before = await _index_scans(one_connection, [own])
            row = await one_connection.fetchrow(
                SEARCH_ARRAYS_SQL[plan], org, agent, unit_vector(3), 10, *_width(plan)
            )
            after = await _index_scans(one_connection, [own])
        counted = {name: after[name] - before[name] for name in after}
        assert row is not None and len(row[0]) == 10, plan
        assert {name: counted[name] for name in scans} == scans, plan


async def test_a_graph_search_walks_at_the_width_it_is_given_for_that_search_alone(
    postgres_dsn: str,
    one_connection: asyncpg.Connection,
    tenant: Tenant,
    make_memory: MakeMemory,
) -> None:
    """The width argument (migration 0020) is the search's ``hnsw.ef_search``: without
    iterative scans a graph returns the rows of at most that many vectors (the seed's
    memories come in pairs with one vector, which pgvector keeps as one element). It
    holds for that search alone: the caller's setting is the same afterwards, inside the
    caller's transaction too (where a ``SET LOCAL`` would have lasted to its end)."""
    await _seed_with_own_graph(postgres_dsn, tenant, make_memory)
    org, agent = uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id)
    found: dict[int, set[int]] = {}
    async with one_connection.transaction():
        await one_connection.execute("SET LOCAL hnsw.iterative_scan = off")
        for width in (3, 7, 25):
            for statements in (SEARCH_ARRAYS_SQL, SEARCH_WITH_VECTORS_SQL):
                row = await one_connection.fetchrow(
                    statements[ColdPlan.AGENT_HALFVEC], org, agent, unit_vector(3), 20, width
                )
                assert row is not None
                found.setdefault(width, set()).add(len(row[0]))
            assert await one_connection.fetchval("SHOW hnsw.ef_search") == str(EF_SEARCH)
    # The connection's 64 would give 20 rows every time.
    assert len(found[3]) == len(found[7]) == 1, found
    (narrow,), (wider,) = found[3], found[7]
    assert 3 <= narrow <= 6 and 7 <= wider <= 14, found
    assert found[25] == {20}, found


async def test_the_functions_generic_plans_probe_every_row_by_its_primary_key(
    pg_store: PostgresMemoryStore, one_connection: asyncpg.Connection, tenant: Tenant, make_memory: MakeMemory
) -> None:
    """Each function's statement, planned generic with the function's own settings after
    ANALYZE of a database holding agents of every size: every relation other than the
    search functions is read by an index probe per winner, never scanned or hash-joined."""
    await _seed(pg_store, tenant, make_memory, 30)
    await one_connection.execute("ANALYZE memories, memory_usage")
    functions = await one_connection.fetch(
        "SELECT proname, prosrc, proargnames[1:pronargs] AS inputs, proconfig,"
        " ARRAY(SELECT format_type(t, NULL) FROM unnest(proargtypes) AS t) AS types FROM pg_proc"
        " WHERE proname IN ('ibex_cold_exact_arrays', 'ibex_cold_hnsw_arrays', 'ibex_cold_agent_arrays',"
        " 'ibex_bm25_arrays') AND pronargs = 4"  # not the graph searches' width wrappers (0020)
    )
    assert len(functions) == 4
    for function in functions:
        assert "plan_cache_mode=force_generic_plan" in function["proconfig"]
        statement = function["prosrc"]
        for position, name in enumerate(function["inputs"], start=1):
            statement = re.sub(rf"\b{name}\b", f"${position}", statement)
        async with one_connection.transaction():
            for setting in function["proconfig"]:
                key, value = setting.split("=", 1)
                await one_connection.execute(f"SET LOCAL {key} = {value}")
            # The session's generic plan of the statement, as the function's plan cache makes it.
            await one_connection.execute(f"PREPARE probe({', '.join(function['types'])}) AS {statement}")
            try:
                # The tenant's partition is the one left after pruning at the executor's start.
                values = f"'{tenant.org_id}', '{tenant.agent_id}', NULL, NULL"
                plan = "\n".join(r[0] for r in await one_connection.fetch(f"EXPLAIN EXECUTE probe({values})"))
            finally:
                await one_connection.execute("DEALLOCATE probe")
        name = function["proname"]
        for wrong in ("Seq Scan", "Hash Join", "Merge Join", "Bitmap"):
            assert wrong not in plan, (name, plan)
        assert "Index Scan using memory_usage_pkey" in plan, (name, plan)
        assert plan.count("Nested Loop") == (2 if name == "ibex_bm25_arrays" else 1), (name, plan)
        if name == "ibex_bm25_arrays":
            # One partition's probe, by the tenant and the id (on a database this small the
            # planner may take any index led by the tenant; on the load test's data set it is
            # the primary key, as the statement's custom plan was).
            assert "Subplans Removed: 63" in plan, plan
            assert re.search(r"Index Scan using memories_p\d\d_\w+ on memories_p\d\d", plan), plan
            assert "(id = top.memory_id)" in plan, plan
