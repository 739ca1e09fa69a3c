"""Server reflection lists the services (health: test_health_stores.py)."""

from __future__ import annotations

from grpclib.client import Channel
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest
from grpclib.reflection.v1.reflection_grpc import ServerReflectionStub
from grpclib.reflection.v1.reflection_pb2 import ServerReflectionRequest

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
