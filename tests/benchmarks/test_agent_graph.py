"""``benchmarks.agent_graph``: each kind of graph it measures is built and searched for real."""

from __future__ import annotations

import asyncpg
import numpy as np
import pytest
from ibex_context.stores.postgres.pool import create_pool

from benchmarks.agent_graph import (
    FULL_PRECISION_GRAPH,
    SERVICE_GRAPH,
    DataSet,
    Index,
    ensure_table,
    exact_top,
    measure,
)

GRAPHS = {
    "vector": FULL_PRECISION_GRAPH,
    "halfvec": SERVICE_GRAPH,
    "bit": Index("hnsw", "m = 16, ef_construction = 64", "hnsw.ef_search", quantised="bit", rerank=400),
}


def _data(rows: int = 600, dim: int = 32) -> DataSet:
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((rows, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    questions = vectors[:20] + 0.1 * rng.standard_normal((20, dim)).astype(np.float32)
    return DataSet(
        "tiny", "tiny", vectors, questions / np.linalg.norm(questions, axis=1, keepdims=True), "", ""
    )


@pytest.mark.parametrize("kind", sorted(GRAPHS))
async def test_each_graph_is_built_on_its_expression_and_its_search_walks_it(
    private_postgres_dsn: str, kind: str
) -> None:
    index, data = GRAPHS[kind], _data()
    conn = await asyncpg.connect(private_postgres_dsn)
    try:
        assert await ensure_table(conn, data, index, "64MB") is not None  # built now
        table = f"{data.name}_{index.tag}"
        definition = await conn.fetchval("SELECT indexdef FROM pg_indexes WHERE tablename = $1", table)
        expected = {"vector": "vector_cosine_ops", "halfvec": "halfvec_cosine_ops", "bit": "bit_hamming_ops"}
        assert expected[kind] in definition
        await conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in await conn.fetch(
                f"EXPLAIN {index.statement(table, data.vectors.shape[1])}",
                f"[{','.join(map(str, data.questions[0]))}]",
            )
        )
        assert "Index Scan using" in plan, plan
        assert await ensure_table(conn, data, index, "64MB") is None  # kept for later runs
    finally:
        await conn.close()
    pool = await create_pool(private_postgres_dsn, min_size=1, max_size=1, ef_search=40)
    try:
        found = await measure(pool, data, index, exact_top(data), 400)
    finally:
        await pool.close()
    # 600 rows at ef_search 400: the walk sees nearly all; the bits' 400 nearest by Hamming
    # distance (32 bits: many ties) are re-ranked exactly.
    assert found.recall_mean >= (0.8 if kind == "bit" else 0.95), found
