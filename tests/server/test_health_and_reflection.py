"""Server reflection (v1 and v1alpha) and health Watch on the real grpc.aio server (the
stores' health names: test_health_stores.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from google.protobuf.descriptor_pb2 import FileDescriptorProto
from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpc_health.v1.health_pb2_grpc import HealthStub
from grpc_reflection.v1alpha.reflection_pb2 import ServerReflectionRequest, ServerReflectionResponse
from ibex_context.server.grpc_server import ServiceServer
from ibex_context.server.health import ServiceHealth

from .conftest import StartService

ASSEMBLY = "ibex.context.v1.ContextAssemblyService"


async def _status(port: int, service: str = "") -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await HealthStub(channel).Check(HealthCheckRequest(service=service), timeout=5)
        return int(reply.status)


def _reflection(channel: grpc.aio.Channel, version: str) -> grpc.aio.StreamStreamMultiCallable:
    # v1 and v1alpha carry the same messages (the same field numbers) under two names.
    return channel.stream_stream(
        f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
        request_serializer=ServerReflectionRequest.SerializeToString,
        response_deserializer=ServerReflectionResponse.FromString,
    )


async def test_reflection_lists_both_services(start_service: StartService) -> None:
    service = await start_service()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        stream = _reflection(channel, "v1")(timeout=10)
        await stream.write(ServerReflectionRequest(list_services=""))
        reply = await stream.read()
        await stream.done_writing()
    assert isinstance(reply, ServerReflectionResponse)
    names = {s.name for s in reply.list_services_response.service}
    assert {ASSEMBLY, "ibex.context.v1.MemoryService", "grpc.health.v1.Health"} <= names


async def test_reflection_v1alpha_lists_the_services_and_a_symbol_resolves_to_its_file(
    start_service: StartService,
) -> None:
    service = await start_service()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        stream = _reflection(channel, "v1alpha")(timeout=10)
        await stream.write(ServerReflectionRequest(list_services=""))
        listed = await stream.read()
        await stream.write(ServerReflectionRequest(file_containing_symbol=f"{ASSEMBLY}.AssembleContext"))
        found = await stream.read()
        await stream.write(ServerReflectionRequest(file_containing_symbol="no.such.Symbol"))
        missing = await stream.read()
        await stream.done_writing()
    assert isinstance(listed, ServerReflectionResponse)
    assert isinstance(found, ServerReflectionResponse)
    assert isinstance(missing, ServerReflectionResponse)
    assert ASSEMBLY in {s.name for s in listed.list_services_response.service}
    (file_bytes,) = found.file_descriptor_response.file_descriptor_proto
    proto = FileDescriptorProto.FromString(file_bytes)
    assert proto.package == "ibex.context.v1"
    assert "ContextAssemblyService" in {s.name for s in proto.service}
    assert missing.error_response.error_code == 5  # NOT_FOUND


@pytest.fixture
async def health_only() -> AsyncIterator[tuple[ServiceHealth, int]]:
    """The health service alone on a real grpc.aio server (no stores: they pass)."""
    health = ServiceHealth([])
    server = ServiceServer(health.methods([ASSEMBLY]), max_request_bytes=1024)
    port = await server.start("127.0.0.1", 0)
    try:
        yield health, port
    finally:
        await server.stop(0)


async def test_watch_sends_serving_then_not_serving_as_soon_as_the_drain_starts(
    health_only: tuple[ServiceHealth, int],
) -> None:
    health, port = health_only
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stream = HealthStub(channel).Watch(HealthCheckRequest(service=ASSEMBLY), timeout=10)
        first = await stream.read()
        assert isinstance(first, HealthCheckResponse) and first.status == HealthCheckResponse.SERVING
        started = asyncio.get_running_loop().time()
        health.set_not_serving()
        second = await stream.read()
        waited = asyncio.get_running_loop().time() - started
        stream.cancel()
    assert isinstance(second, HealthCheckResponse) and second.status == HealthCheckResponse.NOT_SERVING
    # Woken by the drain, not by the once-a-second re-evaluation.
    assert waited < 0.9, waited
    assert await _status(port, "liveness") == HealthCheckResponse.SERVING


async def test_an_unknown_name_is_not_found_on_check_and_service_unknown_on_watch(
    health_only: tuple[ServiceHealth, int],
) -> None:
    _, port = health_only
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await HealthStub(channel).Check(HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert error.value.code() is grpc.StatusCode.NOT_FOUND
        stream = HealthStub(channel).Watch(HealthCheckRequest(service="no.such.Service"), timeout=10)
        reply = await stream.read()
        stream.cancel()
    assert isinstance(reply, HealthCheckResponse) and reply.status == HealthCheckResponse.SERVICE_UNKNOWN


async def test_watch_streams_past_the_limit_are_refused_naming_it_and_a_closed_one_frees_its_slot() -> None:
    health = ServiceHealth([], max_watches=2)
    server = ServiceServer(health.methods([ASSEMBLY]), max_request_bytes=1024)
    port = await server.start("127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = HealthStub(channel)
            held = [stub.Watch(HealthCheckRequest(service=ASSEMBLY), timeout=10) for _ in range(2)]
            for stream in held:
                assert (await stream.read()).status == HealthCheckResponse.SERVING
            extra = stub.Watch(HealthCheckRequest(service="liveness"), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await extra.read()
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "IBEX_MAX_HEALTH_WATCHES" in (refused.value.details() or "")
            assert health.watches == 2
            held[0].cancel()
            loop = asyncio.get_running_loop()
            ends = loop.time() + 5
            while health.watches > 1:
                assert loop.time() < ends, "the cancelled Watch kept its slot"
                await asyncio.sleep(0.02)
            again = stub.Watch(HealthCheckRequest(service="liveness"), timeout=10)
            assert (await again.read()).status == HealthCheckResponse.SERVING
            again.cancel()
            held[1].cancel()
    finally:
        await server.stop(0)
