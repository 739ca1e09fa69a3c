"""Observability and the clients against the real server with the session's real Redis and PostgreSQL.

The lead's ``ContextService`` takes its ``Tracing`` and metrics registry by injection;
here spans go to memory, the service's own logs to a JSON buffer, and metrics are
scraped from its metrics port over HTTP.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.models import ChatMessage, FloatVector, NewMemory
from ibex_context.observability.logging import CallContextFilter, JsonFormatter
from ibex_context.observability.metrics import KNOWN_REASONS
from ibex_context.observability.tracing import Tracing
from ibex_context.server.app import ContextService
from ibex_context.tokens.encodings import EncodingRegistry
from ibex_context_client import ContextClient, MemoryClient, MemoryRequestInvalid
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Tenant
from tests.observability.harness import Samples, sample
from tests.server.conftest import make_settings

pytestmark = pytest.mark.integration

MEMORY = "Our Reykjavik office door code is Heron-Tamarind-8842"
DIRECTIVE = "Sign every answer as Commander Pelican-7719"
QUESTION = "What is the Reykjavik office door code? Ask Gladys-Umber-3390"
DISTINCTIVE = ("Heron", "Tamarind", "Pelican", "Gladys", "Umber", "8842", "7719", "3390")
ASSEMBLE = {
    "grpc_type": "unary",
    "grpc_service": "ibex.context.v1.ContextAssemblyService",
    "grpc_method": "AssembleContext",
}


# Sources get the most time a profile allows, so a FULL assembly does not depend on
# this machine's load (the product defaults are 10/15/35 ms).
GENEROUS_PROFILES = {
    "apiVersion": "context.ibex.dev/v1alpha1",
    "kind": "ContextProfileSet",
    "profiles": [
        {
            "name": "tests/generous",
            "selector": {"default": True},
            "deadlines": {"assemblyMs": 45, "directiveMs": 40, "hotMs": 40, "coldMs": 44},
        }
    ],
}


def generous_profiles_file(directory: Path) -> Path:
    path = directory / "profiles.json"
    path.write_text(json.dumps(GENEROUS_PROFILES))
    return path


@dataclass
class Running:
    service: ContextService
    exporter: InMemorySpanExporter
    log_output: io.StringIO

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.service.port}"

    async def scrape(self) -> Samples:
        async with httpx.AsyncClient() as http:
            response = await http.get(f"http://127.0.0.1:{self.service.metrics_port}/metrics")
        response.raise_for_status()
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.text)
            for s in family.samples
        }

    def lines(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.log_output.getvalue().splitlines()]


@pytest.fixture
def service_logs() -> Iterator[io.StringIO]:
    """Everything the service logs under ``ibex_context`` (access log included), as JSON."""
    output = io.StringIO()
    handler = logging.StreamHandler(output)
    handler.addFilter(CallContextFilter())
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("ibex_context")
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield output
    logger.removeHandler(handler)
    logger.setLevel(previous)


async def start(
    redis_url: str, postgres_dsn: str, profiles: Path, encodings: EncodingRegistry
) -> tuple[ContextService, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    service = ContextService(
        make_settings(redis_url, postgres_dsn, profiles_path=profiles),
        encodings=encodings,
        metrics_registry=CollectorRegistry(),
        tracing=Tracing(exporter, sample_ratio=1.0, batch=False),
    )
    await service.start()
    return service, exporter


@pytest.fixture
async def running(
    redis_url: str, postgres_dsn: str, tmp_path: Path, service_logs: io.StringIO, encodings: EncodingRegistry
) -> AsyncIterator[Running]:
    service, exporter = await start(redis_url, postgres_dsn, generous_profiles_file(tmp_path), encodings)
    try:
        yield Running(service, exporter, service_logs)
    finally:
        await service.stop(grace=1.0)


async def seed(target: str, tenant: Tenant) -> None:
    async with MemoryClient(target) as memories:
        await memories.set_directive(tenant.org_id, tenant.agent_id, DIRECTIVE)
        results = await memories.upsert_memories(
            tenant.org_id,
            tenant.agent_id,
            [NewMemory(MEMORY, "factual"), NewMemory("The Oslo office closes at six", "factual")],
        )
    assert [r.outcome for r in results] == ["created", "created"]


async def test_a_real_assembly_is_measured_traced_and_logged_without_its_content(
    running: Running, tenant: Tenant
) -> None:
    await seed(running.target, tenant)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with ContextClient(running.target, timeout=5, tracer=provider.get_tracer("proxy")) as client:
        result = await client.assemble(
            org_id=tenant.org_id,
            agent_id=tenant.agent_id,
            session_id="5b0c1a52-8a4c-4bb5-9d55-0f5a3f0d8a11",
            model="gpt-4o",
            messages=[ChatMessage("user", QUESTION)],
            request_id="obs-real-1",
        )
    samples = await running.scrape()

    # The content really went through the service...
    assert result.from_service, result.fallback_reason
    injected = result.messages[0].content
    assert MEMORY in injected and DIRECTIVE in injected
    assert result.metadata is not None and result.metadata.request_id == "obs-real-1"

    # ...the metrics saw the call...
    outcome = "full" if not result.fallback_reason else "degraded"
    assert sample(samples, "ibex_context_assembly_duration_seconds_count", outcome=outcome) == 1
    assert sample(samples, "grpc_server_handled_total", grpc_code="OK", **ASSEMBLE) == 1
    writes = {"grpc_type": "unary", "grpc_service": "ibex.context.v1.MemoryService", "grpc_code": "OK"}
    assert sample(samples, "grpc_server_handled_total", grpc_method="UpsertMemories", **writes) == 1
    assert sample(samples, "grpc_server_handled_total", grpc_method="SetDirective", **writes) == 1
    assert sample(samples, "ibex_context_memories_injected_sum") == result.metadata.memories_injected
    for stage in ("budget", "directive", "hot", "score", "pack", "format", "serialize"):
        assert sample(samples, "ibex_context_stage_duration_seconds_count", stage=stage) == 1, stage
    assert sample(samples, "ibex_context_inflight_calls") == 0

    # ...the trace continues the proxy's span, with the stages under the server span...
    (client_span,) = exporter.get_finished_spans()
    spans = running.exporter.get_finished_spans()
    (root,) = [s for s in spans if s.kind is SpanKind.SERVER and s.name.endswith("AssembleContext")]
    assert root.parent is not None and root.parent.span_id == client_span.context.span_id
    children = [s for s in spans if s.parent is not None and s.parent.span_id == root.context.span_id]
    assert {"ibex.context.hot", "ibex.context.pack", "ibex.context.serialize"} <= {c.name for c in children}

    # ...and not one attribute, label or log line carries the text or the tenant.
    forbidden = (*DISTINCTIVE, tenant.org_id, tenant.agent_id, "5b0c1a52")
    for span in (*spans, client_span):
        for key, value in (span.attributes or {}).items():
            text = " ".join(map(str, value)) if isinstance(value, tuple) else str(value)
            assert not [f for f in forbidden if f in text], (span.name, key)
    label_values = {value for _, labels in samples for _, value in labels}
    assert not [v for v in label_values if any(f in v for f in forbidden)]
    log_text = running.log_output.getvalue()
    assert not [f for f in forbidden if f in log_text]
    (access,) = [
        line
        for line in running.lines()
        if line["msg"] == "rpc" and line.get("rpc_method") == "AssembleContext"
    ]
    assert access["request_id"] == "obs-real-1"
    assert access["trace_id"] == f"{root.context.trace_id:032x}"
    assert access["memories_injected"] == result.metadata.memories_injected


async def test_a_rejected_request_is_counted_logged_and_returned_as_a_client_fallback(
    running: Running,
) -> None:
    async with ContextClient(running.target, timeout=5) as client:
        result = await client.assemble(
            org_id="not-a-uuid", agent_id="also-not", model="gpt-4o", messages=[ChatMessage("user", QUESTION)]
        )
    samples = await running.scrape()

    assert result.fallback_reason == "client_invalid_argument"
    assert result.messages == (ChatMessage("user", QUESTION),)
    assert sample(samples, "grpc_server_handled_total", grpc_code="INVALID_ARGUMENT", **ASSEMBLE) == 1
    assert sample(samples, "ibex_context_assembly_duration_seconds_count", outcome="invalid") == 1
    (access,) = [line for line in running.lines() if line["msg"] == "rpc"]
    assert access["outcome"] == "invalid"
    assert access["invalid_field"] == "org_id"
    assert "Gladys" not in running.log_output.getvalue()


async def test_the_memory_client_names_the_field_the_real_service_rejected(running: Running) -> None:
    async with MemoryClient(running.target) as memories:
        with pytest.raises(MemoryRequestInvalid) as caught:
            await memories.set_directive("not-a-uuid", "x", DIRECTIVE)
    assert caught.value.field == "org_id"


class SlowWhenAsked(HashingEmbedder):
    """The real hashing embedder, made slower than any deadline on demand (writes stay fast)."""

    def __init__(self) -> None:
        super().__init__(384)
        self.delay = 0.0

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        if self.delay:
            await asyncio.sleep(self.delay)
        return await super().embed(texts)


async def test_a_real_degradation_shows_up_as_known_fallback_reasons(
    redis_url: str,
    postgres_dsn: str,
    tenant: Tenant,
    tmp_path: Path,
    service_logs: io.StringIO,
    encodings: EncodingRegistry,
) -> None:
    embedder = SlowWhenAsked()
    service = ContextService(
        make_settings(redis_url, postgres_dsn, profiles_path=generous_profiles_file(tmp_path)),
        embedder=embedder,
        encodings=encodings,
        metrics_registry=CollectorRegistry(),
        tracing=Tracing(),
    )
    await service.start()
    running = Running(service, InMemorySpanExporter(), service_logs)
    try:
        await seed(running.target, tenant)
        embedder.delay = 1.0
        async with ContextClient(running.target, timeout=5) as client:
            result = await client.assemble(
                org_id=tenant.org_id,
                agent_id=tenant.agent_id,
                model="gpt-4o",
                messages=[ChatMessage("user", QUESTION)],
            )
        samples = await running.scrape()
    finally:
        await service.stop(grace=1.0)

    assert result.from_service
    assert result.metadata is not None
    reasons = list(result.metadata.degradation_reasons)
    assert "embed_timeout" in reasons
    assert set(reasons) <= KNOWN_REASONS, "a reason the metrics would count as 'other'"
    for reason in reasons:
        assert sample(samples, "ibex_context_fallbacks_total", reason=reason) == 1, reason
    assert sample(samples, "ibex_context_fallbacks_total", reason="other") == 0
    assert sample(samples, "ibex_context_retrieval_failures_total", source="embed", kind="timeout") == 1
    # degraded (hot memories still injected) or, on a loaded machine, fallback (directive only)
    degraded_or_fallback = sum(
        sample(samples, "ibex_context_assembly_duration_seconds_count", outcome=o)
        for o in ("degraded", "fallback")
    )
    assert degraded_or_fallback == 1
    assert sample(samples, "ibex_context_assembly_duration_seconds_count", outcome="full") == 0
    (access,) = [line for line in running.lines() if line.get("rpc_method") == "AssembleContext"]
    assert access["reasons"] == reasons
    assert access["sources"]["embed"] == "timeout"  # type: ignore[index]


async def test_healthz_on_the_metrics_port_reports_the_stores(running: Running) -> None:
    async with httpx.AsyncClient() as http:
        response = await http.get(f"http://127.0.0.1:{running.service.metrics_port}/healthz")
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok"
    assert "stores" in body
