"""How long the post-response bookkeeping holds the event loop, with real stores.

Run: ``.venv/bin/python -m benchmarks.bookkeeping [--out FILE]`` (default
benchmarks/results/bookkeeping-<date>.md).

Issue #14 asks that recording injections (``memory_usage`` counters in PostgreSQL,
then the hot sets' counters and scores patched in Redis) never takes a single loop
step of more than ~1 ms: every call of the process waits for such a step. This runs
``ContextRepository.record_injections`` (what ``InjectionQueue`` calls per batch) on a
loop whose selector measures each iteration, and reports per batch the longest
iteration and the whole batch, in **CPU time of the loop's thread**
(``time.thread_time``), so other work on the machine does not count; wall times are
given beside them.

Setup: embedded Redis and PostgreSQL+pgvector, 20 agents x 300 memories written
through the store's upsert, each agent's hot set built (50 members). A batch is what
``InjectionQueue`` flushes: its size in injections, from calls that inject 20
memories each (15 hot-set members and 5 others of one agent per call), agents drawn
at random. Nothing else runs on the loop, so each iteration is bookkeeping alone.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import platform
import random
import selectors
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import redis.asyncio as aioredis
from ibex_context.devtools.embedded import embedded_stores
from ibex_context.pipeline.costing import stored_token_counts
from ibex_context.server.loop_lag import IterationClock
from ibex_context.stores.base import Injection, PreparedMemory
from ibex_context.stores.migrate import migrate
from ibex_context.stores.postgres import PostgresMemoryStore, create_pool
from ibex_context.stores.redis import RedisContextCache
from ibex_context.stores.redis_wire import PipelinedRedis
from ibex_context.stores.repository import ContextRepository
from ibex_context.tokens.encodings import EncodingRegistry

AGENTS = 20
MEMORIES = 300
HOT_SET_SIZE = 50
PER_CALL = 20
HOT_PER_CALL = 15
BATCH_SIZES = (20, 200, 1000)
BATCHES = 40
STEP_BOUND_MS = 1.0


class CpuIterationClock(IterationClock):
    """The service's ``IterationClock`` (its delegation to the default selector), recording
    every iteration's CPU time of the loop's thread and wall time instead of the longest
    wall time."""

    def __init__(self) -> None:
        super().__init__()
        self._cpu_at = 0.0
        self._wall_at = 0.0
        self.iterations: list[tuple[float, float]] = []  # (cpu, wall) seconds

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        cpu, wall = time.thread_time(), time.perf_counter()
        if self._wall_at:
            self.iterations.append((cpu - self._cpu_at, wall - self._wall_at))
        events = self._inner.select(timeout)
        self._cpu_at, self._wall_at = time.thread_time(), time.perf_counter()
        return events


@dataclass(frozen=True, slots=True)
class BatchFigures:
    size: int
    longest_step_cpu_ms: list[float]
    batch_cpu_ms: list[float]
    batch_wall_ms: list[float]
    steps: list[int]


def _unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.standard_normal(384).astype(np.float32)
    return v / np.linalg.norm(v)


def _memory(rng: np.random.Generator, n: int, registry: EncodingRegistry) -> PreparedMemory:
    content = f"memory {n}: the user mentioned a plausible fact worth remembering, number {n}"
    return PreparedMemory(
        id=str(uuid.uuid4()),
        content=content,
        content_hash=hashlib.sha256(content.encode()).digest(),
        category="factual",
        confidence=float(rng.uniform(0.3, 1.0)),
        usefulness=0.5,
        metadata={},
        token_counts=stored_token_counts(content, [registry.get("o200k_base"), registry.get("cl100k_base")]),
        embedding=_unit(rng),
    )


def _batch(
    size: int, agents: Sequence[tuple[str, str]], hot: dict[tuple[str, str], list[str]],
    cold: dict[tuple[str, str], list[str]], rng: random.Random,
) -> list[Injection]:  # fmt: skip
    injections: list[Injection] = []
    now = time.time()
    while len(injections) < size:
        agent = rng.choice(agents)
        ids = rng.sample(hot[agent], HOT_PER_CALL) + rng.sample(cold[agent], PER_CALL - HOT_PER_CALL)
        injections.extend(Injection(agent[0], agent[1], memory_id, now) for memory_id in ids)
    return injections[:size]


async def _measure(clock: CpuIterationClock, data_dir: Path) -> list[BatchFigures]:
    figures: list[BatchFigures] = []
    with embedded_stores(data_dir, remove_on_stop=True) as stores:
        await migrate(stores.postgres.dsn, 384)
        pool = await create_pool(stores.postgres.dsn, min_size=2, max_size=4, ef_search=64)
        postgres = PostgresMemoryStore(pool, ef_search=64)
        client = aioredis.Redis.from_url(stores.redis.url)
        cache = RedisContextCache(
            client,
            PipelinedRedis.from_url(stores.redis.url),
            directive_ttl_seconds=300,
            hot_set_size=HOT_SET_SIZE,
            hot_set_ttl_seconds=3600,
        )
        await cache.warm_up(connections=4)
        repository = ContextRepository(postgres, cache)
        vectors = np.random.default_rng(0)
        registry = EncodingRegistry()
        agents = [(str(uuid.uuid4()), str(uuid.uuid4())) for _ in range(AGENTS)]
        hot: dict[tuple[str, str], list[str]] = {}
        cold: dict[tuple[str, str], list[str]] = {}
        for org, agent in agents:
            memories = [_memory(vectors, n, registry) for n in range(MEMORIES)]
            await postgres.upsert_memories(org, agent, memories)
            await repository.rebuild_hot_set(org, agent)
            members = await cache.get_hot_memories(org, agent, HOT_SET_SIZE)
            assert members is not None and len(members) == HOT_SET_SIZE
            hot[(org, agent)] = [m.id for m in members]
            in_hot = set(hot[(org, agent)])
            cold[(org, agent)] = [m.id for m in memories if m.id not in in_hot]
        rng = random.Random(0)
        for size in BATCH_SIZES:
            for _ in range(5):  # warm-up: statement caches, Redis scripts
                await repository.record_injections(_batch(size, agents, hot, cold, rng))
            longest, cpu, wall, steps = [], [], [], []
            for _ in range(BATCHES):
                batch = _batch(size, agents, hot, cold, rng)
                await asyncio.sleep(0)  # the batch starts on a fresh iteration
                clock.iterations.clear()
                cpu_start, wall_start = time.thread_time(), time.perf_counter()
                await repository.record_injections(batch)
                cpu.append((time.thread_time() - cpu_start) * 1e3)
                wall.append((time.perf_counter() - wall_start) * 1e3)
                # The iteration that resumes this coroutine after the batch is still open;
                # its share of bookkeeping is in the batch's CPU total.
                longest.append(max((c for c, _ in clock.iterations), default=0.0) * 1e3)
                steps.append(len(clock.iterations) + 1)
            figures.append(BatchFigures(size, longest, cpu, wall, steps))
        await repository.aclose()
        await cache.aclose()
        await postgres.aclose()
    return figures


def _p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def _commit() -> str:
    try:
        argv = ["git", "rev-parse", "--short", "HEAD"]
        out = subprocess.run(argv, capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _report(figures: Sequence[BatchFigures], elapsed: float) -> str:
    lines = [
        f"# Post-response bookkeeping: loop steps ({datetime.now(UTC):%Y-%m-%d})",
        "",
        f"Commit {_commit()}. Written by `python -m benchmarks.bookkeeping` (module doc: what it does).",
        "",
        f"Issue #14: no single loop step of the bookkeeping over ~{STEP_BOUND_MS:g} ms. CPU times are the",
        "loop thread's own (`time.thread_time`); wall times include waiting for the stores.",
        "",
        "| batch (injections) | longest step CPU p50 / p99 / max ms | batch CPU p50 ms | CPU per injection µs"
        " | loop iterations per batch | batch wall p50 ms |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for f in figures:
        longest = f.longest_step_cpu_ms
        lines.append(
            f"| {f.size} | {statistics.median(longest):.2f} / {_p(longest, 0.99):.2f}"
            f" / {max(longest):.2f} | {statistics.median(f.batch_cpu_ms):.2f}"
            f" | {1000 * statistics.median(f.batch_cpu_ms) / f.size:.1f}"
            f" | {statistics.median(f.steps):.0f} | {statistics.median(f.batch_wall_ms):.2f} |"
        )
    lines += [
        "",
        "## Setup",
        "",
        f"- Machine: {platform.machine()}, {os.cpu_count()} vCPUs shared with other work (load average"
        f" {' / '.join(f'{x:.2f}' for x in os.getloadavg())} at the end),"
        f" Python {platform.python_version()}.",
        "- Stores: embedded Redis (TCP loopback) and PostgreSQL 18 + pgvector (Unix socket);"
        f" {AGENTS} agents x {MEMORIES} memories, hot sets of {HOT_SET_SIZE}.",
        f"- Batches: {BATCHES} per size after 5 of warm-up; calls of {PER_CALL} injections"
        f" ({HOT_PER_CALL} hot-set members, the rest from the agent's other memories), agents at random.",
        f"- Run time {elapsed:.0f} s.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = Path(__file__).parent / "results" / f"bookkeeping-{datetime.now(UTC):%Y-%m-%d}.md"
    parser.add_argument("--out", type=Path, default=default)
    args = parser.parse_args(argv)
    clock = CpuIterationClock()
    loop = asyncio.SelectorEventLoop(clock)
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="ibex-bookkeeping-") as tmp:
            figures = loop.run_until_complete(_measure(clock, Path(tmp)))
    finally:
        loop.close()
    report = _report(figures, time.perf_counter() - start)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report, encoding="utf-8")
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
