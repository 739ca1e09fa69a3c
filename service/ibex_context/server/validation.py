"""Validation of wire requests into the values the pipeline works on.

Every failure names the field (``messages[3].role``) so the caller can fix it;
nothing reaches a store before its request is valid.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf import json_format
from ibex_context_client.proto.ibex.context.v1 import context_pb2 as pb

from ibex_context.errors import InvalidRequest, LimitExceeded
from ibex_context.models import (
    DEFAULT_CONFIDENCE,
    DEFAULT_USEFULNESS,
    ROLES,
    AssemblyRequest,
    Category,
    ChatMessage,
    NewMemory,
)

_MAX_MODEL_CHARS = 200
_MAX_REQUEST_ID_CHARS = 128
_MAX_METADATA_BYTES = 16 * 1024
_FEEDBACK = {
    pb.FEEDBACK_POSITIVE: "positive",
    pb.FEEDBACK_NEGATIVE: "negative",
    pb.FEEDBACK_NEUTRAL: "neutral",
}


@dataclass(frozen=True, slots=True)
class Limits:
    max_messages: int
    max_message_chars: int
    max_memory_chars: int
    max_directive_chars: int
    max_upsert_batch: int
    embedding_dim: int
    max_delete_ids: int = 1000
    max_feedback_items: int = 1000


def uuid_field(value: str, field: str, *, required: bool = True) -> str:
    """A canonical lower-case UUID string, or '' for an allowed empty value."""
    if not value:
        if required:
            raise InvalidRequest(field, "is required (a UUID)")
        return ""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise InvalidRequest(field, f"is not a valid UUID: {_preview(value)}") from None


def assemble_request(message: pb.AssembleContextRequest, limits: Limits) -> AssemblyRequest:
    org_id = uuid_field(message.org_id, "org_id")
    agent_id = uuid_field(message.agent_id, "agent_id")
    session_id = uuid_field(message.session_id, "session_id", required=False)
    model = message.model.strip()
    if not model:
        raise InvalidRequest("model", "is required (e.g. gpt-4o)")
    if len(model) > _MAX_MODEL_CHARS or not model.isprintable():
        raise InvalidRequest("model", f"must be at most {_MAX_MODEL_CHARS} printable characters")
    request_id = message.request_id or uuid.uuid4().hex
    if len(request_id) > _MAX_REQUEST_ID_CHARS or not request_id.isprintable():
        raise InvalidRequest("request_id", f"must be at most {_MAX_REQUEST_ID_CHARS} printable characters")
    count = len(message.messages)
    if count > limits.max_messages:
        raise InvalidRequest("messages", f"has {count} messages; at most {limits.max_messages} are accepted")
    messages = []
    for i, m in enumerate(message.messages):
        if m.role not in ROLES:
            raise InvalidRequest(
                f"messages[{i}].role", f"unknown role {_preview(m.role)}; expected one of {sorted(ROLES)}"
            )
        if len(m.content) > limits.max_message_chars:
            raise InvalidRequest(
                f"messages[{i}].content",
                f"has {len(m.content)} characters; at most {limits.max_message_chars} are accepted",
            )
        messages.append(ChatMessage(m.role, m.content))
    return AssemblyRequest(
        org_id=org_id,
        agent_id=agent_id,
        session_id=session_id,
        model=model,
        request_id=request_id,
        messages=tuple(messages),
    )


def scope(org_id: str, agent_id: str) -> tuple[str, str]:
    return uuid_field(org_id, "org_id"), uuid_field(agent_id, "agent_id")


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
                f"unknown category {_preview(item.category)}; expected one of {[c.value for c in Category]}",
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


# A writer's clock may run a little ahead of ours; a day more is a wrong date, which
# would keep a memory "brand new" in every recency computation until it arrives.
OCCURRED_AT_FUTURE_TOLERANCE_S = 86_400.0


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


INVALID_VALUE = "<invalid>"


def loggable(value: str, max_chars: int) -> str:
    """``value`` when it is short and printable, else ``<invalid>``: what a refused
    request's identifiers may put in logs and spans. A raw value could carry bidi
    controls (U+202E) or line breaks that forge or hide log lines."""
    return value if len(value) <= max_chars and value.isprintable() else INVALID_VALUE


def _preview(value: str) -> str:
    # Identifiers only; never echo content fields back.
    return repr(value[:40] + ("…" if len(value) > 40 else ""))
