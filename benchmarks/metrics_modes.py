"""Metrics of several worker processes: one port per worker vs prometheus_client's
multiprocess mode, measured where they differ.

* Per observation: a labelled histogram ``observe`` and a counter ``inc``, the
  operations a call makes ~40 of (ADR-0006), in one process of each mode
  (multiprocess mode keeps values in mmap'd files chosen at import time).
* Per scrape: rendering the registry of one worker (ports) vs merging the files of
  ``workers`` processes (multiprocess mode) with the service's metric families.
* What multiprocess mode does not carry over is listed in the results file.

    PYTHONPATH=service .venv/bin/python -m benchmarks.metrics_modes --out benchmarks/results/metrics-modes.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

_CHILD = r"""
import json, os, sys, time
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from ibex_context.observability.metrics import Metrics

mode, workers, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
registry = CollectorRegistry()
histogram = Histogram("bench_seconds", "h", ["stage"], registry=registry, buckets=(0.001, 0.01, 0.1))
counter = Counter("bench_calls", "c", ["code"], registry=registry)
h, c = histogram.labels("cold"), counter.labels("OK")
for _ in range(1000):
    h.observe(0.002); c.inc()
t = time.process_time_ns()
for _ in range(n):
    h.observe(0.002)
observe_ns = (time.process_time_ns() - t) / n
t = time.process_time_ns()
for _ in range(n):
    c.inc()
inc_ns = (time.process_time_ns() - t) / n
out = {"observe_ns": observe_ns, "inc_ns": inc_ns}
if mode == "ports":
    metrics = Metrics(CollectorRegistry())
    t = time.process_time_ns()
    for _ in range(20):
        generate_latest(metrics.registry)
    out["scrape_ms"] = (time.process_time_ns() - t) / 20 / 1e6
else:
    from prometheus_client import multiprocess
    # The service's families as each worker would write them (pid-named files).
    import prometheus_client.values as values
    for pid in range(workers):
        values.ValueClass = values.MultiProcessValue(lambda pid=pid: 100000 + pid)
        Metrics(CollectorRegistry())
    merged = CollectorRegistry()
    multiprocess.MultiProcessCollector(merged)
    t = time.process_time_ns()
    for _ in range(20):
        generate_latest(merged)
    out["scrape_ms"] = (time.process_time_ns() - t) / 20 / 1e6
print(json.dumps(out))
"""


def _run(mode: str, workers: int, n: int) -> dict[str, float]:
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as directory:
        if mode == "multiprocess":
            env["PROMETHEUS_MULTIPROC_DIR"] = directory
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, mode, str(workers), str(n)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for mode in ("ports", "multiprocess"):
        runs = [_run(mode, args.workers, args.iterations) for _ in range(args.rounds)]
        rows.append((mode, runs))
    lines = [
        "# Metrics of several workers: one port per worker vs multiprocess mode",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, `python -m benchmarks.metrics_modes` "
        f"({args.rounds} rounds of {args.iterations:,} operations; CPU time; median of the rounds).",
        "",
        "| mode | histogram observe ns | counter inc ns | scrape ms (the service's families) |",
        "|---|---:|---:|---:|",
    ]
    for mode, runs in rows:

        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return sorted(r[key] for r in runs)[len(runs) // 2]

        label = (
            "one port per worker" if mode == "ports" else f"multiprocess mode, {args.workers} workers' files"
        )
        lines.append(f"| {label} | {med('observe_ns'):.0f} | {med('inc_ns'):.0f} | {med('scrape_ms'):.2f} |")
    lines += [
        "",
        "What multiprocess mode would also change (prometheus_client documentation and source):",
        "",
        '- no exemplars (values.py: "TODO: Implement exemplars for multiprocess mode"): the trace ids on',
        "  `ibex_context_assembly_duration_seconds` (ADR-0006) are dropped;",
        "- a `Gauge.set_function` value never reaches the merged view, which reads only the files: the",
        "  post-response queue depth is read that way today;",
        "- gauges need a `multiprocess_mode` (e.g. `livesum` for in-flight calls), and a dead worker's",
        "  files must be removed (`mark_process_dead`) or its last values linger;",
        "- every worker's values go through mmap'd files in a directory that must be emptied at start.",
        "",
        f"Setup: {os.cpu_count()} vCPU ({platform.machine()}), python {platform.python_version()}, "
        f"prometheus_client {version('prometheus_client')}; load average {os.getloadavg()[0]:.2f}.",
    ]
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
