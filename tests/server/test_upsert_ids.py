"""UpsertMemories with an explicit id, over real gRPC into real PostgreSQL: an id
that names one stored memory, given the text of another, is refused naming both,
and nothing in the batch is written."""

from __future__ import annotations

import uuid

import grpc
import pytest
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

from tests.conftest import Tenant


async def _upsert(
    memories: context_pb2_grpc.MemoryServiceStub, tenant: Tenant, *items: pb.MemoryInput
) -> list[tuple[str, int]]:
    reply = await memories.UpsertMemories(
        pb.UpsertMemoriesRequest(org_id=tenant.org_id, agent_id=tenant.agent_id, memories=list(items)),
        timeout=10,
    )
    return [(r.id, r.outcome) for r in reply.results]


async def test_an_id_given_another_memorys_text_is_refused_naming_both_and_nothing_is_written(
    memories: context_pb2_grpc.MemoryServiceStub, tenant: Tenant
) -> None:
    x, y = str(uuid.uuid4()), str(uuid.uuid4())
    created = await _upsert(
        memories,
        tenant,
        pb.MemoryInput(id=x, content="The office opens at eight.", category="factual"),
        pb.MemoryInput(id=y, content="Invoices go out on Fridays.", category="factual"),
    )
    assert created == [(x, pb.UPSERT_OUTCOME_CREATED), (y, pb.UPSERT_OUTCOME_CREATED)]

    new_one = str(uuid.uuid4())
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _upsert(
            memories,
            tenant,
            pb.MemoryInput(id=new_one, content="A memory that must not be written.", category="factual"),
            pb.MemoryInput(id=y, content="The office opens at eight.", category="preference"),
        )
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    message = refused.value.details() or ""
    assert message.startswith("memories[1].id: ")
    assert f"memory {y} cannot take the text of memory {x}" in message

    # Y still has its own text and X its fields; the batch's first item was not written.
    assert await _upsert(
        memories,
        tenant,
        pb.MemoryInput(id=y, content="Invoices go out on Fridays.", category="factual"),
        pb.MemoryInput(id=x, content="The office opens at eight.", category="factual"),
    ) == [(y, pb.UPSERT_OUTCOME_UNCHANGED), (x, pb.UPSERT_OUTCOME_UNCHANGED)]
    deleted = await memories.DeleteMemories(
        pb.DeleteMemoriesRequest(org_id=tenant.org_id, agent_id=tenant.agent_id, ids=[new_one]), timeout=10
    )
    assert deleted.deleted == 0


async def test_a_new_id_with_a_stored_text_answers_with_the_stored_memorys_id(
    memories: context_pb2_grpc.MemoryServiceStub, tenant: Tenant
) -> None:
    x = str(uuid.uuid4())
    await _upsert(
        memories, tenant, pb.MemoryInput(id=x, content="Deploys happen on Tuesdays.", category="factual")
    )
    results = await _upsert(
        memories,
        tenant,
        pb.MemoryInput(id=str(uuid.uuid4()), content="Deploys happen on Tuesdays.", category="factual"),
    )
    assert results == [(x, pb.UPSERT_OUTCOME_UNCHANGED)]
