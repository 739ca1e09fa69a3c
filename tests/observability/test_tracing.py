"""Spans built after each call: structure, propagation, the end-of-call sampling rule, no content."""

from __future__ import annotations

import http.server
import threading
import time
from typing import ClassVar

import grpc
from ibex_context.devtools import scripted_service as scripted
from ibex_context.models import ChatMessage
from ibex_context.observability.state import CallState
from ibex_context.observability.tracing import Tracing, ratio_keeps, sampling_decision
from ibex_context.pipeline.outcome import STAGES
from ibex_context.settings import Settings
from ibex_context_client import ContextClient
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.observability.harness import ObservedFactory

USER_TEXT = "Please remember my locker code is Marmalade-Osprey-3301"
MESSAGES = [ChatMessage("system", "You are terse."), ChatMessage("user", USER_TEXT)]
RPC_NAME = "ibex.context.v1.ContextAssemblyService/AssembleContext"


def decide(**changes: object) -> str | None:
    args: dict[str, object] = {
        "parent_sampled": None,
        "failed": False,
        "degraded": False,
        "duration_ms": 5.0,
        "slow_ms": 40.0,
        "trace_id": 1 << 100,  # low 64 bits zero: kept by any ratio > 0
        "ratio": 0.0,
    }
    args.update(changes)
    return sampling_decision(**args)  # type: ignore[arg-type]


