"""The write-time score that ranks an agent's memories for the hot set.

It is the request-time composite (``pipeline.scoring``, default weights) with
relevance fixed at 1: the hot set is chosen before any query is known, so it keeps
the memories that would win among equally relevant ones. Constant relevance does
not change the order, only the level, so the score stays comparable with the
composite the scorer computes later.

    score = (w_rel·1 + w_rec·recency + w_use·usefulness + w_conf·confidence
             + w_freq·frequency) / Σw
    recency   = 0.5 ** (age_days / half_life_days(category))     (from occurred_at)
    frequency = min(retrieval_count / 50, 1)

``hot_set_order_sql`` is the same formula in SQL, used to pick the top N in
PostgreSQL when a hot set is rebuilt; a test keeps the two in agreement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ibex_context.models import MemoryRecord
from ibex_context.profiles.model import (
    DEFAULT_HALF_LIVES_DAYS,
    UNKNOWN_CATEGORY_HALF_LIFE_DAYS,
    ScoringWeights,
)

FREQUENCY_CAP = 50
DEFAULT_CONFIDENCE = 0.8
DEFAULT_USEFULNESS = 0.5
SECONDS_PER_DAY = 86_400.0
_WEIGHTS = ScoringWeights()


def hot_set_score(
    record: MemoryRecord,
    now: float,
    half_lives_days: Mapping[str, float] = DEFAULT_HALF_LIVES_DAYS,
    weights: ScoringWeights = _WEIGHTS,
) -> float:
    half_life = half_lives_days.get(record.category, UNKNOWN_CATEGORY_HALF_LIFE_DAYS)
    created = record.occurred_at if record.occurred_at is not None else now
    age_days = max(0.0, now - created) / SECONDS_PER_DAY
    recency = math.pow(0.5, age_days / half_life)
    usefulness = DEFAULT_USEFULNESS if record.usefulness is None else record.usefulness
    confidence = DEFAULT_CONFIDENCE if record.confidence is None else record.confidence
    frequency = min(record.retrieval_count / FREQUENCY_CAP, 1.0)
    total = weights.relevance + weights.recency + weights.usefulness + weights.confidence + weights.frequency
    return (
        weights.relevance * 1.0
        + weights.recency * recency
        + weights.usefulness * usefulness
        + weights.confidence * confidence
        + weights.frequency * frequency
    ) / total


def frequency_weight(weights: ScoringWeights = _WEIGHTS) -> tuple[float, int]:
    """(share of the score, cap) of the frequency term: the only term injections move.

    ``score = ... + share * min(retrieval_count / cap, 1)``, so a change of the count
    moves the score by ``share * Δmin(count / cap, 1)`` (``stores.redis`` applies that
    in Redis when injections are recorded).
    """
    total = weights.relevance + weights.recency + weights.usefulness + weights.confidence + weights.frequency
    return weights.frequency / total, FREQUENCY_CAP


def hot_set_order_sql(
    now_param: str,
    half_lives_days: Mapping[str, float] = DEFAULT_HALF_LIVES_DAYS,
    weights: ScoringWeights = _WEIGHTS,
    *,
    memory: str = "m",
    retrieval_count: str = "coalesce(u.retrieval_count, 0)",
) -> str:
    """``hot_set_score`` as a SQL expression; ``now_param`` is epoch seconds.

    ``memory`` is the alias of ``memories``; ``retrieval_count`` the expression of the
    count (it lives in ``memory_usage``, LEFT JOINed as ``u`` by default).
    """
    m = memory
    cases = " ".join(
        f"WHEN '{category}' THEN {float(days)!r}" for category, days in sorted(half_lives_days.items())
    )
    half_life = f"(CASE {m}.category {cases} ELSE {float(UNKNOWN_CATEGORY_HALF_LIFE_DAYS)!r} END)"
    occurred = f"extract(epoch FROM coalesce({m}.occurred_at, {m}.created_at))::float8"
    age_days = f"greatest(0, {now_param} - {occurred}) / {SECONDS_PER_DAY!r}"
    total = weights.relevance + weights.recency + weights.usefulness + weights.confidence + weights.frequency
    return (
        f"(({weights.relevance!r} + {weights.recency!r} * power(0.5, {age_days} / {half_life})"
        f" + {weights.usefulness!r} * {m}.usefulness + {weights.confidence!r} * {m}.confidence"
        f" + {weights.frequency!r} * least(({retrieval_count})::float8 / {FREQUENCY_CAP}, 1.0)) / {total!r})"
    )
