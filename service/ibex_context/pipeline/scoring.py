"""Scores for retrieved memories, vectorised over all candidates: the request path's
evaluation of ``ranking`` (the formula, its constants and its rules for unknowns),
with the part only a query gives, relevance:

* relevance = (1 - lexical_weight) · semantic + lexical_weight · lexical, where
  - semantic: the store's ``similarity`` (vector search) or else the cosine of
    the query embedding and the memory's ``embedding`` (hot and lexical-only
    matches), clipped to [0, 1];
  - lexical: BM25 of the query's words (``lexical_score``, PostgreSQL full-text
    search) saturated to [0, 1) as bm25 / (bm25 + LEXICAL_SATURATION); 0 for a
    memory the lexical search did not return when it ran.
  Without a lexical search (failed, skipped) relevance is the semantic half alone.
  An unknown semantic half (no query embedding: the hot-only path) counts as
  neutral, ``NEUTRAL_RELEVANCE``, and the floor is not applied to it: the floor
  exists to drop memories known to be off-topic.

Candidates known to be off-topic are dropped: a semantic half below
``scoring.relevance_floor`` and no word shared with the query.
The result is sorted by score descending, ties by id, so it is deterministic.
``scoring`` is trusted: its bounds and rules were checked once, when the profile
was built (``profiles.schema``), not on every request.
``tokens`` is left 0: packing cost depends on the format and is computed later.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np
import numpy.typing as npt

from ibex_context import ranking
from ibex_context.candidates import Candidates
from ibex_context.models import FloatVector, ScoredMemory
from ibex_context.profiles.model import UNKNOWN_CATEGORY_HALF_LIFE_DAYS, Scoring
from ibex_context.ranking import NUMPY

NEUTRAL_RELEVANCE = 0.5
# The BM25 score at which the lexical half of relevance reaches 0.5. BM25 of a
# query word that one memory in a hundred holds is ~4-5 per occurrence, so a
# memory matching two or three of the query's rarer words scores 0.5-0.6.
LEXICAL_SATURATION = 10.0

_Array = npt.NDArray[np.float64]
_LARGEST_FLOAT = float(np.finfo(np.float64).max)


def _semantic(
    candidates: Candidates, query_embedding: FloatVector | None
) -> tuple[_Array, npt.NDArray[np.bool_]]:
    """Cosine similarity per candidate, clipped to [0, 1], and whether it is known."""
    similarity = candidates.similarity
    known = ~np.isnan(similarity)
    semantic = np.where(known, similarity, 0.0)
    vectors = candidates.vectors
    if query_embedding is not None and vectors.shape[0]:
        query = np.asarray(query_embedding, dtype=np.float64).ravel()
        # A stored vector of another dimension (embedder changed) cannot be
        # compared: its similarity stays unknown rather than failing the request.
        if vectors.shape[1] == query.shape[0]:
            rows = np.flatnonzero(~known & (candidates.vector_rows >= 0))
            if rows.size:
                matrix = vectors[candidates.vector_rows[rows]].astype(np.float64)
                # sqrt of row dot products: np.linalg.norm(axis=1) costs several times more here.
                norms = np.sqrt(np.einsum("ij,ij->i", matrix, matrix)) * math.sqrt(float(query @ query))
                dots = matrix @ query
                cosine = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
                semantic[rows] = cosine
                known[rows] = True
    _clip_unit(semantic)
    return semantic, known


def _lexical(candidates: Candidates) -> _Array:
    """BM25 saturated to [0, 1); 0 where the lexical search did not return the memory."""
    # fmax puts 0.0 where the score is NaN (or negative) and the min keeps an infinite
    # score finite (its share is then 1.0): np.nan_to_num and a clip at 0, value for
    # value, without nan_to_num's Python around its ufuncs.
    bm25 = np.minimum(np.fmax(candidates.lexical_score, 0.0), _LARGEST_FLOAT)
    return bm25 / (bm25 + LEXICAL_SATURATION)


def _clip_unit(values: _Array) -> _Array:
    """Clips to [0, 1] in place (np.clip's wrapper costs more than the work at this size)."""
    np.maximum(values, 0.0, out=values)
    np.minimum(values, 1.0, out=values)
    return values


@dataclass(frozen=True, slots=True)
class Ranking:
    """Every candidate's score components (``components[:, i]`` is ``candidates[i]``'s,
    in ``COMPONENTS`` order), and ``order``: the kept candidates' indices, best first
    (ties by id).

    Nothing per candidate is built here: the assembler materialises only the
    memories it injects (``scored_at``), so ranking 100 candidates to inject 20
    builds 20 objects, not 100 (issue #14: per-candidate objects built and
    rebuilt were a large part of the call's CPU).
    """

    candidates: Candidates
    order: list[int]
    components: _Array

    def __len__(self) -> int:
        return len(self.order)

    def scored_at(self, rows: Sequence[int], tokens: Sequence[int]) -> list[ScoredMemory]:
        """Candidates ``rows`` with their score components and costs (``tokens[k]`` of
        ``rows[k]``): the objects built for the memories injected, and only for them."""
        if not rows:
            return []
        records = self.candidates.records_at(rows)
        # One read of the chosen columns: a list of COMPONENTS values per row.
        values = self.components[:, rows].T.tolist()
        return [
            ScoredMemory(
                record, score, relevance, recency, usefulness, confidence, frequency, cost, semantic, lexical
            )
            for record, (
                score,
                relevance,
                recency,
                usefulness,
                confidence,
                frequency,
                semantic,
                lexical,
            ), cost in zip(records, values, tokens, strict=True)
        ]


# The rows of ``Ranking.components``.
COMPONENTS = ("score", "relevance", "recency", "usefulness", "confidence", "frequency", "semantic", "lexical")
_NO_COMPONENTS: _Array = np.zeros((len(COMPONENTS), 0), dtype=np.float64)


def rank(
    candidates: Candidates,
    query_embedding: FloatVector | None,
    scoring: Scoring,
    now: float,
    *,
    lexical_searched: bool = False,
) -> Ranking:
    """``lexical_searched``: the lexical search answered for this call, so a memory
    without a ``lexical_score`` is known not to match the query's words.

    A numpy call's fixed cost outweighs its work on ~100-element arrays, so the
    columns are computed with as few calls as the formula allows."""
    if not candidates:
        return Ranking(candidates, [], _NO_COMPONENTS)
    n = len(candidates)
    semantic, semantic_known = _semantic(candidates, query_embedding)
    lexical = _lexical(candidates)
    # An unknown semantic half counts as neutral, and the floor (meant for memories
    # known to be off-topic) spares it: without a query embedding, hot memories are
    # kept, and lexical matches rank above them.
    semantic_or_neutral = np.where(semantic_known, semantic, NEUTRAL_RELEVANCE)
    if lexical_searched:
        weight = scoring.lexical_weight
        relevance = (1.0 - weight) * semantic_or_neutral + weight * lexical
    else:
        relevance = semantic_or_neutral
    relevance_known = semantic_known

    # The half-life is the one per-candidate look-up; every other field is a column.
    half_lives = np.fromiter(
        map(scoring.half_lives_days.get, candidates.categories, repeat(UNKNOWN_CATEGORY_HALF_LIFE_DAYS)),
        dtype=np.float64,
        count=n,
    )
    recency = ranking.recency(NUMPY, candidates.occurred_at, now, half_lives)
    # Usefulness and confidence rated in one stacked call.
    usefulness, confidence = ranking.rated(
        NUMPY, np.stack((candidates.usefulness, candidates.confidence)), _RATED_DEFAULTS
    )
    frequency = ranking.frequency(NUMPY, candidates.retrieval_counts)
    composite = relevance * ranking.adjustment(scoring.weights, recency, usefulness, confidence, frequency)

    # Off-topic means both halves say so: a memory that shares a word with the query
    # is kept whatever its semantic half (the blend halves a semantic match, so a
    # floor on the blend dropped memories the semantic search alone had kept).
    keep = ~relevance_known | (semantic >= scoring.relevance_floor) | (lexical > 0.0)
    order = np.flatnonzero(keep).tolist()
    # Best first, ties by id: sorted by id, then (stable, so ties keep that order) by
    # score; two sorts with C-level keys cost less than one with a key tuple each.
    order.sort(key=candidates.ids.__getitem__)
    order.sort(key=composite.tolist().__getitem__, reverse=True)
    components = np.concatenate(
        (composite, relevance, recency, usefulness, confidence, frequency, semantic, lexical)
    ).reshape(len(COMPONENTS), n)
    return Ranking(candidates, order, components)


_RATED_DEFAULTS = np.array([[ranking.DEFAULT_USEFULNESS], [ranking.DEFAULT_CONFIDENCE]])


def score_candidates(
    candidates: Candidates,
    query_embedding: FloatVector | None,
    scoring: Scoring,
    now: float,
    *,
    lexical_searched: bool = False,
) -> list[ScoredMemory]:
    """Every kept candidate as a ``ScoredMemory``, best first (``rank``, materialised)."""
    ranking = rank(candidates, query_embedding, scoring, now, lexical_searched=lexical_searched)
    return ranking.scored_at(ranking.order, [0] * len(ranking.order))
