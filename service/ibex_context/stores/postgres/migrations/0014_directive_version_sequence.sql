-- Directive versions from one sequence, so they keep growing across a purge.
--
-- A purge deletes the agent's directive row and leaves a Redis tombstone whose version
-- refuses the cache fills of readers that read PostgreSQL before the purge. With
-- versions counted per row (version + 1), a directive set after the purge started again
-- at 1, below the tombstone: its cache write was refused and the next calls read "no
-- directive" from the tombstone for its whole minute. A version from one sequence is
-- above every version handed out before the purge, so the purge's tombstone is the
-- sequence's value then (stores.tenant_data), and what is set after it is served at once.
CREATE SEQUENCE IF NOT EXISTS directive_versions AS bigint;
SELECT setval('directive_versions', greatest(coalesce((SELECT max(version) FROM directives), 0), 1));
ALTER TABLE directives ALTER COLUMN version SET DEFAULT nextval('directive_versions');
