"""MemoryService at the edge: each method's request in (validated into the memory API's
values, every failure naming its field), the call (``memory_api``: writes, reads, export,
purge) and the answer out (stored rows, pages, reports as protobuf).

What every method does around its work (counted in flight, errors mapped to statuses,
the tenant validated first) is ``server/handling.py``'s; ``server/rpc.py`` parses,
serializes and observes around it. Page sizes, id lists and top-k are bounded so that
no single call can ask a store for an unbounded amount of work.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from ibex_context.errors import InvalidRequest, LimitExceeded
from ibex_context.memory_api.purge import PurgeReport, TenantPurge
from ibex_context.memory_api.reads import ListQuery, MemoryReadApi
from ibex_context.memory_api.writes import MemoryWriteApi
from ibex_context.models import DEFAULT_CONFIDENCE, DEFAULT_USEFULNESS, Category, FloatVector, NewMemory
from ibex_context.server.handling import agent_scoped, handled
from ibex_context.server.lifecycle import InflightCalls
from ibex_context.server.rpc import Method, service_methods
from ibex_context.server.validation import Limits, preview, uuid_field
from ibex_context.stores.base import ListOrder, MemoryFilter, StoredRow

MAX_GET_IDS = 1000
MAX_PAGE_SIZE = 1000
DEFAULT_LIST_PAGE_SIZE = 100
DEFAULT_EXPORT_PAGE_SIZE = 500
MAX_TOP_K = 200
DEFAULT_TOP_K = 10
MAX_QUERY_CHARS = 8192
# Categories a list may filter by: more than there are is only repeats (a bound, not a
# setting: the categories are the proto's).
MAX_LIST_CATEGORIES = 32

_ORDERS = {
    pb.MEMORY_ORDER_UNSPECIFIED: ListOrder.CREATED_DESC,
    pb.MEMORY_ORDER_CREATED_DESC: ListOrder.CREATED_DESC,
    pb.MEMORY_ORDER_CREATED_ASC: ListOrder.CREATED_ASC,
    pb.MEMORY_ORDER_OCCURRED_DESC: ListOrder.OCCURRED_DESC,
    pb.MEMORY_ORDER_OCCURRED_ASC: ListOrder.OCCURRED_ASC,
}
_MAX_METADATA_BYTES = 16 * 1024
# A writer's clock may run a little ahead of ours; a day more is a wrong date, which
# would keep a memory "brand new" in every recency computation until it arrives.
OCCURRED_AT_FUTURE_TOLERANCE_S = 86_400.0
_FEEDBACK = {
    pb.FEEDBACK_POSITIVE: "positive",
    pb.FEEDBACK_NEGATIVE: "negative",
    pb.FEEDBACK_NEUTRAL: "neutral",
}
_OUTCOMES = {"created": pb.UPSERT_OUTCOME_CREATED, "updated": pb.UPSERT_OUTCOME_UPDATED}
# Rows converted between two yields to the event loop: a 1000-row page converted in
# one go would hold the loop for milliseconds that assemblies on it are waiting for.
CONVERT_CHUNK = 100


class MemoryServiceHandler:
    def __init__(
        self,
        *,
        writes: MemoryWriteApi,
        reads: MemoryReadApi,
        purge: TenantPurge,
        limits: Limits,
        inflight: InflightCalls,
        limit_refused: Callable[[str], None] = lambda _limit: None,
    ) -> None:
        self._writes = writes
        self._reads = reads
        self._purge = purge
        self._limits = limits
        self._inflight = inflight
        self._limit_refused = limit_refused

    def methods(self) -> list[Method]:
        """Every method of MemoryService in the proto (this class has them all)."""
        return service_methods(pb.DESCRIPTOR.services_by_name["MemoryService"], pb, self)

    @agent_scoped
    async def UpsertMemories(
        self, message: pb.UpsertMemoriesRequest, org_id: str, agent_id: str
    ) -> pb.UpsertMemoriesResponse:
        memories = new_memories(message.memories, self._limits)
        results = await self._writes.upsert(org_id, agent_id, memories)
        return pb.UpsertMemoriesResponse(
            results=[
                pb.UpsertResult(id=r.id, outcome=_OUTCOMES.get(r.outcome, pb.UPSERT_OUTCOME_UNCHANGED))
                for r in results
            ]
        )

    @agent_scoped
    async def DeleteMemories(
        self, message: pb.DeleteMemoriesRequest, org_id: str, agent_id: str
    ) -> pb.DeleteMemoriesResponse:
        ids = delete_ids(message.ids, self._limits)
        deleted = await self._writes.delete(org_id, agent_id, ids)
        return pb.DeleteMemoriesResponse(deleted=deleted)

    @agent_scoped
    async def SetDirective(
        self, message: pb.SetDirectiveRequest, org_id: str, agent_id: str
    ) -> pb.SetDirectiveResponse:
        content = directive_content(message.content, self._limits)
        version = await self._writes.set_directive(org_id, agent_id, content)
        return pb.SetDirectiveResponse(version=version)

    @agent_scoped
    async def ClearDirective(
        self, message: pb.ClearDirectiveRequest, org_id: str, agent_id: str
    ) -> pb.ClearDirectiveResponse:
        cleared = await self._writes.clear_directive(org_id, agent_id)
        return pb.ClearDirectiveResponse(cleared=cleared)

    @agent_scoped
    async def RecordFeedback(
        self, message: pb.RecordFeedbackRequest, org_id: str, agent_id: str
    ) -> pb.RecordFeedbackResponse:
        session_id = uuid_field(message.session_id, "session_id", required=False) or None
        items = feedback(message.feedback, self._limits)
        updates = await self._writes.record_feedback(org_id, agent_id, session_id, items)
        return pb.RecordFeedbackResponse(
            updates=[
                pb.MemoryScoreUpdate(
                    memory_id=u.memory_id,
                    previous_usefulness=u.previous_usefulness,
                    new_usefulness=u.new_usefulness,
                )
                for u in updates
            ]
        )

    @agent_scoped
    async def GetMemories(
        self, message: pb.GetMemoriesRequest, org_id: str, agent_id: str
    ) -> pb.GetMemoriesResponse:
        ids = get_ids(message.ids)
        rows = await self._reads.get(org_id, agent_id, ids, with_embedding=message.include_embedding)
        return pb.GetMemoriesResponse(memories=[stored_memory(r) for r in rows])

    @agent_scoped
    async def ListMemories(
        self, message: pb.ListMemoriesRequest, org_id: str, agent_id: str
    ) -> pb.ListMemoriesResponse:
        page = await self._reads.list_page(org_id, agent_id, list_query(message))
        return pb.ListMemoriesResponse(memories=await _converted(page.rows), next_page_token=page.next_token)

    @agent_scoped
    async def SearchMemories(
        self, message: pb.SearchMemoriesRequest, org_id: str, agent_id: str
    ) -> pb.SearchMemoriesResponse:
        query, vector, top_k = search_query(message, self._limits.embedding_dim)
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
        org_id = uuid_field(message.org_id, "org_id")
        agent_id = optional_agent(message.agent_id)
        size = page_size(message.page_size, DEFAULT_EXPORT_PAGE_SIZE)
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
        org_id = uuid_field(message.org_id, "org_id")
        report = await self._purge.purge_org(org_id)
        return pb.PurgeOrgResponse(**_purge_fields(report))


# --- the requests in ----------------------------------------------------------------


def new_memories(inputs: Sequence[pb.MemoryInput], limits: Limits) -> list[NewMemory]:
    if not inputs:
        raise InvalidRequest("memories", "is empty; send at least one memory")
    if len(inputs) > limits.max_upsert_batch:
        raise InvalidRequest(
            "memories", f"has {len(inputs)} items; at most {limits.max_upsert_batch} per call"
        )
    result = []
    for i, item in enumerate(inputs):
        path = f"memories[{i}]"
        content = item.content
        if not content.strip():
            raise InvalidRequest(f"{path}.content", "is empty")
        if len(content) > limits.max_memory_chars:
            raise InvalidRequest(
                f"{path}.content", f"has {len(content)} characters; at most {limits.max_memory_chars}"
            )
        category = item.category.strip().lower()
        if category not in {c.value for c in Category}:
            raise InvalidRequest(
                f"{path}.category",
                f"unknown category {preview(item.category)}; expected one of {[c.value for c in Category]}",
            )
        confidence = (
            _unit(item.confidence, f"{path}.confidence")
            if item.HasField("confidence")
            else DEFAULT_CONFIDENCE
        )
        usefulness = (
            _unit(item.usefulness, f"{path}.usefulness")
            if item.HasField("usefulness")
            else DEFAULT_USEFULNESS
        )
        memory_id = uuid_field(item.id, f"{path}.id", required=False) or None
        metadata = _metadata(item, f"{path}.metadata")
        occurred_at = _occurred_at(item, f"{path}.occurred_at") if item.HasField("occurred_at") else None
        embedding = None
        if len(item.embedding):
            vector = np.asarray(item.embedding, dtype=np.float32)
            if vector.shape[0] != limits.embedding_dim:
                raise InvalidRequest(
                    f"{path}.embedding",
                    f"has {vector.shape[0]} dimensions; the service is configured for {limits.embedding_dim}",
                )
            norm = float(np.linalg.norm(vector))
            if not math.isfinite(norm) or norm == 0.0:
                raise InvalidRequest(f"{path}.embedding", "must be finite and non-zero")
            embedding = vector / norm
        result.append(
            NewMemory(
                content=content,
                category=category,
                confidence=confidence,
                usefulness=usefulness,
                id=memory_id,
                metadata=metadata,
                embedding=embedding,
                occurred_at=occurred_at,
            )
        )
    return result


def memory_ids(ids: Sequence[str], field: str = "ids") -> list[str]:
    if not ids:
        raise InvalidRequest(field, "is empty")
    return [uuid_field(v, f"{field}[{i}]") for i, v in enumerate(ids)]


def delete_ids(ids: Sequence[str], limits: Limits) -> list[str]:
    """DeleteMemories' ids: counted before any is parsed."""
    if len(ids) > limits.max_delete_ids:
        raise LimitExceeded(
            "max_delete_ids", f"ids has {len(ids)} ids; at most {limits.max_delete_ids} per call"
        )
    return memory_ids(ids)


