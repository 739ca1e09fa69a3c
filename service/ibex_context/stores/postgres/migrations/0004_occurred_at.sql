-- When a memory's information came to be, as its writer says (an imported history
-- keeps its own dates); recency counts from it. NULL on rows written before this
-- migration: readers take coalesce(occurred_at, created_at), so the migration adds
-- the column without rewriting the table (no default, instant even at 1M rows).
ALTER TABLE memories ADD COLUMN IF NOT EXISTS occurred_at timestamptz;
