-- The lexical search with a bounded cost per query, whatever the agent's size, and a
-- plan that the table's statistics cannot change (issue 26).
--
-- Before: ibex_bm25 (0009) joined the query's lexemes to the agent's postings and
-- counted each lexeme's postings per query for its document frequency. Its generic
-- plan was chosen from the postings' statistics: on rows written since the last
-- ANALYZE (estimate: 1 row) it read ALL of the agent's postings (8,409 for a
-- 675-memory agent, 13-24 ms instead of ~1 ms), and a common word of a 10k-memory
-- agent read up to 2,001 postings just to be counted.
--
-- Now:
-- * memory_lexicon keeps each agent's document frequency per lexeme, kept by the same
--   statement triggers as the postings: read by primary key, never counted.
-- * memory_terms' key orders each lexeme's postings by their BM25 weight at a
--   reference length (impact_order, derived from tf and dl): a search reads at most
--   p_term_postings of each lexeme, best first, by an explicit per-lexeme LATERAL
--   probe. A LATERAL subquery with LIMIT can only run as one index range scan per
--   lexeme, whatever the estimates. The score is computed exactly from tf, dl, df and
--   the agent's current average length; only which postings of a common word are read
--   is approximate. Against exact BM25 on the LoCoMo dev set the top 50 overlap
--   0.999 per conversation and 0.970 with all five as one 2,760-memory agent at 500
--   per word (0.969 / 0.846 at 200; benchmarks/results/lexical_overlap-2026-11-28.md).
-- * No word is skipped: skipping the words held by most memories (speakers' names in
--   LoCoMo) dropped the overlap to 0.60, and the bound already caps their cost.
--
-- Migrating rewrites memory_terms (a new stored column) and rebuilds its key, writes
-- wait meanwhile; the rewritten pages are then vacuumed (all-visible again, so the
-- searches' index-only scans read no heap page):
-- after commit: VACUUM (ANALYZE) memory_terms
-- after commit: VACUUM (ANALYZE) memory_lexicon

-- 10000 minus the posting's BM25 term weight (k1 = 1.2, b = 0.75) at a reference
-- document length of 16 lexemes, scaled to 0..10000: ascending = best first. A function
-- of tf and dl alone, so a posting's key can be computed from the memory's lexemes (the
-- triggers' deletes probe by it). For the usual tf = 1 it orders by length, as the real
-- weight does at any average length.
CREATE OR REPLACE FUNCTION ibex_posting_order(tf smallint, dl smallint) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT (10000 - round(10000 * tf / (tf + 1.2 * (0.25 + 0.75 * dl / 16.0))))::smallint $$;

ALTER TABLE memory_terms
    ADD COLUMN IF NOT EXISTS impact_order smallint GENERATED ALWAYS AS (ibex_posting_order(tf, dl)) STORED;
ALTER TABLE memory_terms DROP CONSTRAINT IF EXISTS memory_terms_pkey;
ALTER TABLE memory_terms ADD CONSTRAINT memory_terms_pkey
    PRIMARY KEY (org_id, agent_id, lexeme, impact_order, memory_id) INCLUDE (tf, dl);

-- Index-only scans stay index-only when the visibility map is current: vacuum after
-- every ~2k new postings plus 0.2 % of the table (default: 1,000 + 20 %), and after
-- 2 % dead postings (default 20 %); the plan no longer depends on statistics, analyse
-- at the default pace.
ALTER TABLE memory_terms SET (
    autovacuum_vacuum_insert_threshold = 2000,
    autovacuum_vacuum_insert_scale_factor = 0.002,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_scale_factor = 0.02
);

-- Each agent's document frequency per lexeme. df is not in the key, so its updates are
-- HOT (room left on each page for them).
CREATE TABLE IF NOT EXISTS memory_lexicon (
    org_id   uuid    NOT NULL,
    agent_id uuid    NOT NULL,
    lexeme   text    NOT NULL,
    df       integer NOT NULL,
    PRIMARY KEY (org_id, agent_id, lexeme)
) WITH (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.05);

INSERT INTO memory_lexicon (org_id, agent_id, lexeme, df)
SELECT org_id, agent_id, lexeme, count(*) FROM memory_terms GROUP BY org_id, agent_id, lexeme
ON CONFLICT (org_id, agent_id, lexeme) DO UPDATE SET df = EXCLUDED.df;

-- 0005's trigger function, with the postings' deletes probing by their full key and the
-- lexicon kept: one upsert of each (agent, lexeme)'s change in document frequency per
-- statement, in key order (concurrent statements lock rows in the same order). A
-- lexeme whose df falls to 0 keeps its row (a search skips it).
CREATE OR REPLACE FUNCTION ibex_memory_stats_apply() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM memory_terms AS p
        USING (SELECT o.org_id, o.agent_id, t.lexeme, o.id,
                      ibex_posting_order(least(greatest(cardinality(t.positions), 1), 32767)::smallint,
                                         least(length(o.lexemes), 32767)::smallint) AS impact_order
               FROM old_rows AS o, unnest(o.lexemes) AS t) AS d
        WHERE p.org_id = d.org_id AND p.agent_id = d.agent_id AND p.lexeme = d.lexeme
          AND p.impact_order = d.impact_order AND p.memory_id = d.id;
    ELSIF TG_OP = 'UPDATE' THEN
        DELETE FROM memory_terms AS p
        USING (SELECT o.org_id, o.agent_id, t.lexeme, o.id,
                      ibex_posting_order(least(greatest(cardinality(t.positions), 1), 32767)::smallint,
                                         least(length(o.lexemes), 32767)::smallint) AS impact_order
               FROM old_rows AS o JOIN new_rows AS n
                 ON n.org_id = o.org_id AND n.agent_id = o.agent_id AND n.id = o.id
               CROSS JOIN LATERAL unnest(o.lexemes) AS t
               WHERE n.lexemes IS DISTINCT FROM o.lexemes) AS d
        WHERE p.org_id = d.org_id AND p.agent_id = d.agent_id AND p.lexeme = d.lexeme
          AND p.impact_order = d.impact_order AND p.memory_id = d.id;
        INSERT INTO memory_terms (org_id, agent_id, lexeme, memory_id, tf, dl)
        SELECT n.org_id, n.agent_id, t.lexeme, n.id,
               least(greatest(cardinality(t.positions), 1), 32767), least(length(n.lexemes), 32767)
        FROM new_rows AS n JOIN old_rows AS o ON o.org_id = n.org_id AND o.agent_id = n.agent_id AND o.id = n.id
        CROSS JOIN LATERAL unnest(n.lexemes) AS t
        WHERE n.lexemes IS DISTINCT FROM o.lexemes
        ON CONFLICT DO NOTHING;
    ELSE
        INSERT INTO memory_terms (org_id, agent_id, lexeme, memory_id, tf, dl)
        SELECT n.org_id, n.agent_id, t.lexeme, n.id,
               least(greatest(cardinality(t.positions), 1), 32767), least(length(n.lexemes), 32767)
        FROM new_rows AS n CROSS JOIN LATERAL unnest(n.lexemes) AS t
        ON CONFLICT DO NOTHING;
    END IF;
    -- The lexicon: +1 per new memory holding a lexeme, -1 per old one.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO memory_lexicon AS x (org_id, agent_id, lexeme, df)
        SELECT n.org_id, n.agent_id, t.lexeme, count(*)
        FROM new_rows AS n CROSS JOIN LATERAL unnest(n.lexemes) AS t
        GROUP BY n.org_id, n.agent_id, t.lexeme ORDER BY n.org_id, n.agent_id, t.lexeme
        ON CONFLICT (org_id, agent_id, lexeme) DO UPDATE SET df = x.df + EXCLUDED.df;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO memory_lexicon AS x (org_id, agent_id, lexeme, df)
        SELECT o.org_id, o.agent_id, t.lexeme, -count(*)
        FROM old_rows AS o CROSS JOIN LATERAL unnest(o.lexemes) AS t
        GROUP BY o.org_id, o.agent_id, t.lexeme ORDER BY o.org_id, o.agent_id, t.lexeme
        ON CONFLICT (org_id, agent_id, lexeme) DO UPDATE SET df = greatest(x.df + EXCLUDED.df, 0);
    ELSE
        INSERT INTO memory_lexicon AS x (org_id, agent_id, lexeme, df)
        SELECT c.org_id, c.agent_id, c.lexeme, sum(c.delta)
        FROM (
            SELECT n.org_id, n.agent_id, t.lexeme, 1 AS delta
            FROM new_rows AS n JOIN old_rows AS o ON o.org_id = n.org_id AND o.agent_id = n.agent_id AND o.id = n.id
            CROSS JOIN LATERAL unnest(n.lexemes) AS t
            WHERE n.lexemes IS DISTINCT FROM o.lexemes
            UNION ALL
            SELECT o.org_id, o.agent_id, t.lexeme, -1
            FROM old_rows AS o JOIN new_rows AS n ON n.org_id = o.org_id AND n.agent_id = o.agent_id AND n.id = o.id
            CROSS JOIN LATERAL unnest(o.lexemes) AS t
            WHERE n.lexemes IS DISTINCT FROM o.lexemes
        ) AS c
        GROUP BY c.org_id, c.agent_id, c.lexeme
        HAVING sum(c.delta) <> 0
        ORDER BY c.org_id, c.agent_id, c.lexeme
        ON CONFLICT (org_id, agent_id, lexeme) DO UPDATE SET df = greatest(x.df + EXCLUDED.df, 0);
    END IF;
    -- The agent's counts (0005): rows aggregated per agent, applied in key order.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO memory_stats AS s (org_id, agent_id, memories, lexemes)
        SELECT org_id, agent_id, count(*), coalesce(sum(length(lexemes)), 0)
        FROM new_rows GROUP BY org_id, agent_id ORDER BY org_id, agent_id
        ON CONFLICT (org_id, agent_id) DO UPDATE
            SET memories = s.memories + EXCLUDED.memories, lexemes = s.lexemes + EXCLUDED.lexemes;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE memory_stats AS s SET memories = s.memories - d.n, lexemes = s.lexemes - d.l
        FROM (SELECT org_id, agent_id, count(*) AS n, coalesce(sum(length(lexemes)), 0) AS l
              FROM old_rows GROUP BY org_id, agent_id) AS d
        WHERE s.org_id = d.org_id AND s.agent_id = d.agent_id;
    ELSE
        UPDATE memory_stats AS s SET lexemes = s.lexemes + d.l
        FROM (SELECT org_id, agent_id, sum(delta) AS l FROM (
                  SELECT org_id, agent_id, length(lexemes) AS delta FROM new_rows
                  UNION ALL
                  SELECT org_id, agent_id, -length(lexemes) FROM old_rows) AS changes
              GROUP BY org_id, agent_id) AS d
        WHERE s.org_id = d.org_id AND s.agent_id = d.agent_id AND d.l <> 0;
    END IF;
    RETURN NULL;
END
$$;

-- BM25 (k1 = 1.2, b = 0.75) of the agent's memories holding any of the query's lexemes,
-- best first. Each lexeme's df comes from the lexicon, then at most p_term_postings (500)
-- of its postings are read, best first, by one index range scan each. Generic plan, made
-- once per connection: with the LATERAL probes there is no other plan to choose.
DROP FUNCTION IF EXISTS ibex_bm25(uuid, uuid, text, integer, integer);

CREATE OR REPLACE FUNCTION ibex_bm25(
    p_org uuid, p_agent uuid, p_query text, p_limit integer, p_term_postings integer DEFAULT 500
)
RETURNS TABLE (memory_id uuid, bm25 double precision)
LANGUAGE sql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
    WITH stats AS MATERIALIZED (
        SELECT greatest(s.memories, 1)::float8 AS n,
               greatest(s.lexemes::float8 / greatest(s.memories, 1), 1.0) AS avgdl
        FROM memory_stats AS s WHERE s.org_id = p_org AND s.agent_id = p_agent
    ), terms AS MATERIALIZED (
        SELECT q.lexeme, ln(1 + (stats.n - x.df + 0.5) / (x.df + 0.5)) AS idf
        FROM stats
        CROSS JOIN (SELECT DISTINCT lexeme FROM unnest(to_tsvector('english', p_query))) AS q
        CROSS JOIN LATERAL (
            SELECT l.df FROM memory_lexicon AS l
            WHERE l.org_id = p_org AND l.agent_id = p_agent AND l.lexeme = q.lexeme
            LIMIT 1
        ) AS x
        WHERE x.df > 0
    )
    SELECT p.memory_id,
           sum(terms.idf * p.tf * 2.2 / (p.tf + 1.2 * (0.25 + 0.75 * p.dl / stats.avgdl))) AS bm25
    FROM stats CROSS JOIN terms
    CROSS JOIN LATERAL (
        SELECT t.memory_id, t.tf::float8 AS tf, t.dl::float8 AS dl FROM memory_terms AS t
        WHERE t.org_id = p_org AND t.agent_id = p_agent AND t.lexeme = terms.lexeme
        ORDER BY t.impact_order, t.memory_id
        LIMIT p_term_postings
    ) AS p
    GROUP BY p.memory_id
    ORDER BY bm25 DESC, p.memory_id
    LIMIT p_limit
$$;
