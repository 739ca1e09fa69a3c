"""MemoryService: the write handlers of ``server.handlers`` plus the read side,
export and purge (issue 16). A subclass, so the write side's module stays as it is."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from ibex_context.memory_api.purge import PurgeReport, TenantPurge
from ibex_context.memory_api.reads import MemoryReads
from ibex_context.memory_api.writes import MemoryWrites
from ibex_context.server import read_validation, validation
from ibex_context.server.handlers import MemoryHandler
from ibex_context.server.handling import agent_scoped, handled
from ibex_context.server.lifecycle import InflightCalls
from ibex_context.stores.base import StoredRow


def _stamp(target: Any, value: datetime) -> None:
    target.FromDatetime(value)


def _stamp_micros(target: Any, micros: int) -> None:
    seconds, rest = divmod(micros, 1_000_000)
    target.seconds = seconds
    target.nanos = rest * 1000


def stored_memory(row: StoredRow) -> pb.StoredMemory:
    message = pb.StoredMemory(
        id=row.id,
        agent_id=row.agent_id,
        content=row.content,
        category=row.category,
        confidence=row.confidence,
        usefulness=row.usefulness,
        retrieval_count=row.retrieval_count,
    )
    if row.metadata:
        message.metadata.update(row.metadata)
    _stamp_micros(message.occurred_at, row.occurred_at)
    _stamp_micros(message.created_at, row.created_at)
    _stamp_micros(message.updated_at, row.updated_at)
    if row.last_injected_at is not None:
        _stamp_micros(message.last_injected_at, row.last_injected_at)
    if row.embedding is not None:
        message.embedding.extend(row.embedding.tolist())
    return message


# Rows converted between two yields to the event loop: a 1000-row page converted in
# one go would hold the loop for milliseconds that assemblies on it are waiting for.
CONVERT_CHUNK = 100


async def _converted(rows: Sequence[StoredRow]) -> list[pb.StoredMemory]:
    messages: list[pb.StoredMemory] = []
    for start in range(0, len(rows), CONVERT_CHUNK):
        if start:
            await asyncio.sleep(0)
        messages.extend(stored_memory(r) for r in rows[start : start + CONVERT_CHUNK])
    return messages


def _purge_fields(report: PurgeReport) -> dict[str, Any]:
    return {
        "memories_deleted": report.memories_deleted,
        "directives_deleted": report.directives_deleted,
        "agents_purged": report.agents_purged,
        "cache_keys_deleted": report.cache_keys_deleted,
        "complete": report.complete,
    }


class MemoryServiceHandler(MemoryHandler):
    def __init__(
        self,
        *,
        writes: MemoryWrites,
        reads: MemoryReads,
        purge: TenantPurge,
        limits: validation.Limits,
        inflight: InflightCalls,
        limit_refused: Callable[[str], None] = lambda _limit: None,
    ) -> None:
        super().__init__(writes=writes, limits=limits, inflight=inflight, limit_refused=limit_refused)
        self._reads = reads
        self._purge = purge

    @agent_scoped
    async def GetMemories(
        self, message: pb.GetMemoriesRequest, org_id: str, agent_id: str
    ) -> pb.GetMemoriesResponse:
        ids = read_validation.get_ids(message.ids)
        rows = await self._reads.get(org_id, agent_id, ids, with_embedding=message.include_embedding)
        return pb.GetMemoriesResponse(memories=[stored_memory(r) for r in rows])

    @agent_scoped
    async def ListMemories(
        self, message: pb.ListMemoriesRequest, org_id: str, agent_id: str
    ) -> pb.ListMemoriesResponse:
        page = await self._reads.list_page(org_id, agent_id, read_validation.list_query(message))
        return pb.ListMemoriesResponse(memories=await _converted(page.rows), next_page_token=page.next_token)

    @agent_scoped
    async def SearchMemories(
        self, message: pb.SearchMemoriesRequest, org_id: str, agent_id: str
    ) -> pb.SearchMemoriesResponse:
        query, vector, top_k = read_validation.search_query(message, self._limits.embedding_dim)
        results = await self._reads.search(org_id, agent_id, query, vector, top_k)
        return pb.SearchMemoriesResponse(
            hits=[
                pb.SearchHit(
                    memory=stored_memory(r.memory),
                    similarity=r.hit.similarity,
                    lexical_score=r.hit.lexical_score or 0.0,
                    relevance=r.hit.relevance,
                )
                for r in results
            ]
        )

    @agent_scoped
    async def GetDirective(
        self, message: pb.GetDirectiveRequest, org_id: str, agent_id: str
    ) -> pb.GetDirectiveResponse:
        row = await self._reads.directive(org_id, agent_id)
        reply = pb.GetDirectiveResponse(
            exists=row.content is not None, content=row.content or "", version=row.version
        )
        if row.updated_at is not None:
            _stamp(reply.updated_at, row.updated_at)
        return reply

    @handled
    async def ExportMemories(self, message: pb.ExportMemoriesRequest) -> pb.ExportMemoriesResponse:
        org_id = validation.uuid_field(message.org_id, "org_id")
        agent_id = read_validation.optional_agent(message.agent_id)
        size = read_validation.page_size(message.page_size, read_validation.DEFAULT_EXPORT_PAGE_SIZE)
        page = await self._reads.export(
            org_id,
            agent_id,
            page_size=size,
            page_token=message.page_token,
            with_embedding=message.include_embedding,
        )
        return pb.ExportMemoriesResponse(
            memories=await _converted(page.rows), next_page_token=page.next_token
        )

    @agent_scoped
    async def PurgeAgent(
        self, message: pb.PurgeAgentRequest, org_id: str, agent_id: str
    ) -> pb.PurgeAgentResponse:
        report = await self._purge.purge_agent(org_id, agent_id)
        return pb.PurgeAgentResponse(**_purge_fields(report))

    @handled
    async def PurgeOrg(self, message: pb.PurgeOrgRequest) -> pb.PurgeOrgResponse:
        org_id = validation.uuid_field(message.org_id, "org_id")
        report = await self._purge.purge_org(org_id)
        return pb.PurgeOrgResponse(**_purge_fields(report))
