"""The read side: get, list, search, directive and export, scoped by tenant.

Search runs the cold retrieval through ``RetrievalSearch``, one narrow function
(org, agent, query text, query vector, k) -> hits. The service plugs in
``hybrid_search``: the vector and the lexical search at once, relevance computed by
the assembly's own scorer (ADR-0008), so a user sees what retrieval sees.
``vector_search`` is the cosine half alone.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from ibex_context.candidates import Candidates, merge
from ibex_context.embedding.base import Embedder
from ibex_context.embedding.cache import embed_for_org
from ibex_context.errors import InvalidRequest
from ibex_context.memory_api import page_tokens
from ibex_context.memory_api.throttle import RowRateLimit
from ibex_context.models import FloatVector
from ibex_context.pipeline.scoring import score_candidates
from ibex_context.profiles.model import Scoring
from ibex_context.stores.base import (
    ColdMemorySearch,
    DirectiveRow,
    ListOrder,
    MemoryFilter,
    StoredRow,
    TenantReads,
)


@dataclass(frozen=True, slots=True)
class RetrievalHit:
    """One memory as retrieval ranked it, with the components of its relevance."""

    memory_id: str
    similarity: float
    # The lexical half of relevance (BM25 saturated to [0, 1)); None when no lexical
    # search ran.
    lexical_score: float | None
    relevance: float


RetrievalSearch = Callable[[str, str, str, FloatVector, int], Awaitable[list[RetrievalHit]]]


def vector_search(cold: ColdMemorySearch) -> RetrievalSearch:
    """The cold retrieval as the assembly runs it today: cosine similarity alone."""

    async def search(
        org_id: str, agent_id: str, _query: str, vector: FloatVector, k: int
    ) -> list[RetrievalHit]:
        found = await cold.search(org_id, agent_id, vector, k)
        similarity = np.nan_to_num(found.similarity, nan=0.0).tolist()
        return [RetrievalHit(i, s, None, s) for i, s in zip(found.ids, similarity, strict=True)]

    return search


def hybrid_search(cold: ColdMemorySearch, scoring: Scoring | None = None) -> RetrievalSearch:
    """The cold retrieval as the assembly runs it: the nearest ``k`` by vector and the
    best ``k`` by BM25 at once, merged, ranked by the scorer's relevance (semantic and
    lexical halves; recency and the other adjustments are left out: they rank the
    assembly, not the search)."""
    profile_scoring = scoring or Scoring()

    async def search(
        org_id: str, agent_id: str, query: str, vector: FloatVector, k: int
    ) -> list[RetrievalHit]:
        nearest, matching = await asyncio.gather(
            cold.search(org_id, agent_id, vector, k), cold.search_lexical(org_id, agent_id, query, k)
        )
        candidates = merge(nearest, matching, Candidates.empty(), dim=int(np.asarray(vector).shape[-1]))
        scored = score_candidates(
            candidates,
            vector,
            profile_scoring.model_copy(update={"relevance_floor": 0.0}),
            now=time.time(),
            lexical_searched=bool(query.strip()),
        )
        scored.sort(key=lambda s: (-s.relevance, s.memory.id))
        return [RetrievalHit(s.memory.id, s.semantic, s.lexical, s.relevance) for s in scored[:k]]

    return search


@dataclass(frozen=True, slots=True)
class SearchResult:
    memory: StoredRow
    hit: RetrievalHit


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[StoredRow]
    next_token: str


@dataclass(frozen=True, slots=True)
class ListQuery:
    order: ListOrder
    filters: MemoryFilter
    page_size: int
    page_token: str
    with_embedding: bool


def _micros(value: datetime) -> str:
    delta = value - datetime(1970, 1, 1, tzinfo=UTC)
    return str((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)


def time_of_position(text: str) -> datetime:
    try:
        seconds, rest = divmod(int(text), 1_000_000)
        # A forged position far outside datetime's range must not become an INTERNAL error.
        return datetime.fromtimestamp(seconds, tz=UTC).replace(microsecond=rest)
    except (ValueError, OverflowError, OSError):
        raise InvalidRequest(page_tokens.FIELD, "is not a token this service issued") from None


def _checked_uuid(text: str) -> str:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        raise InvalidRequest(page_tokens.FIELD, "is not a token this service issued") from None


class MemoryReadApi:
    def __init__(
        self,
        *,
        data: TenantReads,
        search: RetrievalSearch,
        embedder: Embedder,
        export_limit: RowRateLimit,
    ) -> None:
        self._data = data
        self._search = search
        self._embedder = embedder
        self._export_limit = export_limit

    async def get(
        self, org_id: str, agent_id: str, ids: Sequence[str], *, with_embedding: bool
    ) -> list[StoredRow]:
        return await self._data.get_memories(org_id, agent_id, ids, with_embedding=with_embedding)

    async def list_page(self, org_id: str, agent_id: str, query: ListQuery) -> Page:
        f = query.filters
        digest = page_tokens.query_digest(
            [
                org_id,
                agent_id,
                query.order.name,
                sorted(f.categories),
                f.created_after,
                f.created_before,
                f.occurred_after,
                f.occurred_before,
            ]
        )
        after = None
        if query.page_token:
            key, last_id = page_tokens.decode(query.page_token, digest, 2)
            after = (time_of_position(key), _checked_uuid(last_id))
        # One row more than the page tells whether another page follows.
        rows = await self._data.list_memories(
            org_id,
            agent_id,
            order=query.order,
            filters=f,
            after=after,
            limit=query.page_size + 1,
            with_embedding=query.with_embedding,
        )
        page = rows[: query.page_size]
        token = ""
        if len(rows) > query.page_size and page[-1].sort_key is not None:
            token = page_tokens.encode(digest, [_micros(page[-1].sort_key), page[-1].id])
        return Page(page, token)

    async def search(
        self, org_id: str, agent_id: str, query: str, vector: FloatVector | None, k: int
    ) -> list[SearchResult]:
        if vector is None:
            (vector,) = await embed_for_org(self._embedder, org_id, [query])
        hits = await self._search(org_id, agent_id, query, vector, k)
        rows = await self._data.get_memories(org_id, agent_id, [h.memory_id for h in hits])
        by_id = {r.id: r for r in rows}
        # A hit deleted between the search and the read is left out.
        return [SearchResult(by_id[h.memory_id], h) for h in hits if h.memory_id in by_id]

    async def directive(self, org_id: str, agent_id: str) -> DirectiveRow:
        return await self._data.get_directive(org_id, agent_id)

    async def export(
        self, org_id: str, agent_id: str | None, *, page_size: int, page_token: str, with_embedding: bool
    ) -> Page:
        """One export page, in the org's turn of the process's export rate (``throttle``)."""
        digest = page_tokens.query_digest(["export", org_id, agent_id or ""])
        after = None
        if page_token:
            agent, last_id = page_tokens.decode(page_token, digest, 2)
            after = (_checked_uuid(agent), _checked_uuid(last_id))
        # The org's turn reserves a page; the rows it did not deliver are given back.
        async with self._export_limit.turn(org_id, page_size) as turn:
            rows = await self._data.export_memories(
                org_id, agent_id, after=after, limit=page_size + 1, with_embedding=with_embedding
            )
            page = rows[:page_size]
            turn.used(len(page))
        token = page_tokens.encode(digest, [page[-1].agent_id, page[-1].id]) if len(rows) > page_size else ""
        return Page(page, token)
