"""What one hot-set read costs: ``RedisContextCache.get_hot_memories`` for 20 and 50 records.

Run: ``.venv/bin/python -m benchmarks.hot_read [--calls N] [--callgrind] [--out FILE]``

Drives the public API only (``replace_hot_set`` to install the hot sets,
``get_hot_memories`` to read them), so the same script measures any version of the hot
set's storage form: run it with ``PYTHONPATH`` pointing at the version to measure.

Setup: an embedded Redis (TCP loopback), 20 agents with a full hot set of 50 records
each, records as the load test stores them (50-400-token contents, the six
``token_counts`` keys the write path stores, 384-d float32 embeddings, counters set).
Calls are sequential on one connection, cycling over the agents, after a warm-up.

Per call it reports:

* wall time of the call (``perf_counter``), p50 and p99: the round trip included;
* the client's CPU (``thread_time`` of the only thread: redis-py, hiredis, decoding
  and building the records), p50 and p99;
* Redis's CPU per call (``INFO commandstats``: ``usec_per_call`` of EVALSHA);
* with ``--callgrind``: the client's instructions per call, exact and independent of
  the machine's load: the script is run under ``valgrind --tool=callgrind`` with two
  numbers of calls and the difference is divided by the difference of calls (Redis
  runs outside valgrind: children are not traced);
* with ``--lua-alternative`` (format 3 only): Redis's CPU per read of the read script
  against the alternative that cuts the records into three concatenated columns in
  Lua (``_CUT_IN_LUA``), over the same hot sets, alternating.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import random
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from ibex_context.devtools.embedded import RedisProcess  # noqa: E402
from ibex_context.models import CATEGORY_ORDER, MemoryRecord, Source  # noqa: E402
from ibex_context.stores.redis import _READ_HOT, RedisContextCache, create_redis_client  # noqa: E402
from ibex_context.stores.redis_wire import PipelinedRedis  # noqa: E402

AGENTS = 20
HOT_SET_SIZE = 50
DIM = 384
LIMITS = (20, 50)
_VOCABULARY = (
    "deploy service cluster latency budget customer invoice refund schedule meeting release branch "
    "pipeline database index query cache migration rollback incident review summary ticket priority "
    "travel flight hotel seat window aisle dog allergy coffee tea morning evening weekend Berlin café "
    "naïve Zürich"
)
_WORDS = tuple(_VOCABULARY.split())
# The keys the write path stores per memory (``costing.stored_token_counts``).
_COUNT_KEYS = (
    "o200k_base",
    "o200k_base/xml",
    "o200k_base/markdown",
    "cl100k_base",
    "cl100k_base/xml",
    "cl100k_base/markdown",
)


def _record(rng: random.Random, nrng: np.random.Generator, now: float) -> MemoryRecord:
    tokens = rng.randint(50, 400)
    # ~1.3 tokens per word of this vocabulary: contents of 50-400 tokens.
    content = " ".join(rng.choice(_WORDS) for _ in range(int(tokens / 1.3))) + "."
    vector = nrng.standard_normal(DIM).astype(np.float32)
    return MemoryRecord(
        id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        content=content,
        category=rng.choice(CATEGORY_ORDER),
        confidence=rng.uniform(0.3, 1.0),
        usefulness=rng.uniform(0.0, 1.0),
        retrieval_count=rng.randint(0, 80),
        occurred_at=now - rng.uniform(0, 200) * 86_400,
        last_injected_at=now - rng.uniform(0, 20) * 86_400 if rng.random() < 0.5 else None,
        token_counts={key: tokens + i for i, key in enumerate(_COUNT_KEYS)},
        embedding=vector / np.linalg.norm(vector),
        source=Source.COLD,
    )


async def _install(cache: RedisContextCache, org: str, agents: Sequence[str]) -> None:
    rng, nrng = random.Random(7), np.random.default_rng(7)
    for agent in agents:
        scored = [(_record(rng, nrng, 1_790_000_000.0), rng.random()) for _ in range(HOT_SET_SIZE)]
        assert await cache.replace_hot_set(org, agent, scored, expected_generation=0)


async def _evalsha_usec(cache: RedisContextCache) -> tuple[int, int]:
    stats = await cache._client.info("commandstats")
    entry = stats.get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    return int(entry["calls"]), int(entry["usec"])


# The alternative not taken (docs/adr/0003-stores.md): headers, numbers and texts of the
# records cut and joined in Lua, so the client receives three strings.
_HEADER_SIZE = 61  # format 3's header
_SIZES_AT = struct.calcsize("<BIdddd") + 1  # k and d in the header, 1-based for Lua
_CUT_IN_LUA = f"""
if redis.call('EXISTS', KEYS[2]) == 0 then return false end
local ids = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'REV')
local records = redis.call('HMGET', KEYS[2], unpack(ids))
local headers, numbers, texts = {{}}, {{}}, {{}}
for i = 1, #records do
  local record = records[i]
  local counts, dims = struct.unpack('<I4I4', record, {_SIZES_AT})
  local text_at = {_HEADER_SIZE + 1} + 4 * (counts + dims)
  headers[i] = string.sub(record, 1, {_HEADER_SIZE})
  numbers[i] = string.sub(record, {_HEADER_SIZE + 1}, text_at - 1)
  texts[i] = string.sub(record, text_at)
