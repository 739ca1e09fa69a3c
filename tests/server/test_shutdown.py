"""Graceful shutdown of the real process: on SIGTERM the server reports NOT_SERVING,
lets every in-flight call finish, then exits 0. No in-flight call is cut."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import grpc
from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpc_health.v1.health_pb2_grpc import HealthStub
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

from tests.conftest import Tenant

from .conftest import request, user


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _wait_serving(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                reply = await HealthStub(channel).Check(HealthCheckRequest(), timeout=1)
                if reply.status == HealthCheckResponse.SERVING:
                    return
        except grpc.aio.AioRpcError:  # not listening yet
            pass
        await asyncio.sleep(0.1)
    raise AssertionError("server did not become SERVING")


def _serve(redis_url: str, postgres_dsn: str, **settings: str) -> tuple[subprocess.Popen[bytes], int]:
    """``ibex-context serve`` as its own process, as in production; ``settings``
    (``IBEX_*`` variables) override the defaults here."""
    port = _free_port()
    env = dict(
        os.environ,
        IBEX_REDIS_URL=redis_url,
        IBEX_POSTGRES_DSN=postgres_dsn,
        IBEX_GRPC_HOST="127.0.0.1",
        IBEX_GRPC_PORT=str(port),
        IBEX_METRICS_PORT="0",
        IBEX_EMBEDDER="hashing",
        IBEX_LOG_FORMAT="text",
        IBEX_AUTH_ENABLED="false",
    )
    env.update(settings)
    return subprocess.Popen([sys.executable, "-m", "ibex_context", "serve"], env=env), port


async def test_sigterm_lets_every_in_flight_call_finish(
    redis_url: str, postgres_dsn: str, tenant: Tenant
) -> None:
    proc, port = _serve(redis_url, postgres_dsn, IBEX_SHUTDOWN_GRACE_SECONDS="20")
    try:
        await _wait_serving(port)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            memories = context_pb2_grpc.MemoryServiceStub(channel)
            await memories.UpsertMemories(
                pb.UpsertMemoriesRequest(
                    org_id=tenant.org_id,
                    agent_id=tenant.agent_id,
                    memories=[
                        pb.MemoryInput(content=f"fact number {i} about shutdown", category="factual")
                        for i in range(30)
                    ],
                )
            )
            stub = context_pb2_grpc.ContextAssemblyServiceStub(channel)
            calls = [
                asyncio.ensure_future(
                    stub.AssembleContext(
                        request(tenant.org_id, tenant.agent_id, user(f"shutdown fact {i}")), timeout=20
                    )
                )
                for i in range(300)
            ]
            await asyncio.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            sent_at = time.monotonic()
            results = await asyncio.gather(*calls, return_exceptions=True)

        failures = [r for r in results if isinstance(r, BaseException)]
        assert not failures, f"{len(failures)} calls were cut, e.g. {failures[0]!r}"
        finished_after_signal = time.monotonic() - sent_at
        assert all(isinstance(r, pb.AssembleContextResponse) for r in results)
        assert proc.wait(timeout=30) == 0
        assert finished_after_signal > 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_sigterm_turns_health_not_serving_while_draining(
    redis_url: str, postgres_dsn: str, tenant: Tenant
) -> None:
    proc, port = _serve(redis_url, postgres_dsn, IBEX_SHUTDOWN_DRAIN_DELAY_SECONDS="1.5")
    try:
        await _wait_serving(port)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            reply = await HealthStub(channel).Check(HealthCheckRequest(), timeout=1)
            assert reply.status == HealthCheckResponse.NOT_SERVING
            # Still answering calls while the load balancer drains.
            response = await context_pb2_grpc.ContextAssemblyServiceStub(channel).AssembleContext(
                request(tenant.org_id, tenant.agent_id, user("still there?")), timeout=5
            )
            assert response.messages[-1].content == "still there?"
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
