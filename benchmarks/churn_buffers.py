"""What a long-lived installation's history costs the call's statements: PostgreSQL
buffers touched (deterministic, not timed) by one agent's vector search, lexical search
and hot-set rebuild as its injection counters fill and churn and its memories churn.

Run: ``.venv/bin/python -m benchmarks.churn_buffers [--memories N] [--injections N]
[--churn N]`` (starts an embedded PostgreSQL of its own in a temporary directory).

One agent with ``--memories`` memories (hashing embedder, 12 random words each) is
written through the service's store, then, with ``VACUUM ANALYZE`` where named:

1. fresh (what a seeded load-test data set looks like: no ``memory_usage`` rows);
2. every memory injected once (a ``memory_usage`` row each: an installation in service);
3. each injected ``--injections`` more times with autovacuum off on ``memory_usage``;
4. after ``VACUUM ANALYZE memory_usage``;
5. ``--churn`` memories upserted and deleted (the soak's writes), before any vacuum;
6. after ``VACUUM ANALYZE``.

Each statement is run twice under ``EXPLAIN (ANALYZE, BUFFERS)`` and the second's
shared hit+read blocks reported (the first also loads catalogs), with the sizes of the
``memories`` heap and indexes and ``memory_usage``'s live and dead rows.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from ibex_context.devtools.embedded import start_postgres
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.stores.base import InjectionRecord, PreparedMemory
from ibex_context.stores.cold_plan import ColdPlan
from ibex_context.stores.postgres import PostgresMemoryStore, create_pool
from ibex_context.stores.postgres.migrate import migrate
from ibex_context.stores.postgres.reads import HOT_SET_SQL
from ibex_context.stores.postgres.searches import LEXICAL_ARRAYS_SQL, SEARCH_ARRAYS_SQL

from loadtest.corpus import churn_words

QUERY = "rocket garden violin"
DIM = 384


def _memory(text: str, embedder: HashingEmbedder, category: str = "factual") -> PreparedMemory:
    return PreparedMemory(
        id=str(uuid.uuid4()),
        content=text,
        content_hash=hashlib.sha256(text.encode()).digest(),
        category=category,
        confidence=0.8,
        usefulness=0.5,
        metadata={},
        token_counts={"o200k_base": len(text.split())},
        embedding=embedder.embed_one(text),
        occurred_at=None,
    )


async def _measure(args: argparse.Namespace, dsn: str) -> list[dict[str, Any]]:
    await migrate(dsn, DIM)
    embedder, rng = HashingEmbedder(DIM), random.Random(args.seed)
    store = PostgresMemoryStore(await create_pool(dsn, min_size=1, max_size=2, ef_search=64), ef_search=64)
    org, agent = str(uuid.uuid4()), str(uuid.uuid4())
    memories = [_memory(churn_words(rng) + f" item{n}", embedder) for n in range(args.memories)]
    for start in range(0, len(memories), 100):
        await store.upsert_memories(org, agent, memories[start : start + 100])
    conn = await store.pool.acquire()
    await conn.execute("SET statement_timeout = 0")
    query = embedder.embed_one(QUERY)
    key = (uuid.UUID(org), uuid.UUID(agent))
    rows: list[dict[str, Any]] = []

    async def state(label: str) -> None:
        row: dict[str, Any] = {"state": label}
        statements = (
            ("vector", SEARCH_ARRAYS_SQL[ColdPlan.EXACT], (*key, query, 50)),
            ("lexical", LEXICAL_ARRAYS_SQL, (*key, QUERY, 50)),
            ("hot rebuild", HOT_SET_SQL, (*key, time.time(), 50)),
        )
        for name, sql, params in statements:
            await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, *params)
            plan = json.loads(await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, *params))
            top = plan[0]["Plan"]
            row[name] = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
        sizes = await conn.fetchrow(
            "SELECT sum(pg_relation_size(relid)) FILTER (WHERE relname ~ '^memories') AS heap,"
            " sum(pg_indexes_size(relid)) FILTER (WHERE relname ~ '^memories') AS indexes,"
            " sum(n_live_tup) FILTER (WHERE relname = 'memory_usage') AS usage_live,"
            " sum(n_dead_tup) FILTER (WHERE relname = 'memory_usage') AS usage_dead"
            " FROM pg_stat_user_tables"
        )
        row.update({k: int(sizes[k] or 0) for k in ("heap", "indexes", "usage_live", "usage_dead")})
        rows.append(row)
        print(row, flush=True)

    def injections() -> list[InjectionRecord]:
        return [InjectionRecord(org, agent, m.id, time.time()) for m in memories]

    async def settle() -> None:
        await asyncio.sleep(0.7)  # statistics reach the views within PGSTAT_MIN_INTERVAL

    await conn.execute("VACUUM ANALYZE")
    await state("fresh (no memory_usage rows), VACUUM ANALYZE")
    await store.record_injection_counters(injections())
    await settle()
    await state("every memory injected once")
    await conn.execute("ALTER TABLE memory_usage SET (autovacuum_enabled = false)")
    for _ in range(args.injections):
        await store.record_injection_counters(injections())
    await settle()
    await state(f"each injected {args.injections} more times, no vacuum")
    await conn.execute("VACUUM ANALYZE memory_usage")
    await conn.execute("ALTER TABLE memory_usage RESET (autovacuum_enabled)")
    await state("after VACUUM ANALYZE memory_usage")
    for batch in range(0, args.churn, 100):
        churn = [
            _memory(churn_words(rng) + f" churn{batch}-{n}", embedder, "episodic")
            for n in range(min(100, args.churn - batch))
        ]
        await store.upsert_memories(org, agent, churn)
        await store.delete_memories(org, agent, [m.id for m in churn])
    await settle()
    await state(f"{args.churn} memories upserted and deleted, before a vacuum")
    await conn.execute("VACUUM ANALYZE")
    await state("after VACUUM ANALYZE")
    await store.pool.release(conn)
    await store.aclose()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--memories", type=int, default=1000)
    parser.add_argument("--injections", type=int, default=30)
    parser.add_argument("--churn", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="ibex-churn-"))
    directory.chmod(0o755)
    postgres = start_postgres(directory, remove_on_stop=True)
    try:
        rows = asyncio.run(_measure(args, postgres.dsn))
    finally:
        postgres.stop()
    print()
    print(
        "| state | vector | lexical | hot rebuild | memories heap kB | memories indexes kB"
        " | memory_usage live / dead |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['state']} | {r['vector']} | {r['lexical']} | {r['hot rebuild']} | {r['heap'] // 1024:,} |"
            f" {r['indexes'] // 1024:,} | {r['usage_live']:,} / {r['usage_dead']:,} |"
        )


if __name__ == "__main__":
    main()
