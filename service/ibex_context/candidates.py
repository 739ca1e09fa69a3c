"""The memories one call's retrieval found, as columns (issue #14).

Every source answers with one ``Candidates``: the vector and lexical searches build
it straight from their rows (``stores.postgres``), the hot set's read from its
records (``stores.redis.hot_record``). ``merge`` joins the three by id with index arrays,
``pipeline.scoring.rank`` scores the columns, the packer costs candidates by index,
and only the memories injected become objects (``records_at``, into ``ScoredMemory``).
Per-candidate objects built and rebuilt between the stores and the response were a
large part of a call's CPU (one ``MemoryRecord`` per row, then copies to merge them).

Unknown numbers are NaN (``confidence``, ``usefulness``, ``occurred_at``,
``last_injected_at``; ``similarity``: not computed by the store; ``lexical_score``:
not found by the lexical search). Vectors are rows of one float32 matrix: ``vector_rows[i]`` is
candidate i's row in ``vectors``, -1 when it has none (the vector search returns
its similarity instead). Nothing here does I/O.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from ibex_context.models import FloatVector, MemoryRecord, Source

Floats = npt.NDArray[np.float64]
Rows = npt.NDArray[np.intp]
VectorMatrix = npt.NDArray[np.float32]

_NO_VECTORS: VectorMatrix = np.zeros((0, 0), dtype=np.float32)
_NO_FLOATS: Floats = np.zeros(0, dtype=np.float64)
_NO_SOURCES: npt.NDArray[np.int8] = np.zeros(0, dtype=np.int8)
_NO_ROWS: Rows = np.zeros(0, dtype=np.intp)
_NAN = math.nan
T = TypeVar("T")
# The float64 columns, in the order ``_concat`` and ``records_at`` unpack them.
_FLOAT_COLUMNS = (
    "confidence",
    "usefulness",
    "retrieval_counts",
    "occurred_at",
    "last_injected_at",
    "similarity",
    "lexical_score",
)
# Source by value: an index, not an Enum call per record.
_SOURCES = {int(source): source for source in Source}


# Not frozen: a frozen dataclass's __init__ sets every field through
# object.__setattr__; a few are built per call. Treat instances as values all the same.
@dataclass(slots=True)
class Candidates:
    """Column i of every field is candidate i."""

    ids: Sequence[str]
    contents: Sequence[str]
    categories: Sequence[str]
    confidence: Floats
    usefulness: Floats
    retrieval_counts: Floats
    occurred_at: Floats
    last_injected_at: Floats
    # Per-encoding (and per-format block) token counts written with the memory
    # (``layout.stored_token_counts``), as the store decoded them: never copied here.
    token_counts: Sequence[Mapping[str, int]]
    similarity: Floats
    lexical_score: Floats
    sources: npt.NDArray[np.int8]
    vectors: VectorMatrix
    vector_rows: Rows

    def __len__(self) -> int:
        return len(self.ids)

    def embedding(self, i: int) -> FloatVector | None:
        row = int(self.vector_rows[i])
        return None if row < 0 else self.vectors[row]

    def record(self, i: int) -> MemoryRecord:
        """Candidate ``i`` as one object (for a memory injected, and for tests)."""
        return self.records_at([i])[0]

    def records(self) -> list[MemoryRecord]:
        return self.records_at(range(len(self)))

    def records_at(self, rows: Sequence[int]) -> list[MemoryRecord]:
        """The candidates at ``rows`` as objects: each column is read once for all of them
        (reading numpy scalars one field at a time costs several times more)."""
        if not rows:
            return []
        index = np.asarray(rows, dtype=np.intp)
        # One concatenate of the seven picks (np.stack adds a Python wrapper's cost).
        numbers = (
            np.concatenate([getattr(self, name)[index] for name in _FLOAT_COLUMNS])
            .reshape(len(_FLOAT_COLUMNS), len(index))
            .tolist()
        )
        # NaN (unknown) becomes None; ``v != v`` is NaN's test without a call per value.
        confidence, usefulness, counts, occurred, injected, similarity, lexical = (
            [None if v != v else v for v in column] for column in numbers
        )
        vector_rows = self.vector_rows[index].tolist()
        vectors = self.vectors
        ids, contents, categories, token_counts = self.ids, self.contents, self.categories, self.token_counts
        sources = self.sources[index].tolist()
        return [
            MemoryRecord(
                ids[i],
                contents[i],
                categories[i],
                confidence[k],
                usefulness[k],
                int(counts[k] or 0),
                occurred[k],
                injected[k],
                token_counts[i],
                None if vector_rows[k] < 0 else vectors[vector_rows[k]],
                similarity[k],
                _SOURCES[sources[k]],
                lexical[k],
            )
            for k, i in enumerate(rows)
        ]

    def take(self, rows: Rows) -> Candidates:
        """The candidates at ``rows``, in that order (vectors stay shared)."""
        pick = rows.tolist()
        return Candidates(
            [self.ids[i] for i in pick],
            [self.contents[i] for i in pick],
            [self.categories[i] for i in pick],
            self.confidence[rows],
            self.usefulness[rows],
            self.retrieval_counts[rows],
            self.occurred_at[rows],
            self.last_injected_at[rows],
            [self.token_counts[i] for i in pick],
            self.similarity[rows],
            self.lexical_score[rows],
            self.sources[rows],
            self.vectors,
            self.vector_rows[rows],
        )

    @staticmethod
    def empty() -> Candidates:
        """No candidates (what a source that found nothing, or did not answer, gives);
        its columns are shared, being empty."""
        none = _NO_FLOATS
        return Candidates(
            (), (), (), none, none, none, none, none, (), none, none, _NO_SOURCES, _NO_VECTORS, _NO_ROWS
        )

    @staticmethod
    def from_records(records: Sequence[MemoryRecord], source: Source | None = None) -> Candidates:
        """Columns of ``records`` (each with its own ``source`` unless one is given).
        The write side, tests and benchmarks hold records; the stores build columns."""
        n = len(records)

        def column(values: Sequence[float | None]) -> Floats:
            return np.array([_NAN if v is None else v for v in values], dtype=np.float64).reshape(n)

        with_vectors = [i for i, r in enumerate(records) if r.embedding is not None]
        vector_rows = np.full(n, -1, dtype=np.intp)
        vectors = _NO_VECTORS
        if with_vectors:
            dim = _common_dimension([records[i].embedding for i in with_vectors])
            alike = [i for i in with_vectors if _dimension(records[i].embedding) == dim]
            vectors = np.array([records[i].embedding for i in alike], dtype=np.float32).reshape(
                len(alike), dim
            )
            vector_rows[alike] = np.arange(len(alike))
        return Candidates(
            [r.id for r in records],
            [r.content for r in records],
            [r.category for r in records],
            column([r.confidence for r in records]),
            column([r.usefulness for r in records]),
            column([float(r.retrieval_count) for r in records]),
            column([r.occurred_at for r in records]),
            column([r.last_injected_at for r in records]),
            [r.token_counts for r in records],
            column([r.similarity for r in records]),
            column([r.lexical_score for r in records]),
            np.array([int(source if source is not None else r.source) for r in records], dtype=np.int8),
            vectors,
            vector_rows,
        )


def _dimension(vector: FloatVector | None) -> int:
    return -1 if vector is None else int(vector.shape[0])


def _common_dimension(vectors: Sequence[FloatVector | None]) -> int:
    """The most common dimension (ties: the first seen). One deployment writes one; a
    set written across an embedder change keeps its most common one's vectors."""
    dims = [_dimension(v) for v in vectors]
    return max(dict.fromkeys(dims), key=dims.count)


