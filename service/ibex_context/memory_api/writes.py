"""The write side: validated memories are embedded, hashed and token-counted once,
then stored (PostgreSQL first, caches kept correct by the repository)."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Mapping, Sequence

from ibex_context.embedding.base import Embedder, embed_to_store
from ibex_context.errors import EmbeddingError
from ibex_context.models import FloatVector, NewMemory
from ibex_context.pipeline.layout import stored_token_counts
from ibex_context.stores.base import FeedbackUpdate, MemoryWriter, PreparedMemory, UpsertResult
from ibex_context.tokens.encodings import Encoding, EncodingRegistry

# Memories are counted once at write time for every exact encoding we serve, so the
# request path never tokenizes stored text.
STORED_ENCODINGS: tuple[str, ...] = ("o200k_base", "cl100k_base")
_EMBED_BATCH = 64


def content_hash(content: str) -> bytes:
    return hashlib.sha256(content.encode("utf-8")).digest()


class MemoryWriteApi:
    def __init__(
        self,
        *,
        writer: MemoryWriter,
        embedder: Embedder,
        encodings: EncodingRegistry,
        stored_encodings: Sequence[str] = STORED_ENCODINGS,
    ) -> None:
        self._writer = writer
        self._embedder = embedder
        self._encodings = encodings
        self._stored_encodings = tuple(stored_encodings)

    async def upsert(self, org_id: str, agent_id: str, memories: Sequence[NewMemory]) -> list[UpsertResult]:
        missing = [m.content for m in memories if m.embedding is None]
        vectors = iter(await self._embed(org_id, missing))
        counts = await asyncio.to_thread(self.memory_token_counts, [m.content for m in memories])
        prepared = [
            PreparedMemory(
                id=m.id or str(uuid.uuid4()),
                content=m.content,
                content_hash=content_hash(m.content),
                category=m.category,
                confidence=m.confidence,
                usefulness=m.usefulness,
                metadata=m.metadata,
                token_counts=count,
                embedding=m.embedding if m.embedding is not None else next(vectors),
                occurred_at=m.occurred_at,
            )
            for m, count in zip(memories, counts, strict=True)
        ]
        return await self._writer.upsert_memories(org_id, agent_id, prepared)

    async def delete(self, org_id: str, agent_id: str, ids: Sequence[str]) -> int:
        return await self._writer.delete_memories(org_id, agent_id, ids)

    async def set_directive(self, org_id: str, agent_id: str, content: str) -> int:
        (counts,) = await asyncio.to_thread(self.token_counts, [content])
        return await self._writer.set_directive(org_id, agent_id, content, counts)

    async def clear_directive(self, org_id: str, agent_id: str) -> bool:
        return await self._writer.clear_directive(org_id, agent_id)

    async def record_feedback(
        self, org_id: str, agent_id: str, session_id: str | None, feedback: Sequence[tuple[str, str]]
    ) -> list[FeedbackUpdate]:
        return await self._writer.record_feedback(org_id, agent_id, session_id, feedback)

    def token_counts(self, texts: Sequence[str]) -> list[Mapping[str, int]]:
        """Each text's tokens per exact stored encoding (a directive's counts)."""
        exact = self._exact_encodings()
        return [{e.name: e.count(text) for e in exact} for text in texts]

    def memory_token_counts(self, contents: Sequence[str]) -> list[Mapping[str, int]]:
        """What a memory stores: its tokens and its formatted block bodies' tokens per
        exact stored encoding (``layout.stored_token_counts``), so the request
        path costs it without a tokenizer."""
        exact = self._exact_encodings()
        return [stored_token_counts(content, exact) for content in contents]

    def _exact_encodings(self) -> list[Encoding]:
        encodings = [self._encodings.get(name) for name in self._stored_encodings]
        return [e for e in encodings if e.exact]

    async def _embed(self, org_id: str, texts: Sequence[str]) -> list[FloatVector]:
        vectors: list[FloatVector] = []
        for i in range(0, len(texts), _EMBED_BATCH):
            batch = texts[i : i + _EMBED_BATCH]
            result = await embed_to_store(self._embedder, org_id, batch)
            if len(result) != len(batch):
                raise EmbeddingError(f"embedder returned {len(result)} vectors for {len(batch)} texts")
            vectors.extend(result)
        return vectors
