-- A cleared directive keeps its row with content NULL, so its version keeps
-- increasing across clear/set. Cache writes are guarded by that version: a reader
-- filling the cache with an older version can never overwrite a newer write.
ALTER TABLE directives ALTER COLUMN content DROP NOT NULL;
