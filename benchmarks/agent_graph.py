"""One agent's own HNSW graph at 10k, 100k and 1M memories: build time, search time and
recall@50 against exact, by ``hnsw.ef_search``, on vectors shaped like MiniLM's.

    .venv/bin/python -m benchmarks.agent_graph --check                  # real vs drawn, 10k
    .venv/bin/python -m benchmarks.agent_graph --memories 10000,100000,1000000

Each data set is one agent's memories in a table of its own with the graph the service
builds for an agent past ``cold_exact_max_memories`` (``stores.postgres.graphs.AGENT_GRAPH_OPTIONS``,
its vectors in half precision),
in an embedded PostgreSQL under ``loadtest/out/agent-graphs`` (kept: a 1M-memory graph
takes long to build, later runs reuse it). The vectors:

* ``real``: the check sample of ``loadtest.vectors`` (10k seeded memories embedded by
  MiniLM in fp32 as the service stores them); questions: a question about each of a
  sample of them, embedded as the service embeds queries (int8);
* ``drawn``: drawn from ``loadtest.vectors.VectorShape`` (fitted to the other sample);
  questions: drawn memories plus the offset of a real question in the same cluster.

Per ef_search: the search statement (``ORDER BY embedding <=> $1 LIMIT 50`` under the
service's session settings, ``stores.postgres.pool``) for ``--queries`` questions on one
connection, sequential, after a warm-up round; wall time per statement including the
Unix-socket round trip and the backend's CPU time per statement (``/proc``, steadier on
a shared machine); recall@50 against the exact top 50 (numpy, all distances). Writes
``benchmarks/results/agent-graphs-<label>.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import platform
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import numpy as np
from ibex_context.devtools.embedded import start_postgres
from ibex_context.stores.postgres.graphs import AGENT_GRAPH_OPTIONS, GRAPH_OPTIONS
from ibex_context.stores.postgres.pool import create_pool

from loadtest import pgcopy
from loadtest.datastores import configure_postgres
from loadtest.vectors import (
    CHECK_SAMPLE,
    FIT_SAMPLE,
    REFERENCE_MEMORIES,
    VectorShape,
    fitted_shape,
    reference_sample,
)

RESULTS = Path(__file__).parent / "results"
DATA = Path(__file__).resolve().parent.parent / "loadtest" / "out" / "agent-graphs"
LIMIT = 50
WARM_UP = 30
DEFAULT_EF = (50, 64, 100, 150, 200, 400)
PG_SETTINGS = {"shared_buffers": "8GB", "effective_cache_size": "16GB"}


@dataclass(frozen=True, slots=True)
class Index:
    """The index a data set's table gets and the setting its searches are widened by."""

    method: str  # "hnsw" | "ivfflat"
    options: str  # the index's WITH (...)
    knob: str  # "hnsw.ef_search" | "ivfflat.probes"
    # What the graph holds: the vectors as stored, in half precision, or one bit a
    # dimension (binary_quantize, Hamming distance), whose candidates an exact re-rank orders.
    quantised: str = "vector"  # "vector" | "halfvec" | "bit"
    rerank: int = 0  # bit: candidates taken from the graph and re-ranked exactly

    @property
    def tag(self) -> str:
        return (
            self.method
            + ("" if self.quantised == "vector" else f"_{self.quantised}")
            + "_"
            + "_".join("".join(ch for ch in part if ch.isalnum()) for part in self.options.split(","))
        )

    def describe(self) -> str:
        quantised = {"vector": "", "halfvec": " on halfvec", "bit": f" on bits, top {self.rerank} re-ranked"}
        return f"{self.method} ({self.options}){quantised[self.quantised]}"

    def indexed(self, dim: int) -> str:
        """The index's expression and operator class."""
        if self.quantised == "halfvec":
            return f"((embedding::halfvec({dim})) halfvec_cosine_ops)"
        if self.quantised == "bit":
            return f"((binary_quantize(embedding)::bit({dim})) bit_hamming_ops)"
        return "(embedding vector_cosine_ops)"

    def statement(self, table: str, dim: int) -> str:
        """The top-``LIMIT`` search of ``$1`` (a vector) through this index."""
        if self.quantised == "halfvec":
            return (
                f"SELECT id FROM {table} ORDER BY embedding::halfvec({dim}) <=> $1::vector::halfvec({dim})"
                f" LIMIT {LIMIT}"
            )
        if self.quantised == "bit":
            return (
                f"SELECT id FROM (SELECT id, embedding FROM {table} ORDER BY"
                f" binary_quantize(embedding)::bit({dim}) <~> binary_quantize($1::vector)::bit({dim})"
                f" LIMIT {self.rerank or LIMIT}) AS candidates ORDER BY embedding <=> $1 LIMIT {LIMIT}"
            )
        return f"SELECT id FROM {table} ORDER BY embedding <=> $1 LIMIT {LIMIT}"


