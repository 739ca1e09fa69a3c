-- Lexical retrieval beside the vector search (ADR-0008): a full-text vector of each
-- memory, an inverted index of its lexemes per agent (memory_terms), and per-agent
-- statistics for BM25's IDF and length normalisation.
--
-- 'english' stems words and drops stop words ("went" -> "went", "groups" -> "group"):
-- on the LoCoMo dev set stemming added 3-6 points of evidence recall to BM25 over
-- plain lower-cased words (benchmarks/results/quality-*.md).
--
-- Adding a STORED generated column rewrites the table and its indexes under an
-- ACCESS EXCLUSIVE lock, and every memory's postings are written: plan a maintenance
-- window on a large installation (most of it the HNSW rebuild of the rewrite).
ALTER TABLE memories
    ADD COLUMN IF NOT EXISTS lexemes tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED;

-- The postings of each agent: one row per (lexeme, memory), keyed by the agent first.
-- A search reads only the postings of the query's lexemes, by primary-key range: its
-- cost follows how many of the agent's memories hold those words, not how many
-- memories the table or the agent has, and no memory row is read or decompressed to
-- rank. (A GIN index over memories.lexemes spans every tenant: for a common word it
-- collected 59k row ids of other agents to find 581 of this one's, 13 ms; scanning
-- the agent's rows and matching each tsvector cost 11-13 ms at 1k memories; this
-- ~1-2 ms. ADR-0008.) tf: the lexeme's positions in the memory; dl: the memory's
-- distinct lexemes, BM25's document length.
CREATE TABLE IF NOT EXISTS memory_terms (
    org_id    uuid     NOT NULL,
    agent_id  uuid     NOT NULL,
    lexeme    text     NOT NULL,
    memory_id uuid     NOT NULL,
    tf        smallint NOT NULL,
    dl        smallint NOT NULL,
    -- tf and dl ride in the index: a search is an index-only range scan per query
    -- lexeme (a lexeme's postings lie on as many heap pages as it has memories; the
    -- heap fetches made it 4x slower).
    PRIMARY KEY (org_id, agent_id, lexeme, memory_id) INCLUDE (tf, dl)
);
-- An index-only scan skips the heap only on pages the visibility map marks all-visible,
-- which autovacuum sets; by default an insert-only table waits for 20 % more rows (1M
-- at 5M postings) before it is vacuumed. Measured on a 419-memory agent: 0.6 ms for
-- the BM25 function on vacuumed pages, 5-8 ms on fresh ones.
ALTER TABLE memory_terms SET (autovacuum_vacuum_insert_scale_factor = 0.01,
                              autovacuum_vacuum_insert_threshold = 10000);


-- How many memories an agent has and how many distinct lexemes they hold in all:
-- BM25 needs the collection size (IDF) and the average document length. Kept by
-- statement-level triggers, so every writer (the service, COPY seeding, manual SQL)
-- keeps it true, with one aggregate per statement rather than per row.
CREATE TABLE IF NOT EXISTS memory_stats (
    org_id   uuid   NOT NULL,
    agent_id uuid   NOT NULL,
    memories bigint NOT NULL DEFAULT 0,
    lexemes  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (org_id, agent_id)
);

CREATE OR REPLACE FUNCTION ibex_memory_stats_apply() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Postings follow the memories' lexemes: removed for the old rows, added for the
    -- new (an UPDATE that leaves the content alone, e.g. feedback, touches none).
    IF TG_OP = 'DELETE' THEN
        DELETE FROM memory_terms AS p
        USING (SELECT o.org_id, o.agent_id, t.lexeme, o.id FROM old_rows AS o, unnest(o.lexemes) AS t) AS d
        WHERE p.org_id = d.org_id AND p.agent_id = d.agent_id AND p.lexeme = d.lexeme AND p.memory_id = d.id;
    ELSIF TG_OP = 'UPDATE' THEN
        DELETE FROM memory_terms AS p
        USING (SELECT o.org_id, o.agent_id, t.lexeme, o.id
               FROM old_rows AS o JOIN new_rows AS n
                 ON n.org_id = o.org_id AND n.agent_id = o.agent_id AND n.id = o.id
               CROSS JOIN LATERAL unnest(o.lexemes) AS t
               WHERE n.lexemes IS DISTINCT FROM o.lexemes) AS d
        WHERE p.org_id = d.org_id AND p.agent_id = d.agent_id AND p.lexeme = d.lexeme AND p.memory_id = d.id;
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
    -- Rows are aggregated per agent and applied in key order, so concurrent
    -- statements lock the stats rows in the same order and cannot deadlock.
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

