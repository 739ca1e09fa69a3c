# ruff: noqa: E501  (report templates read better unwrapped)
"""A new agent and a growing agent (issue 40, deliverable 5), against the real service over
gRPC and real embedded stores:

    .venv/bin/python -m benchmarks.growing_agent                  # both parts, ~6 min
    .venv/bin/python -m benchmarks.growing_agent --part writes --server-embeds
    .venv/bin/python -m benchmarks.growing_agent --quick --out /tmp/growing.md   # small sizes

**Promotion** (``--part promotion``): one agent seeded with ``--seeded`` memories, a
little under the exact scan's limit (``cold_exact_max_memories``); AssembleContext for it
at ``--rps`` (Poisson arrivals, each call with the client deadline ``--deadline-ms`` and a
question about one of its memories); then UpsertMemories push it ``--cross-by`` past the
limit, so the service builds the agent's own graph (``stores.postgres.graphs``:
``CREATE INDEX CONCURRENTLY`` on the graph pool's one connection; searched exactly until
``agent_graphs.ready`` and the service's cached state of the agent expires).
The calls go on through the build and ``--after`` seconds past it. Per phase (before,
the crossing writes, during the build, after ready): calls, FULL %, degradation reasons,
client p50/p99, the plans the calls used (``SourceOutcome.detail`` of the cold source),
server and stores CPU per call; the build's duration (``agent_graphs`` polled every
50 ms). The target holds when FULL % during the build is within ``--full-tolerance``
points of FULL % before it.

**Writes while searched** (``--part writes``): one agent of ``--memories`` memories with
its own graph ready; calls at ``--rps`` for ``--baseline`` seconds, then for
``--with-writes`` seconds while a writer (``loadtest.soak.Writer``) upserts
``--writes-per-second`` memories a second into the same agent and deletes as many (each
memory it wrote ``--keep`` writes earlier: the agent's size stays flat). At the end of
each period (the writer stopped), recall@50 of the service's vector search statement
(``stores.postgres.SEARCH_SQL`` of the plan it chooses for the agent) against the exact
scan, ``--recall-queries`` queries as ``benchmarks.cold_plans --queries shaped`` makes
them. The target holds when the write period's p99 is within ``--p99-tolerance`` of the
baseline's, its FULL % within ``--full-tolerance`` points and its mean recall within
``--recall-tolerance``.

Stored vectors are drawn like MiniLM's (``loadtest.vectors``, seeded with ``--vectors
shaped``); the writes send vectors drawn the same way in the API's ``embedding`` field
(the server's embedder stays out of the write cost), or none with ``--server-embeds``
(the service embeds each memory with MiniLM). The service embeds the calls' questions
with MiniLM (``IBEX_EMBEDDER=minilm``, the default users run). Each part seeds a fresh
data directory (``<data-root>/growing-<part>``, removed first: a run changes its data).
The server is pinned to ``--server-cpus``, the stores and this process (client, writer)
to ``--client-cpus``, as ``loadtest/run`` pins them. Writes
``benchmarks/results/growing-agent-<date>.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import math
import os
import random
import shutil
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from ibex_context.pipeline.outcome import plan_of  # noqa: E402
from ibex_context.settings import Settings  # noqa: E402
from ibex_context.stores.cold_plan import ColdPlan, choose_plan  # noqa: E402

from benchmarks.cold_plans import _timed, recall, service_width  # noqa: E402
from loadtest.arrivals import Schedule  # noqa: E402
from loadtest.corpus import churn_words  # noqa: E402
from loadtest.datastores import pin_stores, seed_if_needed, stores, warm_postgres  # noqa: E402
from loadtest.machine import cpu_model, cpu_seconds, git_commit, inherited_settings, versions  # noqa: E402
from loadtest.options import parse_args as loadtest_args  # noqa: E402
from loadtest.server import ServerProcess, start_server, wait_ready  # noqa: E402
from loadtest.soak import Writer, tree_cpu_seconds  # noqa: E402
from loadtest.vectors import VectorShape, fitted_shape  # noqa: E402
from loadtest.workload import Caller as CallerIdentity  # noqa: E402
from loadtest.workload import Workload, build_request  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
# The service's limit: past it an agent gets a graph of its own (one source: the setting).
THRESHOLD = int(Settings.model_fields["cold_exact_max_memories"].default)
# Phases whose calls are left out of the figures: the server's first calls, and the
# recall checks' exact scans competing with the calls for the stores' core.
WARM_UP, RECALL_CHECK, END = "warm-up", "recall check", "end"
EXCLUDED = frozenset({WARM_UP, RECALL_CHECK, END})
# Promotion's phases, in order.
BEFORE, CROSSING, BUILDING, AFTER = "before", "crossing writes", "during the build", "after ready"
# Writes' phases.
BASELINE, WRITES = "baseline", "with writes"
WATCH_INTERVAL_S = 0.05
# The agent's own graph: no row (none), claimed (false: being built) or ready (true).
GRAPH_READY_SQL = "SELECT ready FROM agent_graphs WHERE org_id = $1::uuid AND agent_id = $2::uuid"
QUICK: dict[str, Any] = {
    "threshold": 300,
    "seeded": 280,
    "cross_by": 20,
    "warmup": 2.0,
    "before": 4.0,
    "after": 4.0,
    "build_timeout": 60.0,
    "memories": 800,
    "baseline": 4.0,
    "with_writes": 4.0,
    "writes_per_second": 20.0,
    "keep": 20,
    "recall_queries": 10,
}


def log(message: str) -> None:
    print(f"[{datetime.now(UTC):%H:%M:%S}] {message}", flush=True)


# --------------------------------------------------------------------------- pure: calls and phases


@dataclass(frozen=True, slots=True)
class Call:
    """One AssembleContext call as the client saw it."""

    at: float  # its start, on this process's monotonic clock
    latency_ms: float
    status: str  # "OK" or the gRPC status's name
    level: str = ""  # the degradation level without its prefix, e.g. "FULL" ("" without a response)
    reasons: tuple[str, ...] = ()
    plan: str = ""  # the plan of the cold search, when it answered


def level_name(enum_name: str) -> str:
    """``DEGRADATION_LEVEL_FULL`` -> ``FULL``."""
    return enum_name.removeprefix("DEGRADATION_LEVEL_")


@dataclass(frozen=True, slots=True)
class Mark:
    """A phase's start (and the previous phase's end), with the counters read there."""

    name: str
    at: float
    server_cpu_s: float = 0.0
    stores_cpu_s: float = 0.0
    upserts: int = 0
    deletes: int = 0
    write_errors: int = 0


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (None of nothing)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class PhaseFigures:
    name: str
    seconds: float
    calls: int
    full: int
    p50_ms: float | None
    p99_ms: float | None
    # Degradation reasons of the answered calls, and "rpc <STATUS>" of the failed ones.
    reasons: collections.Counter[str]
    plans: collections.Counter[str]
    server_ms_per_call: float | None
    stores_ms_per_call: float | None
    upserts: int = 0
    deletes: int = 0
    write_errors: int = 0

    @property
    def full_pct(self) -> float | None:
        return 100.0 * self.full / self.calls if self.calls else None

    @property
    def writes_per_second(self) -> float:
        return self.upserts / self.seconds if self.seconds > 0 else 0.0


def summary(
    name: str, calls: Sequence[Call], seconds: float, start: Mark | None = None, end: Mark | None = None
) -> PhaseFigures:
    """The figures of ``calls``; CPU and writes per call from the marks, when given."""
    reasons: collections.Counter[str] = collections.Counter()
    for call in calls:
        reasons.update(call.reasons if call.status == "OK" else (f"rpc {call.status}",))
    latencies = [c.latency_ms for c in calls]

    def per_call(seconds: float) -> float | None:
        return 1000.0 * seconds / len(calls) if calls else None

    return PhaseFigures(
        name=name,
        seconds=seconds,
        calls=len(calls),
        full=sum(1 for c in calls if c.status == "OK" and c.level == "FULL"),
        p50_ms=percentile(latencies, 0.50),
        p99_ms=percentile(latencies, 0.99),
        reasons=reasons,
        plans=collections.Counter(c.plan or "none" for c in calls),
        server_ms_per_call=None
        if start is None or end is None
        else per_call(end.server_cpu_s - start.server_cpu_s),
        stores_ms_per_call=None
        if start is None or end is None
        else per_call(end.stores_cpu_s - start.stores_cpu_s),
        upserts=0 if start is None or end is None else end.upserts - start.upserts,
        deletes=0 if start is None or end is None else end.deletes - start.deletes,
        write_errors=0 if start is None or end is None else end.write_errors - start.write_errors,
    )


def _within(calls: Sequence[Call], start: Mark, end: Mark) -> list[Call]:
    return [c for c in calls if start.at <= c.at < end.at]


def phases(calls: Sequence[Call], marks: Sequence[Mark]) -> list[PhaseFigures]:
    """The figures of the calls that started in each phase (from one mark to the next),
    the excluded phases left out."""
    return [
        summary(a.name, _within(calls, a, b), b.at - a.at, a, b)
        for a, b in itertools.pairwise(marks)
        if a.name not in EXCLUDED
    ]


def by_plan(calls: Sequence[Call], marks: Sequence[Mark]) -> list[PhaseFigures]:
    """The calls of the measured phases, grouped by the plan their cold search used."""
    measured = [
        c for a, b in itertools.pairwise(marks) if a.name not in EXCLUDED for c in _within(calls, a, b)
    ]
    plans = sorted({c.plan or "none" for c in measured})
    return [
        summary(plan, mine, max(c.at for c in mine) - min(c.at for c in mine))
        for plan in plans
        if (mine := [c for c in measured if (c.plan or "none") == plan])
    ]


@dataclass(frozen=True, slots=True)
class RecallFigures:
    """Recall@50 of the service's vector search against the exact scan, over some queries."""

    plan: str
    memories: int
    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values) if self.values else float("nan")

    @property
    def p5(self) -> float:
        ordered = sorted(self.values)
        return ordered[int(len(ordered) * 0.05)] if ordered else float("nan")

    @property
    def low(self) -> float:
        return min(self.values) if self.values else float("nan")