# The graph the service builds for an agent (migration 0019), and the one it built before.
SERVICE_GRAPH = Index("hnsw", AGENT_GRAPH_OPTIONS, "hnsw.ef_search", quantised="halfvec")
FULL_PRECISION_GRAPH = Index("hnsw", GRAPH_OPTIONS, "hnsw.ef_search")


@dataclass(frozen=True, slots=True)
class DataSet:
    name: str  # the table's
    label: str
    vectors: np.ndarray
    questions: np.ndarray
    vectors_origin: str
    origin: str  # the questions'


def real_data(queries: int, sample_name: str = CHECK_SAMPLE, memories: int = REFERENCE_MEMORIES) -> DataSet:
    sample = reference_sample(sample_name, memories=memories)
    rng = np.random.default_rng(7)
    asked = rng.choice(len(sample.texts), size=queries, replace=False)
    return DataSet(
        name=f"real_{len(sample.texts)}",
        label=f"real {len(sample.texts):,}",
        vectors=sample.vectors,
        questions=sample.question_vectors[asked],
        vectors_origin=f"MiniLM (fp32) of the {sample_name} sample's memories, as the service stores them",
        origin="questions about them, embedded by MiniLM as the service embeds queries (int8)",
    )


@functools.lru_cache(maxsize=1)
def _drawn(memories: int) -> tuple[VectorShape, np.ndarray, dict[str, object]]:
    """The model, ``memories`` vectors drawn from it and the random state after the draw:
    both question kinds of one size search the same vectors, drawn once (1.5 GB at 1M)."""
    shape = VectorShape.load(fitted_shape())
    rng = np.random.default_rng(memories)
    vectors, _ = shape.draw(memories, rng)
    return shape, vectors, rng.bit_generator.state


def drawn_data(memories: int, queries: int, *, real_questions: bool = False) -> DataSet:
    shape, vectors, state = _drawn(memories)
    rng = np.random.default_rng()
    rng.bit_generator.state = state
    if real_questions:  # what the service searches with: MiniLM's vectors of real questions
        asked = reference_sample(FIT_SAMPLE).question_vectors
        questions = asked[rng.choice(len(asked), size=queries, replace=False)]
        origin = "MiniLM (int8) of the fit sample's questions, as the service embeds queries"
    else:
        questions = shape.questions(vectors[rng.choice(memories, size=queries, replace=False)], rng)
        origin = "questions about drawn memories, made as the model's real ones were"
    return DataSet(
        name=f"drawn_{memories}",
        label=f"drawn {memories:,}, {'real' if real_questions else 'drawn'} questions",
        vectors=vectors,
        questions=questions,
        vectors_origin="drawn from the model fitted to the fit sample, loadtest.vectors",
        origin=origin,
    )


def exact_top(data: DataSet) -> np.ndarray:
    """The exact top ``LIMIT`` ids (row numbers) of every question, by cosine."""
    out = np.empty((len(data.questions), LIMIT), dtype=np.int64)
    for i, question in enumerate(data.questions):
        scores = data.vectors @ question
        top = np.argpartition(-scores, LIMIT)[:LIMIT]
        out[i] = top[np.argsort(-scores[top])]
    return out


async def ensure_table(
    conn: asyncpg.Connection, data: DataSet, index: Index, maintenance_work_mem: str
) -> float | None:
    """Creates, fills and indexes the data set's table unless it exists; the build's
    seconds when it was built now."""
    table = f"{data.name}_{index.tag}"
    exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table)
    if exists:
        return None
    dim = data.vectors.shape[1]
    await conn.execute(f"DROP TABLE IF EXISTS {table}_partial")
    await conn.execute(
        f"CREATE TABLE {table}_partial (id integer NOT NULL, embedding vector({dim}) NOT NULL)"
    )

    async def chunks() -> AsyncIterator[bytes]:
        yield pgcopy.HEADER
        for start in range(0, len(data.vectors), 20_000):
            values = pgcopy.vector_values(data.vectors[start : start + 20_000])
            yield b"".join(
                pgcopy.row((pgcopy.integer_value(start + i), vector)) for i, vector in enumerate(values)
            )
        yield pgcopy.TRAILER

    await conn.copy_to_table(
        f"{table}_partial", source=chunks(), format="binary", columns=["id", "embedding"]
    )
    await conn.execute(f"SET maintenance_work_mem = '{maintenance_work_mem}'")
    await conn.execute("SET max_parallel_maintenance_workers = 1")
    started = time.perf_counter()
    await conn.execute(
        f"CREATE INDEX ON {table}_partial USING {index.method} {index.indexed(dim)} WITH ({index.options})"
    )
    seconds = time.perf_counter() - started
    await conn.execute(f"ALTER TABLE {table}_partial RENAME TO {table}")
    await conn.execute(f"ANALYZE {table}")
    return seconds


