-- An agent's own graph may be rebuilt once a share of its memories were replaced since it
-- was built, instead of being repaired by a vacuum (issue 40; off by default).
--
-- A deleted memory, or one re-embedded by an update, leaves its vector in the agent's HNSW
-- graph until a vacuum of its partition finds the dead row; the vacuum then repairs the
-- links of every neighbour of each dead vector. On 10k real MiniLM memories (the service's
-- dense graph) that repair took 37.7-40.8 s of PostgreSQL's CPU for 2,000 replaced rows,
-- where rebuilding the graph first and vacuuming after took 13.3 s: the rebuild reads
-- only live rows, so the vacuum has nothing left to repair (benchmarks.graph_vacuum,
-- benchmarks/results/large-agents-2026-12-06.md section 20). Until then the searches walk
-- past the dead vectors too.
--
-- agent_graphs.replaced counts the agent's rows deleted or re-embedded since its graph was
-- built (a statement trigger, one row update per statement, and only for agents with a
-- graph: the join finds no row for the others). Where Settings.cold_graph_rebuild_replaced_share
-- is set, stores.postgres.graphs rebuilds a graph whose count passed that share of the
-- agent's memories with
-- REINDEX INDEX CONCURRENTLY (searches and writes go on) and subtracts what it counted
-- when it started. Writers of one agent are serialised by its advisory lock
-- (stores.postgres.writes.lock_agent), so the row lock taken here orders after it.
-- Updates that leave the vector alone (feedback, metadata) are HOT and are not counted.
--
-- A rebuild runs at full speed where autovacuum's repair is throttled: under 100 writes a
-- second into one 10k agent with the stores on one core, its writers fell from 80 to 41-50
-- a second, back to back or paced. built_at and build_seconds record the last build, so a
-- graph is rebuilt at most a quarter of the time (stores.postgres.graphs.REBUILD_PAUSE);
-- autovacuum repairs what is replaced faster than that. The rebuild is therefore off by
-- default (large-agents-2026-12-06.md section 22): for stores with a core to spare.

ALTER TABLE agent_graphs ADD COLUMN IF NOT EXISTS replaced bigint NOT NULL DEFAULT 0;
ALTER TABLE agent_graphs ADD COLUMN IF NOT EXISTS built_at timestamptz;
ALTER TABLE agent_graphs ADD COLUMN IF NOT EXISTS build_seconds real;

CREATE OR REPLACE FUNCTION ibex_agent_graph_replaced() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        UPDATE agent_graphs AS g SET replaced = g.replaced + d.n
        FROM (SELECT org_id, agent_id, count(*) AS n FROM old_rows GROUP BY org_id, agent_id) AS d
        WHERE g.org_id = d.org_id AND g.agent_id = d.agent_id;
    ELSE
        UPDATE agent_graphs AS g SET replaced = g.replaced + d.n
        FROM (SELECT o.org_id, o.agent_id, count(*) AS n
              FROM old_rows AS o JOIN new_rows AS n
                ON n.org_id = o.org_id AND n.agent_id = o.agent_id AND n.id = o.id
              WHERE n.embedding IS DISTINCT FROM o.embedding
              GROUP BY o.org_id, o.agent_id) AS d
        WHERE g.org_id = d.org_id AND g.agent_id = d.agent_id;
    END IF;
    RETURN NULL;
END
$$;

DROP TRIGGER IF EXISTS memory_graph_replaced_delete ON memories;
CREATE TRIGGER memory_graph_replaced_delete AFTER DELETE ON memories
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION ibex_agent_graph_replaced();
DROP TRIGGER IF EXISTS memory_graph_replaced_update ON memories;
CREATE TRIGGER memory_graph_replaced_update AFTER UPDATE ON memories
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION ibex_agent_graph_replaced();
