"""The values a caller hands the clients: chat messages and memories to write.

The service validates both again (``ibex_context.server.assembly_service`` and
``memory_service``); these are the shapes, the roles and the categories it accepts,
from one place for both sides.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool", "developer"})

# A memory's confidence and usefulness when written without them (the proto's
# ``MemoryInput`` leaves them unset); ranking takes the same for a memory it has none of.
DEFAULT_CONFIDENCE = 0.8
DEFAULT_USEFULNESS = 0.5


class Category(enum.StrEnum):
    """Memory categories, in the order the formatter injects them."""

    PROCEDURAL = "procedural"
    FACTUAL = "factual"
    PREFERENCE = "preference"
    BEHAVIORAL = "behavioral"
    EPISODIC = "episodic"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class NewMemory:
    """A memory to write through ``MemoryClient.upsert``."""

    content: str
    category: str
    confidence: float = DEFAULT_CONFIDENCE
    usefulness: float = DEFAULT_USEFULNESS
    id: str | None = None
    metadata: Mapping[str, object] = field(default_factory=dict)
    # The caller's own vector; None: the service embeds the content.
    embedding: Sequence[float] | None = None
    # When the information came to be, seconds since the epoch; None: now.
    occurred_at: float | None = None
