"""What a run measures over its window: the server's own histograms and counters (deltas of
two /metrics scrapes), CPU time of the server, the load generator and the stores, run-queue
waits, stolen CPU, load average; and the RunResult that carries them to the report."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtest import promdelta
from loadtest.machine import cpu_seconds, runqueue_wait_seconds, stolen_seconds
from loadtest.server import scrape

# The gRPC deadline locust gives every call.
DEADLINE_S = 0.045


@dataclass(slots=True)
class RunResult:
    summary: dict[str, Any]
    locust_rc: int
    stages: dict[str, dict[str, float | None]]
    assembly: dict[str, dict[str, float | None]]
    fallbacks_server: dict[str, float]
    degradation_server: dict[str, float]
    server_cpu_s: float
    server_runqueue_wait_s: float
    stores_cpu_s: float
    pg_activity: list[str]
    load_average: tuple[float, float]
    locust_cpu_s: float
    wall_s: float
    seed_output: str
    setup: dict[str, Any]
    profile_summary: str = ""
    gc_pauses: dict[str, dict[str, float | None]] = field(default_factory=dict)
    gc_pauses_over_deadline: float = 0.0
    # ``lag`` and ``longest iteration`` of the server's event loop(s), like ``stages``.
    event_loop: dict[str, dict[str, float | None]] = field(default_factory=dict)
    stolen_s: dict[str, float] = field(default_factory=dict)
    # The backend of the run's own pg_stat_activity sampler, left out of stores_cpu_s.
    sampler_cpu_s: float = 0.0
    # The server's query-embedding cache lookups over the window, by result: hit (cached),
    # shared (joined the same query's embedding in flight), miss (embedded).
    embedding_cache: dict[str, float] = field(default_factory=dict)
    # The embedding worker's inferences (minilm), like ``stages``, by "<kind> <phase>".
    embedding: dict[str, dict[str, float | None]] = field(default_factory=dict)
    # Calls whose vector search ran with the static table's query vector (the stand-in).
    stand_ins: float = 0.0
    # Graph walks repeated wider because the lexical search showed they missed.
    rewalks: float = 0.0

    def ms_per_request(self, cpu_s: float) -> float | None:
        """``cpu_s`` of CPU over the window as milliseconds per request (None: no request)."""
        requests = self.summary.get("requests") or 0
        return 1000.0 * cpu_s / requests if requests else None

    @property
    def embedding_cache_hit_rate(self) -> float | None:
        """Lookups served without an embedding of their own (hit or shared) over all lookups
        in the window; None when the server reported none."""
        lookups = sum(self.embedding_cache.values())
        served = self.embedding_cache.get("hit", 0.0) + self.embedding_cache.get("shared", 0.0)
        return served / lookups if lookups else None


def stage_table(
    deltas: dict[promdelta.LabelKey, promdelta.HistogramDelta], label: str, *more_labels: str
) -> dict[str, Any]:
    """Rows named by the values of ``label`` (and ``more_labels``, space-separated)."""
    table: dict[str, dict[str, float | None]] = {}
    for key, delta in sorted(deltas.items()):
        labels = dict(key)
        name = " ".join(labels.get(name, "all") for name in (label, *more_labels))
        if not delta.count:
            continue

        def ms(v: float | None) -> float | None:
            return None if v is None else v * 1000.0

        table[name] = {
            "count": delta.count,
            "mean_ms": ms(delta.mean),
            "p50_ms": ms(delta.quantile(0.5)),
            "p95_ms": ms(delta.quantile(0.95)),
            "p99_ms": ms(delta.quantile(0.99)),
        }
    return table


@dataclass(frozen=True, slots=True)
class Reading:
    """One reading of every counter, at one end of the measured window."""

    scrapes: list[str]
    server_cpu_s: float
    locust_cpu_s: float
    at: float
    server_runqueue_wait_s: float
    load_average: float
    stolen_s: dict[str, float]
    stores_cpu_s: float


def read_counters(
    metrics_ports: Sequence[int], server_pid: int, locust_pid: int, store_pids: Sequence[int]
) -> Reading:
    scrapes = [scrape(p) for p in metrics_ports]
    cpu, lcpu, at = cpu_seconds(server_pid), cpu_seconds(locust_pid), time.monotonic()
    wait, load = runqueue_wait_seconds(server_pid), os.getloadavg()[0]
    stolen = stolen_seconds()
    stores = sum(cpu_seconds(pid) for pid in store_pids)
    return Reading(scrapes, cpu, lcpu, at, wait, load, stolen, stores)


def _histogram(
    before: Reading, after: Reading, name: str
) -> dict[promdelta.LabelKey, promdelta.HistogramDelta]:
    return promdelta.merge_deltas(
        promdelta.histogram_deltas(b, a, name) for b, a in zip(before.scrapes, after.scrapes, strict=True)
    )


def _counter_by(before: Reading, after: Reading, name: str, label: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for b, a in zip(before.scrapes, after.scrapes, strict=True):
        for key, value in promdelta.counter_deltas(b, a, name).items():
            by = dict(key).get(label, "?")
            totals[by] = totals.get(by, 0.0) + value
    return {k: v for k, v in totals.items() if v}


def window_figures(before: Reading, after: Reading) -> dict[str, Any]:
    """The RunResult fields measured over the window between two readings."""
    stage_deltas = _histogram(before, after, "ibex_context_stage_duration_seconds")
    assembly_deltas = _histogram(before, after, "ibex_context_assembly_duration_seconds")
    gc_deltas = _histogram(before, after, "ibex_context_gc_pause_seconds")
    embedding_deltas = _histogram(before, after, "ibex_context_embedding_seconds")
    gc_over_deadline = sum(
        d.count - next((c for bound, c in d.buckets if bound >= DEADLINE_S), d.count)
        for d in gc_deltas.values()
    )
    event_loop = {
        name: row
        for name, metric in (
            ("lag", "ibex_context_event_loop_lag_seconds"),
            ("longest iteration", "ibex_context_event_loop_longest_iteration_seconds"),
        )
        if (row := stage_table(_histogram(before, after, metric), "stage").get("all")) is not None
    }
    return {
        "event_loop": event_loop,
        "stages": stage_table(stage_deltas, "stage"),
        "assembly": stage_table(assembly_deltas, "outcome"),
        "gc_pauses": stage_table(gc_deltas, "generation"),
        "embedding": stage_table(embedding_deltas, "kind", "phase"),
        "gc_pauses_over_deadline": gc_over_deadline,
        "fallbacks_server": _counter_by(before, after, "ibex_context_fallbacks", "reason"),
        "degradation_server": _counter_by(before, after, "ibex_context_assembly_degradation", "level"),
        "embedding_cache": _counter_by(before, after, "ibex_context_query_embedding_lookups", "result"),
        "stand_ins": sum(_counter_by(before, after, "ibex_context_embedding_stand_ins", "").values()),
        "rewalks": sum(_counter_by(before, after, "ibex_context_cold_search_rewalks", "").values()),
        "server_cpu_s": after.server_cpu_s - before.server_cpu_s,
        "server_runqueue_wait_s": after.server_runqueue_wait_s - before.server_runqueue_wait_s,
        "stolen_s": {cpu: after.stolen_s[cpu] - before.stolen_s.get(cpu, 0.0) for cpu in after.stolen_s},
        "stores_cpu_s": after.stores_cpu_s - before.stores_cpu_s,
        "load_average": (before.load_average, after.load_average),
        "locust_cpu_s": after.locust_cpu_s - before.locust_cpu_s,
        "wall_s": after.at - before.at,
    }
