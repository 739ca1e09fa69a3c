"""Readiness means "this process can answer": a store outage leaves the overall
health SERVING (calls are answered, degraded) and shows on the stores' own health
names, the /healthz body and ``ibex_context_store_up``. Store checks answer within
their timeout even while PostgreSQL is stopped, and never from a stale cache.
Real Redis killed, real PostgreSQL stopped with SIGSTOP."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpc_health.v1.health_pb2_grpc import HealthStub
from ibex_context.devtools.embedded import PostgresProcess, RedisProcess
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Tenant

from .conftest import StartService, request, user

ASSEMBLY = "ibex.context.v1.ContextAssemblyService"
SERVING, NOT_SERVING = HealthCheckResponse.SERVING, HealthCheckResponse.NOT_SERVING
# Far above the 0.5 s store check timeout: an answer later than this is a hang.
ANSWER_WITHIN = 2.0


async def _status(port: int, service: str = "") -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await HealthStub(channel).Check(HealthCheckRequest(service=service), timeout=ANSWER_WITHIN)
        return int(reply.status)


async def _healthz(metrics_port: int) -> httpx.Response:
    async with httpx.AsyncClient(timeout=ANSWER_WITHIN) as http:
        return await http.get(f"http://127.0.0.1:{metrics_port}/healthz")


async def _store_up(metrics_port: int, store: str) -> float:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "ibex_context_store_up" and s.labels.get("store") == store:
                return float(s.value)
    raise AssertionError(f"no ibex_context_store_up sample for {store}")


async def test_a_redis_outage_keeps_readiness_and_shows_on_the_store_names(
    start_service: StartService, throwaway_redis: RedisProcess, tenant: Tenant
) -> None:
    service = await start_service(redis_url=throwaway_redis.url)
    port = service.port
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await context_pb2_grpc.MemoryServiceStub(channel).SetDirective(
            pb.SetDirectiveRequest(org_id=tenant.org_id, agent_id=tenant.agent_id, content="Be brief."),
            timeout=10,
        )
    for name in ("", ASSEMBLY, "ibex.stores", "ibex.stores.redis", "ibex.stores.postgres"):
        assert await _status(port, name) == SERVING, name

    throwaway_redis.stop()  # the process is terminated
    # No sleep: the first check after the outage reports it (nothing is cached).
    assert await _status(port, "ibex.stores.redis") == NOT_SERVING
    assert await _status(port, "ibex.stores") == NOT_SERVING
    assert await _status(port, "ibex.stores.postgres") == SERVING
    # ... while the process still answers every call: it stays ready.
    for name in ("", ASSEMBLY, "ibex.context.v1.MemoryService", "liveness"):
        assert await _status(port, name) == SERVING, name
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await context_pb2_grpc.ContextAssemblyServiceStub(channel).AssembleContext(
            request(tenant.org_id, tenant.agent_id, user("what now?")), timeout=10
        )
    assert reply.metadata.directive_injected, "the directive comes from PostgreSQL"
    assert "hot_error" in reply.metadata.degradation_reasons
    assert await _store_up(service.metrics_port, "redis") == 0
    assert await _store_up(service.metrics_port, "postgres") == 1
    healthz = await _healthz(service.metrics_port)
    body = healthz.json()
    assert healthz.status_code == 200, body
    assert body["stores_ok"] is False and body["stores"]["redis"] != "ok"

    throwaway_redis.start()
    assert await _status(port, "ibex.stores.redis") == SERVING
    assert await _store_up(service.metrics_port, "redis") == 1


def _process_tree(root: int) -> list[int]:
    """``root`` and its descendants (the postmaster and its backends)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            # The command name may hold spaces; the parent pid follows its ")".
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


@contextlib.contextmanager
def _stopped(postgres: PostgresProcess) -> Iterator[None]:
    """Every PostgreSQL process stopped (SIGSTOP) for the block; continued after it."""
    assert postgres.pid is not None
    pids = _process_tree(postgres.pid)
    try:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def test_health_answers_at_once_while_postgresql_is_stopped(
    start_service: StartService, postgres_server: PostgresProcess
) -> None:
    service = await start_service()
    assert await _status(service.port, "ibex.stores.postgres") == SERVING
    assert (await _healthz(service.metrics_port)).json()["stores_ok"] is True

    with _stopped(postgres_server):
        # The first poll after the stop: not SERVING from a cache, and no hang.
        assert await _status(service.port, "ibex.stores.postgres") == NOT_SERVING
        assert await _status(service.port, "ibex.stores") == NOT_SERVING
        assert await _status(service.port) == SERVING, "the process can still answer"
        healthz = await _healthz(service.metrics_port)
        body = healthz.json()
        assert healthz.status_code == 200, body
        assert body["stores"]["postgres"] == "timed out" and body["stores_ok"] is False

    for _ in range(60):  # the probe stuck while stopped finishes; a fresh one passes
        if await _status(service.port, "ibex.stores.postgres") == SERVING:
            break
        await asyncio.sleep(0.25)
    else:
        raise AssertionError("PostgreSQL continued, but its health never came back")
