"""The seeder's bulk load stores what the service's own write path stores.

The seeder COPYs memories with the triggers off and builds the postings and stats
set-wise afterwards (``loadtest.bulkload``); the service writes through
``MemoryWriteApi`` and the triggers. Same memories, same database: the rows' hashes,
token counts, vectors and lexemes, the postings and the per-agent stats must be equal.
"""

from __future__ import annotations

import asyncio
import json
import random
from itertools import groupby
from pathlib import Path
from typing import Any, cast

import asyncpg
import pytest
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.memory_api.writes import MemoryWriteApi
from ibex_context.models import NewMemory
from ibex_context.stores.base import MemoryWriter
from ibex_context.stores.postgres import PostgresMemoryStore, create_pool
from ibex_context.tokens.encodings import EncodingRegistry

from loadtest import seed

PLAN = seed.SeedPlan(agents=3, memories=30, orgs=2, queries_per_agent=4)
SLICE = 20  # two slices per agent, so slices and their joins are exercised


async def _snapshot(conn: asyncpg.Connection) -> dict[str, Any]:
    memories = await conn.fetch(
        "SELECT org_id, agent_id, id, content_hash, token_counts, embedding::text AS embedding,"
        " lexemes::text AS lexemes FROM memories ORDER BY org_id, agent_id, id"
    )
    postings = await conn.fetch(
        "SELECT org_id, agent_id, lexeme, memory_id, tf, dl FROM memory_terms"
        " ORDER BY org_id, agent_id, lexeme, memory_id"
    )
    stats = await conn.fetch("SELECT org_id, agent_id, memories, lexemes FROM memory_stats ORDER BY 1, 2")
    lexicon = await conn.fetch("SELECT org_id, agent_id, lexeme, df FROM memory_lexicon ORDER BY 1, 2, 3")
    usage = await conn.fetch("SELECT org_id, memories, content_bytes FROM org_usage ORDER BY 1")
    return {
        "memories": [dict(r) | {"token_counts": json.loads(r["token_counts"])} for r in memories],
        "postings": [tuple(r) for r in postings],
        "stats": [tuple(r) for r in stats],
        "lexicon": [tuple(r) for r in lexicon],
        "usage": [tuple(r) for r in usage],
    }


async def _postings_scan(conn: asyncpg.Connection, org_id: Any, agent_id: Any) -> dict[str, Any]:
    """EXPLAIN ANALYZE of reading one agent's postings the way ``ibex_bm25`` does."""
    async with conn.transaction():
        await conn.execute("SET LOCAL enable_seqscan = off")
        await conn.execute("SET LOCAL enable_bitmapscan = off")
        plan = await conn.fetchval(
            "EXPLAIN (ANALYZE, FORMAT JSON) SELECT memory_id, tf, dl FROM memory_terms"
            " WHERE org_id = $1 AND agent_id = $2",
            org_id,
            agent_id,
        )
    return cast(dict[str, Any], json.loads(plan)[0]["Plan"])


async def _write_through_the_service(dsn: str, rows: list[asyncpg.Record]) -> None:
    pool = await create_pool(dsn, min_size=1, max_size=2, ef_search=40)
    try:
        writes = MemoryWriteApi(
            # _store_errors types the store's methods as Awaitable, not Coroutine.
            writer=cast(MemoryWriter, PostgresMemoryStore(pool, ef_search=40)),
            embedder=HashingEmbedder(PLAN.dim),
            encodings=EncodingRegistry(),
        )
        for (org, agent), group in groupby(rows, key=lambda r: (r["org_id"], r["agent_id"])):
            memories = [
                NewMemory(
                    content=r["content"],
                    category=r["category"],
                    confidence=r["confidence"],
                    usefulness=r["usefulness"],
                    id=str(r["id"]),
                    metadata=json.loads(r["metadata"]),
                )
                for r in group
            ]
            await asyncio.wait_for(writes.upsert(str(org), str(agent), memories), timeout=60)
    finally:
        await pool.close()