@dataclass(frozen=True, slots=True)
class Verdict:
    holds: bool
    why: str


def full_kept(before: PhaseFigures, during: PhaseFigures, tolerance_pp: float) -> Verdict:
    """Promotion's target: FULL kept during the build, against before it."""
    if before.full_pct is None or during.full_pct is None:
        return Verdict(False, "no calls were measured before or during the build")
    drop = before.full_pct - during.full_pct
    holds = drop <= tolerance_pp
    return Verdict(
        holds,
        f"FULL {during.full_pct:.1f} % during the build ({during.calls} calls) vs {before.full_pct:.1f} % before"
        f" ({before.calls} calls): {'within' if holds else 'more than'} {tolerance_pp:g} points",
    )


def searched_while_written(
    baseline: PhaseFigures,
    writes: PhaseFigures,
    recall_baseline: RecallFigures,
    recall_writes: RecallFigures,
    *,
    p99_tolerance: float,
    full_tolerance_pp: float,
    recall_tolerance: float,
) -> Verdict:
    """Writes' target: the written agent keeps its latency (p99), FULL % and recall."""
    parts: list[tuple[bool, str]] = []
    if baseline.p99_ms is None or writes.p99_ms is None:
        parts.append((False, "no calls measured in a period"))
    else:
        ratio = writes.p99_ms / baseline.p99_ms - 1.0
        parts.append(
            (
                ratio <= p99_tolerance,
                f"p99 {writes.p99_ms:.1f} ms vs {baseline.p99_ms:.1f} ms ({ratio:+.0%}; at most {p99_tolerance:+.0%})",
            )
        )
    if baseline.full_pct is not None and writes.full_pct is not None:
        drop = baseline.full_pct - writes.full_pct
        parts.append(
            (
                drop <= full_tolerance_pp,
                f"FULL {writes.full_pct:.1f} % vs {baseline.full_pct:.1f} % (at most {full_tolerance_pp:g} points less)",
            )
        )
    loss = recall_baseline.mean - recall_writes.mean
    parts.append(
        (
            loss <= recall_tolerance,
            f"recall@50 {recall_writes.mean:.3f} vs {recall_baseline.mean:.3f} (at most {recall_tolerance:g} less)",
        )
    )
    return Verdict(all(ok for ok, _ in parts), "; ".join(text for _, text in parts))


