"""Store and embedder latencies on this machine, with real embedded Redis and PostgreSQL.

Run: ``.venv/bin/python benchmarks/stores.py`` (writes benchmarks/results/stores.md).

Setup: one agent with 1,000 memories (384-d MiniLM-shaped random unit vectors,
realistic token counts) and a built hot set of 50; sequential calls on one
connection, after warm-up. Timings include the client library and, for Redis
and PostgreSQL, the loopback/Unix-socket round trip.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import redis.asyncio as aioredis
from ibex_context.devtools.embedded import embedded_stores
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.embedding.minilm import MiniLMEmbedder
from ibex_context.stores.base import PreparedMemory
from ibex_context.stores.hot_record import decode_records, encode_record
from ibex_context.stores.migrate import migrate
from ibex_context.stores.postgres import PostgresMemoryStore, create_pool
from ibex_context.stores.redis import RedisContextCache
from ibex_context.stores.redis_wire import PipelinedRedis
from ibex_context.stores.repository import ContextRepository

RESULTS = Path(__file__).parent / "results" / "stores.md"
MEMORIES = 1000


def _stats(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{statistics.median(ordered) * 1e3:.3f} | {p99 * 1e3:.3f} | {len(ordered)}"


async def _time(call: Callable[[], Awaitable[object]], runs: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        await call()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples


def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.standard_normal(384).astype(np.float32)
    return v / np.linalg.norm(v)


async def _run(data_dir: Path) -> list[str]:
    rows: list[str] = []
    with embedded_stores(data_dir, remove_on_stop=True) as stores:
        await migrate(stores.postgres.dsn, 384)
        pool = await create_pool(stores.postgres.dsn, min_size=1, max_size=2, ef_search=64)
        postgres = PostgresMemoryStore(pool, ef_search=64)
        client = aioredis.Redis.from_url(stores.redis.url)
        cache = RedisContextCache(
            client,
            PipelinedRedis.from_url(stores.redis.url),
            directive_ttl_seconds=300,
            hot_set_size=50,
            hot_set_ttl_seconds=3600,
        )
        repository = ContextRepository(postgres, cache)
        org, agent = str(uuid.uuid4()), str(uuid.uuid4())
        rng = np.random.default_rng(0)
        batch = []
        for i in range(MEMORIES):
            content = f"memory {i}: " + "a plausible remembered fact about the user " * 3
            batch.append(
                PreparedMemory(
                    id=str(uuid.uuid4()),
                    content=content,
                    content_hash=hashlib.sha256(content.encode()).digest(),
                    category="factual",
                    confidence=float(rng.uniform(0.3, 1.0)),
                    usefulness=0.5,
                    metadata={},
                    token_counts={"o200k_base": 30, "cl100k_base": 31},
                    embedding=_unit(rng),
                )
            )
        start = time.perf_counter()
        for i in range(0, MEMORIES, 250):
            await postgres.upsert_memories(org, agent, batch[i : i + 250])
        total_ms = (time.perf_counter() - start) * 1e3
        rows.append(
            f"| upsert 1,000 memories (4 batches of 250, HNSW maintained) | {total_ms:.1f} total | | 1 |"
        )
        await repository.rebuild_hot_set(org, agent)
        await repository.set_directive(org, agent, "Be concise. " * 40, {"o200k_base": 120})

        hot = await _time(lambda: cache.get_hot_memories(org, agent, 20), 1000)
        rows.append(f"| hot set read, 20 of 50 records (Lua ZRANGE+HMGET, decode) | {_stats(hot)} |")
        records = await cache.get_hot_memories(org, agent, 20)
        assert records is not None and len(records) == 20
        blobs = [encode_record(r) for r in records.records()]
        decode_samples = []
        for _ in range(2000):
            t = time.perf_counter()
            decode_records(blobs)
            decode_samples.append(time.perf_counter() - t)
        rows.append(f"| decode 20 hot records (pure, {len(blobs[0])} B each) | {_stats(decode_samples)} |")
        directive = await _time(lambda: repository.get_directive(org, agent), 1000)
        rows.append(f"| directive read (cache hit) | {_stats(directive)} |")
        query = _unit(rng)
        cold = await _time(lambda: postgres.search(org, agent, query, 50), 300)
        rows.append(f"| cold search, top 50 of 1,000 (one agent) | {_stats(cold)} |")

        hashing = HashingEmbedder(384)
        hashed = await _time(lambda: hashing.embed(["What should I call the user?"]), 1000)
        rows.append(f"| hashing embed, short query | {_stats(hashed)} |")
        minilm = MiniLMEmbedder.load()
        mini = await _time(lambda: minilm.embed(["What should I call the user?"]), 100, warmup=5)
        rows.append(f"| MiniLM embed, short query (8 tokens, own thread) | {_stats(mini)} |")
        long_text = ["Tell me everything we discussed last week about the deployment plan " * 4]
        mini_long = await _time(lambda: minilm.embed(long_text), 30, warmup=3)
        rows.append(f"| MiniLM embed, ~60-token query | {_stats(mini_long)} |")
        await minilm.aclose()
        await repository.aclose()
        await cache.aclose()
        await postgres.aclose()
    return rows


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="ibex-bench-") as tmp:
        rows = asyncio.run(_run(Path(tmp)))
    header = [
        "# Store and embedder latencies",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores shared with other work "
        f"(load average {os.getloadavg()[0]:.2f} at the end), Python {platform.python_version()}, "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}.",
        "Setup: embedded Redis 6.2 (TCP loopback) and PostgreSQL 18 + pgvector (Unix socket), "
        "one agent with 1,000 memories and a 50-member hot set; sequential calls after warm-up.",
        "",
        "| operation | p50 ms | p99 ms | runs |",
        "|---|---|---|---|",
    ]
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text("\n".join(header + rows) + "\n", encoding="utf-8")
    print(RESULTS.read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
