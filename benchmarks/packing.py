"""Packer benchmark: bounded DP vs plain greedy vs an exact oracle.

Run: ``.venv/bin/python benchmarks/packing.py`` (writes benchmarks/results/packing.md).

Instances mimic the assembler's input: scores are composite scores in [0, 1]
(Beta(2, 3): few strong, many middling), token costs are formatted memory costs
(log-normal, median ~120 tokens, clipped to [15, 1500]), budget = the default
``max_memory_tokens`` (4000) and ``max_items`` = 20 (the default profile).

Oracles: brute force over all subsets for n <= 14; for n = 100 an exact DP
(one-token buckets, with the count dimension, no ceiling), which is the true
optimum for integer costs.
"""

from __future__ import annotations

import itertools
import math
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from ibex_context.models import MemoryRecord, ScoredMemory
from ibex_context.pipeline.packing import (
    DP_BOUNDED_CELL_CEILING,
    DP_CELL_CEILING,
    MAX_BUCKETS,
    MIN_BUCKETS,
    PackResult,
    pack,
    pack_greedy,
)

RESULTS = Path(__file__).parent / "results" / "packing.md"
BUDGET = 4000
MAX_ITEMS = 20


def instance(rng: random.Random, n: int) -> list[ScoredMemory]:
    return [
        ScoredMemory(
            memory=MemoryRecord(id=f"m{i:04d}", content="", category="factual"),
            score=rng.betavariate(2, 3),
            relevance=0.0,
            recency=0.0,
            usefulness=0.0,
            confidence=0.0,
            frequency=0.0,
            tokens=int(min(1500, max(15, rng.lognormvariate(math.log(120), 0.8)))),
        )
        for i in range(n)
    ]


def brute_force(cands: Sequence[ScoredMemory], budget: int, max_items: int) -> float:
    best = 0.0
    for r in range(min(max_items, len(cands)) + 1):
        for combo in itertools.combinations(cands, r):
            if sum(c.tokens for c in combo) <= budget:
                best = max(best, math.fsum(c.score for c in combo))
    return best


def exact_dp(cands: Sequence[ScoredMemory], budget: int, max_items: int) -> float:
    unlimited = 10**12  # one-token buckets and the count dimension always: the exact optimum
    exact = pack(
        cands,
        budget,
        max_items=max_items,
        max_buckets=budget,
        cell_ceiling=unlimited,
        bounded_cell_ceiling=unlimited,
    )
    return exact.total_score


def timed(fn: Callable[[], PackResult]) -> tuple[PackResult, float, float]:
    """The result, wall-clock ms and CPU ms of one call."""
    cpu, wall = time.process_time_ns(), time.perf_counter_ns()
    result = fn()
    return result, (time.perf_counter_ns() - wall) / 1e6, (time.process_time_ns() - cpu) / 1e6


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def run_suite(name: str, n: int, trials: int, oracle: Callable[..., float], seed: int, budget: int) -> str:
    rng = random.Random(seed)
    rows: dict[str, dict[str, list[float]]] = {
        "dp": {"ms": [], "cpu": [], "use": [], "ratio": []},
        "greedy": {"ms": [], "cpu": [], "use": [], "ratio": []},
    }
    methods: dict[str, int] = {}
    for _ in range(trials):
        cands = instance(rng, n)
        best = oracle(cands, budget, MAX_ITEMS)
        for label, fn in (
            ("dp", lambda c=cands: pack(c, budget, max_items=MAX_ITEMS)),
            ("greedy", lambda c=cands: pack_greedy(c, budget, max_items=MAX_ITEMS)),
        ):
            result, ms, cpu = timed(fn)
            assert result.total_tokens <= budget and len(result.selected) <= MAX_ITEMS
            rows[label]["ms"].append(ms)
            rows[label]["cpu"].append(cpu)
            rows[label]["use"].append(100.0 * result.total_tokens / budget)
            rows[label]["ratio"].append(result.total_score / best if best > 0 else 1.0)
            if label == "dp":
                methods[result.method] = methods.get(result.method, 0) + 1
    lines = [
        f"### {name}: n = {n}, budget = {budget}, max_items = {MAX_ITEMS}, {trials} instances",
        "",
        "| packer | wall p50 (ms) | wall p99 (ms) | CPU p50 (ms) | CPU p99 (ms) | budget used, mean "
        "| score / optimum, mean | min | optimal (±1e-9) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, data in rows.items():
        optimal = sum(1 for r in data["ratio"] if r >= 1 - 1e-9) / len(data["ratio"])
        lines.append(
            f"| {label} | {pct(data['ms'], 0.5):.3f} | {pct(data['ms'], 0.99):.3f} | "
            f"{pct(data['cpu'], 0.5):.3f} | {pct(data['cpu'], 0.99):.3f} | "
            f"{statistics.fmean(data['use']):.1f} % | {statistics.fmean(data['ratio']):.4f} | "
            f"{min(data['ratio']):.4f} | {100 * optimal:.0f} % |"
        )
    lines += ["", f"DP packer methods taken: {methods}", ""]
    return "\n".join(lines)


def main() -> None:
    # Warm numpy and the code paths once before timing.
    warm = random.Random(0)
    for _ in range(20):
        pack(instance(warm, 100), BUDGET, max_items=MAX_ITEMS)
    sections = [
        run_suite("Small, brute-force oracle", 12, 300, brute_force, seed=1, budget=600),
        run_suite("Production size, exact-DP oracle", 100, 300, exact_dp, seed=2, budget=BUDGET),
        run_suite("Production size, 50 candidates", 50, 300, exact_dp, seed=3, budget=BUDGET),
        run_suite("Tight budget (1500 tokens; the count binds too)", 100, 300, exact_dp, seed=4, budget=1500),
    ]
    load = os.getloadavg()[0]
    header = f"""# Packer benchmark

Generated by `python benchmarks/packing.py`; re-run to refresh.

## Setup

- Machine: {platform.machine()}, 2 vCPU shared with other jobs (timings are noisy upward, single
  process, no pinning), {platform.system()} {platform.release()}
- Python {sys.version.split()[0]}, numpy {np.__version__}
- Instances: scores ~ Beta(2, 3); token costs ~ log-normal (median 120, sigma 0.8) clipped to
  [15, 1500]; ids unique. Seeds fixed (1, 2, 3, 4). With budget 4000 and max_items 20 the item
  count usually binds; in the last suite (budget 1500) both the token budget and the count bind.
- Load: the machine's 1-minute load average was {load:.2f} when the run ended
  (other agents' jobs share the 2 vCPUs), so the p99 columns include scheduling noise.
- Packer settings: MAX_BUCKETS = {MAX_BUCKETS}, MIN_BUCKETS = {MIN_BUCKETS},
  DP_CELL_CEILING = {DP_CELL_CEILING:,} cells (1-D), DP_BOUNDED_CELL_CEILING =
  {DP_BOUNDED_CELL_CEILING:,} cells (with the count dimension).
- "greedy" is plain skip-and-continue in score order with the same 3-miss stop (the original
  design's packer).
- Times per `pack()` call, including sorting, reduction and repair: wall-clock
  (`perf_counter_ns`) and CPU (`process_time_ns`, less sensitive to the other jobs'
  scheduling). 20 warm-up calls first; GC on.

## Results
"""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(header + "\n" + "\n".join(sections))
    print(RESULTS.read_text())


if __name__ == "__main__":
    main()
