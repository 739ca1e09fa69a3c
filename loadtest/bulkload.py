"""The PostgreSQL side of a bulk load into emptied tables: rows in without per-row
work, then everything derived from them built set-wise.

The service's write path keeps a memory's postings (``memory_terms``) and its
agent's ``memory_stats`` and ``memory_lexicon`` and its org's ``org_usage`` with
statement-level triggers (migrations 0005, 0012, 0016). Through
COPY they cost ~8 CPU-seconds per 20k memories here, most of it inserting ~47
postings per memory one by one into the postings' primary-key index. A seed into
emptied tables instead COPYs with the triggers off (``session_replication_role =
replica``, this session only) and derives both afterwards, as the migration that
introduced them did for existing rows: one ``INSERT ... SELECT`` of every posting
with the postings' indexes dropped, the indexes built again by sorting (in the
same transaction: a failed seed leaves them in place), one ``GROUP BY`` for the
stats. ``tests/loadtest/test_bulkload.py`` checks that the result equals what the
service's own writes give for the same memories.

Index and constraint definitions are read from the catalog before they are
dropped, never written here: the migrations stay their one source.
"""

from __future__ import annotations

from dataclasses import dataclass

import asyncpg

# The postings of every stored memory: the trigger's INSERT of migration 0005 over
# the whole table instead of one statement's new rows.
POSTINGS_SQL = """
    INSERT INTO memory_terms (org_id, agent_id, lexeme, memory_id, tf, dl)
    SELECT m.org_id, m.agent_id, t.lexeme, m.id,
           least(greatest(cardinality(t.positions), 1), 32767), least(length(m.lexemes), 32767)
    FROM memories AS m CROSS JOIN LATERAL unnest(m.lexemes) AS t
"""
# Each agent's document frequency per lexeme (migration 0012), from the postings.
LEXICON_SQL = """
    INSERT INTO memory_lexicon (org_id, agent_id, lexeme, df)
    SELECT org_id, agent_id, lexeme, count(*) FROM memory_terms GROUP BY org_id, agent_id, lexeme
"""
STATS_SQL = """
    INSERT INTO memory_stats (org_id, agent_id, memories, lexemes)
    SELECT org_id, agent_id, count(*), coalesce(sum(length(lexemes)), 0)
    FROM memories GROUP BY org_id, agent_id
"""
# Each org's usage, which the quotas read (migration 0016).
ORG_USAGE_SQL = """
    INSERT INTO org_usage (org_id, memories, content_bytes)
    SELECT org_id, count(*), coalesce(sum(octet_length(content)), 0) FROM memories GROUP BY org_id
"""
# Each index of a table: a constraint's (dropped and added back as the constraint)
# or a plain one, with the DDL that recreates it.
_INDEXES_SQL = """
    SELECT i.indexrelid::regclass::text AS index_name, c.conname,
           pg_get_constraintdef(c.oid) AS constraint_def, pg_get_indexdef(i.indexrelid) AS index_def
    FROM pg_index AS i LEFT JOIN pg_constraint AS c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid
    WHERE i.indrelid = $1::text::regclass
    ORDER BY i.indexrelid
"""


@dataclass(frozen=True, slots=True)
class IndexDefinition:
    table: str
    index_name: str
    constraint: str | None
    definition: str

    def drop_sql(self) -> str:
        if self.constraint is not None:
            return f"ALTER TABLE {self.table} DROP CONSTRAINT {self.constraint}"
        return f"DROP INDEX {self.index_name}"

    def create_sql(self) -> str:
        if self.constraint is not None:
            return f"ALTER TABLE {self.table} ADD CONSTRAINT {self.constraint} {self.definition}"
        return self.definition


async def index_definitions(conn: asyncpg.Connection, table: str) -> list[IndexDefinition]:
    rows = await conn.fetch(_INDEXES_SQL, table)
    return [
        IndexDefinition(
            table=table,
            index_name=r["index_name"],
            constraint=r["conname"],
            definition=r["constraint_def"] if r["conname"] is not None else r["index_def"],
        )
        for r in rows
    ]


async def triggers_off(conn: asyncpg.Connection) -> bool:
    """Turns this session's ordinary triggers off; False when the role may not (then
    the triggers run and keep the postings and stats themselves)."""
    try:
        await conn.execute("SET session_replication_role = replica")
    except asyncpg.InsufficientPrivilegeError:
        return False
    return True


async def triggers_on(conn: asyncpg.Connection) -> None:
    await conn.execute("RESET session_replication_role")


async def build_postings_and_stats(conn: asyncpg.Connection, *, maintenance_work_mem: str) -> int:
    """Fills the emptied ``memory_terms``, ``memory_lexicon``, ``memory_stats`` and ``org_usage`` from
    every stored memory, in one transaction; returns the postings' count."""
    async with conn.transaction():
        indexes = await index_definitions(conn, "memory_terms")
        for index in indexes:
            await conn.execute(index.drop_sql())
        status = await conn.execute(POSTINGS_SQL)
        await conn.execute(STATS_SQL)
        await conn.execute(ORG_USAGE_SQL)
        await conn.execute(LEXICON_SQL)
        # A sorted build, with a parallel worker on the second core.
        await conn.execute(f"SET LOCAL maintenance_work_mem = '{maintenance_work_mem}'")
        await conn.execute("SET LOCAL max_parallel_maintenance_workers = 1")
        for index in indexes:
            await conn.execute(index.create_sql())
    return int(status.split()[-1])
