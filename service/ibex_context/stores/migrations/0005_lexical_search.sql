-- Lexical retrieval beside the vector search (ADR-0008): a full-text vector of each
-- memory, a GIN index over it, and per-agent statistics for BM25's IDF and length
-- normalisation.
--
-- 'english' stems words and drops stop words ("went" -> "went", "groups" -> "group"):
-- on the LoCoMo dev set stemming added 3-6 points of evidence recall to BM25 over
-- plain lower-cased words (benchmarks/results/quality-*.md).
--
-- Adding a STORED generated column rewrites the table and its indexes under an
-- ACCESS EXCLUSIVE lock: plan a maintenance window on a large installation (see
-- docs/operations.md: 1M rows took minutes here, most of it the HNSW rebuild).
ALTER TABLE memories
    ADD COLUMN IF NOT EXISTS lexemes tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED;

CREATE INDEX IF NOT EXISTS memories_lexemes_gin ON memories USING gin (lexemes);

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

INSERT INTO memory_stats (org_id, agent_id, memories, lexemes)
SELECT org_id, agent_id, count(*), coalesce(sum(length(lexemes)), 0)
FROM memories GROUP BY org_id, agent_id
ON CONFLICT (org_id, agent_id) DO UPDATE
    SET memories = EXCLUDED.memories, lexemes = EXCLUDED.lexemes;
