"""A real ibex-context server with authentication on (bearer tokens bound to an org), on the
session's real stores, for the integrations to call as their users would."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import yaml
from ibex_context.models import NewMemory
from ibex_context.server.app import ContextService
from ibex_context.server.auth import token_digest
from ibex_context.tokens.encodings import EncodingRegistry
from ibex_context_client.memory import MemoryClient

from tests.server.conftest import generous_profiles_file, make_settings


def _token(name: str) -> str:
    return f"tok-{name}-{uuid.uuid4().hex}{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Tokens:
    """Bearer tokens the service knows: the proxy's (assemble, ORG), an agent's (read and write,
    ORG), another org's agent (read and write, OTHER_ORG), and an admin's (every role, any org)."""

    org_id: str
    other_org_id: str
    proxy: str
    agent: str
    other_org_agent: str
    admin: str


@pytest.fixture(scope="module")
def tokens() -> Tokens:
    return Tokens(
        org_id=str(uuid.uuid4()),
        other_org_id=str(uuid.uuid4()),
        proxy=_token("proxy"),
        agent=_token("agent"),
        other_org_agent=_token("other"),
        admin=_token("admin"),
    )


def _credentials_yaml(tokens: Tokens) -> str:
    def principal(name: str, token: str, roles: list[str], org_id: str | None) -> dict[str, object]:
        entry: dict[str, object] = {"name": name, "roles": roles, "token_sha256": [token_digest(token).hex()]}
        if org_id is not None:
            entry["org_id"] = org_id
        return entry

    return yaml.safe_dump(
        {
            "principals": [
                principal("proxy", tokens.proxy, ["assemble"], tokens.org_id),
                principal("agent", tokens.agent, ["read", "write"], tokens.org_id),
                principal("other", tokens.other_org_agent, ["read", "write"], tokens.other_org_id),
                principal("admin", tokens.admin, ["assemble", "read", "write", "admin"], None),
            ]
        }
    )


@pytest.fixture(scope="module")
async def secured_service(
    redis_url: str,
    postgres_dsn: str,
    tmp_path_factory: pytest.TempPathFactory,
    encodings: EncodingRegistry,
    tokens: Tokens,
) -> AsyncIterator[ContextService]:
    directory = tmp_path_factory.mktemp("integrations")
    credentials = directory / "credentials.yaml"
    credentials.write_text(_credentials_yaml(tokens))
    settings = make_settings(
        redis_url,
        postgres_dsn,
        profiles_path=generous_profiles_file(directory),
        auth_enabled=True,
        auth_credentials_file=credentials,
    )
    service = ContextService(settings, encodings=encodings)
    await service.start()
    yield service
    await service.stop(grace=1.0)


@pytest.fixture
def service_target(secured_service: ContextService) -> str:
    return f"127.0.0.1:{secured_service.port}"


async def remember(target: str, token: str, org_id: str, agent_id: str, *contents: str) -> list[str]:
    """Writes memories as the agent would (the write side's own client); their ids."""
    async with MemoryClient(target, token=token) as client:
        results = await client.upsert_memories(
            org_id, agent_id, [NewMemory(content=c, category="factual", confidence=0.95) for c in contents]
        )
    return [r.id for r in results]
