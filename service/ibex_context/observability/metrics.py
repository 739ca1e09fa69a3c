"""Prometheus metrics of the service, derived from the ``Assembly`` of each call.

Everything lives in a ``CollectorRegistry`` passed in (never the global default
registry), so tests and embedded servers each get their own.

Cardinality is bounded by construction: labels only ever take values from fixed
sets (outcomes, stages, sources, reasons, gRPC codes, the server's own methods);
anything else becomes ``other``. No tenant, agent, session or request id is ever a
label; a trace id may ride on a histogram observation as an OpenMetrics exemplar,
which is not a label and creates no series.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

import grpc
from ibex_context_client.buckets import ASSEMBLY_BUCKETS
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from ibex_context.embedding.batching import EmbeddingTurn
from ibex_context.models import Degradation
from ibex_context.observability.exposition import (
    HealthCheck,
    HealthStatus,
    MetricsServer,
    start_metrics_server,
)
from ibex_context.pipeline.assembly import Assembly
from ibex_context.pipeline.outcome import (
    SOURCES,
    STAGES,
    STAND_IN_DETAIL,
    Outcome,
    Reason,
    SourceName,
    SourceStatus,
    StageSpan,
    plan_of,
    rewalked,
)
from ibex_context.stores.cold_plan import ColdPlan
from ibex_context.stores.postgres.graphs import DENSE_GRAPH, SPARSE_GRAPH, GraphBuildTiming
from ibex_context.stores.postgres.read_routing import REPLICA, ROUTE_REASONS, ReplicaStatus

__all__ = [
    "ASSEMBLY_BUCKETS",
    "KNOWN_REASONS",
    "OTHER",
    "STAGE_BUCKETS",
    "HealthCheck",
    "HealthStatus",
    "Metrics",
    "MetricsServer",
    "normalise_reason",
    "start_metrics_server",
]

OTHER = "other"

# Stages take tens of microseconds (scoring, packing) to tens of milliseconds (cold search).
STAGE_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05,
)  # fmt: skip
# Every RPC, including the write side, where embedding a batch can take seconds.
RPC_BUCKETS: tuple[float, ...] = (*ASSEMBLY_BUCKETS, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
MEMORY_COUNT_BUCKETS: tuple[float, ...] = (0, 1, 2, 3, 5, 8, 13, 20, 30, 50, 100)
CANDIDATE_BUCKETS: tuple[float, ...] = (0, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
UTILISATION_BUCKETS: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
TOKEN_BUCKETS: tuple[float, ...] = (0, 100, 250, 500, 1000, 2000, 4000, 8000, 16000, 32000)
# Seconds. A young collection takes tens of microseconds; a full one over an unfrozen
# start-up heap took 60-80 ms, past the call deadline.
GC_PAUSE_BUCKETS: tuple[float, ...] = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.045, 0.1)
GC_GENERATIONS: tuple[str, ...] = ("0", "1", "2")
# Seconds. An idle loop shows up to ~1 ms (epoll's millisecond rounding); the issue's
# target for the longest step is 2 ms; past the 45 ms deadline every call in flight fails.
LOOP_LAG_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.045, 0.1, 0.25,
)  # fmt: skip
COLD_PLANS: tuple[str, ...] = tuple(plan.value for plan in ColdPlan)
# Seconds. A query's inference takes 2-5 ms (int8 / fp32) on this project's machine and
# 10-20 ms on an older one; a write's turn of long texts, and its chunks' queueing, more.
EMBEDDING_BUCKETS: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.045, 0.1, 0.25, 1.0,
)  # fmt: skip
EMBEDDING_PHASES: tuple[str, ...] = ("queued", "computing", "on_cpu")
# Seconds. An agent's own graph builds in ~2 s (sparse, 5k memories) to ~5 min (dense,
# 100k) and longer at 1M (large-agents-2026-12-06.md).
GRAPH_BUILD_BUCKETS: tuple[float, ...] = (
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip
GRAPH_KINDS: tuple[str, ...] = (DENSE_GRAPH.name, SPARSE_GRAPH.name)

# Degradation reasons the assembler reports (``Assembly.reasons``). Anything
# else is counted as ``other``: a new reason shows up on the dashboard as ``other``
# until it is added here, instead of silently creating series.
KNOWN_REASONS: frozenset[str] = frozenset(
    {
        *Reason,
        # Set by the observability layer for calls that ended before the assembly did.
        "cancelled",
    }
)

# The ``limit`` label of ``ibex_context_admission_shed_total``, by the reason a call is shed with.
ADMISSION_LIMITS: dict[Reason, str] = {
    Reason.OVERLOADED: "process",
    Reason.ORG_OVER_SHARE: "org_share",
    Reason.ORG_OVER_RATE: "org_rate",
}

_OUTCOMES: tuple[str, ...] = tuple(o.value for o in Outcome)
_DEGRADATION_LABELS: dict[Degradation, str] = {d: d.name.lower() for d in Degradation}
_FAILURE_KINDS: dict[SourceStatus, str] = {SourceStatus.TIMEOUT: "timeout", SourceStatus.ERROR: "error"}


def normalise_reason(reason: str, known: frozenset[str] = KNOWN_REASONS) -> str:
    return reason if reason in known else OTHER


def unfinished_outcome(status: grpc.StatusCode) -> tuple[Outcome, str | None]:
    """Outcome and reason of an AssembleContext call that ended without a finished report."""
    if status in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return Outcome.INVALID, None
    if status is grpc.StatusCode.DEADLINE_EXCEEDED:
        return Outcome.FALLBACK, "deadline_exceeded"
    if status is grpc.StatusCode.CANCELLED:
        return Outcome.FALLBACK, "cancelled"
    return Outcome.FALLBACK, "assembly_error"


def split_method(method: str) -> tuple[str, str]:
    """``/ibex.context.v1.ContextAssemblyService/AssembleContext`` -> (service, method)."""
    service, _, name = method.lstrip("/").rpartition("/")
    return service, name


class _Declare:
    """Declares the service's metrics in one registry (so no declaration repeats it)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, documentation, labels, registry=self._registry)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, documentation, labels, registry=self._registry)

    def histogram(
        self, name: str, documentation: str, labels: Sequence[str] = (), *, buckets: Sequence[float]
    ) -> Histogram:
        return Histogram(name, documentation, labels, buckets=buckets, registry=self._registry)


