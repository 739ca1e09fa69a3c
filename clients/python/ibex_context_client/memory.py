"""The write-side client (memories, directives, feedback), used by the CLI and by integrators.

Unlike ``ContextClient`` it raises: a write that did not happen must not look like
one that did. Every failure is a ``MemoryClientError``; a rejected request is the
``MemoryRequestInvalid`` subclass, naming the field the service named.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import grpc

from ibex_context_client.channels import ChannelClient
from ibex_context_client.context import classify_failure
from ibex_context_client.credentials import ClientCredentials
from ibex_context_client.errors import ClientError
from ibex_context_client.memory_views import (
    ORDERS,
    DirectiveView,
    MemoryPage,
    PurgeResult,
    SearchHit,
    StoredMemory,
    timestamp,
)
from ibex_context_client.messages import NewMemory
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb
from ibex_context_client.target import Target

__all__ = [
    "DirectiveView",
    "FeedbackKind",
    "MemoryClient",
    "MemoryClientError",
    "MemoryPage",
    "MemoryRequestInvalid",
    "PurgeResult",
    "ScoreUpdate",
    "SearchHit",
    "StoredMemory",
    "UpsertResult",
]

_SERVICE = "/ibex.context.v1.MemoryService/"
DEFAULT_WRITE_TIMEOUT_SECONDS = 30.0


class MemoryClientError(ClientError):
    """A write-side call failed. ``status`` is the gRPC status when the service answered."""

    def __init__(
        self, method: str, reason: str, detail: str = "", status: grpc.StatusCode | None = None
    ) -> None:
        super().__init__(f"{method} failed: {reason}" + (f" ({detail})" if detail else ""))
        self.method = method
        self.reason = reason
        self.detail = detail
        self.status = status


class MemoryRequestInvalid(MemoryClientError):
    """The service rejected the request (INVALID_ARGUMENT or RESOURCE_EXHAUSTED); nothing was written."""

    @property
    def field(self) -> str:
        """The field the service named (its messages read ``field: problem``)."""
        return self.detail.partition(":")[0].strip()


class FeedbackKind(enum.StrEnum):
    POSITIVE = "positive"
    NEGATIVE = "negative"
    NEUTRAL = "neutral"


_FEEDBACK_WIRE = {
    FeedbackKind.POSITIVE: pb.FEEDBACK_POSITIVE,
    FeedbackKind.NEGATIVE: pb.FEEDBACK_NEGATIVE,
    FeedbackKind.NEUTRAL: pb.FEEDBACK_NEUTRAL,
}
_UPSERT_OUTCOMES = {
    pb.UPSERT_OUTCOME_CREATED: "created",
    pb.UPSERT_OUTCOME_UPDATED: "updated",
    pb.UPSERT_OUTCOME_UNCHANGED: "unchanged",
}


@dataclass(frozen=True, slots=True)
class UpsertResult:
    id: str
    outcome: str  # "created", "updated" or "unchanged"


@dataclass(frozen=True, slots=True)
class ScoreUpdate:
    memory_id: str
    previous_usefulness: float
    new_usefulness: float


_MEMORY_INDEX = re.compile(r"memories\[(\d+)\]")


def _shift_memory_index(detail: str, offset: int) -> str:
    return _MEMORY_INDEX.sub(lambda m: f"memories[{int(m.group(1)) + offset}]", detail)


def memory_input(memory: NewMemory) -> pb.MemoryInput:
    message = pb.MemoryInput(
        id=memory.id or "",
        content=memory.content,
        category=memory.category,
        confidence=memory.confidence,
        usefulness=memory.usefulness,
    )
    if memory.metadata:
        # Struct takes JSON-like values; anything else fails here, before the call.
        message.metadata.update(cast("dict[str, Any]", dict(memory.metadata)))
    if memory.embedding is not None:
        message.embedding.extend(float(x) for x in memory.embedding)
    if memory.occurred_at is not None:
        seconds = math.floor(memory.occurred_at)
        message.occurred_at.seconds = seconds
        message.occurred_at.nanos = min(999_999_999, round((memory.occurred_at - seconds) * 1e9))
    return message


class MemoryClient(ChannelClient):
    """MemoryService over one grpc.aio channel. Use ``async with`` or ``start()``/``close()``."""

    def __init__(
        self,
        target: str | Target,
        *,
        timeout: float = DEFAULT_WRITE_TIMEOUT_SECONDS,
        credentials: ClientCredentials | None = None,
        batch_size: int = 500,
        token: str | None = None,
    ) -> None:
        """``credentials``: TLS and the bearer token (docs/security.md); ``token``, when
        given, is sent in place of theirs."""
        super().__init__(target, timeout=timeout, credentials=credentials, token=token)
        self.batch_size = batch_size

    async def upsert_memories(
        self, org_id: str, agent_id: str, memories: Iterable[NewMemory | pb.MemoryInput]
    ) -> list[UpsertResult]:
        """Upsert in batches of ``batch_size``; one result per memory, in order.

        A memory is a ``NewMemory`` or, already in wire form (as ``import`` parses
        JSONL), a ``MemoryInput``.

        Batches already sent stay written if a later one fails (the error says how far it got).
        """
        results: list[UpsertResult] = []
        batch: list[pb.MemoryInput] = []

        async def flush() -> None:
            request = pb.UpsertMemoriesRequest(org_id=org_id, agent_id=agent_id, memories=batch)
            try:
                reply = await self._call("UpsertMemories", request, pb.UpsertMemoriesResponse)
            except MemoryClientError as exc:
                if not results:
                    raise
                # Point at the caller's index, not the batch's, and say what already happened.
                detail = _shift_memory_index(exc.detail, len(results))
                detail += f"; {len(results)} memories before this batch were written"
                raise type(exc)(exc.method, exc.reason, detail, exc.status) from exc
            results.extend(
                UpsertResult(r.id, _UPSERT_OUTCOMES.get(r.outcome, "unknown")) for r in reply.results
            )

        for memory in memories:
            batch.append(memory if isinstance(memory, pb.MemoryInput) else memory_input(memory))
            if len(batch) >= self.batch_size:
                await flush()
                batch = []
        if batch:
            await flush()
        return results

    async def delete_memories(self, org_id: str, agent_id: str, ids: Sequence[str]) -> int:
        request = pb.DeleteMemoriesRequest(org_id=org_id, agent_id=agent_id, ids=list(ids))
        reply = await self._call("DeleteMemories", request, pb.DeleteMemoriesResponse)
        return int(reply.deleted)

    async def set_directive(self, org_id: str, agent_id: str, content: str) -> int:
        """Replace the agent's directive; returns its new version."""
        request = pb.SetDirectiveRequest(org_id=org_id, agent_id=agent_id, content=content)
        reply = await self._call("SetDirective", request, pb.SetDirectiveResponse)
        return int(reply.version)

    async def clear_directive(self, org_id: str, agent_id: str) -> bool:
        request = pb.ClearDirectiveRequest(org_id=org_id, agent_id=agent_id)
        reply = await self._call("ClearDirective", request, pb.ClearDirectiveResponse)
        return bool(reply.cleared)

    async def record_feedback(
        self,
        org_id: str,
        agent_id: str,
        feedback: Mapping[str, FeedbackKind | str],
        *,
        session_id: str = "",
    ) -> list[ScoreUpdate]:
        """``feedback`` maps memory id -> positive/negative/neutral."""
        items = [
            pb.MemoryFeedback(memory_id=memory_id, feedback=_FEEDBACK_WIRE[FeedbackKind(kind)])
            for memory_id, kind in feedback.items()
        ]
        request = pb.RecordFeedbackRequest(
            org_id=org_id, agent_id=agent_id, session_id=session_id, feedback=items
        )
        reply = await self._call("RecordFeedback", request, pb.RecordFeedbackResponse)
        return [ScoreUpdate(u.memory_id, u.previous_usefulness, u.new_usefulness) for u in reply.updates]

    # ---------------------------------------------------------------- read side, export, purge

    async def get_memories(
        self, org_id: str, agent_id: str, ids: Sequence[str], *, include_embedding: bool = False
    ) -> list[StoredMemory]:
        """The agent's memories among ``ids`` (at most 1000), in that order; unknown ids left out."""
        request = pb.GetMemoriesRequest(
            org_id=org_id, agent_id=agent_id, ids=list(ids), include_embedding=include_embedding
        )
        reply = await self._call("GetMemories", request, pb.GetMemoriesResponse)
        return [StoredMemory.from_wire(m) for m in reply.memories]

    async def list_memories(
        self,
        org_id: str,
        agent_id: str,
        *,
        page_size: int = 100,
        page_token: str = "",
        categories: Sequence[str] = (),
        created_after: float | datetime | None = None,
        created_before: float | datetime | None = None,
        occurred_after: float | datetime | None = None,
        occurred_before: float | datetime | None = None,
        order: str = "created_desc",
        include_embedding: bool = False,
    ) -> MemoryPage:
        """One page; pass its ``next_page_token`` (with the same filters) for the next."""
        if order not in ORDERS:
            raise ValueError(f"order must be one of {sorted(ORDERS)}")
        request = pb.ListMemoriesRequest(
            org_id=org_id,
            agent_id=agent_id,
            page_size=page_size,
            page_token=page_token,
            categories=list(categories),
            order=ORDERS[order],  # type: ignore[arg-type]
            include_embedding=include_embedding,
        )
        bounds = {
            "created_after": created_after,
            "created_before": created_before,
            "occurred_after": occurred_after,
            "occurred_before": occurred_before,
        }
        for name, value in bounds.items():
            if value is not None:
                getattr(request, name).CopyFrom(timestamp(value))
        reply = await self._call("ListMemories", request, pb.ListMemoriesResponse)
        return MemoryPage([StoredMemory.from_wire(m) for m in reply.memories], reply.next_page_token)

    async def search_memories(
        self,
        org_id: str,
        agent_id: str,
        query: str = "",
        *,
        embedding: Sequence[float] = (),
        top_k: int = 10,
    ) -> list[SearchHit]:
        """What the cold retrieval finds for ``query`` (or ``embedding``), best first."""
        request = pb.SearchMemoriesRequest(
            org_id=org_id, agent_id=agent_id, query=query, query_embedding=list(embedding), top_k=top_k
        )
        reply = await self._call("SearchMemories", request, pb.SearchMemoriesResponse)
        return [
            SearchHit(StoredMemory.from_wire(h.memory), h.similarity, h.lexical_score, h.relevance)
            for h in reply.hits
        ]

    async def get_directive(self, org_id: str, agent_id: str) -> DirectiveView:
        request = pb.GetDirectiveRequest(org_id=org_id, agent_id=agent_id)
        reply = await self._call("GetDirective", request, pb.GetDirectiveResponse)
        updated = (
            reply.updated_at.seconds + reply.updated_at.nanos / 1e9 if reply.HasField("updated_at") else None
        )
        return DirectiveView(reply.exists, reply.content, int(reply.version), updated)

    async def export_pages(
        self, org_id: str, agent_id: str = "", *, include_embedding: bool = False, page_size: int = 500
    ) -> AsyncIterator[list[pb.StoredMemory]]:
        """Every memory of the org (or one agent), page by page, at the rate the service allows."""
        token = ""
        while True:
            request = pb.ExportMemoriesRequest(
                org_id=org_id,
                agent_id=agent_id,
                page_size=page_size,
                page_token=token,
                include_embedding=include_embedding,
            )
            reply = await self._call("ExportMemories", request, pb.ExportMemoriesResponse)
            yield list(reply.memories)
            token = reply.next_page_token
            if not token:
                return

    async def purge_agent(self, org_id: str, agent_id: str, *, max_calls: int = 100) -> PurgeResult:
        """Deletes everything of the agent in both stores, calling again until complete."""
        request = pb.PurgeAgentRequest(org_id=org_id, agent_id=agent_id)
        return await self._purge("PurgeAgent", request, pb.PurgeAgentResponse, max_calls)

    async def purge_org(self, org_id: str, *, max_calls: int = 1000) -> PurgeResult:
        """Deletes everything of every agent of the org, calling again until complete."""
        request = pb.PurgeOrgRequest(org_id=org_id)
        return await self._purge("PurgeOrg", request, pb.PurgeOrgResponse, max_calls)

    async def _purge(self, method: str, request: Any, reply_type: type[Any], max_calls: int) -> PurgeResult:
        totals = [0, 0, 0, 0]
        for call in range(1, max_calls + 1):
            reply = await self._call(method, request, reply_type)
            for i, value in enumerate(
                (
                    reply.memories_deleted,
                    reply.directives_deleted,
                    reply.agents_purged,
                    reply.cache_keys_deleted,
                )
            ):
                totals[i] += int(value)
            if reply.complete:
                return PurgeResult(totals[0], totals[1], totals[2], totals[3], calls=call)
        raise MemoryClientError(method, "incomplete", f"not complete after {max_calls} calls; call again")

    async def _call(self, method: str, request: Any, reply_type: type[Any]) -> Any:
        await self._channel.start()
        unary = self._channel.unary(_SERVICE + method, type(request), reply_type)
        try:
            return await unary(request, timeout=self.timeout, metadata=self._auth)
        except Exception as exc:
            failure = classify_failure(exc)
            if failure.kind == "unavailable":
                self._channel.unavailable()
            status = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
            if status in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED):
                raise MemoryRequestInvalid(method, failure.reason, failure.detail, status) from exc
            raise MemoryClientError(method, failure.reason, failure.detail, status) from exc
