"""gRPC health is SERVING only while Redis and PostgreSQL answer; liveness ignores the
stores; server reflection lists the services."""

from __future__ import annotations

import asyncio

from grpclib.client import Channel
from grpclib.health.v1.health_grpc import HealthStub
from grpclib.health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpclib.reflection.v1.reflection_grpc import ServerReflectionStub
from grpclib.reflection.v1.reflection_pb2 import ServerReflectionRequest
from ibex_context.embedded import RedisProcess

from .conftest import StartService

ASSEMBLY = "ibex.context.v1.ContextAssemblyService"


async def _status(port: int, service: str = "") -> int:
    async with Channel("127.0.0.1", port) as channel:
        reply = await HealthStub(channel).Check(HealthCheckRequest(service=service), timeout=5)
        return int(reply.status)


async def test_health_follows_the_stores_and_liveness_does_not(
    start_service: StartService, throwaway_redis: RedisProcess
) -> None:
    service = await start_service(redis_url=throwaway_redis.url)
    assert await _status(service.port) == HealthCheckResponse.SERVING
    assert await _status(service.port, ASSEMBLY) == HealthCheckResponse.SERVING

    throwaway_redis.stop()
    await asyncio.sleep(1.2)  # the store check is cached for one second
    assert await _status(service.port) == HealthCheckResponse.NOT_SERVING
    assert await _status(service.port, ASSEMBLY) == HealthCheckResponse.NOT_SERVING
    assert await _status(service.port, "liveness") == HealthCheckResponse.SERVING

    throwaway_redis.start()
    await asyncio.sleep(1.2)
    assert await _status(service.port) == HealthCheckResponse.SERVING


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
