"""Versioned migrations: ordered, recorded, idempotent, safe to run concurrently."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import asyncpg
import pytest
from ibex_context.errors import ConfigurationError
from ibex_context.stores.postgres.graphs import graph_index_name
from ibex_context.stores.postgres.migrate import (
    apply_migrations,
    check_schema,
    load_migrations,
    migrate,
    render,
)


async def test_the_session_database_has_every_migration_recorded_and_its_dim(postgres_dsn: str) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        versions = await conn.fetch("SELECT version, name FROM schema_migrations ORDER BY version")
        dim = await conn.fetchval("SELECT value FROM ibex_meta WHERE key = 'embedding_dim'")
    finally:
        await conn.close()
    assert [r["name"] for r in versions] == [m.name for m in load_migrations()]
    assert [r["version"] for r in versions] == sorted(r["version"] for r in versions)
    assert dim == "384"


async def test_a_database_lacking_a_migration_of_this_build_is_refused_naming_it(
    empty_database_dsn: str,
) -> None:
    conn = await asyncpg.connect(empty_database_dsn)
    try:
        with pytest.raises(ConfigurationError, match=f"lacks {len(load_migrations())} migration"):
            await check_schema(conn, 384)
        *older, newest = load_migrations()
        await apply_migrations(conn, 384, older)
        with pytest.raises(ConfigurationError, match=rf"\({newest.name}\): run `ibex-context migrate`"):
            await check_schema(conn, 384)
        await apply_migrations(conn, 384)
        await check_schema(conn, 384)
        with pytest.raises(ConfigurationError, match="embedding_dim"):
            await check_schema(conn, 1024)
    finally:
        await conn.close()


def test_the_dimension_is_substituted_without_touching_other_braces() -> None:
    assert render("vector({embedding_dim}) DEFAULT '{}'::jsonb", 384) == "vector(384) DEFAULT '{}'::jsonb"


def test_a_badly_named_migration_file_is_a_configuration_error(tmp_path: Path) -> None:
    (tmp_path / "1_oops.sql").write_text("SELECT 1")
    with pytest.raises(ConfigurationError, match="NNNN_name"):
        load_migrations(tmp_path)


async def test_migrating_twice_applies_nothing_the_second_time(postgres_dsn: str) -> None:
    assert await migrate(postgres_dsn, 384) == []


async def test_migrating_with_another_embedding_dim_is_a_configuration_error(postgres_dsn: str) -> None:
    with pytest.raises(ConfigurationError, match="embedding_dim"):
        await migrate(postgres_dsn, 1024)


async def test_concurrent_migrators_apply_each_migration_once(empty_database_dsn: str) -> None:
    dsn = empty_database_dsn
    results = await asyncio.gather(*(migrate(dsn, 384) for _ in range(4)))
    applied = [name for result in results for name in result]
    assert sorted(applied) == sorted(m.name for m in load_migrations())
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == len(load_migrations())
        assert await apply_migrations(conn, 384) == []
    finally:
        await conn.close()


async def test_the_usage_migration_carries_existing_counters_over(empty_database_dsn: str) -> None:
    conn = await asyncpg.connect(empty_database_dsn)
    try:
        migrations = load_migrations()
        before_usage = [m for m in migrations if m.version < 3]
        assert await apply_migrations(conn, 8, before_usage) == [m.name for m in before_usage]
        await conn.execute(
            "INSERT INTO memories (org_id, agent_id, id, content, content_hash, category, retrieval_count,"
            " last_injected_at, embedding) VALUES"
            " (gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'used', 'a', 'factual', 5, now(),"
            "  '[1,0,0,0,0,0,0,0]'),"
            " (gen_random_uuid(), gen_random_uuid(), gen_random_uuid(), 'unused', 'b', 'factual', 0, NULL,"
            "  '[0,1,0,0,0,0,0,0]')"
        )
        assert await apply_migrations(conn, 8) == [m.name for m in migrations if m.version >= 3]
        usage = await conn.fetch(
            "SELECT u.retrieval_count, u.last_injected_at IS NOT NULL AS injected FROM memory_usage AS u"
            " JOIN memories AS m ON m.org_id = u.org_id AND m.agent_id = u.agent_id AND m.id = u.memory_id"
        )
        assert [(r["retrieval_count"], r["injected"]) for r in usage] == [(5, True)]
    finally:
        await conn.close()


async def test_the_partitioning_migration_keeps_every_memory_and_what_is_derived_from_them(
    empty_database_dsn: str,
) -> None:
    """A database at the schema before 0008, with data, migrated: the same rows, postings
    and counts in a partitioned table whose triggers, constraints and searches work."""
    conn = await asyncpg.connect(empty_database_dsn)
    try:
        migrations = load_migrations()
        before = [m for m in migrations if m.version < 8]
        await apply_migrations(conn, 8, before)
        tenants = [(uuid.uuid4(), uuid.uuid4()), (uuid.uuid4(), uuid.uuid4())]
        rows = [
            (
                org,
                agent,
                f"the cat number {n} sat on mats",
                f"{org}{n}".encode(),
                f"[{n + 1},1,0,0,0,0,0,{12 - n}]",
                n,
            )
            for org, agent in tenants
            for n in range(12)
        ]
        await conn.executemany(
            "INSERT INTO memories (org_id, agent_id, id, content, content_hash, category, embedding,"
            " occurred_at) VALUES ($1, $2, gen_random_uuid(), $3, $4, 'factual', $5::text::vector,"
            " now() - $6 * interval '1 day')",
            rows,
        )
        await conn.execute(
            "DELETE FROM memories WHERE content = 'the cat number 11 sat on mats' AND org_id = $1",
            tenants[0][0],
        )
        snapshot = (
            "SELECT org_id, agent_id, id, content, content_hash, category, embedding::text, occurred_at,"
            " created_at, lexemes::text FROM memories ORDER BY org_id, agent_id, id"
        )
        derived = (
            # The postings' own columns: 0012 adds a derived one.
            "SELECT (SELECT array_agg(p ORDER BY p) FROM ("
            " SELECT (t.org_id, t.agent_id, t.lexeme, t.memory_id, t.tf, t.dl)::text AS p"
            " FROM memory_terms AS t)"
            " AS postings),"
            " (SELECT array_agg(s ORDER BY s::text) FROM memory_stats AS s)"
        )
        exact = (
            "SELECT id FROM memories WHERE org_id = $1 AND agent_id = $2"
            " ORDER BY embedding <=> '[1,1,0,0,0,0,0,0]' LIMIT 5"
        )
        memories_before = await conn.fetch(snapshot)
        derived_before = await conn.fetchrow(derived)
        nearest_before = [r["id"] for r in await conn.fetch(exact, *tenants[1])]

        # Up to 0020: the partitions' graphs as 0008-0020 kept them (0021 drops them).
        until_0020 = [m for m in migrations if m.version <= 20]
        assert await apply_migrations(conn, 8, until_0020) == [m.name for m in until_0020 if m.version >= 8]

        assert (
            await conn.fetchval(
                "SELECT count(*) FROM pg_partitioned_table WHERE partrelid = 'memories'::regclass"
            )
            == 1
        )
        assert (
            await conn.fetchval("SELECT count(*) FROM pg_inherits WHERE inhparent = 'memories'::regclass")
            == 64
        )
        assert [tuple(r) for r in await conn.fetch(snapshot)] == [tuple(r) for r in memories_before]
        assert tuple(await conn.fetchrow(derived)) == tuple(derived_before)
        indexes = {
            r[0] for r in await conn.fetch("SELECT indexname FROM pg_indexes WHERE tablename = 'memories'")
        }
        assert {
            "memories_pkey",
            "memories_org_id_agent_id_content_hash_key",
            "memories_tenant_created",
            "memories_tenant_occurred",
            "memories_embedding_hnsw",
        } <= indexes
        storage = await conn.fetch(
            "SELECT DISTINCT a.attstorage::text FROM pg_attribute AS a"
            " JOIN pg_inherits AS i ON i.inhrelid = a.attrelid"
            " WHERE i.inhparent = 'memories'::regclass AND a.attname = 'embedding'"
        )
        assert [r[0] for r in storage] == ["p"]  # the vector stays inline (0003)
        for plan in ("exact", "hnsw"):
            found = await conn.fetch(
                f"SELECT id FROM ibex_cold_{plan}($1, $2, '[1,1,0,0,0,0,0,0]', 5)", *tenants[1]
            )
            assert [r["id"] for r in found] == nearest_before

        org, agent = tenants[0]
        stats = "SELECT memories FROM memory_stats WHERE org_id = $1 AND agent_id = $2"
        assert await conn.fetchval(stats, org, agent) == 11
        await conn.execute(
            "INSERT INTO memories (org_id, agent_id, id, content, content_hash, category, embedding)"
            " VALUES ($1, $2, gen_random_uuid(), 'a zebra', 'z', 'factual', '[0,0,0,0,0,0,0,1]')",
            org,
            agent,
        )
        assert await conn.fetchval(stats, org, agent) == 12
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM memory_terms WHERE org_id = $1 AND agent_id = $2 AND lexeme = 'zebra'",
                org,
                agent,
            )
            == 1
        )
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(
                "INSERT INTO memories (org_id, agent_id, id, content, content_hash, category, embedding)"
                " VALUES ($1, $2, gen_random_uuid(), 'a zebra again', 'z', 'factual', '[0,0,0,0,0,0,0,1]')",
                org,
                agent,
            )
        await conn.execute(
            "DELETE FROM memories WHERE org_id = $1 AND agent_id = $2 AND content = 'a zebra'", org, agent
        )
        assert await conn.fetchval(stats, org, agent) == 11
    finally:
        await conn.close()


async def test_the_recall_migration_rebuilds_every_partitions_graph_with_twice_the_links(
    empty_database_dsn: str,
) -> None:
    """A database at 0009 with data, migrated: every partition's graph is rebuilt with
    m 32 / ef_construction 128 under the old names, the rows are untouched, and the graph
    plan finds what the exact plan finds."""
    conn = await asyncpg.connect(empty_database_dsn)
    try:
        migrations = load_migrations()
        await apply_migrations(conn, 8, [m for m in migrations if m.version < 10])
        tenants = [(uuid.uuid4(), uuid.uuid4()) for _ in range(6)]
        await conn.executemany(
            "INSERT INTO memories (org_id, agent_id, id, content, content_hash, category, embedding)"
            " VALUES ($1, $2, gen_random_uuid(), $3, $4, 'factual', $5::text::vector)",
            [
                (org, agent, f"note {n}", f"{agent}{n}".encode(), f"[{n + 1},1,{n % 3},0,0,0,0,{9 - n}]")
                for org, agent in tenants
                for n in range(10)
            ],
        )
        snapshot = "SELECT org_id, agent_id, id, content, embedding::text FROM memories ORDER BY 1, 2, 3"
        before = [tuple(r) for r in await conn.fetch(snapshot)]
        graphs = (
            "SELECT c.relname, c.reloptions::text[] FROM pg_inherits AS i"
            " JOIN pg_class AS c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = 'memories_embedding_hnsw'::regclass ORDER BY 1"
        )
        assert {tuple(r["reloptions"]) for r in await conn.fetch(graphs)} == {("m=16", "ef_construction=64")}

        until_0020 = [m for m in migrations if m.version <= 20]
        assert await apply_migrations(conn, 8, until_0020) == [m.name for m in until_0020 if m.version >= 10]

        rebuilt = await conn.fetch(graphs)
        assert [r["relname"] for r in rebuilt] == [f"memories_p{n:02d}_embedding_idx" for n in range(64)]
        assert {tuple(r["reloptions"]) for r in rebuilt} == {("m=32", "ef_construction=128")}
        assert await conn.fetchval(
            "SELECT reloptions::text[] FROM pg_class WHERE relname = 'memories_embedding_hnsw'"
        ) == ["m=32", "ef_construction=128"]
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM pg_indexes"
                " WHERE tablename = 'memories' AND indexdef LIKE '%USING hnsw%'"
            )
            == 1
        )
        assert [tuple(r) for r in await conn.fetch(snapshot)] == before
        for org, agent in tenants:
            plans = [
                [
                    r["id"]
                    for r in await conn.fetch(
                        f"SELECT id FROM ibex_cold_{plan}($1, $2, '[1,1,0,0,0,0,0,1]', 4)", org, agent
                    )
                ]
                for plan in ("exact", "hnsw")
            ]
            assert plans[0] == plans[1] and len(plans[0]) == 4
    finally:
        await conn.close()


async def test_graphs_built_beforehand_partition_by_partition_are_swapped_in_not_rebuilt(
    empty_database_dsn: str,
) -> None:
    """ADR-0009's online path for 0010: the parent index made ON ONLY the table, each
    partition's graph built (CONCURRENTLY in production) and attached. Until every
    partition is attached the migration refuses; then it only swaps the names."""
    conn = await asyncpg.connect(empty_database_dsn)
    try:
        migrations = load_migrations()
        await apply_migrations(conn, 8, [m for m in migrations if m.version < 10])
        await conn.execute(
            "CREATE INDEX memories_embedding_hnsw_m32 ON ONLY memories"
            " USING hnsw (embedding vector_cosine_ops) WITH (m = 32, ef_construction = 128)"
        )
        with pytest.raises(asyncpg.RaiseError, match="attach every partition"):
            await apply_migrations(conn, 8, [m for m in migrations if m.version <= 20])
        assert await conn.fetchval("SELECT max(version) FROM schema_migrations") == 9
        for n in range(64):
            await conn.execute(
                f"CREATE INDEX memories_p{n:02d}_graph_m32 ON memories_p{n:02d}"
                " USING hnsw (embedding vector_cosine_ops) WITH (m = 32, ef_construction = 128)"
            )
            await conn.execute(
                f"ALTER INDEX memories_embedding_hnsw_m32 ATTACH PARTITION memories_p{n:02d}_graph_m32"
            )
        built = await conn.fetchval(
            "SELECT array_agg(inhrelid::oid ORDER BY inhrelid) FROM pg_inherits"
            " WHERE inhparent = 'memories_embedding_hnsw_m32'::regclass"
        )

        until_0020 = [m for m in migrations if m.version <= 20]
        assert await apply_migrations(conn, 8, until_0020) == [m.name for m in until_0020 if m.version >= 10]

        swapped = await conn.fetch(
            "SELECT inhrelid::oid AS oid, inhrelid::regclass::text AS name FROM pg_inherits"
            " WHERE inhparent = 'memories_embedding_hnsw'::regclass ORDER BY inhrelid"
        )
        assert [r["oid"] for r in swapped] == built
        assert sorted(r["name"] for r in swapped) == [f"memories_p{n:02d}_embedding_idx" for n in range(64)]
    finally:
        await conn.close()


async def test_the_partitions_graphs_are_dropped_and_the_previous_builds_search_still_answers(
    empty_database_dsn: str,
) -> None:
    """0021: a database at 0020 with agents, one with a graph of its own, migrated: no
    partition keeps a graph over every tenant, the agent's own graph stays, the rows are
    untouched, and the partitions' graph search a process of the previous build still
    calls during a rollout returns the exact answer."""
    conn = await asyncpg.connect(empty_database_dsn)
    try:
        migrations = load_migrations()
        await apply_migrations(conn, 8, [m for m in migrations if m.version <= 20])
        tenants = [(uuid.uuid4(), uuid.uuid4()) for _ in range(4)]
        await conn.executemany(
            "INSERT INTO memories (org_id, agent_id, id, content, content_hash, category, embedding)"
            " VALUES ($1, $2, gen_random_uuid(), $3, $4, 'factual', $5::text::vector)",
            [
                (org, agent, f"note {n}", f"{agent}{n}".encode(), f"[{n + 1},1,{n % 3},0,0,0,0,{9 - n}]")
                for org, agent in tenants
                for n in range(10)
            ],
        )
        org, agent = tenants[0]
        partition = await conn.fetchval(
            "SELECT tableoid::regclass::text FROM memories WHERE org_id = $1 AND agent_id = $2 LIMIT 1",
            org,
            agent,
        )
        own = graph_index_name(org, agent)
        await conn.execute(
            f"CREATE INDEX {own} ON {partition} USING hnsw ((embedding::halfvec(8)) halfvec_cosine_ops)"
            f" WHERE org_id = '{org}'::uuid AND agent_id = '{agent}'::uuid"
        )
        hnsw = (
            "SELECT indexrelid::regclass::text FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
        )
        hnsw += " WHERE c.relam = (SELECT oid FROM pg_am WHERE amname = 'hnsw') ORDER BY 1"
        assert len(await conn.fetch(hnsw)) >= 64 + 1  # each partition's (and the parent's), the agent's
        snapshot = "SELECT org_id, agent_id, id, content, embedding::text FROM memories ORDER BY 1, 2, 3"
        before = [tuple(r) for r in await conn.fetch(snapshot)]

        assert await apply_migrations(conn, 8, [m for m in migrations if m.version <= 21]) == [
            "0021_partition_graphs_dropped"
        ]

        assert [r[0] for r in await conn.fetch(hnsw)] == [own]
        assert [tuple(r) for r in await conn.fetch(snapshot)] == before
        for org, agent in tenants:
            exact = await conn.fetch(
                "SELECT id FROM memories WHERE org_id = $1 AND agent_id = $2"
                " ORDER BY embedding <=> '[1,1,0,0,0,0,0,1]', id LIMIT 4",
                org,
                agent,
            )
            previous = await conn.fetchrow(
                "SELECT * FROM ibex_cold_hnsw_arrays($1, $2, '[1,1,0,0,0,0,0,1]', 4, 40)", org, agent
            )
            assert previous is not None and [str(i) for i in previous[0]] == [str(r["id"]) for r in exact]
    finally:
        await conn.close()


async def test_the_graphs_recorded_before_sparse_ones_existed_are_recorded_by_their_links(
    empty_database_dsn: str,
) -> None:
    """0022: a half-precision graph (0019) is dense, 48 links; one built before 0019, 32."""
    conn = await asyncpg.connect(empty_database_dsn)
    try:
        migrations = load_migrations()
        await apply_migrations(conn, 8, [m for m in migrations if m.version <= 21])
        recorded = [(uuid.uuid4(), uuid.uuid4(), halfvec) for halfvec in (True, False)]
        await conn.executemany(
            "INSERT INTO agent_graphs (org_id, agent_id, index_name, ready, halfvec)"
            " VALUES ($1, $2, $3, true, $4)",
            [
                (org, agent, f"memories_agent_{n}", halfvec)
                for n, (org, agent, halfvec) in enumerate(recorded)
            ],
        )
        assert await apply_migrations(conn, 8, [m for m in migrations if m.version <= 22]) == [
            "0022_sparse_agent_graphs"
        ]
        links = await conn.fetch(
            "SELECT halfvec, links, rebuild_requested_at FROM agent_graphs ORDER BY links DESC"
        )
        assert [tuple(r) for r in links] == [(True, 48, None), (False, 32, None)]
    finally:
        await conn.close()


async def test_the_narrow_exact_ranking_returns_what_the_wide_one_did(empty_database_dsn: str) -> None:
    """0011 reworks ibex_cold_exact (rank on ids, then read the winners): for every tenant
    and limit, the same rows with the same columns, distances and order as 0008's, ties
    between equal vectors included; other tenants' rows never appear."""
    conn = await asyncpg.connect(empty_database_dsn)
    try:
        migrations = load_migrations()
        await apply_migrations(conn, 8, [m for m in migrations if m.version < 11])
        tenants = [(uuid.uuid4(), uuid.uuid4()) for _ in range(3)]
        await conn.executemany(
            "INSERT INTO memories (org_id, agent_id, id, content, content_hash, category, confidence,"
            " usefulness, token_counts, embedding, occurred_at)"
            " VALUES ($1, $2, gen_random_uuid(), $3, $4, 'factual', $5, 0.5, $6::jsonb, $7::text::vector,"
            " CASE WHEN $8 THEN now() - interval '3 days' END)",
            [
                (
                    org,
                    agent,
                    f"note {n} of {t}",
                    f"{agent}{n}".encode(),
                    0.1 * (n % 10),
                    f'{{"cl100k_base": {n + 3}}}',
                    # Every third vector repeats another: equal distances, ties to keep in order.
                    f"[{(n % 7) + 1},1,{n % 3},0,{t},0,0,{9 - n % 5}]",
                    n % 2 == 0,
                )
                for t, (org, agent) in enumerate(tenants)
                for n in range(25)
            ],
        )
        queries = ["[1,1,0,0,0,0,0,1]", "[7,0,2,0,1,0,0,3]", "[0,0,0,0,2,0,0,0]"]
        # 0008's columns (0018 adds each row's vector after them).
        search = (
            "SELECT id, content, category, confidence, usefulness, occurred_at, created_at, token_counts,"
            " distance FROM ibex_cold_exact($1, $2, $3::text::vector, $4)"
        )
        source = "SELECT prosrc FROM pg_proc WHERE proname = 'ibex_cold_exact'"

        async def answers() -> list[list[tuple[object, ...]]]:
            return [
                [tuple(r) for r in await conn.fetch(search, org, agent, query, limit)]
                for org, agent in tenants
                for query in queries
                for limit in (1, 5, 24, 50)
            ]

        wide, wide_source = await answers(), await conn.fetchval(source)
        assert await apply_migrations(conn, 8) == [m.name for m in migrations if m.version >= 11]
        assert await conn.fetchval(source) != wide_source
        narrow = await answers()
        assert narrow == wide
        assert [len(rows) for rows in narrow[:4]] == [1, 5, 24, 25]
        own = {
            r["id"] for r in await conn.fetch("SELECT id FROM memories WHERE agent_id = $1", tenants[0][1])
        }
        assert {row[0] for rows in narrow[:12] for row in rows} <= own
    finally:
        await conn.close()


