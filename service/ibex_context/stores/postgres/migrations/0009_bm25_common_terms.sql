-- The lexical search's cost bounded by its rarest words (issue 13's finding): ibex_bm25
-- (0005) read every posting of every query word, so one question to a 100k-memory agent
-- read 77k-197k postings and took 350-1,050 ms (ADR-0009). A word held by more than
-- p_max_df of the agent's memories is now left out of the ranking: its inverse document
-- frequency is low (at 2,000 of 100k memories, ln(1 + 49) = 3.9 against ~11 for a word
-- of one memory), and reading its postings costs more than the rest of the call.
--
-- * Whether a word is that common is found by reading at most p_max_df + 1 of its
--   postings, so one word costs at most that many index entries.
-- * An agent of at most p_max_df memories has no such word: the count is skipped and it
--   ranks exactly as before.
-- * The query's words, then the words kept, are MATERIALIZED: the plan is generic (built
--   once per session), and with the CTEs inlined a session that first ran on a freshly
--   loaded database folded the count into the postings join and kept that plan (754 of
--   the LoCoMo benchmark's 760 lexical searches timed out at its first budget).
--   Postings are only ever read by (org, agent, lexeme): sequential scans are off.
DROP FUNCTION IF EXISTS ibex_bm25(uuid, uuid, text, integer);

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
