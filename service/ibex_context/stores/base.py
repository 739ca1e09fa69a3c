"""The narrow interfaces the pipeline and the write side use to reach the stores.

PostgreSQL is the source of truth; Redis caches the directive and the hot set.
Every method takes ``org_id`` and ``agent_id``: there is no unscoped read or write.
Implementations: ``stores.postgres`` and ``stores.redis``; the composition of the
two (write-through, cache fill on miss) is ``stores.repository``.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from ibex_context.candidates import Candidates
from ibex_context.models import Directive, FloatVector


@dataclass(frozen=True, slots=True)
class PreparedMemory:
    """A memory ready to store: validated, hashed, embedded and token-counted."""

    id: str
    content: str
    content_hash: bytes
    category: str
    confidence: float
    usefulness: float
    metadata: Mapping[str, object]
    token_counts: Mapping[str, int]
    embedding: FloatVector
    # Seconds since the epoch; None: now for a new memory, unchanged for a stored one.
    occurred_at: float | None = None


# Not frozen: a frozen dataclass's __init__ costs ~6x more (object.__setattr__ per
# field) and one is built per injected memory; treat instances as values all the same.
@dataclass(slots=True)
class InjectionRecord:
    """One memory injected into one response (recorded after the response)."""

    org_id: str
    agent_id: str
    memory_id: str
    at: float


@dataclass(frozen=True, slots=True)
class UpsertResult:
    id: str
    outcome: str  # "created" | "updated" | "unchanged"


@dataclass(frozen=True, slots=True)
class FeedbackUpdate:
    memory_id: str
    previous_usefulness: float
    new_usefulness: float


@dataclass(frozen=True, slots=True)
class StoreHealth:
    ok: bool
    detail: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)


class ListOrder(enum.Enum):
    """Sort orders of a memory listing: by creation time or by when it happened (creation
    time when unknown), newest or oldest first."""

    CREATED_DESC = "created_desc"
    CREATED_ASC = "created_asc"
    OCCURRED_DESC = "occurred_desc"
    OCCURRED_ASC = "occurred_asc"

    @property
    def descending(self) -> bool:
        return self.name.endswith("_DESC")


@dataclass(frozen=True, slots=True)
class MemoryFilter:
    """Filters of ``list_memories``; ranges are half-open [after, before)."""

    categories: tuple[str, ...] = ()
    created_after: datetime | None = None
    created_before: datetime | None = None
    occurred_after: datetime | None = None
    occurred_before: datetime | None = None


@dataclass(frozen=True, slots=True)
class StoredRow:
    """A memory as stored, every field the read side and the export return."""

    agent_id: str
    id: str
    content: str
    category: str
    confidence: float
    usefulness: float
    metadata: dict[str, Any]
    # Times in microseconds since the epoch.
    occurred_at: int
    created_at: int
    updated_at: int
    retrieval_count: int
    last_injected_at: int | None
    embedding: FloatVector | None
    # The value of the listing's sort key (for its next page token).
    sort_key: datetime | None = None


@dataclass(frozen=True, slots=True)
class DirectiveRow:
    content: str | None
    version: int
    updated_at: datetime | None


@dataclass(frozen=True, slots=True)
class DirectiveState:
    """The directive row as the cache stores it: ``content`` None when there is none.

    ``version`` only grows (a cleared directive keeps its row), so a cache write of
    an older state can be refused; 0 means the agent never had a directive.
    """

    content: str | None
    version: int
    token_counts: Mapping[str, int]

    def to_directive(self) -> Directive | None:
        if self.content is None:
            return None
        return Directive(content=self.content, version=self.version, token_counts=self.token_counts)


# Not frozen: a frozen dataclass's __init__ costs ~6x more (object.__setattr__ per
# field) and one is built per injected memory; treat instances as values all the same.
@dataclass(slots=True)
class MemoryCounters:
    """A memory's injection counters after a recorded batch (``memory_usage``)."""

    org_id: str
    agent_id: str
    memory_id: str
    retrieval_count: int
    last_injected_at: float | None


class TenantReads(Protocol):
    """The memory API's reads of one tenant's rows (``stores.postgres.tenant_data``)."""

    def get_memories(
        self, org_id: str, agent_id: str, ids: Sequence[str], *, with_embedding: bool = False
    ) -> Awaitable[list[StoredRow]]: ...

    def list_memories(
        self,
        org_id: str,
        agent_id: str,
        *,
        order: ListOrder,
        filters: MemoryFilter,
        after: tuple[datetime, str] | None,
        limit: int,
        with_embedding: bool = False,
    ) -> Awaitable[list[StoredRow]]: ...

    def export_memories(
        self,
        org_id: str,
        agent_id: str | None,
        *,
        after: tuple[str, str] | None,
        limit: int,
        with_embedding: bool,
    ) -> Awaitable[list[StoredRow]]: ...

    def get_directive(self, org_id: str, agent_id: str) -> Awaitable[DirectiveRow]: ...


class DirectiveReader(Protocol):
    async def get_directive(self, org_id: str, agent_id: str) -> Directive | None: ...


class HotMemoryReader(Protocol):
    async def get_hot_memories(self, org_id: str, agent_id: str, limit: int) -> Candidates: ...


class ColdMemorySearch(Protocol):
    async def search(
        self,
        org_id: str,
        agent_id: str,
        embedding: FloatVector,
        limit: int,
        *,
        with_vectors: bool = False,
        wider: bool = False,
    ) -> Candidates:
        """The nearest memories by cosine with their ``similarity``; ``with_vectors``: with
        their stored vectors too, for scoring with another query vector; ``wider``: a graph
        walk repeated after it missed, at its wider width."""
        ...

    async def search_lexical(self, org_id: str, agent_id: str, query: str, limit: int) -> Candidates: ...


class MemoryWriter(Protocol):
    async def upsert_memories(
        self, org_id: str, agent_id: str, memories: Sequence[PreparedMemory]
    ) -> list[UpsertResult]: ...

    async def delete_memories(self, org_id: str, agent_id: str, ids: Sequence[str]) -> int: ...

    async def set_directive(
        self, org_id: str, agent_id: str, content: str, token_counts: Mapping[str, int]
    ) -> int: ...

    async def clear_directive(self, org_id: str, agent_id: str) -> bool: ...

    async def record_feedback(
        self, org_id: str, agent_id: str, session_id: str | None, feedback: Sequence[tuple[str, str]]
    ) -> list[FeedbackUpdate]: ...


class InjectionRecorder(Protocol):
    async def record_injections(self, injections: Sequence[InjectionRecord]) -> None: ...


class WriteMarkStore(Protocol):
    """Each agent's last write's WAL position, seen by every process
    (``stores.redis.write_marks``): the read routing sends an agent's searches to a
    replica only once it has replayed the mark. ``put`` and ``get`` raise CacheError."""

    def put(self, org_id: str, agent_id: str, lsn: int) -> Awaitable[None]: ...

    def get(self, org_id: str, agent_id: str) -> Awaitable[int]: ...

    def forget_expired(self) -> None: ...

    def aclose(self) -> Awaitable[None]: ...


class HealthProbe(Protocol):
    async def check_health(self) -> StoreHealth: ...
