"""The call observer around the grpc.aio methods: in-flight accounting, statuses, access log, quiet probes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import grpc
import pytest
from grpc_health.v1.health_pb2 import HealthCheckRequest
from grpc_health.v1.health_pb2_grpc import HealthStub
from ibex_context.devtools import scripted_service as scripted
from ibex_context.models import ChatMessage
from ibex_context.observability.calls import safe_request_id
from ibex_context.observability.metrics import Metrics
from ibex_context.observability.tracing import IncomingTrace, Tracing
from ibex_context.server.health import ServiceHealth
from ibex_context_client import ContextClient
from prometheus_client import CollectorRegistry

from tests.observability.harness import Observed, ObservedFactory, sample

MESSAGES = [ChatMessage("user", "hello")]


async def wait_for_gauge(observed: Observed, value: float) -> None:
    for _ in range(400):
        if observed.metrics.inflight_calls._value.get() == value:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"inflight gauge never reached {value}")


async def test_a_call_is_in_flight_while_it_runs_and_not_after(observed: Observed) -> None:
    async with ContextClient(observed.target, timeout=5) as c:
        call = asyncio.create_task(
            c.assemble(org_id="o", agent_id="a", model=scripted.SLOW, messages=MESSAGES)
        )
        await wait_for_gauge(observed, 1)
        assert sample(await observed.scrape(), "ibex_context_inflight_calls") == 1
        result = await call
    assert result.from_service
    assert sample(await observed.scrape(), "ibex_context_inflight_calls") == 0


async def test_a_call_cut_by_the_client_deadline_leaves_nothing_in_flight(observed: Observed) -> None:
    async with ContextClient(observed.target, timeout=0.1) as c:
        result = await c.assemble(org_id="o", agent_id="a", model=scripted.SLOW, messages=MESSAGES)
    assert result.fallback_reason == "client_timeout"

    await wait_for_gauge(observed, 0)
    samples = await observed.scrape()
    codes = {
        dict(labels)["grpc_code"]: value
        for (name, labels), value in samples.items()
        if name == "grpc_server_handled_total" and value
    }
    # Which side notices first is racy (server deadline vs the client's reset).
    assert sum(codes.values()) == 1
    assert set(codes) <= {"DEADLINE_EXCEEDED", "CANCELLED"}
    # The half-done assembly counts as a fallback, not as the "full" its early report said.
    assert sample(samples, "ibex_context_assembly_duration_seconds_count", outcome="fallback") == 1
    assert sample(samples, "ibex_context_assembly_duration_seconds_count", outcome="full") == 0
    reasons = {
        r
        for r in ("deadline_exceeded", "cancelled")
        if sample(samples, "ibex_context_fallbacks_total", reason=r)
    }
    assert len(reasons) == 1


async def test_a_cancelled_caller_leaves_nothing_in_flight(observed: Observed) -> None:
    async with ContextClient(observed.target, timeout=5) as c:
        call = asyncio.create_task(
            c.assemble(org_id="o", agent_id="a", model=scripted.SLOW, messages=MESSAGES)
        )
        await wait_for_gauge(observed, 1)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        await wait_for_gauge(observed, 0)
    assert call.cancelled()


async def test_one_access_line_per_call_with_counts_and_no_content(
    observed: Observed, client: ContextClient
) -> None:
    await client.assemble(
        org_id="org-7f3a",
        agent_id="agent-91bc",
        model=scripted.COLD_TIMEOUT,
        messages=MESSAGES,
        request_id="req-77",
    )
    (line,) = observed.access_lines()

    assert line["request_id"] == "req-77"
    assert isinstance(line["trace_id"], str) and len(line["trace_id"]) == 32
    assert line["grpc_code"] == "OK"
    assert line["rpc_method"] == "AssembleContext"
    assert line["outcome"] == "degraded"
    assert line["reasons"] == ["cold_timeout"]
    assert line["memories_injected"] == 2
    assert line["sources"] == {"directive": "ok", "hot": "ok", "embed": "ok", "cold": "timeout"}
    assert set(line["stages_us"]) >= {"budget", "cold", "serialize"}  # type: ignore[arg-type]
    assert "org-7f3a" not in str(line) and "agent-91bc" not in str(line)


async def test_handler_log_lines_carry_the_request_and_trace_id_of_their_call(
    observed: Observed, client: ContextClient
) -> None:
    await client.assemble(
        org_id="o", agent_id="a", model=scripted.FULL, messages=MESSAGES, request_id="req-a"
    )
    await client.assemble(
        org_id="o", agent_id="a", model=scripted.FULL, messages=MESSAGES, request_id="req-b"
    )
    lines = observed.log_lines()

    handler_lines = [line for line in lines if line["msg"] == "assembling"]
    access_lines = [line for line in lines if line["msg"] == "rpc"]
    assert [line["request_id"] for line in handler_lines] == ["req-a", "req-b"]
    for handler_line, access_line in zip(handler_lines, access_lines, strict=True):
        assert handler_line["trace_id"] == access_line["trace_id"]
    assert handler_lines[0]["trace_id"] != handler_lines[1]["trace_id"]


async def test_rejected_call_is_logged_with_the_field_it_named(
    observed: Observed, client: ContextClient
) -> None:
    await client.assemble(org_id="o", agent_id="a", model=scripted.INVALID, messages=MESSAGES)
    (line,) = observed.access_lines()
    assert line["grpc_code"] == "INVALID_ARGUMENT"
    assert line["outcome"] == "invalid"
    assert line["invalid_field"] == "org_id"


async def test_health_probes_are_counted_but_neither_traced_nor_logged(
    observed_factory: ObservedFactory,
) -> None:
    async with observed_factory(extra_methods=ServiceHealth([]).methods([])) as observed:
        async with grpc.aio.insecure_channel(observed.target) as channel:
            reply = await HealthStub(channel).Check(HealthCheckRequest(), timeout=5)
        await asyncio.sleep(0)
        samples = await observed.scrape()

    assert reply.status == 1  # SERVING
    assert (
        sample(
            samples,
            "grpc_server_handled_total",
            grpc_type="unary",
            grpc_service="grpc.health.v1.Health",
            grpc_method="Check",
            grpc_code="OK",
        )
        == 1
    )
    assert observed.exporter.get_finished_spans() == ()
    assert observed.access_lines() == []


async def test_without_an_x_request_id_the_access_line_uses_the_reports_request_id(
    observed: Observed,
) -> None:
    observed.service.sets_request_id = False  # like the real handler: it only attaches its report
    async with ContextClient(observed.target, timeout=5) as c:
        # No request_id: the client sends no x-request-id and the handler generates one.
        await c.assemble(org_id="o", agent_id="a", model=scripted.FULL, messages=MESSAGES)
    (line,) = observed.access_lines()
    assert "x-request-id" not in observed.service.seen_metadata[0]
    assert line["request_id"] == "generated-request-id"


def test_a_request_id_is_bounded_and_stripped_of_control_characters() -> None:
    assert safe_request_id("req-1") == "req-1"
    assert safe_request_id("req\n2026-01-01 INFO forged line") == "req2026-01-01 INFO forged line"
    assert safe_request_id("x" * 500) == "x" * 128
    assert safe_request_id(b"binary") == ""
    assert safe_request_id(None) == ""


async def test_a_failing_observer_costs_the_call_its_telemetry_not_its_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class BrokenTracing(Tracing):
        def extract(self, metadata: Mapping[str, str | bytes]) -> IncomingTrace:
            raise RuntimeError("tracing bug")

    metrics = Metrics(CollectorRegistry())
    async with (
        scripted.scripted_server(metrics=metrics, tracing=BrokenTracing()) as server,
        ContextClient(server.target, timeout=5) as client,
    ):
        result = await client.assemble(org_id="o", agent_id="a", model=scripted.FULL, messages=MESSAGES)

    assert result.from_service
    assert metrics.inflight_calls._value.get() == 0
    assert "observing a call failed" in caplog.text
