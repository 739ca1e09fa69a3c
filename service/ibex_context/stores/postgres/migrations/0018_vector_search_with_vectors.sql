-- The vector search with the winners' vectors (issue 42: the static table as a first stage).
--
-- With IBEX_EMBEDDING_QUERY_MODEL=static-then-minilm the vector search starts at once with
-- the static table's query vector, and MiniLM's vector, when it comes in time, scores the
-- memories that search found: from their stored vectors, as scoring does for the hot set and
-- the lexical search's rows. So for each plan a function returning 0015's row of arrays
-- plus the winners' vectors in pgvector's binary form (vector_send), in the same order.
--
-- It reads 0015's function, so the ranking, the columns and their order have one
-- definition; each winner's vector is one probe by the full primary key, the row the
-- search has just read. The other searches are unchanged, and a process of the previous
-- build never calls these.
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
    SELECT a.id, a.content, a.category, a.confidence, a.usefulness, a.retrieval_count,
           a.occurred_at, a.last_injected_at, a.token_counts, a.distance,
           (SELECT array_agg(vector_send(m.embedding) ORDER BY w.ord)
            FROM unnest(a.id) WITH ORDINALITY AS w(id, ord)
            CROSS JOIN LATERAL (
                SELECT embedding FROM memories
                WHERE org_id = p_org AND agent_id = p_agent AND id = w.id::uuid
                LIMIT 1
            ) AS m)
    FROM %2$I(p_org, p_agent, p_query, p_limit) AS a
$body$
$function$, 'ibex_cold_' || plan || '_arrays_with_vectors', 'ibex_cold_' || plan || '_arrays');
    END LOOP;
END
$migration$;
