"""What one agent's cold search costs under each plan the service can choose, and the
approximate plan's recall against the exact one.

Run on a data set the load test seeded (``loadtest/run`` keeps them under
``loadtest/out/data/``)::

    .venv/bin/python -m benchmarks.cold_plans loadtest/out/data/100x10000-...

It starts that data set's PostgreSQL and runs the service's own search statements
(``stores.postgres.SEARCH_SQL``, one per plan of ``stores.cold_plan``) for
``--agents`` agents (the largest and, for mixed data sets, the smallest; ``--calls``
queries each, by default the load test's questions about its memories; one pooled
connection, sequential, after a warm-up round of at least 30 calls), and writes
``benchmarks/results/cold_plans-<data set>[-<label>].md``:

* **exact**: ``ibex_cold_exact``: the agent's rows by the tenant key, every distance
  computed, top-K sorted;
* **own graph**: for agents that have one (``stores.postgres.graphs``), the walk of
  their graph; recall@50 against the exact answer of the same query;
* **service**: the plan ``choose_plan`` picks (the agent's own graph once ready, else
  exact; counted per plan);
* **walked again** (``--rewalk-ef``, for question queries): the service's repeated walk.
  The call's lexical search (``stores.postgres.LEXICAL_SQL``, the question's words) runs
  too, and when it found a memory the walk did not return, nearer to the question than one
  it did (``stores.cold_plan.nearer_than_walk``), the walk is repeated at that ``hnsw.ef_search``;
  its time is the first walk's plus the second's (the service runs the lexical search
  beside the walk).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import os
import platform
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import numpy as np
from ibex_context.devtools.embedded import start_postgres
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.settings import Settings
from ibex_context.stores.cold_plan import ColdPlan, GraphSearchWidth, choose_plan, nearer_than_walk
from ibex_context.stores.postgres import SEARCH_SQL, create_pool, decode_vectors
from ibex_context.stores.postgres.graphs import AGENT_STATE_SQL, own_graph_plan
from ibex_context.stores.postgres.searches import LEXICAL_SQL

from loadtest import corpus, seed_worker
from loadtest.vectors import VectorShape, fitted_shape

RESULTS = Path(__file__).parent / "results"
LIMIT = 50
# Enough to bring a freshly started data set's pages into memory for a single agent.
WARM_UP_CALLS = 30
QUERIES = {
    "questions": "the load test's questions (a span of one of the agent's memories), hashing-embedded",
    "minilm": "the load test's questions (a span of one of the agent's memories), embedded by MiniLM as"
    " the service embeds queries (int8): for data sets seeded with MiniLM's own vectors",
    "memories": "the normalised mean of two of the agent's memories' vectors",
    "shaped": "one of the agent's stored vectors plus a real MiniLM question's offset from its memory"
    " (loadtest.vectors: for data sets seeded with --vectors shaped)",
    "random": "random unit vectors",
}


@dataclass(slots=True)
class Measured:
    condition: str
    milliseconds: list[float] = field(default_factory=list)
    recall: list[float] = field(default_factory=list)
    plans: collections.Counter[str] = field(default_factory=collections.Counter)

    def row(self) -> str:
        ordered = sorted(self.milliseconds)
        p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
        recall = (
            f"{statistics.mean(self.recall):.3f} / {_p5(self.recall):.2f} / {min(self.recall):.2f}"
            if self.recall
            else "1 (exact)"
        )
        plans = ", ".join(f"{name} {count}" for name, count in sorted(self.plans.items()))
        return (
            f"| {self.condition} | {statistics.median(ordered):.1f} | {p95:.1f} | {ordered[-1]:.1f}"
            f" | {len(ordered)} | {recall} | {plans} |"
        )


def _p5(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[int(len(ordered) * 0.05)]


def service_width() -> GraphSearchWidth:
    """The service's graph search width by agent size, from the settings' defaults."""
    return GraphSearchWidth.from_settings(Settings.model_construct())


@dataclass(frozen=True, slots=True)
class Found:
    milliseconds: float
    distances: list[float]
    ids: list[str]


async def _timed(
    conn: asyncpg.Connection,
    plan: ColdPlan,
    agent: asyncpg.Record,
    query: np.ndarray,
    width: GraphSearchWidth,
    session_ef_search: int,
    *,
    rewalk: bool = False,
) -> Found:
    """Milliseconds, and the distances and ids of the rows found. The graph search runs
    with the width the service would use for this agent (``rewalk``: for a repeated walk;
    ``SET LOCAL`` in a transaction when it differs from the session's)."""
    args = (agent["org_id"], agent["agent_id"], query, LIMIT)
    ef_search = width.for_agent(agent["memories"], LIMIT, plan, rewalk=rewalk)
    start = time.perf_counter()
    if plan is not ColdPlan.EXACT and ef_search != session_ef_search:
        async with conn.transaction():
            await conn.execute(f"SET LOCAL hnsw.ef_search = {int(ef_search)}")
            rows = await conn.fetch(SEARCH_SQL[plan], *args)
    else:
        rows = await conn.fetch(SEARCH_SQL[plan], *args)
    milliseconds = (time.perf_counter() - start) * 1000
    return Found(milliseconds, [float(r["distance"]) for r in rows], [r["id"] for r in rows])


async def _walk_missed(
    conn: asyncpg.Connection, agent: asyncpg.Record, question: str, query: np.ndarray, walked: Found
) -> bool:
    """The service's test of a walk (``nearer_than_walk``) against the call's lexical search."""
    rows = await conn.fetch(LEXICAL_SQL, agent["org_id"], agent["agent_id"], question, LIMIT)
    if not rows or not walked.ids:
        return False
    vectors, at = decode_vectors([r["embedding"] for r in rows])
    present = [i for i in range(len(rows)) if at[i] >= 0]
    return nearer_than_walk(
        walked.ids,
        1.0 - max(walked.distances),
        [rows[i]["id"] for i in present],
        vectors[at[present]],
        query,
    )


def recall(exact: list[float], found: list[float]) -> float:
    """Share of the exact top-K that the approximate answer matches, by distance: a row
    as near as the exact K-th row counts (equal distances are common: the seeded corpus
    repeats texts' words, so distinct memories can share a vector; which of the tied
    rows an index returns is arbitrary)."""
    if not exact:
        return 1.0
    bound = max(exact) + 1e-6
    return min(len(exact), sum(1 for d in found if d <= bound)) / len(exact)


async def measure(
    conn: asyncpg.Connection,
    agents: list[asyncpg.Record],
    calls: int,
    dim: int,
    queries: str,
    width: GraphSearchWidth,
    graph_warm_up: int = 0,
    rewalk_widths: tuple[int, ...] = (),
) -> list[Measured]:
    """Every query runs under each plan back to back, so recall compares like with like.

    ``graph_warm_up``: graph walks per agent with a graph of its own before the timed
    calls, beyond the common warm-up. An agent's graph larger than the common warm-up
    touches (1.6 GB at 1M memories) is otherwise measured partly from the OS's page cache,
    not from shared buffers as it is served once its agent is called often.

    ``queries``: ``questions`` (the load test's: a question quoting a span of one of the
    agent's memories, ``loadtest.corpus.query_from_memory``, embedded by the hashing
    embedder the data was seeded with), ``shaped`` (for vectors drawn from the model of
    MiniLM's: a stored vector plus a real question's offset), ``memories`` (the normalised mean of two of the
    agent's memories' vectors: a point between two memories, the hardest case for a
    graph), ``minilm`` (the load test's questions embedded by MiniLM as the service embeds
    them: for data seeded with MiniLM's vectors) or ``random`` unit vectors.

    ``rewalk_widths``: for question queries, each walk that missed is repeated at each
    width (``Found`` rows "walked again").
    """
    rng = np.random.default_rng(7)
    texts = random.Random(7)
    embedder = HashingEmbedder(dim)
    minilm = seed_worker.worker_embedder("minilm", dim) if queries == "minilm" else None
    shape = VectorShape.load(fitted_shape()) if queries == "shaped" else None
    vectors: dict[tuple[object, object], np.ndarray] = {}
    contents: dict[tuple[object, object], list[str]] = {}
    if queries != "random":
        for agent in agents:
            rows = await conn.fetch(
                "SELECT embedding, content FROM memories WHERE org_id = $1 AND agent_id = $2"
                " ORDER BY id LIMIT 400",
                agent["org_id"],
                agent["agent_id"],
            )
            key = (agent["org_id"], agent["agent_id"])
            vectors[key] = np.stack([r["embedding"] for r in rows])
            contents[key] = [r["content"] for r in rows]

    def asked(agent: asyncpg.Record) -> tuple[np.ndarray, str]:
        """A query vector and, for question queries, the question."""
        key = (agent["org_id"], agent["agent_id"])
        question = ""
        if queries in ("questions", "minilm"):
            question = corpus.query_from_memory(texts, texts.choice(contents[key]))
            if minilm is not None:
                vector = np.asarray(minilm.embed_sync([question], query=True)[0], dtype=np.float32)
            else:
                vector = embedder.embed_one(question)
        elif queries == "shaped":
            assert shape is not None
            pool = vectors[key]
            vector = shape.questions(pool[rng.integers(len(pool))][None, :], rng)[0]
        elif queries == "memories":
            pool = vectors[key]
            a, b = rng.choice(len(pool), size=2, replace=len(pool) < 2)
            vector = pool[a] + pool[b]
        else:
            vector = rng.standard_normal(dim).astype(np.float32)
        return np.asarray(vector / np.linalg.norm(vector), dtype=np.float32), question

    def query(agent: asyncpg.Record) -> np.ndarray:
        return asked(agent)[0]

    # Which plan searches each agent's own graph: read as the service reads it.
    with_graph = {
        (agent["org_id"], agent["agent_id"]): own_graph_plan(
            await conn.fetchrow(AGENT_STATE_SQL, agent["org_id"], agent["agent_id"])
        )
        for agent in agents
    }

    def own_graph(agent: asyncpg.Record) -> ColdPlan | None:
        return with_graph.get((agent["org_id"], agent["agent_id"]))

    for i in range(max(len(agents), WARM_UP_CALLS)):
        agent = agents[i % len(agents)]
        for plan in {ColdPlan.EXACT, choose_plan(own_graph(agent))}:
            await _timed(conn, plan, agent, query(agent), width, width.ef_search)
    for agent in agents:
        if (graph := own_graph(agent)) is not None:
            for _ in range(graph_warm_up):
                await _timed(conn, choose_plan(graph), agent, query(agent), width, width.ef_search)
    exact, service = Measured("exact"), Measured("service's choice")
    # Agents with a graph of their own (migration 0013): that graph's cost and recall.
    own = Measured("own graph (agents that have one)")
    # A mixed data set also gets the rows of each agent size apart: the service's plan
    # differs by size, and so do its cost and recall.
    sizes = sorted({int(agent["memories"]) for agent in agents})
    mixed = sizes if len(sizes) > 1 else []
    by_size = {size: Measured(f"service's choice, {size:,}-memory agents") for size in mixed}
    rewalked = {
        w: Measured(f"own graph, walked again at ef_search {w} when it missed") for w in rewalk_widths
    }
    exact.plans["exact"] = len(agents)
    for agent in agents:
        chosen = choose_plan(own_graph(agent))
        service.plans[chosen.value] += 1
        if chosen is not ColdPlan.EXACT:
            own.plans[chosen.value] += 1
        if agent["memories"] in by_size:
            by_size[agent["memories"]].plans[chosen.value] += 1
    for _ in range(calls):
        for agent in agents:
            q, question = asked(agent)
            exact_found = await _timed(conn, ColdPlan.EXACT, agent, q, width, width.ef_search)
            exact_ms, truth = exact_found.milliseconds, exact_found.distances
            exact.milliseconds.append(exact_ms)
            chosen = choose_plan(own_graph(agent))
            chosen_ms, chosen_recall = exact_ms, 1.0
            if chosen is not ColdPlan.EXACT:
                walked = await _timed(conn, chosen, agent, q, width, width.ef_search)
                chosen_ms, chosen_recall = walked.milliseconds, recall(truth, walked.distances)
                own.milliseconds.append(chosen_ms)
                own.recall.append(chosen_recall)
                missed = bool(rewalked) and question and await _walk_missed(conn, agent, question, q, walked)
                for w, row in rewalked.items():
                    again = walked
                    if missed:
                        wider = dataclasses.replace(width, rewalk_ef_search=w)
                        again = await _timed(conn, chosen, agent, q, wider, width.ef_search, rewalk=True)
                        row.plans["walked again"] += 1
                    row.milliseconds.append(chosen_ms + (again.milliseconds if missed else 0.0))
                    row.recall.append(recall(truth, again.distances))
            service.milliseconds.append(chosen_ms)
            service.recall.append(chosen_recall)
            if agent["memories"] in by_size:
                by_size[agent["memories"]].milliseconds.append(chosen_ms)
                by_size[agent["memories"]].recall.append(chosen_recall)
    return [
        exact,
        service,
        *([own] if own.milliseconds else []),
        *(row for row in rewalked.values() if row.milliseconds),
        *by_size.values(),
    ]


def _widths(width: GraphSearchWidth) -> str:
    """The graph searches' hnsw.ef_search, as the setup line tells them."""
    half = width.for_agent(0, LIMIT, ColdPlan.AGENT_HALFVEC)
    half_large = width.for_agent(width.large_agent_memories + 1, LIMIT, ColdPlan.AGENT_HALFVEC)
    full, full_large = width.for_agent(0, LIMIT), width.for_agent(width.large_agent_memories + 1, LIMIT)
    return (
        f" hnsw.ef_search on an own graph in half precision {half}, {half_large} above"
        f" {width.large_agent_memories:,} memories; on one built before migration 0019 {full}, {full_large}"
    )


async def run(
    data_dir: Path,
    agents_wanted: int,
    calls: int,
    ef_search: int | None,
    queries: str,
    graph_warm_up: int = 0,
    rewalk_widths: tuple[int, ...] = (),
) -> str:
    # The service's width by agent size, unless one width is asked for every agent.
    width = service_width() if ef_search is None else GraphSearchWidth(ef_search, ef_search, 0)
    postgres = start_postgres(data_dir)
    try:
        pool = await create_pool(postgres.dsn, min_size=1, max_size=1, ef_search=width.ef_search)
        try:
            async with pool.acquire() as conn:
                rows = await conn.fetchval("SELECT sum(memories)::bigint FROM memory_stats")
                largest = await conn.fetch(
                    "SELECT org_id, agent_id, memories FROM memory_stats WHERE memories > 0"
                    " ORDER BY memories DESC, 1, 2 LIMIT $1",
                    agents_wanted,
                )
                smallest = await conn.fetch(
                    "SELECT org_id, agent_id, memories FROM memory_stats WHERE memories > 0"
                    " ORDER BY memories, 1, 2 LIMIT $1",
                    agents_wanted // 2,
                )
                # A mixed data set: half the agents from each end; else the largest only.
                if smallest and smallest[0]["memories"] != largest[0]["memories"]:
                    agents = [*largest[: agents_wanted - len(smallest)], *smallest]
                else:
                    agents = list(largest)
                dim = int(await conn.fetchval("SELECT value FROM ibex_meta WHERE key = 'embedding_dim'"))
                versions = await conn.fetchval(
                    "SELECT version() || ', pgvector ' || extversion"
                    " FROM pg_extension WHERE extname = 'vector'"
                )
                partitions = await conn.fetchval(
                    "SELECT count(*) FROM pg_inherits WHERE inhparent = 'memories'::regclass"
                )
                measured = await measure(
                    conn, agents, calls, dim, queries, width, graph_warm_up, rewalk_widths
                )
        finally:
            await pool.close()
    finally:
        postgres.stop()
    sizes = sorted({a["memories"] for a in agents})
    lines = [
        f"# Cold search plans: {data_dir.name}",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Command: "
        f"`python -m benchmarks.cold_plans {data_dir}` (--agents {agents_wanted} --calls {calls}"
        f"{'' if ef_search is None else f' --ef-search {ef_search}'}"
        f" --queries {queries}{f' --graph-warm-up {graph_warm_up}' if graph_warm_up else ''}"
        f"{' --rewalk-ef ' + ','.join(map(str, rewalk_widths)) if rewalk_widths else ''}).",
        "",
        f"Setup: {rows:,} memories in {partitions} partitions; {len(agents)} agents of"
        f" {', '.join(f'{s:,}' for s in sizes)} memories; the service's search statements (LIMIT {LIMIT},"
        + _widths(width)
        + f"; exact until an agent's own graph is ready); queries: {QUERIES[queries]}; each exactly"
        " and, for an agent with a graph of its own, through it, back to back: recall@50 of the graph"
        " against the exact answer (mean / 5th percentile / min);"
        + (
            " walked again: when the lexical search (the question's words, LIMIT 50) found a memory"
            " the walk did not return, nearer than one it did, the walk repeated at that width, its"
            " time added;"
            if rewalk_widths
            else ""
        )
        + " one pooled connection, sequential, after >= 30 warm-up calls per plan"
        + (f" and {graph_warm_up} more graph walks per agent with a graph;" if graph_warm_up else ";")
        + f" wall time per call including the Unix-socket round trip. Load average {os.getloadavg()[0]:.2f}"
        f" (2 vCPUs shared). {platform.machine()}; {versions}.",
        "",
        "| plan | median ms | p95 ms | max ms | calls | recall@50 mean / p5 / min | plans (per agent) |",
        "|---|---:|---:|---:|---:|---|---|",
        *(m.row() for m in measured),
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path, help="a seeded data set, e.g. loadtest/out/data/100x10000-...")
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--calls", type=int, default=5, help="rounds over the agents")
    parser.add_argument(
        "--ef-search",
        type=int,
        default=None,
        help="one hnsw.ef_search for every agent (default: the service's, by agent size)",
    )
    parser.add_argument(
        "--queries",
        choices=sorted(QUERIES),
        default=None,
        help="default: shaped for a data set seeded with --vectors shaped, else questions",
    )
    parser.add_argument(
        "--graph-warm-up",
        type=int,
        default=0,
        help="graph walks per agent with a graph of its own before the timed calls (a large graph's pages"
        " into shared buffers; default 0)",
    )
    parser.add_argument(
        "--rewalk-ef",
        default="",
        help="comma-separated hnsw.ef_search widths of a repeated walk (question queries): each walk"
        " that missed by the service's test is repeated at each",
    )
    parser.add_argument("--label", default="", help="appended to the results file's name")
    args = parser.parse_args()
    if args.queries is None:
        # The seed's plan, in the data set's agents file, says how its vectors were made.
        plan = json.loads((args.data_dir / "agents.json").read_text())["plan"]
        if plan.get("vectors") == "shaped":
            args.queries = "shaped"
        else:
            own = plan.get("vectors") == "embedder" and plan.get("embedder") == "minilm"
            args.queries = "minilm" if own else "questions"
    report = asyncio.run(
        run(
            args.data_dir.resolve(),
            args.agents,
            args.calls,
            args.ef_search,
            args.queries,
            graph_warm_up=args.graph_warm_up,
            rewalk_widths=tuple(int(w) for w in filter(None, args.rewalk_ef.split(","))),
        )
    )
    RESULTS.mkdir(exist_ok=True)
    shape = args.data_dir.name.split("-")[0]
    path = RESULTS / f"cold_plans-{shape}{'-' + args.label if args.label else ''}.md"
    path.write_text(report)
    print(report)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
