-- Each graph search states its own width (hnsw.ef_search) as an argument (issue 40).
--
-- Before: the connection's session setting was the width, and a search that needed
-- another (an agent's own graph in half precision takes 100 at 10k memories and 200
-- at 100k, the partitions' graphs 200 and 400) ran in a transaction of its own:
-- BEGIN, SET LOCAL hnsw.ef_search, the search, COMMIT, three round trips more than
-- the search, each a wake-up of a backend on a busy stores core. That was every
-- search of every agent with a graph of its own.
--
-- Now each graph plan's row-of-arrays functions (0015, 0018, 0019) have a
-- five-argument form taking the width: it sets hnsw.ef_search for the search inside
-- it (set_config(..., true) is SET LOCAL; the SET clause restores the caller's value
-- when the function returns, so nothing leaks into the caller's transaction) and
-- calls the four-argument form, which stays for processes of the previous build
-- during a rollout. The exact scan walks no graph and keeps its four arguments.
--
-- The wrappers are written from each wrapped function's own result type, so the two
-- cannot disagree.

DO $migration$
DECLARE
    wrapped record;
    written integer := 0;
BEGIN
    FOR wrapped IN
        SELECT p.proname, pg_get_function_result(p.oid) AS result
        FROM pg_proc AS p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND p.pronargs = 4
          AND p.proname IN (
              'ibex_cold_hnsw_arrays', 'ibex_cold_hnsw_arrays_with_vectors',
              'ibex_cold_agent_arrays', 'ibex_cold_agent_arrays_with_vectors',
              'ibex_cold_agent_halfvec_arrays', 'ibex_cold_agent_halfvec_arrays_with_vectors')
    LOOP
        EXECUTE format(
            $f$
            CREATE OR REPLACE FUNCTION %1$I(
                p_org uuid, p_agent uuid, p_query vector, p_limit integer, p_ef_search integer)
            RETURNS %2$s
            LANGUAGE sql VOLATILE
            -- Any value: the body sets the call's own; the clause restores the caller's at exit.
            SET hnsw.ef_search = 40
            AS $body$
                SELECT set_config('hnsw.ef_search', p_ef_search::text, true);
                SELECT * FROM %1$I(p_org, p_agent, p_query, p_limit);
            $body$
            $f$,
            wrapped.proname, wrapped.result);
        written := written + 1;
    END LOOP;
    IF written <> 6 THEN
        RAISE EXCEPTION 'expected the six graph search functions, found %', written;
    END IF;
END
$migration$;
