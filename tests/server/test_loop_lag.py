"""The event-loop lag probe sees a step that holds the loop, and the served process
exports both loop histograms."""

from __future__ import annotations

import asyncio
import time

import grpc
import httpx
import pytest
from ibex_context.server.loop_lag import LoopLagProbe, TimedEventLoop
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Tenant

from .conftest import request, user
from .test_shutdown import _free_port, _serve, _wait_serving

BLOCK_SECONDS = 0.03


async def test_the_probe_reports_how_long_a_blocking_step_held_the_loop() -> None:
    lags: list[float] = []
    probe = LoopLagProbe(lags.append, interval=0.005)
    probe.start()
    try:
        await asyncio.sleep(0.05)
        quiet = len(lags)
        time.sleep(BLOCK_SECONDS)  # noqa: ASYNC251 (holds the loop, as a slow callback would)
        await asyncio.sleep(0.05)
    finally:
        probe.stop()
    assert quiet >= 3, "the probe ticks while the loop is free"
    assert max(lags) >= BLOCK_SECONDS * 0.8
    assert not probe.times_iterations, "the test session's loop is not a TimedEventLoop"
    ticks = len(lags)
    await asyncio.sleep(0.03)
    assert len(lags) == ticks, "stopped: no more ticks"


def test_a_timed_loop_reports_its_longest_iteration_per_interval() -> None:
    lags: list[float] = []
    longest: list[float] = []

    async def main() -> bool:
        probe = LoopLagProbe(lags.append, longest.append, interval=0.01)
        probe.start()
        try:
            await asyncio.sleep(0.1)
            time.sleep(BLOCK_SECONDS)  # noqa: ASYNC251 (the stall under test)
            await asyncio.sleep(0.1)
        finally:
            probe.stop()
        return probe.times_iterations

    with asyncio.Runner(loop_factory=TimedEventLoop) as runner:
        assert runner.run(main())
    assert len(longest) == len(lags) >= 10
    assert max(longest) >= BLOCK_SECONDS
    # Every other interval only ran the probe's own tick and a sleep's wake-up.
    assert sorted(longest)[len(longest) // 2] < BLOCK_SECONDS / 3


def test_an_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval"):
        LoopLagProbe(lambda _s: None, interval=0)


async def _served_loop_metrics(
    redis_url: str, postgres_dsn: str, tenant: Tenant, **env: str
) -> dict[str, float]:
    """The loop metrics of a served process after 20 calls."""
    metrics_port = _free_port()
    proc, port = _serve(redis_url, postgres_dsn, IBEX_METRICS_PORT=str(metrics_port), **env)
    try:
        await _wait_serving(port)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = context_pb2_grpc.ContextAssemblyServiceStub(channel)
            for i in range(20):
                await stub.AssembleContext(
                    request(tenant.org_id, tenant.agent_id, user(f"question {i}")), timeout=5
                )
        await asyncio.sleep(0.2)
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}


async def test_the_served_process_exports_loop_lag_on_uvloop_its_default_loop(
    redis_url: str, postgres_dsn: str, tenant: Tenant
) -> None:
    samples = await _served_loop_metrics(redis_url, postgres_dsn, tenant)
    assert samples["ibex_context_event_loop_lag_seconds_count"] >= 3
    # uvloop has no hook to time an iteration: the histogram stays empty, not made up.
    assert samples["ibex_context_event_loop_longest_iteration_seconds_count"] == 0


async def test_on_asyncios_loop_the_served_process_also_exports_the_longest_iteration(
    redis_url: str, postgres_dsn: str, tenant: Tenant
) -> None:
    samples = await _served_loop_metrics(redis_url, postgres_dsn, tenant, IBEX_USE_UVLOOP="false")
    assert samples["ibex_context_event_loop_lag_seconds_count"] >= 3
    # The timed loop: one longest iteration per probe tick.
    assert (
        samples["ibex_context_event_loop_longest_iteration_seconds_count"]
        == samples["ibex_context_event_loop_lag_seconds_count"]
    )
    assert samples["ibex_context_event_loop_longest_iteration_seconds_sum"] > 0