def client_tracer() -> tuple[trace.Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test-proxy"), exporter


def server_spans(spans: tuple[ReadableSpan, ...]) -> tuple[ReadableSpan, list[ReadableSpan]]:
    roots = [s for s in spans if s.kind is SpanKind.SERVER]
    assert len(roots) == 1, [s.name for s in spans]
    return roots[0], [s for s in spans if s.kind is not SpanKind.SERVER]


# --- the sampling rule ---------------------------------------------------------------


def test_a_sampled_caller_always_gets_our_spans() -> None:
    assert decide(parent_sampled=True) == "parent"


def test_failed_degraded_and_slow_calls_are_kept_even_at_ratio_zero() -> None:
    assert decide(failed=True) == "error"
    assert decide(degraded=True) == "degraded"
    assert decide(duration_ms=41.0) == "slow"
    assert decide(parent_sampled=False, failed=True) == "error"


def test_ordinary_calls_follow_the_ratio_by_trace_id() -> None:
    low = 5  # low 64 bits tiny: inside any positive ratio
    high = (1 << 64) - 1  # low 64 bits maximal: outside any ratio below 1
    assert decide(trace_id=low, ratio=0.01) == "ratio"
    assert decide(trace_id=high, ratio=0.01) is None
    assert decide(trace_id=low, ratio=0.0) is None
    assert ratio_keeps(high, 1.0)


def test_a_caller_that_chose_not_to_sample_is_respected_for_ordinary_calls() -> None:
    assert decide(parent_sampled=False, trace_id=5, ratio=1.0) is None


# --- real calls ----------------------------------------------------------------------


async def test_one_server_span_with_a_child_per_stage_inside_it(observed_factory: ObservedFactory) -> None:
    async with observed_factory(sample_ratio=1.0) as observed, ContextClient(observed.target, timeout=5) as c:
        await c.assemble(org_id="o", agent_id="a", model=scripted.FULL, messages=MESSAGES, request_id="req-1")
        root, children = server_spans(observed.exporter.get_finished_spans())

    assert root.name == RPC_NAME
    assert root.attributes is not None
    assert root.attributes["rpc.grpc.status_code"] == 0
    assert root.attributes["ibex.request_id"] == "req-1"
    assert root.attributes["ibex.outcome"] == "full"
    assert root.attributes["ibex.memories_injected"] == 2
    assert [c.name for c in children] == [f"ibex.context.{s}" for s in STAGES]
    assert root.start_time is not None and root.end_time is not None
    for child in children:
        assert child.parent is not None and child.parent.span_id == root.context.span_id
        assert child.context.trace_id == root.context.trace_id
        assert child.start_time is not None and child.end_time is not None
        assert root.start_time <= child.start_time <= child.end_time <= root.end_time


async def test_the_server_span_continues_the_proxy_client_span(observed_factory: ObservedFactory) -> None:
    tracer, client_exporter = client_tracer()
    async with (
        observed_factory(sample_ratio=0.0) as observed,
        ContextClient(observed.target, timeout=5, tracer=tracer) as c,
    ):
        await c.assemble(org_id="o", agent_id="a", model=scripted.FULL, messages=MESSAGES)
        root, _ = server_spans(observed.exporter.get_finished_spans())

    (client_span,) = client_exporter.get_finished_spans()
    assert client_span.kind is SpanKind.CLIENT
    assert root.parent is not None
    assert root.parent.span_id == client_span.context.span_id
    assert root.context.trace_id == client_span.context.trace_id
    assert root.attributes is not None and root.attributes["ibex.sampling.reason"] == "parent"
    assert observed.service.seen_metadata[0]["traceparent"].startswith("00-")


async def test_the_callers_current_span_is_propagated_without_a_client_tracer(
    observed_factory: ObservedFactory,
) -> None:
    tracer, _ = client_tracer()
    async with observed_factory(sample_ratio=0.0) as observed, ContextClient(observed.target, timeout=5) as c:
        with tracer.start_as_current_span("proxy.request") as proxy_span:
            await c.assemble(org_id="o", agent_id="a", model=scripted.FULL, messages=MESSAGES)
        root, _ = server_spans(observed.exporter.get_finished_spans())

    assert root.parent is not None and root.parent.span_id == proxy_span.get_span_context().span_id


async def test_an_unsampled_ordinary_call_exports_nothing_but_a_degraded_one_is_kept(
    observed_factory: ObservedFactory,
) -> None:
    async with observed_factory(sample_ratio=0.0) as observed, ContextClient(observed.target, timeout=5) as c:
        await c.assemble(org_id="o", agent_id="a", model=scripted.FULL, messages=MESSAGES)
        assert observed.exporter.get_finished_spans() == ()
        await c.assemble(org_id="o", agent_id="a", model=scripted.COLD_TIMEOUT, messages=MESSAGES)
        root, children = server_spans(observed.exporter.get_finished_spans())

    assert root.attributes is not None
    assert root.attributes["ibex.sampling.reason"] == "degraded"
    assert root.attributes["ibex.fallback_reason"] == "cold_timeout"
    cold = next(c for c in children if c.name == "ibex.context.cold")
    assert cold.status.status_code is StatusCode.ERROR
    assert cold.attributes is not None and cold.attributes["ibex.source.status"] == "timeout"


async def test_a_crashed_call_is_kept_and_marked_as_an_error(observed_factory: ObservedFactory) -> None:
    async with observed_factory(sample_ratio=0.0) as observed, ContextClient(observed.target, timeout=5) as c:
        await c.assemble(org_id="o", agent_id="a", model=scripted.CRASH, messages=MESSAGES)
        root, _ = server_spans(observed.exporter.get_finished_spans())

    assert root.status.status_code is StatusCode.ERROR
    assert root.attributes is not None and root.attributes["rpc.grpc.status_code"] == 2  # UNKNOWN


async def test_no_span_attribute_contains_message_memory_directive_text_or_tenant_ids(
    observed_factory: ObservedFactory,
) -> None:
    tracer, client_exporter = client_tracer()
    async with (
        observed_factory(sample_ratio=1.0) as observed,
        ContextClient(observed.target, timeout=5, tracer=tracer) as c,
    ):
        results = [
            await c.assemble(
                org_id="org-7f3a",
                agent_id="agent-91bc",
                session_id="sess-55de",
                model=model,
                messages=MESSAGES,
            )
            for model in (scripted.FULL, scripted.COLD_TIMEOUT, scripted.INVALID)
        ]
        spans = [*observed.exporter.get_finished_spans(), *client_exporter.get_finished_spans()]

    # The memory text really went through these calls...
    assert scripted.MEMORY_TEXT in results[0].messages[0].content
    assert len(spans) > 10
    # ...and none of it, nor the caller's text or ids, is on any span.
    forbidden = [
        "Marmalade",
        "Osprey",
        "PAPAYA",
        "quokka",
        "Nebula",
        "terse",
        "org-7f3a",
        "agent-91bc",
        "sess-55de",
    ]
    for span in spans:
        for key, value in (span.attributes or {}).items():
            text = " ".join(map(str, value)) if isinstance(value, tuple) else str(value)
            assert not [f for f in forbidden if f in text], (span.name, key, value)
        assert not [f for f in forbidden if f in span.name]


# --- exporters from settings -----------------------------------------------------------


class _Collector(http.server.BaseHTTPRequestHandler):
    bodies: ClassVar[list[tuple[str, bytes]]] = []

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        self.bodies.append((self.path, self.rfile.read(length)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_exporter_none_disables_export_but_still_reads_the_callers_trace_id() -> None:
    tracing = Tracing.from_settings(Settings(tracing_exporter="none"))
    incoming = tracing.extract({"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
    assert not tracing.enabled
    assert incoming.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736
    assert incoming.parent_sampled is True


def test_a_malformed_traceparent_starts_a_fresh_trace() -> None:
    incoming = Tracing().extract({"traceparent": "00-zzzz-not-a-trace-01"})
    assert incoming.context is None and incoming.parent_sampled is None
    assert incoming.trace_id != 0


def test_the_otlp_exporter_posts_the_spans_to_the_configured_endpoint() -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        tracing = Tracing.from_settings(Settings(tracing_exporter="otlp", otlp_endpoint=endpoint))
        state = CallState(method="/" + RPC_NAME, start_ns=0, epoch_offset_ns=time.time_ns(), trace_id=7)
        state.status, state.end_ns = grpc.StatusCode.UNKNOWN, 2_000_000  # an error: always kept
        assert tracing.record(state) == f"{7:032x}"
        assert tracing.force_flush()
        tracing.shutdown()
    finally:
        server.shutdown()
        thread.join()
        server.server_close()

    (path, body), *_ = _Collector.bodies
    request = ExportTraceServiceRequest.FromString(body)
    (span,) = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    resource = {a.key: a.value.string_value for a in request.resource_spans[0].resource.attributes}
    assert path == "/v1/traces"
    assert span.name == RPC_NAME
    assert span.trace_id == (7).to_bytes(16, "big")
    assert resource["service.name"] == "ibex-context"
