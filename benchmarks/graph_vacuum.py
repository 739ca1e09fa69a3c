# ruff: noqa: E501  (report templates read better unwrapped)
"""What vacuuming an agent's own graph costs, vacuumed often or seldom for the same churn.

    .venv/bin/python -m benchmarks.graph_vacuum                         # 10k memories, ~9 min
    .venv/bin/python -m benchmarks.graph_vacuum --memories 10000 --order 10,1,1,10 --out X.md

Why: `memories` partitions are vacuumed when 20 % of their rows are dead (PostgreSQL's
default), and dead rows cost the searches CPU until then (`soak-2026-12-06-30min.md`, last
section). A partition may also hold agents' own HNSW graphs (``stores.postgres.graphs``), and
a vacuum repairs each graph around its deleted rows. A lower scale factor vacuums the same
churn in more, smaller passes; this measures what that does to a graph's repair.

One agent of ``--memories`` real MiniLM memories (the named sample's first rows, ``loadtest.vectors``:
the real 100k agent by default, embedded once and cached, 40 min on a fresh 2-vCPU machine),
in a table of its own (autovacuum off) with the service's own-graph index (half precision,
``AGENT_GRAPH_OPTIONS``), built fresh for each arm. An arm replaces ``--churn-share`` of the
rows (deletes that many random rows and inserts as many new ones, the sample's next rows) in
``cycles`` equal steps and runs ``VACUUM (PARALLEL 0)`` after each: 10 steps are a 2 % scale
factor's pace, 1 step the default 20 %'s. An arm written ``Nr`` in ``--order`` rebuilds the
graph before each vacuum as the service rebuilds a churned graph (``graphs.REINDEX_SQL``,
``REINDEX INDEX CONCURRENTLY``; pgvector's documentation advises a rebuild for HNSW): the
vacuum then has nothing to repair. ``2r`` is the service's pace with
``IBEX_COLD_GRAPH_REBUILD_REPLACED_SHARE`` 0.1 (a rebuild once a tenth of the agent's
memories were replaced; off by default). Per arm: the build's seconds, the backend's CPU
(``/proc``) of the inserts and of the vacuums, and recall@50 at ``--ef-search`` against the
exact top 50 of the live rows (100 questions about live rows, embedded as the service embeds
queries), before and after the last vacuum.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import numpy as np
from ibex_context.devtools.embedded import start_postgres
from ibex_context.stores.postgres.codecs import init_connection
from ibex_context.stores.postgres.graphs import AGENT_GRAPH_OPTIONS, REINDEX_SQL

from benchmarks.agent_graph import LIMIT, backend_cpu_seconds
from loadtest import pgcopy
from loadtest.vectors import reference_sample

RECALL_QUESTIONS = 100


@dataclass(frozen=True, slots=True)
class Arm:
    """One arm: ``cycles`` vacuums, each after ``rows_each`` rows were replaced."""

    cycles: int
    rows_each: int
    reindex_first: bool  # each vacuum after a REINDEX of the graph (nothing left to repair)
    build_s: float
    inserts_cpu_s: float
    vacuum_cpu_s: tuple[float, ...]  # each vacuum's, its REINDEX included
    recall_before_last_vacuum: tuple[float, float]  # mean, p5
    recall_after: tuple[float, float]


async def load_rows(conn: asyncpg.Connection, vectors: np.ndarray) -> None:
    """Every vector the arms use, in ``rows`` (id = row number), whence each arm's table is filled."""
    dim = vectors.shape[1]
    await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    await conn.execute("DROP TABLE IF EXISTS rows")
    await conn.execute(f"CREATE TABLE rows (id integer PRIMARY KEY, embedding vector({dim}) NOT NULL)")

    async def chunks() -> AsyncIterator[bytes]:
        yield pgcopy.HEADER
        for start in range(0, len(vectors), 20_000):
            values = pgcopy.vector_values(vectors[start : start + 20_000])
            yield b"".join(
                pgcopy.row((pgcopy.integer_value(start + i), value)) for i, value in enumerate(values)
            )
        yield pgcopy.TRAILER

    await conn.copy_to_table("rows", source=chunks(), format="binary", columns=["id", "embedding"])


