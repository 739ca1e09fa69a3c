-- Memories in hash partitions on (org_id, agent_id), one HNSW graph per partition
-- (ADR-0009, issue 13).
--
-- One HNSW graph over every tenant's rows made a large agent's search a walk through
-- other agents' vectors, filtered afterwards: 102-107 ms for a 10k-memory agent among
-- 1M rows (benchmarks/results/cold_plans-100x10000.md). Each partition's graph holds
-- the vectors of the few agents hashed to it, so an agent with many memories owns most
-- of its graph; an agent with few is searched exactly (the service chooses: see
-- stores.cold_plan). Partition pruning needs only the tenant key every statement
-- already has.
--
-- The table is rebuilt: a new partitioned table is filled from the old one in tenant
-- order (each agent's rows contiguous, as CLUSTER would lay them out), its indexes are
-- built, the old table is dropped and the new one takes its name, index names,
-- constraints and triggers. A SHARE lock on the old table throughout: reads (searches)
-- go on, writes wait until the migration commits; the final swap holds an ACCESS
-- EXCLUSIVE lock for seconds. Measured here: 91 s for 100k memories at load average ~5
-- (ADR-0009, which records the run); about 15 min expected for 1M.
-- memory_terms, memory_stats and memory_usage are keyed by tenant and unchanged.

LOCK TABLE memories IN SHARE MODE;

-- pgvector builds an HNSW graph in memory when it fits; a partition's graph needs
-- about 2 kB per 384-d row. Raise the limit for this transaction, never lower it.
DO $$
BEGIN
    IF pg_size_bytes(current_setting('maintenance_work_mem')) < pg_size_bytes('512MB') THEN
        SET LOCAL maintenance_work_mem = '512MB';
    END IF;
END
$$;

CREATE TABLE memories_partitioned (
    LIKE memories INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED
                  INCLUDING STORAGE INCLUDING COMMENTS
) PARTITION BY HASH (org_id, agent_id);

-- 64 partitions: at 1M memories ~16k rows each, one to a few large agents per graph
-- (ADR-0009 measures 32 and 64). The count is fixed here; changing it is another
-- rewrite.
DO $$
BEGIN
    FOR n IN 0..63 LOOP
        EXECUTE format(
            'CREATE TABLE memories_p%s PARTITION OF memories_partitioned FOR VALUES WITH (MODULUS 64, REMAINDER %s)',
            lpad(n::text, 2, '0'), n);
    END LOOP;
END
$$;

-- Partitions keep their parent's column storage only from the LIKE copy above; set it
-- again on every partition (0003: the vector stays inline).
DO $$
BEGIN
    IF {embedding_dim} <= 1024 THEN
        ALTER TABLE memories_partitioned ALTER COLUMN embedding SET STORAGE PLAIN;
    ELSE
        ALTER TABLE memories_partitioned ALTER COLUMN embedding SET STORAGE MAIN;
    END IF;
END
$$;

-- Every stored column, by name (the generated lexemes are computed again).
DO $$
DECLARE
    columns text;
BEGIN
    SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) INTO columns
    FROM pg_attribute
    WHERE attrelid = 'memories'::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = '';
    EXECUTE format(
        'INSERT INTO memories_partitioned (%1$s) SELECT %1$s FROM memories ORDER BY org_id, agent_id, created_at, id',
        columns);
END
$$;

-- Constraints and indexes under temporary names, built while searches still read the
-- old table (the HNSW graphs are most of the migration's time).
ALTER TABLE memories_partitioned ADD CONSTRAINT memories_partitioned_pkey PRIMARY KEY (org_id, agent_id, id);
ALTER TABLE memories_partitioned ADD CONSTRAINT memories_partitioned_content_hash_key
    UNIQUE (org_id, agent_id, content_hash);
CREATE INDEX memories_partitioned_tenant_created ON memories_partitioned (org_id, agent_id, created_at, id);
CREATE INDEX memories_partitioned_tenant_occurred
    ON memories_partitioned (org_id, agent_id, (coalesce(occurred_at, created_at)), id);
CREATE INDEX memories_partitioned_embedding_hnsw
    ON memories_partitioned USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64);

-- The swap: from here to the commit, an ACCESS EXCLUSIVE lock (seconds).
DROP TABLE memories;
ALTER TABLE memories_partitioned RENAME TO memories;
ALTER TABLE memories RENAME CONSTRAINT memories_partitioned_pkey TO memories_pkey;
ALTER TABLE memories RENAME CONSTRAINT memories_partitioned_content_hash_key
    TO memories_org_id_agent_id_content_hash_key;
ALTER INDEX memories_partitioned_tenant_created RENAME TO memories_tenant_created;
ALTER INDEX memories_partitioned_tenant_occurred RENAME TO memories_tenant_occurred;
ALTER INDEX memories_partitioned_embedding_hnsw RENAME TO memories_embedding_hnsw;

-- The statement triggers that keep memory_terms and memory_stats (0005); they are
-- created after the copy, whose rows' postings and counts already exist.
CREATE TRIGGER memory_stats_insert AFTER INSERT ON memories
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION ibex_memory_stats_apply();
CREATE TRIGGER memory_stats_delete AFTER DELETE ON memories
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION ibex_memory_stats_apply();
CREATE TRIGGER memory_stats_update AFTER UPDATE ON memories
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION ibex_memory_stats_apply();

-- The two plans of the vector search, each fixed by its function's settings rather
-- than left to the planner's estimate of the agent's share of the table (the service
-- chooses between them from memory_stats, stores.cold_plan). Generic plans, made once
-- per connection: partitions are pruned when the executor starts, from the tenant.
--
-- Exact: the agent's rows by the tenant key (a bitmap scan reads their pages in order:
-- 170 vs 256 ms for an index scan of a 100k-memory agent), every distance computed,
-- the top N sorted ("+ 0": an order no index provides, so never the approximate graph;
-- no sequential scan of a partition other agents share).
CREATE OR REPLACE FUNCTION ibex_cold_exact(p_org uuid, p_agent uuid, p_query vector, p_limit integer)
RETURNS TABLE (id uuid, content text, category text, confidence real, usefulness real,
               occurred_at timestamptz, created_at timestamptz, token_counts jsonb, distance double precision)
LANGUAGE sql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
    SELECT m.id, m.content, m.category, m.confidence, m.usefulness, m.occurred_at, m.created_at,
           m.token_counts, m.embedding <=> p_query
    FROM memories AS m
    WHERE m.org_id = p_org AND m.agent_id = p_agent
    ORDER BY (m.embedding <=> p_query) + 0
    LIMIT p_limit
$$;

-- Approximate: the partition's HNSW graph, filtered to the agent, with the session's
-- hnsw.ef_search and iterative scan (the scan continues until LIMIT rows of the agent
-- pass the filter). Sorting is disabled so the planner cannot trade the graph for the
-- tenant index plus a sort.
CREATE OR REPLACE FUNCTION ibex_cold_hnsw(p_org uuid, p_agent uuid, p_query vector, p_limit integer)
RETURNS TABLE (id uuid, content text, category text, confidence real, usefulness real,
               occurred_at timestamptz, created_at timestamptz, token_counts jsonb, distance double precision)
LANGUAGE sql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
    SELECT m.id, m.content, m.category, m.confidence, m.usefulness, m.occurred_at, m.created_at,
           m.token_counts, m.embedding <=> p_query
    FROM memories AS m
    WHERE m.org_id = p_org AND m.agent_id = p_agent
    ORDER BY m.embedding <=> p_query
    LIMIT p_limit
$$;
