"""The hot set's ranking: ``ranking``'s adjustment (relevance fixed at 1, the default
weights and half-lives: ``ranking`` says why), for one memory in Python and as the
SQL the hot set's rebuild orders by, both generated from ``ranking``'s terms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ibex_context import ranking
from ibex_context.models import MemoryRecord
from ibex_context.profiles.model import (
    DEFAULT_HALF_LIVES_DAYS,
    UNKNOWN_CATEGORY_HALF_LIFE_DAYS,
    ScoringWeights,
)
from ibex_context.ranking import FLOATS, LUA, SQL, lua, sql

_WEIGHTS = ScoringWeights()
_NAN = math.nan


def hot_set_score(
    record: MemoryRecord,
    now: float,
    half_lives_days: Mapping[str, float] = DEFAULT_HALF_LIVES_DAYS,
    weights: ScoringWeights = _WEIGHTS,
) -> float:
    def known(value: float | None) -> float:
        return _NAN if value is None else value

    half_life = half_lives_days.get(record.category, UNKNOWN_CATEGORY_HALF_LIFE_DAYS)
    score: float = ranking.adjustment(
        weights,
        ranking.recency(FLOATS, known(record.occurred_at), now, half_life),
        ranking.rated(FLOATS, known(record.usefulness), ranking.DEFAULT_USEFULNESS),
        ranking.rated(FLOATS, known(record.confidence), ranking.DEFAULT_CONFIDENCE),
        ranking.frequency(FLOATS, float(record.retrieval_count)),
    )
    return score


def frequency_weight(weights: ScoringWeights = _WEIGHTS) -> float:
    """The share of the hot-set score the frequency term holds: ``stores.redis`` moves a
    score by ``share · Δfrequency`` when injections are recorded."""
    return ranking.frequency_share(weights)


def frequency_lua(count: str) -> str:
    """``ranking.frequency`` of the Lua number ``count``, as Lua."""
    code: ranking.Code = ranking.frequency(LUA, lua(count))
    return code.text


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
    half_life = sql(f"CASE {m}.category {cases} ELSE {float(UNKNOWN_CATEGORY_HALF_LIFE_DAYS)!r} END")
    occurred = sql(f"extract(epoch FROM coalesce({m}.occurred_at, {m}.created_at))")
    score = ranking.adjustment(
        weights,
        ranking.recency(SQL, occurred, sql(now_param), half_life),
        ranking.rated(SQL, sql(f"{m}.usefulness"), ranking.DEFAULT_USEFULNESS),
        ranking.rated(SQL, sql(f"{m}.confidence"), ranking.DEFAULT_CONFIDENCE),
        ranking.frequency(SQL, sql(retrieval_count)),
    )
    # With every weight but relevance's at 0 the score is a constant.
    return score.text if isinstance(score, ranking.Code) else repr(float(score))
