"""What one agent's cold search costs under each plan PostgreSQL can choose for it.

Run on a data set the load test seeded (``loadtest/run`` keeps them under
``loadtest/out/data/``)::

    .venv/bin/python -m benchmarks.cold_plans loadtest/out/data/100x10000-...

It starts that data set's PostgreSQL, runs the service's own search statement for
``--agents`` agents (``--calls`` each, random unit queries, one pooled connection,
sequential, after a warm-up round of at least 30 calls) under four conditions, and
writes ``benchmarks/results/cold_plans-<data set>.md``:

* **planner**: the statistics as seeded; the plan PostgreSQL picks (counted);
* **exact, bitmap**: ``enable_indexscan = off``: the agent's rows through a bitmap
  scan of the tenant key, distances computed for each, top-K sorted;
* **HNSW**: the vector index forced (``enable_bitmapscan/seqscan/sort = off``),
  filtered by tenant with iterative scan;
* **planner + tenant statistics**: ``CREATE STATISTICS (dependencies, ndistinct,
  mcv) ON org_id, agent_id`` and ANALYZE, inside a transaction that is rolled back:
  the data set is left as it was.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import numpy as np
from ibex_context.devtools.embedded import start_postgres
from ibex_context.stores.postgres import SEARCH_SQL, create_pool

RESULTS = Path(__file__).parent / "results"
LIMIT = 50
# Enough to bring a freshly started data set's pages into memory for a single agent.
WARM_UP_CALLS = 30

EXACT = {"enable_indexscan": "off"}
HNSW = {"enable_bitmapscan": "off", "enable_seqscan": "off", "enable_sort": "off"}


@dataclass(frozen=True, slots=True)
class Measured:
    condition: str
    plans: dict[str, int]
    milliseconds: list[float]

    def row(self) -> str:
        ordered = sorted(self.milliseconds)
        p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
        plans = ", ".join(f"{name} {count}" for name, count in sorted(self.plans.items()))
        return (
            f"| {self.condition} | {statistics.median(ordered):.1f} | {p95:.1f} | {ordered[-1]:.1f}"
            f" | {len(ordered)} | {plans} |"
        )


def _plan_name(lines: list[str]) -> str:
    text = " ".join(lines)
    if "hnsw" in text:
        return "HNSW"
    if "Bitmap Heap Scan" in text:
        return "exact (bitmap)"
    if "Index Scan" in text:
        return "exact (key index)"
    return "exact (seq scan)"


async def _measure(
    conn: asyncpg.Connection,
    condition: str,
    settings: dict[str, str],
    agents: list[asyncpg.Record],
    calls: int,
    rng: np.random.Generator,
) -> Measured:
    def query() -> np.ndarray:
        vector = rng.standard_normal(384).astype(np.float32)
        return vector / np.linalg.norm(vector)

    for name, value in settings.items():
        await conn.execute(f"SET {name} = {value}")
    try:
        plans: collections.Counter[str] = collections.Counter()
        for agent in agents:
            explain = await conn.fetch("EXPLAIN " + SEARCH_SQL, agent[0], agent[1], query(), LIMIT)
            plans[_plan_name([r[0] for r in explain])] += 1
        for i in range(max(len(agents), WARM_UP_CALLS)):
            agent = agents[i % len(agents)]
            await conn.fetch(SEARCH_SQL, agent[0], agent[1], query(), LIMIT)
        samples = []
        for _ in range(calls):
            for agent in agents:
                start = time.perf_counter()
                await conn.fetch(SEARCH_SQL, agent[0], agent[1], query(), LIMIT)
                samples.append((time.perf_counter() - start) * 1000)
        return Measured(condition, dict(plans), samples)
    finally:
        for name in settings:
            await conn.execute(f"RESET {name}")


async def run(data_dir: Path, agents_wanted: int, calls: int) -> str:
    postgres = start_postgres(data_dir)
    try:
        pool = await create_pool(postgres.dsn, min_size=1, max_size=1, ef_search=64)
        try:
            async with pool.acquire() as conn:
                rows = await conn.fetchval("SELECT count(*) FROM memories")
                agents = await conn.fetch(
                    "SELECT org_id, agent_id FROM memories"
                    " GROUP BY 1, 2 ORDER BY count(*) DESC, 1, 2 LIMIT $1",
                    agents_wanted,
                )
                sizes = await conn.fetch(
                    "SELECT count(*) AS n FROM memories GROUP BY org_id, agent_id ORDER BY 1 DESC LIMIT 1"
                )
                versions = await conn.fetchval(
                    "SELECT version() || ', pgvector ' || extversion"
                    " FROM pg_extension WHERE extname = 'vector'"
                )
                rng = np.random.default_rng(7)
                measured = [
                    await _measure(conn, "planner", {}, agents, calls, rng),
                    await _measure(conn, "exact, bitmap", EXACT, agents, calls, rng),
                    await _measure(conn, "HNSW", HNSW, agents, calls, rng),
                ]
                async with conn.transaction():
                    await conn.execute(
                        "CREATE STATISTICS bench_tenant_stats (dependencies, ndistinct, mcv)"
                        " ON org_id, agent_id FROM memories"
                    )
                    await conn.execute("ANALYZE memories")
                    with_stats = await _measure(conn, "planner + tenant statistics", {}, agents, calls, rng)
                    measured.append(with_stats)
                    raise _RollBack
        except _RollBack:
            pass
        finally:
            await pool.close()
    finally:
        postgres.stop()
    largest = sizes[0]["n"] if sizes else 0
    lines = [
        f"# Cold search plans: {data_dir.name}",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Command: "
        f"`python -m benchmarks.cold_plans {data_dir}` (--agents {agents_wanted} --calls {calls}).",
        "",
        f"Setup: {rows:,} memories, the {len(agents)} largest agents ({largest:,} memories each at most);"
        f" the service's search statement (LIMIT {LIMIT}, hnsw.ef_search 64, iterative scan relaxed);"
        " one pooled connection, sequential calls after >= 30 warm-up calls; wall time per call"
        f" including the Unix-socket round trip. {platform.machine()}, {platform.processor() or 'cpu'};"
        f" {versions}.",
        "",
        "| condition | median ms | p95 ms | max ms | calls | plans chosen (per agent) |",
        "|---|---:|---:|---:|---:|---|",
        *(m.row() for m in measured),
        "",
    ]
    return "\n".join(lines)


class _RollBack(Exception):
    """Leaves the data set's statistics as they were."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path, help="a seeded data set, e.g. loadtest/out/data/100x10000-...")
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--calls", type=int, default=5, help="rounds over the agents per condition")
    args = parser.parse_args()
    report = asyncio.run(run(args.data_dir.resolve(), args.agents, args.calls))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"cold_plans-{args.data_dir.name.split('-')[0]}.md"
    path.write_text(report)
    print(report)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
