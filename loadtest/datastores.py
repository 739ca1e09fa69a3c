"""The stores of a run: Redis and PostgreSQL+pgvector started in a data dir, configured,
seeded once per data set, pinned, warmed, and PostgreSQL's activity sampled."""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from loadtest.machine import PYTHON, ROOT, process_cpu_ns


class PgActivitySampler:
    """Samples ``pg_stat_activity`` every ``interval`` s in a thread: which statements
    the PostgreSQL backends are running, as a share of samples (a poor man's profile
    of the database; there is no pg_stat_statements in this build)."""

    def __init__(self, dsn: str, interval: float = 0.02) -> None:
        import threading

        self._dsn, self._interval = dsn, interval
        self._stop = threading.Event()
        self.samples = 0
        self.active: dict[str, int] = {}
        # Its own backend, whose CPU the run leaves out of the stores' figure.
        self.backend_pid: int | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        import asyncio
        import re

        import asyncpg

        async def loop() -> None:
            conn = await asyncpg.connect(self._dsn)
            self.backend_pid = conn.get_server_pid()
            try:
                while not self._stop.is_set():
                    rows = await conn.fetch(
                        "SELECT CASE WHEN backend_type = 'client backend' THEN query"
                        " ELSE backend_type || ': ' || coalesce(query, '') END AS query"
                        " FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid()"
                        " AND backend_type IN ('client backend', 'autovacuum worker', 'parallel worker')"
                    )
                    self.samples += 1
                    for row in rows:
                        text = re.sub(r"\s+", " ", row["query"] or "").strip()
                        key = re.sub(r"'[^']*'", "?", text)[:120]
                        self.active[key] = self.active.get(key, 0) + 1
                    await asyncio.sleep(self._interval)
            finally:
                await conn.close()

        with contextlib.suppress(Exception):
            asyncio.run(loop())

    def backend_cpu_seconds(self) -> float:
        """CPU its backend has used since it connected (read before ``stop``: the
        backend exits with the connection). ~45 queries a second cost the stores
        0.15-0.3 ms per call at 50 RPS (benchmarks/results/stores-cpu-2026-11-26.md):
        the run's stores figure leaves it out."""
        return 0.0 if self.backend_pid is None else process_cpu_ns(self.backend_pid) / 1e9

    def summary(self, top: int = 8) -> list[str]:
        if not self.samples:
            return []
        busy = sum(self.active.values())
        rows = [
            f"PostgreSQL activity: {self.samples} samples of pg_stat_activity; on average "
            f"{busy / self.samples:.2f} backends (client backends and autovacuum workers) "
            "were running a statement.",
            "",
            "| statement (normalised) | mean active backends |",
            "|---|---:|",
        ]
        for key, n in sorted(self.active.items(), key=lambda kv: -kv[1])[:top]:
            rows.append(f"| `{key}` | {n / self.samples:.2f} |")
        return rows


# PostgreSQL settings for the runs: the defaults (128 MB shared_buffers) keep neither a
# 100k-row agent's HNSW index (~200 MB) nor the 100x1k heap in PostgreSQL's own cache.
PG_SETTINGS: dict[str, str] = {"shared_buffers": "1GB", "effective_cache_size": "4GB"}


def configure_postgres(dsn: str, settings: dict[str, str]) -> bool:
    """ALTER SYSTEM for every setting that differs; True when a restart is needed."""
    import asyncio

    import asyncpg

    async def apply() -> bool:
        conn = await asyncpg.connect(dsn)
        try:
            changed = False
            for name, value in settings.items():
                current = await conn.fetchval(
                    "SELECT setting || coalesce(unit, '') FROM pg_settings WHERE name = $1", name
                )
                wanted = await conn.fetchval("SELECT $1::text", value)
                shown = await conn.fetchval(f"SHOW {name}")
                if shown.replace(" ", "").lower() != wanted.replace(" ", "").lower():
                    await conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
                    changed = changed or current is not None
            return changed
        finally:
            await conn.close()

    return asyncio.run(apply())


@contextlib.contextmanager
def stores(
    data_dir: Path, shared_buffers: str = PG_SETTINGS["shared_buffers"]
) -> Iterator[tuple[str, str, Any, Any]]:
    """Redis and PostgreSQL on ``data_dir``, PostgreSQL with the runs' settings (and
    ``shared_buffers``: the 1M-memory shapes' working set outgrows the default 1 GB)."""
    from ibex_context.devtools.embedded import start_postgres, start_redis

    redis = start_redis(data_dir / "redis")
    try:
        postgres = start_postgres(data_dir)
        try:
            if configure_postgres(postgres.dsn, {**PG_SETTINGS, "shared_buffers": shared_buffers}):
                postgres.stop()  # shared_buffers needs a restart; the data dir is kept
                postgres = start_postgres(data_dir)
            yield postgres.dsn, redis.url, redis, postgres
        finally:
            postgres.stop()
    finally:
        redis.stop()


