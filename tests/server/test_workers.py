"""``ibex-context serve --workers N``: N real processes on one port, each with its own
metrics port, a supervisor that drains them all on SIGTERM without losing a call, and
that takes the pod down when one worker dies."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import grpc
import httpx
from ibex_context.server.workers import Supervisor, worker_count, worker_environment
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from loadtest.machine import free_port_run
from tests.conftest import Tenant

from .conftest import request, user
from .test_shutdown import _serve, _wait_serving

# Connections are spread by a hash of their addresses: with 16 of them, all on one of
# two workers has a probability of 2^-15.
CHANNELS = 16
ASSEMBLE = "AssembleContext"


def test_worker_count_is_the_setting_or_one_per_usable_cpu() -> None:
    assert worker_count(3) == 3
    assert worker_count(0) == len(os.sched_getaffinity(0))


def test_each_worker_shares_the_grpc_port_and_gets_its_own_metrics_port() -> None:
    base = {"IBEX_GRPC_PORT": "50051", "IBEX_WORKERS": "2"}
    second = worker_environment(base, 1, 9464)
    assert second["IBEX_METRICS_PORT"] == "9465"
    assert second["IBEX_GRPC_REUSE_PORT"] == "true"
    assert second["IBEX_WORKERS"] == "1", "a worker must not start workers of its own"
    assert second["IBEX_GRPC_PORT"] == "50051"
    assert worker_environment(base, 1, 0)["IBEX_METRICS_PORT"] == "0"


def test_a_worker_that_dies_takes_the_others_down_and_the_supervisor_fails() -> None:
    stays = (
        "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\ntime.sleep(60)\n"
    )
    dies = "import time, sys\ntime.sleep(0.3)\nsys.exit(3)\n"
    env = dict(os.environ)
    supervisor = Supervisor([([sys.executable, "-c", stays], env), ([sys.executable, "-c", dies], env)])
    started = time.monotonic()
    assert supervisor.run() == 3
    assert time.monotonic() - started < 30, "the surviving worker was stopped, not waited for"


def test_a_worker_that_leaves_with_status_0_still_fails_the_supervisor() -> None:
    stays = (
        "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\ntime.sleep(60)\n"
    )
    env = dict(os.environ)
    supervisor = Supervisor([([sys.executable, "-c", stays], env), ([sys.executable, "-c", "pass"], env)])
    assert supervisor.run() == 1


def test_workers_need_a_fixed_grpc_port() -> None:
    env = dict(os.environ, IBEX_GRPC_PORT="0", IBEX_WORKERS="2")
    done = subprocess.run(
        [sys.executable, "-m", "ibex_context", "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "IBEX_GRPC_PORT" in done.stderr


async def _assembled_by_worker(metrics_ports: list[int]) -> list[float]:
    counts = []
    async with httpx.AsyncClient() as http:
        for port in metrics_ports:
            text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
            counts.append(
                sum(
                    s.value
                    for family in text_string_to_metric_families(text)
                    for s in family.samples
                    if s.name == "grpc_server_handled_total" and s.labels.get("grpc_method") == ASSEMBLE
                )
            )
    return counts


async def test_two_workers_serve_one_port_export_their_own_metrics_and_drain_on_sigterm(
    redis_url: str, postgres_dsn: str, tenant: Tenant
) -> None:
    metrics_base = free_port_run(2, avoid=set())
    proc, port = _serve(
        redis_url,
        postgres_dsn,
        IBEX_WORKERS="2",
        IBEX_METRICS_PORT=str(metrics_base),
        IBEX_SHUTDOWN_GRACE_SECONDS="20",
    )
    # A connection per channel (grpcio shares one between channels of the same target and
    # options unless each has its own subchannel pool), so both workers get some.
    channels = [
        grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(CHANNELS)
    ]
    try:
        await _wait_serving(port)
        await context_pb2_grpc.MemoryServiceStub(channels[0]).UpsertMemories(
            pb.UpsertMemoriesRequest(
                org_id=tenant.org_id,
                agent_id=tenant.agent_id,
                memories=[
                    pb.MemoryInput(content=f"fact number {i} about workers", category="factual")
                    for i in range(30)
                ],
            )
        )
        stubs = [context_pb2_grpc.ContextAssemblyServiceStub(ch) for ch in channels]
        # Both workers must be up before the connections are made: wait for both ports.
        for metrics_port in (metrics_base, metrics_base + 1):
            async with httpx.AsyncClient() as http:
                for _ in range(300):
                    try:
                        if (await http.get(f"http://127.0.0.1:{metrics_port}/healthz")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.1)
        for i, stub in enumerate(stubs * 2):
            await stub.AssembleContext(
                request(tenant.org_id, tenant.agent_id, user(f"worker fact {i}")), timeout=10
            )

        by_worker = await _assembled_by_worker([metrics_base, metrics_base + 1])
        assert sum(by_worker) == 2 * CHANNELS, "every call counted once, by the worker that served it"
        assert all(count > 0 for count in by_worker), f"one worker served everything: {by_worker}"

        calls = [
            asyncio.ensure_future(
                stubs[i % CHANNELS].AssembleContext(
                    request(tenant.org_id, tenant.agent_id, user(f"draining fact {i}")), timeout=20
                )
            )
            for i in range(300)
        ]
        await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        results = await asyncio.gather(*calls, return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        assert not failures, f"{len(failures)} of {len(calls)} calls were cut, e.g. {failures[0]!r}"
        assert all(isinstance(r, pb.AssembleContextResponse) for r in results)
        assert proc.wait(timeout=40) == 0
    finally:
        for ch in channels:
            await ch.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
