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

# One statement per feedback item: lock the memory, move its usefulness, log both values.
_FEEDBACK_SQL = f"""
    WITH previous AS (
        SELECT usefulness FROM memories
        WHERE org_id = $1 AND agent_id = $2 AND id = $3 FOR UPDATE
    ), updated AS (
        UPDATE memories AS m
        SET usefulness = (1 - {FEEDBACK_ALPHA}) * p.usefulness + {FEEDBACK_ALPHA} * (
            CASE $5::text WHEN 'positive' THEN 1.0 WHEN 'negative' THEN 0.0 ELSE 0.5 END),
            updated_at = now()
        FROM previous AS p
        WHERE m.org_id = $1 AND m.agent_id = $2 AND m.id = $3
        RETURNING p.usefulness AS previous, m.usefulness AS updated
    ), logged AS (
        INSERT INTO memory_feedback
            (org_id, agent_id, memory_id, session_id, feedback, previous, updated)
        SELECT $1, $2, $3, $4, $5, previous, updated FROM updated
    )
    SELECT $3::uuid AS id, previous, updated FROM updated
"""


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
        memory ids are skipped (they may have been deleted meanwhile).
        """
        if not feedback:
            return []
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        session = as_uuid(session_id, "session_id") if session_id else None
        args = []
        for n, (memory_id, kind) in enumerate(feedback):
            if kind not in FEEDBACK_TARGETS:
                raise InvalidRequest(f"feedback[{n}].kind", f"must be one of {sorted(FEEDBACK_TARGETS)}")
            args.append((org, agent, as_uuid(memory_id, f"feedback[{n}].memory_id"), session, kind))
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetchmany(_FEEDBACK_SQL, args)
        return [
            FeedbackUpdate(
                memory_id=str(r["id"]),
                previous_usefulness=float(r["previous"]),
                new_usefulness=float(r["updated"]),
            )
            for r in rows
        ]
