"""Client CPU of the two PostgreSQL searches of a call, by the form their rows take.

Run: ``.venv/bin/python -m benchmarks.row_decode --data-dir DIR [--rounds N] [--out FILE]``
(``DIR``: a ``loadtest/run`` data dir, or a copy of one: its PostgreSQL is started there).

Three forms of the vector search (50 rows, the exact plan) and of the lexical search
(up to 50 rows), each run in turn against the same agents and questions, one pooled
connection:

* **records**: the rows as they were before issue #14's columnar core: asyncpg
  ``Record``s, one ``MemoryRecord`` per row (the statements and decoding of that
  version, kept here for the comparison);
* **row columns**: the same rows zipped into ``Candidates`` columns;
* **arrays**: the service's form: PostgreSQL aggregates the rows into one row of
  arrays (``stores.postgres.rows.as_arrays``), which asyncpg decodes in C into lists.

Reported: client thread CPU per search with the fetch (median and p90 of ``--rounds``),
and the decoding alone (best of 7 runs of 200 on one answer). Server CPU is not in it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
import timeit
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ibex_context.candidates import Candidates  # noqa: E402
from ibex_context.embedding.hashing import HashingEmbedder  # noqa: E402
from ibex_context.models import MemoryRecord, Source  # noqa: E402
from ibex_context.stores import postgres as pg  # noqa: E402
from ibex_context.stores.cold_plan import ColdPlan  # noqa: E402
from ibex_context.stores.postgres import rows as pg_rows  # noqa: E402
from ibex_context.stores.postgres import searches  # noqa: E402

from loadtest.datastores import stores  # noqa: E402

LIMIT = 50
# The statements before the columnar core (their selected columns differ: the id as a
# uuid, the injection time NULL when none, the lexical vectors through the codec).
_RECORD_COLUMNS = (
    "m.id, m.content, m.category, m.confidence, m.usefulness,"
    " coalesce(u.retrieval_count, 0) AS retrieval_count,"
    " extract(epoch FROM coalesce(m.occurred_at, m.created_at))::float8 AS occurred_at,"
    " extract(epoch FROM u.last_injected_at)::float8 AS last_injected_at,"
    " m.token_counts::text AS token_counts"
)
_USAGE = """
    LEFT JOIN LATERAL (
        SELECT retrieval_count, last_injected_at FROM memory_usage
        WHERE org_id = $1 AND agent_id = $2 AND memory_id = m.id
        LIMIT 1
    ) AS u ON true"""
RECORDS_VECTOR_SQL = (
    f"SELECT {_RECORD_COLUMNS}, m.distance FROM ibex_cold_exact($1, $2, $3, $4) AS m {_USAGE}"
)
RECORDS_LEXICAL_SQL = f"""
    SELECT {_RECORD_COLUMNS}, m.embedding, top.bm25
    FROM ibex_bm25($1, $2, $3, $4) AS top
    CROSS JOIN LATERAL (
        SELECT id, content, category, confidence, usefulness, occurred_at, created_at, token_counts, embedding
        FROM memories WHERE org_id = $1 AND agent_id = $2 AND id = top.memory_id
        LIMIT 1
    ) AS m {_USAGE}
    ORDER BY top.bm25 DESC, m.id
"""


class _RecordsTokenCounts:
    """The memo of that version: a fresh dict per row."""

    def __init__(self) -> None:
        self._parsed: dict[str, tuple[tuple[str, int], ...]] = {}

    def __call__(self, text: str) -> dict[str, int]:
        items = self._parsed.get(text)
        if items is None:
            items = self._parsed[text] = tuple(json.loads(text).items())
        return dict(items)


def _records_vector(rows: Sequence[Any], decode: _RecordsTokenCounts) -> list[MemoryRecord]:
    records = []
    for ident, content, category, confidence, usefulness, count, created, injected, counts, distance in rows:
        records.append(
            MemoryRecord(
                str(ident),
                content,
                category,
                float(confidence),
                float(usefulness),
                count,
                created,
                injected,
                decode(counts),
                None,
                1.0 - distance,
                Source.COLD,
            )
        )
    records.sort(key=lambda r: -(r.similarity or 0.0))
    return records


def _records_lexical(rows: Sequence[Any], decode: _RecordsTokenCounts) -> list[MemoryRecord]:
    records = []
    for row in rows:
        injected = row["last_injected_at"]
        records.append(
            MemoryRecord(
                id=str(row["id"]),
                content=row["content"],
                category=row["category"],
                confidence=float(row["confidence"]),
                usefulness=float(row["usefulness"]),
                retrieval_count=int(row["retrieval_count"]),
                occurred_at=float(row["occurred_at"]),
                last_injected_at=None if injected is None else float(injected),
                token_counts=decode(row["token_counts"]),
                embedding=row["embedding"],
                source=Source.COLD,
                lexical_score=float(row["bm25"]),
            )
        )
    return records


def _row_columns(
    rows: Sequence[Any], decode: pg.TokenCountsDecoder
) -> tuple[list[tuple[Any, ...]], Candidates]:
    """Rows zipped into columns, then as the arrays' columns are."""
    columns = [list(c) for c in zip(*rows, strict=True)]
    return pg_rows.candidate_columns(columns, decode)  # type: ignore[arg-type]


