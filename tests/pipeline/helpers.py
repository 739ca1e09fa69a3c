"""Values the layout tests share."""

from __future__ import annotations

from collections.abc import Sequence

from ibex_context.models import ChatMessage, MemoryRecord, ScoredMemory
from ibex_context.pipeline.layout import lay_out
from ibex_context.profiles.model import Format

NONCE = "3f9a1c0b7d2e4a68"
FORMATS: tuple[Format, ...] = ("xml", "markdown", "json")
MESSAGES = (ChatMessage("system", "Client system prompt."), ChatMessage("user", "Hi"))


def scored(id: str, content: str, category: str = "factual", **record: object) -> ScoredMemory:
    memory = MemoryRecord(id=id, content=content, category=category, **record)  # type: ignore[arg-type]
    return ScoredMemory(memory, 0.5, 0.5, 0.5, 0.5, 0.8, 0.0)


def render_injection(
    *, directive: str | None, memories: Sequence[ScoredMemory | MemoryRecord], fmt: Format, nonce: str
) -> str:
    """The injected text alone ('' when there is nothing to inject)."""
    return lay_out(
        (), directive=directive, memories=memories, fmt=fmt, mode="system_first", nonce=nonce
    ).text()
