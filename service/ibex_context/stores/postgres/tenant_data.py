"""PostgreSQL reads of the memory API and the tenant purge (issue 16).

Kept apart from ``stores.postgres`` (the request path's statements): these are
operator calls, paged and bounded, never on an assembly. Every statement is scoped
by ``org_id`` and, except the org-wide export and purge, ``agent_id``; the org-wide
ones enumerate the org's agents through the primary keys (org first).

Paging is keyset paging on a unique, immutable sort key, so a page never repeats
or skips a row that existed when the listing started, whatever is written
meanwhile: ``(created_at, id)`` or ``(coalesce(occurred_at, created_at), id)``
(indexes of migration 0007) for listings, the primary key ``(agent_id, id)`` for
exports. ``occurred_at`` can change on an update; a row whose key moves past the
cursor is seen again or not at all, which is what a consistent keyset gives.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from ibex_context.stores.base import DirectiveRow, ListOrder, MemoryFilter, StoredRow
from ibex_context.stores.postgres.codecs import as_uuid
from ibex_context.stores.postgres.graphs import graph_index_names
from ibex_context.stores.postgres.pool import store_errors
from ibex_context.stores.postgres.writes import WRITER_LOCK_CLASS

# Rows deleted per transaction by a purge: each batch holds the agent's writer lock
# for one short transaction, so upserts of that agent interleave instead of waiting
# for a whole tenant's deletion.
PURGE_BATCH = 2000


# The sort key of each listing order (migration 0007 indexes both).
_ORDER_KEYS = {
    ListOrder.CREATED_DESC: "m.created_at",
    ListOrder.CREATED_ASC: "m.created_at",
    ListOrder.OCCURRED_DESC: "coalesce(m.occurred_at, m.created_at)",
    ListOrder.OCCURRED_ASC: "coalesce(m.occurred_at, m.created_at)",
}


# Above every version the agent's directive had (the row's, or the one the purge deleted,
# $3) and at most the first one set after it (migration 0017: versions are the clock's
# microseconds, or the row's previous + 1): a cache entry of this version is replaced only
# by a write of this version or newer.
DIRECTIVE_TOMBSTONE_VERSION_SQL = (
    "SELECT greatest(coalesce(max(version), 0) + 1, $3::int8, directive_clock_version())"
    " FROM directives WHERE org_id = $1 AND agent_id = $2"
)


@dataclass(frozen=True, slots=True)
class PurgeOutcome:
    memories_deleted: int = 0
    directives_deleted: int = 0
    agents: tuple[str, ...] = ()
    # Nothing of the tenant left in any table when the call ended.
    complete: bool = False
    # Above every directive version handed out before the purge and at most the first
    # after it (migrations 0014, 0017): the cache's tombstone for the agent's directive.
    directive_tombstone_version: int = 0


def _micros(column: str) -> str:
    # Exact (extract returns numeric); an int is ~7x cheaper to put on the wire than
    # a datetime (Timestamp.FromDatetime), which matters at export rates.
    return f"(extract(epoch FROM {column}) * 1000000)::int8"


def _columns(with_embedding: bool) -> str:
    embedding = "m.embedding" if with_embedding else "NULL::vector AS embedding"
    return (
        "m.agent_id, m.id, m.content, m.category, m.confidence, m.usefulness, m.metadata,"
        f" {_micros('coalesce(m.occurred_at, m.created_at)')} AS occurred_at,"
        f" {_micros('m.created_at')} AS created_at, {_micros('m.updated_at')} AS updated_at,"
        " coalesce(u.retrieval_count, 0) AS retrieval_count,"
        f" {_micros('u.last_injected_at')} AS last_injected_at,"
        f" {embedding}"
    )


# Scoped on both sides; keyed like memories, so one primary-key probe per row.
_USAGE = (
    "LEFT JOIN memory_usage AS u ON u.org_id = m.org_id AND u.agent_id = m.agent_id AND u.memory_id = m.id"
)


def _row(record: asyncpg.Record, sort_key: datetime | None = None) -> StoredRow:
    return StoredRow(
        agent_id=str(record["agent_id"]),
        id=str(record["id"]),
        content=record["content"],
        category=record["category"],
        confidence=float(record["confidence"]),
        usefulness=float(record["usefulness"]),
        metadata=dict(record["metadata"]),
        occurred_at=record["occurred_at"],
        created_at=record["created_at"],
        updated_at=record["updated_at"],
        retrieval_count=int(record["retrieval_count"]),
        last_injected_at=record["last_injected_at"],
        embedding=record["embedding"],
        sort_key=sort_key,
    )


class TenantData:
    """The read-side statements and the purge over the service's asyncpg pool (whose
    connections have the vector and jsonb codecs of ``stores.postgres``)."""

    def __init__(self, pool: asyncpg.Pool, *, purge_batch: int = PURGE_BATCH) -> None:
        self._pool = pool
        self._purge_batch = purge_batch

    # ---------------------------------------------------------------- reads

    @store_errors
    async def get_memories(
        self, org_id: str, agent_id: str, ids: Sequence[str], *, with_embedding: bool = False
    ) -> list[StoredRow]:
        """The agent's memories among ``ids``, in the order of ``ids``; unknown ids left out."""
        if not ids:
            return []
        targets = [as_uuid(i, f"ids[{n}]") for n, i in enumerate(ids)]
        rows = await self._pool.fetch(
            f"SELECT {_columns(with_embedding)} FROM memories AS m {_USAGE}"
            " WHERE m.org_id = $1 AND m.agent_id = $2 AND m.id = ANY($3::uuid[])",
            as_uuid(org_id, "org_id"),
            as_uuid(agent_id, "agent_id"),
            targets,
        )
        by_id = {str(r["id"]): _row(r) for r in rows}
        return [by_id[i] for i in dict.fromkeys(str(t) for t in targets) if i in by_id]

    @store_errors
    async def list_memories(
        self,
        org_id: str,
        agent_id: str,
        *,
        order: ListOrder,
        filters: MemoryFilter,
        after: tuple[datetime, str] | None,
        limit: int,
        with_embedding: bool = False,
    ) -> list[StoredRow]:
        """One page: at most ``limit`` rows past the keyset position ``after``."""
        args: list[Any] = [as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")]

        def param(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        where = ["m.org_id = $1", "m.agent_id = $2"]
        if filters.categories:
            where.append(f"m.category = ANY({param(list(filters.categories))}::text[])")
        occurred = "coalesce(m.occurred_at, m.created_at)"
        for column, low, high in (
            ("m.created_at", filters.created_after, filters.created_before),
            (occurred, filters.occurred_after, filters.occurred_before),
        ):
            if low is not None:
                where.append(f"{column} >= {param(low)}")
            if high is not None:
                where.append(f"{column} < {param(high)}")
        key = _ORDER_KEYS[order]
        direction = "DESC" if order.descending else "ASC"
        if after is not None:
            compare = "<" if order.descending else ">"
            where.append(f"({key}, m.id) {compare} ({param(after[0])}, {param(uuid.UUID(after[1]))})")
        rows = await self._pool.fetch(
            f"SELECT {_columns(with_embedding)}, {key} AS sort_key"
            f" FROM memories AS m {_USAGE} WHERE {' AND '.join(where)}"
            f" ORDER BY {key} {direction}, m.id {direction} LIMIT {param(limit)}",
            *args,
        )
        return [_row(r, r["sort_key"]) for r in rows]

    @store_errors
    async def export_memories(
        self,
        org_id: str,
        agent_id: str | None,
        *,
        after: tuple[str, str] | None,
        limit: int,
        with_embedding: bool,
    ) -> list[StoredRow]:
        """One export page in primary-key order (agent_id, id) past ``after``."""
        args: list[Any] = [as_uuid(org_id, "org_id")]
        where = ["m.org_id = $1"]
        if agent_id is not None:
            args.append(as_uuid(agent_id, "agent_id"))
            where.append(f"m.agent_id = ${len(args)}")
        if after is not None:
            args += [uuid.UUID(after[0]), uuid.UUID(after[1])]
            where.append(f"(m.agent_id, m.id) > (${len(args) - 1}, ${len(args)})")
        args.append(limit)
        rows = await self._pool.fetch(
            f"SELECT {_columns(with_embedding)} FROM memories AS m {_USAGE}"
            f" WHERE {' AND '.join(where)} ORDER BY m.agent_id, m.id LIMIT ${len(args)}",
            *args,
        )
        return [_row(r) for r in rows]

    @store_errors
    async def get_directive(self, org_id: str, agent_id: str) -> DirectiveRow:
        row = await self._pool.fetchrow(
            "SELECT content, version, updated_at FROM directives WHERE org_id = $1 AND agent_id = $2",
            as_uuid(org_id, "org_id"),
            as_uuid(agent_id, "agent_id"),
        )
        if row is None:
            return DirectiveRow(content=None, version=0, updated_at=None)
        return DirectiveRow(content=row["content"], version=int(row["version"]), updated_at=row["updated_at"])

    # ---------------------------------------------------------------- purge

    @store_errors
    async def agents_of_org(self, org_id: str) -> list[str]:
        """Every agent with a row in any of the tenant tables (memories, directives,
        counters, feedback): a purge must reach rows whose memory is already gone."""
        rows = await self._pool.fetch(
            "SELECT agent_id FROM memories WHERE org_id = $1"
            " UNION SELECT agent_id FROM directives WHERE org_id = $1"
            " UNION SELECT agent_id FROM memory_usage WHERE org_id = $1"
            " UNION SELECT agent_id FROM memory_feedback WHERE org_id = $1",
            as_uuid(org_id, "org_id"),
        )
        return sorted(str(r["agent_id"]) for r in rows)

    @store_errors
    async def purge_agent(
        self, org_id: str, agent_id: str, *, out_of_time: Callable[[], bool]
    ) -> PurgeOutcome:
        """Deletes the agent's rows in batches until none is left or ``out_of_time()``
        says so after a batch; safe to call again (it resumes).

        Each batch runs under the agent's writer lock (the one upserts take), so no
        upsert is half-way through while it deletes. The last batch, which finds
        fewer rows than a batch, deletes the directive too and commits with nothing
        of the agent left: every write committed before it is gone. ``complete``
        says that last batch ran; the caller still counts what is left afterwards
        (``count_agent_rows``), because a write can commit right after it, and
        injection counters are recorded without the lock.
        """
        org, agent = as_uuid(org_id, "org_id"), as_uuid(agent_id, "agent_id")
        memories = directives = deleted_version = 0
        graph: str | None = None
        while True:
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    "SELECT pg_advisory_xact_lock($1, hashtext($2::uuid::text || $3::uuid::text))",
                    WRITER_LOCK_CLASS,
                    org,
                    agent,
                )
                ids = [
                    r["id"]
                    for r in await conn.fetch(
                        "SELECT id FROM memories WHERE org_id = $1 AND agent_id = $2 LIMIT $3",
                        org,
                        agent,
                        self._purge_batch,
                    )
                ]
                if ids:
                    status = await conn.execute(
                        "DELETE FROM memories WHERE org_id = $1 AND agent_id = $2 AND id = ANY($3::uuid[])",
                        org,
                        agent,
                        ids,
                    )
                    memories += int(status.split()[-1])
                last = len(ids) < self._purge_batch
                if last:
                    # Counters and feedback of every memory (also of memories deleted
                    # earlier whose rows a racing recorder left behind).
                    await conn.execute(
                        "DELETE FROM memory_usage WHERE org_id = $1 AND agent_id = $2", org, agent
                    )
                    await conn.execute(
                        "DELETE FROM memory_feedback WHERE org_id = $1 AND agent_id = $2", org, agent
                    )
                    deleted = await conn.fetchval(
                        "DELETE FROM directives WHERE org_id = $1 AND agent_id = $2 RETURNING version",
                        org,
                        agent,
                    )
                    if deleted is not None:
                        directives += 1
                        deleted_version = max(deleted_version, int(deleted) + 1)
                    # The words its memories held (document frequencies left at 0) and its
                    # own graph's record (migrations 0012, 0013).
                    await conn.execute(
                        "DELETE FROM memory_lexicon WHERE org_id = $1 AND agent_id = $2", org, agent
                    )
                    graph = await conn.fetchval(
                        "DELETE FROM agent_graphs WHERE org_id = $1 AND agent_id = $2 RETURNING index_name",
                        org,
                        agent,
                    )
                else:
                    for table in ("memory_usage", "memory_feedback"):
                        await conn.execute(
                            f"DELETE FROM {table} WHERE org_id = $1 AND agent_id = $2"
                            " AND memory_id = ANY($3::uuid[])",
                            org,
                            agent,
                            ids,
                        )
            if last:
                if graph is not None:  # an index is dropped outside a transaction
                    # Its recorded graph and, were a rebuild under way, the other one.
                    for name in {graph, *graph_index_names(org, agent)}:
                        await self._pool.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
                break
            if out_of_time():
                break
        # Read after the deletes: a reader that read a version before them read one below it.
        tombstone = int(
            await self._pool.fetchval(DIRECTIVE_TOMBSTONE_VERSION_SQL, org, agent, deleted_version)
        )
        return PurgeOutcome(
            memories, directives, (agent_id,), complete=last, directive_tombstone_version=tombstone
        )

    @store_errors
    async def count_agent_rows(self, org_id: str, agent_id: str) -> int:
        """Rows of the agent in every tenant table (memories, directive, counters, feedback)."""
        count: int = await self._pool.fetchval(
            "SELECT (SELECT count(*) FROM memories WHERE org_id = $1 AND agent_id = $2)"
            " + (SELECT count(*) FROM directives WHERE org_id = $1 AND agent_id = $2)"
            " + (SELECT count(*) FROM memory_usage WHERE org_id = $1 AND agent_id = $2)"
            " + (SELECT count(*) FROM memory_feedback WHERE org_id = $1 AND agent_id = $2)",
            as_uuid(org_id, "org_id"),
            as_uuid(agent_id, "agent_id"),
        )
        return count
