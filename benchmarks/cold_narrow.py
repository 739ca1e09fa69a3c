# ruff: noqa: E501  (SQL reads better unwrapped)
"""The exact per-agent scan over narrower copies of the vectors (ADR-0009's candidates).

    python -m benchmarks.cold_narrow   # after benchmarks.cold_layouts --shape 100x10000

On ``benchmarks.cold_layouts``' 100 x 10k table (random unit vectors, 64 partitions) it
builds two side tables of (org_id, agent_id, id, vector) in tenant order with a
covering btree (org_id, agent_id) INCLUDE (id, vector), one of ``halfvec`` and one of
``vector``, and times the exact top-50 by index-only scan against the exact scan of the
wide rows, for 20 agents x 10 random unit queries (recall against the wide exact
answer). Prints a markdown table.
"""

import asyncio
import statistics
import time
from pathlib import Path

import numpy as np
from ibex_context.devtools.embedded import start_postgres

from benchmarks.cold_layouts import _connect

TABLE = "lay_partitioned_100x10000_64"
DATA_DIR = Path(__file__).resolve().parent.parent / "loadtest" / "out" / "cold_layouts"
VARIANTS = {
    "narrow halfvec, index-only": "SELECT id FROM narrow_half WHERE org_id=$1 AND agent_id=$2 ORDER BY (e <=> ($3::vector)::halfvec(384)) + 0 LIMIT 50",
    "narrow vector, index-only": "SELECT id FROM narrow_full WHERE org_id=$1 AND agent_id=$2 ORDER BY (e <=> $3) + 0 LIMIT 50",
    "wide rows (as memories)": f"SELECT id FROM {TABLE} WHERE org_id=$1 AND agent_id=$2 ORDER BY (embedding <=> $3) + 0 LIMIT 50",
}


async def main() -> None:
    pg = start_postgres(DATA_DIR)
    try:
        c = await _connect(pg.dsn)
        for kind, typ in (("half", "halfvec(384)"), ("full", "vector(384)")):
            name = f"narrow_{kind}"
            if not await c.fetchval("SELECT to_regclass($1) IS NOT NULL", name):
                started = time.perf_counter()
                await c.execute(
                    f"CREATE TABLE {name} AS SELECT org_id, agent_id, id, embedding::{typ} AS e FROM {TABLE} ORDER BY org_id, agent_id"
                )
                await c.execute(f"ALTER TABLE {name} ALTER COLUMN e SET STORAGE PLAIN")
                await c.execute(f"CREATE INDEX ON {name} (org_id, agent_id) INCLUDE (id, e)")
                await c.execute(f"VACUUM ANALYZE {name}")
                print(f"{name} built in {time.perf_counter() - started:.0f} s", flush=True)
        agents = await c.fetch(f"SELECT org_id, agent_id FROM {TABLE} GROUP BY 1, 2 ORDER BY 1, 2 LIMIT 20")
        rng = np.random.default_rng(7)
        queries = []
        for _ in range(10):
            for a in agents:
                q = rng.standard_normal(384).astype(np.float32)
                queries.append((a[0], a[1], q / np.linalg.norm(q)))
        truth = [{r[0] for r in await c.fetch(VARIANTS["wide rows (as memories)"], *q)} for q in queries]
        print("| exact scan over | median ms | p95 ms | recall@50 mean / min |")
        print("|---|---:|---:|---|")
        for name, sql in VARIANTS.items():
            for q in queries[:30]:
                await c.fetch(sql, *q)
            ms, recall = [], []
            for q, want in zip(queries, truth, strict=True):
                started = time.perf_counter()
                rows = await c.fetch(sql, *q)
                ms.append((time.perf_counter() - started) * 1000)
                recall.append(len(want & {r[0] for r in rows}) / 50)
            ms.sort()
            print(
                f"| {name} | {statistics.median(ms):.2f} | {ms[int(len(ms) * 0.95)]:.2f} |"
                f" {statistics.mean(recall):.3f} / {min(recall):.2f} |"
            )
        await c.close()
    finally:
        pg.stop()


if __name__ == "__main__":
    asyncio.run(main())
