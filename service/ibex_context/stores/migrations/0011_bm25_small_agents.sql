-- ibex_bm25 (0010) without the per-word count for agents that cannot reach the bound:
-- an agent holding at most p_max_df memories has no word held by more, so counting each
-- query word's postings first (then reading them again) only doubled the postings read.
-- The agent's size comes from memory_stats, read once per search.
CREATE OR REPLACE FUNCTION ibex_bm25(
    p_org uuid, p_agent uuid, p_query text, p_limit integer, p_max_df integer DEFAULT 2000
)
RETURNS TABLE (memory_id uuid, bm25 double precision)
LANGUAGE sql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
    WITH stats AS MATERIALIZED (
        SELECT greatest(s.memories, 1)::float8 AS n,
               greatest(s.lexemes::float8 / greatest(s.memories, 1), 1.0) AS avgdl,
               s.memories AS memories
        FROM memory_stats AS s WHERE s.org_id = p_org AND s.agent_id = p_agent
    ), terms AS MATERIALIZED (
        SELECT DISTINCT lexeme FROM unnest(to_tsvector('english', p_query))
    ), searched AS MATERIALIZED (
        SELECT terms.lexeme FROM terms
        WHERE (SELECT coalesce(max(stats.memories), 0) FROM stats) <= p_max_df
           OR (
            SELECT count(*) FROM (
                SELECT 1 FROM memory_terms AS p
                WHERE p.org_id = p_org AND p.agent_id = p_agent AND p.lexeme = terms.lexeme
                LIMIT p_max_df + 1
            ) AS held
        ) <= p_max_df
    ), postings AS (
        SELECT p.memory_id, p.tf::float8 AS tf, p.dl::float8 AS dl,
               count(*) OVER (PARTITION BY p.lexeme)::float8 AS df
        FROM searched
        JOIN memory_terms AS p ON p.org_id = p_org AND p.agent_id = p_agent AND p.lexeme = searched.lexeme
    )
    SELECT postings.memory_id,
           sum(ln(1 + (stats.n - postings.df + 0.5) / (postings.df + 0.5)) * postings.tf * 2.2
               / (postings.tf + 1.2 * (0.25 + 0.75 * postings.dl / stats.avgdl))) AS bm25
    FROM postings CROSS JOIN stats
    GROUP BY postings.memory_id
    ORDER BY bm25 DESC, postings.memory_id
    LIMIT p_limit
$$;
