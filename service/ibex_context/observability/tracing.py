"""Spans of the service, built after each call from its ``CallState`` and ``Assembly``.

Starting live spans on the request path (OpenTelemetry's grpcio instrumentation does)
would cost time inside the deadline. So nothing is traced while the call runs:
the caller's ``traceparent`` is parsed at call start, and after the response one
SERVER span (named after the RPC, parented on the caller's span) and one child span
per assembly stage are created with explicit start and end timestamps.

Because the spans are built at the end, the sampling decision is made at the end too,
knowing how the call went (see ``sampling_decision``): a trace is kept when the caller
sampled it, when the call failed, degraded or was slow, and otherwise with probability
``sample_ratio`` (by trace id, like ``TraceIdRatioBased``, so every service keeps the
same traces).

Span attributes carry counts, timings, outcomes, reasons, the model and the profile
name, plus the request id. Never message, memory or directive text, and no tenant,
agent or session id (ADR-0006).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata as package_metadata
from typing import TYPE_CHECKING

import grpc
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ibex_context.observability.metrics import split_method
from ibex_context.pipeline.assembly import Assembly
from ibex_context.pipeline.outcome import Outcome, SourceResult, SourceStatus

if TYPE_CHECKING:
    from ibex_context.observability.state import CallState
    from ibex_context.settings import Settings

AttributeValue = str | bool | int | float | tuple[str, ...]

# Server-side gRPC codes that mark a span as an error (OpenTelemetry RPC semantic
# conventions); INVALID_ARGUMENT and friends are the caller's problem, not ours.
SERVER_ERROR_CODES: frozenset[grpc.StatusCode] = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
_MAX_DETAIL_CHARS = 200
_TRACE_ID_LOW_MASK = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class IncomingTrace:
    """The caller's trace context as read from gRPC metadata."""

    context: Context | None
    trace_id: int
    parent_sampled: bool | None


def ratio_keeps(trace_id: int, ratio: float) -> bool:
    """The ``TraceIdRatioBased`` rule: keep when the low 64 bits fall under ratio * 2^64."""
    return (trace_id & _TRACE_ID_LOW_MASK) < round(ratio * (1 << 64))


def sampling_decision(
    *,
    parent_sampled: bool | None,
    failed: bool,
    degraded: bool,
    duration_ms: float,
    slow_ms: float,
    trace_id: int,
    ratio: float,
) -> str | None:
    """Why this call's trace is kept, or None to drop it.

    A caller that sampled its trace gets our spans (its trace would be broken
    otherwise). Failed, degraded and slow calls are always kept: they are the ones
    someone will look for. The rest are kept at ``ratio``, but only when the caller
    sent no trace context; a caller that decided not to sample is respected.
    """
    if parent_sampled:
        return "parent"
    if failed:
        return "error"
    if degraded:
        return "degraded"
    if duration_ms >= slow_ms:
        return "slow"
    if parent_sampled is None and ratio_keeps(trace_id, ratio):
        return "ratio"
    return None


DEFAULT_SERVICE_NAME = "ibex-context"
# Read by the OpenTelemetry SDK itself (Settings reads the others: exporter, protocol, sampler,
# service name); docs/observability.md lists them.
SDK_READ_VARIABLES = frozenset(
    {
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
        "OTEL_EXPORTER_OTLP_COMPRESSION",
        "OTEL_RESOURCE_ATTRIBUTES",
    }
)


def service_resource(service_name: str = "") -> Resource:
    """The spans' resource: OTEL_RESOURCE_ATTRIBUTES (read by the SDK) with service.version, and
    service.name from OTEL_SERVICE_NAME, else the attributes' service.name, else ibex-context."""
    attributes: dict[str, str] = {"service.version": _version()}
    if service_name:
        attributes["service.name"] = service_name
    resource = Resource.create(attributes)
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    return resource


def sample_ratio(settings: Settings) -> float:
    """The share of ordinary calls traced: OTEL_TRACES_SAMPLER(_ARG) when set, else
    IBEX_TRACING_SAMPLE_RATIO. The parent-based variants act like the plain ones: a caller's
    decision is always followed (``sampling_decision``), and failed, degraded and slow calls are
    kept whatever the sampler says."""
    sampler = settings.traces_sampler.removeprefix("parentbased_")
    if not sampler:
        return settings.tracing_sample_ratio
    if sampler == "always_on":
        return 1.0
    if sampler == "always_off":
        return 0.0
    return 1.0 if settings.traces_sampler_arg is None else settings.traces_sampler_arg