def directive_content(content: str, limits: Limits) -> str:
    if not content.strip():
        raise InvalidRequest("content", "is empty; use ClearDirective to remove a directive")
    if len(content) > limits.max_directive_chars:
        raise InvalidRequest(
            "content", f"has {len(content)} characters; at most {limits.max_directive_chars}"
        )
    return content


def feedback(items: Sequence[pb.MemoryFeedback], limits: Limits) -> list[tuple[str, str]]:
    if not items:
        raise InvalidRequest("feedback", "is empty")
    if len(items) > limits.max_feedback_items:
        raise LimitExceeded(
            "max_feedback_items",
            f"feedback has {len(items)} items; at most {limits.max_feedback_items} per call",
        )
    result = []
    for i, item in enumerate(items):
        memory_id = uuid_field(item.memory_id, f"feedback[{i}].memory_id")
        kind = _FEEDBACK.get(item.feedback)
        if kind is None:
            raise InvalidRequest(f"feedback[{i}].feedback", "must be POSITIVE, NEGATIVE or NEUTRAL")
        result.append((memory_id, kind))
    return result


def _occurred_at(item: pb.MemoryInput, field: str) -> float:
    stamp = item.occurred_at
    if not 0 <= stamp.nanos < 1_000_000_000:
        raise InvalidRequest(field, "has nanos outside 0..999999999")
    seconds = stamp.seconds + stamp.nanos / 1e9
    if seconds < 0:
        raise InvalidRequest(field, "is before 1970-01-01T00:00:00Z")
    if seconds > time.time() + OCCURRED_AT_FUTURE_TOLERANCE_S:
        raise InvalidRequest(field, "is more than one day in the future")
    return seconds