def _vector_found(more: Sequence[Any], found: Candidates) -> Candidates:
    (distances,) = more
    found.similarity = 1.0 - np.array(distances, dtype=np.float64)
    return found


def _lexical_found(more: Sequence[Any], found: Candidates) -> Candidates:
    bm25, embeddings = more
    found.lexical_score = np.array(bm25, dtype=np.float64)
    found.vectors, found.vector_rows = pg.decode_vectors(embeddings)
    return found


async def _measure(dsn: str, agents: list[dict[str, Any]], rounds: int) -> dict[str, dict[str, float]]:
    embedder = HashingEmbedder(384)
    pool = await pg.create_pool(dsn, min_size=1, max_size=1, ef_search=64)
    records_decode, decode = _RecordsTokenCounts(), pg.TokenCountsDecoder()
    work = []
    for agent in agents:
        question = agent["queries"][0]
        (vector,) = await embedder.embed([question])
        work.append(
            (pg.as_uuid(agent["org_id"], "org"), pg.as_uuid(agent["agent_id"], "agent"), question, vector)
        )
    vector_arrays = searches.SEARCH_ARRAYS_SQL[ColdPlan.EXACT]
    lexical_arrays = searches.LEXICAL_ARRAYS_SQL
    vector_rows = pg.SEARCH_SQL[ColdPlan.EXACT]
    forms: Mapping[str, Callable[[Any, tuple[Any, ...]], Any]] = {
        "vector: records": lambda conn, w: conn.fetch(RECORDS_VECTOR_SQL, w[0], w[1], w[3], LIMIT),
        "vector: row columns": lambda conn, w: conn.fetch(vector_rows, w[0], w[1], w[3], LIMIT),
        "vector: arrays": lambda conn, w: conn.fetchrow(vector_arrays, w[0], w[1], w[3], LIMIT),
        "lexical: records": lambda conn, w: conn.fetch(RECORDS_LEXICAL_SQL, w[0], w[1], w[2], LIMIT),
        "lexical: row columns": lambda conn, w: conn.fetch(searches.LEXICAL_SQL, w[0], w[1], w[2], LIMIT),
        "lexical: arrays": lambda conn, w: conn.fetchrow(lexical_arrays, w[0], w[1], w[2], LIMIT),
    }
    decoders: Mapping[str, Callable[[Any], Any]] = {
        "vector: records": lambda rows: _records_vector(rows, records_decode),
        "vector: row columns": lambda rows: _vector_found(*_row_columns(rows, decode)),
        "vector: arrays": lambda row: _vector_found(*pg_rows.candidate_columns(row, decode)),
        "lexical: records": lambda rows: _records_lexical(rows, records_decode),
        "lexical: row columns": lambda rows: _lexical_found(*_row_columns(rows, decode)),
        "lexical: arrays": lambda row: _lexical_found(*pg_rows.candidate_columns(row, decode)),
    }
    with_fetch: dict[str, list[float]] = {name: [] for name in forms}
    answers: dict[str, Any] = {}
    try:
        async with pool.acquire() as conn:
            for i in range(rounds + 20):  # the first 20: warm-up
                w = work[i % len(work)]
                for name, fetch in forms.items():
                    start = time.thread_time_ns()
                    answer = await fetch(conn, w)
                    decoders[name](answer)
                    if i >= 20:
                        with_fetch[name].append((time.thread_time_ns() - start) / 1000)
                    answers[name] = answer
    finally:
        await pool.close()
    result: dict[str, dict[str, float]] = {}
    for name, samples in with_fetch.items():
        samples.sort()
        decode_alone = min(timeit.repeat(lambda n=name: decoders[n](answers[n]), number=200, repeat=7)) / 200
        result[name] = {
            "p50": statistics.median(samples),
            "p90": samples[int(0.9 * len(samples))],
            "decode": decode_alone * 1e6,
        }
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    agents = json.loads((args.data_dir / "agents.json").read_text())["agents"][: args.agents]
    with stores(args.data_dir) as (dsn, _redis_url, _redis, _postgres):
        result = asyncio.run(_measure(dsn, agents, args.rounds))
    lines = [
        f"Client thread CPU µs per search, {args.rounds} rounds of each form in turn over "
        f"{len(agents)} agents of {args.data_dir.name}, limit {LIMIT}; Python {platform.python_version()}, "
        f"{os.cpu_count()} vCPUs shared, load average {os.getloadavg()[0]:.1f} at the end.",
        "",
        "| search: form | with the fetch, p50 | p90 | decoding alone (best) |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {r['p50']:.0f} | {r['p90']:.0f} | {r['decode']:.1f} |" for name, r in result.items()),
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
