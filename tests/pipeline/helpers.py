"""Values the formatting and costing tests share."""

from __future__ import annotations

from ibex_context.models import ChatMessage, MemoryRecord, ScoredMemory
from ibex_context.profiles.model import Format

NONCE = "3f9a1c0b7d2e4a68"
FORMATS: tuple[Format, ...] = ("xml", "markdown", "json")
MESSAGES = (ChatMessage("system", "Client system prompt."), ChatMessage("user", "Hi"))


def scored(id: str, content: str, category: str = "factual", **record: object) -> ScoredMemory:
    memory = MemoryRecord(id=id, content=content, category=category, **record)  # type: ignore[arg-type]
    return ScoredMemory(memory, 0.5, 0.5, 0.5, 0.5, 0.8, 0.0)
