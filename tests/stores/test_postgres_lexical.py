"""The lexical half of the cold search: BM25 over PostgreSQL full-text vectors."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
import numpy as np
from ibex_context.stores.postgres import PostgresMemoryStore

from tests.conftest import Tenant
from tests.stores.helpers import MakeMemory, records


async def _stats(dsn: str, tenant: Tenant) -> tuple[int, int] | None:
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT memories, lexemes FROM memory_stats WHERE org_id = $1 AND agent_id = $2",
            tenant.org_id,
            tenant.agent_id,
        )
    finally:
        await conn.close()
    return None if row is None else (row["memories"], row["lexemes"])


async def test_ranks_by_bm25_with_stemming_and_returns_embeddings(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    memories = [
        make_memory("Caroline went to an LGBTQ support group yesterday"),
        make_memory("Melanie painted a sunrise over the lake"),
        make_memory("The support groups meet every Tuesday"),
        make_memory("We talked about the weather"),
    ]
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, memories)
    found = records(
        await pg_store.search_lexical(
            tenant.org_id, tenant.agent_id, "When did Caroline go to the LGBTQ support group?", 10
        )
    )
    # "groups" matches "group" (english stemming); the weather matches nothing.
    assert [m.content for m in found] == [memories[0].content, memories[2].content]
    assert all(m.lexical_score is not None and m.lexical_score > 0 for m in found)
    assert found[0].lexical_score > found[1].lexical_score  # type: ignore[operator]
    # The vectors come back exactly as written (pgvector's binary form, decoded as one matrix).
    assert found[0].embedding is not None and found[0].embedding.dtype == np.float32
    np.testing.assert_array_equal(found[0].embedding, memories[0].embedding)
    np.testing.assert_array_equal(found[1].embedding, memories[2].embedding)
    assert found[0].similarity is None  # the scorer computes it from the embedding


async def test_rare_words_weigh_more_than_common_ones(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    common = [make_memory(f"Caroline said something ordinary number {i}") for i in range(8)]
    rare = make_memory("a note about the telescope")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [*common, rare])
    found = records(await pg_store.search_lexical(tenant.org_id, tenant.agent_id, "Caroline telescope", 3))
    assert found[0].content == "a note about the telescope"


async def test_a_query_of_stop_words_or_nothing_finds_nothing(
    pg_store: PostgresMemoryStore, tenant: Tenant, make_memory: MakeMemory
) -> None:
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [make_memory("what is it about")])
    assert records(await pg_store.search_lexical(tenant.org_id, tenant.agent_id, "what is it?", 5)) == []
    assert records(await pg_store.search_lexical(tenant.org_id, tenant.agent_id, "   ", 5)) == []


async def test_is_scoped_to_the_org_and_the_agent(
    pg_store: PostgresMemoryStore, tenant: Tenant, new_tenant: Callable[[], Tenant], make_memory: MakeMemory
) -> None:
    other = new_tenant()
    await pg_store.upsert_memories(other.org_id, other.agent_id, [make_memory("the secret launch codes")])
    await pg_store.upsert_memories(other.org_id, tenant.agent_id, [make_memory("the secret launch codes")])
    assert (
        records(await pg_store.search_lexical(tenant.org_id, tenant.agent_id, "secret launch codes", 5)) == []
    )
    assert (
        records(await pg_store.search_lexical(tenant.org_id, other.agent_id, "secret launch codes", 5)) == []
    )


async def test_agent_statistics_follow_inserts_updates_and_deletes(
    pg_store: PostgresMemoryStore, postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    first, second = make_memory("alpha beta gamma"), make_memory("delta epsilon")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [first, second])
    assert await _stats(postgres_dsn, tenant) == (2, 5)
    # Same id, new content: one lexeme fewer.
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [make_memory("alpha beta", id=first.id)])
    assert await _stats(postgres_dsn, tenant) == (2, 4)
    await pg_store.delete_memories(tenant.org_id, tenant.agent_id, [second.id])
    assert await _stats(postgres_dsn, tenant) == (1, 2)


async def _postings(dsn: str, tenant: Tenant) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM memory_terms WHERE org_id = $1 AND agent_id = $2",
                tenant.org_id,
                tenant.agent_id,
            )
        )
    finally:
        await conn.close()


async def test_postings_follow_new_content_feedback_and_deletes(
    pg_store: PostgresMemoryStore, postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    memory = make_memory("the alpine lodge")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    assert await _postings(postgres_dsn, tenant) == 2  # "alpin", "lodg"
    await pg_store.upsert_memories(
        tenant.org_id, tenant.agent_id, [make_memory("a desert camp by the river", id=memory.id)]
    )
    assert records(await pg_store.search_lexical(tenant.org_id, tenant.agent_id, "alpine", 5)) == []
    [found] = records(await pg_store.search_lexical(tenant.org_id, tenant.agent_id, "rivers", 5))
    assert found.id == memory.id
    # Feedback rewrites the row but not its words: the postings stay as they are.
    await pg_store.record_feedback(tenant.org_id, tenant.agent_id, None, [(memory.id, "positive")])
    assert await _postings(postgres_dsn, tenant) == 3  # "desert", "camp", "river"
    await pg_store.delete_memories(tenant.org_id, tenant.agent_id, [memory.id])
    assert await _postings(postgres_dsn, tenant) == 0
    assert records(await pg_store.search_lexical(tenant.org_id, tenant.agent_id, "river", 5)) == []


async def test_a_word_more_memories_hold_than_the_bound_is_left_out_of_the_ranking(
    pg_store: PostgresMemoryStore, postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    # Migration 0009: a word held by more than p_max_df of the agent's memories costs
    # more to read than it tells; the search stays bounded by the rarer words.
    common = [make_memory(f"Caroline said something ordinary number {i}") for i in range(6)]
    rare = make_memory("Caroline looked through the telescope")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [*common, rare])
    conn = await asyncpg.connect(postgres_dsn)
    try:

        async def ranked(max_df: int) -> list[str]:
            rows = await conn.fetch(
                "SELECT memory_id FROM ibex_bm25($1, $2, 'Caroline telescope', 10, $3)",
                tenant.org_id,
                tenant.agent_id,
                max_df,
            )
            return [str(r["memory_id"]) for r in rows]

        # "caroline" is in 7 memories: counted under a bound of 7, left out under 6.
        assert set(await ranked(7)) == {m.id for m in [*common, rare]}
        assert await ranked(6) == [rare.id]
        # The default bound (2,000) is above any small agent: the store's search is unchanged.
        found = records(
            await pg_store.search_lexical(tenant.org_id, tenant.agent_id, "Caroline telescope", 10)
        )
        assert len(found) == 7 and found[0].id == rare.id
    finally:
        await conn.close()
