-- A graph of its own for each large agent (issue 26): the vector search's cost no longer
-- depends on the other tenants of its partition.
--
-- Since 0008 an agent larger than cold_exact_max_memories is searched through its hash
-- partition's HNSW graph, which holds every agent of that partition: the walk filters
-- the others' rows out as it goes (iterative scan), so its cost and recall depend on
-- who shares the partition (a 10k-memory agent ~11.7 ms; single questions at recall
-- 0.10 in the 100 x 10k shape, benchmarks/results/shapes-2026-11-26.md).
--
-- Now such an agent gets a partial HNSW index on its partition whose predicate is its
-- tenant key, built CONCURRENTLY (writes and searches go on) when the store sees it grow
-- past the threshold (stores.postgres.graphs). agent_graphs records each: ``ready`` once
-- the build has finished and the index is valid. Until then the agent keeps the
-- partition's graph. Small agents keep the exact scan.

CREATE TABLE IF NOT EXISTS agent_graphs (
    org_id       uuid        NOT NULL,
    agent_id     uuid        NOT NULL,
    -- memories_agent_<16 hex digits of a hash of the tenant>: no tenant id in a name.
    index_name   text        NOT NULL UNIQUE,
    ready        boolean     NOT NULL DEFAULT false,
    requested_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (org_id, agent_id)
);

-- The agent's own graph: the query names the tenant as literals, so the planner can prove
-- the partial index's predicate and the partition is pruned at plan time; a generic plan
-- (parameters) could use neither. EXECUTE plans each call (~0.2-0.5 ms). Sort, sequential
-- and bitmap scans are off so the only ordered path is a graph; of the two graphs that
-- apply, the agent's is the smaller, the cheaper by pgvector's estimate (tested).
CREATE OR REPLACE FUNCTION ibex_cold_agent(p_org uuid, p_agent uuid, p_query vector, p_limit integer)
RETURNS TABLE (id uuid, content text, category text, confidence real, usefulness real,
               occurred_at timestamptz, created_at timestamptz, token_counts jsonb, distance double precision)
LANGUAGE plpgsql STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
BEGIN
    RETURN QUERY EXECUTE format(
        'SELECT m.id, m.content, m.category, m.confidence, m.usefulness, m.occurred_at, m.created_at,'
        '       m.token_counts, m.embedding <=> $1'
        ' FROM memories AS m WHERE m.org_id = %L::uuid AND m.agent_id = %L::uuid'
        ' ORDER BY m.embedding <=> $1 LIMIT $2',
        p_org, p_agent)
    USING p_query, p_limit;
END
$$;
