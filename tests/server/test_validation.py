"""Bad input gets INVALID_ARGUMENT naming the field, and nothing is written."""

from __future__ import annotations

import time

import asyncpg
import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from ibex_context.server.app import ContextService
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

from tests.conftest import Tenant

from .conftest import user

VALID_ORG = "0b6f7a4e-8f1c-4b53-9a51-5b1a3c7c2d01"
VALID_AGENT = "5d2e9c1a-3b4f-4e6a-8c7d-9f0a1b2c3d11"


def _assemble(**fields: object) -> pb.AssembleContextRequest:
    values: dict[str, object] = {
        "org_id": VALID_ORG,
        "agent_id": VALID_AGENT,
        "model": "gpt-4o",
        "messages": [user("hi")],
    }
    values.update(fields)
    return pb.AssembleContextRequest(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (_assemble(org_id="not-a-uuid"), "org_id"),
        (_assemble(org_id=""), "org_id"),
        (_assemble(agent_id="1234"), "agent_id"),
        (_assemble(session_id="zzz"), "session_id"),
        (_assemble(model=""), "model"),
        (_assemble(messages=[user("a"), pb.Message(role="wizard", content="x")]), "messages[1].role"),
        (_assemble(messages=[pb.Message(role="user", content="x" * 400_001)]), "messages[0].content"),
        (_assemble(messages=[user("m")] * 10_000), "messages"),
    ],
    ids=[
        "malformed-org",
        "missing-org",
        "malformed-agent",
        "malformed-session",
        "missing-model",
        "unknown-role",
        "oversized-content",
        "10k-messages",
    ],
)
async def test_assemble_rejects_bad_input_naming_the_field(
    assembly: context_pb2_grpc.ContextAssemblyServiceStub, request_: pb.AssembleContextRequest, field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await assembly.AssembleContext(request_)
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert (error.value.details() or "").startswith(f"{field}:")


async def test_a_20_mb_request_is_rejected_before_it_is_parsed(
    assembly: context_pb2_grpc.ContextAssemblyServiceStub,
) -> None:
    huge = _assemble(messages=[user("x" * 1_000_000) for _ in range(20)])
    assert huge.ByteSize() > 20_000_000
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await assembly.AssembleContext(huge, timeout=30)
    # gRPC's core refuses it from its length prefix (server/grpc_server.py).
    assert error.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "larger than max (20000364 vs. 4194304)" in (error.value.details() or "")


@pytest.mark.parametrize("method", ["ContextAssemblyService/AssembleContext", "MemoryService/UpsertMemories"])
async def test_bytes_that_are_not_protobuf_are_invalid_argument(
    shared_service: ContextService, method: str
) -> None:
    not_protobuf = b"\x0a\x64abc"  # field 1 announced 100 bytes long, 3 present
    async with grpc.aio.insecure_channel(f"127.0.0.1:{shared_service.port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            # No serializer: the bytes go as they are.
            await channel.unary_unary(f"/ibex.context.v1.{method}")(not_protobuf, timeout=10)
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert error.value.details() == "request: not a valid protobuf message"


async def _count(postgres_dsn: str, tenant: Tenant) -> int:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM memories WHERE org_id = $1 AND agent_id = $2",
                tenant.org_id,
                tenant.agent_id,
            )
        )
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("memory", "field"),
    [
        (pb.MemoryInput(content="", category="factual"), "memories[1].content"),
        (pb.MemoryInput(content="   ", category="factual"), "memories[1].content"),
        (pb.MemoryInput(content="x" * 8193, category="factual"), "memories[1].content"),
        (pb.MemoryInput(content="ok", category="gossip"), "memories[1].category"),
        (pb.MemoryInput(content="ok", category="factual", id="nope"), "memories[1].id"),
        (pb.MemoryInput(content="ok", category="factual", confidence=1.5), "memories[1].confidence"),
        (pb.MemoryInput(content="ok", category="factual", embedding=[0.1] * 3), "memories[1].embedding"),
        (
            pb.MemoryInput(content="ok", category="factual", occurred_at=Timestamp(seconds=-1)),
            "memories[1].occurred_at",
        ),
        (
            pb.MemoryInput(
                content="ok", category="factual", occurred_at=Timestamp(seconds=int(time.time()) + 3 * 86_400)
            ),
            "memories[1].occurred_at",
        ),
    ],
    ids=[
        "empty",
        "blank",
        "oversized",
        "unknown-category",
        "malformed-id",
        "confidence-out-of-range",
        "wrong-dimension",
        "occurred-before-1970",
        "occurred-in-the-future",
    ],
)
async def test_upsert_rejects_the_whole_batch_naming_the_field_and_writes_nothing(
    memories: context_pb2_grpc.MemoryServiceStub,
    postgres_dsn: str,
    tenant: Tenant,
    memory: pb.MemoryInput,
    field: str,
) -> None:
    good = pb.MemoryInput(content="a perfectly fine memory", category="factual")
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await memories.UpsertMemories(
            pb.UpsertMemoriesRequest(org_id=tenant.org_id, agent_id=tenant.agent_id, memories=[good, memory])
        )
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert (error.value.details() or "").startswith(f"{field}:")
    assert await _count(postgres_dsn, tenant) == 0


async def test_write_calls_reject_malformed_scope(memories: context_pb2_grpc.MemoryServiceStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await memories.SetDirective(pb.SetDirectiveRequest(org_id="x", agent_id=VALID_AGENT, content="d"))
    assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert (error.value.details() or "").startswith("org_id:")
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await memories.DeleteMemories(
            pb.DeleteMemoriesRequest(org_id=VALID_ORG, agent_id=VALID_AGENT, ids=["1"])
        )
    assert (error.value.details() or "").startswith("ids[0]:")
