"""Server reflection (v1 and v1alpha) and health Watch on the real grpc.aio server (the
stores' health names: test_health_stores.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from google.protobuf.descriptor_pb2 import FileDescriptorProto
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpclib.reflection.v1.reflection_grpc import ServerReflectionStub
from grpclib.reflection.v1.reflection_pb2 import ServerReflectionRequest
from ibex_context.server.grpc_server import ServiceServer
from ibex_context.server.health import ServiceHealth

from .conftest import StartService

ASSEMBLY = "ibex.context.v1.ContextAssemblyService"


async def _status(port: int, service: str = "") -> int:
    async with Channel("127.0.0.1", port) as channel:
        reply = await HealthStub(channel).Check(HealthCheckRequest(service=service), timeout=5)
        return int(reply.status)


async def test_reflection_lists_both_services(start_service: StartService) -> None:
    service = await start_service()
    async with (
        Channel("127.0.0.1", service.port) as channel,
        ServerReflectionStub(channel).ServerReflectionInfo.open() as stream,
    ):
        await stream.send_message(ServerReflectionRequest(list_services=""))
        reply = await stream.recv_message()
        await stream.end()
    assert reply is not None
    names = {s.name for s in reply.list_services_response.service}
    assert {ASSEMBLY, "ibex.context.v1.MemoryService", "grpc.health.v1.Health"} <= names


async def test_reflection_v1alpha_lists_the_services_and_a_symbol_resolves_to_its_file(
    start_service: StartService,
) -> None:
    from grpclib.reflection.v1alpha.reflection_grpc import ServerReflectionStub as AlphaStub
    from grpclib.reflection.v1alpha.reflection_pb2 import ServerReflectionRequest as AlphaRequest

    service = await start_service()
    async with (
        Channel("127.0.0.1", service.port) as channel,
        AlphaStub(channel).ServerReflectionInfo.open() as stream,
    ):
        await stream.send_message(AlphaRequest(list_services=""))
        listed = await stream.recv_message()
        await stream.send_message(AlphaRequest(file_containing_symbol=f"{ASSEMBLY}.AssembleContext"))
        found = await stream.recv_message()
        await stream.send_message(AlphaRequest(file_containing_symbol="no.such.Symbol"))
        missing = await stream.recv_message()
        await stream.end()
    assert listed is not None and found is not None and missing is not None
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
    async with (
        Channel("127.0.0.1", port) as channel,
        HealthStub(channel).Watch.open(timeout=10) as stream,
    ):
        await stream.send_message(HealthCheckRequest(service=ASSEMBLY), end=True)
        first = await stream.recv_message()
        assert first is not None and first.status == HealthCheckResponse.SERVING
        started = asyncio.get_running_loop().time()
        health.set_not_serving()
        second = await stream.recv_message()
        waited = asyncio.get_running_loop().time() - started
        await stream.cancel()
    assert second is not None and second.status == HealthCheckResponse.NOT_SERVING
    # Woken by the drain, not by the once-a-second re-evaluation.
    assert waited < 0.9, waited
    assert await _status(port, "liveness") == HealthCheckResponse.SERVING


async def test_an_unknown_name_is_not_found_on_check_and_service_unknown_on_watch(
    health_only: tuple[ServiceHealth, int],
) -> None:
    _, port = health_only
    async with Channel("127.0.0.1", port) as channel:
        with pytest.raises(GRPCError) as error:
            await HealthStub(channel).Check(HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert error.value.status is Status.NOT_FOUND
        async with HealthStub(channel).Watch.open(timeout=10) as stream:
            await stream.send_message(HealthCheckRequest(service="no.such.Service"), end=True)
            reply = await stream.recv_message()
            await stream.cancel()
    assert reply is not None and reply.status == HealthCheckResponse.SERVICE_UNKNOWN
