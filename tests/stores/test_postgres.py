"""PostgresMemoryStore against the session's real PostgreSQL + pgvector."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import struct
import time
import uuid
from collections.abc import Callable

import asyncpg
import numpy as np
import pytest
from ibex_context.errors import InvalidRequest, StoreError, StoreUnavailable
from ibex_context.stores.base import Injection
from ibex_context.stores.cold_plan import AgentSizes, ColdMatches, ColdPlan, GraphSearchWidth
from ibex_context.stores.hot_score import hot_set_score
from ibex_context.stores.postgres import (
    FEEDBACK_ALPHA,
    PostgresMemoryStore,
    TokenCountsDecoder,
    create_pool,
    decode_vectors,
)

from tests.conftest import Tenant
from tests.postgres_locks import memories_locked
from tests.stores.helpers import EF_SEARCH, MakeMemory, at_similarity, near, records, unit_vector


async def test_upserting_new_texts_creates_them_in_input_order(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    batch = [make_memory(f"fact number {i}") for i in range(5)]
    results = await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, batch)
    assert [r.id for r in results] == [m.id for m in batch]
    assert {r.outcome for r in results} == {"created"}
    assert await pg_store.count_memories(tenant.org_id, tenant.agent_id) == 5


async def test_reupserting_the_same_text_is_unchanged_and_keeps_the_first_id(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    first = make_memory("The user's name is Priya")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [first])
    again = make_memory("The user's name is Priya")  # same text, a different generated id
    [result] = await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [again])
    assert (result.id, result.outcome) == (first.id, "unchanged")
    assert await pg_store.count_memories(tenant.org_id, tenant.agent_id) == 1


async def test_same_text_with_changed_fields_is_updated_in_place(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    first = make_memory("Prefers metric units", category="preference", confidence=0.6)
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [first])
    changed = make_memory("Prefers metric units", category="preference", confidence=0.9, metadata={"k": 1})
    [result] = await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [changed])
    assert (result.id, result.outcome) == (first.id, "updated")
    [stored] = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [first.id])
    assert stored.confidence == pytest.approx(0.9)


async def test_an_existing_id_with_new_text_replaces_the_content(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    first = make_memory("Lives in Lisbon")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [first])
    moved = make_memory("Lives in Porto", id=first.id)
    [result] = await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [moved])
    assert (result.id, result.outcome) == (first.id, "updated")
    [stored] = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [first.id])
    assert stored.content == "Lives in Porto"
    # The old text is free again: storing it creates a new memory.
    [again] = await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [make_memory("Lives in Lisbon")])
    assert again.outcome == "created"


async def test_duplicates_inside_one_batch_are_stored_once(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    a, b = make_memory("Owns a cat"), make_memory("Owns a cat")
    results = await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [a, b])
    assert [(r.id, r.outcome) for r in results] == [(a.id, "created"), (a.id, "unchanged")]
    assert await pg_store.count_memories(tenant.org_id, tenant.agent_id) == 1


async def test_delete_removes_only_the_named_memories_of_that_agent(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    keep, gone = make_memory("keep me"), make_memory("delete me")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [keep, gone])
    other_org = Tenant(org_id=str(uuid.uuid4()), agent_id=tenant.agent_id)
    assert await pg_store.delete_memories(other_org.org_id, other_org.agent_id, [gone.id]) == 0
    assert await pg_store.delete_memories(tenant.org_id, tenant.agent_id, [gone.id]) == 1
    remaining = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [keep.id, gone.id])
    assert [m.id for m in remaining] == [keep.id]


async def test_the_same_agent_id_under_another_org_sees_nothing(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    memory = make_memory("secret of org A")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    other_org = str(uuid.uuid4())
    assert records(await pg_store.search(other_org, tenant.agent_id, memory.embedding, 10)) == []
    assert await pg_store.fetch_memories(other_org, tenant.agent_id, [memory.id]) == []
    assert await pg_store.top_memories_for_hot_set(other_org, tenant.agent_id, 50) == []
    # The same text in the other org is a separate memory, not a duplicate.
    [result] = await pg_store.upsert_memories(other_org, tenant.agent_id, [make_memory("secret of org A")])
    assert result.outcome == "created" and result.id != memory.id


async def test_cold_search_returns_the_top_k_nearest_first_even_above_ef_search(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    query = unit_vector(1)
    # 60 memories at increasing distance from the query; ask for 50 (ef_search is 64 here,
    # and a limit above it must still be filled: asked 80 -> all 60).
    batch = [
        make_memory(f"memory {i}", embedding=at_similarity(query, 0.95 - 0.01 * i, seed=100 + i))
        for i in range(60)
    ]
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, batch)
    found = records(await pg_store.search(tenant.org_id, tenant.agent_id, query, 50))
    assert len(found) == 50
    assert [m.id for m in found] == [m.id for m in batch[:50]]
    similarities = [m.similarity for m in found]
    assert similarities == sorted(similarities, reverse=True)
    assert found[0].similarity == pytest.approx(0.95, abs=1e-5)
    assert found[0].token_counts == {"o200k_base": 2}
    assert found[0].occurred_at is not None and abs(found[0].occurred_at - time.time()) < 60
    assert len(records(await pg_store.search(tenant.org_id, tenant.agent_id, query, 80))) == 60


async def _tenant_in_the_partition_of(
    conn: asyncpg.Connection, org_id: str, agent_id: str
) -> tuple[str, str]:
    """A fresh (org_id, agent_id) that hashes to the same partition of ``memories``."""
    bound = await conn.fetchval(
        "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_class AS c WHERE c.oid ="
        " (SELECT tableoid FROM memories WHERE org_id = $1 AND agent_id = $2 LIMIT 1)",
        uuid.UUID(org_id),
        uuid.UUID(agent_id),
    )
    modulus, remainder = (int(n) for n in re.findall(r"\d+", bound))
    for _ in range(100 * modulus):
        candidate = (uuid.uuid4(), uuid.uuid4())
        if await conn.fetchval(
            "SELECT satisfies_hash_partition('memories'::regclass, $1, $2, $3::uuid, $4::uuid)",
            modulus,
            remainder,
            *candidate,
        ):
            return str(candidate[0]), str(candidate[1])
    raise AssertionError("no tenant found in that partition")


async def test_the_hnsw_plan_fills_the_limit_for_a_small_tenant_sharing_a_large_ones_partition(
    postgres_dsn: str, pg_store: PostgresMemoryStore, make_memory: MakeMemory
) -> None:
    """The partition's graph holds both tenants' vectors; iterative scan keeps going until
    LIMIT rows pass the tenant filter, and only the asking tenant's rows come back."""
    big = (str(uuid.uuid4()), str(uuid.uuid4()))
    query = unit_vector(7)
    await pg_store.upsert_memories(
        *big, [make_memory(f"big {i}", embedding=near(query, 0.3, seed=i)) for i in range(400)]
    )
    conn = await asyncpg.connect(postgres_dsn)
    try:
        small = await _tenant_in_the_partition_of(conn, *big)
    finally:
        await conn.close()
    await pg_store.upsert_memories(
        *small, [make_memory(f"small {i}", embedding=near(query, 1.5, seed=5000 + i)) for i in range(30)]
    )
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=20)
    try:
        # Every agent with more than 0 memories takes the graph.
        store = PostgresMemoryStore(pool, ef_search=20, exact_max_memories=0)
        found = await store.search(*small, query, 25)
        exact = await PostgresMemoryStore(pool, ef_search=20).search(*small, query, 25)
    finally:
        await pool.close()
    assert isinstance(found, ColdMatches) and found.plan is ColdPlan.HNSW
    assert isinstance(exact, ColdMatches) and exact.plan is ColdPlan.EXACT
    assert len(found) == 25
    assert all(content.startswith("small") for content in found.contents)
    # 25 of 30 from a graph of 430 vectors: the approximate answer is the exact one here.
    assert found.ids == exact.ids


