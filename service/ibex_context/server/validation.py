"""What both services validate alike: the request limits, UUID fields, a tenant's scope,
and what of a refused value may be echoed or logged.

Every failure names the field (``messages[3].role``) so the caller can fix it; nothing
reaches a store before its request is valid. Each service's own requests are validated
in its module (``server/assembly_service.py``, ``server/memory_service.py``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from ibex_context.errors import InvalidRequest


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
        raise InvalidRequest(field, f"is not a valid UUID: {preview(value)}") from None


def scope(org_id: str, agent_id: str) -> tuple[str, str]:
    return uuid_field(org_id, "org_id"), uuid_field(agent_id, "agent_id")


INVALID_VALUE = "<invalid>"


def loggable(value: str, max_chars: int) -> str:
    """``value`` when it is short and printable, else ``<invalid>``: what a refused
    request's identifiers may put in logs and spans. A raw value could carry bidi
    controls (U+202E) or line breaks that forge or hide log lines."""
    return value if len(value) <= max_chars and value.isprintable() else INVALID_VALUE


def preview(value: str) -> str:
    # Identifiers only; never echo content fields back.
    return repr(value[:40] + ("…" if len(value) > 40 else ""))
