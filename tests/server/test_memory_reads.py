"""The memory API's read side over real gRPC against the session's real stores:
get, list (paging, filters, order), search, directive, and cross-tenant attempts."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.proto.ibex.context.v1 import context_pb2_grpc

from tests.conftest import Tenant

Stub = context_pb2_grpc.MemoryServiceStub
# 2024-01-01T00:00:00Z plus i days for memory i.
BASE = 1_704_067_200


def _at(seconds: int) -> Timestamp:
    return Timestamp(seconds=seconds)


async def _seed(stub: Stub, tenant: Tenant, count: int, marker: str = "") -> list[str]:
    categories = ["factual", "preference", "episodic"]
    reply = await stub.UpsertMemories(
        pb.UpsertMemoriesRequest(
            org_id=tenant.org_id,
            agent_id=tenant.agent_id,
            memories=[
                pb.MemoryInput(
                    content=f"note {i} about topic{i} {marker}",
                    category=categories[i % 3],
                    confidence=0.5 + i / 100,
                    occurred_at=_at(BASE + i * 86_400),
                )
                for i in range(count)
            ],
        )
    )
    return [r.id for r in reply.results]


async def _invalid(call: object) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return str(caught.value.details())


async def test_get_returns_the_agents_memories_in_the_order_asked(memories: Stub, tenant: Tenant) -> None:
    ids = await _seed(memories, tenant, 3, "GETME")
    unknown = str(uuid.uuid4())

    reply = await memories.GetMemories(
        pb.GetMemoriesRequest(
            org_id=tenant.org_id,
            agent_id=tenant.agent_id,
            ids=[ids[2], unknown, ids[0]],
            include_embedding=True,
        )
    )

    assert [m.id for m in reply.memories] == [ids[2], ids[0]]
    first = reply.memories[0]
    assert first.content == "note 2 about topic2 GETME" and first.category == "episodic"
    assert first.agent_id == tenant.agent_id
    assert first.confidence == pytest.approx(0.52)
    assert first.occurred_at.seconds == BASE + 2 * 86_400
    assert first.created_at.seconds > BASE and first.updated_at.seconds >= first.created_at.seconds
    assert len(first.embedding) == 384
    plain = await memories.GetMemories(
        pb.GetMemoriesRequest(org_id=tenant.org_id, agent_id=tenant.agent_id, ids=[ids[0]])
    )
    assert len(plain.memories[0].embedding) == 0


async def test_list_pages_through_every_memory_once_in_order(memories: Stub, tenant: Tenant) -> None:
    ids = await _seed(memories, tenant, 25)
    seen: list[pb.StoredMemory] = []
    token = ""
    pages = 0
    while True:
        reply = await memories.ListMemories(
            pb.ListMemoriesRequest(
                org_id=tenant.org_id,
                agent_id=tenant.agent_id,
                page_size=10,
                page_token=token,
                order=pb.MEMORY_ORDER_OCCURRED_ASC,
            )
        )
        pages += 1
        seen += reply.memories
        token = reply.next_page_token
        if not token:
            break
        assert pages < 10

    assert pages == 3
    assert [m.id for m in seen] == ids  # seeded in occurred order
    descending = await memories.ListMemories(
        pb.ListMemoriesRequest(
            org_id=tenant.org_id, agent_id=tenant.agent_id, page_size=5, order=pb.MEMORY_ORDER_OCCURRED_DESC
        )
    )
    assert [m.id for m in descending.memories] == ids[::-1][:5]


async def test_list_created_order_stays_stable_while_memories_are_written(
    memories: Stub, tenant: Tenant
) -> None:
    ids = await _seed(memories, tenant, 6)
    first = await memories.ListMemories(
        pb.ListMemoriesRequest(
            org_id=tenant.org_id, agent_id=tenant.agent_id, page_size=3, order=pb.MEMORY_ORDER_CREATED_ASC
        )
    )
    # Written between two pages: sorts after everything (newer), must not shift page 2.
    await memories.UpsertMemories(
        pb.UpsertMemoriesRequest(
            org_id=tenant.org_id,
            agent_id=tenant.agent_id,
            memories=[pb.MemoryInput(content="written between pages", category="factual")],
        )
    )
    second = await memories.ListMemories(
        pb.ListMemoriesRequest(
            org_id=tenant.org_id,
            agent_id=tenant.agent_id,
            page_size=3,
            page_token=first.next_page_token,
            order=pb.MEMORY_ORDER_CREATED_ASC,
        )
    )
    listed = [m.id for m in first.memories] + [m.id for m in second.memories]
    assert len(set(listed)) == 6 and set(listed) == set(ids)


async def test_list_filters_by_category_and_occurred_range(memories: Stub, tenant: Tenant) -> None:
    ids = await _seed(memories, tenant, 12)

    reply = await memories.ListMemories(
        pb.ListMemoriesRequest(
            org_id=tenant.org_id,
            agent_id=tenant.agent_id,
            categories=["preference"],
            occurred_after=_at(BASE + 2 * 86_400),
            occurred_before=_at(BASE + 10 * 86_400),
            order=pb.MEMORY_ORDER_OCCURRED_ASC,
        )
    )

    # preference = i % 3 == 1, within days [2, 10): 4 and 7.
    assert [m.id for m in reply.memories] == [ids[4], ids[7]]
    assert not reply.next_page_token
    now = int(datetime.now(UTC).timestamp())
    none_created_later = await memories.ListMemories(
        pb.ListMemoriesRequest(org_id=tenant.org_id, agent_id=tenant.agent_id, created_after=_at(now + 3600))
    )
    assert len(none_created_later.memories) == 0


async def test_another_orgs_ids_cursors_and_filters_return_nothing_of_it(
    memories: Stub, tenant: Tenant
) -> None:
    ids = await _seed(memories, tenant, 4, "SECRETMARK")
    await memories.SetDirective(
        pb.SetDirectiveRequest(org_id=tenant.org_id, agent_id=tenant.agent_id, content="secret directive")
    )
    page = await memories.ListMemories(
        pb.ListMemoriesRequest(org_id=tenant.org_id, agent_id=tenant.agent_id, page_size=2)
    )
    # The same agent id in another org, and another agent of the same org.
    for other in (Tenant(str(uuid.uuid4()), tenant.agent_id), Tenant(tenant.org_id, str(uuid.uuid4()))):
        got = await memories.GetMemories(
            pb.GetMemoriesRequest(org_id=other.org_id, agent_id=other.agent_id, ids=ids)
        )
        assert len(got.memories) == 0
        listed = await memories.ListMemories(
            pb.ListMemoriesRequest(org_id=other.org_id, agent_id=other.agent_id, categories=["factual"])
        )
        assert len(listed.memories) == 0
        found = await memories.SearchMemories(
            pb.SearchMemoriesRequest(org_id=other.org_id, agent_id=other.agent_id, query="SECRETMARK note")
        )
        assert len(found.hits) == 0
        directive = await memories.GetDirective(
            pb.GetDirectiveRequest(org_id=other.org_id, agent_id=other.agent_id)
        )
        assert not directive.exists and directive.content == "" and directive.version == 0
        exported = await memories.ExportMemories(
            pb.ExportMemoriesRequest(org_id=other.org_id, agent_id=other.agent_id)
        )
        assert len(exported.memories) == 0
        message = await _invalid(
            memories.ListMemories(
                pb.ListMemoriesRequest(
                    org_id=other.org_id, agent_id=other.agent_id, page_size=2, page_token=page.next_page_token
                )
            )
        )
        assert message.startswith("page_token:")
    foreign_org = await memories.ExportMemories(pb.ExportMemoriesRequest(org_id=str(uuid.uuid4())))
    assert len(foreign_org.memories) == 0


async def test_a_page_token_is_refused_with_other_filters(memories: Stub, tenant: Tenant) -> None:
    await _seed(memories, tenant, 3)
    page = await memories.ListMemories(
        pb.ListMemoriesRequest(org_id=tenant.org_id, agent_id=tenant.agent_id, page_size=1)
    )
    message = await _invalid(
        memories.ListMemories(
            pb.ListMemoriesRequest(
                org_id=tenant.org_id,
                agent_id=tenant.agent_id,
                page_size=1,
                page_token=page.next_page_token,
                categories=["factual"],
            )
        )
    )
    assert message.startswith("page_token:")
    garbage = await _invalid(
        memories.ListMemories(
            pb.ListMemoriesRequest(org_id=tenant.org_id, agent_id=tenant.agent_id, page_token="not-a-token")
        )
    )
    assert garbage.startswith("page_token:")


async def test_search_returns_what_retrieval_sees_with_its_components(memories: Stub, tenant: Tenant) -> None:
    ids = await _seed(memories, tenant, 8)

    reply = await memories.SearchMemories(
        pb.SearchMemoriesRequest(org_id=tenant.org_id, agent_id=tenant.agent_id, query="topic5", top_k=3)
    )

    assert len(reply.hits) == 3
    best = reply.hits[0]
    assert best.memory.id == ids[5] and best.memory.content == "note 5 about topic5 "
    # Hybrid, as the assembly retrieves: only memory 5 holds the word "topic5".
    assert best.lexical_score > 0 and all(h.lexical_score == 0.0 for h in reply.hits[1:])
    for hit in reply.hits:  # relevance = the semantic and lexical halves, 0.5 each
        assert hit.relevance == pytest.approx(0.5 * hit.similarity + 0.5 * hit.lexical_score)
    relevances = [h.relevance for h in reply.hits]
    assert relevances == sorted(relevances, reverse=True)
    by_vector = await memories.GetMemories(
        pb.GetMemoriesRequest(
            org_id=tenant.org_id, agent_id=tenant.agent_id, ids=[ids[5]], include_embedding=True
        )
    )
    same = await memories.SearchMemories(
        pb.SearchMemoriesRequest(
            org_id=tenant.org_id,
            agent_id=tenant.agent_id,
            query_embedding=by_vector.memories[0].embedding,
            top_k=1,
        )
    )
    assert same.hits[0].memory.id == ids[5]
    assert same.hits[0].similarity == pytest.approx(1.0, abs=1e-4)


async def test_get_directive_returns_content_and_version(memories: Stub, tenant: Tenant) -> None:
    scope = {"org_id": tenant.org_id, "agent_id": tenant.agent_id}
    never = await memories.GetDirective(pb.GetDirectiveRequest(**scope))
    assert not never.exists and never.version == 0 and not never.HasField("updated_at")

    first = await memories.SetDirective(pb.SetDirectiveRequest(**scope, content="Be brief."))
    second = await memories.SetDirective(pb.SetDirectiveRequest(**scope, content="Be very brief."))
    assert second.version > first.version > 0
    current = await memories.GetDirective(pb.GetDirectiveRequest(**scope))
    assert current.exists and current.content == "Be very brief." and current.version == second.version
    assert current.updated_at.seconds > BASE

    await memories.ClearDirective(pb.ClearDirectiveRequest(**scope))
    cleared = await memories.GetDirective(pb.GetDirectiveRequest(**scope))
    assert not cleared.exists and cleared.content == "" and cleared.version > second.version


_ANY = str(uuid.uuid4())


def _bad_requests(org: str, agent: str) -> list[tuple[str, object, str]]:
    """(method, request, the field the error must name) for every kind of bad input."""
    scope = {"org_id": org, "agent_id": agent}
    return [
        ("GetMemories", pb.GetMemoriesRequest(agent_id=agent, ids=[_ANY]), "org_id"),
        ("GetMemories", pb.GetMemoriesRequest(org_id=org, agent_id="nope", ids=[_ANY]), "agent_id"),
        ("GetMemories", pb.GetMemoriesRequest(**scope), "ids"),
        ("GetMemories", pb.GetMemoriesRequest(**scope, ids=["not-a-uuid"]), "ids[0]"),
        ("GetMemories", pb.GetMemoriesRequest(**scope, ids=[_ANY] * 1001), "ids"),
        ("ListMemories", pb.ListMemoriesRequest(**scope, page_size=1001), "page_size"),
        ("ListMemories", pb.ListMemoriesRequest(**scope, page_size=-1), "page_size"),
        ("ListMemories", pb.ListMemoriesRequest(**scope, categories=["factual", "gossip"]), "categories[1]"),
        ("ListMemories", pb.ListMemoriesRequest(**scope, order=99), "order"),  # type: ignore[arg-type]
        (
            "ListMemories",
            pb.ListMemoriesRequest(**scope, created_after=Timestamp(seconds=-5)),
            "created_after",
        ),
        ("SearchMemories", pb.SearchMemoriesRequest(**scope), "query"),
        (
            "SearchMemories",
            pb.SearchMemoriesRequest(**scope, query="a", query_embedding=[1.0] * 384),
            "query",
        ),
        ("SearchMemories", pb.SearchMemoriesRequest(**scope, query_embedding=[1.0] * 3), "query_embedding"),
        ("SearchMemories", pb.SearchMemoriesRequest(**scope, query_embedding=[0.0] * 384), "query_embedding"),
        ("SearchMemories", pb.SearchMemoriesRequest(**scope, query="a", top_k=201), "top_k"),
        ("ExportMemories", pb.ExportMemoriesRequest(org_id=org, page_size=5000), "page_size"),
        ("ExportMemories", pb.ExportMemoriesRequest(org_id=org, agent_id="nope"), "agent_id"),
        ("ExportMemories", pb.ExportMemoriesRequest(org_id=org, page_token="zz"), "page_token"),
        ("ExportMemories", pb.ExportMemoriesRequest(), "org_id"),
        ("PurgeAgent", pb.PurgeAgentRequest(org_id=org, agent_id="nope"), "agent_id"),
        ("PurgeOrg", pb.PurgeOrgRequest(org_id="nope"), "org_id"),
    ]


async def test_bad_input_is_invalid_argument_naming_the_field(memories: Stub, tenant: Tenant) -> None:
    for method, message, field in _bad_requests(tenant.org_id, tenant.agent_id):
        text = await _invalid(getattr(memories, method)(message))
        assert text.split(":")[0] == field, (method, text)