async def test_the_bounded_lexical_migration_derives_each_agents_document_frequencies(
    empty_database_dsn: str,
) -> None:
    """A database at 0011 with data (written, rewritten and deleted by SQL), migrated:
    every agent's lexicon equals its postings' counts, the postings carry their order, the
    search ranks as before, and later writes keep the lexicon."""
    conn = await asyncpg.connect(empty_database_dsn)
    try:
        migrations = load_migrations()
        await apply_migrations(conn, 8, [m for m in migrations if m.version < 12])
        tenants = [(uuid.uuid4(), uuid.uuid4()), (uuid.uuid4(), uuid.uuid4())]
        words = ["harbour", "lighthouse", "river", "camp", "telescope", "garden"]
        await conn.executemany(
            "INSERT INTO memories (org_id, agent_id, id, content, content_hash, category, embedding)"
            " VALUES ($1, $2, gen_random_uuid(), $3, $4, 'factual', '[1,0,0,0,0,0,0,0]')",
            [
                (org, agent, " ".join(words[: 1 + (n % len(words))]) + f" note{n}", f"{org}{n}".encode())
                for org, agent in tenants
                for n in range(20)
            ],
        )
        await conn.execute(
            "UPDATE memories SET content = 'a garden by the river' WHERE content LIKE '% note3'"
        )
        await conn.execute("DELETE FROM memories WHERE content LIKE '% note4'")
        query = "river garden telescope harbour"
        ranking = "SELECT memory_id, bm25 FROM ibex_bm25($1, $2, $3, 50) ORDER BY bm25 DESC, memory_id"
        before = [[tuple(r) for r in await conn.fetch(ranking, *tenant, query)] for tenant in tenants]

        assert await apply_migrations(conn, 8) == [m.name for m in migrations if m.version >= 12]

        lexicon = "SELECT org_id, agent_id, lexeme, df FROM memory_lexicon WHERE df > 0 ORDER BY 1, 2, 3"
        counted = (
            "SELECT org_id, agent_id, lexeme, count(*) FROM memory_terms GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
        )
        assert [tuple(r) for r in await conn.fetch(lexicon)] == [tuple(r) for r in await conn.fetch(counted)]
        assert await conn.fetchval("SELECT count(*) FROM memory_lexicon") == await conn.fetchval(
            "SELECT count(*) FROM (SELECT DISTINCT org_id, agent_id, lexeme FROM memory_terms) AS d"
        )
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM memory_terms WHERE impact_order <> ibex_posting_order(tf, dl)"
            )
            == 0
        )
        after = [[tuple(r) for r in await conn.fetch(ranking, *tenant, query)] for tenant in tenants]
        # The same memories and scores (the sums' order may differ in the last bit: ties
        # compared to 1e-9).
        assert [_by_score(r) for r in after] == [_by_score(r) for r in before]

        org, agent = tenants[0]
        await conn.execute(
            "INSERT INTO memories (org_id, agent_id, id, content, content_hash, category, embedding)"
            " VALUES ($1, $2, gen_random_uuid(), 'a zebra by the river', 'z', 'factual',"
            " '[0,0,0,0,0,0,0,1]')",
            org,
            agent,
        )
        await conn.execute("DELETE FROM memories WHERE org_id = $1 AND content LIKE '% note5'", org)
        assert [tuple(r) for r in await conn.fetch(lexicon)] == [tuple(r) for r in await conn.fetch(counted)]
    finally:
        await conn.close()