end
return {{table.concat(headers), table.concat(numbers), table.concat(texts)}}
"""


async def _lua_alternative(url: str, calls: int) -> list[str]:
    cache = RedisContextCache(
        create_redis_client(url, max_connections=2),
        PipelinedRedis.from_url(url),
        directive_ttl_seconds=300,
        hot_set_size=HOT_SET_SIZE,
        hot_set_ttl_seconds=3600,
    )
    org = str(uuid.UUID(int=1))
    agents = [str(uuid.UUID(int=100 + i)) for i in range(AGENTS)]
    await _install(cache, org, agents)
    client = cache._client
    scripts = {
        "as stored (kept)": client.register_script(_READ_HOT),
        "cut in Lua": client.register_script(_CUT_IN_LUA),
    }
    lines = ["| records | script | Redis CPU µs per read |", "|---:|---|---:|"]
    for limit in LIMITS:
        for _round in range(2):
            for name, script in scripts.items():
                for i in range(50):
                    await script(keys=cache._hot_keys(org, agents[i % AGENTS])[:2], args=[limit])
                await client.config_resetstat()
                for i in range(calls):
                    await script(keys=cache._hot_keys(org, agents[i % AGENTS])[:2], args=[limit])
                lines.append(f"| {limit} | {name} | {(await _evalsha_usec(cache))[1] / calls:.1f} |")
                print(lines[-1], flush=True)
    await cache.aclose()
    return lines


def _pct(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def _measure(
    url: str, calls: int, limits: Sequence[int], *, timed: bool
) -> dict[int, dict[str, float]]:
    cache = RedisContextCache(
        create_redis_client(url, max_connections=2),
        PipelinedRedis.from_url(url),
        directive_ttl_seconds=300,
        hot_set_size=HOT_SET_SIZE,
        hot_set_ttl_seconds=3600,
    )
    org = str(uuid.UUID(int=1))
    agents = [str(uuid.UUID(int=100 + i)) for i in range(AGENTS)]
    await _install(cache, org, agents)
    results: dict[int, dict[str, float]] = {}
    for limit in limits:
        for i in range(50):  # warm-up: scripts loaded, connection open, caches filled
            await cache.get_hot_memories(org, agents[i % AGENTS], limit)
        got = await cache.get_hot_memories(org, agents[0], limit)
        assert got is not None and len(got) == limit, "the hot set did not read back"
        gc.collect()
        walls, cpus = [], []
        before = await _evalsha_usec(cache)
        for i in range(calls):
            agent = agents[i % AGENTS]
            if timed:
                w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                await cache.get_hot_memories(org, agent, limit)
                cpus.append(time.thread_time_ns() - c0)
                walls.append(time.perf_counter_ns() - w0)
            else:
                await cache.get_hot_memories(org, agent, limit)
        after = await _evalsha_usec(cache)
        if timed:
            results[limit] = {
                "wall_p50": _pct(walls, 0.5) / 1e3,
                "wall_p99": _pct(walls, 0.99) / 1e3,
                "cpu_p50": _pct(cpus, 0.5) / 1e3,
                "cpu_p99": _pct(cpus, 0.99) / 1e3,
                "cpu_mean": statistics.fmean(cpus) / 1e3,
                "redis_us": (after[1] - before[1]) / max(1, after[0] - before[0]),
            }
    await cache.aclose()
    return results


def _with_redis(calls: int, limits: Sequence[int], *, timed: bool) -> dict[int, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="ibex-hot-read-") as tmp:
        redis = RedisProcess(Path(tmp))
        redis.start()
        try:
            return asyncio.run(_measure(redis.url, calls, limits, timed=timed))
        finally:
            redis.stop()


def _instructions(calls: int, limit: int) -> int:
    """Instructions of this script run with ``calls`` reads of ``limit`` records, under callgrind."""
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            "-m",
            "benchmarks.hot_read",
            "--untimed-calls",
            str(calls),
            "--untimed-limit",
            str(limit),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    match = re.search(r"Collected : (\d+)", done.stderr)
    assert match, done.stderr[-2000:]
    return int(match.group(1))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--callgrind", action="store_true", help="also count instructions per call")
    parser.add_argument("--lua-alternative", action="store_true", help="also compare Redis's CPU")
    parser.add_argument("--untimed-calls", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--untimed-limit", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--label", default="")
    args = parser.parse_args(argv)
    if args.untimed_calls is not None:  # the run callgrind counts
        _with_redis(args.untimed_calls, [args.untimed_limit], timed=False)
        return 0
    results = _with_redis(args.calls, LIMITS, timed=True)
    lines = [
        "| records | wall p50 / p99 µs | client CPU p50 / p99 / mean µs | Redis CPU µs "
        "| client instructions |",
        "|---:|---|---|---:|---:|",
    ]
    for limit, r in results.items():
        instructions = "not counted"
        if args.callgrind:
            few, many = 20, 220
            per_call = (_instructions(many, limit) - _instructions(few, limit)) / (many - few)
            instructions = f"{per_call / 1e3:.0f} k"
        lines.append(
            f"| {limit} | {r['wall_p50']:.0f} / {r['wall_p99']:.0f} "
            f"| {r['cpu_p50']:.0f} / {r['cpu_p99']:.0f} / {r['cpu_mean']:.0f} | {r['redis_us']:.1f} "
            f"| {instructions} |"
        )
        print(lines[-1], flush=True)
    if args.lua_alternative:
        with tempfile.TemporaryDirectory(prefix="ibex-hot-read-") as tmp:
            redis = RedisProcess(Path(tmp))
            redis.start()
            try:
                lines += ["", *asyncio.run(_lua_alternative(redis.url, args.calls))]
            finally:
                redis.stop()
    setup = (
        f"{args.label} {args.calls} sequential `get_hot_memories` calls per row over {AGENTS} agents' "
        f"hot sets of {HOT_SET_SIZE} (50-400-token contents, 6 token counts, {DIM}-d float32 vectors), "
        f"embedded Redis over TCP loopback; Python {platform.python_version()}, numpy {np.__version__}, "
        f"{platform.machine()}, {os.cpu_count()} vCPUs shared, load average "
        f"{os.getloadavg()[0]:.2f} at the end."
    ).strip()
    text = "\n".join([setup, "", *lines, ""])
    if args.out:
        args.out.write_text(text)
    print(setup)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
