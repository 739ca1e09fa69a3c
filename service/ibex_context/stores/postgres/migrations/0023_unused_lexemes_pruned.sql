-- A lexeme no memory of the agent holds any more leaves the agent's lexicon (issue 40).
--
-- Before: 0012's trigger lowered a lexeme's document frequency to 0 and kept the row (a
-- search skips it). Under churn every word that came and went stayed: a 30-minute soak
-- of 100 agents x 1k memories, 10 upserts and 10 deletes a second, grew memory_lexicon by
-- 19 % while the memories stayed as many (benchmarks/results/soak-2026-12-06-30min.md);
-- its churned database then held 59,180 rows at df 0 of 321,378. The one table that grew
-- without bound under a steady load.
--
-- Now a second statement trigger, after 0012's (triggers on one event fire in name
-- order: "memory_unused_..." sorts after "memory_stats_..."), deletes the rows at df 0
-- among the lexemes the statement's old rows held. Each such row was lowered to 0 by
-- this same transaction, which still holds its lock, so no other writer can have raised
-- it meanwhile; a writer adding the lexeme concurrently waits on that lock and, finding
-- the row gone when it commits, inserts it afresh (INSERT ... ON CONFLICT retries).
-- Committed rows at df 0 therefore no longer exist, and the delete never waits on
-- another transaction's lock. The lexical search reads the same frequencies: an absent
-- lexeme and one at df 0 both count for nothing.
--
-- The rows already at df 0 are deleted here, then the table is vacuumed:
-- after commit: VACUUM (ANALYZE) memory_lexicon

CREATE OR REPLACE FUNCTION ibex_unused_lexemes_prune() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM memory_lexicon AS l
        USING (SELECT DISTINCT o.org_id, o.agent_id, t.lexeme
               FROM old_rows AS o CROSS JOIN LATERAL unnest(o.lexemes) AS t) AS d
        WHERE l.org_id = d.org_id AND l.agent_id = d.agent_id AND l.lexeme = d.lexeme AND l.df = 0;
    ELSE
        -- Only rows whose lexemes changed moved any frequency (0012 skips the others).
        DELETE FROM memory_lexicon AS l
        USING (SELECT DISTINCT o.org_id, o.agent_id, t.lexeme
               FROM old_rows AS o JOIN new_rows AS n
                 ON n.org_id = o.org_id AND n.agent_id = o.agent_id AND n.id = o.id
               CROSS JOIN LATERAL unnest(o.lexemes) AS t
               WHERE n.lexemes IS DISTINCT FROM o.lexemes) AS d
        WHERE l.org_id = d.org_id AND l.agent_id = d.agent_id AND l.lexeme = d.lexeme AND l.df = 0;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS memory_unused_lexemes_delete ON memories;
CREATE TRIGGER memory_unused_lexemes_delete AFTER DELETE ON memories
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION ibex_unused_lexemes_prune();
DROP TRIGGER IF EXISTS memory_unused_lexemes_update ON memories;
CREATE TRIGGER memory_unused_lexemes_update AFTER UPDATE ON memories
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION ibex_unused_lexemes_prune();

DELETE FROM memory_lexicon WHERE df = 0;
