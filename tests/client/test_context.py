"""ContextClient: the LLM request never fails because of the context service."""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
import pytest
from ibex_context.devtools import scripted_service as scripted
from ibex_context.devtools.scripted_service import RunningServer, closed_port, free_socket, scripted_server
from ibex_context.models import ChatMessage
from ibex_context.server.grpc_server import ServiceServer
from ibex_context.server.health import ServiceHealth
from ibex_context.server.rpc import Context
from ibex_context_client import ContextClient
from ibex_context_client.context import _RateLimitedLog
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from prometheus_client import CollectorRegistry

MESSAGES = (ChatMessage("system", "You are helpful."), ChatMessage("user", "What do I drink?"))


async def assemble(client: ContextClient, model: str = scripted.FULL, **kwargs: object) -> object:
    return await client.assemble(org_id="o", agent_id="a", model=model, messages=MESSAGES, **kwargs)  # type: ignore[arg-type]


# --- a healthy service ---------------------------------------------------------------


async def test_a_healthy_service_returns_its_messages_and_metadata(server: RunningServer) -> None:
    async with ContextClient(server.target, timeout=5) as client:
        result = await client.assemble(
            org_id="o", agent_id="a", model=scripted.FULL, messages=MESSAGES, request_id="req-1"
        )

    assert result.from_service
    assert result.fallback_reason == ""
    assert not result.degraded
    assert result.messages[0].role == "system" and scripted.MEMORY_TEXT in result.messages[0].content
    assert result.messages[1:] == MESSAGES
    assert isinstance(result.metadata, pb.InjectionMetadata)
    assert result.metadata.memories_injected == 2
    assert result.metadata.request_id == "req-1"
    assert server.service.seen_metadata[0]["x-request-id"] == "req-1"


async def test_a_degraded_assembly_is_still_the_services_answer_with_its_reason(
    server: RunningServer,
) -> None:
    async with ContextClient(server.target, timeout=5) as client:
        result = await client.assemble(
            org_id="o", agent_id="a", model=scripted.COLD_TIMEOUT, messages=MESSAGES
        )
    assert result.from_service
    assert result.fallback_reason == "cold_timeout"
    assert result.degraded


async def test_the_deadline_reaches_the_server(server: RunningServer) -> None:
    seen: list[float] = []
    original = server.service.assemble

    async def spy(request: pb.AssembleContextRequest, context: Context) -> bytes:
        remaining = context.time_remaining()
        seen.append(remaining if remaining is not None else -1.0)
        return await original(request, context)

    server.service.assemble = spy  # type: ignore[method-assign]
    async with ContextClient(server.target, timeout=0.5) as client:
        await assemble(client)
    # gRPC's core rounds the grpc-timeout header up (0.5006 s was seen on the server), so the
    # bound allows a few ms: what matters is that the client's 0.5 s, not the default, arrived.
    assert len(seen) == 1 and 0 < seen[0] <= 0.51


# --- everything that can go wrong -----------------------------------------------------


async def test_nothing_listening_falls_back_to_the_original_messages() -> None:
    async with ContextClient(f"127.0.0.1:{closed_port()}") as client:
        result = await client.assemble(org_id="o", agent_id="a", model="gpt-4o", messages=MESSAGES)

    assert not result.from_service
    assert result.fallback_reason == "client_unavailable"
    assert result.messages == MESSAGES
    assert all(a is b for a, b in zip(result.messages, MESSAGES, strict=True))
    assert result.metadata is None


async def test_a_server_slower_than_the_45ms_deadline_is_abandoned() -> None:
    async with scripted_server() as slow, ContextClient(slow.target) as client:
        assert client.timeout == 0.045
        started = time.perf_counter()
        result = await assemble(client, scripted.SLOW)
        waited = time.perf_counter() - started

    assert result.fallback_reason == "client_timeout"
    assert result.messages == MESSAGES
    assert waited < scripted.SLOW_SECONDS  # it did not wait for the server


async def test_a_server_that_accepts_but_never_answers_times_out() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        await asyncio.sleep(10)

    sink = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = sink.sockets[0].getsockname()[1]
    try:
        async with ContextClient(f"127.0.0.1:{port}", timeout=0.1) as client:
            result = await assemble(client)
    finally:
        sink.close()
    assert result.fallback_reason == "client_timeout"


async def test_invalid_argument_falls_back_and_is_logged_loudly_with_the_field(
    server: RunningServer, client_log: pytest.LogCaptureFixture
) -> None:
    async with ContextClient(server.target, timeout=5) as client:
        result = await assemble(client, scripted.INVALID, request_id="req-bad")

    assert result.fallback_reason == "client_invalid_argument"
    assert result.messages == MESSAGES
    (record,) = [r for r in client_log.records if r.name == "ibex_context_client"]
    assert record.levelno == logging.ERROR
    assert "org_id: must be a UUID" in record.getMessage()
    assert "req-bad" in record.getMessage()


async def test_a_request_over_the_size_limit_falls_back_as_a_rejected_request(
    server: RunningServer, client_log: pytest.LogCaptureFixture
) -> None:
    huge = (ChatMessage("user", "x" * (5 * 1024 * 1024)),)  # the server takes 4 MiB
    async with ContextClient(server.target, timeout=5) as client:
        result = await client.assemble(org_id="o", agent_id="a", model=scripted.FULL, messages=huge)

    assert result.fallback_reason == "client_invalid_argument"
    assert result.messages == huge
    assert server.service.calls == 0, "refused before the handler"
    (record,) = [r for r in client_log.records if r.name == "ibex_context_client"]
    assert "larger than max" in record.getMessage()