async def test_the_plan_follows_the_agents_memory_count(
    postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=EF_SEARCH)
    now = [0.0]
    sizes = AgentSizes(ttl=60, clock=lambda: now[0])
    store = PostgresMemoryStore(pool, ef_search=EF_SEARCH, exact_max_memories=3, agent_sizes=sizes)
    try:
        query = unit_vector(11)
        await store.upsert_memories(
            tenant.org_id,
            tenant.agent_id,
            [make_memory(f"m {i}", embedding=unit_vector(20 + i)) for i in range(3)],
        )
        first = await store.search(tenant.org_id, tenant.agent_id, query, 10)
        assert isinstance(first, ColdMatches) and first.plan is ColdPlan.EXACT and len(first) == 3
        await store.upsert_memories(
            tenant.org_id,
            tenant.agent_id,
            [make_memory(f"n {i}", embedding=unit_vector(40 + i)) for i in range(2)],
        )
        # The count of 3 is cached: still exact (it finds the new memories all the same).
        cached = await store.search(tenant.org_id, tenant.agent_id, query, 10)
        assert isinstance(cached, ColdMatches) and cached.plan is ColdPlan.EXACT and len(cached) == 5
        now[0] += 61
        grown = await store.search(tenant.org_id, tenant.agent_id, query, 10)
        assert isinstance(grown, ColdMatches) and grown.plan is ColdPlan.HNSW
        assert grown.ids == cached.ids
    finally:
        await store.aclose()


