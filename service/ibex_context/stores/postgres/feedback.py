"""Feedback on injected memories: each moves a memory's usefulness and is logged."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import asyncpg

from ibex_context.errors import InvalidRequest
from ibex_context.stores.base import FeedbackUpdate
from ibex_context.stores.postgres.codecs import as_uuid
from ibex_context.stores.postgres.pool import store_errors

# Usefulness moves a fifth of the way towards the feedback's target each time: one
# signal cannot flip a memory, five consistent ones move it most of the way (1-0.8^5 = 67 %).
FEEDBACK_ALPHA = 0.2
FEEDBACK_TARGETS: Mapping[str, float] = {"positive": 1.0, "negative": 0.0, "neutral": 0.5}

# The newest rows of each memory's feedback log that migration 0016 keeps
# (``ibex_trim_memory_feedback``).
FEEDBACK_LOG_PER_MEMORY = 100

# One statement for the whole batch. The memories are locked in id order (concurrent
# batches cannot deadlock), each moved once to where its feedback leaves it, and every
# item logged with the values before and after it. Repeated feedback on one memory
# compounds in request order: after its j-th item the EMA stands at
# (1-a)^j * (u0 + a * sum_{i<=j} t_i * (1-a)^-i), a running sum per memory (a window);
# (1-a)^-j stays finite for j up to the request's bound (settings: at most 1,000 items).
# $1 org, $2 agent, $3 memory ids, $4 kinds (in request order), $5 session.
_FEEDBACK_SQL = f"""
    WITH items AS (
        SELECT i.memory_id, i.kind, i.n,
               row_number() OVER (PARTITION BY i.memory_id ORDER BY i.n) AS j,
               (CASE i.kind WHEN 'positive' THEN 1.0 WHEN 'negative' THEN 0.0 ELSE 0.5 END)::float8
                   AS target
        FROM unnest($3::uuid[], $4::text[]) WITH ORDINALITY AS i(memory_id, kind, n)
    ), previous AS (
        SELECT m.id, m.usefulness::float8 AS usefulness FROM memories AS m
        WHERE m.org_id = $1 AND m.agent_id = $2 AND m.id = ANY($3::uuid[])
        ORDER BY m.id FOR UPDATE
    ), steps AS (
        SELECT t.n, t.memory_id, t.kind, t.j, p.usefulness AS before_all,
               power(1 - {FEEDBACK_ALPHA}, t.j) * (p.usefulness + {FEEDBACK_ALPHA}
                   * sum(t.target * power(1 - {FEEDBACK_ALPHA}, -t.j)) OVER by_memory) AS updated,
               count(*) OVER (PARTITION BY t.memory_id) AS items
        FROM items AS t JOIN previous AS p ON p.id = t.memory_id
        WINDOW by_memory AS (PARTITION BY t.memory_id ORDER BY t.n)
    ), logged_steps AS (
        SELECT n, memory_id, kind, j, items, updated,
               coalesce(lag(updated) OVER (PARTITION BY memory_id ORDER BY n), before_all) AS previous
        FROM steps
    ), moved AS (
        UPDATE memories AS m SET usefulness = s.updated, updated_at = now()
        FROM logged_steps AS s
        WHERE s.j = s.items AND m.org_id = $1 AND m.agent_id = $2 AND m.id = s.memory_id
    ), logged AS (
        INSERT INTO memory_feedback
            (org_id, agent_id, memory_id, session_id, feedback, previous, updated)
        SELECT $1, $2, memory_id, $5, kind, previous, updated FROM logged_steps ORDER BY n
    )
    SELECT memory_id AS id, previous, updated FROM logged_steps ORDER BY n
"""
_TRIM_SQL = "SELECT ibex_trim_memory_feedback($1, $2, $3::uuid[])"


class FeedbackLog:
    """Applies and logs feedback (``memory_feedback``) through the primary's pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @store_errors
    async def record_feedback(
        self, org_id: str, agent_id: str, session_id: str | None, feedback: Sequence[tuple[str, str]]
    ) -> list[FeedbackUpdate]:
        """Moves each memory's usefulness towards 1 / 0 / 0.5 (EMA, alpha ``FEEDBACK_ALPHA``).

        Applied in order, so repeated feedback on one memory compounds. Unknown
        memory ids are skipped (they may have been deleted meanwhile). One statement
        for the batch, then the log of the memories it touched is trimmed to their
        newest ``FEEDBACK_LOG_PER_MEMORY`` rows.
        """
        if not feedback:
            return []
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        session = as_uuid(session_id, "session_id") if session_id else None
        memories, kinds = [], []
        for n, (memory_id, kind) in enumerate(feedback):
            if kind not in FEEDBACK_TARGETS:
                raise InvalidRequest(f"feedback[{n}].kind", f"must be one of {sorted(FEEDBACK_TARGETS)}")
            memories.append(as_uuid(memory_id, f"feedback[{n}].memory_id"))
            kinds.append(kind)
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(_FEEDBACK_SQL, org, agent, memories, kinds, session)
            if rows:  # the log keeps each memory's newest rows (migration 0016)
                await conn.execute(_TRIM_SQL, org, agent, sorted({r["id"] for r in rows}))
        return [
            FeedbackUpdate(
                memory_id=str(r["id"]),
                previous_usefulness=float(r["previous"]),
                new_usefulness=float(r["updated"]),
            )
            for r in rows
        ]
