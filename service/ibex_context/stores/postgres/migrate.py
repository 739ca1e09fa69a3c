"""Versioned SQL migrations: ``stores/postgres/migrations/NNNN_name.sql``, applied in order.

Each migration runs in its own transaction, holding a transaction-scoped advisory
lock, and is recorded in ``schema_migrations``; a migrator that finds it already
recorded skips it. Several replicas starting at once are therefore safe: one
applies, the others wait on the lock and then see it done.

A line ``-- after commit: <statement>`` runs that statement once the migration has
committed, outside any transaction (``VACUUM`` cannot run inside one): e.g. a migration
that rewrites a table marks its pages all-visible again, or index-only scans would read
the heap until autovacuum next came by. Only the migrator that applied it runs it.

``{embedding_dim}`` in the SQL is replaced by the embedder's dimension. The value
is recorded in ``ibex_meta`` by the first migration and checked on every start:
vectors of another dimension cannot be compared with the stored ones.
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from ibex_context.errors import ConfigurationError, StoreError
from ibex_context.stores.postgres import postgres_tls

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# An arbitrary constant shared by every migrator of this schema ("ibex" in ASCII).
ADVISORY_LOCK_KEY = 0x69626578
_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_AFTER_COMMIT = re.compile(r"^-- after commit: (.+)$", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def after_commit(self) -> list[str]:
        """The statements to run once this migration has committed (in file order)."""
        return _AFTER_COMMIT.findall(self.sql)


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migrations in ``directory``, ordered by version; versions must be unique."""
    migrations: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_NAME.match(path.name)
        if match is None:
            raise ConfigurationError(f"migration file name {path.name!r} is not NNNN_name.sql")
        migrations.append(Migration(int(match.group(1)), path.stem, path.read_text(encoding="utf-8")))
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise ConfigurationError(f"duplicate migration versions in {directory}")
    return migrations


def render(sql: str, embedding_dim: int) -> str:
    # str.replace, not str.format: the SQL contains literal braces ('{}'::jsonb).
    return sql.replace("{embedding_dim}", str(int(embedding_dim)))


async def recorded_embedding_dim(conn: asyncpg.Connection) -> int | None:
    """The dimension the schema was created with, or None before the first migration."""
    exists = await conn.fetchval("SELECT to_regclass('ibex_meta') IS NOT NULL")
    if not exists:
        return None
    value = await conn.fetchval("SELECT value FROM ibex_meta WHERE key = 'embedding_dim'")
    return int(value) if value is not None else None


async def check_embedding_dim(conn: asyncpg.Connection, dim: int) -> None:
    """Raises ConfigurationError when the database stores vectors of another dimension."""
    recorded = await recorded_embedding_dim(conn)
    if recorded is not None and recorded != dim:
        raise ConfigurationError(
            f"embedding_dim: the database stores {recorded}-dimensional embeddings but the "
            f"embedder produces {dim}; use an embedder of the same dimension or a new database"
        )


async def check_schema(conn: asyncpg.Connection, dim: int) -> None:
    """Raises ConfigurationError unless the database has every migration this build
    carries and vectors of ``dim`` dimensions: a service must not serve on a schema
    whose statements it cannot prepare (``stores.postgres.store.prepare_request_path``)."""
    await check_embedding_dim(conn, dim)
    applied: set[int] = set()
    if await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
        applied = {row[0] for row in await conn.fetch("SELECT version FROM schema_migrations")}
    pending = [m.name for m in load_migrations() if m.version not in applied]
    if pending:
        raise ConfigurationError(
            f"postgres_dsn: the database lacks {len(pending)} migration(s) of this build"
            f" ({', '.join(pending)}): run `ibex-context migrate` (the chart's migrations Job) first"
        )


async def apply_migrations(
    conn: asyncpg.Connection, embedding_dim: int, migrations: list[Migration] | None = None
) -> list[str]:
    """Applies the pending migrations on ``conn``; returns the names applied."""
    applied: list[str] = []
    for migration in migrations if migrations is not None else load_migrations():
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", ADVISORY_LOCK_KEY)
            await conn.execute(
                """
                CREATE TABLE IF NOT EXISTS schema_migrations (
                    version    integer     PRIMARY KEY,
                    name       text        NOT NULL,
                    applied_at timestamptz NOT NULL DEFAULT now()
                )
                """
            )
            await check_embedding_dim(conn, embedding_dim)
            done = await conn.fetchval(
                "SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)", migration.version
            )
            if done:
                continue
            await conn.execute(render(migration.sql, embedding_dim))
            await conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                migration.version,
                migration.name,
            )
            applied.append(migration.name)
        if applied and applied[-1] == migration.name:
            for statement in migration.after_commit:
                await conn.execute(statement)
    await check_embedding_dim(conn, embedding_dim)
    return applied


async def migrate(dsn: str, embedding_dim: int, *, ca_file: Path | None = None) -> list[str]:
    """Brings the schema at ``dsn`` up to date; returns the names of the migrations applied.
    ``ca_file``: verify-full against this CA (``Settings.postgres_ca_file``).

    Raises StoreError when PostgreSQL fails, chained to the driver's error (whose
    message ``ibex-context migrate`` shows: migrations quote no memory content)."""
    tls = postgres_tls(ca_file)
    try:
        conn = await asyncpg.connect(dsn, **({"ssl": tls} if tls is not None else {}))
        try:
            return await apply_migrations(conn, embedding_dim)
        finally:
            await conn.close()
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise StoreError(f"postgres: {type(exc).__name__}") from exc


async def check_database(dsn: str, dim: int, *, tls: ssl.SSLContext | None = None) -> None:
    """``check_schema`` over a connection of its own, opened and closed here."""
    conn = await asyncpg.connect(dsn, **({"ssl": tls} if tls is not None else {}))
    try:
        await check_schema(conn, dim)
    finally:
        await conn.close()
