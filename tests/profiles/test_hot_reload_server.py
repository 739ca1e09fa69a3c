"""Hot reload end to end: swap the mounted profiles directory under a running server (real
gRPC, real Redis and PostgreSQL) and the next call is scored with the new weights."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from ibex_context.profiles.watcher import ReloadOutcome
from ibex_context.server.app import ContextService
from ibex_context.settings import Settings
from ibex_context.tokens.encodings import EncodingRegistry
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

from tests.conftest import Tenant

from .volumes import ConfigMapVolume

pytestmark = pytest.mark.integration

ONLY = {"relevance": 0.0, "recency": 0.0, "usefulness": 0.0, "confidence": 0.0, "frequency": 0.0}


def profile_set(name: str, **weights: float) -> str:
    return json.dumps(
        {
            "apiVersion": "context.ibex.dev/v1alpha1",
            "kind": "ContextProfileSet",
            "profiles": [
                {
                    "name": name,
                    "selector": {"default": True},
                    # Generous deadlines: the test is about weights, not about this machine's load.
                    "deadlines": {"assemblyMs": 45, "directiveMs": 40, "hotMs": 40, "coldMs": 44},
                    "scoring": {"weights": {**ONLY, **weights}, "relevanceFloor": 0.0},
                }
            ],
        }
    )


@pytest.fixture
async def served(
    redis_url: str, postgres_dsn: str, tmp_path: Path, encodings: EncodingRegistry
) -> AsyncIterator[tuple[ContextService, ConfigMapVolume]]:
    volume = ConfigMapVolume(tmp_path)
    volume.publish(profile_set("v1-recency", recency=1.0))
    settings = Settings(
        redis_url=redis_url,
        postgres_dsn=postgres_dsn,
        grpc_host="127.0.0.1",
        grpc_port=0,
        metrics_port=0,
        embedder="hashing",
        log_format="text",
        nonce_secret="test-secret",
        shutdown_grace_seconds=1.0,
        profiles_path=volume.path,
        profiles_poll_seconds=0.05,
        auth_enabled=False,
    )
    service = ContextService(settings, encodings=encodings)
    await service.start()
    try:
        yield service, volume
    finally:
        await service.stop(grace=1.0)


async def assemble(channel: grpc.aio.Channel, tenant: Tenant) -> Any:
    stub = context_pb2_grpc.ContextAssemblyServiceStub(channel)
    return await stub.AssembleContext(
        pb.AssembleContextRequest(
            org_id=tenant.org_id,
            agent_id=tenant.agent_id,
            model="gpt-4o",
            request_id="hot-reload",
            messages=[pb.Message(role="user", content="when do deployments to production happen?")],
        )
    )


async def until_profile(channel: grpc.aio.Channel, tenant: Tenant, name: str) -> Any:
    for _ in range(200):
        response = await assemble(channel, tenant)
        if response.metadata.profile == name:
            return response
        await asyncio.sleep(0.05)
    raise AssertionError(f"profile {name!r} never used")


HALF_A_YEAR_AGO = Timestamp(seconds=int(time.time()) - 180 * 86_400)


async def test_a_swapped_profiles_directory_changes_the_weights_of_the_next_calls(
    served: tuple[ContextService, ConfigMapVolume], tenant: Tenant
) -> None:
    service, volume = served
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        memories = context_pb2_grpc.MemoryServiceStub(channel)
        await memories.UpsertMemories(
            pb.UpsertMemoriesRequest(
                org_id=tenant.org_id,
                agent_id=tenant.agent_id,
                memories=[
                    # Half a year old: recency ~0.5, so a recency-only score differs from relevance.
                    pb.MemoryInput(
                        content=c,
                        category="factual",
                        occurred_at=Timestamp(seconds=int(time.time()) - 180 * 86_400),
                    )
                    for c in (
                        "Deployments to production happen on Tuesdays after the standup",
                        "The staging database is rebuilt every Sunday night",
                        "The office plants are watered on Fridays",
                    )
                ],
            )
        )

        before = await assemble(channel, tenant)
        assert before.metadata.profile == "v1-recency"
        assert before.metadata.memories
        for m in before.metadata.memories:  # recency only: relevance scaled by recency alone
            assert m.score == pytest.approx(m.relevance * m.recency)
        assert any(m.score != pytest.approx(m.relevance) for m in before.metadata.memories)

        volume.publish(profile_set("v2-relevance", relevance=1.0))
        after = await until_profile(channel, tenant, "v2-relevance")
        assert after.metadata.memories
        for m in after.metadata.memories:  # relevance only now
            assert m.score == pytest.approx(m.relevance)

        # A bad update is rejected: the server keeps serving with the last good profiles.
        assert service.watcher is not None
        volume.publish(json.dumps({"profiles": [{"name": "broken", "selector": {}}]}))
        for _ in range(200):
            if service.watcher.status.last_outcome is ReloadOutcome.INVALID:
                break
            await asyncio.sleep(0.05)
        assert service.watcher.status.last_outcome is ReloadOutcome.INVALID
        still = await assemble(channel, tenant)
        assert still.metadata.profile == "v2-relevance"
