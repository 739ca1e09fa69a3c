# ruff: noqa: E501  (help texts read better unwrapped)
# The command line of loadtest/run and its scenario presets. The docstring is the --help text.
"""One load-test run on this machine: stores, service, seed, locust, metrics, report.

    loadtest/run --scenario smoke
    loadtest/run --scenario baseline --rps 50 --duration 60
    loadtest/run --scenario agent-loop --rps 150               # agent loops: a question, 0-8 tool calls
    loadtest/run --scenario baseline --rps 600 --profile        # + py-spy profile of the server
    loadtest/run --scenario baseline --embedder hashing         # TOY embedder: isolates the rest's cost
    loadtest/run --scenario noisy-neighbour --rps 150 --quiet-rps 5   # org A floods, org B beside it

The service embeds queries with the real embedder (all-MiniLM-L6-v2, ``--embedder minilm``)
unless told otherwise, and the stored vectors come from the same embedder. ``hashing`` is a
toy (its vectors carry words, not meaning) for isolating what the rest of the call costs.

Steps: start Redis and PostgreSQL+pgvector (``ibex_context.devtools.embedded``) in a data dir,
migrate and seed (``loadtest.seed``; a data dir seeded with the same parameters is
reused, one seeded with others is refused unless ``--reseed``; Redis and PostgreSQL pinned
to the load generator's CPU), start
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtest.arrivals import ARRIVALS
from loadtest.machine import ROOT
from loadtest.vectors import VECTORS

# The service's embedders a run can use. minilm is the real one; hashing is a toy that
# isolates the rest of the call's cost (its vectors carry words, not meaning).
EMBEDDERS = ("minilm", "hashing")
TOY_EMBEDDERS = frozenset({"hashing"})
# The chart's values: where the server has its CPUs to itself, the run gives the inference
# threads the priority the chart deploys them with (loadtest.options.worker_nice).
CHART_VALUES = ROOT / "charts" / "ibex-context" / "values.yaml"
WORKER_NICE_VARIABLE = "IBEX_EMBEDDING_WORKER_NICE"
# Above this many memories, --seed-embedder auto stores vectors drawn from the model of
# MiniLM's (loadtest.vectors): MiniLM takes ~37 ms of a core per seeded memory here.
MINILM_SEED_MAX = 2_000


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
    # The request mix (locust's --scenario-weights); "" is the locustfile's default mix.
    scenario_weights: str = ""
    # Two tenants (loadtest/locustfile.py NoisyTenant, QuietTenant): org A floods at ``rps``,
    # org B calls at --quiet-rps, each with its own org-bound token (--secure implied).
    tenants: bool = False
    # The gate (--p99-ms, --max-fallback-rate): of the quiet tenant alone in a tenants run.
    p99_ms: float = 50.0
    max_fallback_rate: float = 0.001


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("smoke", 5, 200, 40, 30, 4, description="CI smoke: small data, low rate"),
        Scenario("baseline", 100, 1000, 200, 60, 30, description="100 agents x 1k memories at 200 RPS"),
        Scenario("step", 100, 1000, 400, 45, 30, description="one step of the max-RPS search"),
        # The baseline's data, every call part of an agent loop's turn: the user's question,
        # then 0-8 tool calls with the same last user message (loadtest/workload.py).
        Scenario(
            "agent-loop",
            100,
            1000,
            150,
            60,
            30,
            description="baseline data, agent loops: a question then 0-8 tool calls",
            scenario_weights="agent_loop=1",
        ),
        # Issue 39's "measured by": one org floods, another calls steadily beside it.
        Scenario(
            "noisy-neighbour",
            100,
            1000,
            150,
            60,
            15,
            description="baseline data; org A floods at --rps, org B calls at --quiet-rps (own tokens)",
            tenants=True,
            p99_ms=45.0,
            max_fallback_rate=0.01,
        ),
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
        # The shapes of issue 13 (the matrix's "shapes" step), with the embedder's vectors
        # (above MINILM_SEED_MAX memories, MiniLM's drawn from the model of its own, or the
        # hashing toy's with --embedder hashing): random unit vectors have no neighbourhoods
        # for an approximate index to find (HNSW recall@50 0.40 at 10k, ADR-0009).
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
    p.add_argument("--vectors", choices=VECTORS)
    p.add_argument(
        "--embedder",
        choices=EMBEDDERS,
        default="minilm",
        help="the service's embedder: minilm (default) is the real one (all-MiniLM-L6-v2) users run;"
        " hashing is a TOY for isolating costs (lexical only: no user who wants meaning runs it)",
    )
    p.add_argument(
        "--seed-embedder",
        choices=("auto", *EMBEDDERS),
        default="auto",
        help="embedder of the stored vectors (with --vectors embedder). auto: --embedder's, so the stored"
        f" vectors and the query's live in the same space, up to {MINILM_SEED_MAX:,} memories; above, the"
        " hashing toy's (MiniLM costs ~0.2 s of CPU per seeded memory here: hours for 100k; a call's cost"
        " does not depend on the stored vectors), said so in the report. minilm: MiniLM whatever the size",
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
    p.add_argument(
        "--arrivals",
        choices=ARRIVALS,
        default="poisson",
        help="when the users call (loadtest.arrivals): poisson, independent as a fleet's calls;"
        " paced, each at a phase fixed for the run (the runs before 2026-12-05)",
    )
    p.add_argument(
        "--scenario-weights",
        default=None,
        help="request mix, e.g. new_session=5,agent_loop=1 (default: the scenario's; see loadtest/workload.py)",
    )
    p.add_argument("--server-cpus", default="0")
    p.add_argument(
        "--worker-nice",
        type=int,
        default=None,
        help="the minilm inference threads' nice value (IBEX_EMBEDDING_WORKER_NICE). Default: the"
        " variable when set; else the chart's config.embeddingWorkerNice when the server has its CPUs"
        " to itself (as a pod has its own cgroup), 0 when it shares them with the stores or locust",
    )
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
    p.add_argument("--p99-ms", type=float, help="gate: p99 below this (default: the scenario's, 50)")
    p.add_argument("--max-fallback-rate", type=float, help="gate (default: the scenario's, 0.001)")
    p.add_argument(
        "--quiet-rps",
        type=float,
        default=5.0,
        help="noisy-neighbour: the quiet org's rate, beside the flooding org's --rps",
    )
    p.add_argument(
        "--noisy-rate-limit",
        type=float,
        default=None,
        help="noisy-neighbour: the flooding org's admission.ratePerSecond (a ContextProfile for its org);"
        " default: none, the service's defaults",
    )
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
    p.add_argument(
        "--reseed",
        action="store_true",
        help="seed the data dir again, even if it holds a data set (of these parameters or others)",
    )
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
        "scenario_weights",
        "p99_ms",
        "max_fallback_rate",
    ):
        if getattr(args, name) is None:
            setattr(args, name, getattr(preset, name))
    args.vectors, args.seed_embedder, args.seed_embedder_why = seed_embedder(args)
    if args.stores_cpus is None:
        args.stores_cpus = args.locust_cpus
    elif args.stores_cpus == "any":
        args.stores_cpus = None
    args.worker_nice, args.worker_nice_why = worker_nice(args, os.environ)
    args.tenants = preset.tenants
    if args.tenants:
        args.secure = True  # each tenant's own org-bound token
    elif args.noisy_rate_limit is not None:
        p.error("--noisy-rate-limit: only with a scenario of two tenants (noisy-neighbour)")
    args.label = args.label or args.scenario
    args.argv = raw
    return args


def worker_nice(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[int, str]:
    """The inference threads' nice value for the run, and why (for the report).

    The chart deploys them at ``config.embeddingWorkerNice``, below the event loop in the
    pod's own cgroup, where they compete with nothing but the process. Here that holds
    only while the server's CPUs are its own: on CPUs shared with the stores or locust a
    niced worker would yield to them too, which no pod's does, so it runs at the
    service's default."""
    if args.worker_nice is not None:
        return args.worker_nice, "--worker-nice"
    if WORKER_NICE_VARIABLE in environ:
        return int(environ[WORKER_NICE_VARIABLE]), f"{WORKER_NICE_VARIABLE} from the environment"
    server = cpu_set(args.server_cpus)
    others = [cpu_set(args.stores_cpus), cpu_set(args.locust_cpus)]
    if server is None or any(cpus is None or cpus & server for cpus in others):
        return (
            service_worker_nice(),
            "the service's default: the server shares CPUs with the stores or locust",
        )
    return chart_worker_nice(), "the chart's config.embeddingWorkerNice: the server has its CPUs to itself"


