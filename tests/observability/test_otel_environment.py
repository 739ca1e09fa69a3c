"""Tracing configured the way platform teams configure every OpenTelemetry SDK: the standard OTEL_*
variables (exporter, endpoint, protocol including gRPC, sampler, service name, resource attributes),
with the older IBEX_* names still working. Spans go to real collectors over a real socket."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import ClassVar

import grpc
import pytest
from ibex_context.observability.state import CallState
from ibex_context.observability.tracing import Tracing, sample_ratio, service_resource
from ibex_context.settings import Settings
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

OTEL_NAMES = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "IBEX_TRACING_EXPORTER",
    "IBEX_OTLP_ENDPOINT",
    "IBEX_TRACING_SAMPLE_RATIO",
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_NAMES:
        monkeypatch.delenv(name, raising=False)


def failed_call(trace_id: int) -> CallState:
    state = CallState(
        method="/ibex.context.v1.ContextAssemblyService/AssembleContext",
        start_ns=0,
        epoch_offset_ns=time.time_ns(),
        trace_id=trace_id,
    )
    state.status, state.end_ns = grpc.StatusCode.UNKNOWN, 2_000_000  # an error: always kept
    return state


def export_one(trace_id: int) -> None:
    tracing = Tracing.from_settings(Settings())
    assert tracing.record(failed_call(trace_id)) == f"{trace_id:032x}"
    assert tracing.force_flush()
    tracing.shutdown()


def resource_of(request: ExportTraceServiceRequest) -> dict[str, str]:
    return {a.key: a.value.string_value for a in request.resource_spans[0].resource.attributes}


class _HttpCollector(http.server.BaseHTTPRequestHandler):
    bodies: ClassVar[list[tuple[str, bytes]]] = []

    def do_POST(self) -> None:
        self.bodies.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture()
def http_collector() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    _HttpCollector.bodies = []
    server = http.server.HTTPServer(("127.0.0.1", 0), _HttpCollector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _HttpCollector.bodies
    finally:
        server.shutdown()
        thread.join()
        server.server_close()


class _GrpcCollector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []

    def Export(
        self, request: ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture()
def grpc_collector() -> Iterator[tuple[str, _GrpcCollector]]:
    collector = _GrpcCollector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", collector
    finally:
        server.stop(0).wait(5)


def test_otlp_over_http_goes_to_the_standard_base_endpoint_plus_v1_traces(
    monkeypatch: pytest.MonkeyPatch, http_collector: tuple[str, list[tuple[str, bytes]]]
) -> None:
    base, bodies = http_collector
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", base)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "context-eu-1")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,k8s.pod.name=ibex-7")
    export_one(11)
    (path, body), *_ = bodies
    assert path == "/v1/traces"
    resource = resource_of(ExportTraceServiceRequest.FromString(body))
    assert resource["service.name"] == "context-eu-1"
    assert resource["deployment.environment"] == "prod" and resource["k8s.pod.name"] == "ibex-7"
    assert resource["service.version"]


def test_otlp_over_grpc_when_the_protocol_says_so(
    monkeypatch: pytest.MonkeyPatch, grpc_collector: tuple[str, _GrpcCollector]
) -> None:
    endpoint, collector = grpc_collector
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    export_one(12)
    (request,) = collector.requests
    (span,) = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert span.trace_id == (12).to_bytes(16, "big")
    assert resource_of(request)["service.name"] == "ibex-context"


def test_the_deprecated_ibex_names_still_work_and_an_otel_name_set_beside_one_wins(
    monkeypatch: pytest.MonkeyPatch, http_collector: tuple[str, list[tuple[str, bytes]]]
) -> None:
    base, bodies = http_collector
    monkeypatch.setenv("IBEX_TRACING_EXPORTER", "otlp")
    monkeypatch.setenv("IBEX_OTLP_ENDPOINT", f"{base}/custom/traces")
    export_one(13)
    assert [path for path, _ in bodies] == ["/custom/traces"]
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert Settings().tracing_exporter == "none"


def test_service_name_from_the_resource_attributes_when_otel_service_name_is_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert service_resource().attributes["service.name"] == "ibex-context"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes")
    assert service_resource().attributes["service.name"] == "from-attributes"
    assert service_resource("explicit").attributes["service.name"] == "explicit"


@pytest.mark.parametrize(
    ("sampler", "arg", "ratio"),
    [
        ("", None, 0.01),
        ("always_on", None, 1.0),
        ("parentbased_always_on", None, 1.0),
        ("always_off", None, 0.0),
        ("parentbased_always_off", None, 0.0),
        ("traceidratio", "0.25", 0.25),
        ("parentbased_traceidratio", "0.5", 0.5),
        ("traceidratio", None, 1.0),
    ],
)
def test_the_standard_samplers_set_the_ratio_of_ordinary_calls(
    monkeypatch: pytest.MonkeyPatch, sampler: str, arg: str | None, ratio: float
) -> None:
    if sampler:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    if arg is not None:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    assert sample_ratio(Settings()) == ratio


def test_an_unknown_sampler_or_protocol_is_a_settings_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ibex_context.cli_support import settings_error_message
    from pydantic import ValidationError

    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "jaeger_remote")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ValidationError) as caught:
        Settings()
    message = settings_error_message(caught.value)
    assert "OTEL_TRACES_SAMPLER: " in message
    assert "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL: " in message
    assert "IBEX_OTEL" not in message