async def test_a_large_agents_graph_search_runs_wider_and_finds_the_exact_answer(
    postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    """Above ``large_agent_memories`` the search sets its own ef_search for its
    transaction; the connection's setting is untouched afterwards."""
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=EF_SEARCH)
    width = GraphSearchWidth(
        ef_search=EF_SEARCH, large_agent_ef_search=EF_SEARCH + 36, large_agent_memories=4
    )
    store = PostgresMemoryStore(pool, ef_search=EF_SEARCH, exact_max_memories=0, graph_width=width)
    try:
        query = unit_vector(5)
        await store.upsert_memories(
            tenant.org_id,
            tenant.agent_id,
            [make_memory(f"w {i}", embedding=near(query, 0.2 * (i + 1), seed=900 + i)) for i in range(6)],
        )
        found = await store.search(tenant.org_id, tenant.agent_id, query, 5)
        exact = await PostgresMemoryStore(pool, ef_search=EF_SEARCH).search(
            tenant.org_id, tenant.agent_id, query, 5
        )
        assert isinstance(found, ColdMatches) and found.plan is ColdPlan.HNSW
        assert isinstance(exact, ColdMatches) and exact.plan is ColdPlan.EXACT
        assert list(found.contents) == list(exact.contents) == [f"w {i}" for i in range(5)]
        async with pool.acquire() as conn:
            assert await conn.fetchval("SHOW hnsw.ef_search") == str(EF_SEARCH)
    finally:
        await store.aclose()


async def test_cancelling_a_blocked_search_cancels_the_query_on_the_server(
    private_postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    pool = await create_pool(private_postgres_dsn, min_size=1, max_size=2, ef_search=EF_SEARCH)
    store = PostgresMemoryStore(pool, ef_search=EF_SEARCH)
    observer = await asyncpg.connect(private_postgres_dsn)
    waiting_sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ibex-context'"
        " AND state = 'active' AND query LIKE '%ibex_cold_%'"
    )

    async def searches_waiting(expected: int) -> int:
        count = -1
        for _ in range(250):
            count = await observer.fetchval(waiting_sql)
            if count == expected:
                break
            await asyncio.sleep(0.02)
        return int(count)

    try:
        await store.upsert_memories(tenant.org_id, tenant.agent_id, [make_memory("blocked")])
        async with memories_locked(private_postgres_dsn):
            # The search waits on this lock just as it would on a slow scan.
            search = asyncio.create_task(store.search(tenant.org_id, tenant.agent_id, unit_vector(3), 5))
            assert await searches_waiting(1) == 1
            search.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(search, timeout=10)
            # Still holding the lock: only a server-side cancel can have ended the query.
            assert await searches_waiting(0) == 0
        # The pool is healthy afterwards.
        assert len(records(await store.search(tenant.org_id, tenant.agent_id, unit_vector(3), 5))) == 1
    finally:
        await observer.close()
        await store.aclose()