def otlp_exporter(settings: Settings) -> SpanExporter:
    """OTLP over HTTP (protobuf) or gRPC. Without the deprecated IBEX_OTLP_ENDPOINT the SDK reads
    the endpoint, headers, certificate, timeout and compression from the OTEL_EXPORTER_OTLP_*
    variables itself, with the standard's semantics (a base endpoint gets /v1/traces over HTTP)."""
    endpoint = settings.otlp_endpoint or None
    if settings.otlp_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcSpanExporter,
        )

        return GrpcSpanExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint)


class _PresetTraceIds(IdGenerator):
    """Hands out the trace id chosen at call start for the next root span.

    A call without a caller trace gets its trace id when the request arrives (so log
    lines written during the call carry it), but its spans are created afterwards;
    the SDK asks the id generator for a trace id for any span without a valid parent.
    """

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self.next_trace_id = 0

    def generate_span_id(self) -> int:
        return self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        trace_id, self.next_trace_id = self.next_trace_id, 0
        return trace_id or self._random.generate_trace_id()


class Tracing:
    """Builds spans for finished calls and exports them. ``exporter=None`` disables export.

    Even disabled, ``extract`` still reads the caller's trace id, so log lines stay
    joinable with the caller's traces.
    """

    def __init__(
        self,
        exporter: SpanExporter | None = None,
        *,
        sample_ratio: float = 0.01,
        slow_ms: float = 40.0,
        batch: bool = True,
        service_name: str = "",
    ) -> None:
        self.sample_ratio = sample_ratio
        self.slow_ms = slow_ms
        self._propagator = TraceContextTextMapPropagator()
        self._ids = _PresetTraceIds()
        self._provider: TracerProvider | None = None
        self._tracer: trace.Tracer | None = None
        if exporter is not None:
            resource = service_resource(service_name)
            self._provider = TracerProvider(resource=resource, sampler=ALWAYS_ON, id_generator=self._ids)
            processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
            self._provider.add_span_processor(processor)
            self._tracer = self._provider.get_tracer("ibex_context.observability", _version())

    @classmethod
    def from_settings(cls, settings: Settings) -> Tracing:
        exporter: SpanExporter | None
        if settings.tracing_exporter == "otlp":
            exporter = otlp_exporter(settings)
        elif settings.tracing_exporter == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporter = ConsoleSpanExporter()
        else:
            exporter = None
        return cls(
            exporter,
            sample_ratio=sample_ratio(settings),
            slow_ms=settings.tracing_slow_ms,
            batch=settings.tracing_exporter == "otlp",
            service_name=settings.service_name,
        )

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def extract(self, metadata: Mapping[str, str | bytes]) -> IncomingTrace:
        """Read W3C ``traceparent``/``tracestate`` from gRPC metadata (lower-case keys)."""
        traceparent = metadata.get("traceparent")
        if isinstance(traceparent, str):
            carrier = {"traceparent": traceparent}
            tracestate = metadata.get("tracestate")
            if isinstance(tracestate, str):
                carrier["tracestate"] = tracestate
            context = self._propagator.extract(carrier)
            parent = trace.get_current_span(context).get_span_context()
            if parent.is_valid:
                return IncomingTrace(context, parent.trace_id, parent.trace_flags.sampled)
        return IncomingTrace(None, random.getrandbits(128) or 1, None)

    def record(self, state: CallState) -> str | None:
        """Export the spans of a finished call if it is kept; return its trace id (hex) if so."""
        if self._tracer is None or state.status is None:
            return None
        assembly = state.assembly
        reason = sampling_decision(
            parent_sampled=state.parent_sampled,
            failed=state.status is not grpc.StatusCode.OK,
            degraded=assembly is not None and (assembly.outcome in _DEGRADED or bool(assembly.reasons)),
            duration_ms=state.duration_seconds * 1000,
            slow_ms=self.slow_ms,
            trace_id=state.trace_id,
            ratio=self.sample_ratio,
        )
        if reason is None:
            return None
        self._emit(self._tracer, state, reason)
        return state.trace_id_hex

    def _emit(self, tracer: trace.Tracer, state: CallState, sampling_reason: str) -> None:
        assert state.status is not None
        self._ids.next_trace_id = 0 if state.parent is not None else state.trace_id
        try:
            root = tracer.start_span(
                state.method.lstrip("/"),
                context=state.parent,
                kind=SpanKind.SERVER,
                attributes=call_attributes(state, sampling_reason),
                start_time=state.to_epoch_ns(state.start_ns),
            )
        finally:
            self._ids.next_trace_id = 0
        if state.status in SERVER_ERROR_CODES:
            root.set_status(StatusCode.ERROR, state.status.name)
        if state.assembly is not None:
            inside_root = trace.set_span_in_context(root)
            # Stage names are plain strings; a source's name equals its stage's.
            sources: dict[str, SourceResult] = {s.source: s for s in state.assembly.sources}
            for stage in state.stages:
                source = sources.get(stage.stage)
                child = tracer.start_span(
                    f"ibex.context.{stage.stage}",
                    context=inside_root,
                    kind=SpanKind.INTERNAL,
                    attributes=source_attributes(source) if source else None,
                    start_time=state.to_epoch_ns(stage.start_ns),
                )
                if source is not None and source.status in (SourceStatus.TIMEOUT, SourceStatus.ERROR):
                    child.set_status(StatusCode.ERROR, source.status.name.lower())
                child.end(end_time=state.to_epoch_ns(stage.end_ns))
        root.end(end_time=state.to_epoch_ns(state.end_ns))

    def force_flush(self, timeout_millis: int = 5000) -> bool:
        return self._provider.force_flush(timeout_millis) if self._provider else True

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()


