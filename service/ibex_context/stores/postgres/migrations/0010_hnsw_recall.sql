-- The partitions' HNSW graphs rebuilt with twice the links (m 32, ef_construction 128)
-- so the approximate plan finds what the exact one finds (issue 13's target: recall@50
-- >= 0.95 against exact search; ADR-0009 "Recall").
--
-- With 0008's graphs (m 16, ef_construction 64) the hashing embedder's vectors gave a
-- mean recall@50 of 0.82 (100 x 10k) and 0.77 (1 x 100k) at hnsw.ef_search 64; raising
-- ef_search to pgvector's limit (1,000) brought the 100k agent to 0.95 at best, at 3-4x
-- the cost. Short questions against long memories are far from every stored vector, and
-- a sparse graph's greedy walk settles in the wrong neighbourhood; a graph with twice
-- the links per node reaches 0.972 (100 x 10k) and 0.915-0.955 (1 x 100k, by question
-- sample) at ef_search 400 on the same data (ADR-0009 "Recall").
-- The service's ef_search rises with it: 200, and 400 for agents of more than 50,000
-- memories (Settings.hnsw_ef_search, hnsw_ef_search_large_agents).
--
-- Online for reads, not for writes: the new graphs are built beside the old ones under
-- a temporary name (a SHARE lock, so writes wait and searches go on through the old
-- graphs), then the old index is dropped and the new one takes its name (ACCESS
-- EXCLUSIVE, milliseconds). Measured here: 1,433 s for 1M memories (100 x 10k), 299 s
-- for one agent of 100k, niced beside other jobs at load average 7-13
-- (benchmarks/results/migration_0010-100x10000.md, ADR-0009). An installation that cannot stop
-- writes that long builds memories_embedding_hnsw_m32 beforehand, concurrently, one
-- partition at a time (ADR-0009 gives the statements); this migration then only swaps.

LOCK TABLE memories IN SHARE MODE;

-- A partition's graph is built in memory when it fits (about 2.5 kB per 384-d row at
-- m 32). Raise the limit for this transaction, never lower it.
DO $$
BEGIN
    IF pg_size_bytes(current_setting('maintenance_work_mem')) < pg_size_bytes('512MB') THEN
        SET LOCAL maintenance_work_mem = '512MB';
    END IF;
END
$$;

CREATE INDEX IF NOT EXISTS memories_embedding_hnsw_m32
    ON memories USING hnsw (embedding vector_cosine_ops) WITH (m = 32, ef_construction = 128);

-- Built beforehand by hand, it must cover every partition: a partitioned index is valid
-- only once each partition's index is attached.
DO $$
BEGIN
    IF NOT (SELECT indisvalid FROM pg_index WHERE indexrelid = 'memories_embedding_hnsw_m32'::regclass) THEN
        RAISE EXCEPTION 'memories_embedding_hnsw_m32 is not valid: attach every partition''s graph first (ADR-0009)';
    END IF;
END
$$;

DROP INDEX memories_embedding_hnsw;
ALTER INDEX memories_embedding_hnsw_m32 RENAME TO memories_embedding_hnsw;

-- The partitions' graphs keep their partition's name (memories_pNN_embedding_idx, as
-- 0008 left them) rather than the suffixed names PostgreSQL gave them beside the old.
DO $$
DECLARE
    graph record;
BEGIN
    FOR graph IN
        SELECT i.inhrelid::regclass AS index, p.relname AS partition
        FROM pg_inherits AS i
        JOIN pg_index AS x ON x.indexrelid = i.inhrelid
        JOIN pg_class AS p ON p.oid = x.indrelid
        WHERE i.inhparent = 'memories_embedding_hnsw'::regclass
    LOOP
        EXECUTE format('ALTER INDEX %s RENAME TO %I', graph.index, graph.partition || '_embedding_idx');
    END LOOP;
END
$$;