async def _recall(
    conn: asyncpg.Connection, vectors: np.ndarray, questions: np.ndarray, live: np.ndarray
) -> tuple[float, float]:
    """recall@50 mean and p5 of the graph's search against the exact top 50 of the live rows."""
    dim = vectors.shape[1]
    asked = np.random.default_rng(1).choice(live, size=min(RECALL_QUESTIONS, len(live)), replace=False)
    shares: list[float] = []
    for question in questions[asked]:
        scores = vectors[live] @ question
        top = set(live[np.argpartition(-scores, LIMIT)[:LIMIT]].tolist())
        rows = await conn.fetch(
            f"SELECT id FROM agent ORDER BY embedding::halfvec({dim}) <=> $1::vector::halfvec({dim}) LIMIT {LIMIT}",
            question,
        )
        shares.append(len({r["id"] for r in rows} & top) / LIMIT)
    shares.sort()
    return statistics.fmean(shares), shares[int(0.05 * (len(shares) - 1))]


async def run_arm(
    conn: asyncpg.Connection,
    vectors: np.ndarray,
    questions: np.ndarray,
    *,
    memories: int,
    churn: int,
    cycles: int,
    seed: int,
    graph_options: str = AGENT_GRAPH_OPTIONS,
    ef_search: int = 100,
    reindex_first: bool = False,
) -> Arm:
    """Builds the agent's table and graph afresh from ``rows`` (``load_rows``), then replaces
    ``churn`` rows in ``cycles`` steps, vacuuming after each."""
    dim = vectors.shape[1]
    await init_connection(conn)  # vectors as numpy arrays, as the service's pool sends them
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    await conn.execute("DROP TABLE IF EXISTS agent")
    await conn.execute(
        f"CREATE TABLE agent (id integer PRIMARY KEY, embedding vector({dim}) NOT NULL)"
        " WITH (autovacuum_enabled = false)"
    )
    await conn.execute("INSERT INTO agent SELECT id, embedding FROM rows WHERE id < $1", memories)
    await conn.execute("SET max_parallel_maintenance_workers = 0")
    started = time.perf_counter()
    await conn.execute(
        f"CREATE INDEX agent_graph ON agent USING hnsw ((embedding::halfvec({dim})) halfvec_cosine_ops) WITH ({graph_options})"
    )
    build_s = time.perf_counter() - started
    await conn.execute("VACUUM (ANALYZE) agent")
    await conn.execute("SET enable_seqscan = off")
    await conn.execute(f"SET hnsw.ef_search = {int(ef_search)}")
    rng = np.random.default_rng(seed)
    live = np.arange(memories)
    next_row = memories
    rows_each = churn // cycles
    inserts_cpu = 0.0
    vacuum_cpu: list[float] = []
    before_last = (1.0, 1.0)
    for cycle in range(cycles):
        gone = rng.choice(live, size=rows_each, replace=False)
        await conn.execute("DELETE FROM agent WHERE id = ANY($1::integer[])", gone.tolist())
        cpu_before = backend_cpu_seconds(pid)
        await conn.execute(
            "INSERT INTO agent SELECT id, embedding FROM rows WHERE id >= $1 AND id < $2",
            next_row,
            next_row + rows_each,
        )
        inserts_cpu += backend_cpu_seconds(pid) - cpu_before
        live = np.concatenate([np.setdiff1d(live, gone), np.arange(next_row, next_row + rows_each)])
        next_row += rows_each
        if cycle == cycles - 1:
            before_last = await _recall(conn, vectors, questions, live)
        cpu_before = backend_cpu_seconds(pid)
        if reindex_first:
            await conn.execute(REINDEX_SQL.format(index="agent_graph"))
        await conn.execute("VACUUM (PARALLEL 0) agent")
        vacuum_cpu.append(backend_cpu_seconds(pid) - cpu_before)
    return Arm(
        cycles=cycles,
        rows_each=rows_each,
        reindex_first=reindex_first,
        build_s=build_s,
        inserts_cpu_s=inserts_cpu,
        vacuum_cpu_s=tuple(vacuum_cpu),
        recall_before_last_vacuum=before_last,
        recall_after=await _recall(conn, vectors, questions, live),
    )