async def test_the_pruning_migration_removes_the_lexemes_no_memory_holds(empty_database_dsn: str) -> None:
    """A database at 0022 whose deletes left lexemes at df 0, migrated: those rows are
    gone, the others kept as they were, and later deletes leave none."""
    conn = await asyncpg.connect(empty_database_dsn)
    try:
        migrations = load_migrations()
        await apply_migrations(conn, 8, [m for m in migrations if m.version <= 22])
        org, agent = uuid.uuid4(), uuid.uuid4()
        insert = (
            "INSERT INTO memories (org_id, agent_id, id, content, content_hash, category, embedding)"
            " VALUES ($1, $2, gen_random_uuid(), $3, $4, 'factual', '[1,0,0,0,0,0,0,0]')"
        )
        await conn.executemany(
            insert,
            [(org, agent, text, text.encode()) for text in ("river camp", "river lodge", "desert well")],
        )
        await conn.execute("DELETE FROM memories WHERE content IN ('river camp', 'desert well')")
        lexicon = "SELECT lexeme, df FROM memory_lexicon ORDER BY lexeme"
        assert [tuple(r) for r in await conn.fetch(lexicon)] == [
            ("camp", 0),
            ("desert", 0),
            ("lodg", 1),
            ("river", 1),
            ("well", 0),
        ]

        assert await apply_migrations(conn, 8, [m for m in migrations if m.version <= 23]) == [
            "0023_unused_lexemes_pruned"
        ]
        assert [tuple(r) for r in await conn.fetch(lexicon)] == [("lodg", 1), ("river", 1)]
        await conn.execute(insert, org, agent, "river camp", b"again")
        await conn.execute("DELETE FROM memories WHERE content = 'river lodge'")
        assert [tuple(r) for r in await conn.fetch(lexicon)] == [("camp", 1), ("river", 1)]
    finally:
        await conn.close()


