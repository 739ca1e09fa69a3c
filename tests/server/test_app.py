"""Starting the service (``server.app``): what it refuses to serve on."""

from __future__ import annotations

import asyncio
import gc

import pytest
from ibex_context.errors import ConfigurationError
from ibex_context.server.app import ContextService
from ibex_context.tokens.encodings import EncodingRegistry

from .conftest import StartService, make_settings


async def test_a_database_without_this_builds_migrations_is_refused_at_start_with_what_to_run(
    start_service: StartService, empty_database_dsn: str
) -> None:
    with pytest.raises(ConfigurationError, match="run `ibex-context migrate`"):
        await start_service(postgres_dsn=empty_database_dsn)


async def test_a_failed_start_closes_what_it_had_opened(
    redis_url: str, postgres_dsn: str, empty_database_dsn: str, encodings: EncodingRegistry
) -> None:
    service = ContextService(make_settings(redis_url, empty_database_dsn), encodings=encodings)
    callbacks_before = list(gc.callbacks)
    tasks_before = asyncio.all_tasks()
    with pytest.raises(ConfigurationError):
        await service.start()
    # The collector hook and the loop-lag probe were installed before the schema check.
    assert gc.callbacks == callbacks_before
    assert asyncio.all_tasks() - tasks_before == set()
    # And a service on the same settings with a migrated database starts and serves.
    started = ContextService(make_settings(redis_url, postgres_dsn), encodings=encodings)
    await started.start()
    try:
        assert started.port > 0
    finally:
        await started.stop(grace=0.5)


async def test_metrics_listen_on_loopback_unless_configured_even_when_grpc_serves_every_address(
    start_service: StartService,
) -> None:
    """Metrics describe every tenant's traffic: a peer that can reach the gRPC port must
    not read them unless the deployment opens them (the chart does, for Prometheus)."""
    service = await start_service(grpc_host="0.0.0.0")
    assert service.metrics_host == "127.0.0.1"
    opened = await start_service(grpc_host="127.0.0.1", metrics_host="0.0.0.0")
    assert opened.metrics_host == "0.0.0.0"


async def test_requests_above_the_inline_bound_are_counted_on_the_counting_thread(
    start_service: StartService,
) -> None:
    """The served assembler has its counting thread: with a bound of 0 every request's
    messages (the start's warm-up call's too) are counted there, to the same answer. The
    thread is started by its first task only: at the default bound no short call makes it."""
    import threading
    import uuid

    import grpc
    from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

    from .conftest import request, user

    service = await start_service(inline_count_chars=0)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        stub = context_pb2_grpc.ContextAssemblyServiceStub(channel)
        reply = await stub.AssembleContext(
            request(str(uuid.uuid4()), str(uuid.uuid4()), user("when does the warehouse open?")), timeout=10
        )
    assert reply.messages[-1].content == "when does the warehouse open?"
    assert any(t.name.startswith("ibex-token-count") for t in threading.enumerate())


async def test_a_large_agents_graph_build_shows_in_the_services_metrics(
    start_service: StartService, private_postgres_dsn: str
) -> None:
    """Operators see the build queue and each build's time (``ibex_context_graph_build*``),
    with no tenant in a label: an agent written past the exact scan's limit is built. (A
    database of its own: at start the service queues every agent past its limit.)"""
    import uuid

    import grpc
    from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
    from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

    service = await start_service(cold_exact_max_memories=5, postgres_dsn=private_postgres_dsn)
    registry = service.metrics_registry
    built = {"graph": "dense", "outcome": "built"}
    assert registry.get_sample_value("ibex_context_graph_build_seconds_count", built) == 0
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        await context_pb2_grpc.MemoryServiceStub(channel).UpsertMemories(
            pb.UpsertMemoriesRequest(
                org_id=str(uuid.uuid4()),
                agent_id=str(uuid.uuid4()),
                memories=[
                    pb.MemoryInput(content=f"note {i} of a growing agent", category="factual")
                    for i in range(8)
                ],
            ),
            timeout=10,
        )
    for _ in range(200):  # at most 10 s
        if registry.get_sample_value("ibex_context_graph_build_seconds_count", built) == 1:
            break
        await asyncio.sleep(0.05)
    assert registry.get_sample_value("ibex_context_graph_build_seconds_count", built) == 1
    assert registry.get_sample_value("ibex_context_graph_build_seconds_sum", built) > 0
    assert registry.get_sample_value("ibex_context_graph_builds_queued") == 0