# --------------------------------------------------------------------------- pure: the report


def _fmt(value: float | None, digits: int = 1) -> str:
    return (
        "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"
    )


def _counted(counter: collections.Counter[str], top: int = 4) -> str:
    if not counter:
        return "-"
    return ", ".join(f"{name} {n}" for name, n in counter.most_common(top))


def phase_table(rows: Sequence[PhaseFigures], *, writes: bool = False) -> list[str]:
    head = "| phase | s | calls | FULL % | p50 ms | p99 ms | degradation reasons | plans | server CPU ms/call | stores CPU ms/call |"
    rule = "|---|---:|---:|---:|---:|---:|---|---|---:|---:|"
    if writes:
        head += " writes/s (upserts, deletes, errors) |"
        rule += "---|"
    lines = [head, rule]
    for r in rows:
        line = (
            f"| {r.name} | {r.seconds:.1f} | {r.calls} | {_fmt(r.full_pct)} | {_fmt(r.p50_ms)} | {_fmt(r.p99_ms)}"
            f" | {_counted(r.reasons)} | {_counted(r.plans)} | {_fmt(r.server_ms_per_call, 2)} | {_fmt(r.stores_ms_per_call, 2)} |"
        )
        if writes:
            line += f" {r.writes_per_second:.1f} ({r.upserts}, {r.deletes}, {r.write_errors}) |"
        lines.append(line)
    return lines


@dataclass(slots=True)
class PromotionResult:
    seeded: int
    written: int
    writes_s: float  # the crossing writes, from the first request to the last answer
    rows: list[PhaseFigures]
    plan_rows: list[PhaseFigures]
    build_s: float | None  # claim seen -> ready seen
    claimed_after_s: float | None  # the crossing writes' start -> claim seen
    first_own_graph_after_s: float | None  # ready -> first call on the agent's own graph
    verdict: Verdict


@dataclass(slots=True)
class WritesResult:
    memories: int
    rows: list[PhaseFigures]
    plan_rows: list[PhaseFigures]
    recalls: dict[str, RecallFigures]
    writers: int
    verdict: Verdict


