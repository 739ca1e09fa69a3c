-- An agent's own graph is sparse while the agent is small, rebuilt dense as it grows
-- (issue 40).
--
-- Every graph built since 0019 links each vector to 48 neighbours (ef_construction 256),
-- what a 100k-memory agent needs; at the promotion size (5k-10k memories) that costs each
-- new memory ~10 ms of PostgreSQL's CPU for its insertion and the promotion's build 9-10 s
-- at 10k. A graph of 16 links (ef_construction 128) searched at ef_search 200 finds as much
-- there (recall@50 0.988 / 0.94 p5 against 0.995 / 0.96 on real MiniLM vectors at 10k) for
-- a quarter of the insertion and a fifth of the build, up to 12.5k memories and not at
-- 15k; under heavy deletes its recall falls further than the dense graph's
-- (benchmarks/results/large-agents-2026-12-06.md sections 14, 15). Where
-- Settings.cold_sparse_graph_max_memories is set (0, off, by default), stores.postgres.graphs
-- builds the sparse graph for an agent promoted with at most that many memories and
-- rebuilds it dense, beside it, once the agent grows past that.
--
-- agent_graphs.links records each graph's kind (48: dense, 16: sparse; 32: a graph built
-- before 0019, halfvec false); rebuild_requested_at claims a rebuild, as requested_at
-- claims a build. A process of the previous build records its graphs without links, which
-- the default makes dense, as they are; it searches a sparse graph at the dense graph's
-- width (100: recall@50 0.970 / 0.86 at 10k) until it is replaced.

ALTER TABLE agent_graphs ADD COLUMN IF NOT EXISTS links smallint NOT NULL DEFAULT 48;
UPDATE agent_graphs SET links = 32 WHERE NOT halfvec AND links <> 32;
ALTER TABLE agent_graphs ADD COLUMN IF NOT EXISTS rebuild_requested_at timestamptz;
