"""Composite scores for retrieved memories, vectorised over all candidates.

score = (w_rel·relevance + w_rec·recency + w_use·usefulness + w_conf·confidence
         + w_freq·frequency) / sum(w)

* relevance: the store's ``similarity`` (cold search) clipped to [0, 1]; else the
  cosine between the query embedding and the memory's ``embedding`` (hot
  memories); else unknown. Unknown relevance (no query embedding: the hot-only
  degradation path) is scored neutral, ``NEUTRAL_RELEVANCE``, and the floor is
  not applied to it: the floor exists to drop memories known to be off-topic.
* recency: exp(-ln2 · age_days / half_life(category)) from ``created_at``: how
  old the information is. ``last_injected_at`` is not used; it would keep
  memories fresh because they were injected (frequency already rewards use).
  Unknown or unreadable age: 0.5.
* usefulness: default 0.5; confidence: default 0.8; frequency:
  min(retrieval_count / 50, 1).

Candidates with a known relevance below ``scoring.relevance_floor`` are dropped.
The result is sorted by score descending, ties by id, so it is deterministic.
``tokens`` is left 0: packing cost depends on the format and is computed later.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ibex_context.errors import ConfigurationError
from ibex_context.models import FloatVector, MemoryRecord, ScoredMemory
from ibex_context.profiles.model import UNKNOWN_CATEGORY_HALF_LIFE_DAYS, Scoring

NEUTRAL_RELEVANCE = 0.5
UNKNOWN_RECENCY = 0.5
DEFAULT_USEFULNESS = 0.5
DEFAULT_CONFIDENCE = 0.8
FREQUENCY_CAP = 50
SECONDS_PER_DAY = 86_400.0

_Array = npt.NDArray[np.float64]


def validate_scoring(scoring: Scoring) -> None:
    """Raises ConfigurationError naming the first invalid field."""
    weights = scoring.weights
    values = {
        "relevance": weights.relevance,
        "recency": weights.recency,
        "usefulness": weights.usefulness,
        "confidence": weights.confidence,
        "frequency": weights.frequency,
    }
    for name, value in values.items():
        if not math.isfinite(value) or value < 0:
            raise ConfigurationError(f"scoring.weights.{name}: must be a finite number >= 0, got {value!r}")
    if sum(values.values()) <= 0:
        raise ConfigurationError("scoring.weights: at least one weight must be > 0")
    for category, days in scoring.half_lives_days.items():
        if not math.isfinite(days) or days <= 0:
            raise ConfigurationError(f"scoring.half_lives_days.{category}: must be > 0 days, got {days!r}")
    floor = scoring.relevance_floor
    if not math.isfinite(floor) or not 0 <= floor < 1:
        raise ConfigurationError(f"scoring.relevance_floor: must be in [0, 1), got {floor!r}")


def _relevance(
    candidates: Sequence[MemoryRecord], query_embedding: FloatVector | None
) -> tuple[_Array, npt.NDArray[np.bool_]]:
    """Relevance per candidate and whether it is known."""
    n = len(candidates)
    relevance = np.full(n, NEUTRAL_RELEVANCE, dtype=np.float64)
    known = np.zeros(n, dtype=np.bool_)
    needs_cosine: list[tuple[int, FloatVector]] = []
    for i, record in enumerate(candidates):
        if record.similarity is not None and math.isfinite(record.similarity):
            relevance[i] = record.similarity
            known[i] = True
        elif query_embedding is not None and record.embedding is not None:
            needs_cosine.append((i, record.embedding))
    if needs_cosine and query_embedding is not None:
        query = np.asarray(query_embedding, dtype=np.float64).ravel()
        # A stored vector of another dimension (embedder changed) cannot be
        # compared: its relevance stays unknown rather than failing the request.
        rows = [(i, e) for i, e in needs_cosine if e.shape == query.shape]
        if rows:
            matrix = np.stack([np.asarray(e, dtype=np.float64) for _, e in rows])
            norms = np.linalg.norm(matrix, axis=1) * np.linalg.norm(query)
            dots = matrix @ query
            cosine = np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
            index = np.asarray([i for i, _ in rows], dtype=np.intp)
            relevance[index] = cosine
            known[index] = True
    np.clip(relevance, 0.0, 1.0, out=relevance)
    return relevance, known


def score_candidates(
    candidates: Sequence[MemoryRecord],
    query_embedding: FloatVector | None,
    scoring: Scoring,
    now: float,
) -> list[ScoredMemory]:
    validate_scoring(scoring)
    if not candidates:
        return []
    n = len(candidates)
    relevance, relevance_known = _relevance(candidates, query_embedding)

    created = np.array(
        [r.created_at if r.created_at is not None else math.nan for r in candidates], dtype=np.float64
    )
    half_lives = np.array(
        [scoring.half_lives_days.get(r.category, UNKNOWN_CATEGORY_HALF_LIFE_DAYS) for r in candidates],
        dtype=np.float64,
    )
    age_known = np.isfinite(created)
    # A created_at in the future (clock skew) counts as brand new.
    age_days = np.maximum(np.where(age_known, now - created, 0.0), 0.0) / SECONDS_PER_DAY
    recency = np.where(age_known, np.exp(-math.log(2.0) * age_days / half_lives), UNKNOWN_RECENCY)

    usefulness = np.array(
        [r.usefulness if r.usefulness is not None else math.nan for r in candidates], dtype=np.float64
    )
    usefulness = np.clip(np.where(np.isfinite(usefulness), usefulness, DEFAULT_USEFULNESS), 0.0, 1.0)
    confidence = np.array(
        [r.confidence if r.confidence is not None else math.nan for r in candidates], dtype=np.float64
    )
    confidence = np.clip(np.where(np.isfinite(confidence), confidence, DEFAULT_CONFIDENCE), 0.0, 1.0)
    retrievals = np.array([r.retrieval_count for r in candidates], dtype=np.float64)
    frequency = np.clip(retrievals / FREQUENCY_CAP, 0.0, 1.0)

    w = scoring.weights
    total_weight = w.relevance + w.recency + w.usefulness + w.confidence + w.frequency
    composite = (
        w.relevance * relevance
        + w.recency * recency
        + w.usefulness * usefulness
        + w.confidence * confidence
        + w.frequency * frequency
    ) / total_weight

    keep = ~relevance_known | (relevance >= scoring.relevance_floor)
    order = sorted((i for i in range(n) if keep[i]), key=lambda i: (-composite[i], candidates[i].id))
    return [
        ScoredMemory(
            memory=candidates[i],
            score=float(composite[i]),
            relevance=float(relevance[i]),
            recency=float(recency[i]),
            usefulness=float(usefulness[i]),
            confidence=float(confidence[i]),
            frequency=float(frequency[i]),
        )
        for i in order
    ]
