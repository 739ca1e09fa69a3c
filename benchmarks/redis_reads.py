"""CPU of the request path's two Redis reads: redis-py (as main read them) vs ``stores.redis_wire``.

Run: ``.venv/bin/python -m benchmarks.redis_reads [--calls N] [--rounds R] [--out FILE]``

Setup: an embedded Redis (TCP loopback, as the load test's), 20 agents, each with a
cached directive (~600 characters, six token counts) and a full hot set of 50 records
(``benchmarks.hot_read``'s records: 50-400-token contents, 384-d vectors). Calls are
sequential (one at a time), cycling over the agents, after a warm-up; the variants
alternate round by round on the same Redis and the same data.

Variants, each including the decoding into what the pipeline consumes:

* directive, redis-py: ``Redis.get`` + ``decode_directive`` (main's ``get_directive_state``);
* directive, wire: ``RedisContextCache.get_directive_state`` (``PipelinedRedis.get``);
* hot 20, redis-py: the registered read script + ``decode_records`` (main's
  ``get_hot_memories``), and the same inside ``_shielded`` as main's retrieval ran it
  (an extra task per call, because redis-py's release was not cancellation-safe);
* hot 20, wire: ``RedisContextCache.get_hot_memories`` (``PipelinedRedis.evalsha``).

Per call: the client's CPU (``time.thread_time_ns`` of the only thread) and wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from ibex_context.devtools.embedded import RedisProcess
from ibex_context.stores.hot_record import decode_records
from ibex_context.stores.postgres import DirectiveState
from ibex_context.stores.redis import (
    _READ_HOT,
    RedisContextCache,
    create_redis_client,
    decode_directive,
    directive_key,
    hot_data_key,
    hot_set_key,
)
from ibex_context.stores.redis_wire import PipelinedRedis

from benchmarks.hot_read import AGENTS, HOT_SET_SIZE, _install

T = TypeVar("T")
HOT_LIMIT = 20
VARIANTS = (
    "directive, redis-py",
    "directive, wire",
    f"hot {HOT_LIMIT}, redis-py",
    f"hot {HOT_LIMIT}, redis-py shielded",
    f"hot {HOT_LIMIT}, wire",
)
_DIRECTIVE = (
    "You are the support assistant of a logistics company. Answer in the customer's language, "
    "state opening hours exactly as stored, never promise delivery dates, escalate refunds over "
    "500 EUR to a human, and keep answers under 120 words unless asked for detail. "
) * 2


def _shielded(call: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """main's ``retrieval._shielded``, as its hot-set read ran inside it."""
    task = asyncio.ensure_future(call)
    task.add_done_callback(lambda done: None if done.cancelled() else done.exception())
    return asyncio.shield(task)


