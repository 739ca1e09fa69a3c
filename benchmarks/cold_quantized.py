"""Would a cheaper first pass find the exact top 50? Recall of quantized prefilters and of
an IVF partitioning, simulated in numpy on one agent of a seeded data set (ADR-0009,
issue 13).

    python -m benchmarks.cold_quantized loadtest/out/data/1x100000-...

Reads the largest agent's vectors, asks the load test's questions (as
``benchmarks.cold_plans --queries questions``) and, for each candidate first pass, the
share of the exact top 50 (tie-aware, ``cold_plans.recall``) found among its top N
candidates, i.e. what an exact re-rank of those N could recover at best:

* ``sign bits``: ``binary_quantize`` (bit set where the coordinate is > 0), Hamming
  distance (pgvector's ``<~>``), as a stored ``bit(384)`` or an HNSW on it would rank;
* ``sign + zero bits``: 768 bits, positive and negative coordinates apart;
* ``query . sign bits``: the float query against the stored sign bits (asymmetric);
* ``query . ternary``: the float query against -1/0/+1 per coordinate;
* ``halfvec``: the vector rounded to 16-bit floats (an exact scan over ``halfvec``);
* ``IVF, P probes``: k-means lists (sqrt(n)), the P lists nearest the query scanned
  exactly (what ``ivfflat.probes`` would read); N is then the rows scanned.

Nothing is timed here: a first pass that cannot find the answer is not worth timing.
Writes ``benchmarks/results/cold_quantized-<data set>.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import time
from pathlib import Path

import asyncpg
import numpy as np
from ibex_context.devtools.embedded import start_postgres
from ibex_context.embedding.hashing import HashingEmbedder
from ibex_context.stores.postgres.codecs import init_connection

from benchmarks.cold_plans import LIMIT, recall
from loadtest import corpus

RESULTS = Path(__file__).parent / "results"
POOLS = (50, 400, 1600, 3200)
PROBES = (5, 10, 20, 40, 80)


def _kmeans(vectors: np.ndarray, lists: int, rounds: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Spherical k-means: unit centroids and each vector's list."""
    rng = np.random.default_rng(0)
    centroids = vectors[rng.choice(len(vectors), lists, replace=False)].copy()
    for _ in range(rounds):
        assign = np.argmax(vectors @ centroids.T, axis=1)
        for k in range(lists):
            members = vectors[assign == k]
            if len(members):
                total = members.sum(0)
                centroids[k] = total / np.linalg.norm(total)
    return centroids, np.argmax(vectors @ centroids.T, axis=1)


async def _agent(dsn: str) -> tuple[np.ndarray, list[str]]:
    conn = await asyncpg.connect(dsn)
    try:
        await init_connection(conn)
        agent = await conn.fetchrow(
            "SELECT org_id, agent_id FROM memory_stats ORDER BY memories DESC, 1, 2 LIMIT 1"
        )
        rows = await conn.fetch(
            "SELECT embedding, content FROM memories WHERE org_id = $1 AND agent_id = $2 ORDER BY id",
            agent["org_id"],
            agent["agent_id"],
        )
    finally:
        await conn.close()
    vectors = np.stack([r["embedding"] for r in rows])
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True), [r["content"] for r in rows[:400]]


def simulate(vectors: np.ndarray, contents: list[str], questions: int) -> dict[str, list[float]]:
    rng = random.Random(7)
    embedder = HashingEmbedder(vectors.shape[1])
    positive, negative = vectors > 0, vectors < 0
    signs = np.where(positive, 1.0, -1.0).astype(np.float32)
    ternary = positive.astype(np.float32) - negative.astype(np.float32)
    halves = vectors.astype(np.float16).astype(np.float32)
    halves /= np.linalg.norm(halves, axis=1, keepdims=True)
    centroids, lists = _kmeans(vectors, int(math.sqrt(len(vectors))))
    found: dict[str, list[float]] = {}
    for _ in range(questions):
        query = embedder.embed_one(corpus.query_from_memory(rng, rng.choice(contents)))
        query = query / np.linalg.norm(query)
        distances = 1.0 - vectors @ query
        exact = np.sort(distances)[:LIMIT].tolist()
        first_passes = {
            "sign bits (Hamming)": (positive != (query > 0)).sum(1),
            "sign + zero bits (Hamming, 768)": (positive != (query > 0)).sum(1)
            + (negative != (query < 0)).sum(1),
            "query . sign bits": -(signs @ query),
            "query . ternary": -(ternary @ query),
            "halfvec": 1.0 - halves @ query,
        }
        for name, score in first_passes.items():
            order = np.argsort(score, kind="stable")
            for pool in POOLS:
                pooled = np.sort(distances[order[:pool]])[:LIMIT].tolist()
                found.setdefault(f"{name}, top {pool}", []).append(recall(exact, pooled))
        nearest_lists = np.argsort(-(centroids @ query))
        for probes in PROBES:
            scanned = np.isin(lists, nearest_lists[:probes])
            pooled = np.sort(distances[scanned])[:LIMIT].tolist()
            key = f"IVF {len(centroids)} lists, {probes} probes"
            found.setdefault(key, []).append(recall(exact, pooled))
            found.setdefault(key + " (rows scanned)", []).append(float(scanned.sum()))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--questions", type=int, default=100)
    args = parser.parse_args()
    postgres = start_postgres(args.data_dir.resolve())
    try:
        vectors, contents = asyncio.run(_agent(postgres.dsn))
    finally:
        postgres.stop()
    found = simulate(vectors, contents, args.questions)
    lines = [
        f"# First-pass recall (simulated): {args.data_dir.name}",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Command: `python -m benchmarks.cold_quantized"
        f" {args.data_dir}` (--questions {args.questions}). The largest agent ({len(vectors):,} memories,"
        f" hashing-embedder vectors), the load test's questions; recall@{LIMIT} of an exact re-rank of"
        " each first pass's candidates against the exact search (mean / min / 5th percentile). Load average"
        f" {os.getloadavg()[0]:.2f} (numpy only, nothing timed).",
        "",
        "| first pass | recall@50 mean | min | p5 |",
        "|---|---:|---:|---:|",
    ]
    for name, values in found.items():
        if name.endswith("(rows scanned)"):
            continue
        scanned = found.get(name + " (rows scanned)")
        label = f"{name} (~{np.mean(scanned):,.0f} rows)" if scanned else name
        lines.append(
            f"| {label} | {np.mean(values):.3f} | {min(values):.2f} | {np.percentile(values, 5):.2f} |"
        )
    report = "\n".join([*lines, ""])
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"cold_quantized-{args.data_dir.name.split('-')[0]}.md"
    path.write_text(report)
    print(report)
    print(f"written: {path}")


if __name__ == "__main__":
    main()
