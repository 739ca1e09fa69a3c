"""How the stores' rows become values (``stores/postgres/rows.py``), on real PostgreSQL
rows: a search's rows aggregated into one row of arrays, in order, then columns; a
memory's row as a record."""

from __future__ import annotations

import math
import time
import uuid

import numpy as np
from ibex_context.models import Source
from ibex_context.stores.base import InjectionRecord
from ibex_context.stores.postgres import PostgresMemoryStore
from ibex_context.stores.postgres.codecs import TokenCountsDecoder
from ibex_context.stores.postgres.rows import (
    CANDIDATE_COLUMNS,
    MEMORY_COLUMNS,
    USAGE_JOIN,
    as_arrays,
    candidate_columns,
    record,
)

from tests.conftest import Tenant
from tests.stores.helpers import MakeMemory

_ROWS_IN_ORDER = (
    f"SELECT {CANDIDATE_COLUMNS}, m.content AS label FROM memories AS m {USAGE_JOIN}"
    " WHERE m.org_id = $1 AND m.agent_id = $2 ORDER BY m.content DESC"
)


async def test_a_search_s_rows_become_columns_in_their_order(
    pg_store: PostgresMemoryStore, make_memory: MakeMemory, tenant: Tenant
) -> None:
    counts = {"o200k_base": 7, "o200k_base/xml": 9}
    memories = [
        make_memory(f"fact {c}", token_counts=counts, confidence=0.25 * i) for i, c in enumerate("abc")
    ]
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, memories)
    await pg_store.record_injections(
        [InjectionRecord(tenant.org_id, tenant.agent_id, memories[1].id, time.time())]
    )
    org, agent = uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id)
    decoder = TokenCountsDecoder()

    row = await pg_store.pool.fetchrow(as_arrays(_ROWS_IN_ORDER, ["label"]), org, agent)
    (labels,), candidates = candidate_columns(list(row.values()), decoder)

    assert list(candidates.ids) == [memories[2].id, memories[1].id, memories[0].id]  # the rows' order kept
    assert labels == ["fact c", "fact b", "fact a"]  # further columns come back as arrays
    np.testing.assert_array_equal(candidates.confidence, [0.5, 0.25, 0.0])
    np.testing.assert_array_equal(candidates.retrieval_counts, [0, 1, 0])
    injected = candidates.last_injected_at
    assert math.isnan(injected[0]) and math.isnan(injected[2]) and injected[1] > 0  # NaN: never injected
    # Equal token counts decode once and are shared, read-only.
    assert candidates.token_counts[0] == counts and candidates.token_counts[0] is candidates.token_counts[2]
    assert all(np.isnan(candidates.similarity)) and all(np.isnan(candidates.lexical_score))
    assert set(candidates.sources.tolist()) == {int(Source.COLD)}


async def test_no_rows_aggregate_to_one_row_of_nulls(pg_store: PostgresMemoryStore, tenant: Tenant) -> None:
    row = await pg_store.pool.fetchrow(
        as_arrays(_ROWS_IN_ORDER, ["label"]), uuid.UUID(tenant.org_id), uuid.UUID(tenant.agent_id)
    )
    assert row is not None and all(value is None for value in row.values())


async def test_a_memory_row_becomes_a_record_with_its_similarity(
    pg_store: PostgresMemoryStore, make_memory: MakeMemory, tenant: Tenant
) -> None:
    memory = make_memory("the harbour opens at six", occurred_at=1_700_000_000.5)
    await pg_store.upsert_memories(tenant.org_id, tenant.agent_id, [memory])
    row = await pg_store.pool.fetchrow(
        f"SELECT {MEMORY_COLUMNS}, m.embedding, 0.25::float8 AS distance FROM memories AS m {USAGE_JOIN}"
        " WHERE m.org_id = $1 AND m.agent_id = $2",
        uuid.UUID(tenant.org_id),
        uuid.UUID(tenant.agent_id),
    )

    plain = record(row, TokenCountsDecoder())
    with_vector = record(row, TokenCountsDecoder(), with_embedding=True)

    assert (plain.id, plain.content, plain.retrieval_count) == (memory.id, memory.content, 0)
    assert plain.occurred_at == 1_700_000_000.5 and plain.last_injected_at is None
    assert plain.similarity == 0.75 and plain.source is Source.COLD
    assert plain.embedding is None and with_vector.embedding is not None
    np.testing.assert_allclose(with_vector.embedding, memory.embedding, atol=1e-6)