async def test_a_seed_stores_the_postings_stats_and_counts_the_service_would(
    private_postgres_dsn: str, tmp_path: Path
) -> None:
    report = await asyncio.wait_for(
        seed.seed(
            private_postgres_dsn,
            PLAN,
            tmp_path / "agents.json",
            jobs=1,
            reset=True,
            slice_memories=SLICE,
            log=lambda _line: None,
        ),
        timeout=180,
    )
    assert report.triggers_off, "the bulk path (triggers off, postings built after the COPY) was not taken"
    assert report.memories == PLAN.total_memories
    conn = await asyncpg.connect(private_postgres_dsn)
    try:
        seeded = await _snapshot(conn)
        # Agents this small are searched exactly: no graph (the partitions have none since 0021),
        # and every index the migrations define is valid.
        graphs = await conn.fetchval(
            "SELECT count(*) FROM pg_class AS c JOIN pg_am AS a ON a.oid = c.relam WHERE a.amname = 'hnsw'"
        )
        invalid = await conn.fetchval("SELECT count(*) FROM pg_index WHERE NOT indisvalid")
        rows = await conn.fetch(
            "SELECT org_id, agent_id, id, content, category, confidence, usefulness, metadata"
            " FROM memories ORDER BY org_id, agent_id, id"
        )
        postings_scan = await _postings_scan(conn, rows[0]["org_id"], rows[0]["agent_id"])
        # TRUNCATE fires no row triggers: the service starts from empty tables.
        await conn.execute(
            "TRUNCATE memories, memory_terms, memory_stats, memory_usage, memory_lexicon, org_usage"
        )
        await _write_through_the_service(private_postgres_dsn, rows)
        written = await _snapshot(conn)
    finally:
        await conn.close()

    # The postings were vacuumed after every other transaction of the seed: the lexical
    # search's index-only scans read no heap page.
    assert postings_scan["Node Type"] == "Index Only Scan"
    assert postings_scan["Actual Rows"] > 0
    assert postings_scan["Heap Fetches"] == 0
    assert (graphs, invalid) == (0, 0)
    assert len(seeded["memories"]) == PLAN.total_memories
    assert [s[2] for s in seeded["stats"]] == [PLAN.memories] * PLAN.agents
    assert len(seeded["postings"]) > 20 * PLAN.total_memories
    assert written["memories"] == seeded["memories"]
    assert written["postings"] == seeded["postings"]
    assert written["stats"] == seeded["stats"]


def test_slices_cover_every_agents_memories_in_order() -> None:
    agents = seed.plan_agents(seed.SeedPlan(agents=3, memories=0, large_agents=2, large_memories=12))
    slices = seed.plan_slices(agents, size=5)
    assert [(s.agent.index, s.index, s.memories) for s in slices] == [
        (a.index, i, n) for a in agents for i, n in enumerate([5, 5, 2] if a.memories else [0])
    ]


def test_the_first_slice_of_an_agent_draws_from_the_agents_own_stream() -> None:
    # An agent of at most one slice is generated from the stream unsliced seeds used,
    # so its texts are unchanged; later slices draw from streams of their own.
    plan = seed.SeedPlan(agents=1, memories=10)
    (agent,) = seed.plan_agents(plan)
    first, second = seed.plan_slices([agent], size=5)
    agent_stream = random.Random(f"{plan.seed}:{agent.agent_id}").random()
    assert seed.slice_random(first, plan).random() == agent_stream
    assert seed.slice_random(second, plan).random() != agent_stream


async def test_a_reseed_builds_the_agents_own_graphs_again_instead_of_filling_the_old_ones(
    private_postgres_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Agents past 20 memories get a graph of their own, as the service would give them.
    monkeypatch.setenv("IBEX_COLD_EXACT_MAX_MEMORIES", "20")
    plan = seed.SeedPlan(agents=1, memories=40, orgs=1, queries_per_agent=2)

    async def seeded() -> tuple[int, list[str]]:
        report = await asyncio.wait_for(
            seed.seed(
                private_postgres_dsn,
                plan,
                tmp_path / "agents.json",
                jobs=1,
                reset=True,
                slice_memories=SLICE,
                log=lambda _line: None,
            ),
            timeout=180,
        )
        conn = await asyncpg.connect(private_postgres_dsn)
        try:
            graphs = await conn.fetch(
                "SELECT c.relname FROM pg_class AS c JOIN pg_am AS a ON a.oid = c.relam"
                " WHERE a.amname = 'hnsw'"
            )
        finally:
            await conn.close()
        return report.agent_graphs, [g["relname"] for g in graphs]

    first_built, first = await seeded()
    again_built, again = await seeded()
    assert first_built == again_built == 1, "the reseed built the agent's graph itself"
    assert len(first) == 1 and again == first