def pin_stores(pids: Sequence[int], cpus: str | None) -> None:
    """Pins Redis and the PostgreSQL postmaster (whose backends, forked from now on,
    inherit it). Done after seeding, so the COPY and the HNSW build use every core."""
    if not cpus:
        return
    for pid in pids:
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], capture_output=True, check=False)


def warm_postgres(dsn: str, agents_file: Path, log: Any) -> None:
    """Reads every agent's rows once through the index the search uses.

    The stores restart with each run, so PostgreSQL's shared buffers start empty and
    the first searches of each agent read their pages from the OS cache (~4 ms more
    per search here); a database in service has them cached. This measures the
    steady state; the figure is in the results' setup.
    """
    import asyncio

    import asyncpg

    agents = json.loads(agents_file.read_text())["agents"]

    async def warm() -> float:
        started = time.monotonic()
        conn = await asyncpg.connect(dsn)
        try:
            for agent in agents:
                await conn.fetchval(
                    "SELECT sum(vector_dims(embedding) + length(content)) FROM memories"
                    " WHERE org_id = $1::uuid AND agent_id = $2::uuid",
                    agent["org_id"],
                    agent["agent_id"],
                )
            await conn.fetchval("SELECT count(*) FROM memory_usage")
        finally:
            await conn.close()
        return time.monotonic() - started

    log(f"warmed PostgreSQL's buffers with each agent's rows in {asyncio.run(warm()):.1f} s")


def _migrate(dsn: str, dim: int) -> list[str]:
    import asyncio

    from ibex_context.stores.postgres.migrate import migrate

    return asyncio.run(migrate(dsn, dim))


# What a data set is seeded with: a data dir holds the data set of one set of them.
SEED_PARAMETERS = (
    "agents",
    "memories",
    "large_agents",
    "large_memories",
    "vectors",
    "seed_embedder",
    "seed",
    "dim",
    "embedding_storage",
)


def seed_parameters(args: argparse.Namespace) -> dict[str, object]:
    return {name: getattr(args, name) for name in SEED_PARAMETERS}


class DataSetMismatch(RuntimeError):
    """The data dir holds a data set seeded with other parameters than the run's."""


def seed_if_needed(args: argparse.Namespace, dsn: str, data_dir: Path, log: Any) -> tuple[Path, str]:
    """The data dir's data set when it was seeded with the run's parameters, else seeded now.

    A data dir that holds a data set of other parameters is not seeded over unless the run
    says ``--reseed`` (``DataSetMismatch``): a 100k agent embedded by MiniLM takes half an
    hour, and a run that left out one of its options (a scenario's own ``--vectors``, say)
    must not empty it. The marker goes before a seed starts and comes back when it ends:
    an interrupted seed is seeded again, never reused half done.
    """
    agents_file = data_dir / "agents.json"
    marker = data_dir / "seeded.json"
    wanted = seed_parameters(args)
    previous = json.loads(marker.read_text()) if marker.exists() and agents_file.exists() else {}
    previous.get("params", {}).setdefault("embedding_storage", "schema")  # markers written before the option
    if not args.reseed and previous.get("params") == wanted:
        log(f"reusing seeded data in {data_dir}")
        # Seeded by an older build: brought to this build's schema (the service refuses
        # to serve on a database that lacks one of its migrations).
        applied = _migrate(dsn, args.dim)
        if applied:
            log(f"  migrated the reused data: {', '.join(applied)}")
        return agents_file, str(previous.get("output", ""))
    held = previous.get("params")
    if held and not args.reseed:
        differ = ", ".join(
            f"{key} {held.get(key)!r} there, {value!r} asked"
            for key, value in wanted.items()
            if held.get(key) != value
        )
        raise DataSetMismatch(
            f"{data_dir} holds a data set seeded with other parameters ({differ}): ask for its own,"
            " pass --reseed to replace it, or give another --data-dir"
        )
    marker.unlink(missing_ok=True)
    cmd = [
        PYTHON,
        "-m",
        "loadtest.seed",
        "--dsn",
        dsn,
        "--agents",
        str(args.agents),
        "--memories",
        str(args.memories),
        "--large-agents",
        str(args.large_agents),
        "--large-memories",
        str(args.large_memories),
        "--vectors",
        args.vectors,
        "--embedder",
        args.seed_embedder,
        "--jobs",
        str(args.jobs),
        "--seed",
        str(args.seed),
        "--dim",
        str(args.dim),
        "--embedding-storage",
        args.embedding_storage,
        "--agents-file",
        str(agents_file),
    ]
    log("seeding: " + " ".join(cmd[2:]))
    lines: list[str] = []
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            log("  seed| " + line.rstrip())
    output = "".join(line for line in lines if not line.startswith("  ") or "agents," not in line)
    if proc.returncode != 0:
        raise RuntimeError(f"seeding failed ({proc.returncode}):\n{''.join(lines)[-4000:]}")
    marker.write_text(json.dumps({"params": wanted, "output": output}))
    return agents_file, output