def _by_score(ranking: list[tuple[object, float]]) -> list[tuple[float, str]]:
    return sorted((-round(score, 9), str(memory)) for memory, score in ranking)


async def test_the_churn_migration_counts_each_graphed_agents_replaced_rows_from_then_on(
    empty_database_dsn: str,
) -> None:
    """0024: graphs recorded before start at 0; deletes and re-embedding updates of an agent
    with a graph count, other updates and agents without a graph do not."""
    conn = await asyncpg.connect(empty_database_dsn)
    try:
        migrations = load_migrations()
        await apply_migrations(conn, 8, [m for m in migrations if m.version <= 23])
        graphed, plain = uuid.uuid4(), uuid.uuid4()
        org = uuid.uuid4()
        await conn.execute(
            "INSERT INTO agent_graphs (org_id, agent_id, index_name, ready) VALUES ($1, $2, 'g', true)",
            org,
            graphed,
        )
        insert = (
            "INSERT INTO memories (org_id, agent_id, id, content, content_hash, category, embedding)"
            " SELECT $1, $2, gen_random_uuid(), 'm' || i, ('m' || i)::bytea, 'factual', '[1,0,0,0,0,0,0,0]'"
            " FROM generate_series(1, 4) AS i"
        )
        for agent in (graphed, plain):
            await conn.execute(insert, org, agent)

        assert await apply_migrations(conn, 8, [m for m in migrations if m.version <= 24]) == [
            "0024_churned_graphs_rebuilt"
        ]
        replaced = "SELECT replaced FROM agent_graphs WHERE agent_id = $1"
        assert await conn.fetchval(replaced, graphed) == 0
        await conn.execute("DELETE FROM memories WHERE content = 'm1'")  # both agents'
        await conn.execute("UPDATE memories SET usefulness = 0.9")  # the vectors stay
        await conn.execute("UPDATE memories SET embedding = '[0,1,0,0,0,0,0,0]' WHERE content = 'm2'")
        assert await conn.fetchval(replaced, graphed) == 2
        assert await conn.fetchval("SELECT count(*) FROM agent_graphs") == 1
    finally:
        await conn.close()


async def test_a_migrations_after_commit_statements_run_outside_its_transaction_once(
    empty_database_dsn: str, tmp_path: Path
) -> None:
    # CREATE INDEX CONCURRENTLY, like VACUUM, fails inside a transaction block.
    (tmp_path / "0001_table.sql").write_text(
        "CREATE TABLE ibex_meta (key text PRIMARY KEY, value text);\n"
        "CREATE TABLE things (x integer);\n"
        "-- after commit: CREATE INDEX CONCURRENTLY things_x ON things (x)\n"
    )
    conn = await asyncpg.connect(empty_database_dsn)
    try:
        migrations = load_migrations(tmp_path)
        assert migrations[0].after_commit == ["CREATE INDEX CONCURRENTLY things_x ON things (x)"]
        assert await apply_migrations(conn, 384, migrations) == ["0001_table"]
        assert await conn.fetchval("SELECT to_regclass('things_x') IS NOT NULL")
        await conn.execute("DROP INDEX things_x")
        assert await apply_migrations(conn, 384, migrations) == []
        assert await conn.fetchval("SELECT to_regclass('things_x') IS NULL")
    finally:
        await conn.close()