async def _measure(
    url: str, calls: int, rounds: int, only: str | None = None
) -> dict[str, list[dict[str, float]]]:
    client = create_redis_client(url, max_connections=64)
    cache = RedisContextCache(
        client,
        PipelinedRedis.from_url(url),
        directive_ttl_seconds=3600,
        hot_set_size=HOT_SET_SIZE,
        hot_set_ttl_seconds=3600,
    )
    await cache.warm_up()
    org = str(uuid.UUID(int=1))
    agents = [str(uuid.UUID(int=100 + i)) for i in range(AGENTS)]
    await _install(cache, org, agents)
    counts = {key: 150 + i for i, key in enumerate(("o200k_base", "cl100k_base", "a", "b", "c", "d"))}
    for version, agent in enumerate(agents, start=1):
        assert await cache.put_directive(org, agent, DirectiveState(_DIRECTIVE, version, counts))
    read_hot = client.register_script(_READ_HOT)

    async def directive_redis_py(agent: str) -> object:
        value = await client.get(directive_key(org, agent))
        return None if value is None else decode_directive(value)

    async def hot_redis_py(agent: str) -> object:
        records = await read_hot(keys=[hot_set_key(org, agent), hot_data_key(org, agent)], args=[HOT_LIMIT])
        return None if records is None else decode_records(records)

    variants: dict[str, Callable[[str], Awaitable[object]]] = dict(
        zip(
            VARIANTS,
            [
                directive_redis_py,
                lambda agent: cache.get_directive_state(org, agent),
                hot_redis_py,
                lambda agent: _shielded(hot_redis_py(agent)),
                lambda agent: cache.get_hot_memories(org, agent, HOT_LIMIT),
            ],
            strict=True,
        )
    )
    for name, read in variants.items():  # same answers, and warm
        if only in (None, name):
            for i in range(200 if only is None else 20):
                assert await read(agents[i % AGENTS]) is not None, name
    if only is not None:  # the run callgrind counts: one variant, untimed
        for i in range(calls):
            await variants[only](agents[i % AGENTS])
        await cache.aclose()
        return {}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for _round in range(rounds):
        for name, read in variants.items():
            gc.collect()
            cpus, walls = [], []
            for i in range(calls):
                agent = agents[i % AGENTS]
                w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                await read(agent)
                cpus.append(time.thread_time_ns() - c0)
                walls.append(time.perf_counter_ns() - w0)
            cpus.sort()
            walls.sort()
            results[name].append(
                {
                    "cpu_p50_us": cpus[len(cpus) // 2] / 1e3,
                    "cpu_p99_us": cpus[int(len(cpus) * 0.99)] / 1e3,
                    "cpu_mean_us": statistics.fmean(cpus) / 1e3,
                    "wall_p50_us": walls[len(walls) // 2] / 1e3,
                }
            )
            print(name, json.dumps(results[name][-1]), flush=True)
    await cache.aclose()
    return results


def _with_redis(calls: int, rounds: int, only: str | None = None) -> dict[str, list[dict[str, float]]]:
    with tempfile.TemporaryDirectory(prefix="ibex-redis-reads-") as tmp:
        redis = RedisProcess(Path(tmp))
        redis.start()
        try:
            return asyncio.run(_measure(redis.url, calls, rounds, only))
        finally:
            redis.stop()


def _instructions(variant: str, calls: int) -> int:
    """Instructions of this script run with ``calls`` reads of ``variant``, under callgrind."""
    valgrind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    done = subprocess.run(
        [*valgrind, sys.executable, "-m", "benchmarks.redis_reads", "--only", variant, "--calls", str(calls)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    match = re.search(r"Collected : (\d+)", done.stderr)
    assert match, done.stderr[-2000:]
    return int(match.group(1))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--callgrind", action="store_true", help="count instructions per read instead")
    parser.add_argument("--only", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.only is not None:
        _with_redis(args.calls, 1, args.only)
        return 0
    if args.callgrind:
        return _count_instructions(args.out)
    load_before = os.getloadavg()[0]
    results = _with_redis(args.calls, args.rounds)
    lines = [
        "| read | client CPU p50 µs (median of rounds) | p99 µs | mean µs | wall p50 µs | p50 per round |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, rounds in results.items():

        def median(field: str, rounds: list[dict[str, float]] = rounds) -> float:
            return statistics.median(r[field] for r in rounds)

        per_round = " / ".join(f"{r['cpu_p50_us']:.0f}" for r in rounds)
        lines.append(
            f"| {name} | **{median('cpu_p50_us'):.0f}** | {median('cpu_p99_us'):.0f} "
            f"| {median('cpu_mean_us'):.0f} | {median('wall_p50_us'):.0f} | {per_round} |"
        )
    setup = (
        f"{args.rounds} rounds x {args.calls} sequential calls per variant, variants alternated "
        f"within each round; {AGENTS} agents (directive ~{len(_DIRECTIVE)} chars, hot set of "
        f"{HOT_SET_SIZE}, {HOT_LIMIT} read); embedded Redis over TCP loopback; Python "
        f"{platform.python_version()}, {platform.machine()}, {os.cpu_count()} vCPUs shared, "
        f"run under nice -n 19; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after."
    )
    text = "\n".join([setup, "", *lines, ""])
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


def _count_instructions(out: Path | None) -> int:
    few, many = 20, 220
    lines = ["| read | client instructions per read |", "|---|---:|"]
    for variant in VARIANTS:
        per_read = (_instructions(variant, many) - _instructions(variant, few)) / (many - few)
        lines.append(f"| {variant} | {per_read / 1e3:,.0f} k |")
        print(lines[-1], flush=True)
    setup = (
        f"valgrind --tool=callgrind over this script with {few} and {many} sequential reads of one "
        f"variant (the difference divided by {many - few}); Redis outside valgrind; Python "
        f"{platform.python_version()}."
    )
    text = "\n".join([setup, "", *lines, ""])
    if out:
        out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
