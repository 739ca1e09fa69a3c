"""The embedded stores are real servers that start, answer, stop and clean up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import asyncpg
import redis.asyncio as aioredis
from ibex_context.devtools.embedded import (
    RedisProcess,
    _fallback_for,
    _postgres_data_root,
    embedded_stores,
    start_redis,
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) is not running.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


def _wait_dead(pid: int, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


async def test_session_redis_answers_ping(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await client.ping() is True
    finally:
        await client.aclose()


async def test_session_postgres_has_pgvector(postgres_dsn: str) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        extension = await conn.fetchval("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
    finally:
        await conn.close()
    assert extension is not None


def test_redis_restarts_on_the_same_port(throwaway_redis: RedisProcess) -> None:
    port, first_pid = throwaway_redis.port, throwaway_redis.pid
    throwaway_redis.stop()
    assert first_pid is not None and _wait_dead(first_pid)
    assert not throwaway_redis.running
    throwaway_redis.start()
    assert throwaway_redis.port == port
    assert throwaway_redis.running and throwaway_redis.pid != first_pid


def test_stop_is_idempotent(tmp_path: Path) -> None:
    server = start_redis(tmp_path)
    pid = server.pid
    server.stop()
    server.stop()
    assert pid is not None and _wait_dead(pid)


def test_a_path_other_users_cannot_traverse_falls_back_under_tmp(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    root, is_fallback = _postgres_data_root(private / "data")
    if os.geteuid() == 0:
        assert is_fallback and root.parent == Path("/tmp")
        assert root == _postgres_data_root(private / "data")[0]  # stable for the same path
    else:
        assert not is_fallback and root == private / "data"


def test_a_fallback_whose_data_dir_is_gone_is_removed_when_the_next_is_claimed(tmp_path: Path) -> None:
    """A fallback is named after its data dir's inode: once that dir is deleted nothing
    can reach the cluster again, so claiming the next fallback under the same parent
    removes it. One whose dir remains, one whose server still runs, and one without a
    record of its dir (being created, or older) stay."""
    parent = tmp_path / "tmp"
    owners = {name: tmp_path / name for name in ("gone", "kept", "running")}
    for owner in owners.values():
        owner.mkdir()
    fallbacks = {name: _fallback_for(owner / "data", parent) for name, owner in owners.items()}
    for fallback in fallbacks.values():
        (fallback / "postgres").mkdir()
        (fallback / "postgres" / "PG_VERSION").write_text("18\n")
    running_pid = fallbacks["running"] / "postgres" / "postmaster.pid"
    running_pid.write_text(f"{os.getpid()}\n{fallbacks['running']}\n")
    unrecorded = parent / "ibex-pgdata-0123456789abcdef"
    unrecorded.mkdir()
    owners["gone"].rmdir()
    owners["running"].rmdir()

    claimed = _fallback_for(tmp_path / "next" / "data", parent)

    assert not fallbacks["gone"].exists()
    assert fallbacks["kept"].exists() and fallbacks["running"].exists() and unrecorded.exists()
    assert claimed.exists() and claimed != fallbacks["kept"]
    # The same dir, the same cluster.
    assert _fallback_for(owners["kept"] / "data", parent) == fallbacks["kept"]


def test_embedded_stores_start_both_and_stop_both(tmp_path: Path) -> None:
    with embedded_stores(tmp_path, remove_on_stop=True) as stores:
        redis_pid, postgres_pid = stores.redis.pid, stores.postgres.pid
        assert redis_pid is not None and postgres_pid is not None
        assert _alive(redis_pid) and _alive(postgres_pid)
        pgdata = stores.postgres.pgdata
        assert (pgdata / "PG_VERSION").exists()
    assert _wait_dead(redis_pid) and _wait_dead(postgres_pid)
    assert not pgdata.exists()


def test_stores_are_stopped_and_ephemeral_data_removed_when_their_process_is_killed(tmp_path: Path) -> None:
    """SIGKILL runs no atexit handler: the watchdogs must stop both servers."""
    script = textwrap.dedent(
        f"""
        import os, sys
        from pathlib import Path
        from ibex_context.devtools.embedded import start_postgres, start_redis
        redis = start_redis(Path({str(tmp_path)!r}) / "redis")
        postgres = start_postgres(Path({str(tmp_path)!r}), remove_on_stop=True)
        print(redis.pid, postgres.pid, postgres.pgdata, flush=True)
        sys.stdin.read()
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        redis_pid, postgres_pid, pgdata = child.stdout.readline().split()
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert _wait_dead(int(redis_pid))
    assert _wait_dead(int(postgres_pid))
    deadline = time.monotonic() + 10
    while Path(pgdata).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(pgdata).exists()