# The server-side latency of every gRPC call, by ``grpc_method``: the load tools read it too.
GRPC_HANDLING_SECONDS = "grpc_server_handling_seconds"


class Metrics:
    """Every metric of the service, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry, *, known_reasons: frozenset[str] = KNOWN_REASONS) -> None:
        self.registry = registry
        # The standard process_* series (CPU seconds, resident memory, open fds, start time) and
        # python_info, which only the default registry has built in. Read at scrape time, per process:
        # with serve --workers each worker reports its own.
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        self._known_reasons = known_reasons
        declare = _Declare(registry)

        self.assembly_duration = declare.histogram(
            "ibex_context_assembly_duration_seconds",
            "Wall time of AssembleContext, from request parsed to response built, by outcome.",
            ["outcome"],
            buckets=ASSEMBLY_BUCKETS,
        )
        self.stage_duration = declare.histogram(
            "ibex_context_stage_duration_seconds",
            "Wall time of one assembly stage.",
            ["stage"],
            buckets=STAGE_BUCKETS,
        )
        self.degradations = declare.counter(
            "ibex_context_assembly_degradation",
            "Assemblies by how much of the pipeline ran "
            "(full, partial, hot_only, cold_only, directive_only, pass_through).",
            ["level"],
        )
        self.fallbacks = declare.counter(
            "ibex_context_fallbacks",
            "Degradation reasons; an assembly with several reasons counts once for each.",
            ["reason"],
        )
        self.retrieval_failures = declare.counter(
            "ibex_context_retrieval_failures",
            "Retrieval sources that timed out or failed.",
            ["source", "kind"],
        )
        self.cold_plans = declare.counter(
            "ibex_context_cold_search_plans",
            "Vector searches that answered, by the plan the service chose for the agent's size"
            " (exact scan or the partition's HNSW graph; ADR-0009).",
            ["plan"],
        )
        self.cold_rewalks = declare.counter(
            "ibex_context_cold_search_rewalks",
            "Graph walks repeated wider because the lexical search found a memory the walk did not"
            " return, nearer to the question than one it did (IBEX_HNSW_EF_SEARCH_REWALK), and answered.",
        )
        self.embedding_stand_ins = declare.counter(
            "ibex_context_embedding_stand_ins",
            "Calls whose vector search ran with the static table's query vector because the"
            " embedder's was late or failed (IBEX_EMBEDDING_STAND_IN_MS).",
        )
        self.memories_injected = declare.histogram(
            "ibex_context_memories_injected",
            "Memories injected per assembly.",
            buckets=MEMORY_COUNT_BUCKETS,
        )
        self.tokens_injected = declare.histogram(
            "ibex_context_tokens_injected",
            "Tokens injected (directive, memories and framing) per assembly.",
            buckets=TOKEN_BUCKETS,
        )
        self.budget_utilisation = declare.histogram(
            "ibex_context_budget_utilisation_ratio",
            "Share of the memory token budget used by the injected memories.",
            buckets=UTILISATION_BUCKETS,
        )
        self.candidates_evaluated = declare.histogram(
            "ibex_context_candidates_evaluated",
            "Candidate memories scored per assembly.",
            buckets=CANDIDATE_BUCKETS,
        )
        self.store_up = declare.gauge(
            "ibex_context_store_up",
            "1 while the store answered its last health probe, 0 after a failure or a timeout. "
            "Readiness does not follow it (calls degrade instead); alert on it.",
            ["store"],
        )
        self.inflight_calls = declare.gauge(
            "ibex_context_inflight_calls",
            "gRPC calls being handled right now (the HPA scales on this).",
        )
        # gRPC server metrics under the names and labels of go-grpc-prometheus / py-grpc-prometheus
        # (grpc_server_handled_total, grpc_server_handling_seconds), so the dashboards and alerts
        # platform teams already run for gRPC servers work unchanged. Every method is unary.
        self.grpc_requests = declare.counter(
            "grpc_server_handled",
            "Finished gRPC calls by method and status code.",
            ["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
        )
        self.grpc_duration = declare.histogram(
            GRPC_HANDLING_SECONDS,
            "Server-side wall time of gRPC calls, request received to trailers sent.",
            ["grpc_type", "grpc_service", "grpc_method"],
            buckets=RPC_BUCKETS,
        )
        self.graph_builds_queued = declare.gauge(
            "ibex_context_graph_builds_queued",
            "Large agents waiting in this process's queue for their size check and the build of"
            " their own graph (one build at a time, orgs taking turns).",
        )
        self.graph_build_seconds = declare.histogram(
            "ibex_context_graph_build_seconds",
            "Each build of a large agent's own graph (its promotion, its dense rebuild, or the"
            " rebuild of a churned graph), wall time, by graph (dense, sparse) and outcome (built,"
            " failed). The agent is searched exactly while it waits for its first graph, and"
            " through its current one during a rebuild.",
            ["graph", "outcome"],
            buckets=GRAPH_BUILD_BUCKETS,
        )
        self.post_response_queue_depth = declare.gauge(
            "ibex_context_post_response_queue_depth",
            "Usage updates waiting to be written after responses were sent.",
        )
        self.post_response_dropped = declare.counter(
            "ibex_context_post_response_dropped",
            "Usage updates dropped because the post-response queue was full.",
        )
        self.post_response_failures = declare.counter(
            "ibex_context_post_response_failures",
            "Post-response batches that failed to write.",
        )
        self.profile_reloads = declare.counter(
            "ibex_context_profile_reloads",
            "Profile reloads by outcome (success, failure).",
            ["outcome"],
        )
        self.profile_reload_last_success = declare.gauge(
            "ibex_context_profile_reload_last_success_timestamp_seconds",
            "Unix time of the last successful profile load.",
        )
        self.profiles_loaded = declare.gauge(
            "ibex_context_profiles_loaded",
            "Profiles currently loaded.",
        )
        self.gc_pause = declare.histogram(
            "ibex_context_gc_pause_seconds",
            "Event-loop stalls from the cyclic garbage collector, by generation collected.",
            ["generation"],
            buckets=GC_PAUSE_BUCKETS,
        )
        self.event_loop_lag = declare.histogram(
            "ibex_context_event_loop_lag_seconds",
            "How late a timer due every 50 ms ran: how long ready work waits for the event loop "
            "(an idle loop shows up to ~1 ms: epoll waits in whole milliseconds).",
            buckets=LOOP_LAG_BUCKETS,
        )
        self.event_loop_longest_iteration = declare.histogram(
            "ibex_context_event_loop_longest_iteration_seconds",
            "Longest event-loop iteration (the work between two polls for I/O) in each 50 ms "
            "interval; not reported on uvloop.",
            buckets=LOOP_LAG_BUCKETS,
        )
        self.postgres_reads = declare.counter(
            "ibex_context_postgres_reads",
            "Searches by the PostgreSQL that answered (target: primary, replica) and why "
            "(reason: replica; no_replica, behind_write, mark_unknown, replica_failed: the primary's).",
            ["target", "reason"],
        )
        self.replica_lag = declare.gauge(
            "ibex_context_postgres_replica_lag_seconds",
            "How long ago the primary was at the WAL position the read replica has replayed "
            "(as of the last poll); a replica past IBEX_POSTGRES_REPLICA_MAX_LAG_SECONDS takes no reads.",
            ["replica"],
        )
        self.replica_lag_bytes = declare.gauge(
            "ibex_context_postgres_replica_lag_bytes",
            "WAL bytes the read replica had still to replay at the last poll.",
            ["replica"],
        )
        self.replica_up = declare.gauge(
            "ibex_context_postgres_replica_up",
            "1 while the read replica takes reads (answered its last poll, within the lag bound).",
            ["replica"],
        )
        self.auth_refusals = declare.counter(
            "ibex_context_auth_refusals",
            "Calls refused before their handler ran, by method and reason: unauthenticated (no "
            "credential or an unknown one), weak_token (a known token shorter than 32 characters), "
            "role (the credential lacks the method's role), org (bound to another org). No "
            "principal or tenant ids.",
            ["method", "reason"],
        )
        self.limit_refusals = declare.counter(
            "ibex_context_limit_refusals",
            "Calls refused with RESOURCE_EXHAUSTED by a tenant limit, by the limit's setting"
            " (max_org_memories, max_org_content_bytes, max_delete_ids, max_feedback_items,"
            " max_list_categories). No tenant ids: which org reached it is not recorded.",
            ["limit"],
        )
        self.credentials_loaded = declare.gauge(
            "ibex_context_credentials_loaded",
            "1 while the credentials file's last load succeeded; 0 after a load failed (the "
            "file does not read or parse): every credential is refused until a good file loads.",
        )
        self.embedding_seconds = declare.histogram(
            "ibex_context_embedding_seconds",
            "Each inference of the embedding worker threads (minilm), by what it embedded (kind:"
            " query, stored) and phase: queued (its oldest text waiting for a worker), computing"
            " (the inference, wall time), on_cpu (the worker thread's CPU time during it; computing"
            " minus on_cpu is time the worker waited for a core or for the GIL).",
            ["kind", "phase"],
            buckets=EMBEDDING_BUCKETS,
        )
        self.admission_shed = declare.counter(
            "ibex_context_admission_shed",
            "AssembleContext calls answered pass-through at admission, by the limit that shed them: "
            "process (IBEX_MAX_CONCURRENT_ASSEMBLIES, the org within its share: overloaded), org_share "
            "(the org over its share of a saturated process: org_over_share), org_rate (the org's "
            "rate limit: org_over_rate). No tenant ids.",
            ["limit"],
        )
        self.admission_active_orgs = declare.gauge(
            "ibex_context_admission_active_orgs",
            "Orgs sharing the process's assemblies now (called within IBEX_ORG_ACTIVE_SECONDS).",
        )
        self.gc_frozen_objects = declare.gauge(
            "ibex_context_gc_frozen_objects",
            "Start-up objects moved out of the garbage collector's sight (gc.freeze).",
        )

        # Children resolved once: .labels() takes a lock and hashes on every call,
        # and pre-created series read as 0 instead of absent on the dashboard.
        self._by_outcome = {o: self.assembly_duration.labels(o) for o in _OUTCOMES}
        self._by_stage = {s: self.stage_duration.labels(s) for s in (*STAGES, OTHER)}
        self._by_level = {d: self.degradations.labels(label) for d, label in _DEGRADATION_LABELS.items()}
        self._by_reason = {r: self.fallbacks.labels(r) for r in (*sorted(known_reasons), OTHER)}
        self._by_failure = {
            (s, k): self.retrieval_failures.labels(s, k)
            for s in (*SOURCES, OTHER)
            for k in _FAILURE_KINDS.values()
        }
        for outcome in ("success", "failure"):
            self.profile_reloads.labels(outcome)
        self._by_generation = [self.gc_pause.labels(g) for g in GC_GENERATIONS]
        self._embedding = {
            (query, phase): self.embedding_seconds.labels("query" if query else "stored", phase)
            for query in (True, False)
            for phase in EMBEDDING_PHASES
        }
        self._by_plan = {p: self.cold_plans.labels(p) for p in (*COLD_PLANS, OTHER)}
        self._graph_builds = {
            (graph, built): self.graph_build_seconds.labels(graph, "built" if built else "failed")
            for graph in GRAPH_KINDS
            for built in (True, False)
        }
        self._postgres_reads = {
            (target, reason): self.postgres_reads.labels(target, reason)
            for reason in ROUTE_REASONS
            for target in ("replica" if reason == REPLICA else "primary",)
        }
        self._by_shed_reason = {
            reason: self.admission_shed.labels(limit) for reason, limit in ADMISSION_LIMITS.items()
        }
        self._rpc_counters: dict[tuple[str, grpc.StatusCode], Counter] = {}
        self._rpc_histograms: dict[str, Histogram] = {}

    # --- per call -----------------------------------------------------------------------
    def record_auth_refusal(self, method: str, reason: str) -> None:
        self.auth_refusals.labels(split_method(method)[1], reason).inc()

    def record_limit_refusal(self, limit: str) -> None:
        self.limit_refusals.labels(limit).inc()

    def call_started(self) -> None:
        self.inflight_calls.inc()

    def call_ended(self) -> None:
        self.inflight_calls.dec()

    def record_call(self, method: str, status: grpc.StatusCode, duration_seconds: float) -> None:
        """One finished RPC. ``method`` is the full path; only served methods are observed."""
        counter = self._rpc_counters.get((method, status))
        if counter is None:
            service, name = split_method(method)
            counter = self._rpc_counters[(method, status)] = self.grpc_requests.labels(
                "unary", service, name, status.name
            )
        counter.inc()
        histogram = self._rpc_histograms.get(method)
        if histogram is None:
            histogram = self._rpc_histograms[method] = self.grpc_duration.labels(
                "unary", *split_method(method)
            )
        histogram.observe(duration_seconds)

    def record_assembly(
        self, assembly: Assembly, stages: Sequence[StageSpan], *, trace_id: str | None = None
    ) -> None:
        """Everything an answered assembly tells the metrics: ``stages`` are its stages and
        the response's send (``CallState.stages``). ``trace_id`` (hex) becomes an exemplar."""
        exemplar = {"trace_id": trace_id} if trace_id else None
        self._by_outcome[assembly.outcome.value].observe(assembly.duration_seconds, exemplar)
        for stage in stages:
            child = self._by_stage.get(stage.stage) or self._by_stage[OTHER]
            child.observe(max(0, stage.end_ns - stage.start_ns) / 1e9)
        level = self._by_level.get(assembly.degradation)
        if level is not None:
            level.inc()
        for reason in assembly.reasons:
            self._by_reason[normalise_reason(reason, self._known_reasons)].inc()
        for source in assembly.sources:
            kind = _FAILURE_KINDS.get(source.status)
            if kind is not None:
                name = source.source if source.source in SOURCES else OTHER
                self._by_failure[(name, kind)].inc()
            elif source.source == SourceName.COLD and source.status is SourceStatus.OK:
                plan = plan_of(source.detail)
                if plan is not None:
                    self._by_plan[plan if plan in COLD_PLANS else OTHER].inc()
                    if rewalked(source.detail):
                        self.cold_rewalks.inc()
            elif source.source == SourceName.EMBED and source.detail == STAND_IN_DETAIL:
                self.embedding_stand_ins.inc()
        composed = assembly.composed
        self.memories_injected.observe(assembly.memories_injected)
        self.tokens_injected.observe(composed.tokens_injected)
        self.candidates_evaluated.observe(assembly.candidates_evaluated)
        if assembly.memory_budget > 0:
            self.budget_utilisation.observe(assembly.budget_utilisation)

    def record_rejection(self, call_seconds: float, *, trace_id: str | None = None) -> None:
        """A request rejected with INVALID_ARGUMENT: nothing was assembled, so only the
        call's duration under the ``invalid`` outcome (counts would dilute the rest)."""
        exemplar = {"trace_id": trace_id} if trace_id else None
        self._by_outcome[Outcome.INVALID.value].observe(call_seconds, exemplar)

    def record_unfinished_assembly(self, status: grpc.StatusCode, call_seconds: float) -> None:
        """An AssembleContext call that ended (deadline, cancellation, crash, rejection) before
        its report was finished: the caller got no assembly, which the latency and fallback
        panels must show rather than silently drop."""
        outcome, reason = unfinished_outcome(status)
        self._by_outcome[outcome.value].observe(call_seconds)
        if reason is not None:
            self._by_reason[normalise_reason(reason, self._known_reasons)].inc()

    # --- admission ------------------------------------------------------------------------
    def record_admission_shed(self, reason: Reason) -> None:
        child = self._by_shed_reason.get(reason)
        if child is not None:
            child.inc()

    def track_admission(self, active_orgs: Callable[[], float]) -> None:
        """Read the number of orgs sharing the process at scrape time (no update on the request path)."""
        self.admission_active_orgs.set_function(active_orgs)

    # --- post-response work -------------------------------------------------------------
    def track_post_response_queue(self, depth: Callable[[], float]) -> None:
        """Read the queue depth at scrape time (no update on the request path)."""
        self.post_response_queue_depth.set_function(depth)

    def post_response_dropped_items(self, count: int = 1) -> None:
        self.post_response_dropped.inc(count)

    def post_response_failed(self, count: int = 1) -> None:
        self.post_response_failures.inc(count)

    # --- large agents' own graphs --------------------------------------------------------
    def track_graph_builds_queued(self, queued: Callable[[], float]) -> None:
        """Read the build queue's length at scrape time."""
        self.graph_builds_queued.set_function(queued)

    def record_graph_build(self, build: GraphBuildTiming) -> None:
        child = self._graph_builds.get((build.graph, build.built))
        if child is not None:
            child.observe(build.seconds)

    # --- read replicas ------------------------------------------------------------------
    def record_postgres_read(self, target: str, reason: str) -> None:
        self._postgres_reads[(target, reason)].inc()

    def track_replicas(self, statuses: Callable[[], Sequence[ReplicaStatus]], names: Sequence[str]) -> None:
        """Read each replica's state at scrape time (no update on the request path)."""

        def field(name: str, read: Callable[[ReplicaStatus], float]) -> Callable[[], float]:
            return lambda: next((read(s) for s in statuses() if s.name == name), float("nan"))

        for name in names:
            self.replica_lag.labels(name).set_function(field(name, lambda s: s.lag_seconds))
            self.replica_lag_bytes.labels(name).set_function(field(name, lambda s: s.lag_bytes))
            self.replica_up.labels(name).set_function(field(name, lambda s: 1.0 if s.up else 0.0))

    # --- profiles -----------------------------------------------------------------------
    def record_store_up(self, store: str, up: bool) -> None:
        self.store_up.labels(store=store).set(1 if up else 0)

    def record_profile_reload(
        self, ok: bool, *, profiles: int | None = None, at: float | None = None
    ) -> None:
        self.profile_reloads.labels("success" if ok else "failure").inc()
        if ok:
            self.profile_reload_last_success.set(time.time() if at is None else at)
            if profiles is not None:
                self.profiles_loaded.set(profiles)

    def track_query_embedding_cache(self, counts: Callable[[], tuple[int, int, int]]) -> None:
        """Expose the query-embedding cache's (hits, shared, misses), read at scrape time:
        the request path only bumps the cache's own integers."""
        self.registry.register(_QueryEmbeddingCache(counts))

    # --- runtime --------------------------------------------------------------------------
    def record_embedding_turn(self, turn: EmbeddingTurn) -> None:
        """From an embedding worker thread (prometheus_client's histograms are thread-safe)."""
        for phase, seconds in zip(EMBEDDING_PHASES, (turn.queued, turn.computing, turn.on_cpu), strict=True):
            self._embedding[turn.query, phase].observe(seconds)

    def record_gc_pause(self, generation: int, seconds: float) -> None:
        if 0 <= generation < len(self._by_generation):
            self._by_generation[generation].observe(seconds)

    def record_loop_lag(self, seconds: float) -> None:
        self.event_loop_lag.observe(seconds)

    def record_longest_iteration(self, seconds: float) -> None:
        self.event_loop_longest_iteration.observe(seconds)

    # --- introspection for tests and the dashboard check ---------------------------------
    def metric_names(self) -> Iterable[str]:
        """Every sample name this registry exposes (``_bucket``, ``_total`` ... included)."""
        for family in self.registry.collect():
            for sample in family.samples:
                yield sample.name


class _QueryEmbeddingCache(Collector):
    """``ibex_context_query_embedding_lookups_total{result}``: hit (the cache had it),
    shared (joined the same query's embedding in flight), miss (embedded). An agent
    loop's tool calls repeat the turn's query: they should be hits."""

    def __init__(self, counts: Callable[[], tuple[int, int, int]]) -> None:
        self._counts = counts

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "ibex_context_query_embedding_lookups",
            "Query embeddings asked of the cache, by result: hit (cached), shared (joined the "
            "same query's embedding in flight) or miss (embedded).",
            labels=["result"],
        )
        hits, shared, misses = self._counts()
        family.add_metric(["hit"], hits)
        family.add_metric(["shared"], shared)
        family.add_metric(["miss"], misses)
        yield family
