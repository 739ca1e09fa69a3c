"""One small interface for every embedder.

Implementations: ``embedding.minilm`` (all-MiniLM-L6-v2 on ONNX Runtime, offline,
off the event loop: the semantic one), ``embedding.openai`` (an OpenAI-compatible
``/v1/embeddings`` endpoint) and ``embedding.hashing`` (deterministic and lexical: a
toy for tests and for isolating costs, no meaning). ``embedding.cache`` wraps any of
them with an LRU for queries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Protocol, runtime_checkable

from ibex_context.models import FloatVector


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of ``dim`` dimensions."""

    @property
    def name(self) -> str:
        """Identifies the model; part of the query-cache key."""
        ...

    @property
    def dim(self) -> int: ...

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class ThreadedEmbedder(Embedder, Protocol):
    """An embedder whose work runs in its own threads: ``submit_queries`` hands queries
    over at once (the caller's event loop need not turn first) and never raises for the
    texts; the future's error is an ``EmbeddingError``. Queries may be embedded with a
    cheaper model than ``embed``'s (the texts it stores), whose vectors compare with
    theirs: MiniLM's int8 query precision. ``tenant`` (the caller's org) is whose queries
    they are: queries queue per tenant and tenants take turns (``embedding.batching``)."""

    def submit_queries(self, texts: Sequence[str], *, tenant: str = "") -> Future[list[FloatVector]]: ...


@runtime_checkable
class TenantQueuedEmbedder(Embedder, Protocol):
    """An embedder that queues texts to store per tenant, tenants taking turns
    (``embedding.batching``): ``submit_stored`` is ``embed``'s work handed over for
    ``tenant``, so one org's import does not hold another org's write behind all of it."""

    def submit_stored(self, texts: Sequence[str], *, tenant: str = "") -> Future[list[FloatVector]]: ...


async def embed_to_store(embedder: Embedder, org_id: str, texts: Sequence[str]) -> list[FloatVector]:
    """``embedder.embed(texts)`` for texts ``org_id`` stores: in that org's turn where the
    embedder queues them (``TenantQueuedEmbedder``)."""
    if isinstance(embedder, TenantQueuedEmbedder):
        return await asyncio.wrap_future(embedder.submit_stored(texts, tenant=org_id))
    return await embedder.embed(texts)


@runtime_checkable
class TokenisedEmbedder(Embedder, Protocol):
    """An embedder whose cost grows with its model's tokens: ``text_tail`` is the end of
    ``text`` that makes at most ``max_tokens`` of them (``text`` itself when it makes no
    more), so the query cache can bound what one query costs."""

    def text_tail(self, text: str, max_tokens: int) -> str: ...