async def test_directive_versions_increase_across_set_and_clear(
    pg_store: PostgresMemoryStore, tenant: Tenant
) -> None:
    assert await pg_store.get_directive(tenant.org_id, tenant.agent_id) is None
    assert await pg_store.set_directive(tenant.org_id, tenant.agent_id, "Be brief.", {"o200k_base": 3}) == 1
    assert await pg_store.set_directive(tenant.org_id, tenant.agent_id, "Be brief.", {"o200k_base": 3}) == 1
    assert await pg_store.set_directive(tenant.org_id, tenant.agent_id, "Be kind.", {"o200k_base": 3}) == 2
    directive = await pg_store.get_directive(tenant.org_id, tenant.agent_id)
    assert directive is not None
    assert (directive.content, directive.version, dict(directive.token_counts)) == (
        "Be kind.",
        2,
        {"o200k_base": 3},
    )
    assert await pg_store.clear_directive(tenant.org_id, tenant.agent_id) is True
    assert await pg_store.clear_directive(tenant.org_id, tenant.agent_id) is False
    assert await pg_store.get_directive(tenant.org_id, tenant.agent_id) is None
    assert (await pg_store.get_directive_state(tenant.org_id, tenant.agent_id)).version == 3
    assert await pg_store.set_directive(tenant.org_id, tenant.agent_id, "Be brief.", {}) == 4


async def test_feedback_moves_usefulness_by_an_ema_and_is_logged(
    postgres_dsn: str, pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    memory = make_memory("useful fact", usefulness=0.5)
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    updates = await pg_store.record_feedback(
        tenant.org_id,
        tenant.agent_id,
        str(uuid.uuid4()),
        [(memory.id, "positive"), (memory.id, "positive"), (str(uuid.uuid4()), "negative")],
    )
    first = 0.5 + FEEDBACK_ALPHA * (1 - 0.5)
    second = first + FEEDBACK_ALPHA * (1 - first)
    assert [(u.memory_id, u.previous_usefulness) for u in updates] == [
        (memory.id, 0.5),
        (memory.id, pytest.approx(first)),
    ]
    assert updates[1].new_usefulness == pytest.approx(second, abs=1e-6)
    conn = await asyncpg.connect(postgres_dsn)
    try:
        logged = await conn.fetchval(
            "SELECT count(*) FROM memory_feedback WHERE org_id = $1 AND agent_id = $2",
            uuid.UUID(tenant.org_id),
            uuid.UUID(tenant.agent_id),
        )
    finally:
        await conn.close()
    assert logged == 2
    with pytest.raises(InvalidRequest, match=r"feedback\[0\].kind"):
        await pg_store.record_feedback(tenant.org_id, tenant.agent_id, None, [(memory.id, "great")])


async def test_injections_are_counted_in_one_batch(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    a, b = make_memory("injected twice"), make_memory("injected once")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [a, b])
    at = time.time()
    await pg_store.record_injections(
        [
            Injection(tenant.org_id, tenant.agent_id, a.id, at - 5),
            Injection(tenant.org_id, tenant.agent_id, a.id, at),
            Injection(tenant.org_id, tenant.agent_id, b.id, at),
        ]
    )
    stored = {m.id: m for m in await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [a.id, b.id])}
    assert stored[a.id].retrieval_count == 2 and stored[b.id].retrieval_count == 1
    assert stored[a.id].last_injected_at == pytest.approx(at, abs=1e-3)