def render(
    options: argparse.Namespace,
    argv: Sequence[str],
    promotion: PromotionResult | None,
    writes: WritesResult | None,
    setup: dict[str, str],
) -> str:
    vectors = (
        "none: the service embeds each written memory with MiniLM (--server-embeds)"
        if options.server_embeds
        else "drawn like MiniLM's (loadtest.vectors), sent in the API's `embedding` field: the server's embedder stays out of the write cost"
    )
    verdicts = [
        f"- {title}: **{'HOLDS' if result.verdict.holds else 'MISSED'}**: {result.verdict.why}."
        for title, result in (("Promotion", promotion), ("Writes while searched", writes))
        if result is not None
    ]
    lines = [
        "# A new agent and a growing agent (issue 40, deliverable 5)",
        "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {git_commit()}. Command: `python -m benchmarks.growing_agent {' '.join(argv)}`"
        + (" (--quick: small sizes, not a measurement)" if options.quick else ""),
        "",
        *verdicts,
        "",
        "## Setup",
        "",
        f"- Machine: {cpu_model()}, {os.cpu_count()} CPUs shared with other engineers' work; {json.dumps(versions())}."
        f" Server pinned to CPU {options.server_cpus}; Redis, PostgreSQL and this process (client and writer) to CPU {options.client_cpus}."
        f" Load average at the start {setup.get('load_start', '-')}, at the end {setup.get('load_end', '-')}.",
        f"- Service: `ibex-context serve`, one worker, embedder **MiniLM** (`IBEX_EMBEDDER=minilm`: all-MiniLM-L6-v2, the default users run) for the calls' questions;"
        f" `cold_exact_max_memories` {options.threshold:,}{' (the default)' if options.threshold == THRESHOLD else f' (IBEX_COLD_EXACT_MAX_MEMORIES; the default is {THRESHOLD:,})'},"
        f" every other setting its default; {setup.get('inherited', '')}.",
        f"- Calls: AssembleContext at {options.rps:g} RPS (Poisson arrivals, one client, each call on its own), deadline {options.deadline_ms:g} ms,"
        " a new session (the load test's `new_session` request: an optional system prompt and a question quoting one of the agent's memories, made unique by a suffix so no call hits the embedding cache);"
        f" the first {options.warmup:g} s of each part are warm-up, not counted. Latency: the client's, start to response (or to the deadline's error).",
        "- Stored vectors: drawn like MiniLM's (`loadtest.seed --vectors shaped`); written vectors: "
        + vectors
        + ".",
        "- CPU per call: user+system over the phase / calls measured in it; the stores' (PostgreSQL with its exited backends, Redis) includes the writer's writes,"
        " the graph build and this tool's polling of `agent_graphs` (every 50 ms).",
        "",
    ]
    if promotion is not None:
        lines += [
            "## Promotion: an agent crossing to a graph of its own",
            "",
            f"One agent seeded with {promotion.seeded:,} memories; after {options.before:g} s of calls, {promotion.written} memories upserted"
            f" in batches of {options.batch} in {promotion.writes_s:.2f} s ({promotion.seeded + promotion.written:,} in all, {options.cross_by} past the limit), then calls through the build"
            f" and {options.after:g} s after it. The build (the claim in `agent_graphs` to `ready`, seen by polling): **{_fmt(promotion.build_s, 2)} s**,"
            f" claimed {_fmt(promotion.claimed_after_s, 2)} s after the crossing writes began. First call on the agent's own graph"
            f" {_fmt(promotion.first_own_graph_after_s, 1)} s after ready (the service caches an agent's size and graph state for 60 s, `stores.cold_plan.AgentSizes`).",
            "",
            *phase_table(promotion.rows),
            "",
            "By the plan the calls used (all measured phases):",
            "",
            *phase_table(promotion.plan_rows),
            "",
        ]
    if writes is not None:
        lines += [
            "## Writes while searched",
            "",
            f"One agent of {writes.memories:,} memories with its graph of its own ready; {options.baseline:g} s of calls, then {options.with_writes:g} s of calls while"
            f" {writes.writers} writer(s) (`loadtest.soak.Writer`, one UpsertMemories of {options.write_batch} memories and one DeleteMemories of as many written {options.keep} writes earlier, in turn)"
            f" aim at {options.writes_per_second:g} upserts/s into the same agent. Recall@50 at the end of each period (the writer stopped, calls going on but not counted):"
            f" the service's statement for the plan it chooses against the exact scan, {options.recall_queries} queries (`benchmarks.cold_plans` shaped: a stored vector plus a real MiniLM question's offset), one connection, the service's ef_search for the agent's size.",
            "",
            *phase_table(writes.rows, writes=True),
            "",
            "| recall@50 at the end of | plan | memories | mean | p5 | min |",
            "|---|---|---:|---:|---:|---:|",
            *(
                f"| {name} | {r.plan} | {r.memories:,} | {r.mean:.3f} | {r.p5:.2f} | {r.low:.2f} |"
                for name, r in writes.recalls.items()
            ),
            "",
            "By the plan the calls used (both periods):",
            "",
            *phase_table(writes.plan_rows),
            "",
        ]
    lines += ["## Commands", "", *(f"- {k}: `{v}`" for k, v in setup.items() if k.endswith("_cmd")), ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- I/O: the client


class Caller:
    """AssembleContext for the agents of ``workload`` at ``rate`` a second (Poisson arrivals,
    each call a task of its own: a slow call never delays the next), in a thread of its own."""

    def __init__(self, port: int, workload: Workload, rate: float, deadline_s: float, seed: int) -> None:
        self._port, self._workload, self._rate, self._deadline_s = port, workload, rate, deadline_s
        self._rng = random.Random(seed)
        self._identity = CallerIdentity(session_id=str(uuid.UUID(int=seed, version=4)))
        self.calls: list[Call] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._run()), name="growing-caller", daemon=True
        )

    def __enter__(self) -> Caller:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    async def _run(self) -> None:
        import grpc
        from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
        from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

        async with grpc.aio.insecure_channel(f"127.0.0.1:{self._port}") as channel:
            stub = context_pb2_grpc.ContextAssemblyServiceStub(channel)  # type: ignore[no-untyped-call]

            async def one(request: Any) -> None:
                at = time.monotonic()
                try:
                    reply = await stub.AssembleContext(request, timeout=self._deadline_s)
                except grpc.aio.AioRpcError as exc:
                    self.calls.append(Call(at, (time.monotonic() - at) * 1000, exc.code().name))
                    return
                latency = (time.monotonic() - at) * 1000
                meta = reply.metadata
                plan = next((plan_of(s.detail) or "" for s in meta.sources if s.source == "cold"), "")
                self.calls.append(
                    Call(
                        at,
                        latency,
                        "OK",
                        level_name(pb.DegradationLevel.Name(meta.degradation_level)),
                        tuple(meta.degradation_reasons),
                        plan,
                    )
                )

            running: set[asyncio.Task[None]] = set()
            schedule = Schedule("poisson", self._rate, self._rng, time.monotonic())
            await asyncio.sleep(schedule.first_wait(time.monotonic()))
            while not self._stop.is_set():
                request = build_request(self._workload, self._identity, self._rng, "new_session")
                task = asyncio.create_task(one(request))
                running.add(task)
                task.add_done_callback(running.discard)
                await asyncio.sleep(schedule.next_wait(time.monotonic()))
            await asyncio.gather(*running, return_exceptions=True)


