-- Keyset paging of the memory API's ListMemories (issue 16): one index per sort key,
-- tenant first, id last (the tie-breaker), so a page is an index range scan however
-- large the agent, instead of sorting all its rows for every page. The occurred
-- order uses the expression readers use (0004: NULL means the write time).
CREATE INDEX IF NOT EXISTS memories_tenant_created
    ON memories (org_id, agent_id, created_at, id);
CREATE INDEX IF NOT EXISTS memories_tenant_occurred
    ON memories (org_id, agent_id, (coalesce(occurred_at, created_at)), id);
-- Built inside the migration's transaction (CONCURRENTLY is not allowed there), so
-- writes to memories wait while they build: seconds for 100k rows, longer for
-- millions. On a large install, create them beforehand with CREATE INDEX
-- CONCURRENTLY under the same names; IF NOT EXISTS then skips them here.
