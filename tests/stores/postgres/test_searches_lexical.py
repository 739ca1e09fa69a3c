"""The lexical half of the cold search: BM25 over PostgreSQL full-text vectors."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

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


async def _ranked(dsn: str, tenant: Tenant, query: str, term_postings: int) -> list[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT memory_id FROM ibex_bm25($1, $2, $3, 10, $4)",
            tenant.org_id,
            tenant.agent_id,
            query,
            term_postings,
        )
    finally:
        await conn.close()
    return [str(r["memory_id"]) for r in rows]


async def test_each_word_reads_at_most_its_best_postings_by_weight(
    pg_store: PostgresMemoryStore, postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    # Migration 0012: a word's postings are read best first (shorter memories weigh more
    # at tf = 1), at most p_term_postings of them.
    memories = [make_memory("harbour " + " ".join(f"filler{j}" for j in range(i))) for i in range(6)]
    others = [make_memory(f"an unrelated memory {i}") for i in range(7)]
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [*memories, *others])
    assert await _ranked(postgres_dsn, tenant, "harbour", 3) == [m.id for m in memories[:3]]
    assert await _ranked(postgres_dsn, tenant, "harbour", 10) == [m.id for m in memories]


async def test_a_word_held_by_most_memories_is_read_to_the_bound_not_left_out(
    pg_store: PostgresMemoryStore, postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    common = [make_memory(f"Caroline said something ordinary number {i}") for i in range(6)]
    rare = make_memory("Caroline looked through the telescope")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [*common, rare])
    # "caroline" is in all 7 memories: under a bound of 3 its 3 best postings are read (the
    # shortest memories: the rare one and two others), under 7 all of them.
    ranked = await _ranked(postgres_dsn, tenant, "Caroline telescope", 3)
    assert len(ranked) == 3 and ranked[0] == rare.id
    assert set(await _ranked(postgres_dsn, tenant, "Caroline telescope", 7)) == {
        m.id for m in [*common, rare]
    }
    # The store's default bound (500) is above any small agent: every match is ranked.
    found = records(await pg_store.search_lexical(tenant.org_id, tenant.agent_id, "Caroline telescope", 10))
    assert len(found) == 7 and found[0].id == rare.id


async def _lexicon(dsn: str, tenant: Tenant) -> tuple[dict[str, int], dict[str, int]]:
    """The agent's document frequencies as kept (memory_lexicon, zeros left out) and as
    counted from its postings."""
    conn = await asyncpg.connect(dsn)
    try:
        kept = await conn.fetch(
            "SELECT lexeme, df FROM memory_lexicon WHERE org_id = $1 AND agent_id = $2 AND df > 0",
            tenant.org_id,
            tenant.agent_id,
        )
        counted = await conn.fetch(
            "SELECT lexeme, count(*) AS df FROM memory_terms WHERE org_id = $1 AND agent_id = $2"
            " GROUP BY lexeme",
            tenant.org_id,
            tenant.agent_id,
        )
    finally:
        await conn.close()
    return {r["lexeme"]: r["df"] for r in kept}, {r["lexeme"]: r["df"] for r in counted}


async def test_document_frequencies_follow_inserts_updates_feedback_and_deletes(
    pg_store: PostgresMemoryStore, postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    first, second = make_memory("river camp river"), make_memory("river lodge")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [first, second])
    kept, counted = await _lexicon(postgres_dsn, tenant)
    assert kept == counted == {"river": 2, "camp": 1, "lodg": 1}
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [make_memory("desert camp", id=first.id)])
    await pg_store.record_feedback(tenant.org_id, tenant.agent_id, None, [(second.id, "positive")])
    kept, counted = await _lexicon(postgres_dsn, tenant)
    assert kept == counted == {"river": 1, "camp": 1, "lodg": 1, "desert": 1}
    await pg_store.delete_memories(tenant.org_id, tenant.agent_id, [first.id, second.id])
    assert await _lexicon(postgres_dsn, tenant) == ({}, {})


async def _lexicon_rows(dsn: str, tenant: Tenant) -> dict[str, int]:
    """Every row of the agent's lexicon, zeros included."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT lexeme, df FROM memory_lexicon WHERE org_id = $1 AND agent_id = $2",
            tenant.org_id,
            tenant.agent_id,
        )
    finally:
        await conn.close()
    return {r["lexeme"]: r["df"] for r in rows}


async def test_a_lexeme_no_memory_holds_any_more_leaves_the_agents_lexicon(
    pg_store: PostgresMemoryStore,
    postgres_dsn: str,
    tenant: Tenant,
    new_tenant: Callable[[], Tenant],
    make_memory: MakeMemory,
) -> None:
    # Migration 0023: under churn the rows at df 0 were the one thing that grew.
    other = new_tenant()
    first, second = make_memory("river camp"), make_memory("river lodge")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [first, second])
    await pg_store.upsert_memories(other.org_id, other.agent_id, [make_memory("river lodge")])
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [make_memory("river cabin", id=second.id)])
    assert await _lexicon_rows(postgres_dsn, tenant) == {"river": 2, "camp": 1, "cabin": 1}
    await pg_store.delete_memories(tenant.org_id, tenant.agent_id, [first.id])
    assert await _lexicon_rows(postgres_dsn, tenant) == {"river": 1, "cabin": 1}
    await pg_store.delete_memories(tenant.org_id, tenant.agent_id, [second.id])
    assert await _lexicon_rows(postgres_dsn, tenant) == {}
    # Another agent holding the same words keeps them.
    assert await _lexicon_rows(postgres_dsn, other) == {"river": 1, "lodg": 1}


