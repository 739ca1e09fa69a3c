"""CPU per AssembleContext call, in process, against the load test's seeded stores.

Runs the real handler (validation, assembly, response conversion, serialization,
post-response bookkeeping) against the real Redis and PostgreSQL of a
``loadtest/run`` data dir, one call at a time, with the load test's request mix;
only the gRPC transport is left out (the handler is called with the parsed
message and a stand-in context that knows the deadline; it returns the serialized
response). Reports CPU and wall time per call and, with
``--profile``, the functions that take it (cProfile, cumulative).

    .venv/bin/python -m benchmarks.call_cpu --calls 600 [--profile] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import platform
import pstats
import random
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadtest.datastores import stores  # noqa: E402
from loadtest.machine import git_commit  # noqa: E402
from loadtest.workload import (  # noqa: E402
    DEFAULT_WEIGHTS,
    SCENARIOS,
    Caller,
    Workload,
    build_request,
    parse_weights,
)


class _Context:
    """What the handler uses of grpc.aio's servicer context (``server.rpc.Context``)."""

    def __init__(self, deadline_s: float) -> None:
        self._at = time.monotonic() + deadline_s

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def time_remaining(self) -> float:
        return max(0.0, self._at - time.monotonic())

    def set_code(self, code: Any) -> None:
        pass

    def set_details(self, details: str) -> None:
        pass


def _requests(workload: Workload, n: int, seed: int) -> list[tuple[str, Any]]:
    """The locust user's request mix, built by the same code."""
    rng = random.Random(seed)
    caller = Caller(session_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)))
    weights = parse_weights(DEFAULT_WEIGHTS)
    out = []
    for _ in range(n):
        scenario = rng.choices(SCENARIOS, [weights.get(s, 0) for s in SCENARIOS])[0]
        out.append((scenario, build_request(workload, caller, rng, scenario)))
    return out


def _heap_census(top: int) -> dict[str, Any]:
    """What the cyclic GC has to walk on a full (gen2) collection, and how long one takes."""
    import collections
    import gc

    objects = gc.get_objects()
    by_type = collections.Counter(type(o).__qualname__ for o in objects)
    frozen = gc.get_freeze_count()
    del objects
    t0 = time.perf_counter()
    gc.collect()
    full_ms = (time.perf_counter() - t0) * 1000
    return {
        "tracked_objects": sum(by_type.values()),
        "frozen_objects": frozen,
        "full_collection_ms": round(full_ms, 1),
        "by_type": dict(by_type.most_common(top)),
    }


def in_process_settings(dsn: str, redis_url: str, **overrides: str) -> dict[str, str]:
    """The environment of a service started in this process against the load test's
    stores: the hashing embedder, no exporter, no auth, ports of its own."""
    return {
        "IBEX_POSTGRES_DSN": dsn,
        "IBEX_REDIS_URL": redis_url,
        "IBEX_GRPC_HOST": "127.0.0.1",
        "IBEX_GRPC_PORT": "0",
        "IBEX_METRICS_PORT": "0",
        "IBEX_EMBEDDER": "hashing",
        "IBEX_EMBEDDING_DIM": "384",
        "IBEX_LOG_LEVEL": "WARNING",
        "IBEX_TRACING_EXPORTER": "none",
        "IBEX_AUTH_ENABLED": "false",
        **overrides,
    }