_DEGRADED = frozenset({Outcome.DEGRADED, Outcome.FALLBACK})


def call_attributes(state: CallState, sampling_reason: str) -> dict[str, AttributeValue]:
    """Attributes of the SERVER span: ids of the call, never of the tenant, never text."""
    service, method = split_method(state.method)
    attributes: dict[str, AttributeValue] = {
        "rpc.system": "grpc",
        "rpc.service": service,
        "rpc.method": method,
        "ibex.sampling.reason": sampling_reason,
    }
    if state.status is not None:
        attributes["rpc.grpc.status_code"] = state.status.value[0]  # (number, name)
    if state.request_id:
        attributes["ibex.request_id"] = state.request_id
    if state.deadline_ms is not None:
        attributes["ibex.deadline_ms"] = round(state.deadline_ms, 3)
    if state.assembly is not None:
        attributes.update(assembly_attributes(state.assembly))
    elif state.rejection is not None:
        attributes["ibex.outcome"] = state.rejection.outcome.value
        attributes["ibex.model"] = state.rejection.model
        attributes["ibex.invalid_field"] = state.rejection.field
    return attributes


def assembly_attributes(assembly: Assembly) -> dict[str, AttributeValue]:
    composed = assembly.composed
    attributes: dict[str, AttributeValue] = {
        "ibex.outcome": assembly.outcome.value,
        "ibex.degradation": assembly.degradation.name.lower(),
        "ibex.model": assembly.model,
        "ibex.profile": assembly.profile,
        "ibex.directive_injected": composed.directive_injected,
        "ibex.memories_injected": assembly.memories_injected,
        "ibex.memories_available": composed.memories_available,
        "ibex.candidates_evaluated": assembly.candidates_evaluated,
        "ibex.tokens_injected": composed.tokens_injected,
        "ibex.memory_budget": assembly.memory_budget,
        "ibex.memory_tokens_used": composed.memory_tokens,
        "ibex.budget_utilisation": round(assembly.budget_utilisation, 4),
        "ibex.encoding": assembly.encoding,
        "ibex.exact_tokens": assembly.exact_tokens,
    }
    if assembly.reasons:
        attributes["ibex.fallback_reason"] = assembly.reasons[0]
        attributes["ibex.degradation_reasons"] = tuple(assembly.reasons)
    return attributes


def source_attributes(source: SourceResult) -> dict[str, AttributeValue]:
    attributes: dict[str, AttributeValue] = {
        "ibex.source.status": source.status.name.lower(),
        "ibex.source.count": source.found,
    }
    if source.detail:
        attributes["ibex.source.detail"] = source.detail[:_MAX_DETAIL_CHARS]
    return attributes


def _version() -> str:
    try:
        return package_metadata.version("ibex-context")
    except package_metadata.PackageNotFoundError:
        return "0+unknown"
