"""The service under test: started here (its own Redis and PostgreSQL, then
``python -m ibex_context serve`` as a separate process, as in production; a new process
per budget when questions are asked cold), or one already running (``--target``).

A separate process keeps the benchmark's own work (embeddings, baselines) off the
service's event loop, so round trips measure the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpc_health.v1.health_pb2_grpc import HealthStub
from ibex_context.devtools.embedded import embedded_stores
from ibex_context.stores.postgres.migrate import migrate

EMBEDDING_DIM = 384  # all-MiniLM-L6-v2
START_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True, slots=True)
class RunningService:
    target: str  # host:port
    started_here: bool
    settings: Mapping[str, str]  # the IBEX_* settings it was started with ({} for --target)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_serving(host: str, port: int, timeout: float = START_TIMEOUT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with grpc.aio.insecure_channel(f"{host}:{port}") as channel:
                reply = await HealthStub(channel).Check(HealthCheckRequest(), timeout=1)
                if reply.status == HealthCheckResponse.SERVING:
                    return
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the service on {host}:{port} did not become SERVING in {timeout:.0f} s")


def service_settings(redis_url: str, postgres_dsn: str, port: int, profiles: Path) -> dict[str, str]:
    return {
        "IBEX_REDIS_URL": redis_url,
        "IBEX_POSTGRES_DSN": postgres_dsn,
        "IBEX_GRPC_HOST": "127.0.0.1",
        "IBEX_GRPC_PORT": str(port),
        "IBEX_METRICS_PORT": "0",
        "IBEX_EMBEDDER": "minilm",
        "IBEX_PROFILES_PATH": str(profiles),
        "IBEX_LOG_FORMAT": "text",
        "IBEX_LOG_LEVEL": "WARNING",
        "IBEX_AUTH_ENABLED": "false",
        # The questions are asked one after another; a few milliseconds apart, the
        # default 250 ms flush would count each injection ~20 questions late, where a
        # real conversation's turns are seconds apart and see the previous counts.
        "IBEX_POST_RESPONSE_FLUSH_MS": "5",
        # Measured (ibex_context.embedding.minilm): one BLAS thread is much faster here.
        "OPENBLAS_NUM_THREADS": "1",
    }


@dataclass(frozen=True, slots=True)
class LocalStores:
    """Redis and PostgreSQL+pgvector started here, migrated, for service processes to share."""

    work_dir: Path
    redis_url: str
    postgres_dsn: str


@contextlib.asynccontextmanager
async def local_stores(work_dir: Path) -> AsyncIterator[LocalStores]:
    """Fresh stores under ``work_dir`` (removed afterwards)."""
    with embedded_stores(work_dir, remove_on_stop=True) as stores:
        await migrate(stores.postgres.dsn, EMBEDDING_DIM)
        yield LocalStores(work_dir, stores.redis.url, stores.postgres.dsn)


@contextlib.asynccontextmanager
async def service_process(stores: LocalStores, profiles: Path) -> AsyncIterator[RunningService]:
    """A new ``ibex-context serve`` process on ``stores``: nothing cached in it yet (no query
    embedding, no token count), as after a deployment."""
    port = _free_port()
    settings = service_settings(stores.redis_url, stores.postgres_dsn, port, profiles)
    log_path = stores.work_dir / "service.log"
    with log_path.open("ab") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "ibex_context",
            "serve",
            env={**os.environ, **settings},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        await wait_serving("127.0.0.1", port)
        yield RunningService(f"127.0.0.1:{port}", True, settings)
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), timeout=20)
            except TimeoutError:
                process.kill()
                await process.wait()


@contextlib.asynccontextmanager
async def remote_service(target: str) -> AsyncIterator[RunningService]:
    host, _, port = target.rpartition(":")
    await wait_serving(host or "127.0.0.1", int(port), timeout=10)
    yield RunningService(target, False, {})
