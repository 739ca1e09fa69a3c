"""Plain values the client's read calls return, and the JSONL form of an export.

The export line carries every field ``ibex-context import`` restores (the
``MemoryInput`` fields plus ``org_id``/``agent_id``) and, for the record, the
fields a restore cannot set (``created_at``, ``updated_at``, the injection
counters): the importer skips those (``EXPORT_ONLY_FIELDS``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp

from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

EXPORT_ONLY_FIELDS: tuple[str, ...] = ("created_at", "updated_at", "retrieval_count", "last_injected_at")

ORDERS: Mapping[str, int] = {
    "created_desc": pb.MEMORY_ORDER_CREATED_DESC,
    "created_asc": pb.MEMORY_ORDER_CREATED_ASC,
    "occurred_desc": pb.MEMORY_ORDER_OCCURRED_DESC,
    "occurred_asc": pb.MEMORY_ORDER_OCCURRED_ASC,
}


def _seconds(stamp: Timestamp) -> float:
    return stamp.seconds + stamp.nanos / 1e9


def timestamp(value: float | datetime) -> Timestamp:
    stamp = Timestamp()
    if isinstance(value, datetime):
        stamp.FromDatetime(value if value.tzinfo else value.replace(tzinfo=UTC))
    else:
        stamp.FromNanoseconds(round(value * 1e9))
    return stamp


@dataclass(frozen=True, slots=True)
class StoredMemory:
    """A memory as stored; times are seconds since the epoch."""

    id: str
    agent_id: str
    content: str
    category: str
    confidence: float
    usefulness: float
    metadata: dict[str, Any]
    occurred_at: float
    created_at: float
    updated_at: float
    retrieval_count: int
    last_injected_at: float | None
    embedding: list[float] | None

    @classmethod
    def from_wire(cls, message: pb.StoredMemory) -> StoredMemory:
        return cls(
            id=message.id,
            agent_id=message.agent_id,
            content=message.content,
            category=message.category,
            confidence=message.confidence,
            usefulness=message.usefulness,
            metadata=json_format.MessageToDict(message.metadata) if message.HasField("metadata") else {},
            occurred_at=_seconds(message.occurred_at),
            created_at=_seconds(message.created_at),
            updated_at=_seconds(message.updated_at),
            retrieval_count=message.retrieval_count,
            last_injected_at=_seconds(message.last_injected_at)
            if message.HasField("last_injected_at")
            else None,
            embedding=list(message.embedding) if len(message.embedding) else None,
        )


@dataclass(frozen=True, slots=True)
class MemoryPage:
    memories: list[StoredMemory]
    # Empty on the last page.
    next_page_token: str


@dataclass(frozen=True, slots=True)
class SearchHit:
    memory: StoredMemory
    similarity: float
    lexical_score: float
    relevance: float


@dataclass(frozen=True, slots=True)
class DirectiveView:
    exists: bool
    content: str
    version: int
    updated_at: float | None


@dataclass(frozen=True, slots=True)
class PurgeResult:
    memories_deleted: int
    directives_deleted: int
    agents_purged: int
    cache_keys_deleted: int
    # Calls it took until the service said complete.
    calls: int


def export_line(org_id: str, message: pb.StoredMemory) -> dict[str, Any]:
    """One JSONL export record (the input of ``ibex-context import``)."""
    line: dict[str, Any] = {
        "org_id": org_id,
        "agent_id": message.agent_id,
        "id": message.id,
        "content": message.content,
        "category": message.category,
        "confidence": message.confidence,
        "usefulness": message.usefulness,
        "metadata": json_format.MessageToDict(message.metadata) if message.HasField("metadata") else {},
        "occurred_at": message.occurred_at.ToJsonString(),
        "created_at": message.created_at.ToJsonString(),
        "updated_at": message.updated_at.ToJsonString(),
        "retrieval_count": message.retrieval_count,
        "last_injected_at": (
            message.last_injected_at.ToJsonString() if message.HasField("last_injected_at") else None
        ),
    }
    if len(message.embedding):
        line["embedding"] = list(message.embedding)
    return line
