-- What one tenant may keep (issue 39): per-org usage counters for the quotas, and a
-- bounded feedback log.
--
-- org_usage: each org's memories and bytes of content (UTF-8), kept by statement
-- triggers beside memory_stats' (0005): the upsert's quota check reads one row instead
-- of counting the org's memories on every write (stores.postgres.writes). The triggers
-- fire after memory_stats' (trigger names run in order), so every statement locks an
-- agent's stats row before its org's usage row, and concurrent statements cannot
-- deadlock on the two.
CREATE TABLE IF NOT EXISTS org_usage (
    org_id        uuid   PRIMARY KEY,
    memories      bigint NOT NULL DEFAULT 0,
    content_bytes bigint NOT NULL DEFAULT 0
);

CREATE OR REPLACE FUNCTION ibex_org_usage_apply() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- octet_length of a stored text reads its length from the TOAST header: no content
    -- is decompressed.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO org_usage AS u (org_id, memories, content_bytes)
        SELECT org_id, count(*), coalesce(sum(octet_length(content)), 0)
        FROM new_rows GROUP BY org_id ORDER BY org_id
        ON CONFLICT (org_id) DO UPDATE
            SET memories = u.memories + EXCLUDED.memories,
                content_bytes = u.content_bytes + EXCLUDED.content_bytes;
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE org_usage AS u SET memories = u.memories - d.n, content_bytes = u.content_bytes - d.b
        FROM (SELECT org_id, count(*) AS n, coalesce(sum(octet_length(content)), 0) AS b
              FROM old_rows GROUP BY org_id) AS d
        WHERE u.org_id = d.org_id;
    ELSE
        -- Only a changed content moves the bytes (feedback, for one, leaves them alone
        -- and locks no usage row).
        UPDATE org_usage AS u SET content_bytes = u.content_bytes + d.b
        FROM (SELECT org_id, sum(b) AS b FROM (
                  SELECT org_id, octet_length(content) AS b FROM new_rows
                  UNION ALL
                  SELECT org_id, -octet_length(content) FROM old_rows) AS changes
              GROUP BY org_id) AS d
        WHERE u.org_id = d.org_id AND d.b <> 0;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS org_usage_insert ON memories;
CREATE TRIGGER org_usage_insert AFTER INSERT ON memories
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION ibex_org_usage_apply();
DROP TRIGGER IF EXISTS org_usage_delete ON memories;
CREATE TRIGGER org_usage_delete AFTER DELETE ON memories
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION ibex_org_usage_apply();
DROP TRIGGER IF EXISTS org_usage_update ON memories;
CREATE TRIGGER org_usage_update AFTER UPDATE ON memories
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION ibex_org_usage_apply();

-- The counts of what is stored now (the triggers' lock on memories keeps writers out
-- until this commits).
INSERT INTO org_usage (org_id, memories, content_bytes)
SELECT org_id, count(*), coalesce(sum(octet_length(content)), 0) FROM memories GROUP BY org_id
ON CONFLICT (org_id) DO UPDATE
    SET memories = EXCLUDED.memories, content_bytes = EXCLUDED.content_bytes;

-- memory_feedback, a log nothing reads back, grew by a row per feedback item forever.
-- It keeps the newest FEEDBACK_LOG_PER_MEMORY (100) rows of each memory: its size is
-- bounded by the memories stored (and so by the org's quota). RecordFeedback trims the
-- memories it logged, in its own transaction, through ibex_trim_memory_feedback; the
-- index serves the trim's newest-first walk of one memory's rows.
CREATE INDEX IF NOT EXISTS memory_feedback_memory_time
    ON memory_feedback (org_id, agent_id, memory_id, created_at);
DROP INDEX IF EXISTS memory_feedback_memory;  -- a prefix of the new one

CREATE OR REPLACE FUNCTION ibex_trim_memory_feedback(p_org uuid, p_agent uuid, p_memories uuid[])
RETURNS bigint LANGUAGE sql AS $$
    WITH doomed AS (
        DELETE FROM memory_feedback WHERE ctid = ANY(ARRAY(
            SELECT f.ctid FROM unnest(p_memories) AS m(id)
            CROSS JOIN LATERAL (
                SELECT ctid FROM memory_feedback
                WHERE org_id = p_org AND agent_id = p_agent AND memory_id = m.id
                ORDER BY created_at DESC OFFSET 100
            ) AS f))
        RETURNING 1
    )
    SELECT count(*) FROM doomed
$$;

-- The log as it is now, trimmed the same way once.
DELETE FROM memory_feedback WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM (
        SELECT ctid, row_number() OVER (
            PARTITION BY org_id, agent_id, memory_id ORDER BY created_at DESC) AS newest
        FROM memory_feedback) AS ranked
    WHERE newest > 100));
