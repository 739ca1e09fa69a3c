# ruff: noqa: E501  (report templates and SQL read better unwrapped)
"""Candidate storage layouts for the per-agent cold search, measured on synthetic data.

    python -m benchmarks.cold_layouts --shape 100x10000 [--partitions 64] [--data-dir DIR]

Loads ``agents x memories`` random unit vectors (384-d, the load test's hardest case
for an approximate index) with ~1.2 kB of incompressible text per row (the width of a
seeded memory) into a table of the candidate layout, builds its indexes (timed), then
runs single searches (one connection, sequential, after a warm-up) for up to
``--agents`` agents: the exact top-50 and the HNSW top-50 at several ``ef_search``,
each with its recall@50 against the exact answer. Writes
``benchmarks/results/cold_layouts-<layout>-<shape>.md``.

Layouts: ``partitioned`` (hash partitions on (org_id, agent_id), one HNSW per
partition, as migration 0008) and ``partitioned-halfvec`` (the same with the HNSW
over ``embedding::halfvec``, re-ranked by the exact distance).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import struct
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
from ibex_context.devtools.embedded import start_postgres

RESULTS = Path(__file__).parent / "results"
DIM = 384
LIMIT = 50
FORCE_HNSW = ("SET enable_seqscan = off", "SET enable_bitmapscan = off", "SET enable_sort = off")
RESET_HNSW = ("RESET enable_seqscan", "RESET enable_bitmapscan", "RESET enable_sort")


def _encode(value: Any) -> bytes:
    array = np.asarray(value, dtype=">f4")
    return struct.pack(">HH", array.shape[0], 0) + array.tobytes()


def _decode(data: bytes) -> np.ndarray:
    (dim,) = struct.unpack_from(">H", data)
    return np.frombuffer(data, dtype=">f4", count=dim, offset=4).astype(np.float32)


async def _connect(dsn: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(dsn)
    await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    await conn.set_type_codec("vector", schema="public", encoder=_encode, decoder=_decode, format="binary")
    return conn


@dataclass(frozen=True, slots=True)
class Shape:
    agents: int
    memories: int

    @classmethod
    def parse(cls, text: str) -> Shape:
        agents, memories = text.lower().split("x")
        return cls(int(agents), int(memories))

    def __str__(self) -> str:
        return f"{self.agents}x{self.memories}"


def _ddl(table: str, layout: str, partitions: int) -> list[str]:
    statements = [
        "CREATE EXTENSION IF NOT EXISTS vector",
        f"""CREATE TABLE {table} (
            org_id uuid NOT NULL, agent_id uuid NOT NULL, id uuid NOT NULL,
            content text NOT NULL, embedding vector({DIM}) NOT NULL,
            PRIMARY KEY (org_id, agent_id, id)
        ) PARTITION BY HASH (org_id, agent_id)""",
    ]
    statements += [
        f"CREATE TABLE {table}_p{n} PARTITION OF {table} FOR VALUES WITH (MODULUS {partitions}, REMAINDER {n})"
        for n in range(partitions)
    ]
    statements += [
        f"ALTER TABLE {table}_p{n} ALTER COLUMN embedding SET STORAGE PLAIN" for n in range(partitions)
    ]
    return statements


def _index_sql(table: str, layout: str) -> str:
    if layout == "partitioned-halfvec":
        return (
            f"CREATE INDEX ON {table} USING hnsw ((embedding::halfvec({DIM})) halfvec_cosine_ops)"
            " WITH (m = 16, ef_construction = 64)"
        )
    return f"CREATE INDEX ON {table} USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64)"


async def load(
    conn: asyncpg.Connection, table: str, layout: str, shape: Shape, partitions: int
) -> dict[str, float]:
    for statement in _ddl(table, layout, partitions):
        await conn.execute(statement)
    rng = np.random.default_rng(20261125)
    started = time.perf_counter()
    orgs = [uuid.UUID(int=int(rng.integers(1 << 62)) << 64 | 4) for _ in range(4)]
    for a in range(shape.agents):
        org, agent = orgs[a % len(orgs)], uuid.uuid4()
        done = 0
        while done < shape.memories:
            n = min(5000, shape.memories - done)
            vectors = rng.standard_normal((n, DIM), dtype=np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            text = os.urandom(600 * n).hex()
            records = [
                (org, agent, uuid.uuid4(), text[i * 1200 : (i + 1) * 1200], vectors[i]) for i in range(n)
            ]
            await conn.copy_records_to_table(
                table, records=records, columns=("org_id", "agent_id", "id", "content", "embedding")
            )
            done += n
    copied = time.perf_counter() - started
    await conn.execute("SET maintenance_work_mem = '2GB'")
    await conn.execute("SET max_parallel_maintenance_workers = 1")
    started = time.perf_counter()
    await conn.execute(_index_sql(table, layout))
    indexed = time.perf_counter() - started
    await conn.execute(f"VACUUM ANALYZE {table}")
    return {"copy_s": copied, "index_s": indexed}


def _exact_sql(table: str) -> str:
    # "+ 0": an ordering no index provides: always the exact scan of the agent's rows.
    return (
        f"SELECT id FROM {table} WHERE org_id = $1 AND agent_id = $2"
        f" ORDER BY (embedding <=> $3) + 0 LIMIT {LIMIT}"
    )


def _hnsw_sql(table: str, layout: str) -> str:
    if layout == "partitioned-halfvec":
        return (
            f"SELECT id FROM (SELECT id, embedding FROM {table} WHERE org_id = $1 AND agent_id = $2"
            f" ORDER BY embedding::halfvec({DIM}) <=> ($3::vector)::halfvec({DIM}) LIMIT {LIMIT}) AS c"
            " ORDER BY (embedding <=> $3) + 0"
        )
    return (
        f"SELECT id FROM {table} WHERE org_id = $1 AND agent_id = $2 ORDER BY embedding <=> $3 LIMIT {LIMIT}"
    )


@dataclass(slots=True)
class Series:
    name: str
    ms: list[float]
    recall: list[float]

    def row(self) -> str:
        ordered = sorted(self.ms)
        p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
        recall = (
            f"{statistics.mean(self.recall):.3f} / {min(self.recall):.2f}" if self.recall else "1 (exact)"
        )
        return f"| {self.name} | {statistics.median(ordered):.2f} | {p95:.2f} | {ordered[-1]:.2f} | {len(ordered)} | {recall} |"


async def measure(
    conn: asyncpg.Connection,
    table: str,
    layout: str,
    agents: list[asyncpg.Record],
    calls: int,
    efs: list[int],
) -> tuple[list[Series], str]:
    rng = np.random.default_rng(7)
    queries = []
    for _ in range(calls):
        for agent in agents:
            q = rng.standard_normal(DIM).astype(np.float32)
            queries.append((agent[0], agent[1], q / np.linalg.norm(q)))
    exact_sql, hnsw_sql = _exact_sql(table), _hnsw_sql(table, layout)
    await conn.execute("SET hnsw.iterative_scan = relaxed_order")
    plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + exact_sql, *queries[0]))
    for q in queries[: max(30, len(agents))]:
        await conn.fetch(exact_sql, *q)
    exact = Series("exact", [], [])
    truth = []
    for q in queries:
        t = time.perf_counter()
        rows = await conn.fetch(exact_sql, *q)
        exact.ms.append((time.perf_counter() - t) * 1000)
        truth.append({r[0] for r in rows})
    out = [exact]
    for statement in FORCE_HNSW:
        await conn.execute(statement)
    for ef in efs:
        await conn.execute(f"SET hnsw.ef_search = {ef}")
        series = Series(f"HNSW ef_search {ef}", [], [])
        for q in queries[: max(30, len(agents))]:
            await conn.fetch(hnsw_sql, *q)
        for q, want in zip(queries, truth, strict=True):
            t = time.perf_counter()
            rows = await conn.fetch(hnsw_sql, *q)
            series.ms.append((time.perf_counter() - t) * 1000)
            series.recall.append(len(want & {r[0] for r in rows}) / max(1, len(want)))
        out.append(series)
    for statement in RESET_HNSW:
        await conn.execute(statement)
    return out, plan


async def run(args: argparse.Namespace) -> str:
    shape = Shape.parse(args.shape)
    table = f"lay_{args.layout.replace('-', '_')}_{shape.agents}x{shape.memories}_{args.partitions}"
    postgres = start_postgres(args.data_dir)
    conn = await _connect(postgres.dsn)
    changed = False
    for name, value in (("shared_buffers", "1GB"), ("effective_cache_size", "4GB")):
        if await conn.fetchval(f"SHOW {name}") != value:
            await conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
            changed = True
    await conn.close()
    if changed:  # shared_buffers needs a restart
        postgres.stop()
        postgres = start_postgres(args.data_dir)
    try:
        conn = await _connect(postgres.dsn)
        try:
            exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table)
            timings = {"copy_s": float("nan"), "index_s": float("nan")}
            if not exists:
                timings = await load(conn, table, args.layout, shape, args.partitions)
                print(f"loaded {table}: {timings}", flush=True)
            agents = await conn.fetch(
                f"SELECT org_id, agent_id, count(*) FROM {table} GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT $1",
                args.agents,
            )
            share = await conn.fetch(
                f"SELECT tableoid::regclass::text AS part, count(DISTINCT agent_id) AS agents, count(*) AS n"
                f" FROM {table} GROUP BY 1"
            )
            sizes = await conn.fetchrow(
                f"SELECT pg_size_pretty(sum(pg_table_size(inhrelid))) AS heap FROM pg_inherits"
                f" WHERE inhparent = '{table}'::regclass"
            )
            index_size = await conn.fetchval(
                "SELECT pg_size_pretty(sum(pg_relation_size(i.indexrelid))) FROM pg_index AS i"
                " JOIN pg_inherits AS h ON h.inhrelid = i.indrelid JOIN pg_class AS c ON c.oid = i.indexrelid"
                " JOIN pg_am AS am ON am.oid = c.relam"
                f" WHERE h.inhparent = '{table}'::regclass AND am.amname = 'hnsw'"
            )
            series, plan = await measure(conn, table, args.layout, agents, args.calls, args.ef)
            versions = await conn.fetchval(
                "SELECT version() || ', pgvector ' || extversion FROM pg_extension WHERE extname = 'vector'"
            )
        finally:
            await conn.close()
    finally:
        postgres.stop()
    per_part = sorted(r["agents"] for r in share)
    load_avg = os.getloadavg()
    lines = [
        f"# Cold search layouts: {args.layout}, {shape} (random unit vectors)",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Command: `python -m benchmarks.cold_layouts"
        f" --layout {args.layout} --shape {shape} --partitions {args.partitions} --agents {args.agents}"
        f" --calls {args.calls}`.",
        "",
        f"Setup: {shape.agents * shape.memories:,} rows ({shape.agents} agents x {shape.memories:,}; 384-d random"
        f" unit vectors, 1.2 kB text each) in {args.partitions} hash partitions on (org_id, agent_id), agents per"
        f" partition min/median/max {per_part[0]}/{per_part[len(per_part) // 2]}/{per_part[-1]}; heap {sizes['heap']},"
        f" HNSW indexes {index_size} (m 16, ef_construction 64). Load (COPY) {timings['copy_s']:.0f} s, index build"
        f" {timings['index_s']:.0f} s (maintenance_work_mem 2GB, 1 parallel worker; nan = loaded by an earlier run)."
        f" Single searches, LIMIT {LIMIT}, one connection, sequential, after a warm-up, {len(agents)} largest agents"
        f" x {args.calls} random unit queries; iterative scan relaxed_order. Load average {load_avg[0]:.2f}."
        f" {platform.machine()}; {versions}.",
        "",
        "| plan | median ms | p95 ms | max ms | calls | recall@50 mean / min |",
        "|---|---:|---:|---:|---:|---|",
        *(s.row() for s in series),
        "",
        "Exact plan: " + " / ".join(line.strip() for line in plan.splitlines()[:4]),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="100x10000", help="agents x memories per agent")
    parser.add_argument("--layout", choices=("partitioned", "partitioned-halfvec"), default="partitioned")
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--ef", type=int, nargs="+", default=[64, 100, 200])
    parser.add_argument("--data-dir", type=Path, default=Path("loadtest/out/cold_layouts"))
    args = parser.parse_args()
    args.data_dir = args.data_dir.resolve()
    report = asyncio.run(run(args))
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"cold_layouts-{args.layout}-{args.shape}.md"
    path.write_text(report)
    print(report)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
