"""How long migration 0008 (memories into hash partitions) takes on a copy of a data set.

    python -m benchmarks.migration_0008 loadtest/out/data/<a copy of a data set at 0007>

Starts that data set's PostgreSQL, reports the rows and the schema version, applies the
pending migrations with the service's migrator (timed), and checks that every memory,
posting and count is still there. Point it at a copy: the data set is migrated in place.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

import asyncpg
from ibex_context.devtools.embedded import start_postgres
from ibex_context.stores.migrate import apply_migrations

COUNTS = (
    "SELECT (SELECT count(*) FROM memories), (SELECT count(*) FROM memory_terms),"
    " (SELECT coalesce(sum(memories), 0)::bigint FROM memory_stats)"
)


async def run(data_dir: Path, migration: str = "0008", module: str = "migration_0008") -> str:
    """Times the pending migrations on ``data_dir``; the report is titled by ``migration``."""
    postgres = start_postgres(data_dir)
    try:
        conn = await asyncpg.connect(postgres.dsn)
        try:
            version = await conn.fetchval("SELECT max(version) FROM schema_migrations")
            dim = int(await conn.fetchval("SELECT value FROM ibex_meta WHERE key = 'embedding_dim'"))
            before = tuple(await conn.fetchrow(COUNTS))
            heap = await conn.fetchval(
                "SELECT pg_size_pretty(sum(pg_total_relation_size(inhrelid)))"
                " FROM pg_inherits WHERE inhparent = 'memories'::regclass"
            ) or await conn.fetchval("SELECT pg_size_pretty(pg_total_relation_size('memories'))")
            started = time.perf_counter()
            applied = await apply_migrations(conn, dim)
            seconds = time.perf_counter() - started
            after = tuple(await conn.fetchrow(COUNTS))
            settings = {
                name: await conn.fetchval(f"SHOW {name}")
                for name in ("maintenance_work_mem", "max_parallel_maintenance_workers", "shared_buffers")
            }
        finally:
            await conn.close()
    finally:
        postgres.stop()
    return (
        f"# Migration {migration} on {data_dir.name}\n\n"
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Command: `python -m benchmarks.{module}"
        f" {data_dir}`.\n\n"
        f"From schema version {version}: {before[0]:,} memories ({heap} with indexes),"
        f" {before[1]:,} postings."
        f" Applied {', '.join(applied) or 'nothing'} in **{seconds:.0f} s** (one transaction each;"
        f" writes wait throughout, reads until the swap). Settings: {settings}; load average"
        f" {os.getloadavg()[0]:.2f} (2 vCPUs shared with other jobs).\n\n"
        f"Memories / postings / counted memories before {before}, after {after}:"
        f" {'unchanged' if before == after else 'CHANGED'}.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path)
    args = parser.parse_args()
    report = asyncio.run(run(args.data_dir.resolve()))
    shape = args.data_dir.name
    path = Path(__file__).parent / "results" / f"migration_0008-{shape}.md"
    path.write_text(report)
    print(report)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
