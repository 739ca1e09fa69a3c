-- Directive versions per agent, from the database's clock, instead of one deployment-wide
-- sequence (issue 39).
--
-- GetDirective returns the version: from one sequence, the gap between two versions of
-- an agent's directive was the number of directive writes every other tenant made in
-- between (their write rate, read by anyone who may read their own directive). A
-- version is now the microseconds since the epoch at the write (clock_timestamp(), the
-- primary's clock), or its row's previous version + 1 if that is higher: it still grows
-- on every change of the agent's directive, and a directive set after a purge deleted
-- the row still gets a version above every one handed out before it (what migration
-- 0014 made the sequence for: the purge's cache tombstone is computed the same way,
-- stores.tenant_data), without telling anything of other tenants but the time.
--
-- The sequence is moved to the clock and kept, so a replica of the previous build still
-- serving during the rollout hands out versions on the same scale.
CREATE OR REPLACE FUNCTION directive_clock_version() RETURNS bigint
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8 $$;

SELECT setval('directive_versions', greatest(
    directive_clock_version(),
    coalesce((SELECT max(version) FROM directives), 0) + 1
));
ALTER TABLE directives ALTER COLUMN version SET DEFAULT directive_clock_version();
