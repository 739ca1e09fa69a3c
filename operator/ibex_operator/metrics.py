"""The operator's own Prometheus metrics (``IBEX_OPERATOR_METRICS_PORT``, /metrics).

Labels come from fixed sets only: no profile, namespace-tenant or object names.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.reconciles = Counter(
            "ibex_operator_reconciles",
            "Namespace reconciles by result (error: the API server failed; kopf retries).",
            ["result"],
            registry=self.registry,
        )
        self.changes = Counter(
            "ibex_operator_changes",
            "Children written: ConfigMaps and HPAs created, updated or deleted.",
            ["kind", "action"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "ibex_operator_reconcile_duration_seconds",
            "Wall time of one namespace reconcile (list, plan, write).",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
            registry=self.registry,
        )
        self.drift_repairs = Counter(
            "ibex_operator_drift_repairs",
            "Children the drift loop found deleted or hand-edited and restored.",
            registry=self.registry,
        )
        self.leader = Gauge(
            "ibex_operator_leader",
            "1 while this replica is the one working (the peering's highest priority), else 0.",
            registry=self.registry,
        )
        self.last_success = Gauge(
            "ibex_operator_last_success_timestamp_seconds",
            "When a reconcile last succeeded (Unix time).",
            registry=self.registry,
        )
        for result in ("success", "error"):
            self.reconciles.labels(result)
        self.leader.set(1)
