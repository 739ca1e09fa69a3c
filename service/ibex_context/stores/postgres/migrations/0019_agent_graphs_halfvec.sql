-- Large agents' own graphs index their vectors in half precision (issue 40).
--
-- An agent's own graph (0013) held its vectors as stored, 1,536 bytes each at 384
-- dimensions. A graph built from now on (stores.postgres.graphs) indexes
-- embedding::halfvec instead, and links each vector to more neighbours (m 48,
-- ef_construction 256 against 32 / 128): on 100k MiniLM memories of one agent the
-- graph is 164 MB against 212 MB, and at ef_search 200 its top 50 hold 0.978 of the
-- exact top 50 (p5 0.90) in 8.3 ms, where the old graph held 0.943 (p5 0.72) in
-- 7.0 ms and needed ef_search 400 (13.7 ms) for 0.969 / 0.84
-- (benchmarks/results/large-agents-2026-12-06.md, ADR-0015).
--
-- The half-precision distance only orders the walk: each winner's distance is computed
-- again from its stored vector, so scoring sees the same similarity as on every plan.
--
-- Graphs built before this migration stay as they are and are still searched through
-- ibex_cold_agent; agent_graphs.halfvec says which kind each agent has (set when its
-- build finishes), and the store picks the function from it (stores.cold_plan). During a
-- rollout a process of the previous build searches a new graph's agent through
-- ibex_cold_agent, which cannot use a halfvec index: it walks the partition's graph, as
-- before the agent had one of its own (slower, still the agent's nearest memories), until
-- the process is replaced.

ALTER TABLE agent_graphs ADD COLUMN IF NOT EXISTS halfvec boolean NOT NULL DEFAULT false;

-- As ibex_cold_agent (0013, 0018): the tenant as literals, so the planner proves the
-- partial index's predicate and prunes the partition; only a graph can order the rows.
CREATE OR REPLACE FUNCTION ibex_cold_agent_halfvec(p_org uuid, p_agent uuid, p_query vector, p_limit integer)
RETURNS TABLE (id uuid, content text, category text, confidence real, usefulness real,
               occurred_at timestamptz, created_at timestamptz, token_counts jsonb, distance double precision,
               embedding vector)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY EXECUTE format(
        'SELECT m.id, m.content, m.category, m.confidence, m.usefulness, m.occurred_at, m.created_at,'
        '       m.token_counts, m.embedding <=> $1, m.embedding'
        ' FROM memories AS m WHERE m.org_id = %L::uuid AND m.agent_id = %L::uuid'
        ' ORDER BY m.embedding::halfvec({embedding_dim}) <=> $1::halfvec({embedding_dim}) LIMIT $2',
        p_org, p_agent)
    USING p_query, p_limit;
END
$$;

-- Its row-of-arrays functions, as 0015's and 0018's for the other plans.
CREATE OR REPLACE FUNCTION ibex_cold_agent_halfvec_arrays(p_org uuid, p_agent uuid, p_query vector, p_limit integer)
RETURNS TABLE (id text[], content text[], category text[], confidence real[], usefulness real[],
               retrieval_count integer[], occurred_at double precision[],
               last_injected_at double precision[], token_counts text[], distance double precision[])
LANGUAGE sql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
    SELECT array_agg(r.id), array_agg(r.content), array_agg(r.category), array_agg(r.confidence),
           array_agg(r.usefulness), array_agg(r.retrieval_count), array_agg(r.occurred_at),
           array_agg(r.last_injected_at), array_agg(r.token_counts), array_agg(r.distance)
    FROM (
        SELECT m.id::text AS id, m.content, m.category, m.confidence, m.usefulness,
               coalesce(u.retrieval_count, 0) AS retrieval_count,
               extract(epoch FROM coalesce(m.occurred_at, m.created_at))::float8 AS occurred_at,
               coalesce(extract(epoch FROM u.last_injected_at)::float8, 'NaN') AS last_injected_at,
               m.token_counts::text AS token_counts, m.distance
        FROM ibex_cold_agent_halfvec(p_org, p_agent, p_query, p_limit) AS m
        LEFT JOIN LATERAL (
            SELECT retrieval_count, last_injected_at FROM memory_usage
            WHERE org_id = p_org AND agent_id = p_agent AND memory_id = m.id
            LIMIT 1
        ) AS u ON true
    ) AS r
$$;

CREATE OR REPLACE FUNCTION ibex_cold_agent_halfvec_arrays_with_vectors(
    p_org uuid, p_agent uuid, p_query vector, p_limit integer)
RETURNS TABLE (id text[], content text[], category text[], confidence real[], usefulness real[],
               retrieval_count integer[], occurred_at double precision[],
               last_injected_at double precision[], token_counts text[], distance double precision[],
               embedding bytea[])
LANGUAGE sql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
    SELECT array_agg(r.id), array_agg(r.content), array_agg(r.category), array_agg(r.confidence),
           array_agg(r.usefulness), array_agg(r.retrieval_count), array_agg(r.occurred_at),
           array_agg(r.last_injected_at), array_agg(r.token_counts), array_agg(r.distance),
           array_agg(r.embedding)
    FROM (
        SELECT m.id::text AS id, m.content, m.category, m.confidence, m.usefulness,
               coalesce(u.retrieval_count, 0) AS retrieval_count,
               extract(epoch FROM coalesce(m.occurred_at, m.created_at))::float8 AS occurred_at,
               coalesce(extract(epoch FROM u.last_injected_at)::float8, 'NaN') AS last_injected_at,
               m.token_counts::text AS token_counts, m.distance, vector_send(m.embedding) AS embedding
        FROM ibex_cold_agent_halfvec(p_org, p_agent, p_query, p_limit) AS m
        LEFT JOIN LATERAL (
            SELECT retrieval_count, last_injected_at FROM memory_usage
            WHERE org_id = p_org AND agent_id = p_agent AND memory_id = m.id
            LIMIT 1
        ) AS u ON true
    ) AS r
$$;
