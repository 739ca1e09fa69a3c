# ruff: noqa: E501  (help texts read better unwrapped)
# The command line of loadtest/run and its scenario presets. The docstring is the --help text.
"""One load-test run on this machine: stores, service, seed, locust, metrics, report.

    loadtest/run --scenario smoke
    loadtest/run --scenario baseline --rps 200 --duration 60
    loadtest/run --scenario baseline --rps 600 --profile        # + py-spy profile of the server

Steps: start Redis and PostgreSQL+pgvector (``ibex_context.devtools.embedded``) in a data dir,
migrate and seed (``loadtest.seed``; a data dir seeded with the same parameters is
reused; Redis and PostgreSQL pinned to the load generator's CPU), start
``ibex-context serve`` pinned to CPU 0 (``taskset``), run locust headless pinned to
CPU 1 at a constant arrival rate, scrape the service's own
``/metrics`` after the warm-up and at the end (per-stage histogram deltas -> mean and
approximate p99), read the server's CPU time from ``/proc``, gate on p99 and fallback
rate, and write ``benchmarks/results/loadtest/<date>-<scenario>.md``. The exit code is locust's
gate (0: passed).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.machine import ROOT


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    agents: int
    memories: int
    rps: float
    duration: float
    warmup: float
    large_agents: int = 0
    large_memories: int = 0
    vectors: str = "embedder"
    description: str = ""


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("smoke", 5, 200, 40, 30, 4, description="CI smoke: small data, low rate"),
        Scenario("baseline", 100, 1000, 200, 60, 30, description="100 agents x 1k memories at 200 RPS"),
        Scenario("step", 100, 1000, 400, 45, 30, description="one step of the max-RPS search"),
        Scenario(
            "large-agent",
            1,
            100_000,
            50,
            60,
            10,
            vectors="random",
            description="one agent x 100k memories (HNSW): cold-search latency",
        ),
        Scenario(
            "big",
            100,
            10_000,
            200,
            60,
            30,
            vectors="random",
            description="100 agents x 10k memories (1M rows)",
        ),
        # The shapes of issue 13 (the matrix's "shapes" step), with the hashing embedder's
        # vectors of each memory's text: random unit vectors have no neighbourhoods for
        # an approximate index to find (HNSW recall@50 0.40 at 10k, ADR-0009).
        Scenario(
            "agents-10k",
            100,
            10_000,
            50,
            60,
            30,
            description="100 agents x 10k memories (1M rows), embedder vectors",
        ),
        Scenario(
            "agents-1k",
            1000,
            1000,
            50,
            60,
            30,
            description="1,000 agents x 1k memories (1M rows)",
        ),
        Scenario(
            "agents-100k",
            10,
            100_000,
            50,
            60,
            30,
            description="10 agents x 100k memories (1M rows)",
        ),
        Scenario(
            "one-1m",
            1,
            1_000_000,
            50,
            60,
            30,
            description="1 agent x 1M memories",
        ),
        Scenario(
            "mixed",
            505,
            1000,
            50,
            60,
            30,
            large_agents=5,
            large_memories=100_000,
            description="5 agents x 100k among 500 x 1k (1M rows)",
        ),
    )
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    raw = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(
        prog="loadtest/run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="smoke")
    p.add_argument("--label", help="name of the results file (default: the scenario)")
    p.add_argument("--rps", type=float, help="offered arrival rate")
    p.add_argument("--duration", type=float, help="measured seconds (after the warm-up)")
    p.add_argument("--warmup", type=float)
    p.add_argument("--agents", type=int)
    p.add_argument("--memories", type=int, help="memories per agent")
    p.add_argument("--large-agents", type=int)
    p.add_argument("--large-memories", type=int)
    p.add_argument("--vectors", choices=("embedder", "random"))
    p.add_argument(
        "--embedder", choices=("hashing", "minilm"), default="hashing", help="the service's embedder"
    )
    p.add_argument(
        "--seed-embedder",
        choices=("hashing", "minilm"),
        default="hashing",
        help="embedder of the stored vectors (with --vectors embedder)",
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="seeding processes")
    p.add_argument("--seed-only", action="store_true", help="start the stores, seed, stop")
    p.add_argument(
        "--embedding-storage",
        choices=("schema", "plain"),
        default="schema",
        help="plain: EXPERIMENT, store vectors inline (see loadtest/pgcheck.py)",
    )
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--seed", type=int, default=20261122)
    p.add_argument("--workers", type=int, default=1, help="server processes (SO_REUSEPORT)")
    p.add_argument("--rps-per-user", type=float, default=10.0)
    p.add_argument("--scenario-weights", default="")
    p.add_argument("--server-cpus", default="0")
    p.add_argument(
        "--pg-shared-buffers",
        default="1GB",
        help="PostgreSQL's shared_buffers for the run (a 1M-memory shape's rows, postings and graphs"
        " need several GB to stay in PostgreSQL's own cache)",
    )
    p.add_argument("--locust-cpus", default="1")
    p.add_argument(
        "--stores-cpus",
        default=None,
        help="pin Redis and PostgreSQL (default: the load generator's CPUs, so the server has a core "
        "of its own, as it would beside remote stores; 'any': not pinned)",
    )
    p.add_argument("--p99-ms", type=float, default=50.0)
    p.add_argument("--max-fallback-rate", type=float, default=0.001)
    p.add_argument("--max-failure-rate", type=float, default=0.001)
    p.add_argument(
        "--secure",
        action="store_true",
        help="TLS on the gRPC port and bearer-token authentication, as the chart deploys it "
        "(a CA, certificate and token made for the run)",
    )
    p.add_argument("--profile", action="store_true", help="record a py-spy profile of the server")
    p.add_argument("--profile-seconds", type=float, default=30.0)
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--reseed", action="store_true")
    p.add_argument("--out-dir", default=str(ROOT / "loadtest" / "out"))
    p.add_argument("--results-dir", default=str(ROOT / "benchmarks" / "results" / "loadtest"))
    p.add_argument("--no-results", action="store_true", help="do not write a results file")
    p.add_argument("--start-timeout", type=float, default=60.0)
    p.add_argument("--server-log-level", default="WARNING")
    p.add_argument(
        "--export-during",
        action="store_true",
        help="export every seeded memory (ibex-context export, per org) during the measured window",
    )
    args = p.parse_args(raw)
    preset = SCENARIOS[args.scenario]
    for name in (
        "rps",
        "duration",
        "warmup",
        "agents",
        "memories",
        "large_agents",
        "large_memories",
        "vectors",
    ):
        if getattr(args, name) is None:
            setattr(args, name, getattr(preset, name))
    if args.stores_cpus is None:
        args.stores_cpus = args.locust_cpus
    elif args.stores_cpus == "any":
        args.stores_cpus = None
    args.label = args.label or args.scenario
    args.argv = raw
    return args


def dataset_key(args: argparse.Namespace) -> str:
    raw = f"{args.agents}x{args.memories}-L{args.large_agents}x{args.large_memories}-{args.vectors}-{args.seed_embedder}"
    if args.embedding_storage != "schema":
        raw += f"-{args.embedding_storage}"
    return f"{raw}-{hashlib.sha1(f'{raw}-{args.seed}'.encode()).hexdigest()[:8]}"
