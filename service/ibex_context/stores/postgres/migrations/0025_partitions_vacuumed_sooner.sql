-- The memories partitions that hold no agent's own graph are vacuumed once 2 % of their
-- rows are dead instead of PostgreSQL's default 20 % (issue 40).
--
-- Dead rows cost every search of their agents until a vacuum removes them: on 100 agents
-- x 1k memories with 12 % of the rows dead, the stores spent 6.57-6.87 ms of CPU a call
-- against 6.23-6.29 ms vacuumed, both searches paying (soak-2026-12-06-30min.md, last
-- section). A partition of small agents (~1,600 rows) costs milliseconds to vacuum.
-- A partition holding an agent's own graph keeps the default: its vacuum repairs the
-- graph around each dead vector, and ten vacuums for the same churn cost 3.5-3.8 times
-- the CPU of one (large-agents-2026-12-06.md section 20). stores.postgres.graphs resets
-- the setting on the partition of each graph it builds; memory_terms has had 2 % since 0005.

DO $$
DECLARE
    partition regclass;
BEGIN
    FOR partition IN
        SELECT i.inhrelid::regclass FROM pg_inherits AS i
        WHERE i.inhparent = 'memories'::regclass
          AND NOT EXISTS (
              SELECT 1 FROM pg_index AS x JOIN pg_class AS c ON c.oid = x.indexrelid
              JOIN agent_graphs AS g ON g.index_name = c.relname
              WHERE x.indrelid = i.inhrelid)
    LOOP
        EXECUTE format('ALTER TABLE %s SET (autovacuum_vacuum_scale_factor = 0.02)', partition);
    END LOOP;
END
$$;
