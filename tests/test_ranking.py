"""The ranking formula, written once (``ranking``), gives the same scores wherever it
runs: numpy on the request path, Python floats for the hot set, the SQL the hot set's
rebuild orders by (in PostgreSQL) and the Lua that moves a hot score on an injection
(in Redis), over a grid of inputs that includes every unknown."""

from __future__ import annotations

import datetime as dt
import itertools
import math

import asyncpg
import numpy as np
import pytest
import redis.asyncio as aioredis
from ibex_context import ranking
from ibex_context.candidates import Candidates
from ibex_context.models import MemoryRecord
from ibex_context.pipeline.scoring import NEUTRAL_RELEVANCE, rank
from ibex_context.profiles.model import Scoring, ScoringWeights
from ibex_context.ranking import FLOATS, NUMPY
from ibex_context.stores.hot_score import frequency_lua, hot_set_order_sql, hot_set_score

NOW = 1_800_000_000.0
DAY = 86_400.0
CATEGORIES = ("episodic", "factual", "procedural", "custom")
# Ages: now, a day, a half-life or so, very old, in the future; None: unknown;
# an infinite date is unknown too.
OCCURRED = (NOW, NOW - DAY, NOW - 30 * DAY, NOW - 4000 * DAY, NOW + 5 * DAY, None, math.inf)
RATINGS = (None, 0.0, 0.35, 1.0)
COUNTS = (0, 7, 50, 400)
WEIGHTS = (
    ScoringWeights(),
    ScoringWeights(relevance=0.5, recency=0.2, usefulness=0.1, confidence=0.1, frequency=0.1),
)


def _grid() -> list[MemoryRecord]:
    rows = itertools.product(CATEGORIES, OCCURRED, RATINGS, RATINGS[::-1], COUNTS)
    return [
        MemoryRecord(
            id=f"m{i:04d}",
            content="c",
            category=category,
            occurred_at=occurred,
            usefulness=usefulness,
            confidence=confidence,
            retrieval_count=count,
        )
        for i, (category, occurred, usefulness, confidence, count) in enumerate(rows)
    ]


def test_the_terms_follow_the_stated_rules() -> None:
    assert ranking.recency(FLOATS, NOW, NOW, 14.0) == 1.0
    assert ranking.recency(FLOATS, NOW - 14 * DAY, NOW, 14.0) == pytest.approx(0.5)
    assert ranking.recency(FLOATS, NOW + DAY, NOW, 14.0) == 1.0  # the future counts as now
    assert ranking.recency(FLOATS, math.nan, NOW, 14.0) == ranking.UNKNOWN_RECENCY
    assert ranking.rated(FLOATS, math.nan, ranking.DEFAULT_CONFIDENCE) == ranking.DEFAULT_CONFIDENCE
    assert ranking.rated(FLOATS, 1.7, 0.5) == 1.0
    assert ranking.frequency(FLOATS, 25.0) == 0.5
    assert ranking.frequency(FLOATS, 500.0) == 1.0
    weights = ScoringWeights()
    # A stale, unrated memory keeps w_rel / sum(w) of its relevance at least.
    assert ranking.adjustment(weights, 0.0, 0.0, 0.0, 0.0) == pytest.approx(weights.relevance / 1.0)
    assert ranking.adjustment(weights, 1.0, 1.0, 1.0, 1.0) == pytest.approx(1.0)


@pytest.mark.parametrize("weights", WEIGHTS)
def test_the_request_path_ranks_as_the_hot_set_scores(weights: ScoringWeights) -> None:
    records = _grid()
    # No query embedding: every relevance is neutral, so the score is the adjustment scaled.
    ranked = rank(Candidates.from_records(records), None, Scoring(weights=weights), NOW)
    scores = ranked.components[0]
    expected = np.array([NEUTRAL_RELEVANCE * hot_set_score(r, NOW, weights=weights) for r in records])
    np.testing.assert_allclose(scores, expected, rtol=1e-12, atol=0)


def test_numpy_and_floats_evaluate_each_term_alike() -> None:
    occurred = np.array([np.nan if o is None else o for o in OCCURRED])
    for half_life in (14.0, 180.0):
        by_numpy = ranking.recency(NUMPY, occurred, NOW, half_life)
        by_floats = [ranking.recency(FLOATS, float(o), NOW, half_life) for o in occurred]
        np.testing.assert_allclose(by_numpy, by_floats, rtol=1e-14)


def _timestamp(epoch: float | None) -> dt.datetime | None:
    if epoch is None or math.isinf(epoch):
        return None  # an infinite date is written as 'infinity' in the query
    return dt.datetime.fromtimestamp(epoch, dt.UTC)


@pytest.mark.parametrize("weights", WEIGHTS)
async def test_the_sql_scores_as_python_does(postgres_dsn: str, weights: ScoringWeights) -> None:
    records = _grid()
    created = NOW - 2 * DAY  # what a memory written without a date ages from
    expression = hot_set_order_sql("$1::float8", weights=weights, retrieval_count="m.retrieval_count")
    connection = await asyncpg.connect(postgres_dsn)
    try:
        rows = await connection.fetch(
            f"""
            SELECT m.id, {expression} AS score
            FROM unnest($2::text[], $3::text[], $4::timestamptz[], $5::bool[],
                        $6::float8[], $7::float8[], $8::int[])
                 AS r(id, category, occurred_at, infinite, usefulness, confidence, retrieval_count),
            LATERAL (
                SELECT r.id, r.category,
                       CASE WHEN r.infinite THEN 'infinity'::timestamptz ELSE r.occurred_at END
                           AS occurred_at,
                       to_timestamp($9::float8) AS created_at,
                       r.usefulness, r.confidence, r.retrieval_count
            ) AS m
            """,
            NOW,
            [r.id for r in records],
            [r.category for r in records],
            [_timestamp(r.occurred_at) for r in records],
            [r.occurred_at is not None and math.isinf(r.occurred_at) for r in records],
            [r.usefulness for r in records],
            [r.confidence for r in records],
            [r.retrieval_count for r in records],
            created,
        )
    finally:
        await connection.close()
    by_sql = {row["id"]: row["score"] for row in rows}
    for record in records:
        # The SQL ages an undated memory from its write time, as the stores hand it over.
        as_stored = record if record.occurred_at is not None else _with_occurred(record, created)
        assert by_sql[record.id] == pytest.approx(
            hot_set_score(as_stored, NOW, weights=weights), rel=1e-12
        ), record


def _with_occurred(record: MemoryRecord, occurred: float) -> MemoryRecord:
    return MemoryRecord(
        id=record.id,
        content=record.content,
        category=record.category,
        occurred_at=occurred,
        usefulness=record.usefulness,
        confidence=record.confidence,
        retrieval_count=record.retrieval_count,
    )


async def test_the_lua_frequency_is_python_s(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    script = f"local count = tonumber(ARGV[1]) return string.format('%.17g', {frequency_lua('count')})"
    try:
        for count in (*COUNTS, 1, 49, 51, 2**32 - 1):
            by_lua = float(await client.eval(script, 0, count))
            assert by_lua == ranking.frequency(FLOATS, float(count)), count
    finally:
        await client.aclose()