async def test_top_memories_for_the_hot_set_follow_the_write_time_score(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    batch = [
        make_memory(f"scored {i}", category=cat, confidence=c, usefulness=u)
        for i, (cat, c, u) in enumerate(
            [("factual", 0.9, 0.9), ("episodic", 0.2, 0.1), ("preference", 0.5, 0.5), ("factual", 0.7, 0.2)]
        )
    ]
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, batch)
    top = await pg_store.top_memories_for_hot_set(tenant.org_id, tenant.agent_id, 3)
    assert len(top) == 3 and all(m.embedding is not None and m.embedding.shape == (384,) for m in top)
    now = time.time()
    stored = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [m.id for m in batch])
    expected = sorted(stored, key=lambda m: -hot_set_score(m, now))[:3]
    assert [m.id for m in top] == [m.id for m in expected]


async def test_ids_that_are_not_uuids_are_rejected_naming_the_field(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    with pytest.raises(InvalidRequest, match="org_id"):
        records(await pg_store.search("not-a-uuid", tenant.agent_id, unit_vector(1), 5))
    with pytest.raises(InvalidRequest, match=r"ids\[1\]"):
        await pg_store.delete_memories(tenant.org_id, tenant.agent_id, [make_memory("x").id, "nope"])


async def test_health_reports_ok(pg_store: PostgresMemoryStore) -> None:
    health = await pg_store.check_health()
    assert health.ok and health.extra["pool_size"] != ""


async def test_warm_up_prepares_the_read_statements_without_touching_any_tenant(
    pg_store: PostgresMemoryStore,
) -> None:
    await pg_store.warm_up()
    assert (await pg_store.check_health()).ok


async def test_pooled_connections_carry_the_search_settings(postgres_dsn: str) -> None:
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=77)
    try:
        async with pool.acquire() as conn:
            await conn.execute("SELECT '[1,2]'::vector")  # loads pgvector, which applies its settings
            assert await conn.fetchval("SHOW hnsw.ef_search") == "77"
            assert await conn.fetchval("SHOW hnsw.iterative_scan") == "relaxed_order"
            assert await conn.fetchval("SHOW plan_cache_mode") == "force_custom_plan"
    finally:
        await pool.close()


async def test_driver_errors_become_store_errors_that_do_not_quote_the_data(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    secret = "my secret memory text"
    wrong_dim = make_memory(secret, embedding=unit_vector(1)[:10])
    with pytest.raises(StoreError) as raised:
        await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [wrong_dim])
    assert secret not in str(raised.value) and raised.value.__cause__ is None
    assert "SQLSTATE" in str(raised.value)


async def test_a_closed_pool_is_store_unavailable(postgres_dsn: str, tenant: Tenant) -> None:
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=64)
    store = PostgresMemoryStore(pool, ef_search=64)
    await store.aclose()
    with pytest.raises(StoreUnavailable):
        await store.get_directive(tenant.org_id, tenant.agent_id)


async def test_concurrent_injection_batches_over_the_same_rows_all_count(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    batch = [make_memory(f"contended {i}") for i in range(20)]
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, batch)
    at = time.time()
    forward = [Injection(tenant.org_id, tenant.agent_id, m.id, at) for m in batch]
    backward = list(reversed(forward))
    await asyncio.gather(*(pg_store.record_injections(forward if i % 2 else backward) for i in range(8)))
    stored = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [m.id for m in batch])
    assert sorted(m.retrieval_count for m in stored) == [8] * 20


async def _memory_row_version(postgres_dsn: str, tenant: Tenant, memory_id: str) -> str:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        ctid: str = await conn.fetchval(
            "SELECT ctid::text || '/' || xmin::text FROM memories"
            " WHERE org_id = $1 AND agent_id = $2 AND id = $3",
            uuid.UUID(tenant.org_id),
            uuid.UUID(tenant.agent_id),
            uuid.UUID(memory_id),
        )
    finally:
        await conn.close()
    return ctid


