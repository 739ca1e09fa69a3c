-- The request path's two search statements planned once per connection (issue 26,
-- deliverable 3: the stores' CPU per call).
--
-- The pool runs every statement with plan_cache_mode = force_custom_plan (ADR-0003), so
-- the statements around the search functions -- each winner's usage look-up, for the
-- lexical search each winner's row by primary key, and the aggregation into one row of
-- arrays -- were planned again on every call: ~8 % of the vector statement's backend CPU
-- and ~13 % of the lexical one's (perf, 100 x 1k; benchmarks/results/stores-2026-12-05.md).
-- Their plan cannot depend on the agent's size: the nearest rows come from the plan's
-- function (0008, 0011, 0013: ibex_cold_exact / ibex_cold_hnsw / ibex_cold_agent, which
-- the service chooses by the agent's memory count) or from ibex_bm25 (0012), each with its
-- plan fixed by its own settings, and every other relation is read by its full primary
-- key, one LATERAL ... LIMIT 1 probe per winner (a nested loop whatever the estimates).
--
-- So each statement moves into a SQL function whose settings make its plan generic
-- (built once per connection, on the first call: the pool's warm-up). Sequential scans
-- are off so that no statistics (an empty table on a fresh install) can turn a probe into
-- a scan; bitmap scans stay as the caller has them (ibex_cold_exact's ranking uses one,
-- and a function inherits its caller's settings for those it does not set itself). The
-- caller's statement is then a bare function call: its custom plan costs little. Rows,
-- columns and order are the statements' of stores/postgres/searches.py before this
-- migration (SEARCH_SQL, LEXICAL_SQL, aggregated by rows.as_arrays; tested equal in
-- tests/stores/postgres/test_search_functions.py).

-- The vector search through each plan's function: one row of arrays (NULLs: no rows).
DO $migration$
DECLARE
    plan text;
BEGIN
    FOREACH plan IN ARRAY ARRAY['exact', 'hnsw', 'agent'] LOOP
        EXECUTE format($function$
CREATE OR REPLACE FUNCTION %1$I(p_org uuid, p_agent uuid, p_query vector, p_limit integer)
RETURNS TABLE (id text[], content text[], category text[], confidence real[], usefulness real[],
               retrieval_count integer[], occurred_at double precision[],
               last_injected_at double precision[], token_counts text[], distance double precision[])
LANGUAGE sql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $body$
    SELECT array_agg(r.id), array_agg(r.content), array_agg(r.category), array_agg(r.confidence),
           array_agg(r.usefulness), array_agg(r.retrieval_count), array_agg(r.occurred_at),
           array_agg(r.last_injected_at), array_agg(r.token_counts), array_agg(r.distance)
    FROM (
        SELECT m.id::text AS id, m.content, m.category, m.confidence, m.usefulness,
               coalesce(u.retrieval_count, 0) AS retrieval_count,
               extract(epoch FROM coalesce(m.occurred_at, m.created_at))::float8 AS occurred_at,
               coalesce(extract(epoch FROM u.last_injected_at)::float8, 'NaN') AS last_injected_at,
               m.token_counts::text AS token_counts, m.distance
        FROM %2$I(p_org, p_agent, p_query, p_limit) AS m
        LEFT JOIN LATERAL (
            SELECT retrieval_count, last_injected_at FROM memory_usage
            WHERE org_id = p_org AND agent_id = p_agent AND memory_id = m.id
            LIMIT 1
        ) AS u ON true
    ) AS r
$body$
$function$, 'ibex_cold_' || plan || '_arrays', 'ibex_cold_' || plan);
    END LOOP;
END
$migration$;

-- The lexical search: ibex_bm25's winners, best first, each one's row by primary key
-- (with its vector in pgvector's binary form) and its usage; one row of arrays.
CREATE OR REPLACE FUNCTION ibex_bm25_arrays(p_org uuid, p_agent uuid, p_query text, p_limit integer)
RETURNS TABLE (id text[], content text[], category text[], confidence real[], usefulness real[],
               retrieval_count integer[], occurred_at double precision[],
               last_injected_at double precision[], token_counts text[], bm25 double precision[],
               embedding bytea[])
LANGUAGE sql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
    SELECT array_agg(r.id), array_agg(r.content), array_agg(r.category), array_agg(r.confidence),
           array_agg(r.usefulness), array_agg(r.retrieval_count), array_agg(r.occurred_at),
           array_agg(r.last_injected_at), array_agg(r.token_counts), array_agg(r.bm25),
           array_agg(r.embedding)
    FROM (
        SELECT m.id::text AS id, m.content, m.category, m.confidence, m.usefulness,
               coalesce(u.retrieval_count, 0) AS retrieval_count,
               extract(epoch FROM coalesce(m.occurred_at, m.created_at))::float8 AS occurred_at,
               coalesce(extract(epoch FROM u.last_injected_at)::float8, 'NaN') AS last_injected_at,
               m.token_counts::text AS token_counts, top.bm25, vector_send(m.embedding) AS embedding
        FROM ibex_bm25(p_org, p_agent, p_query, p_limit) AS top
        CROSS JOIN LATERAL (
            SELECT id, content, category, confidence, usefulness, occurred_at, created_at, token_counts,
                   embedding
            FROM memories WHERE org_id = p_org AND agent_id = p_agent AND id = top.memory_id
            LIMIT 1
        ) AS m
        LEFT JOIN LATERAL (
            SELECT retrieval_count, last_injected_at FROM memory_usage
            WHERE org_id = p_org AND agent_id = p_agent AND memory_id = m.id
            LIMIT 1
        ) AS u ON true
        ORDER BY top.bm25 DESC, m.id
    ) AS r
$$;
