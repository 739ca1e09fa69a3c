"""A real ibex-context server on a real socket, wired to the session's real stores."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from ibex_context.server.app import ContextService
from ibex_context.settings import Settings
from ibex_context.tokens.encodings import EncodingRegistry
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

StartService = Callable[..., Awaitable[ContextService]]


# Tests that assert a FULL assembly must not depend on this machine's load: the
# sources get the most time a profile allows (the product defaults are 10/15/35 ms).
GENEROUS_PROFILES = {
    "apiVersion": "context.ibex.dev/v1alpha1",
    "kind": "ContextProfileSet",
    "profiles": [
        {
            "name": "tests/generous",
            "selector": {"default": True},
            "deadlines": {"assemblyMs": 45, "directiveMs": 40, "hotMs": 40, "coldMs": 44},
        }
    ],
}


def generous_profiles_file(directory: Path, **deadlines: float) -> Path:
    """A profiles file with the generous default profile (``deadlines`` override it)."""
    profiles = json.loads(json.dumps(GENEROUS_PROFILES))
    profiles["profiles"][0]["deadlines"].update(deadlines)
    path = directory / "profiles.json"
    path.write_text(json.dumps(profiles))
    return path


def make_settings(redis_url: str, postgres_dsn: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "postgres_dsn": postgres_dsn,
        "grpc_host": "127.0.0.1",
        "grpc_port": 0,
        "metrics_port": 0,
        "embedder": "hashing",
        "log_format": "text",
        "nonce_secret": "test-secret",
        "shutdown_grace_seconds": 2.0,
        # These tests are about other things; tests/server/test_auth.py serves with auth on.
        "auth_enabled": False,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
async def start_service(
    redis_url: str, postgres_dsn: str, tmp_path: Path, encodings: EncodingRegistry
) -> AsyncIterator[StartService]:
    """Starts a server per call (for tests that need their own settings or stores);
    with the generous profile unless ``profiles_path`` is given."""
    started: list[ContextService] = []
    generous = generous_profiles_file(tmp_path)

    async def start(*, embedder_instance: Any = None, **overrides: Any) -> ContextService:
        overrides.setdefault("profiles_path", generous)
        settings = make_settings(
            overrides.pop("redis_url", redis_url), overrides.pop("postgres_dsn", postgres_dsn), **overrides
        )
        service = ContextService(settings, embedder=embedder_instance, encodings=encodings)
        await service.start()
        started.append(service)
        return service

    yield start
    for service in started:
        await service.stop(grace=1.0)


@pytest.fixture(scope="session")
async def shared_service(
    redis_url: str, postgres_dsn: str, tmp_path_factory: pytest.TempPathFactory, encodings: EncodingRegistry
) -> AsyncIterator[ContextService]:
    """One server for the tests that only read and write their own tenants."""
    profiles = generous_profiles_file(tmp_path_factory.mktemp("profiles"))
    service = ContextService(
        make_settings(redis_url, postgres_dsn, profiles_path=profiles), encodings=encodings
    )
    await service.start()
    yield service
    await service.stop(grace=1.0)


@pytest.fixture
async def channel(shared_service: ContextService) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{shared_service.port}") as ch:
        yield ch


@pytest.fixture
def assembly(channel: grpc.aio.Channel) -> context_pb2_grpc.ContextAssemblyServiceStub:
    return context_pb2_grpc.ContextAssemblyServiceStub(channel)


@pytest.fixture
def memories(channel: grpc.aio.Channel) -> context_pb2_grpc.MemoryServiceStub:
    return context_pb2_grpc.MemoryServiceStub(channel)


def user(content: str) -> pb.Message:
    return pb.Message(role="user", content=content)


def request(
    org_id: str, agent_id: str, *messages: pb.Message, model: str = "gpt-4o"
) -> pb.AssembleContextRequest:
    return pb.AssembleContextRequest(
        org_id=org_id, agent_id=agent_id, model=model, request_id="test", messages=list(messages)
    )