async def test_injections_never_rewrite_the_memory_row(
    pg_store: PostgresMemoryStore, postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    memory = make_memory("counted elsewhere")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    before = await _memory_row_version(postgres_dsn, tenant, memory.id)
    at = time.time()
    counters = await pg_store.record_injection_counters(
        [Injection(tenant.org_id, tenant.agent_id, memory.id, at) for _ in range(3)]
    )
    await pg_store.record_injections([Injection(tenant.org_id, tenant.agent_id, memory.id, at + 1)])
    assert [(c.memory_id, c.retrieval_count) for c in counters] == [(memory.id, 3)]
    assert counters[0].last_injected_at == pytest.approx(at, abs=1e-3)
    assert await _memory_row_version(postgres_dsn, tenant, memory.id) == before
    [stored] = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [memory.id])
    assert stored.retrieval_count == 4
    [found] = records(await pg_store.search(tenant.org_id, tenant.agent_id, memory.embedding, 5))
    assert (found.retrieval_count, found.last_injected_at) == (4, pytest.approx(at + 1, abs=1e-3))


async def test_injections_of_unknown_or_other_tenants_memories_are_skipped(
    pg_store: PostgresMemoryStore, tenant: Tenant, new_tenant: Callable[[], Tenant], make_memory: MakeMemory
) -> None:
    memory = make_memory("belongs to the first tenant")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    other = new_tenant()
    counters = await pg_store.record_injection_counters(
        [
            Injection(other.org_id, other.agent_id, memory.id, time.time()),
            Injection(tenant.org_id, tenant.agent_id, str(uuid.uuid4()), time.time()),
        ]
    )
    assert counters == []
    [stored] = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [memory.id])
    assert stored.retrieval_count == 0