async def _run(args: argparse.Namespace, dsn: str, redis_url: str, agents_file: Path) -> dict[str, Any]:
    from ibex_context.server.app import ContextService
    from ibex_context.settings import Settings

    os.environ.update(in_process_settings(dsn, redis_url))
    service = ContextService(Settings())
    await service.start()
    try:
        handler = service.assembly_handler
        stage_us: dict[str, list[int]] = {}
        observer = handler._observer
        # The last call's assembly and its stages, the send included.
        last_report: list[Any] = [None]

        class Collecting:
            """The handler's observer, collecting each call's stages on the way."""

            def answered(self, assembly: Any, send: Any) -> None:
                stages = (*assembly.timings.stages, *((send,) if send is not None else ()))
                last_report[0] = (assembly, stages)
                for span in stages:
                    stage_us.setdefault(span.stage, []).append(span.duration_us)
                if args.trace and len(stage_us.get("hot", ())) % 50 == 7:
                    t0 = assembly.timings.started_ns
                    spans = (
                        f"{s.stage}:{(s.start_ns - t0) / 1e6:.2f}-{(s.end_ns - t0) / 1e6:.2f}" for s in stages
                    )
                    print(" ".join(spans), file=sys.stderr)
                observer.answered(assembly, send)

            def rejected(self, rejection: Any) -> None:
                observer.rejected(rejection)

        handler._observer = Collecting()
        workload = Workload(agents_file, args.seed)
        warm = _requests(workload, args.warmup, args.seed + 7)
        calls = _requests(workload, args.calls, args.seed)
        for _, message in warm:
            await handler.AssembleContext(message, _Context(0.045))
        await asyncio.sleep(0.3)
        heap = _heap_census(args.top) if args.heap else None
        profiler = cProfile.Profile() if args.profile else None
        cpu: list[float] = []
        wall: list[float] = []
        by_scenario: dict[str, list[float]] = {}
        per_call: list[dict[str, Any]] = []
        counter = handler._assembler._counter
        hits_before = (counter.hits, counter.misses)
        stage_us.clear()
        import gc

        pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        started: list[float] = []

        def on_gc(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                started.append(time.perf_counter())
            elif started:
                pauses[info["generation"]].append((time.perf_counter() - started.pop()) * 1000)

        gc.callbacks.append(on_gc)
        if args.mark_file:
            args.mark_file.write_text("measuring\n")
        cpu0 = time.process_time()
        for scenario, message in calls:
            if profiler:
                profiler.enable()
            c0, w0 = time.process_time(), time.perf_counter()
            await handler.AssembleContext(message, _Context(0.045))
            c1, w1 = time.process_time(), time.perf_counter()
            if profiler:
                profiler.disable()
            cpu.append((c1 - c0) * 1000)
            wall.append((w1 - w0) * 1000)
            by_scenario.setdefault(scenario, []).append((c1 - c0) * 1000)
            if last_report[0] is not None:
                assembly, stages = last_report[0]
                per_call.append(
                    {
                        "cpu_ms": round((c1 - c0) * 1000, 2),
                        "scenario": scenario,
                        "messages": len(message.messages),
                        "candidates": assembly.candidates_evaluated,
                        "stages_ms": {sp.stage: round(sp.duration_us / 1000, 2) for sp in stages},
                    }
                )
            # Let the post-response queue flush between calls, as it would at 50 RPS.
            if profiler:
                profiler.enable()
            await asyncio.sleep(0)
            if profiler:
                profiler.disable()
        await asyncio.sleep(0.3)  # the last flushes
        gc.callbacks.remove(on_gc)
        counter = handler._assembler._counter
        hits0, misses0 = hits_before
        total_cpu = (time.process_time() - cpu0) * 1000
        result: dict[str, Any] = {
            "calls": len(calls),
            "cpu_ms_per_call_incl_background": total_cpu / len(calls),
            "cpu_ms_p50": statistics.median(cpu),
            "cpu_ms_p99": sorted(cpu)[int(0.99 * len(cpu)) - 1],
            "wall_ms_p50": statistics.median(wall),
            "wall_ms_p99": sorted(wall)[int(0.99 * len(wall)) - 1],
            "token_cache_hit_rate": round(
                (counter.hits - hits0) / max(1, counter.hits - hits0 + counter.misses - misses0), 4
            ),
            "gc_pauses": {
                f"gen{g}": {"n": len(p), "total_ms": round(sum(p), 1), "max_ms": round(max(p, default=0), 2)}
                for g, p in pauses.items()
            },
            "stage_ms_p50": {k: round(statistics.median(v) / 1000, 3) for k, v in sorted(stage_us.items())},
            "cpu_ms_p50_by_scenario": {k: round(statistics.median(v), 3) for k, v in by_scenario.items()},
            # The calls that make the tail: which scenario, and which stage took the time.
            "slowest_calls": sorted(per_call, key=lambda c: -c["cpu_ms"])[: args.slowest],
        }
        if heap:
            result["heap_after_warmup"] = heap
        if profiler:
            buffer = io.StringIO()
            stats = pstats.Stats(profiler, stream=buffer)
            stats.sort_stats("cumulative").print_stats(args.top)
            stats.sort_stats("tottime").print_stats(args.top)
            result["profile"] = buffer.getvalue()
        return result
    finally:
        await service.stop(0)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=None, help="a loadtest/out/data/<key> dir")
    p.add_argument("--calls", type=int, default=600)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--seed", type=int, default=20261122)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--trace", action="store_true", help="print every 50th call's stage spans (ms) to stderr")
    p.add_argument("--uvloop", action="store_true", help="run on uvloop (IBEX_USE_UVLOOP)")
    p.add_argument("--slowest", type=int, default=10, help="how many of the slowest calls to detail")
    p.add_argument("--heap", action="store_true", help="census of GC-tracked objects after the warm-up")
    p.add_argument("--top", type=int, default=45)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--mark-file", type=Path, default=None, help="written when the measured calls start")
    args = p.parse_args()
    data_dir = args.data_dir or sorted((ROOT / "loadtest" / "out" / "data").glob("100x1000-*"))[0]
    with stores(data_dir) as (dsn, redis_url, _redis, _pg):
        from ibex_context.stores.postgres.migrate import migrate

        asyncio.run(migrate(dsn, 384))  # a data dir seeded by an older build
        main_coroutine = _run(args, dsn, redis_url, data_dir / "agents.json")
        if args.uvloop:
            import uvloop

            result = uvloop.run(main_coroutine)
        else:
            result = asyncio.run(main_coroutine)
    profile = result.pop("profile", None)
    result["setup"] = {
        "data": data_dir.name,
        "calls": args.calls,
        "warmup_calls": args.warmup,
        "mix": DEFAULT_WEIGHTS,
        "embedder": "hashing",
        "transport": "none (handler called in process; HTTP/2 excluded)",
        "machine": f"{os.cpu_count()} vCPU {platform.machine()}, shared with other work",
        "python": platform.python_version(),
        "commit": git_commit(),
    }
    print(json.dumps(result, indent=2))
    if profile:
        print(profile)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
