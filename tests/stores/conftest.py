"""Store fixtures on top of the session's real Redis and PostgreSQL (tests/conftest.py)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator, Callable, Mapping

import pytest
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.models import FloatVector
from ibex_context.stores.base import PreparedMemory
from ibex_context.stores.postgres import PostgresMemoryStore, create_pool

from stores.helpers import DIM

EF_SEARCH = 64

MakeMemory = Callable[..., PreparedMemory]


@pytest.fixture(scope="session")
async def pg_store(postgres_dsn: str) -> AsyncIterator[PostgresMemoryStore]:
    pool = await create_pool(postgres_dsn, min_size=1, max_size=4, ef_search=EF_SEARCH)
    store = PostgresMemoryStore(pool, ef_search=EF_SEARCH)
    yield store
    await store.aclose()


@pytest.fixture(scope="session")
def make_memory() -> MakeMemory:
    """``make_memory("text", category=..., embedding=...)`` -> PreparedMemory with a fresh id."""
    embedder = HashingEmbedder(DIM)

    def make(
        content: str,
        *,
        category: str = "factual",
        confidence: float = 0.8,
        usefulness: float = 0.5,
        metadata: Mapping[str, object] | None = None,
        id: str | None = None,
        embedding: FloatVector | None = None,
        token_counts: Mapping[str, int] | None = None,
    ) -> PreparedMemory:
        return PreparedMemory(
            id=id or str(uuid.uuid4()),
            content=content,
            content_hash=hashlib.sha256(content.encode()).digest(),
            category=category,
            confidence=confidence,
            usefulness=usefulness,
            metadata=metadata or {},
            token_counts=token_counts if token_counts is not None else {"o200k_base": len(content.split())},
            embedding=embedding if embedding is not None else embedder.embed_one(content),
        )

    return make
