"""Export / purge / import round trip of a tenant through the CLI against a real
server, and the Python client's read, export and purge calls."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from ibex_context.models import NewMemory
from ibex_context.server.app import ContextService
from ibex_context_client.memory import MemoryClient, MemoryRequestInvalid
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

from tests.conftest import Tenant

from .test_cli import _cli

# Restored exactly; created_at/updated_at are the restore's own times and the
# injection counters start again (documented in docs/memory-api.md).
RESTORED = ("agent_id", "id", "content", "category", "confidence", "usefulness", "metadata", "occurred_at")


def _memories(count: int, marker: str) -> list[NewMemory]:
    return [
        NewMemory(
            content=f"{marker} fact {i}: the ferry leaves at {7 + i}:15",
            category=("factual", "preference", "episodic")[i % 3],
            confidence=0.6 + i / 50,
            usefulness=0.3 + i / 40,
            metadata={"source": "crm", "rank": i, "tags": ["a", str(i)]},
            occurred_at=1_600_000_000.25 + i * 3600,
        )
        for i in range(count)
    ]


def _read(text: str) -> dict[str, dict[str, Any]]:
    return {row["id"]: row for row in map(json.loads, text.splitlines())}


async def test_export_purge_import_restores_the_tenant(
    shared_service: ContextService, tenant: Tenant, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{shared_service.port}"
    sibling = Tenant(tenant.org_id, str(uuid.uuid4()))
    async with MemoryClient(target) as client:
        await client.upsert_memories(tenant.org_id, tenant.agent_id, _memories(7, "ALPHA"))
        await client.upsert_memories(sibling.org_id, sibling.agent_id, _memories(3, "BETA"))
        await client.upsert_memories(str(uuid.uuid4()), tenant.agent_id, _memories(2, "OTHERORG"))

    code, exported, err = await _cli("export", "--target", target, "--org", tenant.org_id, "--embeddings")
    assert code == 0, err
    assert "exported 10 memories" in err
    before = _read(exported)
    assert len(before) == 10 and all("OTHERORG" not in row["content"] for row in before.values())
    assert {row["agent_id"] for row in before.values()} == {tenant.agent_id, sibling.agent_id}
    assert all(len(row["embedding"]) == 384 for row in before.values())
    dump = tmp_path / "memories.jsonl"
    dump.write_text(exported)

    code, out, err = await _cli("purge", "--target", target, "--org", tenant.org_id)
    assert code != 0 and "--yes" in err  # refuses without --yes
    code, out, err = await _cli("purge", "--target", target, "--org", tenant.org_id, "--yes")
    assert code == 0, err
    assert json.loads(out)["memories_deleted"] == 10
    code, out, err = await _cli("export", "--target", target, "--org", tenant.org_id)
    assert code == 0 and out == ""

    code, out, err = await _cli("import", str(dump), "--target", target)
    assert code == 0, err
    assert "imported 10 memories" in out
    code, exported_again, err = await _cli(
        "export", "--target", target, "--org", tenant.org_id, "--embeddings"
    )
    assert code == 0, err
    after = _read(exported_again)

    assert after.keys() == before.keys()
    for memory_id, row in before.items():
        restored = after[memory_id]
        assert {k: restored[k] for k in RESTORED} == {k: row[k] for k in RESTORED}
        assert restored["embedding"] == pytest.approx(row["embedding"], abs=1e-6)
    assert before[next(iter(before))]["occurred_at"].endswith(".250Z")


async def test_cli_reads_an_agents_memories_and_directive(
    shared_service: ContextService, tenant: Tenant
) -> None:
    target = f"127.0.0.1:{shared_service.port}"
    scope = ["--target", target, "--org", tenant.org_id, "--agent", tenant.agent_id]
    async with MemoryClient(target) as client:
        results = await client.upsert_memories(tenant.org_id, tenant.agent_id, _memories(5, "GAMMA"))
        await client.set_directive(tenant.org_id, tenant.agent_id, "Mention the ferry.")

    code, out, err = await _cli("memories", "list", *scope, "--page-size", "2", "--order", "occurred_asc")
    assert code == 0, err
    assert [json.loads(line)["id"] for line in out.splitlines()] == [r.id for r in results[:2]]
    assert "--page-token" in err
    code, out, err = await _cli("memories", "list", *scope, "--all", "--category", "factual")
    assert code == 0, err
    assert len(out.splitlines()) == 2  # facts 0 and 3
    code, out, err = await _cli("memories", "get", *scope, results[4].id)
    assert code == 0, err
    assert json.loads(out)["content"].startswith("GAMMA fact 4")
    code, out, err = await _cli("memories", "search", *scope, "--top-k", "1", "ferry", "9:15")
    assert code == 0, err
    assert json.loads(out)["content"].startswith("GAMMA fact 2")
    code, out, err = await _cli("directive", "get", *scope)
    assert code == 0, err
    assert json.loads(out) | {"updated_at": None, "version": 1} == {
        "exists": True,
        "content": "Mention the ferry.",
        "version": 1,  # one counter for the deployment: any positive value (checked below)
        "updated_at": None,
    }
    assert json.loads(out)["version"] > 0
    code, out, err = await _cli("memories", "list", *scope, "--page-size", "5000")
    assert code != 0 and "page_size" in err


async def test_client_read_export_and_purge_calls(shared_service: ContextService, tenant: Tenant) -> None:
    async with MemoryClient(f"127.0.0.1:{shared_service.port}") as client:
        results = await client.upsert_memories(tenant.org_id, tenant.agent_id, _memories(6, "DELTA"))
        ids = [r.id for r in results]

        got = await client.get_memories(tenant.org_id, tenant.agent_id, [ids[1]], include_embedding=True)
        assert got[0].metadata == {"source": "crm", "rank": 1, "tags": ["a", "1"]}
        assert got[0].occurred_at == pytest.approx(1_600_003_600.25)
        assert got[0].embedding is not None and len(got[0].embedding) == 384

        page = await client.list_memories(
            tenant.org_id,
            tenant.agent_id,
            order="occurred_desc",
            occurred_after=1_600_000_000 + 2 * 3600,
            page_size=3,
        )
        assert [m.id for m in page.memories] == ids[:1:-1][:3] and page.next_page_token
        rest = await client.list_memories(
            tenant.org_id,
            tenant.agent_id,
            order="occurred_desc",
            occurred_after=1_600_000_000 + 2 * 3600,
            page_size=3,
            page_token=page.next_page_token,
        )
        assert [m.id for m in rest.memories] == [ids[2]] and not rest.next_page_token

        hits = await client.search_memories(tenant.org_id, tenant.agent_id, "ferry 11:15", top_k=2)
        assert hits[0].memory.id == ids[4]
        # Relevance as the assembly computes it: the semantic and lexical halves, 0.5 each.
        assert hits[0].relevance == pytest.approx(0.5 * hits[0].similarity + 0.5 * hits[0].lexical_score)

        assert not (await client.get_directive(tenant.org_id, tenant.agent_id)).exists
        pages = [p async for p in client.export_pages(tenant.org_id, tenant.agent_id, page_size=4)]
        assert [len(p) for p in pages] == [4, 2]

        with pytest.raises(MemoryRequestInvalid) as caught:
            await client.list_memories(tenant.org_id, tenant.agent_id, page_size=0, page_token="bogus")
        assert caught.value.field == "page_token"

        purged = await client.purge_agent(tenant.org_id, tenant.agent_id)
        assert purged.memories_deleted == 6 and purged.calls == 1
        assert await client.get_memories(tenant.org_id, tenant.agent_id, ids) == []


async def test_export_through_the_stub_pages_by_agent_then_id(
    memories: context_pb2_grpc.MemoryServiceStub, tenant: Tenant
) -> None:
    agents = sorted(str(uuid.uuid4()) for _ in range(3))
    for agent in agents:
        await memories.UpsertMemories(
            pb.UpsertMemoriesRequest(
                org_id=tenant.org_id,
                agent_id=agent,
                memories=[pb.MemoryInput(content=f"m{i} of {agent}", category="factual") for i in range(3)],
            )
        )
    seen: list[tuple[str, str]] = []
    token = ""
    for _ in range(10):
        reply = await memories.ExportMemories(
            pb.ExportMemoriesRequest(org_id=tenant.org_id, page_size=4, page_token=token)
        )
        seen += [(m.agent_id, m.id) for m in reply.memories]
        token = reply.next_page_token
        if not token:
            break
    assert len(seen) == 9 and seen == sorted(seen)
    assert [a for a, _ in seen] == [a for a in agents for _ in range(3)]


async def test_import_with_org_refuses_a_line_of_another_org_and_writes_nothing_for_it(
    shared_service: ContextService, tenant: Tenant, tmp_path: Path
) -> None:
    """A file's org_id used to override --org: an import for one org wrote into another."""
    target = f"127.0.0.1:{shared_service.port}"
    other_org = str(uuid.uuid4())
    dump = tmp_path / "mixed.jsonl"
    lines = [
        {"content": "own line without an org", "category": "factual", "agent_id": tenant.agent_id},
        {
            "org_id": tenant.org_id.upper(),  # the same org in another spelling
            "agent_id": tenant.agent_id,
            "content": "own, upper case",
            "category": "factual",
        },
        {"org_id": other_org, "agent_id": tenant.agent_id, "content": "FOREIGN line", "category": "factual"},
    ]
    dump.write_text("".join(json.dumps(line) + "\n" for line in lines))
    code, _, err = await _cli("import", str(dump), "--target", target, "--org", tenant.org_id)
    assert code != 0
    assert "mixed.jsonl:3: org_id is not the --org given" in err and other_org not in err
    async with MemoryClient(target) as client:
        assert [m async for page in client.export_pages(other_org) for m in page] == []
        own = [m async for page in client.export_pages(tenant.org_id) for m in page]
    contents = {m.content for m in own}
    assert "own line without an org" in contents and "FOREIGN line" not in contents