async def test_a_batch_counts_each_memory_once_whatever_the_spelling_of_its_id(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    """Repeats add up across spellings (PostgreSQL groups by the uuid), the last time
    wins, and the counters come back keyed by canonical text, as the hot set keys them."""
    memory = make_memory("spelt twice")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    shouted = memory.id.upper()
    counters = await pg_store.record_injection_counters(
        [
            Injection(tenant.org_id, tenant.agent_id, memory.id, 1_700_000_000.0),
            Injection(tenant.org_id.upper(), tenant.agent_id, shouted, 1_700_000_005.0),
        ]
    )
    assert [(c.org_id, c.memory_id, c.retrieval_count, c.last_injected_at) for c in counters] == [
        (tenant.org_id, memory.id, 2, 1_700_000_005.0)
    ]


async def test_an_injection_whose_id_is_not_a_uuid_is_refused_naming_it(
    pg_store: PostgresMemoryStore, tenant: Tenant
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        await pg_store.record_injection_counters(
            [
                Injection(tenant.org_id, tenant.agent_id, str(uuid.uuid4()), 1.0),
                Injection(tenant.org_id, tenant.agent_id, "not-a-uuid", 1.0),
            ]
        )
    assert refused.value.field == "injections[1].memory_id"


async def test_deleting_a_memory_deletes_its_counters_and_a_reused_id_starts_from_zero(
    pg_store: PostgresMemoryStore, postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    memory = make_memory("short-lived")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    await pg_store.record_injections([Injection(tenant.org_id, tenant.agent_id, memory.id, time.time())])
    assert await pg_store.delete_memories(tenant.org_id, tenant.agent_id, [memory.id]) == 1
    conn = await asyncpg.connect(postgres_dsn)
    try:
        left = await conn.fetchval(
            "SELECT count(*) FROM memory_usage WHERE org_id = $1 AND agent_id = $2",
            uuid.UUID(tenant.org_id),
            uuid.UUID(tenant.agent_id),
        )
        # A stale counter row (an injection batch that raced the delete) for the same id:
        await conn.execute(
            "INSERT INTO memory_usage (org_id, agent_id, memory_id, retrieval_count) VALUES ($1, $2, $3, 7)",
            uuid.UUID(tenant.org_id),
            uuid.UUID(tenant.agent_id),
            uuid.UUID(memory.id),
        )
    finally:
        await conn.close()
    assert left == 0
    reborn = dataclasses.replace(make_memory("a new text under the old id"), id=memory.id)
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [reborn])
    [stored] = await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [memory.id])
    assert (stored.content, stored.retrieval_count) == ("a new text under the old id", 0)


async def test_vectors_are_stored_inline(postgres_dsn: str) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        storage = await conn.fetchval(
            "SELECT attstorage::text FROM pg_attribute"
            " WHERE attrelid = 'memories'::regclass AND attname = 'embedding'"
        )
    finally:
        await conn.close()
    assert storage == "p"  # PLAIN: never TOASTed, so the exact scan reads no TOAST pages


def test_token_counts_are_parsed_once_per_distinct_text_into_one_read_only_mapping() -> None:
    decode = TokenCountsDecoder(limit=2)
    first, second = decode('{"o200k_base": 7}'), decode('{"o200k_base": 7}')
    assert first == second == {"o200k_base": 7} and first is second  # nothing copied per row
    with pytest.raises(TypeError):
        first["o200k_base"] = 0  # type: ignore[index]  # so no caller can change what others get
    # Past its limit the memo starts over instead of growing.
    assert decode('{"a": 1}') == {"a": 1} and decode('{"b": 2}') == {"b": 2}
    assert decode('{"o200k_base": 7}') == {"o200k_base": 7}


async def test_a_pooled_connection_comes_back_without_an_open_transaction_or_local_setting(
    postgres_dsn: str,
) -> None:
    # The pool skips asyncpg's RESET ALL round trip on release; what a call may leave
    # behind (an unfinished transaction with a SET LOCAL) must still not leak.
    pool = await create_pool(postgres_dsn, min_size=1, max_size=1, ef_search=40)
    try:
        async with pool.acquire() as conn:
            transaction = conn.transaction()
            await transaction.start()
            await conn.execute("SET LOCAL hnsw.ef_search = 999")
        async with pool.acquire() as conn:
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SHOW hnsw.ef_search") == "40"
    finally:
        await pool.close()


async def test_occurred_at_is_stored_kept_on_updates_that_omit_it_and_defaults_to_the_write_time(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    imported = make_memory("met Ana at the Lisbon conference", occurred_at=1_683_554_160.5)
    fresh = make_memory("prefers window seats")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [imported, fresh])
    # The same text again without a time: unchanged, and the imported time stays.
    [again] = await pg_store.upsert_memories(
        tenant.org_id, tenant.agent_id, [make_memory("met Ana at the Lisbon conference")]
    )
    assert again.outcome == "unchanged"
    # A new time for the same text is an update.
    [moved] = await pg_store.upsert_memories(
        tenant.org_id, tenant.agent_id, [make_memory("prefers window seats", occurred_at=1_600_000_000.0)]
    )
    assert moved.outcome == "updated"
    stored = {
        m.content: m.occurred_at
        for m in await pg_store.fetch_memories(tenant.org_id, tenant.agent_id, [imported.id, fresh.id])
    }
    assert stored["met Ana at the Lisbon conference"] == pytest.approx(1_683_554_160.5)
    assert stored["prefers window seats"] == pytest.approx(1_600_000_000.0)


def test_vectors_in_pgvectors_binary_form_become_one_matrix_of_the_most_common_dimension() -> None:
    def binary(*values: float) -> bytes:
        return struct.pack(">HH", len(values), 0) + np.asarray(values, dtype=">f4").tobytes()

    matrix, rows = decode_vectors([binary(1.0, 2.0), None, binary(3.0, 4.0, 5.0), binary(-1.5, 0.25)])
    assert matrix.dtype == np.float32 and matrix.tolist() == [[1.0, 2.0], [-1.5, 0.25]]
    assert rows.tolist() == [0, -1, -1, 1]
    nothing, none = decode_vectors([None, None])
    assert nothing.shape[0] == 0 and none.tolist() == [-1, -1]