def concat(parts: Sequence[Candidates]) -> Candidates:
    """The parts' candidates one after the other; vectors of a dimension other than the
    first part's that has vectors are dropped (such vectors cannot be compared with the
    query anyway: see ``merge``)."""
    if len(parts) == 1:
        return parts[0]
    with_vectors = [p for p in parts if p.vectors.shape[0]]
    dim = with_vectors[0].vectors.shape[1] if with_vectors else 0
    return _concat(parts, dim)


def _concat(parts: Sequence[Candidates], dim: int, keep: Sequence[int] | None = None) -> Candidates:
    """The parts one after the other (``keep``: only those rows of the result, in that
    order). The float columns travel as one matrix: one ``np.concatenate`` and one
    take for all seven instead of one each (a numpy call's fixed cost outweighs its
    work on a call's ~100 candidates)."""
    matrices: list[VectorMatrix] = []
    rows: list[Rows] = []
    offset = 0
    for part in parts:
        if part.vectors.shape[0] and part.vectors.shape[1] == dim:
            matrices.append(part.vectors)
            rows.append(np.where(part.vector_rows >= 0, part.vector_rows + offset, -1))
            offset += part.vectors.shape[0]
        else:
            rows.append(np.full(len(part), -1, dtype=np.intp))
    n = sum(len(part) for part in parts)
    # Row k of ``numbers`` is the k-th of _FLOAT_COLUMNS, every part's values in turn.
    numbers = np.concatenate([getattr(p, name) for name in _FLOAT_COLUMNS for p in parts]).reshape(
        len(_FLOAT_COLUMNS), n
    )
    sources = np.concatenate([p.sources for p in parts])
    vector_rows = np.concatenate(rows)
    ids = _joined([p.ids for p in parts], keep)
    contents = _joined([p.contents for p in parts], keep)
    categories = _joined([p.categories for p in parts], keep)
    token_counts = _joined([p.token_counts for p in parts], keep)
    if keep is not None:
        index = np.array(keep, dtype=np.intp)
        numbers, sources, vector_rows = numbers[:, index], sources[index], vector_rows[index]
    confidence, usefulness, retrieval_counts, occurred_at, last_injected_at, similarity, lexical_score = (
        numbers
    )
    return Candidates(
        ids,
        contents,
        categories,
        confidence,
        usefulness,
        retrieval_counts,
        occurred_at,
        last_injected_at,
        token_counts,
        similarity,
        lexical_score,
        sources,
        np.concatenate(matrices) if len(matrices) > 1 else (matrices[0] if matrices else _NO_VECTORS),
        vector_rows,
    )


