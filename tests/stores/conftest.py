"""Store fixtures on top of the session's real Redis and PostgreSQL (tests/conftest.py)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator, Mapping

import pytest
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.models import FloatVector
from ibex_context.stores.base import PreparedMemory
from ibex_context.stores.postgres import PostgresMemoryStore, create_pool
from ibex_context.stores.redis.cache import RedisContextCache, create_redis_client
from ibex_context.stores.redis.wire import PipelinedRedis
from ibex_context.stores.repository import ContextRepository

from tests.stores.helpers import DIM, EF_SEARCH, MakeMemory


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
        occurred_at: float | None = None,
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
            occurred_at=occurred_at,
        )

    return make


@pytest.fixture
async def redis_cache(redis_url: str) -> AsyncIterator[RedisContextCache]:
    cache = RedisContextCache(
        create_redis_client(redis_url, max_connections=8),
        PipelinedRedis.from_url(redis_url),
        directive_ttl_seconds=300,
        hot_set_size=5,
        hot_set_ttl_seconds=600,
    )
    yield cache
    await cache.aclose()


@pytest.fixture
async def repository(
    pg_store: PostgresMemoryStore, redis_cache: RedisContextCache
) -> AsyncIterator[ContextRepository]:
    repo = ContextRepository(pg_store, redis_cache, invalidation_retry_seconds=0.05)
    yield repo
    await repo.aclose()
