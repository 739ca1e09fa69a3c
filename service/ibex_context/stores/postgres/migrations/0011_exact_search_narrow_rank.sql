-- The exact plan ranks the agent's memories on narrow rows (id + distance), then reads
-- the winners' columns by primary key (issue 14: the stores' CPU per call).
--
-- 0008's ibex_cold_exact carried content, category, confidence, usefulness, the times
-- and token_counts of every one of the agent's rows into the top-N sort, to keep 50 of
-- them. Per search of a 1,000-memory agent that was a third to a half of the backend's
-- CPU for the statement (benchmarks/results/stores-cpu-2026-11-26.md); the hot-set read
-- learned the same (stores/postgres.py, _HOT_SET_SQL).
--
-- The ranking is 0008's, unchanged: the same rows, in the same order, through the same
-- plan (the agent's rows by its index, sorted by distance + 0 so the planner cannot
-- swap in the HNSW graph), with only the id kept. Each winner's row is then read by the
-- primary key, one LATERAL look-up each (LIMIT 1: the id is unique; a nested loop keeps
-- the ranking's order). Same answers, columns and order as 0008's: compared on 300
-- questions of the load test's data set, and in tests/stores/test_migrate.py.
CREATE OR REPLACE FUNCTION ibex_cold_exact(p_org uuid, p_agent uuid, p_query vector, p_limit integer)
RETURNS TABLE (id uuid, content text, category text, confidence real, usefulness real,
               occurred_at timestamptz, created_at timestamptz, token_counts jsonb, distance double precision)
LANGUAGE sql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
    SELECT m.id, m.content, m.category, m.confidence, m.usefulness, m.occurred_at, m.created_at,
           m.token_counts, nearest.distance
    FROM (
        SELECT r.id, r.embedding <=> p_query AS distance
        FROM memories AS r
        WHERE r.org_id = p_org AND r.agent_id = p_agent
        ORDER BY (r.embedding <=> p_query) + 0
        LIMIT p_limit
    ) AS nearest
    CROSS JOIN LATERAL (
        SELECT w.id, w.content, w.category, w.confidence, w.usefulness, w.occurred_at, w.created_at,
               w.token_counts
        FROM memories AS w
        WHERE w.org_id = p_org AND w.agent_id = p_agent AND w.id = nearest.id
        LIMIT 1
    ) AS m
$$;