def _unit(value: float, field: str) -> float:
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise InvalidRequest(field, f"must be between 0 and 1, got {value}")
    return float(value)


def _metadata(item: pb.MemoryInput, field: str) -> Mapping[str, Any]:
    if not item.HasField("metadata"):
        return {}
    if item.metadata.ByteSize() > _MAX_METADATA_BYTES:
        raise InvalidRequest(field, f"is larger than {_MAX_METADATA_BYTES} bytes")
    value = json_format.MessageToDict(item.metadata)
    assert isinstance(value, dict)
    return value


def page_size(value: int, default: int, field: str = "page_size") -> int:
    if value == 0:
        return default
    if not 1 <= value <= MAX_PAGE_SIZE:
        raise InvalidRequest(field, f"must be between 1 and {MAX_PAGE_SIZE} (0 for {default}), got {value}")
    return value


def get_ids(ids: Sequence[str]) -> list[str]:
    if len(ids) > MAX_GET_IDS:
        raise InvalidRequest("ids", f"has {len(ids)} ids; at most {MAX_GET_IDS} per call")
    return memory_ids(ids)


def _time(message: pb.ListMemoriesRequest, field: str) -> datetime | None:
    if not message.HasField(field):
        return None
    stamp: Timestamp = getattr(message, field)
    if not 0 <= stamp.nanos < 1_000_000_000:
        raise InvalidRequest(field, "has nanos outside 0..999999999")
    if not 0 <= stamp.seconds <= 253_402_300_799:  # 1970 .. 9999-12-31
        raise InvalidRequest(field, "must lie between 1970 and 9999")
    return datetime.fromtimestamp(stamp.seconds, tz=UTC).replace(microsecond=stamp.nanos // 1000)


def list_query(message: pb.ListMemoriesRequest) -> ListQuery:
    if len(message.categories) > MAX_LIST_CATEGORIES:
        raise LimitExceeded(
            "max_list_categories",
            f"categories has {len(message.categories)} entries; at most {MAX_LIST_CATEGORIES} per call",
        )
    categories = []
    known = {c.value for c in Category}
    for i, category in enumerate(message.categories):
        name = category.strip().lower()
        if name not in known:
            raise InvalidRequest(f"categories[{i}]", f"unknown category; expected one of {sorted(known)}")
        categories.append(name)
    order = _ORDERS.get(message.order)
    if order is None:
        raise InvalidRequest("order", f"unknown order {message.order}")
    filters = MemoryFilter(
        categories=tuple(dict.fromkeys(categories)),
        created_after=_time(message, "created_after"),
        created_before=_time(message, "created_before"),
        occurred_after=_time(message, "occurred_after"),
        occurred_before=_time(message, "occurred_before"),
    )
    return ListQuery(
        order=order,
        filters=filters,
        page_size=page_size(message.page_size, DEFAULT_LIST_PAGE_SIZE),
        page_token=message.page_token,
        with_embedding=message.include_embedding,
    )


def search_query(
    message: pb.SearchMemoriesRequest, embedding_dim: int
) -> tuple[str, FloatVector | None, int]:
    """(query text, query vector or None to embed the text, top k)."""
    has_text, has_vector = bool(message.query.strip()), len(message.query_embedding) > 0
    if has_text == has_vector:
        raise InvalidRequest("query", "give exactly one of query (text) and query_embedding")
    if len(message.query) > MAX_QUERY_CHARS:
        raise InvalidRequest("query", f"has {len(message.query)} characters; at most {MAX_QUERY_CHARS}")
    vector = None
    if has_vector:
        vector = np.asarray(message.query_embedding, dtype=np.float32)
        if vector.shape[0] != embedding_dim:
            raise InvalidRequest(
                "query_embedding",
                f"has {vector.shape[0]} dimensions; the service is configured for {embedding_dim}",
            )
        norm = float(np.linalg.norm(vector))
        if not math.isfinite(norm) or norm == 0.0:
            raise InvalidRequest("query_embedding", "must be finite and non-zero")
        vector = vector / norm
    top_k = message.top_k or DEFAULT_TOP_K
    if not 1 <= top_k <= MAX_TOP_K:
        raise InvalidRequest(
            "top_k", f"must be between 1 and {MAX_TOP_K} (0 for {DEFAULT_TOP_K}), got {top_k}"
        )
    return message.query, vector, top_k


def optional_agent(agent_id: str) -> str | None:
    return uuid_field(agent_id, "agent_id", required=False) or None


# --- the answers out ----------------------------------------------------------------


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
