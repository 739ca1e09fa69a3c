-- Hot counters out of the wide row, vectors inline.
--
-- Injection bookkeeping (retrieval_count, last_*_at) used to UPDATE memories: every
-- injected memory rewrote its ~2 kB row and, unless the update was HOT (18 % were),
-- inserted into the primary key, the content_hash index and the HNSW index (an HNSW
-- insert is a graph search). The counters now live in a narrow table keyed like
-- memories; a memory without a row here has never been injected (count 0, NULLs).
-- Reads LEFT JOIN it on (org_id, agent_id, id). Rows are deleted with their memory,
-- in the same transaction (stores.postgres.delete_memories). There is no foreign
-- key: its check would lock the memory row on every new usage row, and a batch
-- racing a delete would fail as a whole; the recorder only inserts rows for
-- memories that exist, and a memory created with a reused id clears stale counters.
CREATE TABLE IF NOT EXISTS memory_usage (
    org_id            uuid        NOT NULL,
    agent_id          uuid        NOT NULL,
    memory_id         uuid        NOT NULL,
    retrieval_count   integer     NOT NULL DEFAULT 0 CHECK (retrieval_count >= 0),
    last_retrieved_at timestamptz,
    last_injected_at  timestamptz,
    PRIMARY KEY (org_id, agent_id, memory_id)
) WITH (fillfactor = 70);  -- room for HOT updates: no index covers the counters

INSERT INTO memory_usage (org_id, agent_id, memory_id, retrieval_count, last_retrieved_at, last_injected_at)
SELECT org_id, agent_id, id, retrieval_count, last_retrieved_at, last_injected_at
FROM memories
WHERE retrieval_count > 0 OR last_retrieved_at IS NOT NULL OR last_injected_at IS NOT NULL
ON CONFLICT (org_id, agent_id, memory_id) DO NOTHING;

-- The old columns stay (unused, no longer written or read) so tools that COPY rows
-- with the 0001 column list keep working; dropping them would not shrink the rows
-- until a rewrite anyway. Their values were copied above.
COMMENT ON COLUMN memories.retrieval_count IS 'unused since 0003: see memory_usage';
COMMENT ON COLUMN memories.last_retrieved_at IS 'unused since 0003: see memory_usage';
COMMENT ON COLUMN memories.last_injected_at IS 'unused since 0003: see memory_usage';

-- pgvector's default STORAGE EXTERNAL moves a 384-d vector (1,540 B) out of line once
-- a row passes ~2 kB, so the exact per-agent scan read ~4 buffers per row (3,902 vs
-- 250 for a 1k-memory agent, 16 -> 1.8 ms). PLAIN keeps new and rewritten rows inline
-- (text may still be compressed/TOASTed, the vector never). Existing rows keep their
-- layout until rewritten: run `VACUUM FULL memories` (not possible inside this
-- migration's transaction; it locks the table and rebuilds the HNSW index) on an
-- existing install. Long content is still TOASTed (EXTENDED), which keeps the row
-- under a page. A vector over 4 kB (> 1,024 dimensions) gets MAIN instead: inline
-- whenever it fits, out of line only as a last resort; PLAIN would make rows with
-- such vectors impossible to store (a heap row must fit in one 8 kB page).
DO $$
BEGIN
    IF {embedding_dim} <= 1024 THEN
        ALTER TABLE memories ALTER COLUMN embedding SET STORAGE PLAIN;
    ELSE
        ALTER TABLE memories ALTER COLUMN embedding SET STORAGE MAIN;
    END IF;
END
$$;
