"""Tenant limits end to end (issue 39): a request list past its bound and an org past
its quota are refused with RESOURCE_EXHAUSTED naming the limit, before the store is
asked for the work, and each refusal is counted by its limit (no tenant ids)."""

from __future__ import annotations

import uuid

import grpc
import httpx
import pytest
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

from tests.conftest import Tenant

from .conftest import StartService


async def _refused(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    return caught.value


async def test_lists_past_their_bounds_and_an_org_past_its_quota_are_refused_naming_the_limit(
    start_service: StartService, tenant: Tenant
) -> None:
    service = await start_service(max_delete_ids=3, max_feedback_items=2, max_org_memories=2)
    org, agent = tenant.org_id, tenant.agent_id
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        memories = context_pb2_grpc.MemoryServiceStub(channel)
        stored = await memories.UpsertMemories(
            pb.UpsertMemoriesRequest(
                org_id=org,
                agent_id=agent,
                memories=[pb.MemoryInput(content=f"fact {i}", category="factual") for i in range(2)],
            )
        )
        ids = [r.id for r in stored.results]

        errors = [
            await _refused(
                memories.DeleteMemories(
                    pb.DeleteMemoriesRequest(
                        org_id=org, agent_id=agent, ids=[str(uuid.uuid4()) for _ in range(4)]
                    )
                )
            ),
            await _refused(
                memories.RecordFeedback(
                    pb.RecordFeedbackRequest(
                        org_id=org,
                        agent_id=agent,
                        feedback=[pb.MemoryFeedback(memory_id=ids[0], feedback=pb.FEEDBACK_POSITIVE)] * 3,
                    )
                )
            ),
            await _refused(
                memories.ListMemories(
                    pb.ListMemoriesRequest(org_id=org, agent_id=agent, categories=["factual"] * 33)
                )
            ),
            # Another agent of the same org: the quota is the org's.
            await _refused(
                memories.UpsertMemories(
                    pb.UpsertMemoriesRequest(
                        org_id=org,
                        agent_id=str(uuid.uuid4()),
                        memories=[pb.MemoryInput(content="one too many", category="factual")],
                    )
                )
            ),
        ]
        assert [e.code() for e in errors] == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 4
        assert [(e.details() or "").split(":")[0] for e in errors] == [
            "max_delete_ids",
            "max_feedback_items",
            "max_list_categories",
            "max_org_memories",
        ]
        # Within the bounds the same calls work: nothing was written by the refused ones.
        assert (
            await memories.DeleteMemories(pb.DeleteMemoriesRequest(org_id=org, agent_id=agent, ids=ids[:1]))
        ).deleted == 1
        listed = await memories.ListMemories(pb.ListMemoriesRequest(org_id=org, agent_id=agent))
        assert [m.id for m in listed.memories] == ids[1:]

    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"http://127.0.0.1:{service.metrics_port}/metrics")).text
    for limit in ("max_delete_ids", "max_feedback_items", "max_list_categories", "max_org_memories"):
        assert f'ibex_context_limit_refusals_total{{limit="{limit}"}} 1.0' in metrics
    assert org not in metrics