_DELETE_ONE = "DELETE FROM memories WHERE org_id = $1 AND agent_id = $2 AND id = $3"


async def _write_behind_open_transaction(
    dsn: str, statement: str, args: Sequence[object], write: Coroutine[Any, Any, object]
) -> None:
    """Runs ``statement`` in a transaction left open, starts ``write``, waits (10 s at
    most) until ``write`` waits on a lock of that transaction, commits, and lets ``write``
    finish (10 s at most)."""
    holder, watcher = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        async with holder.transaction():
            await holder.execute(statement, *args)
            task = asyncio.create_task(write)
            pid = holder.get_server_pid()
            for _ in range(400):
                if await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", pid
                ):
                    break
                await asyncio.sleep(0.025)
            else:
                raise AssertionError("no writer waited on the open transaction")
        await asyncio.wait_for(task, 10)
    finally:
        await holder.close()
        await watcher.close()


async def test_a_lexeme_pruned_while_another_writer_adds_it_is_counted_once(
    pg_store: PostgresMemoryStore, postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    # The last memory holding "lighthouse" is deleted in a transaction left open, which
    # prunes the lexeme's row; a write adding the lexeme waits on that row, then inserts it.
    last = make_memory("a lighthouse")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [last, make_memory("a harbour")])
    await _write_behind_open_transaction(
        postgres_dsn,
        _DELETE_ONE,
        (tenant.org_id, tenant.agent_id, last.id),
        pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [make_memory("lighthouse keeper")]),
    )
    kept, counted = await _lexicon(postgres_dsn, tenant)
    assert kept == counted == {"lighthous": 1, "keeper": 1, "harbour": 1}
    assert await _lexicon_rows(postgres_dsn, tenant) == kept


async def test_a_lexeme_added_while_another_writer_deletes_it_is_kept(
    pg_store: PostgresMemoryStore, postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    # The other order: a memory holding "lighthouse" is added in a transaction left open;
    # the delete of the lexeme's other memory waits, lowers it to 1 and leaves the row.
    old = make_memory("a lighthouse")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [old])
    await _write_behind_open_transaction(
        postgres_dsn,
        "INSERT INTO memories (org_id, agent_id, id, content, content_hash, category, embedding)"
        " SELECT org_id, agent_id, gen_random_uuid(), 'lighthouse keeper', 'keeper', category,"
        " embedding FROM memories WHERE org_id = $1 AND agent_id = $2 AND id = $3",
        (tenant.org_id, tenant.agent_id, old.id),
        pg_store.delete_memories(tenant.org_id, tenant.agent_id, [old.id]),
    )
    kept, counted = await _lexicon(postgres_dsn, tenant)
    assert kept == counted == {"lighthous": 1, "keeper": 1}
    assert await _lexicon_rows(postgres_dsn, tenant) == kept


async def test_writers_deleting_memories_that_share_lexemes_do_not_deadlock(
    pg_store: PostgresMemoryStore, postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    # Each delete lowers the shared lexemes in key order and prunes only rows it lowered.
    first, second = make_memory("zebra yak xylophone"), make_memory("xylophone yak zebra quartz")
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [first, second])
    await _write_behind_open_transaction(
        postgres_dsn,
        _DELETE_ONE,
        (tenant.org_id, tenant.agent_id, second.id),
        pg_store.delete_memories(tenant.org_id, tenant.agent_id, [first.id]),
    )
    assert await _lexicon_rows(postgres_dsn, tenant) == {}


async def test_a_fresh_agents_search_reads_only_its_query_words_best_postings(
    pg_store: PostgresMemoryStore, postgres_dsn: str, tenant: Tenant, make_memory: MakeMemory
) -> None:
    """Issue 26: with no statistics for freshly written postings, 0009's generic plan read
    every posting of the agent. The per-word probes read at most the bound per word,
    whatever the statistics say (index entries counted by PostgreSQL's own statistics)."""
    # 100 of 251 memories hold "harbour", one "lighthouse"; ~2,500 postings in all.
    memories = [
        make_memory(("harbour " if i < 100 else "") + " ".join(f"w{i}x{j}" for j in range(9)))
        for i in range(250)
    ]
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [*memories, make_memory("a lighthouse")])
    conn = await asyncpg.connect(postgres_dsn)
    try:

        async def entries_read() -> int:
            await conn.execute("SELECT pg_stat_force_next_flush()")
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            return int(
                await conn.fetchval(
                    "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'memory_terms_pkey'"
                )
            )

        before = await entries_read()
        rows = await conn.fetch(
            "SELECT memory_id FROM ibex_bm25($1, $2, 'harbour lighthouse', 50, 20)",
            tenant.org_id,
            tenant.agent_id,
        )
        read = await entries_read() - before
    finally:
        await conn.close()
    # 20 "harbour" postings and the one "lighthouse" posting are read (a range scan may
    # look at one entry past its end).
    assert len(rows) == 21
    assert read <= 2 * (20 + 1 + 1)
