"""How closely the bounded lexical search (migration 0012) ranks like exact BM25.

    python -m benchmarks.lexical_overlap [--data locomo-dev.json] [--term-postings 100,200,500]
        [--out benchmarks/results/lexical_overlap-<date>.md]

Stores every turn of each LoCoMo conversation as a memory of one agent (as the quality
benchmark does), plus every conversation's turns together as one larger agent (the words
of a large agent are held by many more memories, which is where the per-word bound
reads only the best postings and the commonest words are skipped). For every question
it asks PostgreSQL for the top 50 twice: exact BM25 over every posting of every query
word (migration 0005's function, as it was) and ``ibex_bm25`` with each per-word bound.
Overlap: the share of the exact top 50 (or of all matches, when fewer) the bounded
search returns too. Same postings, lexicon and scoring formula: only what is read
differs. The vectors are not used (the hashing embedder fills them).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import asyncpg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ibex_context.devtools.embedded import embedded_stores  # noqa: E402
from ibex_context.embedding.hashing import HashingEmbedder  # noqa: E402
from ibex_context.stores.base import PreparedMemory  # noqa: E402
from ibex_context.stores.postgres import PostgresMemoryStore, create_pool  # noqa: E402
from ibex_context.stores.postgres.migrate import migrate  # noqa: E402

from benchmarks.quality.__main__ import default_data_path  # noqa: E402
from benchmarks.quality.locomo import Conversation, load_conversations  # noqa: E402

DIM = 384
TOP = 50

# Migration 0005's ibex_bm25: every posting of every query word, df counted per query.
EXACT_SQL = """
    WITH terms AS (
        SELECT DISTINCT lexeme FROM unnest(to_tsvector('english', $3))
    ), postings AS (
        SELECT p.memory_id, p.tf::float8 AS tf, p.dl::float8 AS dl,
               count(*) OVER (PARTITION BY p.lexeme)::float8 AS df
        FROM terms
        JOIN memory_terms AS p ON p.org_id = $1 AND p.agent_id = $2 AND p.lexeme = terms.lexeme
    ), stats AS (
        SELECT greatest(s.memories, 1)::float8 AS n,
               greatest(s.lexemes::float8 / greatest(s.memories, 1), 1.0) AS avgdl
        FROM memory_stats AS s WHERE s.org_id = $1 AND s.agent_id = $2
    )
    SELECT postings.memory_id
    FROM postings CROSS JOIN stats
    GROUP BY postings.memory_id
    ORDER BY sum(ln(1 + (stats.n - postings.df + 0.5) / (postings.df + 0.5)) * postings.tf * 2.2
                 / (postings.tf + 1.2 * (0.25 + 0.75 * postings.dl / stats.avgdl))) DESC, postings.memory_id
    LIMIT $4
