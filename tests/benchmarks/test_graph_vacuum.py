"""``benchmarks.graph_vacuum``: an arm replaces its rows and vacuums its graph for real."""

from __future__ import annotations

import asyncpg
import numpy as np

from benchmarks.graph_vacuum import load_rows, run_arm, table


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


async def test_an_arm_replaces_its_share_of_rows_in_steps_and_vacuums_after_each(
    private_postgres_dsn: str,
) -> None:
    rng = np.random.default_rng(5)
    vectors = _unit(rng.standard_normal((360, 32)))
    questions = _unit(vectors + 0.1 * rng.standard_normal(vectors.shape))
    conn = await asyncpg.connect(private_postgres_dsn)
    try:
        await load_rows(conn, vectors)
        arm = await run_arm(
            conn,
            vectors,
            questions,
            memories=300,
            churn=60,
            cycles=3,
            seed=1,
            graph_options="m = 8, ef_construction = 32",
        )
        # As many rows as before, the new ones drawn from the next 60 rows (a step may delete
        # an earlier step's), none dead after the last vacuum.
        assert await conn.fetchval("SELECT count(*) FROM agent") == 300
        assert 40 <= await conn.fetchval("SELECT count(*) FROM agent WHERE id >= 300") <= 60
        assert await conn.fetchval("SELECT max(id) FROM agent") < 360
        assert await conn.fetchval("SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'agent'") in (
            0,
            None,
        )
        definition = await conn.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'agent' AND indexdef LIKE '%hnsw%'"
        )
        assert "halfvec_cosine_ops" in definition
    finally:
        await conn.close()
    assert (arm.cycles, arm.rows_each, len(arm.vacuum_cpu_s)) == (3, 20, 3)
    assert all(0.0 <= share <= 1.0 for share in (*arm.recall_before_last_vacuum, *arm.recall_after))
    # A graph this small finds nearly all of the exact top 50.
    assert arm.recall_after[0] > 0.8
    assert table([arm])[-1].startswith("| 3 x 20 |")


async def test_an_arm_may_rebuild_the_graph_before_each_vacuum(private_postgres_dsn: str) -> None:
    rng = np.random.default_rng(6)
    vectors = _unit(rng.standard_normal((240, 16)))
    conn = await asyncpg.connect(private_postgres_dsn)
    try:
        await load_rows(conn, vectors)
        arm = await run_arm(
            conn,
            vectors,
            vectors,
            memories=200,
            churn=40,
            cycles=2,
            seed=2,
            graph_options="m = 8, ef_construction = 32",
            reindex_first=True,
        )
        assert await conn.fetchval("SELECT count(*) FROM agent") == 200
    finally:
        await conn.close()
    assert arm.reindex_first and len(arm.vacuum_cpu_s) == 2
    assert "each after a rebuild" in table([arm])[-1]