DROP TRIGGER IF EXISTS memory_stats_insert ON memories;
CREATE TRIGGER memory_stats_insert AFTER INSERT ON memories
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION ibex_memory_stats_apply();
DROP TRIGGER IF EXISTS memory_stats_delete ON memories;
CREATE TRIGGER memory_stats_delete AFTER DELETE ON memories
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION ibex_memory_stats_apply();
DROP TRIGGER IF EXISTS memory_stats_update ON memories;
CREATE TRIGGER memory_stats_update AFTER UPDATE ON memories
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION ibex_memory_stats_apply();

INSERT INTO memory_terms (org_id, agent_id, lexeme, memory_id, tf, dl)
SELECT m.org_id, m.agent_id, t.lexeme, m.id,
       least(greatest(cardinality(t.positions), 1), 32767), least(length(m.lexemes), 32767)
FROM memories AS m CROSS JOIN LATERAL unnest(m.lexemes) AS t
ON CONFLICT DO NOTHING;

INSERT INTO memory_stats (org_id, agent_id, memories, lexemes)
SELECT org_id, agent_id, count(*), coalesce(sum(length(lexemes)), 0)
FROM memories GROUP BY org_id, agent_id
ON CONFLICT (org_id, agent_id) DO UPDATE
    SET memories = EXCLUDED.memories, lexemes = EXCLUDED.lexemes;

-- BM25 of the agent's memories that hold any of the query's lexemes, best first. A
-- function so that its plan is made once per connection (force_generic_plan: the
-- plan does not depend on the tenant; the service's sessions replan every statement,
-- which cost ~2 ms here). k1 = 1.2, b = 0.75 (Okapi). Document frequency is the
-- number of the agent's postings of a lexeme, the collection size and average length
-- come from memory_stats; a query of stop words only has no lexeme and matches nothing.
CREATE OR REPLACE FUNCTION ibex_bm25(p_org uuid, p_agent uuid, p_query text, p_limit integer)
RETURNS TABLE (memory_id uuid, bm25 double precision)
LANGUAGE sql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
    WITH terms AS (
        SELECT DISTINCT lexeme FROM unnest(to_tsvector('english', p_query))
    ), postings AS (
        SELECT p.memory_id, p.tf::float8 AS tf, p.dl::float8 AS dl,
               count(*) OVER (PARTITION BY p.lexeme)::float8 AS df
        FROM terms
        JOIN memory_terms AS p ON p.org_id = p_org AND p.agent_id = p_agent AND p.lexeme = terms.lexeme
    ), stats AS (
        SELECT greatest(s.memories, 1)::float8 AS n,
               greatest(s.lexemes::float8 / greatest(s.memories, 1), 1.0) AS avgdl
        FROM memory_stats AS s WHERE s.org_id = p_org AND s.agent_id = p_agent
    )
    SELECT postings.memory_id,
           sum(ln(1 + (stats.n - postings.df + 0.5) / (postings.df + 0.5)) * postings.tf * 2.2
               / (postings.tf + 1.2 * (0.25 + 0.75 * postings.dl / stats.avgdl))) AS bm25
    FROM postings CROSS JOIN stats
    GROUP BY postings.memory_id
    ORDER BY bm25 DESC, postings.memory_id
    LIMIT p_limit
$$;