def shaped_vectors(count: int, seed: int) -> Iterator[list[float]]:
    """Vectors drawn like MiniLM's (``loadtest.vectors``), ``count`` of them, cycled."""
    drawn, _ = VectorShape.load(fitted_shape()).draw(count, np.random.default_rng(seed))
    return itertools.cycle(row.tolist() for row in drawn)


async def upsert(
    port: int, agent: dict[str, Any], count: int, batch: int, vectors: Iterator[list[float]] | None, seed: int
) -> int:
    """``count`` new memories for ``agent`` in batches of ``batch``; returns how many were created."""
    import grpc
    from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
    from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

    rng = random.Random(seed)
    created = 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = context_pb2_grpc.MemoryServiceStub(channel)  # type: ignore[no-untyped-call]
        for start in range(0, count, batch):
            memories = []
            for _ in range(min(batch, count - start)):
                memory = pb.MemoryInput(
                    content=f"{churn_words(rng)} #{rng.randrange(10**9)}", category="episodic"
                )
                if vectors is not None:
                    memory.embedding.extend(next(vectors))
                memories.append(memory)
            reply = await stub.UpsertMemories(
                pb.UpsertMemoriesRequest(
                    org_id=agent["org_id"], agent_id=agent["agent_id"], memories=memories
                ),
                timeout=60,
            )
            created += sum(1 for r in reply.results if r.outcome == pb.UPSERT_OUTCOME_CREATED)
    return created


# --------------------------------------------------------------------------- I/O: the stores


@dataclass(slots=True)
class Stage:
    """The running stores and service of one part, and what it reads at each mark."""

    dsn: str
    agent: dict[str, Any]
    workload: Workload
    server: ServerProcess
    store_pids: list[int]
    writers: list[Writer] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)

    def mark(self, name: str) -> Mark:
        mark = Mark(
            name,
            time.monotonic(),
            cpu_seconds(self.server.proc.pid),
            sum(tree_cpu_seconds(pid) for pid in self.store_pids),
            sum(w.upserts for w in self.writers),
            sum(w.deletes for w in self.writers),
            sum(w.errors for w in self.writers),
        )
        self.marks.append(mark)
        log(f"{name}")
        return mark


