"""MemoryWriteApi against the real stores: each memory is embedded (unless it brings its
vector), hashed and token-counted once, then stored; the directive stores its counts."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future

import asyncpg
import numpy as np
import pytest
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.errors import EmbeddingError
from ibex_context.memory_api.writes import STORED_ENCODINGS, MemoryWriteApi, content_hash
from ibex_context.models import FloatVector, NewMemory
from ibex_context.stores.postgres import PostgresMemoryStore
from ibex_context.stores.postgres.tenant_data import TenantData
from ibex_context.stores.repository import ContextRepository
from ibex_context.tokens.encodings import EncodingRegistry

from tests.conftest import Tenant
from tests.stores.helpers import DIM, unit_vector


class BatchRecordingEmbedder(HashingEmbedder):
    """The hashing embedder, remembering the size of each batch it was asked for."""

    def __init__(self) -> None:
        super().__init__(DIM)
        self.batches: list[int] = []

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        self.batches.append(len(texts))
        return await super().embed(texts)


class TenantRecordingEmbedder(HashingEmbedder):
    """The hashing embedder as a ``TenantQueuedEmbedder``: whose texts each batch was."""

    def __init__(self) -> None:
        super().__init__(DIM)
        self.tenants: list[str] = []

    def submit_stored(self, texts: Sequence[str], *, tenant: str = "") -> Future[list[FloatVector]]:
        self.tenants.append(tenant)
        done: Future[list[FloatVector]] = Future()
        done.set_result([self.embed_one(t) for t in texts])
        return done

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        raise AssertionError("a tenant-queued embedder is handed the org's texts, not embed()")


class OneShortEmbedder(HashingEmbedder):
    """A faulty embedder: one vector fewer than the texts it was given."""

    async def embed(self, texts: Sequence[str]) -> list[FloatVector]:
        return (await super().embed(texts))[:-1]


@pytest.fixture
async def pg(postgres_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(postgres_dsn)
    yield conn
    await conn.close()


async def _stored_token_counts(pg: asyncpg.Connection, tenant: Tenant, memory_id: str) -> dict[str, int]:
    raw = await pg.fetchval(
        "SELECT token_counts FROM memories WHERE org_id = $1 AND agent_id = $2 AND id = $3",
        uuid.UUID(tenant.org_id),
        uuid.UUID(tenant.agent_id),
        uuid.UUID(memory_id),
    )
    counts: dict[str, int] = json.loads(raw) if isinstance(raw, str) else dict(raw)
    return counts


async def test_only_memories_without_a_vector_are_embedded_in_batches_of_64(
    repository: ContextRepository, pg_store: PostgresMemoryStore, encodings: EncodingRegistry, tenant: Tenant
) -> None:
    embedder = BatchRecordingEmbedder()
    writes = MemoryWriteApi(writer=repository, embedder=embedder, encodings=encodings)
    brought = unit_vector(7)
    memories = [NewMemory(content="the user's own vector", category="factual", embedding=brought)]
    memories += [NewMemory(content=f"fact number {i} about harbours", category="factual") for i in range(70)]

    results = await writes.upsert(tenant.org_id, tenant.agent_id, memories)

    assert embedder.batches == [64, 6]
    assert [r.outcome for r in results] == ["created"] * 71
    rows = await TenantData(pg_store.pool).get_memories(
        tenant.org_id, tenant.agent_id, [results[0].id, results[5].id], with_embedding=True
    )
    assert rows[0].embedding is not None and rows[1].embedding is not None
    np.testing.assert_allclose(rows[0].embedding, brought, atol=1e-6)
    np.testing.assert_allclose(
        rows[1].embedding, HashingEmbedder(DIM).embed_one(memories[5].content), atol=1e-6
    )


async def test_texts_to_store_are_queued_as_the_writing_orgs(
    repository: ContextRepository, encodings: EncodingRegistry, tenant: Tenant
) -> None:
    """Where the embedder queues texts per org (MiniLM: ``embedding.batching``), a write's
    texts wait in its org's turn, so another org's import cannot hold them behind all of it."""
    embedder = TenantRecordingEmbedder()
    writes = MemoryWriteApi(writer=repository, embedder=embedder, encodings=encodings)
    memories = [NewMemory(content=f"fact {i} about tides", category="factual") for i in range(70)]
    results = await writes.upsert(tenant.org_id, tenant.agent_id, memories)
    assert embedder.tenants == [tenant.org_id, tenant.org_id]  # two batches of at most 64
    assert [r.outcome for r in results] == ["created"] * 70


async def test_a_memory_keeps_the_id_it_brings_and_gets_a_new_one_otherwise(
    repository: ContextRepository, encodings: EncodingRegistry, tenant: Tenant
) -> None:
    writes = MemoryWriteApi(writer=repository, embedder=HashingEmbedder(DIM), encodings=encodings)
    own = str(uuid.uuid4())

    first = await writes.upsert(
        tenant.org_id,
        tenant.agent_id,
        [
            NewMemory(content="named", category="factual", id=own),
            NewMemory(content="unnamed", category="factual"),
        ],
    )
    again = await writes.upsert(
        tenant.org_id, tenant.agent_id, [NewMemory(content="named", category="factual", id=own)]
    )

    assert first[0].id == own
    assert str(uuid.UUID(first[1].id)) == first[1].id and first[1].id != own
    assert again[0].id == own and again[0].outcome == "unchanged"


async def test_an_embedder_that_loses_a_vector_fails_the_write_and_stores_nothing(
    repository: ContextRepository, pg_store: PostgresMemoryStore, encodings: EncodingRegistry, tenant: Tenant
) -> None:
    writes = MemoryWriteApi(writer=repository, embedder=OneShortEmbedder(DIM), encodings=encodings)
    memory_id = str(uuid.uuid4())

    with pytest.raises(EmbeddingError, match="returned 1 vectors for 2 texts"):
        await writes.upsert(
            tenant.org_id,
            tenant.agent_id,
            [
                NewMemory(content="one", category="factual", id=memory_id),
                NewMemory(content="two", category="factual"),
            ],
        )

    assert await TenantData(pg_store.pool).get_memories(tenant.org_id, tenant.agent_id, [memory_id]) == []


async def test_a_memory_stores_its_tokens_per_exact_encoding_and_its_block_bodies(
    repository: ContextRepository,
    encodings: EncodingRegistry,
    pg: asyncpg.Connection,
    tenant: Tenant,
) -> None:
    writes = MemoryWriteApi(writer=repository, embedder=HashingEmbedder(DIM), encodings=encodings)
    content = "The user prefers window seats on long flights."

    (result,) = await writes.upsert(
        tenant.org_id, tenant.agent_id, [NewMemory(content=content, category="preference")]
    )

    stored = await _stored_token_counts(pg, tenant, result.id)
    for name in STORED_ENCODINGS:
        assert stored[name] == encodings.get(name).count(content)
    # The block bodies' counts ("<encoding>/<format>") are what the request path looks up
    # instead of running a tokenizer.
    bodies = {key for key in stored if "/" in key}
    assert bodies and {key.partition("/")[0] for key in bodies} <= set(STORED_ENCODINGS)
    assert stored == writes.memory_token_counts([content])[0]


async def test_the_content_hash_is_the_sha256_of_its_utf8_bytes() -> None:
    assert content_hash("café") == hashlib.sha256("café".encode()).digest()
    assert content_hash("a") != content_hash("a ")


async def test_a_directive_stores_its_counts_and_clearing_it_removes_it(
    repository: ContextRepository,
    pg_store: PostgresMemoryStore,
    encodings: EncodingRegistry,
    pg: asyncpg.Connection,
    tenant: Tenant,
) -> None:
    writes = MemoryWriteApi(writer=repository, embedder=HashingEmbedder(DIM), encodings=encodings)
    data = TenantData(pg_store.pool)

    first = await writes.set_directive(tenant.org_id, tenant.agent_id, "Answer in French.")
    second = await writes.set_directive(tenant.org_id, tenant.agent_id, "Answer in German, briefly.")

    assert second > first
    directive = await data.get_directive(tenant.org_id, tenant.agent_id)
    assert (directive.content, directive.version) == ("Answer in German, briefly.", second)
    raw = await pg.fetchval(
        "SELECT token_counts FROM directives WHERE org_id = $1 AND agent_id = $2",
        uuid.UUID(tenant.org_id),
        uuid.UUID(tenant.agent_id),
    )
    counts = json.loads(raw) if isinstance(raw, str) else dict(raw)
    assert counts == writes.token_counts(["Answer in German, briefly."])[0]
    assert set(counts) == set(STORED_ENCODINGS)

    assert await writes.clear_directive(tenant.org_id, tenant.agent_id)
    assert (await data.get_directive(tenant.org_id, tenant.agent_id)).content is None
    assert not await writes.clear_directive(tenant.org_id, tenant.agent_id)
