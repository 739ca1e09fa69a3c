"""What observability and the proxy-side client cost per call.

Measured, each operation timed on its own per iteration (``time.perf_counter_ns``),
p50/p99 over all iterations of several rounds:

* the call observer, split by where the time goes:
  - ``begin`` (CallState, traceparent parse, gauge) and ``end`` (stamp status,
    schedule the recording) run inside the call, before the status leaves: this is
    the latency the layer adds;
  - ``record`` (metrics from the report, spans, access log line) runs after the
    trailers are written (``loop.call_soon``): CPU, but not in the caller's latency.
  The report is a realistic one: 9 stages, 4 sources, 2 degradation reasons. The
  access log is a JSON line into a ``StringIO``; spans go to an in-memory exporter
  (``SimpleSpanProcessor``, i.e. export inline; production batches in a thread).
* ``/metrics`` rendering after 10,000 recorded assemblies (the whole registry).
* the client: building the request (20 messages) and turning a parsed 20-memory
  response into an ``AssembleResult``; round trips over a real loopback socket to the
  scripted test server (first call on a fresh channel, then warm calls).

    .venv/bin/python benchmarks/observability.py      # writes benchmarks/results/observability.md
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import logging
import os
import platform
import statistics
import subprocess
import time
import timeit
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import grpc
from ibex_context._proto.ibex.context.v1 import context_pb2 as pb
from ibex_context.client import ContextClient
from ibex_context.devtools.scripted_service import scripted_server
from ibex_context.models import ChatMessage, Degradation, MemoryRecord, ScoredMemory
from ibex_context.observability.calls import ASSEMBLE_CONTEXT_METHOD, CallObserver
from ibex_context.observability.logging import CallContextFilter, JsonFormatter
from ibex_context.observability.metrics import Metrics
from ibex_context.observability.state import current_call
from ibex_context.observability.tracing import Tracing
from ibex_context.pipeline.assembly import Assembly, Composition
from ibex_context.pipeline.budget import compute_budget
from ibex_context.pipeline.outcome import (
    STAGES,
    Outcome,
    Reason,
    SourceName,
    SourceResult,
    SourceStatus,
    StageSpan,
    Timings,
)
from ibex_context.profiles.model import BudgetLimits
from ibex_context.tokens.catalogue import resolve_model
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import (
    CollectorRegistry,
    disable_created_metrics,
    enable_created_metrics,
    generate_latest,
)

ROOT = Path(__file__).resolve().parent.parent

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@dataclass(frozen=True, slots=True)
class Sample:
    p50_us: float
    p99_us: float
    n: int


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarise(ns: Sequence[int]) -> Sample:
    us = [x / 1000 for x in ns]
    return Sample(statistics.median(us), _pct(us, 0.99), len(us))


def an_assembly(*, degraded: bool = True) -> Assembly:
    t = time.perf_counter_ns()
    memory = ScoredMemory(MemoryRecord(id="m", content="x", category="factual"), 0.5, 0.5, 0.5, 0.5, 0.5, 0.0)
    budget = compute_budget(
        resolve_model("gpt-4o", {}),
        messages_tokens=20,
        directive_tokens=40,
        limits=BudgetLimits(),
        exact=True,
    )
    return Assembly(
        request_id="req-1",
        model="gpt-4o",
        profile="default",
        composed=Composition(
            (),
            directive_injected=True,
            memories=(memory,) * 6,
            handles=tuple(range(1, 7)),
            memories_available=9,
            tokens_injected=2300,
            memory_tokens=2100,
            budget=budget,
        ),
        degradation=Degradation.HOT_ONLY if degraded else Degradation.FULL,
        reasons=(Reason.COLD_TIMEOUT, Reason.EMBED_ERROR) if degraded else (),
        outcome=Outcome.DEGRADED if degraded else Outcome.FULL,
        sources=(
            SourceResult(SourceName.DIRECTIVE, SourceStatus.OK, 300, 1),
            SourceResult(SourceName.HOT, SourceStatus.OK, 900, 12),
            SourceResult(SourceName.EMBED, SourceStatus.ERROR, 50, 0, "EmbeddingError"),
            SourceResult(SourceName.COLD, SourceStatus.TIMEOUT, 35_000, 0, "timed out"),
        ),
        candidates_evaluated=12,
        context_window_used=2,
        timings=Timings(
            t,
            t + 9_000_000,
            tuple(
                StageSpan(stage, t + i * 1_000_000, t + (i + 1) * 1_000_000)
                for i, stage in enumerate(STAGES)
                if stage != "serialize"
            ),
        ),
    )


class _Deferred:
    """Stands in for ``loop.call_soon``: keeps the callbacks to run them when told."""

    def __init__(self) -> None:
        self.callbacks: list[tuple[Callable[..., object], tuple[object, ...]]] = []

    def __call__(self, callback: Callable[..., object], *args: object, context: object = None) -> None:
        self.callbacks.append((callback, args))

    def run(self) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for callback, args in callbacks:
            callback(*args)


def _metadata(with_parent: bool) -> list[tuple[str, str | bytes]]:
    """Invocation metadata as grpc.aio hands it over (pairs, lower-case keys)."""
    metadata: list[tuple[str, str | bytes]] = [("user-agent", "bench"), ("x-request-id", "req-1")]
    if with_parent:
        metadata.append(("traceparent", TRACEPARENT))
    return metadata


async def bench_observer(iterations: int, rounds: int, tracing_mode: str) -> dict[str, Sample]:
    metrics = Metrics(CollectorRegistry())
    exporter = InMemorySpanExporter()
    if tracing_mode == "off":
        tracing = Tracing()
    else:
        tracing = Tracing(
            exporter, sample_ratio=1.0 if tracing_mode == "kept" else 0.0, batch=False, slow_ms=1e9
        )
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(CallContextFilter())
    handler.setFormatter(JsonFormatter())
    access = logging.getLogger(f"bench.access.{tracing_mode}")
    access.propagate = False
    access.setLevel(logging.INFO)
    access.addHandler(handler)
    observer = CallObserver(metrics=metrics, tracing=tracing, log=access)
    request_ns: list[int] = []
    trailers_ns: list[int] = []
    record_ns: list[int] = []
    loop = asyncio.get_running_loop()
    deferred = _Deferred()
    real_call_soon = loop.call_soon
    # Nothing below suspends, so the only call_soon is the one ``end`` makes:
    # capture it to time the recording on its own.
    loop.call_soon = deferred  # type: ignore[method-assign,assignment]
    try:
        for _ in range(rounds):
            gc.collect()
            for _ in range(iterations):
                metadata = _metadata(with_parent=tracing_mode == "kept")
                token = current_call.set(None)
                t0 = time.perf_counter_ns()
                state = observer.begin(ASSEMBLE_CONTEXT_METHOD, metadata, 0.045)
                t1 = time.perf_counter_ns()
                assert state is not None
                # "dropped" needs an ordinary call: a degraded one is always kept.
                state.assembly = an_assembly(degraded=tracing_mode != "dropped")
                t2 = time.perf_counter_ns()
                observer.end(state, grpc.StatusCode.OK)
                t3 = time.perf_counter_ns()
                deferred.run()
                t4 = time.perf_counter_ns()
                current_call.reset(token)
                request_ns.append(t1 - t0)
                trailers_ns.append(t3 - t2)
                record_ns.append(t4 - t3)
                if out.tell() > 1 << 22:
                    out.seek(0)
                    out.truncate()
                exporter.clear()
    finally:
        loop.call_soon = real_call_soon  # type: ignore[method-assign]
    access.removeHandler(handler)
    tracing.shutdown()
    return {
        "begin": summarise(request_ns),
        "end": summarise(trailers_ns),
        "record": summarise(record_ns),
    }


def bench_scrape(rounds: int, *, created_series: bool) -> tuple[Sample, int, int]:
    if created_series:
        enable_created_metrics()
    else:
        disable_created_metrics()
    metrics = Metrics(CollectorRegistry())
    for _ in range(10_000):
        assembly = an_assembly()
        metrics.record_assembly(assembly, assembly.timings.stages)
        metrics.record_call(ASSEMBLE_CONTEXT_METHOD, grpc.StatusCode.OK, 0.01)
    samples = sum(len(family.samples) for family in metrics.registry.collect())
    times: list[int] = []
    size = 0
    for _ in range(rounds * 20):
        t0 = time.perf_counter_ns()
        body = generate_latest(metrics.registry)
        times.append(time.perf_counter_ns() - t0)
        size = len(body)
    enable_created_metrics()
    return summarise(times), size, samples


def calibration_us() -> float:
    """``sum(range(1000))``: compare with your machine to scale every figure here."""
    return min(timeit.repeat("sum(range(1000))", number=1000, repeat=5)) * 1000


def bench_client_codec(iterations: int, rounds: int) -> dict[str, Sample]:
    messages = tuple(ChatMessage("user" if i % 2 else "assistant", "word " * 160) for i in range(20))
    injected = "\n".join(f"- memory {i}: " + "fact " * 35 for i in range(20))
    response = pb.AssembleContextResponse(
        messages=[
            pb.Message(role="system", content=injected),
            *(pb.Message(role=m.role, content=m.content) for m in messages),
        ],
        metadata=pb.InjectionMetadata(
            memories_injected=20,
            memory_ids=[f"{i:032x}" for i in range(20)],
            memories=[pb.InjectedMemory(id=f"{i:032x}", category="factual", score=0.5) for i in range(20)],
            timings=pb.StageTimings(total_us=9000),
        ),
    )
    wire = response.SerializeToString()
    build: list[int] = []
    parse: list[int] = []
    convert: list[int] = []
    for _ in range(rounds):
        gc.collect()
        for _ in range(iterations):
            t0 = time.perf_counter_ns()
            request = pb.AssembleContextRequest(
                org_id="o",
                agent_id="a",
                model="gpt-4o",
                messages=[pb.Message(role=m.role, content=m.content) for m in messages],
            )
            request.SerializeToString()
            t1 = time.perf_counter_ns()
            reply = pb.AssembleContextResponse.FromString(wire)
            t2 = time.perf_counter_ns()
            tuple(ChatMessage(m.role, m.content) for m in reply.messages)
            t3 = time.perf_counter_ns()
            build.append(t1 - t0)
            parse.append(t2 - t1)
            convert.append(t3 - t2)
    return {
        f"build + serialize request (20 messages, {request.ByteSize():,} B)": summarise(build),
        f"parse response (21 messages, 20 memories, {len(wire):,} B)": summarise(parse),
        "response messages -> ChatMessage tuple": summarise(convert),
    }


async def bench_round_trips(iterations: int) -> dict[str, Sample]:
    messages = tuple(ChatMessage("user", "hello " * 50) for _ in range(5))
    firsts: list[int] = []
    warm: list[int] = []
    async with scripted_server() as server:
        for _ in range(20):
            async with ContextClient(server.target, timeout=5) as client:
                t0 = time.perf_counter_ns()
                await client.assemble(org_id="o", agent_id="a", model="gpt-4o", messages=messages)
                firsts.append(time.perf_counter_ns() - t0)
        async with ContextClient(server.target, timeout=5) as client:
            await client.warm_up()
            for _ in range(iterations):
                t0 = time.perf_counter_ns()
                result = await client.assemble(org_id="o", agent_id="a", model="gpt-4o", messages=messages)
                warm.append(time.perf_counter_ns() - t0)
                assert result.from_service
    return {"first call on a fresh channel (connect + call)": summarise(firsts), "warm call": summarise(warm)}


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _rows(samples: dict[str, Sample]) -> list[str]:
    return [f"| {name} | {s.p50_us:,.1f} | {s.p99_us:,.1f} | {s.n:,} |" for name, s in samples.items()]


async def run(iterations: int, rounds: int) -> str:
    observed = {mode: await bench_observer(iterations, rounds, mode) for mode in ("off", "dropped", "kept")}
    scrapes = {created: bench_scrape(rounds, created_series=created) for created in (True, False)}
    codec = bench_client_codec(iterations, rounds)
    trips = await bench_round_trips(iterations)
    load = [f"{x:.2f}" for x in os.getloadavg()]
    lines = [
        "# Observability and client cost per call",
        "",
        f"Generated {datetime.now(UTC):%Y-%m-%d %H:%M UTC} by `benchmarks/observability.py` at commit "
        f"{_git_commit()}; Python {platform.python_version()}, {iterations:,} iterations x {rounds} rounds, "
        f"load average {' '.join(load)} on a shared 2-core VM (other work was running: read p99 as an upper "
        f"bound). Calibration: `sum(range(1000))` takes {calibration_us():.1f} us here (about 8 us on a "
        "current server core), so expect these figures to be several times smaller in production.",
        "",
        "## Server call observer (per call)",
        "",
        "`begin` + `end` run inside the call, before its status is sent: they are the "
        "latency observability adds. `record` runs after the status is written (`loop.call_soon`): "
        "event-loop CPU, not in this call's latency. Report: 9 stages, 4 sources, 2 reasons; the access "
        "log line is JSON.",
        "",
        "| tracing | step | p50 us | p99 us | n |",
        "|---|---|---|---|---|",
    ]
    labels = {
        "off": "exporter none",
        "dropped": "exporter on, call not sampled",
        "kept": "exporter on, call sampled (10 spans, inline export)",
    }
    for mode, samples in observed.items():
        lines += [f"| {labels[mode]} {row[1:]}" for row in _rows(samples)]
    lines += [
        "",
        "## /metrics rendering",
        "",
        "| what | p50 us | p99 us | n |",
        "|---|---|---|---|",
        *(
            f"| whole registry after 10,000 assemblies, `_created` series {'on' if created else 'off'} "
            f"({n_samples} samples, {size:,} B) | {s.p50_us:,.1f} | {s.p99_us:,.1f} | {s.n} |"
            for created, (s, size, n_samples) in scrapes.items()
        ),
        "",
        "Rendering runs on the event loop. `prometheus_client.disable_created_metrics()` (or "
        "`PROMETHEUS_DISABLE_CREATED_SERIES=true`) drops the `_created` series Prometheus does not need.",
        "",
        "## Client (proxy side)",
        "",
        "| what | p50 us | p99 us | n |",
        "|---|---|---|---|",
        *_rows(codec),
        *_rows(trips),
        "",
        "Round trips are to the scripted test server (no stores) in the same process and event loop, so "
        "they include the server's work; they show the floor and the cost of the first connection, which "
        "is why the proxy should call `ContextClient.warm_up()` at start-up.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "observability.md")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args.iterations, args.rounds))
    args.out.write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
