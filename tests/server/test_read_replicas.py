"""A service with a read replica (IBEX_POSTGRES_READ_DSNS): its searches move to the
replica, a memory upserted is injected on the next call however far behind the
replica is, and a stopped replica leaves calls FULL from the primary. Metrics and
health say which replica takes reads and how far behind it is."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import grpc
import httpx
import pytest
from grpc_health.v1.health_pb2 import HealthCheckRequest, HealthCheckResponse
from grpc_health.v1.health_pb2_grpc import HealthStub
from ibex_context.devtools.replica import PostgresReplica
from ibex_context.server.app import ContextService
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Tenant

from .conftest import StartService, request, user

WAIT_SECONDS = 20.0


async def _metrics(service: ContextService) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with httpx.AsyncClient(timeout=5) as http:
        text = (await http.get(f"http://127.0.0.1:{service.metrics_port}/metrics")).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def _reads(service: ContextService, target: str, reason: str) -> float:
    key = ("ibex_context_postgres_reads_total", (("reason", reason), ("target", target)))
    return (await _metrics(service)).get(key, 0.0)


async def _replica_up(service: ContextService) -> float:
    key = ("ibex_context_postgres_replica_up", (("replica", "replica-0"),))
    return (await _metrics(service))[key]


async def _until_replica_is(service: ContextService, up: float) -> None:
    async with asyncio.timeout(WAIT_SECONDS):  # polled: the service polls the replica itself
        while True:
            if await _replica_up(service) == up:
                return
            await asyncio.sleep(0.05)


@pytest.fixture
async def service(start_service: StartService, postgres_replica: PostgresReplica) -> ContextService:
    service = await start_service(
        postgres_read_dsns=(postgres_replica.dsn,), postgres_replica_poll_seconds=0.05
    )
    await _until_replica_is(service, 1.0)
    # Connections opened, statements prepared, caches filled: the first calls of a new
    # process pay for them (and miss the deadline on a loaded machine), not the tests'.
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        assembly = context_pb2_grpc.ContextAssemblyServiceStub(channel)
        warm_up = request(str(uuid.uuid4()), str(uuid.uuid4()), user("warming up"))
        async with asyncio.timeout(WAIT_SECONDS):
            while True:
                md = (await assembly.AssembleContext(warm_up)).metadata
                if md.degradation_level == pb.DEGRADATION_LEVEL_FULL:
                    break
    return service


@pytest.fixture
async def stubs(
    service: ContextService,
) -> AsyncIterator[tuple[context_pb2_grpc.ContextAssemblyServiceStub, context_pb2_grpc.MemoryServiceStub]]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        yield (
            context_pb2_grpc.ContextAssemblyServiceStub(channel),
            context_pb2_grpc.MemoryServiceStub(channel),
        )


# A shared 2-core machine can make any call miss its deadline; a store's failure
# shows as an error instead. Calls that only ran out of time are asked again.
_LOAD_REASONS = {
    "deadline_exceeded",
    "directive_timeout",
    "hot_timeout",
    "embed_timeout",
    "cold_timeout",
    "lexical_timeout",
}


async def _assemble_full(
    assembly: context_pb2_grpc.ContextAssemblyServiceStub,
    question: pb.AssembleContextRequest,
    attempts: int = 5,
) -> pb.AssembleContextResponse:
    """The first FULL answer to ``question``; fails at once on any degradation but lack of time."""
    for _ in range(attempts):
        response = await assembly.AssembleContext(question)
        reasons = set(response.metadata.degradation_reasons)
        assert reasons <= _LOAD_REASONS, reasons
        if response.metadata.degradation_level == pb.DEGRADATION_LEVEL_FULL:
            return response
    raise AssertionError(f"no FULL answer in {attempts} calls: {reasons}")


async def _upsert(memories: context_pb2_grpc.MemoryServiceStub, tenant: Tenant, content: str) -> str:
    reply = await memories.UpsertMemories(
        pb.UpsertMemoriesRequest(
            org_id=tenant.org_id,
            agent_id=tenant.agent_id,
            memories=[pb.MemoryInput(content=content, category="factual")],
        )
    )
    return str(reply.results[0].id)


async def test_the_searches_go_to_the_replica(
    service: ContextService,
    stubs: tuple[context_pb2_grpc.ContextAssemblyServiceStub, context_pb2_grpc.MemoryServiceStub],
    tenant: Tenant,
) -> None:
    assembly, memories = stubs
    memory_id = await _upsert(memories, tenant, "The wifi password at the Lisbon office is tangerine")
    question = request(tenant.org_id, tenant.agent_id, user("what is the wifi password in Lisbon?"))
    async with asyncio.timeout(WAIT_SECONDS):  # until the replica has replayed the write
        while True:
            before = await _reads(service, "replica", "replica")
            await assembly.AssembleContext(question)
            if await _reads(service, "replica", "replica") == before + 2:
                break
            await asyncio.sleep(0.05)
    before = await _reads(service, "replica", "replica")
    md = (await _assemble_full(assembly, question)).metadata
    (injected,) = [m for m in md.memories if m.id == memory_id]
    assert injected.lexical > 0 and injected.semantic > 0
    assert await _reads(service, "replica", "replica") >= before + 2  # vector and lexical
    assert await _reads(service, "primary", "replica_failed") == 0


async def test_a_memory_upserted_is_injected_on_the_next_call_while_the_replica_is_behind(
    service: ContextService,
    stubs: tuple[context_pb2_grpc.ContextAssemblyServiceStub, context_pb2_grpc.MemoryServiceStub],
    postgres_replica: PostgresReplica,
    tenant: Tenant,
) -> None:
    assembly, memories = stubs
    standby = await asyncpg.connect(postgres_replica.dsn)
    try:
        await standby.execute("SELECT pg_wal_replay_pause()")
        before = await _reads(service, "primary", "behind_write")
        memory_id = await _upsert(memories, tenant, "Caroline adopted a greyhound called Biscuit")
        response = await _assemble_full(
            assembly, request(tenant.org_id, tenant.agent_id, user("what is the name of Caroline's dog?"))
        )
        md = response.metadata
        (injected,) = [m for m in md.memories if m.id == memory_id]
        assert injected.lexical > 0  # found by the search, not only written through to the hot set
        assert await _reads(service, "primary", "behind_write") >= before + 2  # vector and lexical
    finally:
        await standby.execute("SELECT pg_wal_replay_resume()")
        await standby.close()


async def test_a_purged_agent_is_not_served_from_a_replica_that_has_not_replayed_the_purge(
    service: ContextService,
    stubs: tuple[context_pb2_grpc.ContextAssemblyServiceStub, context_pb2_grpc.MemoryServiceStub],
    postgres_replica: PostgresReplica,
    tenant: Tenant,
) -> None:
    assembly, memories = stubs
    memory_id = await _upsert(memories, tenant, "Gina's bank account number is 12345678")
    question = request(tenant.org_id, tenant.agent_id, user("what is Gina's bank account number?"))
    async with asyncio.timeout(WAIT_SECONDS):  # until the replica serves the agent
        while True:
            before = await _reads(service, "replica", "replica")
            await assembly.AssembleContext(question)
            if await _reads(service, "replica", "replica") == before + 2:
                break
            await asyncio.sleep(0.05)
    standby = await asyncpg.connect(postgres_replica.dsn)
    try:
        await standby.execute("SELECT pg_wal_replay_pause()")
        purged = await memories.PurgeAgent(
            pb.PurgeAgentRequest(org_id=tenant.org_id, agent_id=tenant.agent_id)
        )
        assert purged.complete
        md = (await _assemble_full(assembly, question)).metadata
        assert memory_id not in md.memory_ids
        assert md.memories_injected == 0
        # The replica still holds the memory: only the purge's mark kept the searches off it.
        assert (
            await standby.fetchval("SELECT count(*) FROM memories WHERE id = $1", uuid.UUID(memory_id)) == 1
        )
    finally:
        await standby.execute("SELECT pg_wal_replay_resume()")
        await standby.close()


async def test_a_stopped_replica_leaves_calls_full_from_the_primary_and_health_says_so(
    service: ContextService,
    stubs: tuple[context_pb2_grpc.ContextAssemblyServiceStub, context_pb2_grpc.MemoryServiceStub],
    postgres_replica: PostgresReplica,
    tenant: Tenant,
) -> None:
    assembly, memories = stubs
    memory_id = await _upsert(memories, tenant, "Deployments to production happen on Tuesdays")
    await asyncio.to_thread(postgres_replica.stop)
    try:
        for _ in range(3):  # before and after the service notices
            response = await _assemble_full(
                assembly,
                request(tenant.org_id, tenant.agent_id, user("when do deployments to production happen?")),
            )
            (injected,) = [m for m in response.metadata.memories if m.id == memory_id]
            assert injected.lexical > 0
        await _until_replica_is(service, 0.0)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            health = await HealthStub(channel).Check(
                HealthCheckRequest(service="ibex.stores.postgres_replicas")
            )
            assert health.status == HealthCheckResponse.NOT_SERVING
            # Readiness does not follow the stores: calls are answered.
            overall = await HealthStub(channel).Check(HealthCheckRequest(service=""))
            assert overall.status == HealthCheckResponse.SERVING
    finally:
        await asyncio.to_thread(postgres_replica.start)
    await _until_replica_is(service, 1.0)
