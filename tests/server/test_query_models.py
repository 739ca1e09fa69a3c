"""What embeds a call's query with the real MiniLM embedder: MiniLM, the static table
distilled from it, the table first with MiniLM scoring, and the table standing in for a
late MiniLM vector; over gRPC against the real stores, each says so in the embed
source's detail and finds the memory the question is about."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from ibex_context.pipeline.outcome import STAND_IN_DETAIL
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

from tests.conftest import Tenant

from .conftest import StartService, request, user

QUESTION = "What did I tell you about my service dog?"
ANSWER = "Mira's service dog, Juniper, is trained to alert her before a seizure."
OTHERS = [
    "The quarterly report is due on Friday; Sam owns the revenue section.",
    "We moved the team offsite from Lisbon to Porto because of the flights.",
    "Her favourite dessert is a lemon tart from the bakery on Rua Augusta.",
    "The staging cluster is patched every second Tuesday at noon.",
]


async def _ask(
    start_service: StartService, tenant: Tenant, **settings: Any
) -> tuple[pb.SourceOutcome, list[str]]:
    """The embed source's outcome and the injected memories' contents, best first."""
    service = await start_service(embedder="minilm", embedding_dim=384, **settings)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        written = await context_pb2_grpc.MemoryServiceStub(channel).UpsertMemories(
            pb.UpsertMemoriesRequest(
                org_id=tenant.org_id,
                agent_id=tenant.agent_id,
                memories=[pb.MemoryInput(content=c, category="factual") for c in (ANSWER, *OTHERS)],
            )
        )
        content = {r.id: c for r, c in zip(written.results, (ANSWER, *OTHERS), strict=True)}
        response = await context_pb2_grpc.ContextAssemblyServiceStub(channel).AssembleContext(
            request(tenant.org_id, tenant.agent_id, user(QUESTION))
        )
    assert response.metadata.degradation_level == pb.DEGRADATION_LEVEL_FULL
    [embed] = [s for s in response.metadata.sources if s.source == "embed"]
    [cold] = [s for s in response.metadata.sources if s.source == "cold"]
    assert cold.status == pb.SOURCE_STATUS_OK and cold.count == len(content)
    return embed, [content[m.id] for m in response.metadata.memories]


@pytest.mark.parametrize(
    ("settings", "detail"),
    [
        ({}, ""),
        ({"embedding_query_model": "static"}, ""),
        ({"embedding_query_model": "static-first"}, ""),
        # Every call's MiniLM vector is late by a microsecond: each call stands in.
        ({"embedding_stand_in_ms": 0.001}, STAND_IN_DETAIL),
        ({"embedding_query_model": "static-first", "embedding_stand_in_ms": 0.001}, STAND_IN_DETAIL),
    ],
)
async def test_each_query_model_finds_the_memory_asked_about_and_says_how_it_embedded(
    start_service: StartService, tenant: Tenant, settings: dict[str, Any], detail: str
) -> None:
    embed, injected = await _ask(start_service, tenant, **settings)
    assert embed.status == pb.SOURCE_STATUS_OK and embed.detail == detail
    assert injected[0] == ANSWER