async def test_a_server_error_falls_back_with_its_status(server: RunningServer) -> None:
    async with ContextClient(server.target, timeout=5) as client:
        result = await assemble(client, scripted.CRASH)
    assert result.fallback_reason == "client_error:UNKNOWN"
    assert result.messages == MESSAGES


async def test_an_empty_answer_is_not_sent_to_the_model(server: RunningServer) -> None:
    async with ContextClient(server.target, timeout=5) as client:
        result = await assemble(client, scripted.EMPTY)
    assert result.fallback_reason == "client_error:empty_response"
    assert result.messages == MESSAGES


async def test_a_message_that_cannot_be_encoded_falls_back_without_a_call(server: RunningServer) -> None:
    broken = (ChatMessage("user", 42),)  # type: ignore[arg-type]
    async with ContextClient(server.target, timeout=5) as client:
        result = await client.assemble(org_id="o", agent_id="a", model="gpt-4o", messages=broken)
    assert result.fallback_reason == "client_error:bad_request"
    assert result.messages == broken
    assert server.service.calls == 0


async def test_cancelling_the_caller_is_not_swallowed(server: RunningServer) -> None:
    async with ContextClient(server.target, timeout=5) as client:
        call = asyncio.create_task(assemble(client, scripted.SLOW))
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call


async def test_the_client_recovers_when_the_service_comes_back() -> None:
    sock = free_socket()
    port = int(sock.getsockname()[1])
    sock.close()
    async with ContextClient(f"127.0.0.1:{port}", timeout=5) as client:
        down = await assemble(client)
        async with scripted_server(port=port):
            up = await assemble(client)
    assert (down.fallback_reason, up.from_service) == ("client_unavailable", True)  # type: ignore[attr-defined]


async def test_results_are_counted_in_the_optional_registry(server: RunningServer) -> None:
    registry = CollectorRegistry()
    async with ContextClient(server.target, timeout=5, registry=registry) as client:
        await assemble(client)
        await assemble(client, scripted.COLD_TIMEOUT)
        await assemble(client, scripted.INVALID)
        await assemble(client, scripted.CRASH)
    for result, count in {
        "ok": 1,
        "degraded": 1,
        "client_invalid_argument": 1,
        "client_error": 1,
        "client_timeout": 0,
    }.items():
        assert registry.get_sample_value("ibex_context_client_requests_total", {"result": result}) == count
    assert registry.get_sample_value("ibex_context_client_duration_seconds_count") == 4


def test_repeated_fallbacks_log_once_per_interval_with_the_count_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tests.ratelimit")
    limited = _RateLimitedLog(logging.getLogger("tests.ratelimit"), interval=3600)
    for _ in range(5):
        limited(logging.WARNING, "client_timeout", "fell back")
    limited(logging.WARNING, "client_unavailable", "fell back")
    assert [(r.fallback_reason, r.suppressed) for r in caplog.records] == [  # type: ignore[attr-defined]
        ("client_timeout", 0),
        ("client_unavailable", 0),
    ]
    limited._last["client_timeout"] = 0.0 - 3600  # the interval has passed
    limited(logging.WARNING, "client_timeout", "fell back")
    assert caplog.records[-1].suppressed == 4  # type: ignore[attr-defined]


async def test_warm_up_opens_the_connection_before_the_first_call(server: RunningServer) -> None:
    async with ContextClient(server.target, timeout=5) as client:
        assert await client.warm_up()
    async with ContextClient(f"127.0.0.1:{closed_port()}") as client:
        assert not await client.warm_up()


async def test_a_connection_that_keeps_timing_out_is_replaced_by_a_new_one() -> None:
    # A peer that vanished without FIN/RST leaves an HTTP/2 connection that never answers.
    connections = 0

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await reader.read(1 << 16)
        await asyncio.sleep(10)

    sink = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = sink.sockets[0].getsockname()[1]
    try:
        async with ContextClient(f"127.0.0.1:{port}", timeout=0.05) as client:
            reasons = [(await assemble(client)).fallback_reason for _ in range(4)]  # type: ignore[attr-defined]
            await asyncio.sleep(0.05)
    finally:
        sink.close()
    assert reasons == ["client_timeout"] * 4
    assert connections == 2  # three timeouts on the first connection, then a fresh one


# --- the health probe ------------------------------------------------------------------


async def test_check_health_raises_when_nothing_listens_instead_of_falling_back() -> None:
    async with ContextClient(f"127.0.0.1:{closed_port()}") as client:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await client.check_health(timeout=1.0)
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_check_health_names_the_status_the_service_reports() -> None:
    server = ServiceServer(ServiceHealth([]).methods([]), max_request_bytes=1024)
    port = await server.start("127.0.0.1", 0)
    try:
        async with ContextClient(f"dns:///127.0.0.1:{port}") as client:
            assert await client.check_health() == "SERVING"
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await client.check_health("no.such.Service")
            assert raised.value.code() is grpc.StatusCode.NOT_FOUND
    finally:
        await server.stop(0)
