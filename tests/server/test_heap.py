"""The garbage collector is kept off the request path: the start-up heap is frozen
before serving, and every collection's pause is measured."""

from __future__ import annotations

import gc
import subprocess
import sys

import grpc
import httpx
from ibex_context.server.heap import GcPauses
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Tenant

from .conftest import request, user
from .test_shutdown import _free_port, _serve, _wait_serving


def test_gc_pauses_reports_every_collection_with_its_generation() -> None:
    seen: list[tuple[int, float]] = []
    pauses = GcPauses(lambda generation, seconds: seen.append((generation, seconds)))
    pauses.install()
    try:
        gc.collect(1)
        gc.collect()
    finally:
        pauses.uninstall()
    generations = [g for g, _ in seen]
    assert generations[-2:] == [1, 2]
    assert all(seconds >= 0 for _, seconds in seen)

    gc.collect()
    assert len(seen) == len(generations), "uninstalled: no more reports"


def test_gc_pauses_installs_once() -> None:
    seen: list[int] = []
    pauses = GcPauses(lambda generation, _seconds: seen.append(generation))
    pauses.install()
    pauses.install()
    try:
        gc.collect()
    finally:
        pauses.uninstall()
    assert seen.count(2) == 1


def test_freezing_the_start_up_heap_leaves_later_objects_collectable() -> None:
    # In a child process: freezing this one would pin the test session's heap.
    script = (
        "import gc\n"
        "from ibex_context.server.heap import freeze_startup_heap\n"
        "import ibex_context.server.app\n"
        "frozen = freeze_startup_heap()\n"
        "assert frozen == gc.get_freeze_count() > 10_000, frozen\n"
        "class Node:\n"
        "    pass\n"
        "a, b = Node(), Node()\n"
        "a.other, b.other = b, a\n"
        "del a, b\n"
        "assert gc.collect() >= 2, 'a cycle made after the freeze is still collected'\n"
        "print(frozen)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 10_000


async def test_the_served_process_freezes_its_start_up_heap_and_exports_gc_pauses(
    redis_url: str, postgres_dsn: str, tenant: Tenant
) -> None:
    metrics_port = _free_port()
    proc, port = _serve(
        redis_url,
        postgres_dsn,
        IBEX_METRICS_PORT=str(metrics_port),
        IBEX_GC_FREEZE="true",  # the product default; the test session turns it off
    )
    try:
        await _wait_serving(port)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = context_pb2_grpc.ContextAssemblyServiceStub(channel)
            for i in range(60):
                await stub.AssembleContext(
                    request(tenant.org_id, tenant.agent_id, user(f"question {i}")), timeout=5
                )
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{metrics_port}/metrics")).text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    samples = {
        (s.name, s.labels.get("generation")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("ibex_context_gc_frozen_objects", None)] > 10_000
    assert samples[("ibex_context_gc_pause_seconds_count", "0")] > 0, "60 calls trigger young collections"
    assert ("ibex_context_gc_pause_seconds_count", "2") in samples