def backend_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, slots=True)
class Measured:
    data: str
    ef_search: int | None  # None: the exact scan
    median_ms: float
    p95_ms: float
    cpu_ms: float
    recall_mean: float
    recall_p5: float
    recall_min: float


async def measure(
    pool: asyncpg.Pool, data: DataSet, index: Index, exact: np.ndarray, ef_search: int | None
) -> Measured:
    """The index's search at ``ef_search`` (its knob's value), or (None) the exact scan of every row."""
    table = f"{data.name}_{index.tag}"
    statement = (
        f"SELECT id FROM {table} ORDER BY embedding <=> $1 LIMIT {LIMIT}"
        if ef_search is None
        else index.statement(table, data.vectors.shape[1])
    )
    async with pool.acquire() as conn:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        # The planner takes a sequential scan once it costs a wide graph search above it
        # (10k rows at ef_search 150 here): each plan is measured as itself.
        if ef_search is None:
            await conn.execute("SET enable_indexscan = off")
            await conn.execute("SET enable_seqscan = on")
        else:
            await conn.execute("SET enable_indexscan = on")
            await conn.execute("SET enable_seqscan = off")
            await conn.execute(f"SET {index.knob} = {ef_search}")
        for question in data.questions[:WARM_UP]:
            await conn.fetch(statement, question)
        walls: list[float] = []
        recalls: list[float] = []
        cpu_before = backend_cpu_seconds(pid)
        for question, truth in zip(data.questions, exact, strict=True):
            started = time.perf_counter()
            rows = await conn.fetch(statement, question)
            walls.append((time.perf_counter() - started) * 1e3)
            recalls.append(len({r["id"] for r in rows} & set(truth.tolist())) / LIMIT)
        cpu_ms = (backend_cpu_seconds(pid) - cpu_before) * 1e3 / len(walls)
    walls.sort()
    recalls.sort()
    return Measured(
        data=data.label if index == SERVICE_GRAPH else f"{data.label}; {index.describe()}",
        ef_search=ef_search,
        median_ms=statistics.median(walls),
        p95_ms=walls[int(0.95 * (len(walls) - 1))],
        cpu_ms=cpu_ms,
        recall_mean=statistics.fmean(recalls),
        recall_p5=recalls[int(0.05 * (len(recalls) - 1))],
        recall_min=recalls[0],
    )


async def run(
    data_sets: list[DataSet],
    index: Index,
    ef_values: list[int],
    dsn: str,
    lines: list[str],
    *,
    skip_exact_scan: bool = False,
) -> list[Measured]:
    out: list[Measured] = []
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute("CREATE EXTENSION IF NOT EXISTS vector")
        for data in {d.name: d for d in data_sets}.values():
            table = f"{data.name}_{index.tag}"
            gb = data.vectors.shape[0] * 4_000 / 1e9  # graph + vectors, with room
            seconds = await ensure_table(admin, data, index, f"{max(1, min(8, int(gb) + 1))}GB")
            size = await admin.fetchval(
                "SELECT pg_table_size($1::regclass) + pg_indexes_size($1::regclass)", table
            )
            graph = await admin.fetchval("SELECT pg_indexes_size($1::regclass)", table)
            built = f"built in {seconds:.0f} s" if seconds is not None else "built by an earlier run"
            lines.append(
                f"- `{table}`: {len(data.vectors):,} memories ({data.vectors_origin}); {index.method} index"
                f" {graph / 1e6:.0f} MB, table + index {size / 1e6:.0f} MB"
                f" ({size / len(data.vectors):.0f} B a"
                f" memory); {built}."
            )
        for data in data_sets:
            lines.append(f"- {data.label}: {data.origin}.")
    finally:
        await admin.close()
    if not ef_values:  # --build-only
        return out
    pool = await create_pool(dsn, min_size=1, max_size=1, ef_search=DEFAULT_EF[0])
    try:
        for data in data_sets:
            exact = exact_top(data)
            for ef in ([] if skip_exact_scan else [None]) + ef_values:
                out.append(await measure(pool, data, index, exact, ef))
                m = out[-1]
                print(
                    f"{m.data} {index.knob} {ef or 'exact'}: {m.median_ms:.2f} ms, cpu {m.cpu_ms:.2f},"
                    f" recall {m.recall_mean:.3f}/{m.recall_p5:.2f}",
                    flush=True,
                )
    finally:
        await pool.close()
    return out


