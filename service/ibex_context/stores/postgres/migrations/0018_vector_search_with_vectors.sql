-- The vector search with the winners' vectors (issue 42: the static table as a first stage).
--
-- With IBEX_EMBEDDING_QUERY_MODEL=static-first the vector search starts at once with the
-- static table's query vector, and MiniLM's vector, when it comes in time, scores the
-- memories that search found: from their stored vectors, as scoring does for the hot set
-- and the lexical search's rows.
--
-- Each plan's function (0011 exact, 0008 hnsw, 0013 agent) already reads each winner's
-- row; it now returns the row's vector too, as a last column. The ranking, the plans and
-- the columns before it are theirs, unchanged (a function's columns cannot change in
-- place: each is dropped and created again in this migration's transaction). 0015's
-- functions select their columns by name, so they, and a process of the previous build
-- calling them during a rollout, read the same rows as before. For each plan a second
-- row-of-arrays function, 0015's with the vectors in pgvector's binary form
-- (vector_send) in the winners' order: what a search that asks for vectors calls.
-- Sending a vector that was not asked for costs nothing: the plain functions leave it out.

DROP FUNCTION ibex_cold_exact(uuid, uuid, vector, integer);
CREATE FUNCTION ibex_cold_exact(p_org uuid, p_agent uuid, p_query vector, p_limit integer)
RETURNS TABLE (id uuid, content text, category text, confidence real, usefulness real,
               occurred_at timestamptz, created_at timestamptz, token_counts jsonb, distance double precision,
               embedding vector)
LANGUAGE sql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
    SELECT m.id, m.content, m.category, m.confidence, m.usefulness, m.occurred_at, m.created_at,
           m.token_counts, nearest.distance, m.embedding
    FROM (
        SELECT r.id, r.embedding <=> p_query AS distance
        FROM memories AS r
        WHERE r.org_id = p_org AND r.agent_id = p_agent
        ORDER BY (r.embedding <=> p_query) + 0
        LIMIT p_limit
    ) AS nearest
    CROSS JOIN LATERAL (
        SELECT w.id, w.content, w.category, w.confidence, w.usefulness, w.occurred_at, w.created_at,
               w.token_counts, w.embedding
        FROM memories AS w
        WHERE w.org_id = p_org AND w.agent_id = p_agent AND w.id = nearest.id
        LIMIT 1
    ) AS m
$$;

DROP FUNCTION ibex_cold_hnsw(uuid, uuid, vector, integer);
CREATE FUNCTION ibex_cold_hnsw(p_org uuid, p_agent uuid, p_query vector, p_limit integer)
RETURNS TABLE (id uuid, content text, category text, confidence real, usefulness real,
               occurred_at timestamptz, created_at timestamptz, token_counts jsonb, distance double precision,
               embedding vector)
LANGUAGE sql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
    SELECT m.id, m.content, m.category, m.confidence, m.usefulness, m.occurred_at, m.created_at,
           m.token_counts, m.embedding <=> p_query, m.embedding
    FROM memories AS m
    WHERE m.org_id = p_org AND m.agent_id = p_agent
    ORDER BY m.embedding <=> p_query
    LIMIT p_limit
$$;

DROP FUNCTION ibex_cold_agent(uuid, uuid, vector, integer);
CREATE FUNCTION ibex_cold_agent(p_org uuid, p_agent uuid, p_query vector, p_limit integer)
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
        ' ORDER BY m.embedding <=> $1 LIMIT $2',
        p_org, p_agent)
    USING p_query, p_limit;
END
$$;

DO $migration$
DECLARE
    plan text;
BEGIN
    FOREACH plan IN ARRAY ARRAY['exact', 'hnsw', 'agent'] LOOP
        EXECUTE format($function$
CREATE OR REPLACE FUNCTION %1$I(p_org uuid, p_agent uuid, p_query vector, p_limit integer)
RETURNS TABLE (id text[], content text[], category text[], confidence real[], usefulness real[],
               retrieval_count integer[], occurred_at double precision[],
               last_injected_at double precision[], token_counts text[], distance double precision[],
               embedding bytea[])
LANGUAGE sql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $body$
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
        FROM %2$I(p_org, p_agent, p_query, p_limit) AS m
        LEFT JOIN LATERAL (
            SELECT retrieval_count, last_injected_at FROM memory_usage
            WHERE org_id = p_org AND agent_id = p_agent AND memory_id = m.id
            LIMIT 1
        ) AS u ON true
    ) AS r
$body$
$function$, 'ibex_cold_' || plan || '_arrays_with_vectors', 'ibex_cold_' || plan);
    END LOOP;
END
$migration$;
