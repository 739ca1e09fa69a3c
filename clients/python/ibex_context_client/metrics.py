"""Prometheus metrics of ``ContextClient`` (the ``prometheus`` extra: prometheus_client).

Registered only when the caller passes ``registry=``; without it the client imports none of this.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from ibex_context_client.buckets import ASSEMBLY_BUCKETS
from ibex_context_client.results import CLIENT_RESULTS, AssembleResult

__all__ = ["ClientMetrics"]


class ClientMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.results = Counter(
            "ibex_context_client_requests",
            "AssembleContext calls by result: ok, degraded (by the service) or the client fallback.",
            ["result"],
            registry=registry,
        )
        self.duration = Histogram(
            "ibex_context_client_duration_seconds",
            "Client-side wall time of AssembleContext, fallbacks included.",
            buckets=ASSEMBLY_BUCKETS,
            registry=registry,
        )
        for result in CLIENT_RESULTS:
            self.results.labels(result)

    def record(self, result: AssembleResult) -> None:
        if result.from_service:
            label = "degraded" if result.fallback_reason else "ok"
        else:
            label = result.fallback_reason.partition(":")[0]
        self.results.labels(label).inc()
        self.duration.observe(result.elapsed_seconds)
