"""The columns the stores read of a memory and how their rows become values.

Memory reads select from ``memories AS m`` LEFT JOIN ``memory_usage AS u`` (a memory
never injected has no usage row: count 0, no time). ``token_counts`` comes as text:
``TokenCountsDecoder`` parses each distinct value once instead of running the jsonb
codec's json.loads on every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
import numpy as np

from ibex_context.candidates import Candidates
from ibex_context.models import MemoryRecord, Source
from ibex_context.stores.postgres.codecs import NO_VECTORS, TokenCountsDecoder, epoch

# The columns ``record`` reads.
MEMORY_COLUMNS = (
    "m.id, m.content, m.category, m.confidence, m.usefulness,"
    " coalesce(u.retrieval_count, 0) AS retrieval_count,"
    " extract(epoch FROM coalesce(m.occurred_at, m.created_at))::float8 AS occurred_at,"
    " extract(epoch FROM u.last_injected_at)::float8 AS last_injected_at,"
    " m.token_counts::text AS token_counts"
)
# What the searches read of each memory for ``Candidates`` (``candidate_columns``),
# in this order: the id as text (no uuid object per row), times as epoch floats
# (NaN: never injected), ``token_counts`` as text (``TokenCountsDecoder``).
CANDIDATE_COLUMNS = (
    "m.id::text, m.content, m.category, m.confidence, m.usefulness,"
    " coalesce(u.retrieval_count, 0) AS retrieval_count,"
    " extract(epoch FROM coalesce(m.occurred_at, m.created_at))::float8 AS occurred_at,"
    " coalesce(extract(epoch FROM u.last_injected_at)::float8, 'NaN') AS last_injected_at,"
    " m.token_counts::text AS token_counts"
)
# Their names in the rows (``as_arrays`` aggregates each).
CANDIDATE_NAMES = (
    "id",
    "content",
    "category",
    "confidence",
    "usefulness",
    "retrieval_count",
    "occurred_at",
    "last_injected_at",
    "token_counts",
)
# Scoped by the tenant on both sides ($1 = org_id, $2 = agent_id).
USAGE_JOIN = "LEFT JOIN memory_usage AS u ON u.org_id = $1 AND u.agent_id = $2 AND u.memory_id = m.id"


def as_arrays(rows_sql: str, extra: Sequence[str]) -> str:
    """``rows_sql``'s rows as one row of arrays, one per column (NULLs when no row), in
    the rows' order (an aggregate over a sorted subquery keeps it).

    asyncpg builds a ``Record`` per row and its columns are read back one row at a
    time; arrays decode in C straight into lists, the columns ``Candidates`` wants. For
    50 rows of the vector search this cut the client's CPU per search by about a
    third, fetch included (benchmarks/results/columnar-2026-11-26.md).
    """
    columns = ", ".join(f"array_agg(r.{name})" for name in (*CANDIDATE_NAMES, *extra))
    return f"SELECT {columns} FROM ({rows_sql}) AS r"


def candidate_columns(
    row: Sequence[Any], token_counts: TokenCountsDecoder
) -> tuple[list[list[Any]], Candidates]:
    """``as_arrays``'s one row as ``Candidates`` (as from the vector search: no
    similarity, no BM25, no vectors yet), and the arrays of its further columns."""
    ids, contents, categories, confidence, usefulness, counts, occurred, injected, texts, *more = row
    n = len(ids)
    return more, Candidates(
        ids,
        contents,
        categories,
        np.array(confidence, dtype=np.float64),
        np.array(usefulness, dtype=np.float64),
        np.array(counts, dtype=np.float64),
        np.array(occurred, dtype=np.float64),
        np.array(injected, dtype=np.float64),
        list(map(token_counts, texts)),
        np.full(n, np.nan),
        np.full(n, np.nan),
        # A plain int: np.full with an IntEnum fill costs ~5x more.
        np.full(n, int(Source.COLD), dtype=np.int8),
        NO_VECTORS,
        np.full(n, -1, dtype=np.intp),
    )


def record(
    row: asyncpg.Record, token_counts: TokenCountsDecoder, *, with_embedding: bool = False
) -> MemoryRecord:
    """A row of ``MEMORY_COLUMNS`` (and ``embedding`` when asked) as a ``MemoryRecord``."""
    distance = row.get("distance")
    return MemoryRecord(
        id=str(row["id"]),
        content=row["content"],
        category=row["category"],
        confidence=float(row["confidence"]),
        usefulness=float(row["usefulness"]),
        retrieval_count=int(row["retrieval_count"]),
        occurred_at=epoch(row["occurred_at"]),
        last_injected_at=epoch(row["last_injected_at"]),
        token_counts=token_counts(row["token_counts"]),
        embedding=row["embedding"] if with_embedding else None,
        similarity=None if distance is None else 1.0 - float(distance),
        source=Source.COLD,
    )
