"""The HTTP side port: /metrics (text and OpenMetrics with exemplars) and /healthz with a hook."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from ibex_context.observability.exposition import (
    HealthCheck,
    HealthStatus,
    MetricsServer,
    start_metrics_server,
)
from ibex_context.observability.metrics import Metrics
from ibex_context.pipeline.outcome import Timings
from prometheus_client import CollectorRegistry

from tests.pipeline.assemblies import an_assembly

Start = Callable[..., MetricsServer]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    started: list[MetricsServer] = []

    def run(registry: CollectorRegistry | None = None, health: HealthCheck | None = None) -> MetricsServer:
        server = start_metrics_server(0, registry or CollectorRegistry(), host="127.0.0.1", health=health)
        started.append(server)
        return server

    yield run
    for server in started:
        await server.close()


async def get(server: MetricsServer, path: str, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.get(f"http://127.0.0.1:{server.port}{path}", headers=headers)


async def test_metrics_are_served_in_the_prometheus_text_format(start: Start) -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.record_assembly(an_assembly(timings=Timings(0, 5_000_000)), ())
    response = await get(start(metrics.registry), "/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'ibex_context_assembly_duration_seconds_count{outcome="full"} 1.0' in response.text


async def test_openmetrics_scrapes_carry_the_trace_id_exemplar(start: Start) -> None:
    metrics = Metrics(CollectorRegistry())
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    metrics.record_assembly(an_assembly(timings=Timings(0, 5_000_000)), (), trace_id=trace_id)
    response = await get(
        start(metrics.registry), "/metrics", accept="application/openmetrics-text; version=1.0.0"
    )

    assert response.headers["content-type"].startswith("application/openmetrics-text")
    bucket = next(
        line
        for line in response.text.splitlines()
        if line.startswith('ibex_context_assembly_duration_seconds_bucket{le="0.005",outcome="full"}')
    )
    assert f'# {{trace_id="{trace_id}"}} 0.005' in bucket


async def test_healthz_without_a_hook_says_ok(start: Start) -> None:
    response = await get(start(), "/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_healthz_reports_the_hooks_detail_and_fails_when_it_does(start: Start) -> None:
    healthy = True

    async def check() -> HealthStatus:
        return HealthStatus(healthy, {"redis": "ok", "postgres": "ok" if healthy else "unreachable"})

    server = start(health=check)
    ok = await get(server, "/healthz")
    healthy = False
    failing = await get(server, "/healthz")

    assert (ok.status_code, ok.json()) == (200, {"status": "ok", "redis": "ok", "postgres": "ok"})
    assert failing.status_code == 503
    assert failing.json() == {"status": "unhealthy", "redis": "ok", "postgres": "unreachable"}


async def test_a_hanging_or_crashing_health_hook_is_a_503_not_a_hang(start: Start) -> None:
    async def hangs() -> HealthStatus:
        await asyncio.sleep(60)
        return HealthStatus(True)

    async def crashes() -> HealthStatus:
        raise ConnectionError("redis down")

    hanging = start(health=hangs)
    hanging._health_timeout = 0.05
    slow = await get(hanging, "/healthz")
    crashed = await get(start(health=crashes), "/healthz")

    assert (slow.status_code, slow.json()["error"]) == (503, "health check timed out")
    assert (crashed.status_code, crashed.json()["error"]) == (503, "ConnectionError")


async def test_unknown_paths_are_404_and_other_methods_405(start: Start) -> None:
    server = start()
    async with httpx.AsyncClient() as http:
        missing = await http.get(f"http://127.0.0.1:{server.port}/nope")
        posted = await http.post(f"http://127.0.0.1:{server.port}/metrics")
        head = await http.head(f"http://127.0.0.1:{server.port}/metrics")
    assert missing.status_code == 404
    assert posted.status_code == 405
    assert head.status_code == 200 and head.content == b""


async def test_a_taken_port_fails_at_start_not_later(start: Start) -> None:
    server = start()
    with pytest.raises(OSError):
        start_metrics_server(server.port, CollectorRegistry(), host="127.0.0.1")


async def test_a_client_that_sends_nothing_does_not_block_scrapes(start: Start) -> None:
    server = start()
    _, idle_writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        response = await get(server, "/metrics")
    finally:
        idle_writer.close()
    assert response.status_code == 200
