"""Helpers of the observability tests: an instrumented scripted server with its metrics
endpoint, in-memory spans and captured JSON logs."""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import httpx
from ibex_context.devtools.scripted_service import RunningServer, ScriptedAssembly, scripted_server
from ibex_context.observability.exposition import MetricsServer, start_metrics_server
from ibex_context.observability.logging import CallContextFilter, JsonFormatter
from ibex_context.observability.metrics import Metrics
from ibex_context.observability.tracing import Tracing
from ibex_context.server.rpc import Method
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def sample(samples: Samples, name: str, **labels: str) -> float:
    """The value of one sample; 0 when absent (a counter that never moved)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


@dataclass
class Observed:
    """An instrumented scripted server, its metrics endpoint, spans and access log."""

    server: RunningServer
    metrics: Metrics
    exporter: InMemorySpanExporter
    tracing: Tracing
    metrics_server: MetricsServer
    log_output: io.StringIO

    @property
    def target(self) -> str:
        return self.server.target

    @property
    def service(self) -> ScriptedAssembly:
        return self.server.service

    async def scrape(self) -> Samples:
        async with httpx.AsyncClient() as http:
            response = await http.get(f"http://127.0.0.1:{self.metrics_server.port}/metrics")
        response.raise_for_status()
        samples: Samples = {}
        for family in text_string_to_metric_families(response.text):
            for s in family.samples:
                samples[(s.name, frozenset(s.labels.items()))] = s.value
        return samples

    def log_lines(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log_output.getvalue().splitlines() if line]

    def access_lines(self) -> list[dict[str, object]]:
        return [line for line in self.log_lines() if line.get("msg") == "rpc"]


ObservedFactory = Callable[..., AbstractAsyncContextManager[Observed]]


@asynccontextmanager
async def observed_server(
    *, sample_ratio: float = 1.0, slow_ms: float = 40.0, extra_methods: Sequence[Method] = ()
) -> AsyncIterator[Observed]:
    metrics = Metrics(CollectorRegistry())
    exporter = InMemorySpanExporter()
    tracing = Tracing(exporter, sample_ratio=sample_ratio, slow_ms=slow_ms, batch=False)
    # Everything the server logs (access log and handler logs) goes to one JSON stream.
    output = io.StringIO()
    handler = logging.StreamHandler(output)
    handler.addFilter(CallContextFilter())
    handler.setFormatter(JsonFormatter())
    base = logging.getLogger(f"tests.observed.{uuid.uuid4().hex}")
    base.setLevel(logging.INFO)
    base.propagate = False
    base.addHandler(handler)
    service = ScriptedAssembly(log=base.getChild("handler"))
    metrics_server = start_metrics_server(0, metrics.registry, host="127.0.0.1")
    try:
        async with scripted_server(
            metrics=metrics,
            tracing=tracing,
            access_log=base.getChild("access"),
            service=service,
            extra_methods=extra_methods,
        ) as server:
            yield Observed(server, metrics, exporter, tracing, metrics_server, output)
    finally:
        await metrics_server.close()
        tracing.shutdown()
        base.removeHandler(handler)