def table(measured: list[Measured]) -> list[str]:
    lines = [
        "| data set | ef_search / probes | median ms | p95 ms | backend CPU ms | recall@50 mean / p5 / min |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for m in measured:
        lines.append(
            f"| {m.data} | {m.ef_search or 'exact scan'} | {m.median_ms:.2f} | {m.p95_ms:.2f}"
            f" | {m.cpu_ms:.2f} |"
            f" {m.recall_mean:.3f} / {m.recall_p5:.2f} / {m.recall_min:.2f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--check", action="store_true", help="real and drawn vectors at 10k memories, side by side"
    )
    p.add_argument("--memories", default="", help="drawn data sets, e.g. 10000,100000,1000000")
    p.add_argument(
        "--real",
        default="",
        help="real samples too, NAME:MEMORIES (e.g. agent-100k:100000: embedded by MiniLM once,"
        " cached; ~35 min of both cores for 100k)",
    )
    p.add_argument("--index", choices=("hnsw", "ivfflat"), default="hnsw")
    p.add_argument(
        "--index-options",
        default="",
        help=f"the index's WITH (...); default for hnsw: the service's, {AGENT_GRAPH_OPTIONS}",
    )
    p.add_argument(
        "--quantised",
        choices=("vector", "halfvec", "bit"),
        default="halfvec",
        help="what the graph holds: the stored vectors, halfvec (the service's), or bits"
        " (binary_quantize) re-ranked exactly",
    )
    p.add_argument("--rerank", type=int, default=400, help="--quantised bit: candidates re-ranked")
    p.add_argument("--ef", default=",".join(map(str, DEFAULT_EF)), help="the index's knob's values")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument(
        "--skip-exact-scan", action="store_true", help="no exact-scan row (~0.5 s a question at 1M memories)"
    )
    p.add_argument(
        "--build-only",
        action="store_true",
        help="build the tables and indexes (kept for later runs), measure nothing",
    )
    p.add_argument("--label", default="")
    p.add_argument(
        "--data-dir", type=Path, default=DATA, help="where the embedded PostgreSQL keeps the tables"
    )
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.memories.split(",") if s]
    ef_values = [] if args.build_only else [int(s) for s in args.ef.split(",")]
    data_sets = (
        [
            real_data(args.queries),
            drawn_data(10_000, args.queries),
            drawn_data(10_000, args.queries, real_questions=True),
        ]
        if args.check
        else []
    ) + [
        d
        for n in sizes
        for d in (drawn_data(n, args.queries), drawn_data(n, args.queries, real_questions=True))
    ]
    for spec in filter(None, args.real.split(",")):
        name, memories = spec.split(":")
        data_sets.append(real_data(args.queries, name, int(memories)))
    if args.index == "hnsw" and not args.index_options and args.quantised == "halfvec":
        index = SERVICE_GRAPH
    else:
        knob = "hnsw.ef_search" if args.index == "hnsw" else "ivfflat.probes"
        default_options = AGENT_GRAPH_OPTIONS if args.index == "hnsw" else "lists = 100"
        index = Index(
            args.index,
            args.index_options or default_options,
            knob,
            quantised=args.quantised,
            rerank=args.rerank if args.quantised == "bit" else 0,
        )
    args.data_dir.mkdir(parents=True, exist_ok=True)
    postgres = start_postgres(args.data_dir)
    try:
        if configure_postgres(postgres.dsn, PG_SETTINGS):
            postgres.stop()
            postgres = start_postgres(args.data_dir)
        setup: list[str] = []
        load = os.getloadavg()[0]
        measured = asyncio.run(
            run(data_sets, index, ef_values, postgres.dsn, setup, skip_exact_scan=args.skip_exact_scan)
        )
    finally:
        postgres.stop()
    if args.build_only:
        print("\n".join(setup))
        return 0
    label = args.label or (
        "check" if args.check else "-".join([*map(str, sizes), *filter(None, args.real.split(","))])
    )
    path = RESULTS / f"agent-graphs-{label}.md"
    path.write_text(
        "\n".join(
            [
                f"# One agent's own graph: {label}",
                "",
                f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}."
                " Command: `python -m benchmarks.agent_graph"
                f" {' '.join(argv if argv is not None else sys.argv[1:])}`.",
                "",
                f"Setup: {index.describe()}"
                f"{' (the service own-graph options)' if index == SERVICE_GRAPH else ''};"
                f" knob `{index.knob}`; PostgreSQL"
                f" {PG_SETTINGS}; the service's session settings; {args.queries} questions a data set, one"
                f" connection, sequential, after {WARM_UP} warm-up statements; load average {load:.2f} at the"
                f" start; {platform.machine()}, {os.cpu_count()} CPUs.",
                "",
                *setup,
                "",
                *table(measured),
                "",
            ]
        )
    )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