async def graph_state(dsn: str, agent: dict[str, Any]) -> tuple[bool, bool]:
    """(claimed, ready) of the agent's own graph in ``agent_graphs``."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        ready = await conn.fetchval(
            GRAPH_READY_SQL,
            agent["org_id"],
            agent["agent_id"],
        )
    finally:
        await conn.close()
    return ready is not None, bool(ready)


async def watch_graph(
    dsn: str, agent: dict[str, Any], mark: Callable[[str], Mark], timeout: float
) -> tuple[Mark | None, Mark | None]:
    """Polls ``agent_graphs`` every ``WATCH_INTERVAL_S``: marks the build's start (the claim
    seen) and its end (ready seen); (None, None) or (claim, None) on timeout."""
    import asyncpg

    claimed: Mark | None = None
    conn = await asyncpg.connect(dsn)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready = await conn.fetchval(
                GRAPH_READY_SQL,
                agent["org_id"],
                agent["agent_id"],
            )
            if ready is not None and claimed is None:
                claimed = mark(BUILDING)
            if ready:
                return claimed, mark(AFTER)
            await asyncio.sleep(WATCH_INTERVAL_S)
    finally:
        await conn.close()
    return claimed, None


async def cross(
    s: Stage, count: int, batch: int, vectors: Iterator[list[float]] | None, timeout: float, seed: int
) -> tuple[int, float, Mark | None, Mark | None]:
    """The crossing writes, watched: (memories created, seconds the writes took, the
    build's start and end marks)."""
    watching = asyncio.create_task(watch_graph(s.dsn, s.agent, s.mark, timeout))
    started = time.monotonic()
    created = await upsert(s.server.grpc_port, s.agent, count, batch, vectors, seed)
    took = time.monotonic() - started
    building, ready = await watching
    return created, took, building, ready


async def promote_if_grown(dsn: str, threshold: int) -> int:
    """Builds the own graph of every agent past ``threshold`` as the service would, sparse
    or dense by its size (the seed does it for the default limit only: a lower
    ``--threshold`` needs it here)."""
    from ibex_context.stores.postgres import create_pool
    from ibex_context.stores.postgres.graphs import AgentGraphs

    sparse_max = Settings.model_fields["cold_sparse_graph_max_memories"].default
    pool = await create_pool(dsn, min_size=1, max_size=1, ef_search=64)
    try:
        return await AgentGraphs(pool, min_memories=threshold, sparse_max_memories=sparse_max).promote_grown()
    finally:
        await pool.close()


async def measure_recall(dsn: str, agent: dict[str, Any], queries: int, seed: int) -> RecallFigures:
    """Recall@50 of the statement of the plan the service would choose for the agent now,
    against the exact scan, for ``queries`` shaped queries about its stored vectors."""
    from ibex_context.stores.postgres import create_pool
    from ibex_context.stores.postgres.graphs import AGENT_STATE_SQL, own_graph_plan

    width = service_width()
    shape = VectorShape.load(fitted_shape())
    rng = np.random.default_rng(seed)
    pool = await create_pool(dsn, min_size=1, max_size=1, ef_search=width.ef_search)
    try:
        async with pool.acquire() as conn:
            record = await conn.fetchrow(
                "SELECT org_id, agent_id, memories FROM memory_stats WHERE org_id = $1::uuid AND agent_id = $2::uuid",
                agent["org_id"],
                agent["agent_id"],
            )
            state = await conn.fetchrow(AGENT_STATE_SQL, record["org_id"], record["agent_id"])
            plan = choose_plan(own_graph_plan(state))
            rows = await conn.fetch(
                "SELECT embedding FROM memories WHERE org_id = $1 AND agent_id = $2 ORDER BY id LIMIT 400",
                record["org_id"],
                record["agent_id"],
            )
            stored = np.stack([r["embedding"] for r in rows])
            asked = shape.questions(
                stored[rng.choice(len(stored), size=queries, replace=len(stored) < queries)], rng
            )
            values = []
            for question in asked:
                q = np.asarray(question / np.linalg.norm(question), dtype=np.float32)
                truth = (await _timed(conn, ColdPlan.EXACT, record, q, width, width.ef_search)).distances
                found = (await _timed(conn, plan, record, q, width, width.ef_search)).distances
                values.append(recall(truth, found))
    finally:
        await pool.close()
    return RecallFigures(plan.value, int(state[0]), tuple(values))


# --------------------------------------------------------------------------- I/O: the parts


@contextlib.contextmanager
def pinned(cpus: str | None) -> Iterator[None]:
    """This process (its client and writer threads) on ``cpus`` for the block."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def stage(options: argparse.Namespace, part: str, memories: int, setup: dict[str, str]) -> Iterator[Stage]:
    """Fresh stores seeded with one agent of ``memories`` memories, its own graph built when
    it is past the limit, and the service started on them: yields the running stage."""
    base = loadtest_args(
        [
            "--scenario", "baseline", "--label", f"growing-{part}",
            "--agents", "1", "--memories", str(memories), "--vectors", "shaped", "--embedder", "minilm",
            "--server-cpus", options.server_cpus, "--locust-cpus", options.client_cpus,
            "--seed", str(options.seed), "--out-dir", str(options.out_dir),
        ]
    )  # fmt: skip
    data_dir = Path(options.data_root) / f"growing-{part}"
    shutil.rmtree(data_dir, ignore_errors=True)  # a run changes its data: each starts afresh
    data_dir.mkdir(parents=True)
    base.data_dir = data_dir
    Path(base.out_dir).mkdir(parents=True, exist_ok=True)
    prefix = Path(base.out_dir) / f"{datetime.now(UTC):%Y%m%dT%H%M%S}-growing-{part}"
    with stores(data_dir, base.pg_shared_buffers) as (dsn, redis_url, redis, postgres):
        agents_file, _ = seed_if_needed(base, dsn, data_dir, log)
        if memories > options.threshold:
            asyncio.run(promote_if_grown(dsn, options.threshold))
        agent = json.loads(agents_file.read_text())["agents"][0]
        store_pids = [pid for pid in (redis.pid, postgres.pid) if pid]
        pin_stores(store_pids, options.client_cpus)
        warm_postgres(dsn, agents_file, log)
        overridden = options.threshold != THRESHOLD
        if overridden:
            os.environ["IBEX_COLD_EXACT_MAX_MEMORIES"] = str(options.threshold)
        try:
            setup.setdefault("inherited", inherited_settings(os.environ))
            server = start_server(base, dsn, redis_url, prefix, log)
        finally:
            if overridden:
                os.environ.pop("IBEX_COLD_EXACT_MAX_MEMORIES", None)
        setup[f"{part}_serve_cmd"] = " ".join(server.command)
        try:
            wait_ready(server.grpc_port, server.metrics_ports, server.proc, base.start_timeout)
            with pinned(options.client_cpus):
                yield Stage(dsn, agent, Workload(agents_file, options.seed), server, store_pids)
        finally:
            server.stop()


def run_promotion(options: argparse.Namespace, setup: dict[str, str]) -> PromotionResult:
    written = options.threshold - options.seeded + options.cross_by
    with stage(options, "promotion", options.seeded, setup) as s:
        vectors = None if options.server_embeds else shaped_vectors(written, options.seed + 1)
        with Caller(
            s.server.grpc_port, s.workload, options.rps, options.deadline_ms / 1000, options.seed
        ) as caller:
            s.mark(WARM_UP)
            time.sleep(options.warmup)
            s.mark(BEFORE)
            time.sleep(options.before)
            crossing = s.mark(CROSSING)
            created, writes_s, building, ready = asyncio.run(
                cross(s, written, options.batch, vectors, options.build_timeout, options.seed + 2)
            )
            if ready is not None:
                time.sleep(options.after)
            s.mark(END)
    rows = phases(caller.calls, s.marks)
    own_plans = (ColdPlan.AGENT.value, ColdPlan.AGENT_HALFVEC.value)
    first_own = min((c.at for c in caller.calls if c.plan in own_plans), default=None)
    named = {r.name: r for r in rows}
    if ready is None or building is None:
        verdict = Verdict(
            False,
            f"the agent's graph was {'not ready' if building else 'not claimed'} within {options.build_timeout:g} s",
        )
    else:
        verdict = full_kept(named[BEFORE], named[BUILDING], options.full_tolerance)
    return PromotionResult(
        seeded=options.seeded,
        written=created,
        writes_s=writes_s,
        rows=rows,
        plan_rows=by_plan(caller.calls, s.marks),
        build_s=None if ready is None or building is None else ready.at - building.at,
        claimed_after_s=None if building is None else building.at - crossing.at,
        first_own_graph_after_s=None if ready is None or first_own is None else first_own - ready.at,
        verdict=verdict,
    )


def run_writes(options: argparse.Namespace, setup: dict[str, str]) -> WritesResult:
    with stage(options, "writes", options.memories, setup) as s:
        claimed, ready = asyncio.run(graph_state(s.dsn, s.agent))
        if not ready:
            raise RuntimeError(
                f"the {options.memories:,}-memory agent has no graph of its own ready (claimed: {claimed})"
            )
        count = max(1, options.writers)
        expected = (
            int(options.writes_per_second * options.with_writes) + options.keep + options.write_batch + 1
        )
        s.writers = [
            Writer(
                s.server.grpc_port,
                [s.agent],
                options.writes_per_second / count,
                max(1, options.keep // count),
                options.seed + 10 + i,
                vectors=None
                if options.server_embeds
                else shaped_vectors(expected // count + options.write_batch, options.seed + 20 + i).__next__,
                batch=options.write_batch,
            )
            for i in range(count)
        ]
        with Caller(
            s.server.grpc_port, s.workload, options.rps, options.deadline_ms / 1000, options.seed
        ) as caller:
            s.mark(WARM_UP)
            time.sleep(options.warmup)
            s.mark(BASELINE)
            time.sleep(options.baseline)
            s.mark(RECALL_CHECK)
            recalls = {
                BASELINE: asyncio.run(measure_recall(s.dsn, s.agent, options.recall_queries, options.seed))
            }
            s.mark(WRITES)
            try:
                for writer in s.writers:
                    writer.start()
                time.sleep(options.with_writes)
            finally:
                for writer in s.writers:
                    writer.stop()
            s.mark(RECALL_CHECK)
            recalls[WRITES] = asyncio.run(
                measure_recall(s.dsn, s.agent, options.recall_queries, options.seed)
            )
            s.mark(END)
    rows = phases(caller.calls, s.marks)
    named = {r.name: r for r in rows}
    return WritesResult(
        memories=options.memories,
        rows=rows,
        plan_rows=by_plan(caller.calls, s.marks),
        recalls=recalls,
        writers=count,
        verdict=searched_while_written(
            named[BASELINE],
            named[WRITES],
            recalls[BASELINE],
            recalls[WRITES],
            p99_tolerance=options.p99_tolerance,
            full_tolerance_pp=options.full_tolerance,
            recall_tolerance=options.recall_tolerance,
        ),
    )


# --------------------------------------------------------------------------- the command line


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.growing_agent",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--part", choices=("promotion", "writes", "both"), default="both")
    p.add_argument(
        "--quick",
        action="store_true",
        help="small sizes and short phases (tests): " + ", ".join(f"{k}={v}" for k, v in QUICK.items()),
    )
    p.add_argument("--rps", type=float, default=20.0)
    p.add_argument("--deadline-ms", type=float, default=45.0, help="the client deadline of every call")
    p.add_argument(
        "--warmup", type=float, default=10.0, help="seconds of calls not counted, at each part's start"
    )
    p.add_argument(
        "--threshold",
        type=int,
        default=THRESHOLD,
        help="the service's cold_exact_max_memories (default: its default)",
    )
    p.add_argument(
        "--server-embeds",
        action="store_true",
        help="writes send no embedding: the service embeds them with MiniLM",
    )
    promotion = p.add_argument_group("promotion")
    promotion.add_argument(
        "--seeded", type=int, default=4_900, help="the agent's memories before the crossing writes"
    )
    promotion.add_argument(
        "--cross-by", type=int, default=100, help="memories past the limit the writes take it"
    )
    promotion.add_argument(
        "--batch", type=int, default=50, help="memories per UpsertMemories of the crossing writes"
    )
    promotion.add_argument(
        "--before", type=float, default=30.0, help="seconds of calls before the crossing writes"
    )
    promotion.add_argument(
        "--after",
        type=float,
        default=75.0,
        help="seconds of calls after the graph is ready (the service caches an agent's graph state 60 s)",
    )
    promotion.add_argument("--build-timeout", type=float, default=300.0)
    writes = p.add_argument_group("writes while searched")
    writes.add_argument("--memories", type=int, default=10_000, help="the written agent's memories")
    writes.add_argument("--baseline", type=float, default=60.0, help="seconds of calls without writes")
    writes.add_argument("--with-writes", type=float, default=60.0, help="seconds of calls with the writer")
    writes.add_argument(
        "--writes-per-second", type=float, default=100.0, help="upserts a second, and as many deletes"
    )
    writes.add_argument(
        "--keep", type=int, default=100, help="a memory written is deleted this many writes later"
    )
    writes.add_argument(
        "--writers",
        type=int,
        default=3,
        help="writers sharing the rate, each on its own connection",
    )
    writes.add_argument(
        "--write-batch",
        type=int,
        default=10,
        help="memories per UpsertMemories (and per DeleteMemories), as a client writing 100 a second"
        " sends them (one memory a call: three writers reached 40 upserts/s here at 100 asked)",
    )
    writes.add_argument("--recall-queries", type=int, default=50)
    verdict = p.add_argument_group("targets")
    verdict.add_argument(
        "--full-tolerance", type=float, default=2.0, help="points of FULL %% a phase may lose"
    )
    verdict.add_argument(
        "--p99-tolerance", type=float, default=0.25, help="relative p99 rise the write period may show"
    )
    verdict.add_argument(
        "--recall-tolerance", type=float, default=0.02, help="mean recall@50 the write period may lose"
    )
    where = p.add_argument_group("where")
    where.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results file (default: benchmarks/results/growing-agent-<date>.md)",
    )
    where.add_argument("--data-root", type=Path, default=ROOT / "loadtest" / "out" / "data")
    where.add_argument("--out-dir", type=Path, default=ROOT / "loadtest" / "out", help="server logs")
    where.add_argument("--server-cpus", default="0")
    where.add_argument("--client-cpus", default="1", help="the stores, the client and the writer")
    where.add_argument("--seed", type=int, default=20261122)
    raw = list(sys.argv[1:] if argv is None else argv)
    if "--quick" in raw:
        p.set_defaults(**QUICK)
    options = p.parse_args(raw)
    if options.seeded > options.threshold:
        p.error(f"--seeded {options.seeded} is past --threshold {options.threshold}: nothing to cross")
    if options.memories <= options.threshold:
        p.error(
            f"--memories {options.memories} must be past --threshold {options.threshold} (an agent with a graph of its own)"
        )
    if options.out is None:
        options.out = RESULTS / f"growing-agent-{datetime.now(UTC):%Y-%m-%d}.md"
    options.argv = raw
    return options


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    setup: dict[str, str] = {"load_start": f"{os.getloadavg()[0]:.2f}"}
    promotion = run_promotion(options, setup) if options.part in ("promotion", "both") else None
    writes = run_writes(options, setup) if options.part in ("writes", "both") else None
    setup["load_end"] = f"{os.getloadavg()[0]:.2f}"
    text = render(options, options.argv, promotion, writes, setup)
    print(text)
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(text)
    log(f"results: {options.out}")
    verdicts = [r.verdict.holds for r in (promotion, writes) if r is not None]
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