def table(arms: list[Arm]) -> list[str]:
    lines = [
        "| vacuums x rows replaced before each | build s | inserts CPU s | vacuums CPU s (each) | CPU a replaced row, ms | recall@50 mean / p5 before the last vacuum | after it |",
        "|---|---:|---:|---|---:|---|---|",
    ]
    for arm in arms:
        total = sum(arm.vacuum_cpu_s)
        lines.append(
            f"| {arm.cycles} x {arm.rows_each:,}{', each after a rebuild' if arm.reindex_first else ''} | {arm.build_s:.1f} | {arm.inserts_cpu_s:.1f}"
            f" | {total:.1f} ({min(arm.vacuum_cpu_s):.1f}-{max(arm.vacuum_cpu_s):.1f})"
            f" | {1e3 * total / (arm.cycles * arm.rows_each):.1f}"
            f" | {arm.recall_before_last_vacuum[0]:.3f} / {arm.recall_before_last_vacuum[1]:.2f}"
            f" | {arm.recall_after[0]:.3f} / {arm.recall_after[1]:.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--memories", type=int, default=10_000)
    p.add_argument("--churn-share", type=float, default=0.2, help="the share of the rows each arm replaces")
    p.add_argument(
        "--order",
        default="10,1,1,10",
        help="the arms, by their number of vacuums; N r: each vacuum after a REINDEX of the graph",
    )
    p.add_argument("--sample", default="agent-100k:100000", help="NAME:MEMORIES of loadtest.vectors")
    p.add_argument("--ef-search", type=int, default=100, help="the service's up to 50k memories")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    churn = int(args.memories * args.churn_share)
    name, size = args.sample.split(":")
    sample = reference_sample(name, memories=int(size))
    if len(sample.vectors) < args.memories + churn:
        p.error(f"--sample holds {len(sample.vectors):,} vectors; the arms need {args.memories + churn:,}")
    vectors = sample.vectors[: args.memories + churn]
    questions = sample.question_vectors[: args.memories + churn]
    arms_wanted = [(int(a.rstrip("r")), a.endswith("r")) for a in args.order.split(",")]

    async def run() -> list[Arm]:
        scratch = Path(tempfile.mkdtemp(prefix="graph-vacuum-"))
        postgres = start_postgres(scratch, remove_on_stop=True)
        try:
            conn = await asyncpg.connect(postgres.dsn)
            try:
                await load_rows(conn, vectors)
                arms = []
                for i, (n, reindex_first) in enumerate(arms_wanted):
                    arm = await run_arm(
                        conn,
                        vectors,
                        questions,
                        memories=args.memories,
                        churn=churn,
                        cycles=n,
                        seed=100 + i,
                        ef_search=args.ef_search,
                        reindex_first=reindex_first,
                    )
                    print(table([arm])[-1], file=sys.stderr, flush=True)
                    arms.append(arm)
                return arms
            finally:
                await conn.close()
        finally:
            postgres.stop()

    arms = asyncio.run(run())
    report = [
        f"# An own graph's vacuums, often or seldom: {args.memories:,} memories, {churn:,} replaced",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.machine()} x {os.cpu_count()} CPUs."
        f" Command: `python -m benchmarks.graph_vacuum {' '.join(argv if argv is not None else sys.argv[1:])}`."
        f" Vectors: the first {args.memories + churn:,} of `{args.sample}` (MiniLM, fp32). Graph: halfvec, {AGENT_GRAPH_OPTIONS},"
        f" searched at ef_search {args.ef_search}.",
        "",
        *table(arms),
    ]
    text = "\n".join(report) + "\n"
    if args.out is not None:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
