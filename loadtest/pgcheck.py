# ruff: noqa: E501  (SQL and report lines read better unwrapped)
"""Why the cold search costs what it costs: the plan, buffers and time of the service's
search query for one seeded agent, on the table as the schema creates it and on a
copy of that agent's rows with the embedding stored inline (``STORAGE PLAIN``).

    python -m loadtest.pgcheck --dsn "$DSN" --agents-file <data dir>/agents.json [--agent 3]

pgvector's ``vector`` type defaults to ``STORAGE EXTERNAL``: a row over ~2 kB (a 384-d
vector is 1,540 B, plus the memory's text) gets its vector moved out of line into
TOAST, so an exact per-agent scan reads ~4 buffers per row (heap, TOAST index, TOAST
heap) instead of a fraction of one. The copy is a temporary table, dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SESSION = "SET hnsw.ef_search = 64; SET hnsw.iterative_scan = relaxed_order; SET plan_cache_mode = force_custom_plan"


def _query(table: str, org: str, agent: str, vector: str) -> str:
    return (
        f"SELECT id, content, category, confidence, usefulness, retrieval_count, token_counts, "
        f"embedding <=> '{vector}'::vector AS distance FROM {table} "
        f"WHERE org_id = '{org}' AND agent_id = '{agent}' ORDER BY embedding <=> '{vector}'::vector LIMIT 50"
    )


async def check(dsn: str, agent: dict[str, Any], repeats: int) -> str:
    from loadtest.seed import build_embedder

    embedder = build_embedder("hashing", 384)
    vector = "[" + ",".join(f"{x:.6f}" for x in embedder.embed_one(agent["queries"][0])) + "]"
    conn = await asyncpg.connect(dsn)
    lines: list[str] = []
    try:
        await conn.execute(SESSION)
        sizes = await conn.fetchrow(
            "SELECT avg(pg_column_size(embedding))::int AS vector_bytes, avg(pg_column_size(content))::int AS content_bytes,"
            " count(*) AS rows FROM memories WHERE org_id = $1::uuid AND agent_id = $2::uuid",
            agent["org_id"],
            agent["agent_id"],
        )
        toast = await conn.fetchval(
            "SELECT pg_size_pretty(pg_relation_size(reltoastrelid)) FROM pg_class WHERE relname = 'memories'"
        )
        lines.append(
            f"agent {agent['agent_id']}: {sizes['rows']} rows, vector {sizes['vector_bytes']} B, "
            f"content {sizes['content_bytes']} B stored; memories' TOAST table {toast}"
        )
        await conn.execute(
            "CREATE TEMP TABLE memories_plain (LIKE memories INCLUDING DEFAULTS);"
            " ALTER TABLE memories_plain ALTER COLUMN embedding SET STORAGE PLAIN"
        )
        await conn.execute(
            "INSERT INTO memories_plain SELECT * FROM memories WHERE org_id = $1::uuid AND agent_id = $2::uuid",
            agent["org_id"],
            agent["agent_id"],
        )
        await conn.execute(
            "ALTER TABLE memories_plain ADD PRIMARY KEY (org_id, agent_id, id); ANALYZE memories_plain"
        )
        for table, label in (
            ("memories", "as migrated (vector STORAGE EXTERNAL)"),
            ("memories_plain", "vector STORAGE PLAIN"),
        ):
            sql = _query(table, agent["org_id"], agent["agent_id"], vector)
            plan = [r[0] for r in await conn.fetch("EXPLAIN (ANALYZE, BUFFERS) " + sql)]
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                await conn.fetch(sql)
                times.append((time.perf_counter() - t0) * 1000)
            scan = next((p.strip() for p in plan if "Scan" in p), "?")
            buffers = next((p.strip() for p in plan if "Buffers" in p), "?")
            execution = next((p.strip() for p in plan if p.startswith("Execution Time")), "?")
            lines.append(
                f"{label}: {scan.split('(')[0].strip()}; {buffers}; {execution}; round trip over {repeats} runs "
                f"p50 {statistics.median(times):.2f} ms, max {max(times):.2f} ms"
            )
    finally:
        await conn.close()
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", required=True)
    p.add_argument("--agents-file", type=Path, required=True)
    p.add_argument("--agent", type=int, default=0, help="index in the agents file")
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args(argv)
    agent = json.loads(args.agents_file.read_text())["agents"][args.agent]
    print(asyncio.run(check(args.dsn, agent, args.repeats)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