def _joined(columns: Sequence[Sequence[T]], keep: Sequence[int] | None) -> list[T]:
    joined = [value for column in columns for value in column] if len(columns) > 1 else list(columns[0])
    return joined if keep is None else list(map(joined.__getitem__, keep))


def merge(cold: Candidates, lexical: Candidates, hot: Candidates, *, dim: int | None = None) -> Candidates:
    """Hot, vector and lexical matches joined and de-duplicated by id: the first row of
    each id is kept, in the order vector, lexical, hot.

    A memory found by the vector search keeps that row (its similarity was computed by
    PostgreSQL), with the BM25 score of the first lexical row of its id; one found in
    the hot set as well is marked as coming from both. ``dim``: the query's
    dimension, whose vectors are kept (vectors of another dimension cannot be
    compared with it); None: the first source's with vectors.
    """
    parts = [p for p in (cold, lexical, hot) if len(p)]
    if not parts:
        return cold
    if dim is None:
        with_vectors = [p for p in parts if p.vectors.shape[0]]
        dim = with_vectors[0].vectors.shape[1] if with_vectors else 0
    ids = [ident for part in parts for ident in part.ids]
    n, n_cold, n_lexical = len(ids), len(cold), len(lexical)
    # Each id's first row (a dict keeps the last value given, so the rows go in backwards).
    first = dict(zip(reversed(ids), range(n - 1, -1, -1), strict=True))
    if len(first) == n:
        return _concat(parts, dim)
    keep = sorted(first.values())
    merged = _concat(parts, dim, keep)
    # The first lexical row of an id found by the vector search gives it its BM25 score.
    scored_by: dict[int, int] = {}
    for row in range(n_cold, n_cold + n_lexical):
        target = first[ids[row]]
        if target < n_cold:
            scored_by.setdefault(target, row)
    if scored_by:
        at = [bisect_left(keep, target) for target in scored_by]
        merged.lexical_score[at] = lexical.lexical_score[[row - n_cold for row in scored_by.values()]]
    # A hot row whose id came first from elsewhere marks that row as from both.
    from_both = [
        bisect_left(keep, t) for row in range(n_cold + n_lexical, n) if (t := first[ids[row]]) != row
    ]
    if from_both:
        merged.sources[from_both] = int(Source.HOT_AND_COLD)
    return merged