def service_worker_nice() -> int:
    from ibex_context.settings import Settings

    default: int = Settings.model_fields["embedding_worker_nice"].default
    return default


def chart_worker_nice(values: Path = CHART_VALUES) -> int:
    import yaml

    return int(yaml.safe_load(values.read_text())["config"]["embeddingWorkerNice"])


def cpu_set(spec: str | None) -> frozenset[int] | None:
    """A taskset CPU list (``"0"``, ``"0,2"``, ``"0-3"``) as a set; None or empty: any CPU."""
    if not spec:
        return None
    cpus: set[int] = set()
    for part in spec.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def seed_embedder(args: argparse.Namespace) -> tuple[str, str, str]:
    """The stored vectors' kind (``--vectors``), their embedder (``--seed-embedder``) and why
    (for the report)."""
    if args.seed_embedder != "auto":
        return args.vectors, args.seed_embedder, "--seed-embedder"
    total = args.agents * args.memories + args.large_agents * args.large_memories
    if args.embedder in TOY_EMBEDDERS or total <= MINILM_SEED_MAX or args.vectors != "embedder":
        return args.vectors, args.embedder, "the service's embedder (--seed-embedder auto)"
    return (
        "shaped",
        args.embedder,
        (
            f"drawn from the model of {args.embedder}'s vectors (loadtest.vectors; --seed-embedder auto:"
            f" {total:,} memories is over {MINILM_SEED_MAX:,}, and MiniLM takes ~37 ms of a core per seeded"
            " memory here), not each text's own: the graph search costs what it would on real vectors"
            " (benchmarks.agent_graph --check), what it finds is not about the question"
        ),
    )


def dataset_key(args: argparse.Namespace) -> str:
    raw = f"{args.agents}x{args.memories}-L{args.large_agents}x{args.large_memories}-{args.vectors}-{args.seed_embedder}"
    if args.embedding_storage != "schema":
        raw += f"-{args.embedding_storage}"
    return f"{raw}-{hashlib.sha1(f'{raw}-{args.seed}'.encode()).hexdigest()[:8]}"