"""
BOUNDED_SQL = "SELECT memory_id FROM ibex_bm25($1, $2, $3, $4, $5)"


def _memories(texts: Sequence[str], embedder: HashingEmbedder) -> list[PreparedMemory]:
    import hashlib

    unique = list(dict.fromkeys(texts))
    return [
        PreparedMemory(
            id=str(uuid.uuid4()),
            content=text,
            content_hash=hashlib.sha256(text.encode()).digest(),
            category="episodic",
            confidence=0.8,
            usefulness=0.5,
            metadata={},
            token_counts={},
            embedding=embedder.embed_one(text),
            occurred_at=None,
        )
        for text in unique
    ]


async def _store(
    store: PostgresMemoryStore,
    agents: dict[str, tuple[uuid.UUID, uuid.UUID]],
    name: str,
    texts: Sequence[str],
) -> int:
    org, agent = uuid.uuid4(), uuid.uuid4()
    agents[name] = (org, agent)
    memories = _memories(texts, HashingEmbedder(DIM))
    for start in range(0, len(memories), 500):
        await store.upsert_memories(str(org), str(agent), memories[start : start + 500])
    return len(memories)


def _summary(overlaps: Sequence[float]) -> str:
    ordered = sorted(overlaps)
    p5 = ordered[max(0, int(0.05 * len(ordered)) - 1)] if ordered else float("nan")
    full = sum(1 for o in ordered if o >= 1.0) / len(ordered) if ordered else float("nan")
    return f"{statistics.fmean(ordered):.4f} | {p5:.3f} | {ordered[0]:.3f} | {full:.1%}"


Asks = dict[str, list[tuple[uuid.UUID, uuid.UUID, str]]]


async def _compare(conn: asyncpg.Connection, asks: Asks, bounds: Sequence[int]) -> list[str]:
    """Each group's questions, exact then under each bound, back to back: the table's rows."""
    rows: list[str] = []
    for group, questions in asks.items():
        overlaps: dict[int, list[float]] = {b: [] for b in bounds}
        exact_ms: list[float] = []
        bounded_ms: dict[int, list[float]] = {b: [] for b in bounds}
        for org, agent, question in questions:
            t0 = time.perf_counter()
            exact = [r[0] for r in await conn.fetch(EXACT_SQL, org, agent, question, TOP)]
            exact_ms.append((time.perf_counter() - t0) * 1e3)
            for bound in bounds:
                t0 = time.perf_counter()
                found = {r[0] for r in await conn.fetch(BOUNDED_SQL, org, agent, question, TOP, bound)}
                bounded_ms[bound].append((time.perf_counter() - t0) * 1e3)
                if exact:
                    overlaps[bound].append(sum(1 for m in exact if m in found) / len(exact))
        for bound in bounds:
            rows.append(
                f"| {group} | {bound} | {len(overlaps[bound])} | {_summary(overlaps[bound])} |"
                f" {statistics.median(bounded_ms[bound]):.2f} | {statistics.median(exact_ms):.2f} |"
            )
    return rows


_TABLE_HEAD = [
    "| agents | per-word bound | questions | overlap mean | p5 | min | share with all 50"
    " | bounded ms (median) | exact ms (median) |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
]


async def measure(data: Path, bounds: Sequence[int]) -> str:
    conversations: list[Conversation] = load_conversations(data)
    with (
        tempfile.TemporaryDirectory(prefix="ibex-lexical-overlap-") as work,
        embedded_stores(Path(work)) as stores,
    ):
        await migrate(stores.postgres.dsn, DIM)
        pool = await create_pool(stores.postgres.dsn, min_size=1, max_size=2, ef_search=64)
        store = PostgresMemoryStore(pool, ef_search=64)
        agents: dict[str, tuple[uuid.UUID, uuid.UUID]] = {}
        sizes: dict[str, int] = {}
        for conversation in conversations:
            texts = [turn.content for turn in conversation.turns]
            sizes[conversation.sample_id] = await _store(store, agents, conversation.sample_id, texts)
        everything = [turn.content for c in conversations for turn in c.turns]
        sizes["all"] = await _store(store, agents, "all", everything)
        conn = await asyncpg.connect(stores.postgres.dsn)
        try:
            await conn.execute("VACUUM ANALYZE memory_terms")
            asks: Asks = {
                "conversations": [(*agents[c.sample_id], q.text) for c in conversations for q in c.questions],
                "all": [(*agents["all"], q.text) for c in conversations for q in c.questions],
            }
            rows = await _compare(conn, asks, bounds)
        finally:
            await conn.close()
            await store.aclose()
    conv_sizes = [sizes[c.sample_id] for c in conversations]
    lines = [
        f"# Bounded lexical search vs exact BM25, top {TOP} ({dt.date.today().isoformat()})",
        "",
        f"Command: `python -m benchmarks.lexical_overlap --term-postings {','.join(map(str, bounds))}`",
        "",
        f"Data: {data.name}, {len(conversations)} conversations as agents of"
        f" {min(conv_sizes)}-{max(conv_sizes)}"
        f" memories, and all of them as one agent of {sizes['all']} memories; every question of each"
        " (categories 1-4) asked of its agent, and every question asked of the large agent."
        " PostgreSQL (embedded) after VACUUM ANALYZE; wall times are one query at a time on a shared"
        " 2-core machine, for orientation only.",
        "",
        *_TABLE_HEAD,
        *rows,
    ]
    return "\n".join(lines) + "\n"


async def measure_data_set(data_dir: Path, bounds: Sequence[int], agents_wanted: int) -> str:
    """A load-test data set (``loadtest/run`` seeds it): its agents' own questions."""
    from ibex_context.devtools.embedded import start_postgres

    plan = json.loads((data_dir / "agents.json").read_text())
    chosen = plan["agents"][:agents_wanted]
    postgres = start_postgres(data_dir)
    try:
        conn = await asyncpg.connect(postgres.dsn)
        try:
            asks: Asks = {
                f"{len(chosen)} agents of {data_dir.name}": [
                    (uuid.UUID(a["org_id"]), uuid.UUID(a["agent_id"]), q)
                    for a in chosen
                    for q in a["queries"]
                ]
            }
            rows = await _compare(conn, asks, bounds)
        finally:
            await conn.close()
    finally:
        postgres.stop()
    sizes = sorted({int(a["memories"]) for a in chosen})
    return (
        "\n".join(
            [
                f"Data set {data_dir.name}: the first {len(chosen)} agents ({sizes} memories),"
                " the load test's questions (a span of one of the agent's memories; a template vocabulary:"
                " a question's words are held by many of the agent's memories).",
                "",
                *_TABLE_HEAD,
                *rows,
            ]
        )
        + "\n"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", type=Path, default=None, help="LoCoMo JSON (default: the quality benchmark's)"
    )
    parser.add_argument("--term-postings", default="100,200,500", help="per-word bounds, comma-separated")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="a load-test data set instead of LoCoMo (its PostgreSQL is started)",
    )
    parser.add_argument("--agents", type=int, default=20, help="with --data-dir: how many of its agents")
    args = parser.parse_args(argv)
    bounds = [int(b) for b in args.term_postings.split(",")]
    if args.data_dir is not None:
        text = asyncio.run(measure_data_set(args.data_dir, bounds, args.agents))
    else:
        text = asyncio.run(measure(args.data or default_data_path(), bounds))
    if args.out is not None:
        args.out.write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
